"""Ditto (Li et al., 2021): a FedAvg global model plus a proximally regularised personal model."""

from __future__ import annotations

from pflarena.core import keys
from pflarena.strategies.base import LocalTraining
from pflarena.strategies.fedavg import FedAvg

__all__ = ["Ditto"]


class Ditto(FedAvg):
    """Ditto, Li et al. (2021), Algorithm 1.

    The global model is trained and averaged exactly as in FedAvg. In each round a sampled
    client also updates its personal model ``v_i`` (kept on the client) by SGD on
    ``f_i(v) + (lambda/2) ||v - w^t||^2`` for ``personal_epochs`` epochs, where ``w^t`` is
    the global model it received. The personalized model is ``v_i``.
    """

    method = "ditto"

    def __init__(
        self,
        *,
        ditto_lambda: float = 0.1,
        personal_epochs: int = 1,
        training: LocalTraining | None = None,
        **kwargs,
    ) -> None:
        super().__init__(training=training, **kwargs)
        if ditto_lambda < 0:
            raise ValueError(f"ditto_lambda must be >= 0, got {ditto_lambda}")
        self.ditto_lambda = ditto_lambda
        self.personal_epochs = personal_epochs

    def train_config(self, server_round: int, node_id: int) -> dict:
        return {
            **super().train_config(server_round, node_id),
            keys.DITTO_LAMBDA: self.ditto_lambda,
            keys.PERSONAL_EPOCHS: self.personal_epochs,
        }
