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

from typing import Any

from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration
from pflarena.methods.fedavg.partial import PartialFedAvg
from pflarena.methods.fedrep.params import FedRepParams

__all__ = ["FedRep", "FedRepParams"]


class FedRep(PartialFedAvg):
    """FedRep: head epochs then representation epochs per round; only φ is averaged."""

    declaration = MethodDeclaration(
        name="fedrep",
        kind="baseline",
        reference="Collins, Hassani, Mokhtari and Shakkottai, Exploiting Shared "
        "Representations for Personalized Federated Learning, ICML 2021",
        summary="clients update their local head (τ_h epochs), then the shared "
        "representation (τ epochs); only the representation is averaged",
        solver="pflarena.methods.fedrep.solver",
        params=FedRepParams,
        global_model=False,
        honours=frozenset(
            {"batch-size", "lr", "momentum", "weight-decay", "lr-milestones", "lr-gamma"}
        ),
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        head = federation.split(params.head_layers).head
        return [Footprint("its head", federation.entry_bytes(head))]

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
