"""FedBABU (Oh, Kim and Yun, ICLR 2022): train the body only, under a fixed random head.

"FedBABU: Towards Enhanced Representation for Federated Image Classification". The model is
a body (extractor) and a head (the last ``head_layers`` layers with weights, the final
linear classifier by default). During federated training the head keeps its
random initialisation on every client and is never updated: a sampled client receives the
body, trains it by local SGD with the head frozen, and sends the body back; the server
averages the bodies. Personalization happens at evaluation: each client fine-tunes the whole
global model (body and head, the paper's default) on its training split for
``finetune-epochs`` epochs and evaluates that copy; the copy is discarded, so fine-tuning
never feeds back into training. Global accuracy is the un-tuned global model's (averaged
body with the initial head).

The head is the run's seeded initial head, the same on the server and every client, so only
the body travels (sending the fixed head would add bytes and nothing else). Defaults: 5
fine-tuning epochs (the authors' code, ``--ft_ep 5``); the bodies averaged uniformly over
the sampled clients, as the authors' code does (``torch.div(w_glob[k], m)``).

The reading of the paper, decisions and measurements: docs/methods/fedbabu.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.strategies.split_model import PartialFedAvg, split_problem

__all__ = ["FedBABU", "FedBABUParams"]


class FedBABUParams(MethodParams):
    """FedBABU's parameters; defaults from the authors' code."""

    finetune_epochs: int = Field(
        5, ge=0, description="τ_f: epochs of fine-tuning the whole model before evaluation"
    )
    head_layers: int = Field(
        1, ge=1, description="final layers with weights in the fixed random head"
    )
    weighting: Literal["examples", "uniform"] = Field(
        "uniform", description="body average: uniform (code) or by training examples"
    )

    def run_problems(self, cfg) -> list[str]:
        return split_problem(cfg, self.head_layers, "fedbabu.head-layers") if cfg else []


class FedBABU(PartialFedAvg):
    """FedBABU: FedAvg of the body under a frozen random head; fine-tuned evaluation."""

    declaration = MethodDeclaration(
        name="fedbabu",
        kind="baseline",
        reference="Oh, Kim and Yun, FedBABU: Towards Enhanced Representation for Federated "
        "Image Classification, ICLR 2022",
        summary="federated training of the body under a fixed random head; each client "
        "fine-tunes the whole model before evaluating it",
        solver="pflarena.client.solvers.fedbabu",
        params=FedBABUParams,
    )
    shared = "body"

    def evaluate_config(self, server_round: int) -> dict:
        return {
            **super().evaluate_config(server_round),
            **self.training.to_config(server_round),
            **self.method_config(**{"finetune-epochs": self.params.finetune_epochs}),
        }

    def run_summary(self) -> dict[str, Any]:
        return super().run_summary() | {"finetune-epochs": self.params.finetune_epochs}
