"""pFedGT: personalized FL as a game over target-interpolation objectives.

"A Game-Theoretic Approach to Personalized Federated Learning Based on Target
Interpolation" (docs/methods/pfedgt.md). Each user i minimises
``G_i(w_i; w_-i) = γ_i f_i(w_i) + (1-γ_i)/m Σ_j [first-order surrogate of f_j around w_j
with curvature μ] + (ρ/2)||w_i||²`` (Eq. 2). The other users enter only through the average
of the "combined messages" ``c_j = ∇f_j(w_j) − μ w_j``, which the server tracks (Eq. 5),
along with a server model θ that warm-starts local training (Eq. 6).

Server state: θ (a full model state; its trainable part is tracked by Eq. 6, its buffers,
e.g. BatchNorm statistics, are the plain mean of the participants' buffers, used only when
θ is evaluated as a global model) and c (over the trainable parameters). Clients start local
training from θ's trainable parameters and their own BatchNorm statistics, so each w_i keeps
the statistics of its own data (docs/papers/pfedgt.md §9.14).

How it runs: docs/methods/pfedgt.md; the reading of the paper, decisions and measurements:
docs/papers/pfedgt.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid

from pflarena.core import keys
from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.pfedgt import keys as pfedgt_keys
from pflarena.methods.pfedgt.params import PAPER_LAMBDA, PFedGTParams
from pflarena.strategies.aggregation import Arrays, as_numpy, as_record, sum_of, weighted_mean
from pflarena.strategies.base import (
    Exchange,
    PflStrategy,
    Send,
    StrategySetup,
    array_problem,
    direct_send,
)
from pflarena.strategies.replies import delta_reply_problem

__all__ = ["PFedGT", "PFedGTParams", "tracked_update", "PAPER_LAMBDA"]


#: settings only the server uses: the solver is sent the others (and its own γ_i)
SERVER_SIDE = {"gammas", "lambda_", "lambda_rule", "server_lr", "c_init"}


def tracked_update(
    current: dict[str, np.ndarray], deltas: Sequence[Arrays], step: float
) -> dict[str, np.ndarray]:
    """``x + (step/|S|) Σ_{i∈S} Δ_i``: Eq. 5 (step λ, for c) and Eq. 6 (step η_s, for θ).

    The mean is unweighted, as in the paper: client data sizes play no role. The sum is
    ``np.sum``'s, in the deltas' dtype, one delta's entry at a time (:func:`sum_of`).
    """
    if not deltas:
        return {name: value.copy() for name, value in current.items()}
    scale = step / len(deltas)
    return {
        name: (value + scale * sum_of(deltas, name, dtype=None)).astype(value.dtype)
        for name, value in current.items()
    }


def _copy(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: value.copy() for name, value in arrays.items()}


def _norm(arrays: dict[str, np.ndarray]) -> float:
    """The L2 norm of all the arrays taken as one vector (in float64)."""
    return float(np.sqrt(sum(np.sum(np.square(v, dtype=np.float64)) for v in arrays.values())))


class PFedGT(PflStrategy):
    """pFedGT, Algorithm 1 (server) with Algorithm 2 run by the clients.

    Parameters
    ----------
    num_clients
        m, the total number of users (enters every client's (1−γ_i)/m factor).
    trainable
        Names of the model's trainable parameters, in ``state_dict`` order: θ's tracked part
        and the layout of c. Other state entries (buffers) are not tracked.
    params
        :class:`PFedGTParams` (or the same values as keywords): γ_i per client id
        (``gammas``, else ``gamma`` for all), μ and ρ, λ in Eq. 5 (``lambda_rule``:
        ``"tracking"``, the default, λ = |S^t|/m with S^t the clients whose update was used
        this round, Lemma 1's exact tracking; ``"fixed"``: λ = ``lambda_``, the paper's
        0.7), η_s in Eq. 6 (``server_lr``), the ``variant`` (``"paper"``: Algorithm 2 as
        written; ``"exact"``: the variant matching the theory, docs/papers/pfedgt.md §3.3),
        ``c_init`` (``"round"``: before round 1 every client computes c_i⁰ = ∇f_i(θ⁰) − μθ⁰
        on its full training set, and c⁰ is their mean; ``"zeros"``: c_i⁰ = c⁰ = 0), the
        ablations ``warm_start``, ``message_init`` and ``delta_ref`` (docs/papers/pfedgt.md
        §3.4 and §9.1) and ``start_buffers`` (the BatchNorm statistics local training
        starts from: the client's own, docs/papers/pfedgt.md §9.14, or θ's averaged ones).
    """

    declaration = MethodDeclaration(
        name="pfedgt",
        kind="paper",
        reference="A Game-Theoretic Approach to Personalized Federated Learning Based on "
        "Target Interpolation (docs/methods/pfedgt.md)",
        summary="users play a game over target-interpolation objectives; the server tracks "
        "the average message c and a server model θ",
        solver="pflarena.methods.pfedgt.solver",
        params=PFedGTParams,
        # The paper's 25 % participation is an experiment setting, not part of the method
        # (λ = |S|/m keeps Lemma 1 exact at any participation): it lives in the pfedgt-*
        # presets, and a bare `pflarena run` compares pFedGT with the baselines at theirs.
        honours=frozenset({"local-epochs", "batch-size", "lr", "lr-milestones", "lr-gamma"}),
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        return [
            Footprint("its message c_i", federation.entry_bytes(federation.trainable)),
            Footprint("its personal model", federation.state_bytes()),
        ]

    @classmethod
    def initial_versions(cls, params: Any) -> int:
        """With ``c-init = round`` every client stores its c_i⁰ before the first round."""
        return 1 if params.c_init == "round" else 0

    checkpointed = {"message": "message/", "message_mean": "message-mean/"}

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        return [
            *super().checkpoint_footprint(params, federation),
            Footprint(
                "the tracked message c and its mean",
                2 * federation.entry_bytes(federation.trainable),
            ),
        ]

    def __init__(
        self,
        params: MethodParams | None = None,
        *,
        num_clients: int,
        trainable: Sequence[str],
        **kwargs,
    ) -> None:
        super().__init__(params, num_clients=num_clients, **kwargs)
        if num_clients < 2:
            raise ValueError("pFedGT needs at least 2 users (m=1 is local training)")
        #: γ_i by client id: ``gammas``, or ``gamma`` for every client
        self.client_gamma = self.params.client_gammas(num_clients)
        self.num_clients = num_clients
        self.trainable = list(trainable)
        #: c, the tracked average message (None until initialised).
        self.message: dict[str, np.ndarray] | None = None
        #: (1/m) Σ_i c_i over the messages the clients store: what c tracks exactly when
        #: λ = |S|/m (Lemma 1). Kept for the per-round tracking-error metric only.
        self.message_mean: dict[str, np.ndarray] | None = None
        self._message_record: ArrayRecord | None = None  # c^t as sent this round
        self._trainable_reference: ArrayRecord | None = None  # θ^t's trainable arrays
        self._buffer_reference: ArrayRecord | None = None  # θ^t's other arrays (buffers)
        #: reply timeout of the c⁰ exchange when Flower's ``Strategy.start`` drives the run
        self.init_timeout = 600.0

    reply_models = (2, "Δw and Δc: two models each")

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """Each reply carries two models' worth (Δw and Δc); the server tracks c and its
        mean beside θ. With ``c-init=round``, the c⁰ exchange of every client before round 1: its
        replies (a message c_i⁰ as large as the model each), held at once for the mean."""
        terms = [
            *super().server_footprint(params, federation),
            Footprint(
                "the tracked messages c and their mean (two models)", 2 * federation.model_bytes
            ),
        ]
        if params.c_init == "round":
            n, f = federation.num_clients, federation
            terms += [
                Footprint(f"the c⁰ exchange's replies, every client's ({n})", n * f.model_bytes),
            ]
        return terms

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> PFedGT:
        return cls(setup.params, trainable=setup.trainable, **setup.common(cls.declaration))

    # ------------------------------------------------------------------ c⁰
    def train_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, send: Send
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The first round begins with the c⁰ exchange (``init``); every round trains."""
        self.initialise_message(grid, arrays, send)
        return super().train_round(server_round, arrays, grid, send)

    def initialise_message(self, grid: Grid, arrays: ArrayRecord, send: Send) -> None:
        """Initialise c (docs/papers/pfedgt.md §3.2) once: a full-participation exchange at
        θ⁰, or zeros.

        A no-op once c is set.
        """
        if self.message is not None:
            return
        theta = as_numpy(arrays)
        zeros = {name: np.zeros_like(theta[name]) for name in self.trainable}
        if self.params.c_init == "zeros":
            self.message, self.message_mean = zeros, _copy(zeros)
            return
        record = RecordDict(
            {
                keys.ARRAYS: arrays,
                keys.CONFIG: ConfigRecord(
                    {
                        keys.SERVER_ROUND: 0,
                        keys.METHOD: self.method,
                        keys.SOLVER: self.declaration.solver,
                        keys.PHASE: keys.PHASE_INIT,
                        **self.method_config(mu=self.params.mu),
                        keys.BATCH_SIZE: self.training.batch_size,
                    }
                ),
            }
        )
        nodes = self.ordered_nodes(grid)
        messages = [
            Message(content=record, message_type=MessageType.TRAIN, dst_node_id=n) for n in nodes
        ]
        exchange: Exchange = send("init", messages)
        reference = as_record(zeros)
        messages_c = [  # the replies' records, read an entry at a time
            msg.content.array_records[pfedgt_keys.MESSAGE]
            for msg in self.valid_replies(
                exchange, lambda content: array_problem(content, reference, pfedgt_keys.MESSAGE)
            )
        ]
        # c⁰ = (1/m) Σ_i c_i⁰ (the paper's "Σ" is a typo for the mean,
        # docs/papers/pfedgt.md §2.7). A client that did not answer keeps c_i⁰ = 0, which is
        # what the sum then counts for it.
        self.message = (
            {
                name: sum_of(messages_c, name, dtype=None) / self.num_clients
                for name in self.trainable
            }
            if messages_c
            else zeros
        )
        self.message_mean = _copy(self.message)
        log(INFO, "pFedGT: c⁰ from %d of %d clients", len(messages_c), len(nodes))

    # ------------------------------------------------------------------ rounds
    def train_config(self, server_round: int, node_id: int) -> dict:
        client_id = self.client_ids.get(node_id)
        gamma = self.client_gamma[client_id if client_id is not None else 0]
        if client_id is None and len(set(self.client_gamma)) > 1:
            log(WARNING, "pFedGT: node %d has no known client id; using γ=%.3f", node_id, gamma)
        return {
            **super().train_config(server_round, node_id),
            keys.PHASE: keys.PHASE_TRAIN,
            # the solver's settings; ``gamma`` is this client's γ_i, and m travels with them
            **self.params_config(exclude=SERVER_SIDE | {"gamma"}),
            **self.method_config(gamma=gamma, **{"num-users": self.num_clients}),
        }

    def train_content(
        self, server_round: int, node_id: int, arrays: ArrayRecord, config: dict
    ) -> RecordDict:
        """θ^t and c^t: 2d floats down (docs/papers/pfedgt.md §3.3)."""
        assert self.message is not None
        return RecordDict(
            {
                keys.ARRAYS: arrays,
                pfedgt_keys.MESSAGE: self._message_record,
                keys.CONFIG: ConfigRecord(config),
            }
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # Under Flower's own Strategy.start the c⁰ exchange happens here (a no-op once c is set).
        self.initialise_message(grid, arrays, direct_send(grid, self.init_timeout))
        self._message_record = as_record(self.message)
        self._trainable_reference = ArrayRecord({n: arrays[n] for n in self.trainable})
        self._buffer_reference = ArrayRecord(
            {n: arrays[n] for n in arrays.keys() if n not in set(self.trainable)}
        )
        return super().configure_train(server_round, arrays, config, grid)

    def check_train_reply(self, content: RecordDict) -> str | None:
        """Δw and Δc over θ's trainable arrays; the buffers (when θ has any) under θ's other
        names, shapes and dtypes, finite: a NaN running variance never reaches θ."""
        return delta_reply_problem(
            content,
            self._trainable_reference,
            self._buffer_reference,
            (pfedgt_keys.DELTA_W, pfedgt_keys.DELTA_C),
            pfedgt_keys.BUFFERS,
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Eqs. 5–6 over the clients that returned a usable update (failures don't count)."""
        valid = self.valid_train_replies(replies)
        if not valid:
            return None, None
        assert self.message is not None and self._round_arrays is not None
        theta = as_numpy(self._round_arrays)
        # the replies' records, read an entry at a time: no decoded copy of the round's
        delta_w = [m.content.array_records[pfedgt_keys.DELTA_W] for m in valid]
        delta_c = [m.content.array_records[pfedgt_keys.DELTA_C] for m in valid]
        assert self.message_mean is not None  # set with c in initialise_message()
        params = self.params
        step = (
            len(delta_c) / self.num_clients if params.lambda_rule == "tracking" else params.lambda_
        )
        self.message = tracked_update(self.message, delta_c, step)
        self.message_mean = tracked_update(
            self.message_mean, delta_c, len(delta_c) / self.num_clients
        )
        tracked = tracked_update({n: theta[n] for n in self.trainable}, delta_w, params.server_lr)
        # θ's buffers: the participants' own (checked in check_train_reply), for evaluating θ
        buffers = [
            m.content.array_records[pfedgt_keys.BUFFERS]
            for m in valid
            if pfedgt_keys.BUFFERS in m.content.array_records
        ]
        new_theta = {**theta, **tracked}
        if buffers:
            new_theta.update(weighted_mean(buffers))
        metrics = self.train_metrics(valid)
        assert metrics is not None
        metrics.update(self.state_metrics(new_theta))
        return as_record(new_theta), metrics

    def state_metrics(self, theta: dict[str, np.ndarray]) -> dict[str, float]:
        """‖θ‖, ‖c‖ and c's relative distance from the mean of the stored messages.

        The tracking error is 0 with λ = |S|/m and no failures (Lemma 1); with another λ
        it shows how far c has drifted from the average it stands for.
        """
        assert self.message is not None and self.message_mean is not None
        diff = {n: self.message[n] - self.message_mean[n] for n in self.trainable}
        return {
            "theta-norm": _norm({n: theta[n] for n in self.trainable}),
            "message-norm": _norm(self.message),
            "message-tracking-error": _norm(diff) / max(_norm(self.message_mean), 1e-30),
        }

    def summary(self) -> None:
        super().summary()
        params = self.params
        log(
            INFO,
            "\t└── pFedGT: m=%d μ=%g ρ=%g λ=%s η_s=%g variant=%s c⁰=%s warm start=%s (buffers: %s)",
            self.num_clients,
            params.mu,
            params.rho,
            "|S|/m" if params.lambda_rule == "tracking" else f"{params.lambda_:g}",
            params.server_lr,
            params.variant,
            params.c_init,
            params.warm_start,
            params.start_buffers,
        )
