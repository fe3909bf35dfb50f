"""FedEM: federated EM over a mixture of M component models (the mixture ancestor of PPFL).

Marfoq, Neglia, Bellet, Kameni and Vidal, "Federated Multi-Task Learning under a Mixture
of Distributions", NeurIPS 2021, Algorithm 1 (FedEM, client-server). Each client's
distribution is a mixture of M shared components: ``p_i(x, y) = Σ_m π_im p_m(y|x) p(x)``
with client-specific weights π_i on the simplex (Assumption 2). The server keeps the
component models θ_1..θ_M (a stacked state, ``component.<m>.<name>``, each initialised
differently); client i keeps π_i in its own state. Each round (one exchange):

1. the server sends every component model to the sampled clients;
2. **E-step** on the client: for each training sample s, the posterior
   ``q_i(z_s = m) ∝ π_im exp(−ℓ(h_{θ_m}(x_s), y_s))``;
3. **M-step** for the weights: ``π_im ← (1/n_i) Σ_s q_i(z_s = m)``;
4. **M-step** for the components: for each m, ``local-epochs`` of SGD from θ_m on the
   q-weighted loss ``(1/|B|) Σ_{s∈B} q_i(z_s = m) ℓ(h_{θ_m}(x_s), y_s)`` (the authors'
   LocalSolver); the client returns the M updated models;
5. the server averages each component over the clients, weighted by n_i/n.

A client's personalized prediction is the mixture ``Σ_m π_im p_{θ_m}(y|x)`` with its current
π_i (FedEM's inference for a client seen in training). It sends M full models each way per
round, the O(Md) cost the PPFL paper compares against (docs/papers/ppfl.md §10).

The reading of the paper, decisions and measurements: docs/methods/fedem.md.
"""

from __future__ import annotations

from typing import Any

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

from pflarena.core import keys
from pflarena.core.footprint import FLOAT64, Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.fedem import keys as fedem_keys
from pflarena.strategies.aggregation import weighted_average
from pflarena.strategies.base import Send, array_problem
from pflarena.strategies.stacked import StackedModelsStrategy

__all__ = ["FedEM", "FedEMParams"]

COMPONENT_PREFIX = fedem_keys.COMPONENT_PREFIX


class FedEMParams(MethodParams):
    """FedEM's parameters (Marfoq et al. 2021)."""

    num_components: int = Field(3, ge=1, le=64, description="M, the number of mixture components")


class FedEM(StackedModelsStrategy):
    """Algorithm 1 of Marfoq et al. (2021): E and M steps on the clients, averaged components."""

    declaration = MethodDeclaration(
        name="fedem",
        kind="baseline",
        reference="Marfoq, Neglia, Bellet, Kameni, Vidal, Federated Multi-Task Learning under "
        "a Mixture of Distributions, NeurIPS 2021",
        summary="M shared component models, per-client mixture weights learnt by federated "
        "EM; personalized = the client's mixture of the components",
        solver="pflarena.methods.fedem.solver",
        params=FedEMParams,
        global_model=False,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        return [Footprint("its mixture weights (float64)", FLOAT64 * params.num_components)]

    prefix = COMPONENT_PREFIX

    @classmethod
    def copies(cls, params: Any) -> tuple[int, int]:
        return params.num_components, 0

    def _check(self, content: RecordDict, stacked: ArrayRecord) -> str | None:
        examples = content[keys.METRICS].get(keys.NUM_EXAMPLES)
        if not isinstance(examples, int | float) or isinstance(examples, bool) or examples <= 0:
            return (
                f"metric {keys.NUM_EXAMPLES!r} must be > 0 to weight the update, got {examples!r}"
            )
        return array_problem(content, stacked, keys.ARRAYS)

    def train_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, send: Send
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.server_round = server_round
        stacked = self.stacked(arrays)
        self._round_arrays = stacked
        self.last_sampled = nodes = self.sample_train_nodes(grid)
        config = ConfigRecord(self.round_config(server_round))
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
        replies = self.valid_replies(exchange, lambda c: self._check(c, stacked))
        self.last_failed = exchange.failed
        if not replies:
            return None, None
        weights = [float(m.content[keys.METRICS][keys.NUM_EXAMPLES]) for m in replies]
        new = weighted_average([m.content[keys.ARRAYS] for m in replies], weights)
        metrics = self.train_metrics(replies) or MetricRecord({})
        entropies = [float(m.content[keys.METRICS].get(fedem_keys.ENTROPY, 0.0)) for m in replies]
        metrics["mixture-entropy"] = float(np.mean(entropies))
        return new, metrics
