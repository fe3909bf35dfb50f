"""FedAMP (Huang et al., AAAI 2021): attentive message passing between clients' models.

"Personalized Cross-Silo Federated Learning on Non-IID Data". The federation minimises the
clients' losses plus an attention-inducing penalty on the distances between their models::

    G(W) = Σ_i F_i(w_i) + λ Σ_{i<j} A(‖w_i − w_j‖²),   A(x) = 1 − e^{−x/σ}

(A increasing and concave with A(0) = 0; the paper's negative exponential). Each round
alternates the two halves of an incremental proximal step:

1. **Message passing on the server** (a gradient step on the penalty, U^k = W^{k−1} −
   α_k ∇A(W^{k−1})): client i's *personalized cloud model* is a combination of every
   client's latest model (:func:`attention_weights`, :func:`cloud_model`)::

       u_i^k = ξ_{i,i} w_i^{k−1} + Σ_{j≠i} ξ_{i,j} w_j^{k−1},
       ξ_{i,j} = α_k A'(‖w_i^{k−1} − w_j^{k−1}‖²) (j ≠ i),  ξ_{i,i} = 1 − Σ_{j≠i} ξ_{i,j}

   with A'(x) = e^{−x/σ}/σ, so similar models pass more of themselves to each other;
2. **the clients' proximal step**: w_i^k = argmin_w F_i(w) + (λ / (2α_k)) ‖w − u_i^k‖²,
   approximately, by ``local-epochs`` of SGD with that proximal term
   (:mod:`pflarena.methods.fedamp.solver`). w_i is client i's personalized model; there is
   no global model.

The weights ξ_{i,·} form a convex combination when α_k Σ_{j≠i} A'(·) ≤ 1 (the paper takes
α_k small enough). Where the step would make ξ_{i,i} negative, the weights on the other
clients are scaled to sum to one and ξ_{i,i} = 0: the step is shortened to the edge of the
simplex, so u_i stays a convex combination of the clients' models. With identical models
every distance is 0 and u_i is their common value; with equal weights it is FedAvg's
(uniform) average.

Defaults: the paper does not fix α_k, λ, σ for all its experiments; these are PFLlib's
(α_k = λ = σ = 1, a constant α_k). A client that has not uploaded yet counts with the run's
initial model (W^0 = w^0 for all clients, as in the paper); distances cover the trainable
parameters; buffers are combined with the same weights (integer ones rounded: the rule of
:mod:`pflarena.strategies.aggregation`). The client starts its proximal solve from u_i
(``fedamp.start=cloud``; ``own`` starts from its last w_i, as PFLlib does).

The reading of the paper, decisions and measurements: docs/methods/fedamp.md.
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
from pflarena.core.footprint import FLOAT32, FLOAT64, Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.strategies.aggregation import as_record, flatten, float_names, weighted_mean
from pflarena.strategies.base import PflStrategy

__all__ = [
    "FedAMP",
    "FedAMPParams",
    "attention_derivative",
    "attention_weights",
    "cloud_model",
    "squared_distances",
]

MODELS = "models"  # the server pool's record: each client's latest w_i


class FedAMPParams(MethodParams):
    """FedAMP's parameters; the paper leaves them per experiment, defaults are PFLlib's."""

    alpha: float = Field(1.0, gt=0, description="α_k: the message-passing step size (constant)")
    lambda_: float = Field(
        1.0, gt=0, description="λ: the penalty's weight; clients' proximal weight is λ/α_k"
    )
    sigma: float = Field(1.0, gt=0, description="σ of the attention A(x) = 1 − exp(−x/σ)")
    start: Literal["cloud", "own"] = Field(
        "cloud", description="the client's proximal solve starts from u_i ('cloud') or its w_i"
    )


def attention_derivative(squared_distance: np.ndarray, sigma: float) -> np.ndarray:
    """A'(x) = e^{−x/σ} / σ, the derivative of A(x) = 1 − e^{−x/σ}."""
    return np.exp(-np.asarray(squared_distance, dtype=np.float64) / sigma) / sigma


