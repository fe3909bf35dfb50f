"""CFL: Clustered Federated Learning, clusters found by splitting on the clients' update geometry.

Sattler, Müller and Samek, "Clustered Federated Learning: Model-Agnostic Distributed
Multitask Optimization Under Privacy Constraints", IEEE TNNLS 2020 (arXiv:1910.01991),
Algorithm 3, with the optimal bipartition of Algorithm 1. Every client starts in one
cluster, whose model is the run's initial model. Each round (one exchange):

1. every sampled client receives its cluster's model θ_c, runs ``local-epochs`` of SGD and
   returns its weight update Δθ_i = θ_i − θ_c;
2. for each cluster c whose participants' updates satisfy the split criterion (Eq. 28/29)

   ``‖Σ_{i∈c} w_i Δθ_i‖ < ε₁`` and ``max_{i∈c} ‖Δθ_i‖ > ε₂``

   (w_i = n_i / n_c, or uniform; the FL objective of the cluster is near a stationary point
   while some client is still far from its own), after ``warmup-rounds`` rounds and with at
   least ``min-split-size`` participants, the server bi-partitions the participants by the
   cosine similarities α_ij = ⟨Δθ_i, Δθ_j⟩ / (‖Δθ_i‖ ‖Δθ_j‖) into the c₁, c₂ that minimise
   the largest cross-cluster similarity max_{i∈c₁, j∈c₂} α_ij (Algorithm 1,
   :func:`optimal_bipartition`); both parts start from the parent's model;
3. every cluster, split or not, adds the weighted mean of its own participants' updates.

A client's personalized model is its cluster's model; there is no global model (each
cluster's model is the global model of its clients). A client that did not take part in a
round stays in its cluster; when that cluster splits, it stays with the part that keeps the
cluster's id. The norms and similarities use the trainable parameters (the authors' code
flattens ``named_parameters``); buffers are averaged with the same weights.

The reading of the paper, decisions and measurements: docs/methods/cfl.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from pydantic import Field

from pflarena.algorithms.canonical import copy_name, parse_stacked
from pflarena.algorithms.mgda import gram_matrix, stacked_gram_footprint
from pflarena.core import keys
from pflarena.core.footprint import Federation, Footprint, human_bytes
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.cfl import keys as cfl_keys
from pflarena.strategies.aggregation import as_numpy, as_record, stack_flat, weighted_mean
from pflarena.strategies.base import Send, StrategySetup, array_problem
from pflarena.strategies.stacked import StackedModelsStrategy

__all__ = [
    "CFL",
    "CFLParams",
    "cosine_from_gram",
    "cosine_similarities",
    "max_cross_similarity",
    "optimal_bipartition",
    "split_criterion",
]

CLUSTER_PREFIX = cfl_keys.CLUSTER_PREFIX


class CFLParams(MethodParams):
    """CFL's parameters (Sattler et al. 2020, Algorithm 3; defaults of the authors' code)."""

    eps_1: float = Field(
        0.4,
        gt=0,
        description="ε₁: a cluster may split only when the norm of its mean update is below this",
    )
    eps_2: float = Field(
        1.6,
        gt=0,
        description="ε₂: a cluster may split only when some member's update norm exceeds this",
    )
    warmup_rounds: int = Field(
        20, ge=0, description="no split in the first this many rounds (the authors' code: 20)"
    )
    min_split_size: int = Field(
        3,
        ge=2,
        description="a cluster splits only with at least this many participants in the round",
    )
    weighting: Literal["examples", "uniform"] = Field(
        "examples",
        description="the cluster's mean update weights clients by training examples "
        "(Algorithm 3) or equally (the authors' code)",
    )


# ---------------------------------------------------------------------------- the math
def cosine_similarities(updates: np.ndarray) -> np.ndarray:
    """α_ij = ⟨Δθ_i, Δθ_j⟩ / (‖Δθ_i‖ ‖Δθ_j‖) of the rows of ``updates`` (``(m, d)``).

    A zero update has similarity 0 with every other (and 1 with itself).
    """
    return cosine_from_gram(gram_matrix(updates))


def cosine_from_gram(gram: np.ndarray) -> np.ndarray:
    """:func:`cosine_similarities` from the updates' Gram matrix ``G_ij = ⟨Δθ_i, Δθ_j⟩``."""
    gram = np.asarray(gram, dtype=np.float64)
    norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
    safe = np.where(norms > 0, norms, 1.0)
    similarity = np.clip(gram / np.outer(safe, safe), -1.0, 1.0)  # a zero row stays 0
    np.fill_diagonal(similarity, 1.0)
    return similarity


