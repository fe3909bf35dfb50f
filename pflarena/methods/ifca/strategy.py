"""IFCA: the Iterative Federated Clustering Algorithm (the clustered-FL ancestor of PPFL).

Ghosh, Chung, Yin and Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020, Algorithm 1. The server keeps k cluster models θ_1..θ_k (a stacked
state, :mod:`pflarena.algorithms.canonical`, copies ``cluster.<j>.<name>``, each initialised
differently). Each round (one exchange):

1. the server sends every cluster model to the sampled clients;
2. client i estimates its cluster identity ``ĵ = argmin_j F_i(θ_j)``, F_i its empirical loss
   over its training split (Algorithm 1, "cluster identity estimate"), the one-hot ``s_i``;
3. Option II, model averaging (``averaging=model``, the default): it runs local SGD on
   θ_ĵ (``local-epochs`` of ``lr``) and returns θ̃_i; the server sets
   ``θ_j ← Σ_i s_ij θ̃_i / Σ_i s_ij`` for every cluster that received a model.
   Option I, gradient averaging (``averaging=gradient``): it returns ``g_i = ∇F_i(θ_ĵ)``
   over its training split and the server steps ``θ_j ← θ_j − (γ/m) Σ_i s_ij g_i`` with
   γ = ``lr`` and m the number of clients that answered.

A cluster no client chose keeps its model. A client's personalized model is the cluster
model with the lowest loss on its training split at evaluation time (the same estimate
as in training). PPFL's paper shows IFCA is PPFL with a private trunk per cluster, λ = 0
and memberships replaced by the argmin (docs/papers/ppfl.md §10, Eq. O19).

The reading of the paper, decisions and measurements: docs/methods/ifca.md.
"""

from __future__ import annotations

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
from pflarena.core import keys
from pflarena.core.array_decoding import decode
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.ifca import keys as ifca_keys
from pflarena.strategies.aggregation import as_numpy, as_record, weighted_mean
from pflarena.strategies.base import Send, array_problem
from pflarena.strategies.stacked import StackedModelsStrategy

__all__ = ["IFCA", "IFCAParams"]

CLUSTER_PREFIX = ifca_keys.CLUSTER_PREFIX


class IFCAParams(MethodParams):
    """IFCA's parameters (Ghosh et al. 2020, Algorithm 1)."""

    num_clusters: int = Field(3, ge=1, le=64, description="k, the number of cluster models")
    averaging: Literal["model", "gradient"] = Field(
        "model",
        description="Option II 'model' (local SGD, cluster-wise model average) or Option I "
        "'gradient' (one full-gradient step per round)",
    )


