"""Dap-FL's message names: train-reply metrics.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

STATE_LOSS = "dapfl-state-loss"  # s_i(t)[0]: loss of the received W(t), training split
STATE_ACCURACY = "dapfl-state-accuracy"  # s_i(t)[1]: its accuracy there
STATE_F1 = "dapfl-state-f1"  # s_i(t)[2]: its F1 score there
EPOCHS = "dapfl-epochs"  # local epochs the client's agent chose
LR = "dapfl-lr"  # learning rate the client's agent chose
REWARD = "dapfl-reward"  # reward of the client's previous action (from s(t−1) to s(t))
CLIPPED = "dapfl-clipped"  # 1 when the loss change of that reward was clipped
SGD_TIME = "dapfl-sgd-time-s"  # the client's local SGD this round (seconds)
CRITIC_LOSS = "dapfl-critic-loss"  # the critic's loss in the agent's update (if one ran)
