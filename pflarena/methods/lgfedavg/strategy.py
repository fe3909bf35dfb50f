"""LG-FedAvg (Liang et al., 2020): local representations, a global head.

"Think Locally, Act Globally: Federated Learning with Local and Global Representations",
arXiv:2001.01523. The reverse of FedPer's split: each client keeps its own lower layers
(the local representation, the body) and the last ``global-layers`` layers with weights
(the global model on top, the head) are shared. Each round a sampled client receives the
global layers, trains its local and the global layers jointly on its data (the run's local
epochs), keeps its local layers and sends back the global layers only; the server averages
them. Local layers never leave their client; they start as the run's initial body.

Defaults from the authors' code (pliang279/LG-FedAvg): 2 global layers (their CIFAR-10
CNN, ``--num_layers_keep 2``; their MNIST MLP keeps 3), the global layers averaged
uniformly over the sampled clients (``torch.div(w_glob[k], m)``). The code starts every
client from a FedAvg model trained beforehand (``--load_fed``); here they start from the
run's initial model (see ``docs/methods/lgfedavg.md``).

The personalized model of a client is its local layers under the latest global layers;
there is no global model (the global layers alone are no classifier).

The reading of the paper, decisions and measurements: docs/methods/lgfedavg.md.
"""

from __future__ import annotations

from typing import Any

from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration
from pflarena.methods.fedavg.partial import PartialFedAvg
from pflarena.methods.lgfedavg.params import LGFedAvgParams

__all__ = ["LGFedAvg", "LGFedAvgParams"]


class LGFedAvg(PartialFedAvg):
    """LG-FedAvg: FedAvg of the top layers; each client keeps its lower layers."""

    declaration = MethodDeclaration(
        name="lgfedavg",
        kind="baseline",
        reference="Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov and Morency, "
        "Think Locally, Act Globally: Federated Learning with Local and Global "
        "Representations, arXiv:2001.01523, 2020",
        summary="local representation layers kept on each client, the top (global) layers "
        "shared and averaged",
        solver="pflarena.methods.lgfedavg.solver",
        params=LGFedAvgParams,
        global_model=False,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        local = federation.split(params.global_layers).body
        return [Footprint("its local layers", federation.entry_bytes(local))]

    shared = "head"

    layers_field = "global_layers"
