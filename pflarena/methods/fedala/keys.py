"""FedALA's message names: train-reply metrics.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

EPOCHS = "ala-epochs"  # epochs of this round's ALA weight training (0: none)
MEAN_WEIGHT = "mean-weight"  # the mean of the learned ALA weights W, in [0, 1]
