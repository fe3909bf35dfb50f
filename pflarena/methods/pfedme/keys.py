"""pFedMe's message names: train-reply metrics.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

INNER_GRAD_NORM = "inner-grad-norm"  # mean ‖∇h̃_i(θ̃)‖ at the θ̃ used
INNER_GRAD_NORM_MAX = "inner-grad-norm-max"  # its largest value this round
INNER_STEPS = "inner-steps-taken"  # mean number of inner steps actually run
