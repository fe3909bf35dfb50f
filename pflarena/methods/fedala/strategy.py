"""FedALA (Zhang et al., AAAI 2023): adaptive local aggregation of the global model.

"FedALA: Adaptive Local Aggregation for Personalized Federated Learning". The server is
FedAvg (an example-weighted average of the clients' trained models). What changes is how a
client starts its local training: instead of overwriting its local model Θ_i with the
received global model Θ, it aggregates the two element by element (Eq. 4, 5)::

    Θ̂_i = Θ_i + (Θ − Θ_i) ⊙ [1^{|Θ|−p}; W_i^p]

The lower layers take the global model (weights fixed at 1); on the p highest layers each
element has its own learned weight in [0, 1], trained on a random s % of the local training
data with the global and local models fixed (Eq. 6)::

    W_i^p ← clip(W_i^p − η ∇_{W} L(Θ̂_i, D_i^s), 0, 1)
    ∇_W L = ∇_{Θ̂} L ⊙ (Θ − Θ_i)

then trains Θ̂_i locally and uploads it (Algorithm 1). The weights are kept between rounds
and start at 1. In a client's first aggregation they are trained until the loss settles (the
standard deviation of the last ``loss-window`` epoch losses below ``threshold``), afterwards
one epoch per round. At a client's first round its local model is the global model, so ALA
has nothing to aggregate and is skipped (the authors' code does the same).

Defaults from the paper and its code (TsingZ0/FedALA): η = 1, s = 80 %, p = 1 (the top
layer; the code's ``layer_idx = 2`` counts its weight and bias), threshold 0.01 (the README:
"we set it to 0.01 in our paper"), 10 losses in the window. ``start-max-epochs`` bounds the
first training (not in the paper, whose loop has no bound; the README warns that a small
threshold can get a client stuck). A "layer" here is a module's trainable parameters (its
weight and bias). The client draws its s % as a seeded random subset (the code takes a
random contiguous slice). The personalized model is the client's trained local model; the
global model is Θ.

The reading of the paper, decisions and measurements: docs/methods/fedala.md.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pflarena.core import keys
from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.core.model_split import top_trainable
from pflarena.methods.fedala import keys as fedala_keys
from pflarena.methods.fedavg.strategy import FedAvg

__all__ = ["FedALA", "FedALAParams"]


class FedALAParams(MethodParams):
    """FedALA's parameters; defaults from the paper and the authors' code."""

    eta: float = Field(1.0, gt=0, description="η: learning rate of the element-wise weights")
    rand_percent: int = Field(
        80, ge=1, le=100, description="s: % of the local training data the weights learn on"
    )
    layers: int = Field(
        1, ge=1, description="p: highest layers aggregated with learned weights (the rest: global)"
    )
    threshold: float = Field(
        0.01, gt=0, description="first ALA: train until the std of the last losses is below this"
    )
    loss_window: int = Field(10, ge=2, description="losses in that standard deviation")
    start_max_epochs: int = Field(
        100, ge=1, description="bound on the epochs of the first weight training"
    )


class FedALA(FedAvg):
    """FedALA: FedAvg's server; clients initialise by adaptive local aggregation.

    Parameters
    ----------
    Others
        See :class:`FedALAParams`.
    """

    declaration = MethodDeclaration(
        name="fedala",
        kind="baseline",
        reference="Zhang, Hua, Wang, Song, Xue, Ma and Guan, FedALA: Adaptive Local "
        "Aggregation for Personalized Federated Learning, AAAI 2023",
        summary="clients start from an element-wise learned mix of their local and the "
        "global model on the top p layers (weights in [0, 1]); FedAvg server",
        solver="pflarena.methods.fedala.solver",
        params=FedALAParams,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        weights = federation.entry_bytes(top_trainable(federation.trainable, params.layers))
        return [
            Footprint("its local model", federation.state_bytes()),
            Footprint(f"its ALA weights on the top {params.layers} layer(s)", weights),
        ]

    def train_config(self, server_round: int, node_id: int) -> dict:
        return {**super().train_config(server_round, node_id), **self.params_config()}

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if metrics is not None:
            valid = [m for m in self._last_valid_metrics]
            for name in (fedala_keys.EPOCHS, fedala_keys.MEAN_WEIGHT):
                values = [float(m[name]) for m in valid if name in m]
                if values:
                    metrics[f"mean-{name}"] = sum(values) / len(values)
        return arrays, metrics

    def valid_train_replies(self, replies):
        valid = super().valid_train_replies(replies)
        self._last_valid_metrics = [msg.content[keys.METRICS] for msg in valid]
        return valid

    def run_summary(self) -> dict[str, Any]:
        return self.params.model_dump(by_alias=True)
