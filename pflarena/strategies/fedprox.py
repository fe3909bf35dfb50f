"""FedProx (Li et al., 2020): FedAvg with a proximal term in the local objective."""

from __future__ import annotations

from pflarena.core import keys
from pflarena.strategies.base import LocalTraining
from pflarena.strategies.fedavg import FedAvg

__all__ = ["FedProx"]


class FedProx(FedAvg):
    """FedProx: clients minimise ``f_i(w) + (mu/2) ||w - w_global||^2`` (Li et al., Eq. 2).

    Aggregation is FedAvg's example-weighted average; only the local objective changes.
    """

    method = "fedprox"

    def __init__(
        self, *, proximal_mu: float = 0.01, training: LocalTraining | None = None, **kwargs
    ) -> None:
        super().__init__(training=training, **kwargs)
        if proximal_mu < 0:
            raise ValueError(f"proximal_mu must be >= 0, got {proximal_mu}")
        self.proximal_mu = proximal_mu

    def train_config(self, server_round: int, node_id: int) -> dict:
        return {**super().train_config(server_round, node_id), keys.PROXIMAL_MU: self.proximal_mu}
