"""CFL's message names.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

CLUSTER_PREFIX = "cluster"  # ARRAYS: the clusters' models, cluster.<j>.<name>
