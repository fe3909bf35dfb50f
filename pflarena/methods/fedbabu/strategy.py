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

from typing import Any

from pflarena.core.methods import MethodDeclaration
from pflarena.methods.fedavg.partial import PartialFedAvg
from pflarena.methods.fedbabu.params import FedBABUParams

__all__ = ["FedBABU", "FedBABUParams"]


class FedBABU(PartialFedAvg):
    """FedBABU: FedAvg of the body under a frozen random head; fine-tuned evaluation."""

    declaration = MethodDeclaration(
        name="fedbabu",
        kind="baseline",
        reference="Oh, Kim and Yun, FedBABU: Towards Enhanced Representation for Federated "
        "Image Classification, ICLR 2022",
        summary="federated training of the body under a fixed random head; each client "
        "fine-tunes the whole model before evaluating it",
        solver="pflarena.methods.fedbabu.solver",
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
