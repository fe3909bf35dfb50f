"""FedRecon (Singhal et al., NeurIPS 2021): partially local federated learning by
reconstruction.

"Federated Reconstruction: Partially Local Federated Learning". The model's parameters are
partitioned into global parameters g and local parameters l. Each round (Algorithm 1) the
server sends g to the sampled clients; each client reconstructs its l from scratch on a
support set with g frozen (a fresh initialisation and ``reconstruction-epochs`` epochs of
SGD), then updates g on a query set with l frozen (``local-epochs`` epochs) and returns g
only. l is neither sent nor kept: clients are stateless, and every evaluation reconstructs
l before predicting (the paper's inference for any client, seen or new). The server
averages the returned g, weighted by the examples that updated it (the authors' code's
client weight; its server optimizer at step size 1 is this average).

Here g is the body and l the head of :mod:`pflarena.core.model_split` (``head-layers`` final
weighted layers): the paper's partition is model-specific (user embeddings in matrix
factorisation, local vocabulary embeddings in next-word prediction); for the image and
feature classifiers of this toolkit the classifier head is the user-specific part.

Defaults are those of the authors' code (``google-research/federated/reconstruction`` and
TensorFlow Federated's ``build_fed_recon``): one reconstruction epoch per round
(``recon_epochs_max``), the same step size for reconstruction as for the global update
(0.1 both there; here the run's lr), a fresh initialisation of l every round (the local
variables of a model built anew each round), and, in training, the whole training split as
both support and query (the code's default ``split_dataset=False``; ``support-fraction``
below 1 gives Algorithm 1's disjoint support and query sets). The global update runs the
run's ``local-epochs`` (the code's ``post_recon_epochs`` is 1). Evaluation reconstructs on
the training split and tests on the test split, which are disjoint, as the code's
evaluation is.

The reading of the paper, decisions and measurements: docs/methods/fedrecon.md.
"""

from __future__ import annotations

from typing import Any

from pflarena.core.methods import MethodDeclaration
from pflarena.methods.fedavg.partial import PartialFedAvg
from pflarena.methods.fedrecon.params import FedReconParams

__all__ = ["FedRecon", "FedReconParams"]

#: the fields the solver's reconstruction reads (sent with every message)
RECONSTRUCTION = {"support_fraction", "reconstruction_epochs", "reconstruction_lr", "local_init"}


class FedRecon(PartialFedAvg):
    """FedRecon: the body travels and is averaged; the head is rebuilt on every client.

    Parameters
    ----------
    See :class:`FedReconParams`; ``trainable`` names the model's trainable parameters.
    """

    declaration = MethodDeclaration(
        name="fedrecon",
        kind="baseline",
        reference="Singhal, Sidahmed, Garrett, Wu, Rush and Prakash, Federated Reconstruction: "
        "Partially Local Federated Learning, NeurIPS 2021",
        summary="global body averaged; each client reconstructs its local head from scratch "
        "every round (support set, body frozen), then updates the body (query set, head "
        "frozen); local parameters are never kept or sent",
        solver="pflarena.methods.fedrecon.solver",
        params=FedReconParams,
        global_model=False,
    )
    shared = "body"

    def reconstruction(self) -> dict[str, Any]:
        """The reconstruction settings, by their run-config keys (without the prefix)."""
        return self.params.model_dump(by_alias=True, include=RECONSTRUCTION)

    def split_config(self, server_round: int) -> dict[str, Any]:
        """The split, the reconstruction settings, and (for the evaluation's
        reconstruction) the local-training settings."""
        return {
            **super().split_config(server_round),
            **self.method_config(**self.reconstruction()),
            **self.training.to_config(server_round),
        }

    def run_summary(self) -> dict[str, Any]:
        return {**super().run_summary(), **self.reconstruction()}
