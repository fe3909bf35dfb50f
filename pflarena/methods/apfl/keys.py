"""APFL's message names: train-reply metrics.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

ALPHA = "alpha"  # α_i after this round's updates, in [0, 1]
MIXED_LOSS = "mixed-loss"  # mean loss of the mixture v̄ = α v + (1 − α) w this round
