"""FedFomo (Zhang et al., ICLR 2021): clients weight their peers' models by a first-order step.

"Personalized Federated Learning with First Order Model Optimization". The server keeps
every client's latest uploaded model (a pool) and an affinity matrix P (clients × clients:
row i holds client i's running estimate of how useful each peer's model is to it). One
exchange per round:

1. The server sends each sampled client i the models of M peers, chosen from the pool by
   ε-greedy on P[i] (:func:`select_peers`): each of the M slots takes the best remaining peer
   by affinity with probability 1 − ε, else a random remaining one. A client never gets its
   own model.
2. The client (:mod:`pflarena.methods.fedfomo.solver`) weighs each candidate model θ_n on its
   own validation split, w_n = (L_i(θ_ref) − L_i(θ_n)) / ‖θ_n − θ_ref‖, keeps the positive
   part, normalizes, and steps θ_i = θ_ref + Σ_n w_n (θ_n − θ_ref) (no step when no w_n is
   positive); it then trains locally, keeps θ_i as its personalized model and uploads it
   with one affinity increment per peer, which the server adds to P[i].

There is no global model. Where the paper leaves a detail open, the defaults follow the
authors' released code (NVlabs/FedFomo, the settings of its README's commands); the other
readings are options:

- **The reference model and the client's own model** (``fedfomo.baseline``). The paper
  writes the update as a step from θ_i^{t−1} towards the downloaded models θ_n^t without
  saying whether θ_i^{t−1} is the model before or after the client's last local training,
  nor whether the client's own model is one of the θ_n. The authors' code
  (``--baseline_model first_model``) takes as θ_ref the client's model at the start of its
  previous local training (its last federated update) and counts the client's own trained
  model as one more candidate, so local training itself is weighed against the peers
  (``round-start``, the default). Its README's "5 models" runs download 4 peers and use the
  own model as the fifth: ``num-models=4`` reproduces them. When no candidate, the own model
  included, beats θ_ref, the client goes back to θ_ref and its last local training is
  dropped, as in the code. ``trained``: θ_ref is the client's trained model and only peers
  are candidates, so with no useful peer FedFomo is local training. The own model is never
  downloaded: the client keeps it in its state. Measured on ``digits`` (10 clients, 10
  rounds, E = 2, lr 0.1, 20% validation; last-round mean personalized accuracy, pathological
  2 classes / Dirichlet 0.5 / Dirichlet 0.1 / IID): ``round-start`` 97.6 / 77.7 / 87.8 /
  66.0%, ``trained`` 98.1 / 80.1 / 90.6 / 67.8%, Local 98.1 / 75.3 / 90.6 / 58.9%, FedAvg
  59.2 / 78.4 / 60.5 / 76.0%; validation splits of a few dozen samples make the going back
  frequent.
- **M counts downloaded peers** (``fedfomo.num-models``, default 5): each sampled client gets
  min(M, peers in the pool) models.
- **The pool** holds every client's latest upload; the code offers the previous round's
  uploads only, which is the same under full participation (its README's setting).
- **ε schedule.** ε falls linearly, ε_t = max(ε − (t − 1)·decay, 0) in round t, with ε = 0.3
  and decay 0.05 (the code's ``epsilon - epoch * epsilon_decay`` with its first, local-only
  round as epoch 0, and its README's values). Round 1 sends no peers: the pool is empty,
  as in the code, where every client first trains locally.
- **Affinity update** (``fedfomo.affinity-update``). The paper adds the client's weights to
  P (p_{i,n} ← p_{i,n} + w_n) without fixing which form of w_n. The code adds the raw
  first-order weights divided by the absolute value of their sum over all candidates (the
  own model's included), negative ones too, so that a peer whose model hurts loses
  affinity (``signed``, the default). ``positive`` adds the normalized positive weights the
  model update used. On the digits runs above both gave the same accuracies.
- **Distance** (``fedfomo.distance-norm``): the paper's ‖·‖ read as the L2 norm over the
  trainable parameters (``l2``); the code's default is the L1 norm (``l1``). A candidate at
  distance zero from θ_ref (no move) gets weight 0.
- **Initial affinity** is 0 for every pair, so the first greedy choices are random (ties are
  broken at random). The code starts a client's own entry at 0.1, which never matters since
  the own model is not downloaded.
- **Integer state entries** (BatchNorm's batch counters) are not averaged: they come from
  θ_ref. Floating-point buffers are stepped like the parameters.
- **Unknown client ids.** Peers are sent only to nodes whose client id the server knows (from
  a reply; the run loop's round-0 evaluation tells it every node's), since otherwise it could
  not leave the node's own model out; such a node trains without peers.
- **Selection randomness** comes from a generator seeded by (run seed, round, client), so a
  resumed run draws the same peers without the generator's state in the checkpoint; P and
  ε are in it.

The hierarchical extension of the authors' code (sub-federation and global models offered as
extra candidates) is not part of FedFomo's algorithm in the paper and is not implemented.

The reading of the paper, decisions and measurements: docs/methods/fedfomo.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from pydantic import Field

from pflarena.core import keys
from pflarena.core.footprint import FLOAT64, Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.fedfomo import keys as fedfomo_keys
from pflarena.strategies.base import PflStrategy
from pflarena.strategies.replies import read_client_id, vector_problem

__all__ = [
    "FOMO",
    "PEER_PREFIX",
    "FedFomo",
    "FedFomoParams",
    "epsilon_at",
    "select_peers",
]

MODELS = "models"  # the server pool's record: each client's latest upload
PEER_PREFIX = fedfomo_keys.PEER_PREFIX
FOMO = fedfomo_keys.WEIGHTS


class FedFomoParams(MethodParams):
    """FedFomo's parameters; defaults are those of the authors' code and README."""

    num_models: int = Field(
        5, ge=1, description="M: peer models each sampled client downloads per round"
    )
    epsilon: float = Field(
        0.3,
        ge=0,
        le=1,
        description="ε of the ε-greedy peer choice in round 2 (the first with peers)",
    )
    epsilon_decay: float = Field(
        0.05, ge=0, description="ε falls linearly by this much per round, down to 0"
    )
    baseline: Literal["round-start", "trained"] = Field(
        "round-start",
        description="reference model: 'round-start' (the model before the last local "
        "training; the own trained model is a candidate) or 'trained' (peers only)",
    )
    affinity_update: Literal["signed", "positive"] = Field(
        "signed",
        description="P[i][n] += raw weight / |sum of raw weights| ('signed') or the "
        "normalized positive weight ('positive')",
    )
    distance_norm: Literal["l2", "l1"] = Field(
        "l2", description="norm of θ_n − θ_ref dividing the loss gain"
    )


def epsilon_at(server_round: int, epsilon: float, decay: float) -> float:
    """ε in ``server_round``: ``max(epsilon − (round − 1) · decay, 0)``."""
    return max(round(epsilon - (server_round - 1) * decay, 12), 0.0)


def select_peers(
    affinity: np.ndarray,
    candidates: Sequence[int],
    epsilon: float,
    rng: np.random.Generator,
) -> list[int]:
    """Every candidate in ε-greedy order: the first M are the M peers to send.

    Each slot takes, with probability 1 − ε, the remaining candidate of highest
    ``affinity`` (ties in random order), else a uniformly random remaining candidate.

    Parameters
    ----------
    affinity
        The client's row of P, indexed by client id.
    candidates
        Client ids of the peers the server can send (the client itself excluded).
    """
    pool = np.array(sorted({int(c) for c in candidates}), dtype=np.int64)
    if pool.size == 0:
        return []
    ranked = [int(c) for c in pool[np.lexsort((rng.permutation(pool.size), -affinity[pool]))]]
    shuffled = [int(c) for c in rng.permutation(pool)]
    order: list[int] = []
    taken: set[int] = set()
    for _ in range(pool.size):
        source = shuffled if rng.random() < epsilon else ranked
        while source[0] in taken:
            source.pop(0)
        taken.add(source[0])
        order.append(source.pop(0))
    return order


class FedFomo(PflStrategy):
    """FedFomo: per-client ε-greedy routing of peers' models and the affinity matrix.

    Parameters
    ----------
    Others
        See :class:`FedFomoParams`.
    """

    declaration = MethodDeclaration(
        name="fedfomo",
        kind="baseline",
        reference="Zhang, Sapra, Fidler, Yeung and Alvarez, Personalized Federated Learning "
        "with First Order Model Optimization, ICLR 2021",
        summary="clients step towards the peers' models that lower their validation loss, "
        "peers routed by ε-greedy on an affinity matrix",
        solver="pflarena.methods.fedfomo.solver",
        params=FedFomoParams,
        global_model=False,
        needs_validation=True,
    )
    client_models = (2, "its model and the round's starting model")
    pool_models = (1, "its latest model")
    checkpointed = {"affinity": "fedfomo/affinity"}

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        n = federation.num_clients
        return [
            *super().checkpoint_footprint(params, federation),
            Footprint(f"the affinity matrix P ({n} x {n} float64)", n * n * FLOAT64),
        ]

    checkpointed_values = {"epsilon": "fedfomo/epsilon"}

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The affinity matrix P, and the peers' models a round sends (each read once)."""
        n, f = federation.num_clients, federation
        peers = min(n, f.sampled * params.num_models)
        return [
            *super().server_footprint(params, federation),
            Footprint(f"the affinity matrix P ({n} x {n} float64)", n * n * FLOAT64),
            Footprint(f"the peers' models a round sends ({peers})", peers * f.model_bytes),
        ]

    def __init__(self, params: FedFomoParams | None = None, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        if self.num_clients is None:
            raise ValueError("fedfomo needs num_clients (the size of the affinity matrix)")
        #: P: row i, client i's accumulated valuation of each peer's model
        self.affinity = np.zeros((self.num_clients, self.num_clients), dtype=np.float64)
        #: ε of the latest round
        self.epsilon = epsilon_at(1, self.params.epsilon, self.params.epsilon_decay)
        #: this round: client id -> the peers it was sent, node id -> the same
        self.offered: dict[int, list[int]] = {}
        self._node_peers: dict[int, list[int]] = {}
        #: this round: the pool's models read so far (shared by every message)
        self._records: dict[int, ArrayRecord | None] = {}
        self._available: list[int] = []

    # ------------------------------------------------------------------ messages
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.server_round = server_round
        self.epsilon = epsilon_at(server_round, self.params.epsilon, self.params.epsilon_decay)
        self.offered, self._node_peers, self._records = {}, {}, {}
        self._available = self.pool(MODELS).clients()
        return super().configure_train(server_round, arrays, config, grid)

    def _record(self, client: int) -> ArrayRecord | None:
        if client not in self._records:
            self._records[client] = self.pool(MODELS).get(client, MODELS)
        return self._records[client]

    def peers_for(self, server_round: int, client: int | None) -> list[int]:
        """The peers ``client`` gets this round: the first M of the ε-greedy order whose
        model the pool holds; none when the node's client id is unknown."""
        if client is None:
            return []
        rng = np.random.default_rng([self.seed, 0xF0F0, server_round, client])
        order = select_peers(
            self.affinity[client],
            [c for c in self._available if c != client],
            self.epsilon,
            rng,
        )
        chosen: list[int] = []
        for peer in order:
            if len(chosen) == self.params.num_models:
                break
            if self._record(peer) is not None:  # a version rolled back by a resume is gone
                chosen.append(peer)
        return chosen

    def train_config(self, server_round: int, node_id: int) -> dict:
        client = self.client_ids.get(node_id)
        peers = self.peers_for(server_round, client)
        self._node_peers[node_id] = peers
        if client is not None:
            self.offered[client] = peers
        return {
            **super().train_config(server_round, node_id),
            **self.method_config(own=-1 if client is None else client, peers=peers),
            **self.client_config(),
        }

    def client_config(self) -> dict[str, Any]:
        """The settings the clients' weighing reads (the peer choice is the server's)."""
        return self.params_config(exclude={"num_models", "epsilon", "epsilon_decay"})

    def train_content(
        self, server_round: int, node_id: int, arrays: ArrayRecord, config: dict
    ) -> RecordDict:
        # No server model goes down (clients build the run's initial model from the seed);
        # each peer's record is the pool's object, shared by every message that carries it.
        content = RecordDict({keys.CONFIG: ConfigRecord(config)})
        for peer in self._node_peers.get(node_id, []):
            content[f"{PEER_PREFIX}{peer}"] = self._records[peer]
        return content

    # ------------------------------------------------------------------ replies
    def check_train_reply(self, content: RecordDict) -> str | None:
        problem = super().check_train_reply(content)
        if problem is not None:
            return problem
        client = read_client_id(content, self.num_clients)
        if not isinstance(client, int):
            return "no client id"
        expected = self.offered.get(client, [])
        shape = (len(expected),)
        problem = vector_problem(
            content,
            FOMO,
            {
                fedfomo_keys.PEERS: shape,
                fedfomo_keys.PEER_WEIGHTS: shape,
                fedfomo_keys.AFFINITY: shape,
            },
        )
        if problem is not None:
            return problem
        peers = content[FOMO][fedfomo_keys.PEERS].numpy()
        if [int(p) for p in peers] != expected or (peers != peers.astype(np.int64)).any():
            return f"weighs peers {peers.tolist()}, was sent {expected}"
        return None

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(replies)
        if not valid:
            return None, None
        pool = self.pool(MODELS)
        for msg in valid:
            client = int(msg.content[keys.METRICS][keys.CLIENT_ID])
            pool.put(client, server_round, {MODELS: msg.content[keys.ARRAYS]})
            record = msg.content[FOMO]
            peers = record[fedfomo_keys.PEERS].numpy().astype(np.int64)
            self.affinity[client, peers] += record[fedfomo_keys.AFFINITY].numpy()
        return None, self._round_metrics(valid)

    def _round_metrics(self, valid: list[Message]) -> MetricRecord:
        metrics = self.train_metrics(valid)
        assert metrics is not None
        replies = [m.content[keys.METRICS] for m in valid]
        metrics["epsilon"] = self.epsilon
        metrics["mean-peers-sent"] = float(
            np.mean([len(p) for p in self._node_peers.values()]) if self._node_peers else 0.0
        )
        for name in (fedfomo_keys.PEERS_USED, fedfomo_keys.OWN_WEIGHT):
            metrics[f"mean-{name}"] = float(np.mean([float(r.get(name, 0.0)) for r in replies]))
        return metrics

    # ------------------------------------------------------------------ results
    def run_summary(self) -> dict[str, Any]:
        p = self.params
        return {
            "epsilon": self.epsilon,
            "num_models": p.num_models,
            **p.model_dump(by_alias=True, include={"baseline", "affinity_update", "distance_norm"}),
        }

    def write_artifacts(self, output_dir: Path) -> list[Path]:
        """``affinity.csv``: P at the end of the run (row: client, column: peer)."""
        path = output_dir / "affinity.csv"
        np.savetxt(
            path, self.affinity, delimiter=",", fmt="%.6g", header="row: client, column: peer"
        )
        return [path]
