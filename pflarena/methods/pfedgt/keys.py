"""pFedGT's message names: record names.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

MESSAGE = "message"  # c^t down; c_i^0 up in the init phase
DELTA_W = "delta-w"  # w_i^{t+1} − w_i^t (trainable parameters)
DELTA_C = "delta-c"  # c_i^{t+1} − c_i^t
BUFFERS = "buffers"  # the client's non-trainable state (BatchNorm statistics)
