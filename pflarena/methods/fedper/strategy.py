"""FedPer (Arivazhagan et al., 2019): shared base layers, personalization layers on the client.

"Federated Learning with Personalization Layers", arXiv:1912.00818. The model is split into
base layers (the body) and personalization layers (the head: the last ``head_layers``
layers with weights, 1 by default, the final classifier). Each round a sampled client
receives the base layers, trains base and personalization layers jointly by SGD on its data
(the run's local epochs), keeps its personalization layers and sends back its base layers
only; the server averages the base layers as FedAvg does (weights n_j / n). The
personalization layers never leave the client; they start as the run's initial head on
every client. The same method is the "Partial FL" baseline of the PPFL paper.

The personalized model of client j is the latest base layers with its own personalization
layers; there is no global model (no shared head). Where the paper leaves a choice open,
``docs/methods/fedper.md`` says what is taken here.

The reading of the paper, decisions and measurements: docs/methods/fedper.md.
"""

from __future__ import annotations

from typing import Any

from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration
from pflarena.methods.fedavg.partial import PartialFedAvg
from pflarena.methods.fedper.params import FedPerParams

__all__ = ["FedPer", "FedPerParams"]


class FedPer(PartialFedAvg):
    """FedPer: FedAvg of the body; each client trains body and head jointly and keeps the head."""

    declaration = MethodDeclaration(
        name="fedper",
        kind="baseline",
        reference="Arivazhagan, Aggarwal, Singh and Choudhary, Federated Learning with "
        "Personalization Layers, arXiv:1912.00818, 2019",
        summary="shared body averaged by FedAvg, personal head trained jointly with it and "
        "kept on the client (the PPFL paper's Partial FL)",
        solver="pflarena.methods.fedper.solver",
        params=FedPerParams,
        global_model=False,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        head = federation.split(params.head_layers).head
        return [Footprint("its head", federation.entry_bytes(head))]

    shared = "body"
