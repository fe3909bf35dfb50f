"""Names shared by strategies and client solvers: record keys, metric keys, config keys.

A strategy and its solver agree on a message layout through these constants only, so a
typo is an ``AttributeError`` at import time rather than a silently missing value.
"""

from __future__ import annotations

# RecordDict keys in every message.
ARRAYS = "arrays"  # the server's model (global model, or the method's server state)
CONFIG = "config"  # per-round configuration (ConfigRecord)
METRICS = "metrics"  # the client's reply metrics (MetricRecord)

# ConfigRecord keys every strategy sends.
SERVER_ROUND = "server-round"
METHOD = "method"  # the method's name (state keys, logs)
SOLVER = "solver"  # the module whose train/evaluate answer the message (the declaration's)
LR = "lr"
LOCAL_EPOCHS = "local-epochs"
BATCH_SIZE = "batch-size"
MOMENTUM = "momentum"
WEIGHT_DECAY = "weight-decay"
HAS_GLOBAL = "has-global"  # evaluate messages: whether ARRAYS holds a global model
PHASE = "phase"  # train messages of strategies with more than one kind of exchange
PHASE_INIT = "init"
PHASE_TRAIN = "train"
# Evaluate messages of the cross-evaluation (server/crosseval.py <-> client/app.py).
PHASE_CROSS_EXPORT = "cross-export"  # reply: the client's personalized model, as ARRAYS
PHASE_CROSS_SCORE = "cross-score"  # message: models cross/<owner>; reply: their test results
CROSS_PREFIX = "cross/"
CROSS_OWNERS = "cross-owners"  # score reply: the owners' client ids, and per owner:
CROSS_CORRECT = "cross-correct"
CROSS_COUNT = "cross-count"
CROSS_LOSS_SUM = "cross-loss-sum"

# The "sync" ConfigRecord the run loop adds to every message (client/state.py): which of
# this client's state versions the server last accepted, and the version this message's
# writes become (train messages only).
SYNC = "sync"
ACCEPTED = "accepted"
UPDATE_ID = "update-id"
HOLDS = "holds"  # the state version the client must hold (its last accepted state-version)
STATE_KEY = "state-key"  # the run's name for its clients' state (kept in config.json)

# MetricRecord keys every client reply carries.
CLIENT_ID = "client-id"
NUM_EXAMPLES = "num-examples"  # training examples (FedAvg weighting)
TRAIN_LOSS = "train-loss"
TRAIN_STEPS = "train-steps"
TRAIN_TIME = "train-time-s"  # wall time of the local solver (set by the ClientApp)
DATA_TIME = "data-s"  # wall time this message spent building or loading the client's data
TRAIN_CPU = "train-cpu-s"  # CPU time of the local solver's process (set by the ClientApp)
STATE_MISSING = "state-missing"  # 1: the state the server accepted is gone; 2: unreadable
STATE_VERSION = "state-version"  # the client's state version after a train message

# Evaluation replies: sums, so the server can pool them exactly.
PERSONALIZED_CORRECT = "personalized-correct"
PERSONALIZED_COUNT = "personalized-count"
PERSONALIZED_LOSS_SUM = "personalized-loss-sum"
GLOBAL_CORRECT = "global-correct"
GLOBAL_COUNT = "global-count"
GLOBAL_LOSS_SUM = "global-loss-sum"

# APFL (strategies/apfl.py <-> client/solvers/apfl.py): train-reply metrics.
APFL_ALPHA = "alpha"  # α_i after this round's updates, in [0, 1]
APFL_MIXED_LOSS = "mixed-loss"  # mean loss of the mixture v̄ = α v + (1 − α) w this round

# pFedGT (strategies/pfedgt.py <-> client/solvers/pfedgt.py): record names.
PFEDGT_MESSAGE = "message"  # c^t down; c_i^0 up in the init phase
PFEDGT_DELTA_W = "delta-w"  # w_i^{t+1} − w_i^t (trainable parameters)
PFEDGT_DELTA_C = "delta-c"  # c_i^{t+1} − c_i^t
PFEDGT_BUFFERS = "buffers"  # the client's non-trainable state (BatchNorm statistics)

