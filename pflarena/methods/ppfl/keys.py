"""PPFL's message names.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

MEMBERSHIP = "membership"  # ArrayRecord: c_i ("c"), and the penalty row ("penalty")
MEMBERSHIP_C = "c"  # the membership vector c_i (K floats)
MEMBERSHIP_PENALTY = "penalty"  # π_i: the Laplacian term of client i's step (K floats)
MEMBERSHIP_GRADIENT = "membership-gradient"  # reply: ∇_c f_i (ArrayRecord, "c")
LABEL_COUNTS = "label-counts"  # affinity reply: the client's label histogram
START_LOSS = "ppfl-start-loss"  # metric: f_i(θ^t, c_i^t) over the training split
PHASE_AFFINITY = "affinity"  # label histograms (and n_i) for W
PHASE_THETA = "theta"  # θ-block: local SGD on θ with c_i fixed
PHASE_GRADIENT = "membership-gradient"  # C-block (Algorithm 1): ∇_c f_i at (θ^t, c_i^t)
PHASE_SYNC = "membership"  # Algorithm 1's synchronisation: the server's new c_i
PHASE_STEPS = "membership-steps"  # the authors' code: c_i steps at θ^{t+1}
PHASE_ALTERNATE = "alternate"  # Algorithm 2: a c_i step, then local SGD on θ
CANONICAL_PREFIX = "canonical"  # ARRAYS: the stacked copies, canonical.<k>.<name>
