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
from typing import Literal

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
from pydantic import Field, field_validator

from pflarena.core import keys
from pflarena.core.config import parse_float_list
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.strategies.arrays import as_numpy, as_record, weighted_mean
from pflarena.strategies.base import (
    Exchange,
    LocalTraining,
    PflStrategy,
    Send,
    StrategySetup,
    array_problem,
    direct_send,
)
from pflarena.strategies.replies import delta_reply_problem

__all__ = ["PFedGT", "PFedGTParams", "tracked_update", "PAPER_LAMBDA"]

#: λ in the paper's experiments (Eq. 5); used when ``lambda-rule=fixed``.
PAPER_LAMBDA = 0.7


class PFedGTParams(MethodParams):
    """pFedGT's parameters; defaults are the paper's experimental settings.

    The paper's reading: docs/papers/pfedgt.md.
    """

    gamma: float = Field(0.8, ge=0, le=1, description="personalization coefficient γ")
    gammas: str = Field(
        "", description="per-client γ_i as comma-separated values, one per client id"
    )
    mu: float = Field(0.05, ge=0, description="surrogate curvature μ")
    rho: float = Field(0.0, ge=0, description="ridge weight ρ (theory needs ρ > L)")
    lambda_: float = Field(
        PAPER_LAMBDA,
        gt=0,
        description="step size λ of the message average c under lambda-rule=fixed (the "
        "paper's 0.7)",
    )
    lambda_rule: Literal["tracking", "fixed"] = Field(
        "tracking",
        description="'tracking': λ = |S^t|/m each round (S^t: the clients whose update was "
        "used), which keeps c the exact mean of the stored messages (Lemma 1) and kept θ and c "
        "bounded on CIFAR-10 where the paper's 0.7 did not (docs/papers/pfedgt.md §11); 'fixed': "
        "λ = pfedgt.lambda",
    )
    server_lr: float = Field(1.0, gt=0, description="step size η_s of the server model θ")
    variant: Literal["paper", "exact"] = Field(
        "paper",
        description="'paper': Algorithm 2 as written (one-step-stale message); "
        "'exact': unbiased ∇G_i steps and a full-pass message at the end",
    )
    c_init: Literal["round", "zeros"] = Field(
        "round", description="c⁰: a full-participation gradient exchange at θ⁰, or zeros"
    )
    warm_start: Literal["theta", "personal"] = Field(
        "theta", description="local training starts from θ (paper) or the client's own w_i"
    )
    message_init: Literal["server", "stored"] = Field(
        "server", description="the local message starts from c (paper) or the client's stored c_i"
    )
    delta_ref: Literal["theta", "personal"] = Field(
        "theta",
        description="Δw is w_new − θ (default; stable with η_s=1 under partial "
        "participation) or w_new − w_i (Eq. 6 read literally; see docs/papers/pfedgt.md §11)",
    )
    start_buffers: Literal["personal", "theta"] = Field(
        "personal",
        description="BatchNorm running statistics local training starts from: the client's "
        "own (docs/papers/pfedgt.md §9.14, as PFLlib) or θ's, the mean of the last participants'",
    )

    @field_validator("gammas")
    @classmethod
    def _gamma_list(cls, value: str) -> str:
        if value.strip():
            gammas = parse_float_list(value, "pfedgt.gammas")
            if any(not 0.0 <= g <= 1.0 for g in gammas):
                raise ValueError(f"every γ_i must be in [0, 1], got {value!r}")
        return value

    def run_problems(self, cfg) -> list[str]:
        problems = []
        try:
            self.client_gammas(cfg.num_clients)
        except ValueError as exc:
            problems.append(str(exc))
        if self.lambda_rule == "tracking" and self.lambda_ != PAPER_LAMBDA:
            problems.append(
                f"pfedgt.lambda={self.lambda_:g} takes effect only with "
                "pfedgt.lambda-rule=fixed (the default rule, tracking, sets λ = |S^t|/m)"
            )
        return problems

    def client_gammas(self, num_clients: int) -> list[float]:
        """γ_i for every client id; raises ValueError when ``gammas`` has another length."""
        if not self.gammas.strip():
            return [self.gamma] * num_clients
        gammas = parse_float_list(self.gammas, "pfedgt.gammas")
        if len(gammas) != num_clients:
            raise ValueError(
                f"pfedgt.gammas has {len(gammas)} values but num-clients is {num_clients}"
            )
        return gammas