class IFCA(StackedModelsStrategy):
    """Algorithm 1 of Ghosh et al. (2020) over Flower: k cluster models, argmin-loss identity.

    It has one exchange per round, but its replies are cluster-tagged models, not updates
    of the message's arrays, so it runs in pflarena's loop like the multi-exchange methods.
    """

    #: the checkpoint's JSON keeps each sampled client's cluster, every round (9 bytes
    #: measured with two-digit client ids: ``"35": 2, ``; 12 with four)
    checkpoint_round_bytes = 12

    declaration = MethodDeclaration(
        name="ifca",
        kind="baseline",
        reference="Ghosh, Chung, Yin, Ramchandran, An Efficient Framework for Clustered "
        "Federated Learning, NeurIPS 2020",
        summary="k cluster models; each client trains the one with its lowest loss, the "
        "server averages each cluster's models",
        solver="pflarena.methods.ifca.solver",
        params=IFCAParams,
        global_model=False,
    )

    prefix = CLUSTER_PREFIX

    def __init__(self, params: IFCAParams | None = None, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        #: round -> client id -> the cluster it chose
        self.assignments: dict[int, dict[int, int]] = {}

    # ------------------------------------------------------------------ state
    # round -> client id -> cluster, keyed by int (JSON keys it by string): by hand
    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = super().checkpoint_state()
        meta["ifca"] = {
            str(r): {str(c): j for c, j in v.items()} for r, v in self.assignments.items()
        }
        return arrays, meta

    def restore_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        super().restore_state(arrays, meta)
        self.assignments = {
            int(r): {int(c): int(j) for c, j in v.items()} for r, v in meta["ifca"].items()
        }

    @classmethod
    def copies(cls, params: Any) -> tuple[int, int]:
        return params.num_clusters, 0

    # ------------------------------------------------------------------ messages
    def _config(self, server_round: int) -> ConfigRecord:
        return ConfigRecord(
            self.round_config(server_round) | self.params_config(exclude={"num_clusters"})
        )

    def _check(self, content: RecordDict, template: ArrayRecord) -> str | None:
        metrics = content[keys.METRICS]
        cluster = metrics.get(ifca_keys.CLUSTER)
        count = self.params.num_clusters
        if not isinstance(cluster, int) or isinstance(cluster, bool) or not 0 <= cluster < count:
            return (
                f"metric {ifca_keys.CLUSTER!r} must be a cluster in [0, {count}), got {cluster!r}"
            )
        return array_problem(content, template, keys.ARRAYS)

    # ------------------------------------------------------------------ the round
    def train_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, send: Send
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.server_round = server_round
        stacked = self.stacked(arrays)
        self._round_arrays = stacked
        _, entries, _ = parse_stacked(list(stacked.keys()), CLUSTER_PREFIX)
        template = ArrayRecord({n: stacked[copy_name(CLUSTER_PREFIX, 0, n)] for n in entries})
        self.last_sampled = nodes = self.sample_train_nodes(grid)
        config = self._config(server_round)
        exchange = send(
            "train",
            [
                Message(
                    content=RecordDict({keys.ARRAYS: stacked, keys.CONFIG: config}),
                    message_type=MessageType.TRAIN,
                    dst_node_id=node,
                )
                for node in nodes
            ],
        )
        replies = self.valid_replies(exchange, lambda c: self._check(c, template))
        self.last_failed = exchange.failed
        if not replies:
            return None, None
        chosen: dict[int, list[ArrayRecord]] = {j: [] for j in range(self.params.num_clusters)}
        assignment: dict[int, int] = {}
        for msg in replies:
            cluster = int(msg.content[keys.METRICS][ifca_keys.CLUSTER])
            chosen[cluster].append(msg.content[keys.ARRAYS])
            assignment[self.client_ids[exchange.node_of(msg)]] = cluster
        self.assignments[server_round] = assignment
        new = as_numpy(stacked)
        for cluster, records in chosen.items():
            if not records:
                continue
            if self.params.averaging == "model":  # Option II: Σ s_ij θ̃_i / Σ s_ij
                mean = weighted_mean(records, names=entries)
                for name in entries:
                    new[copy_name(CLUSTER_PREFIX, cluster, name)] = mean[name]
                continue
            for name in entries:  # Option I: θ_j − (γ/m) Σ s_ij g_i, m = the clients that answered
                key = copy_name(CLUSTER_PREFIX, cluster, name)
                values = [decode(r[name]) for r in records]
                step = self.training.lr_at(server_round) / len(replies) * sum(values)
                new[key] = (new[key] - step).astype(new[key].dtype)
        metrics = self.train_metrics(replies) or MetricRecord({})
        for cluster in range(self.params.num_clusters):
            metrics[f"cluster-{cluster}-clients"] = len(chosen[cluster])
        return as_record(new), metrics

    # ------------------------------------------------------------------ results
    def run_summary(self) -> dict[str, Any]:
        last = self.assignments[max(self.assignments)] if self.assignments else {}
        return {
            "num_clusters": self.params.num_clusters,
            "averaging": self.params.averaging,
            "last_cluster_sizes": [
                sum(1 for j in last.values() if j == c) for c in range(self.params.num_clusters)
            ],
        }

    def write_artifacts(self, output_dir: Path) -> list[Path]:
        """``clusters.csv``: every round's chosen cluster per client."""
        if not self.assignments:
            return []
        output_dir.mkdir(parents=True, exist_ok=True)
        path = output_dir / "clusters.csv"
        lines = ["round,client,cluster"] + [
            f"{r},{c},{j}"
            for r, v in sorted(self.assignments.items())
            for c, j in sorted(v.items())
        ]
        path.write_text("\n".join(lines) + "\n")
        return [path]
