"""SCAFFOLD's message names: record names.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

CONTROL = "control"  # train message: the server control variate c (trainable)
DELTA_Y = "delta-y"  # reply: Δy_i = y_i − x (trainable parameters)
DELTA_C = "delta-c"  # reply: Δc_i = c_i⁺ − c_i (trainable parameters)
BUFFERS = "buffers"  # reply: the trained model's non-trainable state, if any