# pFedMe (strategies/pfedme.py <-> client/solvers/pfedme.py): train-reply metrics.
PFEDME_INNER_GRAD_NORM = "inner-grad-norm"  # mean ‖∇h̃_i(θ̃)‖ at the θ̃ used
PFEDME_INNER_GRAD_NORM_MAX = "inner-grad-norm-max"  # its largest value this round
PFEDME_INNER_STEPS = "inner-steps-taken"  # mean number of inner steps actually run

# pFedSV (strategies/pfedsv.py <-> client/solvers/pfedsv.py): record and phase names.
PFEDSV_REQUEST = "request"  # train reply: the ranked peer pseudonyms and k (ConfigRecord)
PFEDSV_RELEVANCE = "relevance"  # personalize reply: the client's relevance vector
PFEDSV_REQUEST_PEERS = "peers"  # PFEDSV_REQUEST: the peer pseudonyms, best first
PFEDSV_REQUEST_K = "k"  # PFEDSV_REQUEST: how many of them the client wants
PFEDSV_RELEVANCE_VECTOR = "relevance"  # PFEDSV_RELEVANCE array: φ^i, indexed by pseudonym
PFEDSV_RELEVANCE_VALUES = "values"  # PFEDSV_RELEVANCE array: the players' Shapley values
PFEDSV_RELEVANCE_PLAYERS = "players"  # PFEDSV_RELEVANCE array: those players' pseudonyms
PFEDSV_FEATURES = "feature-extractor"  # D+C: the averaged feature extractor, sent down
PFEDSV_PEER_PREFIX = "peer/"  # personalize message: one ArrayRecord per peer, peer/<pid>
PFEDSV_COALITION_SIZE = "coalition-size"  # personalize reply: the peers valued with the client
PFEDSV_UTILITY_EVALUATIONS = (
    "utility-evaluations"  # the coalition utilities the Shapley estimate evaluated
)
PFEDSV_SHAPLEY_TIME = "shapley-time-s"  # wall time of the valuation (seconds)
PFEDSV_OWN_VALUE = "own-value"  # the client's own Shapley value
PFEDSV_OWN_WEIGHT = "own-weight"  # its own model's weight in the aggregate
PFEDSV_KEPT_OWN = "kept-own"  # 1 when the client kept its own model
PFEDSV_AGGREGATE_BELOW_OWN = (
    "aggregate-below-own"  # 1 when the aggregate scored below its own model
)
PFEDSV_TRAINED_TEST_ACCURACY = (
    "trained-test-accuracy"  # test accuracy of the locally trained model, before aggregation
)
PFEDSV_PHASE_PERSONALIZE = "personalize"  # the second exchange: peers' models down, θ_i^{t*} made

# FedFomo (strategies/fedfomo.py <-> client/solvers/fedfomo.py): record names, metrics.
FEDFOMO_PEER_PREFIX = "peer/"  # train message: one ArrayRecord per peer, peer/<client id>
FEDFOMO_WEIGHTS = "fomo"  # train reply: the peers weighed, their weights, affinity increments
FEDFOMO_PEERS = "peers"  # FEDFOMO_WEIGHTS array: the client ids of the peers weighed
FEDFOMO_PEER_WEIGHTS = "weights"  # FEDFOMO_WEIGHTS array: their FedFomo weights
FEDFOMO_AFFINITY = "affinity"  # FEDFOMO_WEIGHTS array: their affinity increments
FEDFOMO_PEERS_USED = "peers-used"  # train reply: the peers of weight > 0
FEDFOMO_OWN_WEIGHT = "own-weight"  # train reply: the own trained model's weight (round-start)
FEDFOMO_BASE_VAL_LOSS = "base-val-loss"  # train reply: the reference model's validation loss

