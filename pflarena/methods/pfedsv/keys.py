"""pFedSV's message names: record and phase names.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

REQUEST = "request"  # train reply: the ranked peer pseudonyms and k (ConfigRecord)
RELEVANCE = "relevance"  # personalize reply: the client's relevance vector
REQUEST_PEERS = "peers"  # REQUEST: the peer pseudonyms, best first
REQUEST_K = "k"  # REQUEST: how many of them the client wants
RELEVANCE_VECTOR = "relevance"  # RELEVANCE array: φ^i, indexed by pseudonym
RELEVANCE_VALUES = "values"  # RELEVANCE array: the players' Shapley values
RELEVANCE_PLAYERS = "players"  # RELEVANCE array: those players' pseudonyms
FEATURES = "feature-extractor"  # D+C: the averaged feature extractor, sent down
PEER_PREFIX = "peer/"  # personalize message: one ArrayRecord per peer, peer/<pid>
COALITION_SIZE = "coalition-size"  # personalize reply: the peers valued with the client
UTILITY_EVALUATIONS = (
    "utility-evaluations"  # the coalition utilities the Shapley estimate evaluated
)
SHAPLEY_TIME = "shapley-time-s"  # wall time of the valuation (seconds)
OWN_VALUE = "own-value"  # the client's own Shapley value
OWN_WEIGHT = "own-weight"  # its own model's weight in the aggregate
KEPT_OWN = "kept-own"  # 1 when the client kept its own model
AGGREGATE_BELOW_OWN = "aggregate-below-own"  # 1 when the aggregate scored below its own model
TRAINED_TEST_ACCURACY = (
    "trained-test-accuracy"  # test accuracy of the locally trained model, before aggregation
)
PHASE_PERSONALIZE = "personalize"  # the second exchange: peers' models down, θ_i^{t*} made
