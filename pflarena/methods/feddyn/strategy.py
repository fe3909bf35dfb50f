"""FedDyn (Acar et al., ICLR 2021): dynamic regularization of the clients' objectives.

"Federated Learning Based on Dynamic Regularization". Algorithm 1, round t with the
participating clients P_t of m:

- each k ∈ P_t receives θ^{t−1} and sets (client side,
  :mod:`pflarena.methods.feddyn.solver`)::

      θ_k^t = argmin_θ L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2) ‖θ − θ^{t−1}‖²
      ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α (θ_k^t − θ^{t−1})

  keeping the second (its gradient state, zero at first) and sending θ_k^t;
- the server (:func:`server_update`)::

      h^t = h^{t−1} − (α/m) Σ_{k∈P_t} (θ_k^t − θ^{t−1})
      θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − h^t / α

Choices (reasons in ``docs/methods/feddyn.md``): the argmin is approximated by the run's local
training (``local-epochs`` of minibatch SGD from θ^{t−1}, with its momentum and weight
decay, the latter part of L_k); P_t is the set of clients whose reply was used (a failed
client's gradient state is rolled back with it, so h^t = (1/m) Σ_k ∇L_k(θ_k^t) holds
exactly); m is ``num-clients``; h and the gradient states cover the trainable parameters and
the buffers (BatchNorm statistics) of θ^t are the plain mean of the participants'. α = 0.01
as in the authors' example script (CIFAR-10). The personalized model is the global model θ^t.

The reading of the paper, decisions and measurements: docs/methods/feddyn.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from pydantic import Field

from pflarena.core import keys
from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.strategies.aggregation import (
    Arrays,
    as_numpy,
    as_record,
    mean_of,
    sum_of,
    weighted_mean,
)
from pflarena.strategies.base import PflStrategy, StrategySetup

__all__ = ["FedDyn", "FedDynParams", "server_update"]


class FedDynParams(MethodParams):
    """FedDyn's parameter; the default is the authors' CIFAR-10 example's."""

    alpha: float = Field(
        0.01,
        gt=0,
        description="α: weight of the dynamic regularizer (α/2)‖θ − θ^{t−1}‖² and of h's step",
    )


def server_update(
    previous: dict[str, np.ndarray],
    state: dict[str, np.ndarray],
    models: Sequence[Arrays],
    *,
    alpha: float,
    num_clients: int,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Algorithm 1's server step over the entries of ``state`` (h; the trainable parameters).

    h^t = h^{t−1} − (α/m) Σ_{k∈P_t} (θ_k^t − θ^{t−1}); θ^t = mean_k θ_k^t − h^t/α, with
    ``previous`` θ^{t−1} and ``models`` the θ_k^t. Computed in float64, returned in the
    dtypes of ``previous`` and ``state``.
    """
    if not models:
        raise ValueError("no client models to aggregate")
    if len(models) > num_clients:
        raise ValueError(f"{len(models)} models from a federation of {num_clients} clients")
    new_state, new_model = {}, {}
    for name, h in state.items():
        before = previous[name].astype(np.float64)
        drift = sum_of(models, name, minus=before)
        h_new = h.astype(np.float64) - (alpha / num_clients) * drift
        new_state[name] = h_new.astype(h.dtype)
        new_model[name] = (mean_of(models, name) - h_new / alpha).astype(previous[name].dtype)
    return new_model, new_state


class FedDyn(PflStrategy):
    """FedDyn's server: the state h and the corrected average (Algorithm 1).

    Parameters
    ----------
    trainable
        Names of the model's trainable parameters: the layout of h and of every client's
        gradient state.
    num_clients
        m, the number of clients of the federation.
    Others
        See :class:`FedDynParams`.
    """

    declaration = MethodDeclaration(
        name="feddyn",
        kind="baseline",
        reference="Acar, Zhao, Matas Navarro, Mattina, Whatmough and Saligrama, Federated "
        "Learning Based on Dynamic Regularization, ICLR 2021",
        summary="clients minimise L_k − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖²; the server "
        "corrects the mean model by its state h; personalized = global",
        solver="pflarena.methods.feddyn.solver",
        params=FedDynParams,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        return [Footprint("its gradient state", federation.entry_bytes(federation.trainable))]

    checkpointed = {"state": "h/"}

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        return [
            *super().checkpoint_footprint(params, federation),
            Footprint("the state h", federation.entry_bytes(federation.trainable)),
        ]

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The replies, and the state h beside the model."""
        return [
            *super().server_footprint(params, federation),
            Footprint("the state h (a model)", federation.model_bytes),
        ]

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> FedDyn:
        return cls(setup.params, trainable=setup.trainable, **setup.common(cls.declaration))

    def __init__(
        self, params: FedDynParams | None = None, *, trainable: Sequence[str], **kwargs: Any
    ) -> None:
        super().__init__(params, **kwargs)
        num_clients = self.num_clients
        if num_clients is None or num_clients < 1:
            raise ValueError(f"feddyn needs num_clients >= 1 (m in h's step), got {num_clients}")
        if not trainable:
            raise ValueError("feddyn needs the names of the model's trainable parameters")
        self.trainable = list(trainable)
        #: h, the server state over the trainable parameters (zeros until set)
        self.state: dict[str, np.ndarray] | None = None

    # ------------------------------------------------------------------ messages
    def train_config(self, server_round: int, node_id: int) -> dict:
        return {
            **super().train_config(server_round, node_id),
            **self.params_config(),
        }

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        missing = [name for name in self.trainable if name not in arrays]
        if missing:
            raise ValueError(f"the server model lacks trainable parameters {missing}")
        if self.state is None:  # h⁰ = 0
            self.state = {name: np.zeros_like(arrays[name].numpy()) for name in self.trainable}
        return super().configure_train(server_round, arrays, config, grid)

    # ------------------------------------------------------------------ replies
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The server step over the clients whose model is usable (P_t)."""
        valid = self.valid_train_replies(replies)  # θ_k^t, checked against θ^{t−1}'s layout
        if not valid:
            return None, None
        assert self.state is not None and self._round_arrays is not None
        previous = as_numpy(self._round_arrays)
        # the replies' records, read entry by entry: no decoded copy of the round's models
        models = [m.content.array_records[keys.ARRAYS] for m in valid]
        stepped, self.state = server_update(
            previous, self.state, models, alpha=self.params.alpha, num_clients=self.num_clients
        )
        new = {**previous, **stepped}
        buffers = [name for name in previous if name not in stepped]
        if buffers:  # the participants' mean
            new.update(weighted_mean(models, names=buffers))
        metrics = self.train_metrics(valid)
        assert metrics is not None
        metrics["state-norm"] = float(
            np.sqrt(sum(np.sum(np.square(h, dtype=np.float64)) for h in self.state.values()))
        )
        return as_record(new), metrics

    def run_summary(self) -> dict[str, Any]:
        return self.params.model_dump(by_alias=True)
