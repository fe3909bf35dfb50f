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
# what the run's last checkpoint accepted from this client: the version a resume rolls it back
# to, which it keeps beside the accepted one (nothing older)
CHECKPOINTED = "checkpointed"
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