# FedALA (strategies/fedala.py <-> client/solvers/fedala.py): train-reply metrics.
FEDALA_EPOCHS = "ala-epochs"  # epochs of this round's ALA weight training (0: none)
FEDALA_MEAN_WEIGHT = "mean-weight"  # the mean of the learned ALA weights W, in [0, 1]

# FedRoD (client/solvers/fedrod.py): train-reply metrics.
FEDROD_PERSONAL_LOSS = "fedrod-personal-loss"  # the personal head's mean training loss

# FedPG (strategies/fedpg.py, strategies/fedmgda.py <-> client/solvers/fedpg.py).
FEDPG_GRADIENT = "gradient"  # gradients reply: g_i (trainable parameters), ArrayRecord
FEDPG_DIRECTION = "direction"  # line-search / personalize message: d^t, ArrayRecord
FEDPG_PHASE_GRADIENTS = "gradients"  # g_i and L_i at θ^t
FEDPG_PHASE_LINE_SEARCH = "line-search"  # S-FedPG: L_i(θ^t − η d) for one trial η
FEDPG_PHASE_PERSONALIZE = "personalize"  # build θ_i = θ^t − η((1 − γ_i) d + γ_i g_i)
FEDPG_TRIAL_LOSS = "fedpg-trial-loss"  # line-search reply: L_i(θ^t − η d)

# PPFL (strategies/ppfl.py <-> client/solvers/ppfl.py).
PPFL_MEMBERSHIP = "membership"  # ArrayRecord: c_i ("c"), and the penalty row ("penalty")
PPFL_MEMBERSHIP_C = "c"  # the membership vector c_i (K floats)
PPFL_MEMBERSHIP_PENALTY = "penalty"  # π_i: the Laplacian term of client i's step (K floats)
PPFL_MEMBERSHIP_GRADIENT = "membership-gradient"  # reply: ∇_c f_i (ArrayRecord, "c")
PPFL_LABEL_COUNTS = "label-counts"  # affinity reply: the client's label histogram
PPFL_START_LOSS = "ppfl-start-loss"  # metric: f_i(θ^t, c_i^t) over the training split
PPFL_PHASE_AFFINITY = "affinity"  # label histograms (and n_i) for W
PPFL_PHASE_THETA = "theta"  # θ-block: local SGD on θ with c_i fixed
PPFL_PHASE_GRADIENT = "membership-gradient"  # C-block (Algorithm 1): ∇_c f_i at (θ^t, c_i^t)
PPFL_PHASE_SYNC = "membership"  # Algorithm 1's synchronisation: the server's new c_i
PPFL_PHASE_STEPS = "membership-steps"  # the authors' code: c_i steps at θ^{t+1}
PPFL_PHASE_ALTERNATE = "alternate"  # Algorithm 2: a c_i step, then local SGD on θ
PPFL_CANONICAL_PREFIX = "canonical"  # ARRAYS: the stacked copies, canonical.<k>.<name>

# IFCA (strategies/ifca.py <-> client/solvers/ifca.py).
IFCA_CLUSTER = "ifca-cluster"  # train reply: the cluster identity the client estimated
IFCA_CLUSTER_PREFIX = "cluster"  # ARRAYS: the K cluster models, cluster.<j>.<name>

# CFL (strategies/cfl.py <-> client/solvers/cfl.py).
CFL_CLUSTER_PREFIX = "cluster"  # ARRAYS: the clusters' models, cluster.<j>.<name>

# FedEM (strategies/fedem.py <-> client/solvers/fedem.py).
FEDEM_ENTROPY = "fedem-mixture-entropy"  # train reply: the entropy of the client's new π_i
FEDEM_COMPONENT_PREFIX = "component"  # ARRAYS: the M components, component.<m>.<name>

