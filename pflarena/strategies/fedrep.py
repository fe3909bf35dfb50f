"""FedRep (Collins et al., ICML 2021): a shared representation, local heads updated first.

"Exploiting Shared Representations for Personalized Federated Learning". The model is a
representation φ (the body) and a head h_i per client (the last ``head_layers`` layers with
weights). Each round (Algorithm 1) a sampled client i

1. receives the current representation φ^t and, with φ^t fixed, updates its own head h_i
   by τ_h local epochs of SGD (``head-epochs``; the paper's "many local updates" of the
   low-dimensional head);
2. with its new head fixed, updates the representation by τ local epochs
   (``body-epochs``), giving φ_i^{t+1};
3. keeps h_i and sends φ_i^{t+1} only.

The server averages the representations (``weighting``). The head never leaves the client;
it starts as the run's initial head. Defaults: 10 head epochs and 1 representation epoch,
the authors' CIFAR-10 script (``--local_ep 11 --local_rep_ep 1``; their CIFAR-100 and
FEMNIST scripts use 10 and 5); the average weighted by training examples, as the authors'
code does. The run's ``local-epochs`` is replaced by these two and refused if set.

The personalized model of client i is the latest φ with its h_i; there is no global model.

The reading of the paper, decisions and measurements: docs/methods/fedrep.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.strategies.split_model import PartialFedAvg, split_problem

__all__ = ["FedRep", "FedRepParams"]


class FedRepParams(MethodParams):
    """FedRep's parameters; defaults from the authors' CIFAR-10 setting."""

    head_epochs: int = Field(
        10, ge=0, description="τ_h: local epochs of the head per round, the representation fixed"
    )
    body_epochs: int = Field(
        1, ge=0, description="τ: local epochs of the representation per round, the head fixed"
    )
    head_layers: int = Field(1, ge=1, description="final layers with weights in the local head")
    weighting: Literal["examples", "uniform"] = Field(
        "examples", description="representation average: by training examples (code) or uniform"
    )

    @model_validator(mode="after")
    def _something_trains(self) -> FedRepParams:
        if self.head_epochs + self.body_epochs == 0:
            raise ValueError("fedrep.head-epochs and fedrep.body-epochs are both 0: nothing trains")
        return self

    def run_problems(self, cfg) -> list[str]:
        return [] if cfg is None else split_problem(cfg, self.head_layers, "fedrep.head-layers")


class FedRep(PartialFedAvg):
    """FedRep: head epochs then representation epochs per round; only φ is averaged."""

    declaration = MethodDeclaration(
        name="fedrep",
        kind="baseline",
        reference="Collins, Hassani, Mokhtari and Shakkottai, Exploiting Shared "
        "Representations for Personalized Federated Learning, ICML 2021",
        summary="clients update their local head (τ_h epochs), then the shared "
        "representation (τ epochs); only the representation is averaged",
        solver="pflarena.client.solvers.fedrep",
        params=FedRepParams,
        global_model=False,
        honours=frozenset(
            {"batch-size", "lr", "momentum", "weight-decay", "lr-milestones", "lr-gamma"}
        ),
    )
    shared = "body"

    def train_config(self, server_round: int, node_id: int) -> dict:
        return {
            **super().train_config(server_round, node_id),
            **self.method_config(
                **{"head-epochs": self.params.head_epochs, "body-epochs": self.params.body_epochs}
            ),
        }

    def run_summary(self) -> dict[str, Any]:
        return super().run_summary() | {
            "head-epochs": self.params.head_epochs,
            "body-epochs": self.params.body_epochs,
        }
