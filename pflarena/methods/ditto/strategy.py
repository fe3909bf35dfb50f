"""Ditto (Li et al., 2021): a FedAvg global model plus a proximally regularised personal model.

The reading of the paper, decisions and measurements: docs/methods/ditto.md.
"""

from __future__ import annotations

from pydantic import Field

from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.fedavg.strategy import FedAvg

__all__ = ["Ditto", "DittoParams"]


class DittoParams(MethodParams):
    lambda_: float = Field(
        0.1, ge=0, description="proximal weight λ tying the personal model to the global one"
    )
    personal_epochs: int = Field(
        1, ge=0, description="local epochs of the personal model per round"
    )


class Ditto(FedAvg):
    """Ditto, Li et al. (2021), Algorithm 1.

    The global model is trained and averaged exactly as in FedAvg. In each round a sampled
    client also updates its personal model ``v_i`` (kept on the client) by SGD on
    ``f_i(v) + (lambda/2) ||v - w^t||^2`` for ``personal_epochs`` epochs, where ``w^t`` is
    the global model it received. The personalized model is ``v_i``.
    """

    declaration = MethodDeclaration(
        name="ditto",
        kind="baseline",
        reference="Li et al., Ditto: Fair and Robust Federated Learning Through "
        "Personalization, ICML 2021",
        summary="FedAvg plus a personal model regularised toward the global one",
        solver="pflarena.methods.ditto.solver",
        params=DittoParams,
    )
    client_models = (1, "its personal model")

    def train_config(self, server_round: int, node_id: int) -> dict:
        return super().train_config(server_round, node_id) | self.params_config()
