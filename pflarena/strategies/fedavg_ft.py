"""FedAvg with local fine-tuning before evaluation (Wang et al., 2019)."""

from __future__ import annotations

from pflarena.core import keys
from pflarena.strategies.base import LocalTraining
from pflarena.strategies.fedavg import FedAvg

__all__ = ["FedAvgFT"]


class FedAvgFT(FedAvg):
    """FedAvg whose personalized model is the global model fine-tuned on local data.

    Training is FedAvg's. At evaluation each client copies the global model, runs
    ``finetune_epochs`` epochs of local SGD on its training split and evaluates that copy
    on its test split; the fine-tuned copy is discarded, so fine-tuning never feeds back
    into training. Global accuracy is the un-tuned global model's.
    """

    method = "fedavg-ft"

    def __init__(
        self, *, finetune_epochs: int = 1, training: LocalTraining | None = None, **kwargs
    ) -> None:
        super().__init__(training=training, **kwargs)
        self.finetune_epochs = finetune_epochs

    def evaluate_config(self, server_round: int) -> dict:
        return {
            **super().evaluate_config(server_round),
            keys.PERSONAL_EPOCHS: self.finetune_epochs,
            keys.LR: self.training.lr,
        }