def squared_distances(vectors: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
    """‖v_i − v_j‖² for the given rows i (all by default) and every j, summed in float64
    one pair at a time (no m × d float64 copy)."""
    picked = range(len(vectors)) if rows is None else list(rows)
    out = np.empty((len(picked), len(vectors)))
    for r, i in enumerate(picked):
        row = np.asarray(vectors[i], dtype=np.float64)
        for j, other in enumerate(vectors):
            diff = np.asarray(other, dtype=np.float64) - row
            out[r, j] = float(diff @ diff)
    return out


def attention_weights(
    squared_distance_row: np.ndarray, own: int, alpha: float, sigma: float
) -> np.ndarray:
    """Client ``own``'s weights ξ_{own,·} over every client (they sum to one, all ≥ 0).

    ξ_{i,j} = α A'(d_{ij}) for j ≠ i and ξ_{i,i} = 1 − Σ_{j≠i} ξ_{i,j}; where that would be
    negative, the other weights are scaled to sum to one and ξ_{i,i} = 0.
    """
    row = np.asarray(squared_distance_row, dtype=np.float64)
    weights = alpha * attention_derivative(row, sigma)
    weights[own] = 0.0
    total = weights.sum()
    if total > 1.0:
        weights /= total
    else:
        weights[own] = 1.0 - total
    return weights


def cloud_model(records: Sequence[ArrayRecord], weights: np.ndarray) -> ArrayRecord:
    """u_i = Σ_j ξ_ij w_j for a row ξ_i of the attention matrix (summing to 1):
    :func:`~pflarena.strategies.aggregation.weighted_mean`, whose one rule integer entries
    (batch counters) follow."""
    return as_record(weighted_mean(records, weights))


class FedAMP(PflStrategy):
    """FedAMP: server-side attentive message passing; clients solve a proximal problem.

    Parameters
    ----------
    trainable
        Names of the model's trainable parameters (distances are taken over them).
    Others
        See :class:`FedAMPParams`.
    """

    declaration = MethodDeclaration(
        name="fedamp",
        kind="baseline",
        reference="Huang, Chu, Zhou, Wang, Liu, Pei and Zhang, Personalized Cross-Silo "
        "Federated Learning on Non-IID Data, AAAI 2021",
        summary="the server builds each client's cloud model from similarity-weighted "
        "client models (attentive message passing); clients train toward it; no global model",
        solver="pflarena.methods.fedamp.solver",
        params=FedAMPParams,
        global_model=False,
    )
    client_models = (1, "its personalized model")
    pool_models = (1, "its latest model")
    checkpointed = {"attention": "fedamp/attention"}

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        n = federation.num_clients
        return [
            *super().checkpoint_footprint(params, federation),
            Footprint(f"the attention matrix ({n} x {n} float64)", n * n * FLOAT64),
        ]

    @classmethod
    def from_setup(cls, setup) -> FedAMP:
        return cls(setup.params, **setup.common(cls.declaration), trainable=setup.trainable)

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """Every client's latest model, read whole once a round, and flattened beside it;
        the attention matrix; a cloud model per sampled client."""
        n, f = federation.num_clients, federation
        return [
            *super().server_footprint(params, federation),
            Footprint(f"every client's latest model, read for the cloud models ({n})",
                      n * f.model_bytes),
            Footprint(f"those models flattened for their distances ({n} x {f.model_params} "
                      "float32)", n * f.model_params * FLOAT32),
            Footprint(f"the attention matrix ({n} x {n} float64)", n * n * FLOAT64),
            Footprint(f"the round's cloud models ({f.sampled})", f.sampled * f.model_bytes),
        ]  # fmt: skip

    def __init__(
        self, params: FedAMPParams | None = None, *, trainable: Sequence[str] = (), **kwargs: Any
    ) -> None:
        super().__init__(params, **kwargs)
        if self.num_clients is None:
            raise ValueError("fedamp needs num_clients (every client's model enters u_i)")
        self.trainable = tuple(trainable)
        #: this round: client id -> its weights ξ_{i,·}
        self.weights: dict[int, np.ndarray] = {}
        self._models: list[ArrayRecord] | None = None
        self._vectors: np.ndarray | None = None
        #: the latest ξ row of every client that was sent a cloud model (for the picture)
        self.attention = np.full((self.num_clients, self.num_clients), np.nan)

    # ------------------------------------------------------------------ messages
    def _latest_models(self, initial: ArrayRecord) -> list[ArrayRecord]:
        pool = self.pool(MODELS)
        models = []
        for client in range(self.num_clients or 0):
            record = pool.get(client, MODELS)
            models.append(record if record is not None else initial)
        return models

    def _vector(self, record: ArrayRecord) -> np.ndarray:
        names = self.trainable or float_names(record)
        return flatten(record, names, np.float32)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.server_round = server_round
        self.weights, self._models, self._vectors = {}, None, None
        return super().configure_train(server_round, arrays, config, grid)

    def cloud_for(self, client: int, initial: ArrayRecord) -> ArrayRecord:
        """u_i for ``client`` from every client's latest model (read once per round)."""
        if self._models is None or self._vectors is None:
            self._models = self._latest_models(initial)
            # each row written in place: a list of the vectors, stacked, would hold them twice
            first = self._vector(self._models[0])
            self._vectors = np.empty((len(self._models), first.size), np.float32)
            for i, record in enumerate(self._models):
                self._vectors[i] = first if i == 0 else self._vector(record)
        row = squared_distances(self._vectors, [client])[0]
        weights = attention_weights(row, client, self.params.alpha, self.params.sigma)
        self.weights[client] = weights
        self.attention[client] = weights
        return cloud_model(self._models, weights)

    def train_config(self, server_round: int, node_id: int) -> dict:
        return {
            **super().train_config(server_round, node_id),
            **self.method_config(
                proximal=self.params.lambda_ / self.params.alpha, start=self.params.start
            ),
        }

    def train_content(
        self, server_round: int, node_id: int, arrays: ArrayRecord, config: dict
    ) -> RecordDict:
        client = self.client_ids.get(node_id)
        # a node whose client id is unknown (none after round 0) gets the initial model
        cloud = arrays if client is None else self.cloud_for(client, arrays)
        return RecordDict({keys.ARRAYS: cloud, keys.CONFIG: ConfigRecord(config)})

    # ------------------------------------------------------------------ replies
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
        metrics = self.train_metrics(valid)
        assert metrics is not None
        self_weights = [w[c] for c, w in self.weights.items()]
        if self_weights:
            metrics["mean-self-weight"] = float(np.mean(self_weights))
            metrics["min-self-weight"] = float(np.min(self_weights))
        return None, metrics

    # ------------------------------------------------------------------ results
    def run_summary(self) -> dict[str, Any]:
        return self.params.model_dump(by_alias=True)

    def write_artifacts(self, output_dir: Path) -> list[Path]:
        """``attention.csv``: each client's latest weights ξ_{i,·} (row i; NaN: never sampled)."""
        path = output_dir / "attention.csv"
        np.savetxt(
            path, self.attention, delimiter=",", fmt="%.6g", header="row: client i, column: ξ_ij"
        )
        return [path]
