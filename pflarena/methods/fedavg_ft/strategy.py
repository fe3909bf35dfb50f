"""FedAvg with local fine-tuning before evaluation (Wang et al., 2019).

The reading of the paper, decisions and measurements: docs/methods/fedavg-ft.md.
"""

from __future__ import annotations

from pydantic import Field

from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.fedavg.strategy import FedAvg

__all__ = ["FedAvgFT", "FedAvgFTParams"]


class FedAvgFTParams(MethodParams):
    finetune_epochs: int = Field(
        1, ge=0, description="local epochs of fine-tuning the global model before evaluation"
    )


class FedAvgFT(FedAvg):
    """FedAvg whose personalized model is the global model fine-tuned on local data.

    Training is FedAvg's. At evaluation each client copies the global model, runs
    ``finetune_epochs`` epochs of local SGD (the run's learning rate, momentum and weight
    decay) on its training split and evaluates that copy on its test split; the fine-tuned
    copy is discarded, so fine-tuning never feeds back into training. Global accuracy is
    the un-tuned global model's.
    """

    declaration = MethodDeclaration(
        name="fedavg-ft",
        kind="baseline",
        reference="Wang et al., Federated Evaluation of On-device Personalization, "
        "arXiv:1910.10252, 2019",
        summary="FedAvg; each client fine-tunes the global model locally before evaluating it",
        solver="pflarena.methods.fedavg_ft.solver",
        params=FedAvgFTParams,
    )

    def evaluate_config(self, server_round: int) -> dict:
        return {
            **super().evaluate_config(server_round),
            **self.training.to_config(server_round),
            **self.params_config(),
        }
