"""FedEM's message names.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

ENTROPY = "fedem-mixture-entropy"  # train reply: the entropy of the client's new π_i
COMPONENT_PREFIX = "component"  # ARRAYS: the M components, component.<m>.<name>