def max_cross_similarity(similarity: np.ndarray, part: np.ndarray) -> float:
    """max_{i∈c₁, j∈c₂} α_ij for the bipartition ``part`` (a boolean mask of c₁)."""
    part = np.asarray(part, dtype=bool)
    return float(similarity[np.ix_(part, ~part)].max())


def optimal_bipartition(similarity: np.ndarray) -> tuple[list[int], list[int]]:
    """The bipartition minimising the largest cross-cluster similarity (Algorithm 1).

    Algorithm 1 merges clients in decreasing order of similarity until two clusters are
    left; that is single-linkage agglomerative clustering on the distance 1 − α, cut at two
    clusters (scipy's ``linkage(method="single")``). It is optimal: the last merge joins the
    two parts through the weakest edge of a maximum spanning tree, every bipartition cuts
    some tree edge, and every cross pair of this one is at most that edge (the cycle
    property). The authors' code uses complete linkage, which can miss the optimum (a test
    shows a case). Parts are returned as sorted positions, the part holding position 0
    first.
    """
    similarity = np.asarray(similarity, dtype=np.float64)
    count = len(similarity)
    if similarity.shape != (count, count) or count < 2:
        raise ValueError(
            f"need a square similarity matrix of at least 2 rows, got {similarity.shape}"
        )
    if not np.allclose(similarity, similarity.T, atol=1e-9):
        raise ValueError("the similarity matrix must be symmetric")
    distance = 1.0 - similarity
    np.fill_diagonal(distance, 0.0)
    # imported here: scipy's clustering takes half a second to import, and every run loads
    # every strategy module
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    tree = linkage(squareform(np.maximum(distance, 0.0), checks=False), method="single")
    labels = fcluster(tree, t=2, criterion="maxclust")
    first = labels == labels[0]
    return np.flatnonzero(first).tolist(), np.flatnonzero(~first).tolist()


def split_criterion(
    mean_update_norm: float, max_update_norm: float, eps_1: float, eps_2: float
) -> bool:
    """Eq. 28/29: the cluster's mean update is small (< ε₁) and some member's is large (> ε₂)."""
    return mean_update_norm < eps_1 and max_update_norm > eps_2


