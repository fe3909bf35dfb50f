"""FedPG's message names.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

GRADIENT = "gradient"  # gradients reply: g_i (trainable parameters), ArrayRecord
DIRECTION = "direction"  # line-search / personalize message: d^t, ArrayRecord
PHASE_GRADIENTS = "gradients"  # g_i and L_i at θ^t
PHASE_LINE_SEARCH = "line-search"  # S-FedPG: L_i(θ^t − η d) for one trial η
PHASE_PERSONALIZE = "personalize"  # build θ_i = θ^t − η((1 − γ_i) d + γ_i g_i)
TRIAL_LOSS = "fedpg-trial-loss"  # line-search reply: L_i(θ^t − η d)
