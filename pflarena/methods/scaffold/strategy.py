"""SCAFFOLD (Karimireddy et al., ICML 2020): control variates against client drift.

"SCAFFOLD: Stochastic Controlled Averaging for Federated Learning". The server keeps a
control variate c, each client i its own c_i (in its state store, never on the server).
Algorithm 1, one round:

- line 5: the server sends (x, c) to the sampled clients S;
- lines 7–11 (client): y_i ← x, then K local steps y_i ← y_i − η_l (g_i(y_i) − c_i + c);
- line 12 (client): c_i⁺ ← g_i(x) (option I) or c_i − c + (x − y_i)/(K η_l) (option II);
- line 13 (client): it sends (Δy_i, Δc_i) = (y_i − x, c_i⁺ − c_i); line 14: c_i ← c_i⁺;
- lines 16–17 (server, :func:`server_update`): x ← x + η_g · (1/|S|) Σ Δy_i and
  c ← c + (|S|/N) · (1/|S|) Σ Δc_i.

The client side is :mod:`pflarena.methods.scaffold.solver`. Choices where the paper leaves
room (reasons in ``docs/methods/scaffold.md``):

- **K** is the number of local steps the client actually took: ``local-epochs`` passes of
  ``batch-size`` minibatches, a partial last minibatch counting as one step.
- **S** is the set of clients whose reply was used this round; a failed or rejected client
  does not count, and its c_i stays as it was (the client state store rolls the write
  back), so c = (1/N) Σ_i c_i holds exactly, as it does in the paper with c⁰ = c_i⁰ = 0.
- **N** is ``num-clients``; the means over S are unweighted, as in Algorithm 1.
- c and the c_i cover the trainable parameters. Buffers (BatchNorm statistics) are not
  stepped: x's buffers become the mean of the participants'.
- The personalized model is the global model x (SCAFFOLD has no other), as for FedAvg.

The reading of the paper, decisions and measurements: docs/methods/scaffold.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from pydantic import Field

from pflarena.core import keys
from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.scaffold import keys as scaffold_keys
from pflarena.strategies.aggregation import Arrays, as_numpy, as_record, mean_of, weighted_mean
from pflarena.strategies.base import PflStrategy, StrategySetup
from pflarena.strategies.replies import delta_reply_problem

__all__ = ["Scaffold", "ScaffoldParams", "server_update"]


class ScaffoldParams(MethodParams):
    """SCAFFOLD's parameters; defaults from the paper's experiments."""

    global_lr: float = Field(
        1.0, gt=0, description="η_g: global step size, x ← x + η_g · mean of the Δy_i"
    )
    control_update: Literal["II", "I"] = Field(
        "II",
        description="c_i⁺: 'II' = c_i − c + (x − y_i)/(K η_l) (the paper's experiments), "
        "'I' = the gradient of the client's training split at x (one more pass)",
    )


def _norm(arrays: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(np.square(v, dtype=np.float64)) for v in arrays.values())))


def server_update(
    model: dict[str, np.ndarray],
    control: dict[str, np.ndarray],
    delta_y: Sequence[Arrays],
    delta_c: Sequence[Arrays],
    *,
    global_lr: float,
    num_clients: int,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Algorithm 1, lines 16–17, over the entries of ``control`` (the trainable parameters).

    (Δx, Δc) = (1/|S|) Σ_{i∈S} (Δy_i, Δc_i); x ← x + η_g Δx; c ← c + (|S|/N) Δc. Computed
    in float64, returned in the dtypes of ``model`` and ``control``.
    """
    if not delta_y or len(delta_y) != len(delta_c):
        raise ValueError(
            f"need one Δy and one Δc per client, got {len(delta_y)} and {len(delta_c)}"
        )
    if len(delta_c) > num_clients:
        raise ValueError(f"{len(delta_c)} updates from a federation of {num_clients} clients")
    share = len(delta_c) / num_clients
    new_model = {
        name: (model[name].astype(np.float64) + global_lr * mean_of(delta_y, name)).astype(
            model[name].dtype
        )
        for name in control
    }
    new_control = {
        name: (value.astype(np.float64) + share * mean_of(delta_c, name)).astype(value.dtype)
        for name, value in control.items()
    }
    return new_model, new_control