# ---------------------------------------------------------------------------- strategy
class CFL(StackedModelsStrategy):
    """Algorithm 3 of Sattler et al. (2020) over Flower: clusters split by update similarity.

    One exchange per round; each client is sent only its own cluster's model (one shared
    record per cluster), so it runs in pflarena's loop like the multi-exchange methods.
    """

    #: the checkpoint's JSON keeps each sampled client's cluster and the clusters' update
    #: norms, every round (24 bytes a sampled client measured with two-digit client ids)
    checkpoint_round_bytes = 28

    declaration = MethodDeclaration(
        name="cfl",
        kind="baseline",
        reference="Sattler, Müller, Samek, Clustered Federated Learning: Model-Agnostic "
        "Distributed Multitask Optimization Under Privacy Constraints, IEEE TNNLS 2020",
        summary="FedAvg within clusters; a cluster near a stationary point with a client "
        "far from its own splits in two by the cosine similarity of the updates",
        solver="pflarena.methods.cfl.solver",
        params=CFLParams,
        global_model=False,
    )

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """A cluster's updates stacked in float32 for their Gram matrix (at most the
        round's), and its float64 chunk, beside the replies; the clusters' models, now and
        new (:meth:`cluster_models`)."""
        f = federation
        return [
            *super().server_footprint(params, federation),
            *stacked_gram_footprint("the round's updates", f.sampled, f.model_params),
            cls.cluster_models(federation, copies=2),
        ]  # fmt: skip

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        return [cls.cluster_models(federation, copies=1)]

    @staticmethod
    def cluster_models(federation: Federation, copies: int) -> Footprint:
        """The clusters' models at the start: one cluster. Each split adds one model
        (``copies`` of it), and how many splits a run makes depends on its updates: the
        bound (one per cluster and round after the warm-up, each needing
        ``min-split-size`` of the round's clients) is thousands of models for a long run
        of a large federation, which would refuse every such run for splits that the split
        criterion makes rare. So the term counts one cluster and says what a split adds."""
        size = federation.model_bytes
        return Footprint(
            f"the clusters' models{', now and new' if copies > 1 else ''}: one cluster to "
            f"start, each split adds {human_bytes(copies * size)}",
            copies * size,
        )

    prefix = CLUSTER_PREFIX

    @classmethod
    def from_setup(cls, setup: StrategySetup, **extra: Any) -> CFL:
        return super().from_setup(setup, trainable=setup.trainable, **extra)

    def __init__(
        self, params: CFLParams | None = None, *, trainable: tuple[str, ...] = (), **kwargs: Any
    ) -> None:
        super().__init__(params, **kwargs)
        #: the entries whose updates enter the norms and similarities (empty: every entry)
        self.trainable = tuple(trainable)
        #: client id -> its cluster (a client not listed is in cluster 0)
        self.assignment: dict[int, int] = {}
        #: round -> every client's cluster after that round
        self.history: dict[int, dict[int, int]] = {}
        #: the cluster tree: one record per split
        self.splits: list[dict[str, Any]] = []
        #: round -> cluster -> norms of that round's updates (the split criterion's inputs)
        self.norms: dict[int, dict[int, dict[str, float]]] = {}

    # ------------------------------------------------------------------ state
    # dicts keyed by client id and round (JSON keys them by string), split records: by hand
    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = super().checkpoint_state()
        meta["cfl"] = {
            "assignment": {str(c): j for c, j in self.assignment.items()},
            "history": {str(r): {str(c): j for c, j in v.items()} for r, v in self.history.items()},
            "splits": self.splits,
            "norms": {str(r): {str(j): n for j, n in v.items()} for r, v in self.norms.items()},
        }
        return arrays, meta

    def restore_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        super().restore_state(arrays, meta)
        state = meta["cfl"]
        self.assignment = {int(c): int(j) for c, j in state["assignment"].items()}
        self.history = {
            int(r): {int(c): int(j) for c, j in v.items()} for r, v in state["history"].items()
        }
        self.splits = list(state["splits"])
        self.norms = {
            int(r): {int(j): dict(n) for j, n in v.items()} for r, v in state["norms"].items()
        }

    def cluster_of(self, client_id: int) -> int:
        return self.assignment.get(client_id, 0)

    def initial_stack(self, arrays: ArrayRecord) -> ArrayRecord:
        """The run's model as cluster 0, its arrays as they are (no model built): one
        cluster at the start, a split adds one."""
        return ArrayRecord(
            {copy_name(CLUSTER_PREFIX, 0, name): arrays[name] for name in arrays.keys()}
        )

    @staticmethod
    def cluster_model(stacked: ArrayRecord, cluster: int, entries: list[str]) -> ArrayRecord:
        return ArrayRecord({n: stacked[copy_name(CLUSTER_PREFIX, cluster, n)] for n in entries})

    def _assignment_list(self) -> list[int]:
        known = max([*self.assignment, (self.num_clients or 1) - 1, 0])
        return [self.cluster_of(c) for c in range(known + 1)]

    # ------------------------------------------------------------------ messages
    def evaluate_config(self, server_round: int) -> dict:
        """With the assignment, so a node whose client id the server has not learnt yet
        finds its own cluster."""
        return {
            **super().evaluate_config(server_round),
            **self.method_config(assignment=self._assignment_list()),
        }

    # ------------------------------------------------------------------ the round
    def train_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, send: Send
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.server_round = server_round
        stacked = self.stacked(arrays)
        self._round_arrays = stacked
        _, entries, count = parse_stacked(list(stacked.keys()), CLUSTER_PREFIX)
        models = [self.cluster_model(stacked, j, entries) for j in range(count)]
        self.last_sampled = nodes = self.sample_train_nodes(grid)
        config = ConfigRecord(self.round_config(server_round))
        sent_cluster: dict[int, int] = {}
        messages = []
        for node in nodes:
            cluster = self.cluster_of(self.client_ids[node]) if node in self.client_ids else 0
            sent_cluster[node] = cluster
            messages.append(
                Message(
                    content=RecordDict({keys.ARRAYS: models[cluster], keys.CONFIG: config}),
                    message_type=MessageType.TRAIN,
                    dst_node_id=node,
                )
            )
        exchange = send("train", messages)
        replies = self.valid_replies(exchange, lambda c: array_problem(c, models[0], keys.ARRAYS))
        self.last_failed = exchange.failed
        new = as_numpy(stacked)
        if not replies:
            self.history[server_round] = dict(enumerate(self._assignment_list()))
            return as_record(new), None
        # the updates of each cluster's participants, in client-id order
        members: dict[int, list[int]] = {}
        updates: dict[int, ArrayRecord] = {}
        examples: dict[int, float] = {}
        for msg in replies:
            node = exchange.node_of(msg)
            client = self.client_ids[node]
            members.setdefault(sent_cluster[node], []).append(client)
            # the reply's record, read entry by entry: no decoded copy of the round's updates
            updates[client] = msg.content[keys.ARRAYS]
            examples[client] = float(msg.content[keys.METRICS].get(keys.NUM_EXAMPLES, 1))
        measured = [n for n in entries if n in set(self.trainable)] or list(entries)
        dtype = np.result_type(*(np.dtype(models[0][n].dtype) for n in measured))
        round_norms: dict[int, dict[str, float]] = {}
        groups: list[tuple[int, list[int]]] = []  # (cluster id, its participants) after splits
        for cluster in sorted(members):
            clients = members[cluster]
            # The updates stacked in their own dtype (float32: one copy of the cluster's
            # replies) and every figure from their float64 Gram matrix G: ‖Σ w_i Δθ_i‖² is
            # wᵀGw, ‖Δθ_i‖² is G_ii, α_ij is G_ij / √(G_ii G_jj). No float64 copy of them.
            flat = stack_flat([updates[c] for c in clients], measured, dtype)
            gram = gram_matrix(flat)
            weights = self._weights([examples[c] for c in clients])
            mean_norm = math.sqrt(max(float(weights @ gram @ weights), 0.0))
            max_norm = math.sqrt(max(float(np.diag(gram).max()), 0.0))
            round_norms[cluster] = {
                "mean_update_norm": mean_norm,
                "max_update_norm": max_norm,
                "participants": len(clients),
            }
            if (
                server_round > self.params.warmup_rounds
                and len(clients) >= self.params.min_split_size
                and split_criterion(mean_norm, max_norm, self.params.eps_1, self.params.eps_2)
            ):
                similarity = cosine_from_gram(gram)
                first, second = optimal_bipartition(similarity)
                mask = np.zeros(len(clients), dtype=bool)
                mask[first] = True
                cross = max_cross_similarity(similarity, mask)
                child = count
                count += 1
                for name in entries:  # the new cluster starts from the parent's model
                    new[copy_name(CLUSTER_PREFIX, child, name)] = new[
                        copy_name(CLUSTER_PREFIX, cluster, name)
                    ].copy()
                stay = [clients[i] for i in first]
                leave = [clients[i] for i in second]
                for client in leave:
                    self.assignment[client] = child
                self.splits.append(
                    {
                        "round": server_round,
                        "parent": cluster,
                        "children": [cluster, child],
                        "members": [stay, leave],
                        "mean_update_norm": mean_norm,
                        "max_update_norm": max_norm,
                        "max_cross_similarity": cross,
                        # Eq. 36: the split is provably correct for every γ_max below this
                        "separation_bound": math.sqrt(max(0.0, 1.0 - cross) / 2.0),
                    }
                )
                groups += [(cluster, stay), (child, leave)]
            else:
                groups.append((cluster, clients))
        for cluster, clients in groups:  # each cluster adds its own participants' mean update
            step = weighted_mean(
                [updates[c] for c in clients],
                self._raw_weights([examples[c] for c in clients]),
                entries,
                dtype=np.float64,
            )
            for name in entries:
                key = copy_name(CLUSTER_PREFIX, cluster, name)
                new[key] = (new[key] + step[name]).astype(new[key].dtype)
        self.norms[server_round] = round_norms
        self.history[server_round] = dict(enumerate(self._assignment_list()))
        metrics = self.train_metrics(replies) or MetricRecord({})
        metrics["clusters"] = count
        metrics["max-mean-update-norm"] = max(n["mean_update_norm"] for n in round_norms.values())
        metrics["max-update-norm"] = max(n["max_update_norm"] for n in round_norms.values())
        ordered = {}  # cluster 0's entries, then cluster 1's, ...: parse_stacked's order
        for cluster in range(count):
            for name in entries:
                key = copy_name(CLUSTER_PREFIX, cluster, name)
                ordered[key] = new[key]
        return as_record(ordered), metrics

    def _raw_weights(self, examples: list[float]) -> np.ndarray:
        weights = np.asarray(examples, dtype=np.float64)
        if self.params.weighting == "uniform" or weights.sum() <= 0:
            weights = np.ones_like(weights)
        return weights

    def _weights(self, examples: list[float]) -> np.ndarray:
        weights = self._raw_weights(examples)
        return weights / weights.sum()

    # ------------------------------------------------------------------ results
    def run_summary(self) -> dict[str, Any]:
        final = self._assignment_list()
        count = max(final) + 1 if final else 1
        return {
            "clusters": count,
            "splits": [(s["round"], s["parent"], s["children"][1]) for s in self.splits],
            "cluster_sizes": [sum(1 for j in final if j == c) for c in range(count)],
        }

    def write_artifacts(self, output_dir: Path) -> list[Path]:
        """``cfl_tree.json`` (the splits, the final assignment, every round's norms) and
        ``clusters.csv`` (every round's cluster of every client)."""
        output_dir.mkdir(parents=True, exist_ok=True)
        tree = output_dir / "cfl_tree.json"
        tree.write_text(
            json.dumps(
                {
                    "eps_1": self.params.eps_1,
                    "eps_2": self.params.eps_2,
                    "warmup_rounds": self.params.warmup_rounds,
                    "min_split_size": self.params.min_split_size,
                    "splits": self.splits,
                    "assignment": self._assignment_list(),
                    "norms": {
                        str(r): {str(j): n for j, n in v.items()}
                        for r, v in sorted(self.norms.items())
                    },
                },
                indent=1,
            )
            + "\n"
        )
        written = [tree]
        if self.history:
            path = output_dir / "clusters.csv"
            lines = ["round,client,cluster"] + [
                f"{r},{c},{j}"
                for r, v in sorted(self.history.items())
                for c, j in sorted(v.items())
            ]
            path.write_text("\n".join(lines) + "\n")
            written.append(path)
        return written