def tracked_update(
    current: dict[str, np.ndarray], deltas: Sequence[dict[str, np.ndarray]], step: float
) -> dict[str, np.ndarray]:
    """``x + (step/|S|) Σ_{i∈S} Δ_i``: Eq. 5 (step λ, for c) and Eq. 6 (step η_s, for θ).

    The mean is unweighted, as in the paper: client data sizes play no role.
    """
    if not deltas:
        return {name: value.copy() for name, value in current.items()}
    scale = step / len(deltas)
    return {
        name: (value + scale * np.sum([d[name] for d in deltas], axis=0)).astype(value.dtype)
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
    gammas
        γ_i per client id (length ``num_clients``).
    mu, rho
        Surrogate curvature μ and ridge weight ρ.
    message_step
        λ in Eq. 5 under ``lambda_rule="fixed"`` (the paper's experiments: 0.7).
    lambda_rule
        ``"tracking"`` (default): λ = |S^t|/m with S^t the clients whose update was used this
        round (failures do not count), Lemma 1's exact tracking; ``"fixed"``: λ =
        ``message_step``.
    server_lr
        η_s in Eq. 6.
    variant
        ``"paper"``: Algorithm 2 as written; ``"exact"``: the variant matching the theory
        (docs/papers/pfedgt.md §3.3).
    c_init
        ``"round"``: before round 1 every client computes c_i⁰ = ∇f_i(θ⁰) − μθ⁰ on its full
        training set, and c⁰ is their mean; ``"zeros"``: c_i⁰ = c⁰ = 0.
    warm_start, message_init, delta_ref
        Ablations of docs/papers/pfedgt.md §3.4 and §9.1 (θ or own w_i as the local start; c or
        stored c_i as the local message's start; Δw relative to w_i or to θ).
    start_buffers
        The non-trainable state (BatchNorm statistics) local training starts from:
        ``"personal"``, the client's own (docs/papers/pfedgt.md §9.14), or ``"theta"``, θ's
        averaged buffers.
    """

    declaration = MethodDeclaration(
        name="pfedgt",
        kind="paper",
        reference="A Game-Theoretic Approach to Personalized Federated Learning Based on "
        "Target Interpolation (docs/methods/pfedgt.md)",
        summary="users play a game over target-interpolation objectives; the server tracks "
        "the average message c and a server model θ",
        solver="pflarena.client.solvers.pfedgt",
        params=PFedGTParams,
        # The paper's 25 % participation is an experiment setting, not part of the method
        # (λ = |S|/m keeps Lemma 1 exact at any participation): it lives in the pfedgt-*
        # presets, and a bare `pflarena run` compares pFedGT with the baselines at theirs.
        honours=frozenset({"local-epochs", "batch-size", "lr", "lr-milestones", "lr-gamma"}),
    )
    checkpointed = {"message": "message/", "message_mean": "message-mean/"}

    def __init__(
        self,
        *,
        num_clients: int,
        trainable: Sequence[str],
        gammas: Sequence[float] | None = None,
        mu: float = 0.05,
        rho: float = 0.0,
        message_step: float = PAPER_LAMBDA,
        lambda_rule: str = "tracking",
        server_lr: float = 1.0,
        variant: str = "paper",
        c_init: str = "round",
        warm_start: str = "theta",
        message_init: str = "server",
        delta_ref: str = "theta",
        start_buffers: str = "personal",
        training: LocalTraining | None = None,
        **kwargs,
    ) -> None:
        super().__init__(training=training, num_clients=num_clients, **kwargs)
        if num_clients < 2:
            raise ValueError("pFedGT needs at least 2 users (m=1 is local training)")
        gammas = list(gammas) if gammas is not None else [0.8] * num_clients
        if len(gammas) != num_clients or any(not 0.0 <= g <= 1.0 for g in gammas):
            raise ValueError(f"need {num_clients} values γ_i in [0, 1], got {gammas}")
        for name, value, allowed in (
            ("variant", variant, ("paper", "exact")),
            ("c_init", c_init, ("round", "zeros")),
            ("warm_start", warm_start, ("theta", "personal")),
            ("message_init", message_init, ("server", "stored")),
            ("delta_ref", delta_ref, ("personal", "theta")),
            ("start_buffers", start_buffers, ("personal", "theta")),
            ("lambda_rule", lambda_rule, ("fixed", "tracking")),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        self.num_clients = num_clients
        self.trainable = list(trainable)
        self.gammas = gammas
        self.mu, self.rho = mu, rho
        self.message_step, self.server_lr = message_step, server_lr
        self.lambda_rule = lambda_rule
        self.variant, self.c_init = variant, c_init
        self.warm_start, self.message_init, self.delta_ref = warm_start, message_init, delta_ref
        self.start_buffers = start_buffers
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

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> PFedGT:
        params = setup.params
        assert isinstance(params, PFedGTParams)
        return cls(
            trainable=setup.trainable,
            gammas=params.client_gammas(setup.cfg.num_clients),
            mu=params.mu,
            rho=params.rho,
            message_step=params.lambda_,
            lambda_rule=params.lambda_rule,
            server_lr=params.server_lr,
            variant=params.variant,
            c_init=params.c_init,
            warm_start=params.warm_start,
            message_init=params.message_init,
            delta_ref=params.delta_ref,
            start_buffers=params.start_buffers,
            **setup.common(cls.declaration),
        )

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
        if self.c_init == "zeros":
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
                        keys.PFEDGT_MU: self.mu,
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
        messages_c = [
            as_numpy(msg.content.array_records[keys.PFEDGT_MESSAGE])
            for msg in self.valid_replies(
                exchange, lambda content: array_problem(content, reference, keys.PFEDGT_MESSAGE)
            )
        ]
        # c⁰ = (1/m) Σ_i c_i⁰ (the paper's "Σ" is a typo for the mean,
        # docs/papers/pfedgt.md §2.7). A client that did not answer keeps c_i⁰ = 0, which is
        # what the sum then counts for it.
        self.message = (
            {
                name: np.sum([c[name] for c in messages_c], axis=0) / self.num_clients
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
        gamma = self.gammas[client_id] if client_id is not None else self.gammas[0]
        if client_id is None and len(set(self.gammas)) > 1:
            log(WARNING, "pFedGT: node %d has no known client id; using γ=%.3f", node_id, gamma)
        return {
            **super().train_config(server_round, node_id),
            keys.PHASE: keys.PHASE_TRAIN,
            keys.PFEDGT_GAMMA: gamma,
            keys.PFEDGT_MU: self.mu,
            keys.PFEDGT_RHO: self.rho,
            keys.PFEDGT_NUM_USERS: self.num_clients,
            keys.PFEDGT_VARIANT: self.variant,
            keys.PFEDGT_WARM_START: self.warm_start,
            keys.PFEDGT_MESSAGE_INIT: self.message_init,
            keys.PFEDGT_DELTA_REF: self.delta_ref,
            keys.PFEDGT_START_BUFFERS: self.start_buffers,
        }

    def train_content(
        self, server_round: int, node_id: int, arrays: ArrayRecord, config: dict
    ) -> RecordDict:
        """θ^t and c^t: 2d floats down (docs/papers/pfedgt.md §3.3)."""
        assert self.message is not None
        return RecordDict(
            {
                keys.ARRAYS: arrays,
                keys.PFEDGT_MESSAGE: self._message_record,
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
            (keys.PFEDGT_DELTA_W, keys.PFEDGT_DELTA_C),
            keys.PFEDGT_BUFFERS,
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
        delta_w = [as_numpy(m.content.array_records[keys.PFEDGT_DELTA_W]) for m in valid]
        delta_c = [as_numpy(m.content.array_records[keys.PFEDGT_DELTA_C]) for m in valid]
        assert self.message_mean is not None  # set with c in initialise_message()
        step = (
            len(delta_c) / self.num_clients if self.lambda_rule == "tracking" else self.message_step
        )
        self.message = tracked_update(self.message, delta_c, step)
        self.message_mean = tracked_update(
            self.message_mean, delta_c, len(delta_c) / self.num_clients
        )
        tracked = tracked_update({n: theta[n] for n in self.trainable}, delta_w, self.server_lr)
        # θ's buffers: the participants' own (checked in check_train_reply), for evaluating θ
        buffers = [
            as_numpy(m.content.array_records[keys.PFEDGT_BUFFERS])
            for m in valid
            if keys.PFEDGT_BUFFERS in m.content.array_records
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
        log(
            INFO,
            "\t└── pFedGT: m=%d μ=%g ρ=%g λ=%s η_s=%g variant=%s c⁰=%s warm start=%s (buffers: %s)",
            self.num_clients,
            self.mu,
            self.rho,
            "|S|/m" if self.lambda_rule == "tracking" else f"{self.message_step:g}",
            self.server_lr,
            self.variant,
            self.c_init,
            self.warm_start,
            self.start_buffers,
        )
