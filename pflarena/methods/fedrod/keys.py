"""FedRoD's message names: train-reply metrics.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

PERSONAL_LOSS = "fedrod-personal-loss"  # the personal head's mean training loss
