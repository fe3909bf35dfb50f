"""SplitGP's message names: record names, metrics.

Its strategy and its solver agree on them through these constants only; the names every
method uses are in :mod:`pflarena.core.keys`.
"""

from __future__ import annotations

AUX = "aux-classifier"  # messages and replies: the auxiliary classifier κ (client side)
SERVER_SIDE = "server-side"  # reply: the server-side part θ_k the client process trained
CLIENT_LOSS = "splitgp-client-loss"  # train reply: mean loss of the exit κ_k(φ_k(x))
SERVER_LOSS = "splitgp-server-loss"  # train reply: mean loss of the exit θ_k(φ_k(x))
SMASHED_UP = "splitgp-smashed-bytes-up"  # train reply: bytes of z and the labels sent
SMASHED_DOWN = "splitgp-smashed-bytes-down"  # train reply: bytes of the gradients at z
#: SplitGP evaluation metrics: test samples the inference rule offloaded to the server, and
#: test samples the client-side model (φ_k, κ_k) alone predicts right
OFFLOADED = "splitgp-offloaded"
CLIENT_SIDE_CORRECT = "splitgp-client-side-correct"