class Scaffold(PflStrategy):
    """SCAFFOLD with the server control variate c (Algorithm 1).

    Parameters
    ----------
    trainable
        Names of the model's trainable parameters, in ``state_dict`` order: the layout of
        c and of every client's c_i.
    num_clients
        N, the number of clients of the federation (c's step is |S|/N).
    params
        :class:`ScaffoldParams`: η_g (``global_lr``), and how a client computes c_i⁺
        (``control_update``, ``"II"`` or ``"I"``, line 12).
    """

    declaration = MethodDeclaration(
        name="scaffold",
        kind="baseline",
        reference="Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, SCAFFOLD: Stochastic "
        "Controlled Averaging for Federated Learning, ICML 2020",
        summary="local steps corrected by control variates (g − c_i + c) against client "
        "drift; server steps x and c with the mean updates; personalized = global",
        solver="pflarena.methods.scaffold.solver",
        params=ScaffoldParams,
        # momentum would change what (x − y)/(K η_l) measures (option II); weight decay is
        # part of the client's objective f_i and enters g_i
        honours=frozenset(
            {"local-epochs", "batch-size", "lr", "weight-decay", "lr-milestones", "lr-gamma"}
        ),
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        return [Footprint("its control variate", federation.entry_bytes(federation.trainable))]

    checkpointed = {"control": "control/"}

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        return [
            *super().checkpoint_footprint(params, federation),
            Footprint("the control variate c", federation.entry_bytes(federation.trainable)),
        ]

    reply_models = (2, "Δy and Δc: two models each")

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The replies (two models' worth each), and c beside x."""
        return [
            *super().server_footprint(params, federation),
            Footprint("the control variate c (a model)", federation.model_bytes),
        ]

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> Scaffold:
        return cls(
            setup.params,
            trainable=setup.trainable,
            **setup.common(cls.declaration),
        )

    def __init__(
        self,
        params: MethodParams | None = None,
        *,
        trainable: Sequence[str],
        num_clients: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, num_clients=num_clients, **kwargs)
        if num_clients is None or num_clients < 1:
            raise ValueError(f"scaffold needs num_clients >= 1 (N in c's step), got {num_clients}")
        if not trainable:
            raise ValueError("scaffold needs the names of the model's trainable parameters")
        self.trainable = list(trainable)
        #: c, the server control variate over the trainable parameters (zeros until set)
        self.control: dict[str, np.ndarray] | None = None
        self._control_record: ArrayRecord | None = None
        self._trainable_reference: ArrayRecord | None = None
        self._buffer_reference: ArrayRecord | None = None

    # ------------------------------------------------------------------ messages
    def train_config(self, server_round: int, node_id: int) -> dict:
        return {
            **super().train_config(server_round, node_id),
            **self.params_config(exclude={"global_lr"}),
        }

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        missing = [name for name in self.trainable if name not in arrays]
        if missing:
            raise ValueError(f"the server model lacks trainable parameters {missing}")
        if self.control is None:  # c⁰ = 0 (the paper's experiments)
            self.control = {name: np.zeros_like(arrays[name].numpy()) for name in self.trainable}
        self._control_record = as_record(self.control)  # one record, shared by every message
        trainable = set(self.trainable)
        self._trainable_reference = ArrayRecord({n: arrays[n] for n in self.trainable})
        self._buffer_reference = ArrayRecord(
            {n: arrays[n] for n in arrays.keys() if n not in trainable}
        )
        return super().configure_train(server_round, arrays, config, grid)

    def train_content(
        self, server_round: int, node_id: int, arrays: ArrayRecord, config: dict
    ) -> RecordDict:
        """x and c (line 5)."""
        return RecordDict(
            {
                keys.ARRAYS: arrays,
                scaffold_keys.CONTROL: self._control_record,
                keys.CONFIG: ConfigRecord(config),
            }
        )

    # ------------------------------------------------------------------ replies
    def check_train_reply(self, content: RecordDict) -> str | None:
        """Δy and Δc over x's trainable arrays; the buffers (when x has any) under x's other
        names, shapes and dtypes; everything finite."""
        return delta_reply_problem(
            content,
            self._trainable_reference,
            self._buffer_reference,
            (scaffold_keys.DELTA_Y, scaffold_keys.DELTA_C),
            scaffold_keys.BUFFERS,
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Lines 16–17 over the clients whose update is usable (S)."""
        valid = self.valid_train_replies(replies)
        if not valid:
            return None, None
        assert self.control is not None and self._round_arrays is not None
        x = as_numpy(self._round_arrays)
        # the replies' records, read entry by entry: no decoded copy of the round's updates
        delta_y = [m.content.array_records[scaffold_keys.DELTA_Y] for m in valid]
        delta_c = [m.content.array_records[scaffold_keys.DELTA_C] for m in valid]
        stepped, self.control = server_update(
            x,
            self.control,
            delta_y,
            delta_c,
            global_lr=self.params.global_lr,
            num_clients=self.num_clients,
        )
        new_x = {**x, **stepped}
        buffers = [
            m.content.array_records[scaffold_keys.BUFFERS]
            for m in valid
            if scaffold_keys.BUFFERS in m.content.array_records
        ]
        if buffers:  # the participants' mean
            new_x.update(weighted_mean(buffers))
        metrics = self.train_metrics(valid)
        assert metrics is not None
        steps = [float(m.content[keys.METRICS].get(keys.TRAIN_STEPS, np.nan)) for m in valid]
        metrics["control-norm"] = _norm(self.control)
        metrics["mean-local-steps"] = float(np.mean(steps))
        return as_record(new_x), metrics

    def run_summary(self) -> dict[str, Any]:
        return self.params.model_dump(by_alias=True)
