"""Fed-ROD (Chen and Chao, ICLR 2022): a generic head on the balanced risk, averaged, and a
personalized head on its residual, kept by each client.

"On Bridging Generic and Personalized Federated Learning for Image Classification". The
model is split into a feature extractor θ (the body), a generic head ψ and, per client m, a
personalized head φ_m of the same layers. Each round (Algorithm 1) a sampled client trains
θ and ψ on the balanced-softmax loss (Eq. 5), whose class counts ``N_{m,c}`` make every
client's objective an estimate of the same class-balanced risk, and trains φ_m on the
ordinary empirical risk of the combined prediction ``h^G(z; ψ) + h^P(z; φ_m)`` (Section 4.2:
the personalized predictor is a lightweight module on top of the generic one, learning its
residual). The server averages θ and ψ by examples (FedAvg); φ_m never leaves the client.
The personalized model is ``h^G + h^P`` on the client's features; the global (generic)
model is θ with ψ.

Defaults: γ = 1, Ren et al.'s balanced softmax, which the paper's Eq. 5 takes over (the
Fed-ROD code of PFLlib and FL-bench's default use the same; not confirmed from the paper's
text); a one-layer head (the classifier), as the paper's CNNs
and ResNets split. The paper's hypernetwork variant of φ_m (Fed-ROD with a hypernetwork
generating the personalized head from the class distribution) is not implemented.

The reading of the paper, decisions and measurements: docs/methods/fedrod.md.
"""

from __future__ import annotations

from typing import Any

from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration
from pflarena.core.model_split import split_names
from pflarena.methods.fedavg.strategy import FedAvg
from pflarena.methods.fedrod.params import FedRoDParams
from pflarena.strategies.base import StrategySetup

__all__ = ["FedRoD", "FedRoDParams"]


class FedRoD(FedAvg):
    """Fed-ROD: FedAvg of the body and the generic head; a personalized head per client.

    Parameters
    ----------
    trainable
        The model's trainable parameter names (state order), to check that it has a head of
        ``head_layers`` layers and a body.
    Others
        See :class:`FedRoDParams`.
    """

    declaration = MethodDeclaration(
        name="fedrod",
        kind="baseline",
        reference="Chen and Chao, On Bridging Generic and Personalized Federated Learning for "
        "Image Classification, ICLR 2022",
        summary="body and generic head averaged, trained with the balanced-softmax loss; a "
        "personalized head per client learns the generic head's residual",
        solver="pflarena.methods.fedrod.solver",
        params=FedRoDParams,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        head = federation.split(params.head_layers).head
        return [Footprint("its personal head", federation.entry_bytes(head))]

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> FedRoD:
        return cls(setup.params, **setup.common(cls.declaration), trainable=setup.trainable)

    def __init__(
        self,
        params: FedRoDParams | None = None,
        *,
        trainable: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(params, **kwargs)
        if trainable:  # the head must leave a body (SplitError says why not)
            split_names(trainable, trainable, self.params.head_layers)

    def train_config(self, server_round: int, node_id: int) -> dict:
        return {
            **super().train_config(server_round, node_id),
            **self.params_config(),
        }

    def evaluate_config(self, server_round: int) -> dict:
        return {
            **super().evaluate_config(server_round),
            **self.params_config(),
        }

    def run_summary(self) -> dict[str, Any]:
        return self.params.model_dump(by_alias=True)
