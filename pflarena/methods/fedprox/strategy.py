"""FedProx (Li et al., 2020): FedAvg with a proximal term in the local objective.

The reading of the paper, decisions and measurements: docs/methods/fedprox.md.
"""

from __future__ import annotations

from pydantic import Field

from pflarena.core.methods import MethodDeclaration
from pflarena.methods.fedavg.strategy import FedAvg, FedAvgParams

__all__ = ["FedProx", "FedProxParams"]


class FedProxParams(FedAvgParams):
    mu: float = Field(
        0.01, ge=0, description="proximal weight μ in f_i(w) + (μ/2)||w − w_global||²"
    )


class FedProx(FedAvg):
    """FedProx: clients minimise ``f_i(w) + (mu/2) ||w - w_global||^2`` (Li et al., Eq. 2).

    Aggregation is FedAvg's example-weighted average; only the local objective changes.
    """

    declaration = MethodDeclaration(
        name="fedprox",
        kind="baseline",
        reference="Li et al., Federated Optimization in Heterogeneous Networks, MLSys 2020",
        summary="FedAvg with a proximal term pulling local models toward the global one",
        solver="pflarena.methods.fedavg.solver",
        params=FedProxParams,
    )

    def train_config(self, server_round: int, node_id: int) -> dict:
        return super().train_config(server_round, node_id) | self.method_config(mu=self.params.mu)
