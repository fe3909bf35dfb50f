"""FedFomo's message names: record names, metrics.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

PEER_PREFIX = "peer/"  # train message: one ArrayRecord per peer, peer/<client id>
WEIGHTS = "fomo"  # train reply: the peers weighed, their weights, affinity increments
PEERS = "peers"  # WEIGHTS array: the client ids of the peers weighed
PEER_WEIGHTS = "weights"  # WEIGHTS array: their FedFomo weights
AFFINITY = "affinity"  # WEIGHTS array: their affinity increments
PEERS_USED = "peers-used"  # train reply: the peers of weight > 0
OWN_WEIGHT = "own-weight"  # train reply: the own trained model's weight (round-start)
BASE_VAL_LOSS = "base-val-loss"  # train reply: the reference model's validation loss
