"""PAGE's message names: train-reply metrics.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

LOSS = "page-loss"  # f_i(ŵ_i(t)): mean training loss of the trained model, eval mode
STATE = "page-state"  # s_i(t): accuracy of the received W(t) on the training split
EPOCHS = "page-epochs"  # α_i(t) the client's agent chose
LR = "page-lr"  # η_i(t) the client's agent chose
REWARD = "page-reward"  # r_i(t), as the client's agent stored it
CLAMPED = "page-clamped"  # 1 when the loss floor bounded r_i(t)
AGENT_TIME = "page-agent-time-s"  # the client's DDPG work this round (seconds)
SGD_TIME = "page-sgd-time-s"  # the client's local SGD this round (seconds)
AGENT_CPU = "page-agent-cpu-s"  # the same in the thread's CPU time
SGD_CPU = "page-sgd-cpu-s"  # the same in the thread's CPU time
AGENT_MEMORY = "page-agent-from-memory"  # 1 when the client's agent was kept in memory
CRITIC_LOSS = "page-critic-loss"  # the client agent's critic loss in this round's update