# PAGE (strategies/page.py <-> client/solvers/page.py): train-reply metrics.
PAGE_LOSS = "page-loss"  # f_i(ŵ_i(t)): mean training loss of the trained model, eval mode
PAGE_STATE = "page-state"  # s_i(t): accuracy of the received W(t) on the training split
PAGE_EPOCHS = "page-epochs"  # α_i(t) the client's agent chose
PAGE_LR = "page-lr"  # η_i(t) the client's agent chose
PAGE_REWARD = "page-reward"  # r_i(t), as the client's agent stored it
PAGE_CLAMPED = "page-clamped"  # 1 when the loss floor bounded r_i(t)
PAGE_AGENT_TIME = "page-agent-time-s"  # the client's DDPG work this round (seconds)
PAGE_SGD_TIME = "page-sgd-time-s"  # the client's local SGD this round (seconds)
PAGE_AGENT_CPU = "page-agent-cpu-s"  # the same in the thread's CPU time
PAGE_SGD_CPU = "page-sgd-cpu-s"  # the same in the thread's CPU time
PAGE_AGENT_MEMORY = "page-agent-from-memory"  # 1 when the client's agent was kept in memory
PAGE_CRITIC_LOSS = "page-critic-loss"  # the client agent's critic loss in this round's update

# SCAFFOLD (strategies/scaffold.py <-> client/solvers/scaffold.py): record names.
SCAFFOLD_CONTROL = "control"  # train message: the server control variate c (trainable)
SCAFFOLD_DELTA_Y = "delta-y"  # reply: Δy_i = y_i − x (trainable parameters)
SCAFFOLD_DELTA_C = "delta-c"  # reply: Δc_i = c_i⁺ − c_i (trainable parameters)
SCAFFOLD_BUFFERS = "buffers"  # reply: the trained model's non-trainable state, if any

# Dap-FL (strategies/dapfl.py <-> client/solvers/dapfl.py): train-reply metrics.
DAPFL_STATE_LOSS = "dapfl-state-loss"  # s_i(t)[0]: loss of the received W(t), training split
DAPFL_STATE_ACCURACY = "dapfl-state-accuracy"  # s_i(t)[1]: its accuracy there
DAPFL_STATE_F1 = "dapfl-state-f1"  # s_i(t)[2]: its F1 score there
DAPFL_EPOCHS = "dapfl-epochs"  # local epochs the client's agent chose
DAPFL_LR = "dapfl-lr"  # learning rate the client's agent chose
DAPFL_REWARD = "dapfl-reward"  # reward of the client's previous action (from s(t−1) to s(t))
DAPFL_CLIPPED = "dapfl-clipped"  # 1 when the loss change of that reward was clipped
DAPFL_SGD_TIME = "dapfl-sgd-time-s"  # the client's local SGD this round (seconds)
DAPFL_CRITIC_LOSS = "dapfl-critic-loss"  # the critic's loss in the agent's update (if one ran)

# SplitGP (strategies/splitgp.py <-> client/solvers/splitgp.py): record names, metrics.
SPLITGP_AUX = "aux-classifier"  # messages and replies: the auxiliary classifier κ (client side)
SPLITGP_SERVER_SIDE = "server-side"  # reply: the server-side part θ_k the client process trained
SPLITGP_CLIENT_LOSS = "splitgp-client-loss"  # train reply: mean loss of the exit κ_k(φ_k(x))
SPLITGP_SERVER_LOSS = "splitgp-server-loss"  # train reply: mean loss of the exit θ_k(φ_k(x))
SPLITGP_SMASHED_UP = "splitgp-smashed-bytes-up"  # train reply: bytes of z and the labels sent
SPLITGP_SMASHED_DOWN = "splitgp-smashed-bytes-down"  # train reply: bytes of the gradients at z
#: SplitGP evaluation metrics: test samples the inference rule offloaded to the server, and
#: test samples the client-side model (φ_k, κ_k) alone predicts right
SPLITGP_OFFLOADED = "splitgp-offloaded"
SPLITGP_CLIENT_SIDE_CORRECT = "splitgp-client-side-correct"
