"""PPFL: canonical models shared by all, membership vectors per client, an affinity graph.

Di, Yang, Ye and Chang, "PPFL: A Personalized Federated Learning Framework for
Heterogeneous Population", INFORMS Journal on Computing (docs/methods/ppfl.md). The population is
described by K canonical models θ_1..θ_K (optionally on a shared trunk θ_com); client i's
personalized model combines them with its membership c_i ∈ Δ^K (PPFL1: the models' outputs
mixed, Eq. 7; PPFL2: their parameters interpolated, Eq. 8). Training minimizes (Eq. 4, 9)

    F(θ, C) = Σ_i p_i f_i(θ, c_i) + (λ/2) Σ_ij w_ij ‖c_i − c_j‖².

The server holds θ (a stacked state, :mod:`pflarena.algorithms.canonical`: the trunk, then
``canonical.<k>.<name>``), every c_i (the rows of C), each client's n_i, and the affinity W;
the math is :mod:`pflarena.methods.ppfl.population`. Three schedules (``schedule``, docs/papers/ppfl.md §3.6):

``rbcd`` (Algorithm 1, the paper's main algorithm)
    Each round the server draws one block: θ with probability ``theta-probability`` (ρ_1),
    else C. θ-block (exchange ``theta``): every client runs local SGD on θ with its c_i
    fixed (Eq. 11) and θ^{t+1} = Σ_i p_i θ_i (Eq. 12, FedAvg with server step 1). C-block
    (exchange ``membership-gradient``): every client returns ``∇_c f_i(θ^t, c_i^t)``; the
    server forms ``G_i = p_i ∇_c f_i + 2λ(LC^t)_i`` (Eq. 14, the gradient of the MM
    surrogate of Eq. 13 at C^t) and takes one exponentiated-gradient step per client
    (Eq. 15); exchange ``membership`` then sends each client its new c_i (Algorithm 1's
    synchronisation, K floats).
``alternate`` (Algorithm 2, printed as the communication-efficient variant)
    One exchange: the server sends θ^t and each client its penalty row π_i = 2λ(LC^t)_i; the
    client takes one exponentiated-gradient step on c_i at θ^t, then local SGD on θ with the
    new c_i, and returns both.
``theta-first`` (what the authors' code runs, §3.5)
    Exchange ``theta`` as above, then ``membership-steps``: θ^{t+1} and π_i down, and one
    local epoch of exponentiated-gradient steps on c_i, one per minibatch, at θ^{t+1}.

``scaling=normalized`` (default) uses ``G_i = ∇_c f_i + π_i / p_i`` (Eq. 14 divided by p_i,
the scale of the code's step sizes, A3); ``paper`` the printed ``p_i ∇_c f_i + π_i``; ``code``
the authors' ``∇_c f_i + π_i``. ``penalty=degree-only`` reproduces the code's
``λ D C`` (docs/papers/ppfl.md §9.4). W is the cosine similarity of the clients' label histograms
(``affinity=labels``; ``centered-labels`` for the code's Dirichlet variant), which clients
send once, in an ``affinity`` exchange at the start, only when the run asks for it: the
histograms reveal each client's label distribution to the server. ``affinity=complete``
(W = 11ᵀ, every pair alike) and ``none`` (no Laplacian term) reveal nothing.

Each round logs the objective F(θ^t, C^t) from the clients' losses at the round's start
(``objective``), the block, and the memberships' mean entropy; the run writes the
memberships per round (``memberships.csv``) and their picture (``memberships.png``).

The reading of the paper, decisions and measurements: docs/methods/ppfl.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid

from pflarena.core import drawing, keys
from pflarena.core.footprint import FLOAT64, Federation, Footprint
from pflarena.core.methods import MethodDeclaration
from pflarena.core.model_split import copied_entries
from pflarena.methods.ppfl import keys as ppfl_keys
from pflarena.methods.ppfl.params import PPFLParams
from pflarena.methods.ppfl.population import (
    affinity_from_histograms,
    affinity_problem,
    exponentiated_gradient_step,
    laplacian_penalty,
    membership_step_gradient,
    penalty_gradient,
    uniform_memberships,
)
from pflarena.strategies.aggregation import weighted_average
from pflarena.strategies.base import (
    Exchange,
    Send,
    StrategySetup,
    array_problem,
    vector_problem,
)
from pflarena.strategies.stacked import StackedModelsStrategy

__all__ = ["PPFL", "PPFLParams"]

CANONICAL_PREFIX = ppfl_keys.CANONICAL_PREFIX


def _vector_record(**vectors: np.ndarray) -> ArrayRecord:
    return ArrayRecord(
        {
            n: Array(np.ascontiguousarray(np.asarray(v, dtype=np.float64)))
            for n, v in vectors.items()
        }
    )


def _entropy(memberships: np.ndarray) -> float:
    c = np.clip(memberships, 1e-300, 1.0)
    return float(np.mean(-np.sum(c * np.log(c), axis=1)))


#: The memory W takes at most, in W's: built from the histograms and checked (symmetric, its
#: smallest eigenvalue), 3.13 times its size at 3,000 clients (tracemalloc's peak, and the
#: process's peak RSS alike), W itself included.
AFFINITY_PEAK = 3.2


class PPFL(StackedModelsStrategy):
    """PPFL with the RBCD schedule (Algorithm 1), Algorithm 2, or the authors' code order.

    ``model`` is the run's architecture, to build the K canonical models (copy 0 is the run's
    initial model, copy k a fresh seeded initialisation: docs/papers/ppfl.md §9.13); the
    parameters: :class:`PPFLParams`.
    """

    declaration = MethodDeclaration(
        name="ppfl",
        kind="paper",
        reference="Di, Yang, Ye, Chang, PPFL: A Personalized Federated Learning Framework for "
        "Heterogeneous Population, INFORMS Journal on Computing (docs/methods/ppfl.md)",
        summary="K canonical models shared by all, a membership vector on the simplex per "
        "client (mirror descent), a Laplacian over client affinities; RBCD",
        solver="pflarena.methods.ppfl.solver",
        params=PPFLParams,
        global_model=False,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """Its membership vector c_i; with ``persistent-momentum``, the momentum of every
        shared parameter θ (the body once, the canonical layers K times)."""
        k = params.num_canonical
        terms = [Footprint(f"its membership vector ({k} float64)", FLOAT64 * k)]
        if params.persistent_momentum:
            copied = set(
                copied_entries(
                    tuple(federation.entries), federation.trainable, params.canonical_layers
                )
            )
            canonical = [n for n in federation.trainable if n in copied]
            body = [n for n in federation.trainable if n not in copied]
            momentum = federation.entry_bytes(body) + k * federation.entry_bytes(canonical)
            terms.append(Footprint("the momentum of θ", momentum))
        return terms

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The replies; the memberships after every round; and with a Laplacian term
        (``lambda`` > 0 and an ``affinity``) the M × M affinity W, which takes
        :data:`AFFINITY_PEAK` times its size while it is built and checked (its symmetry and
        its smallest eigenvalue)."""
        n = federation.num_clients
        terms = [*super().server_footprint(params, federation), cls._history(params, federation)]
        if params.affinity != "none" and params.lambda_ > 0:
            terms.append(
                Footprint(f"the affinity W ({n} x {n} float64) as it is built and checked",
                          AFFINITY_PEAK * n * n * FLOAT64)
            )  # fmt: skip
        return terms

    checkpointed = {
        "memberships": "ppfl-memberships",
        "num_examples": "ppfl-num-examples",
        "histograms": "ppfl-histograms",
    }
    checkpointed_values = {"folded_round": "ppfl/folded_round"}

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """θ (the stacked state), and per client its membership vector, its examples, its
        label histogram and its memberships after every round (the run's membership picture)."""
        n, k = federation.num_clients, params.num_canonical
        return [
            *super().checkpoint_footprint(params, federation),
            Footprint(
                f"the memberships, examples and histograms ({n} x {k + 1 + federation.num_classes}"
                " float64)",
                n * (k + 1 + federation.num_classes) * FLOAT64,
            ),
            cls._history(params, federation),
        ]

    @staticmethod
    def _history(params: Any, federation: Federation) -> Footprint:
        """The memberships after every round (the run's membership picture), held by the
        server and kept in its checkpoint."""
        n, k, rounds = federation.num_clients, params.num_canonical, federation.num_rounds
        return Footprint(
            f"the memberships of every round ({rounds} x {n} x {k} float64)",
            rounds * n * k * FLOAT64,
        )

    prefix = CANONICAL_PREFIX

    @classmethod
    def from_setup(cls, setup: StrategySetup, **extra: Any) -> PPFL:
        return super().from_setup(
            setup, eval_every=setup.cfg.eval_every, num_rounds=setup.cfg.num_rounds, **extra
        )

    def __init__(
        self,
        params: PPFLParams | None = None,
        *,
        eval_every: int = 1,
        num_rounds: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, **kwargs)
        #: the run's evaluation rounds (every ``eval_every``-th and the last): a theta-first
        #: round's membership epoch is folded into the next round's message only when the
        #: round is not evaluated (:meth:`_may_fold`)
        self.eval_every = max(1, int(eval_every))
        self.num_rounds = num_rounds
        #: the round whose membership epoch the next round's message carries (None: none)
        self.folded_round: int | None = None
        if self.num_clients is None:
            raise ValueError("ppfl needs num_clients: the server holds every client's membership")
        p = self.params
        #: the membership steps "auto" resolves to: epoch for theta-first, else full
        self.steps_mode = (
            p.membership_steps
            if p.membership_steps != "auto"
            else ("epoch" if p.schedule == "theta-first" else "full")
        )
        #: C: row i is client i's membership c_i (Algorithm 1: C^0 = 1/K)
        self.memberships = uniform_memberships(self.num_clients, p.num_canonical)
        #: n_i as the clients last reported it (0: not heard from yet)
        self.num_examples = np.zeros(self.num_clients)
        #: the clients' label histograms (affinity=labels), rows of zeros until received
        self.histograms: np.ndarray | None = None
        self._affinity: np.ndarray | None = None
        self.block_rng = np.random.default_rng([self.seed, 0x9F1])
        #: round -> block ("theta", "membership", "both")
        self.blocks: dict[int, str] = {}
        #: round -> F(θ^t, C^t) over the clients that reported their loss
        self.objective: dict[int, float] = {}
        #: round -> C after the round
        self.history: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------------ state
    # the block RNG's state, and blocks, objective and history keyed by round: by hand
    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        # C, n_i and the histograms: ``checkpointed``; the folded round: ``checkpointed_values``
        arrays, meta = super().checkpoint_state()
        rounds = sorted(self.history)
        arrays["ppfl-history"] = (
            np.stack([self.history[r] for r in rounds])
            if rounds
            else np.zeros((0, self.num_clients, self.params.num_canonical))
        )
        meta.setdefault("ppfl", {}).update(
            {
                "block_rng": self.block_rng.bit_generator.state,
                "blocks": {str(r): b for r, b in self.blocks.items()},
                "objective": {str(r): v for r, v in self.objective.items()},
                "history_rounds": rounds,
            }
        )
        return arrays, meta

    def restore_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        super().restore_state(arrays, meta)
        own = meta["ppfl"]
        self._affinity = None  # W, from the restored histograms when it is next needed
        self.block_rng.bit_generator.state = own["block_rng"]
        self.blocks = {int(r): b for r, b in own["blocks"].items()}
        self.objective = {int(r): float(v) for r, v in own["objective"].items()}
        history = arrays["ppfl-history"]
        self.history = {int(r): np.array(history[i]) for i, r in enumerate(own["history_rounds"])}

    # ------------------------------------------------------------------ θ and W
    @classmethod
    def copies(cls, params: Any) -> tuple[int, int]:
        """θ: K canonical copies of the model's last ``canonical-layers`` weighted layers."""
        return params.num_canonical, params.canonical_layers

    def affinity(self) -> np.ndarray | None:
        """W (M × M), or None when the run has no Laplacian term."""
        mode = self.params.affinity
        if mode == "none" or self.params.lambda_ == 0:
            return None
        if self._affinity is not None:
            return self._affinity
        if mode == "complete":
            w = np.ones((self.num_clients, self.num_clients))
        elif self.histograms is None:
            return None
        else:
            w = affinity_from_histograms(
                self.histograms, "cosine" if mode == "labels" else "centered-cosine"
            )
        problem = affinity_problem(w)
        if problem is not None:
            raise ValueError(f"ppfl: the affinity matrix cannot be used: {problem}")
        self._affinity = w
        return w

    def client_weights(self) -> np.ndarray:
        """p_i = n_i / n over all clients; a client not heard from counts as the mean n_i."""
        n = self.num_examples.copy()
        known = n > 0
        n[~known] = n[known].mean() if known.any() else 1.0
        if self.params.theta_weights == "uniform":
            n = np.ones_like(n)
        return n / n.sum()

    def penalty_rows(self) -> np.ndarray:
        """π = the Laplacian term of every client's step at C^t (M × K; zeros without W)."""
        w = self.affinity()
        if w is None:
            return np.zeros_like(self.memberships)
        return penalty_gradient(w, self.memberships, self.params.lambda_, self.params.penalty)

    def step_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(w, Π)`` (M, and M × K) such that client i's step gradient is
        ``w_i ∇_c f_i + π_i``: every client's at once, so that a round's messages take their
        rows from one computation of Π (an M × M product), not one each."""
        p = self.client_weights()
        pi = self.penalty_rows()
        if self.params.scaling == "paper":
            return p, pi
        if self.params.scaling == "code":
            return np.ones_like(p), pi
        return np.ones_like(p), pi / p[:, None]

    # ------------------------------------------------------------------ messages
    def _config(self, server_round: int, phase: str, **extra: Any) -> ConfigRecord:
        # the run's schedule (lr-milestones, lr-gamma) scales θ's and the memberships' steps
        factor = self.training.lr_factor(server_round)
        return ConfigRecord(
            self.round_config(server_round)
            | {keys.PHASE: phase}
            | self.method_config(
                **{
                    "form": self.params.form,
                    "mix": self.params.mix,
                    "membership-lr": self.params.membership_lr * factor,
                    "persistent-momentum": self.params.persistent_momentum,
                    "membership-steps": self.steps_mode,
                    "membership-floor": self.params.membership_floor,
                    "local-steps": self.params.local_steps,
                }
            )
            | extra
        )

    def evaluate_config(self, server_round: int) -> dict:
        return {
            **super().evaluate_config(server_round),
            **self.method_config(form=self.params.form, mix=self.params.mix),
        }

    def _client(self, node: int) -> int | None:
        return self.client_ids.get(node)

    def _membership_of(self, node: int) -> np.ndarray:
        client = self._client(node)
        if client is None:  # not identified yet: every row is still C^0
            return np.full(self.params.num_canonical, 1.0 / self.params.num_canonical)
        return self.memberships[client]

    def _messages(
        self,
        nodes: Sequence[int],
        server_round: int,
        phase: str,
        theta: ArrayRecord | None,
        with_penalty: bool = False,
        memberships: dict[int, np.ndarray] | None = None,
        fold: dict[str, Any] | None = None,
    ) -> list[Message]:
        out = []
        if with_penalty:
            weights, penalties = self.step_inputs()
        for node in nodes:
            body: dict[str, Any] = {}
            if theta is not None:
                body[keys.ARRAYS] = theta  # one record shared by every message
            c = memberships[node] if memberships is not None else self._membership_of(node)
            vectors = {ppfl_keys.MEMBERSHIP_C: c}
            extra: dict[str, Any] = {}
            if with_penalty:
                client = self._client(node)
                if client is None:
                    weight, pi = 1.0, np.zeros(self.params.num_canonical)
                else:
                    weight, pi = float(weights[client]), penalties[client]
                vectors[ppfl_keys.MEMBERSHIP_PENALTY] = pi
                extra |= self.method_config(**{"loss-weight": float(weight)})
            body[ppfl_keys.MEMBERSHIP] = _vector_record(**vectors)
            body[keys.CONFIG] = self._config(server_round, phase, **extra, **(fold or {}))
            out.append(
                Message(content=RecordDict(body), message_type=MessageType.TRAIN, dst_node_id=node)
            )
        return out

    # ------------------------------------------------------------------ reply checks
    def _check_vector(self, content: RecordDict, key: str, simplex: bool) -> str | None:
        problem = vector_problem(
            content, key, {ppfl_keys.MEMBERSHIP_C: (self.params.num_canonical,)}
        )
        if problem is not None:
            return problem
        vector = content[key][ppfl_keys.MEMBERSHIP_C].numpy()
        if simplex and ((vector < 0).any() or abs(float(vector.sum()) - 1.0) > 1e-6):
            return f"{key!r} is not on the simplex (sum {float(vector.sum()):.6g})"
        return None

    @staticmethod
    def _check_loss(content: RecordDict) -> str | None:
        metrics = content[keys.METRICS]
        for name in (keys.NUM_EXAMPLES, ppfl_keys.START_LOSS):
            value = metrics.get(name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                return f"metric {name!r} must be a number >= 0, got {value!r}"
        if metrics[keys.NUM_EXAMPLES] <= 0:
            return f"metric {keys.NUM_EXAMPLES!r} must be > 0"
        return None

    def _check_theta(self, content: RecordDict, theta: ArrayRecord) -> str | None:
        return self._check_loss(content) or array_problem(content, theta, keys.ARRAYS)

    def _check_alternate(self, content: RecordDict, theta: ArrayRecord) -> str | None:
        return self._check_theta(content, theta) or self._check_vector(
            content, ppfl_keys.MEMBERSHIP, simplex=True
        )

    def _check_gradient(self, content: RecordDict) -> str | None:
        return self._check_loss(content) or self._check_vector(
            content, ppfl_keys.MEMBERSHIP_GRADIENT, simplex=False
        )

    def _check_steps(self, content: RecordDict) -> str | None:
        return self._check_vector(content, ppfl_keys.MEMBERSHIP, simplex=True)

    def _check_histogram(self, content: RecordDict) -> str | None:
        problem = vector_problem(
            content, ppfl_keys.LABEL_COUNTS, {"counts": (self.model.num_classes,)}
        )
        if problem is not None:
            return f"label histogram: {problem}"
        counts = content[ppfl_keys.LABEL_COUNTS]["counts"].numpy()
        if (counts < 0).any():
            return "the label histogram is not a histogram (negative counts)"
        examples = content[keys.METRICS].get(keys.NUM_EXAMPLES)
        if examples is None or float(counts.sum()) != float(examples):
            return (
                f"the label histogram counts {float(counts.sum()):g} samples, the reply's "
                f"{keys.NUM_EXAMPLES!r} {examples!r}"
            )
        return None

    # ------------------------------------------------------------------ the round
    def train_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, send: Send
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.server_round = server_round
        theta = self.stacked(arrays)
        self._round_arrays = theta
        start = self.memberships.copy()  # C^t, for the round's objective
        if self.params.affinity in ("labels", "centered-labels") and self.histograms is None:
            self._collect_histograms(server_round, grid, send)
        self.last_sampled = nodes = self.sample_train_nodes(grid)
        schedule = self.params.schedule
        if schedule == "rbcd":
            if self.block_rng.random() < self.params.theta_probability:
                new_theta, replies, losses = self._theta_block(server_round, nodes, theta, send)
                block = "theta"
            else:
                replies, losses = self._membership_block(server_round, nodes, theta, send)
                new_theta, block = None, "membership"
        elif schedule == "alternate":
            new_theta, replies, losses = self._alternate(server_round, nodes, theta, send)
            block = "both"
        else:
            folded, self.folded_round = self.folded_round, None
            new_theta, replies, losses = self._theta_block(server_round, nodes, theta, send, folded)
            if folded is not None:
                start = self.memberships.copy()  # C^t: the folded epochs' results
                self.history[folded] = start
            if new_theta is not None:
                if self._may_fold(server_round, nodes, replies):
                    self.folded_round = server_round
                else:
                    self._membership_steps(server_round, nodes, new_theta, send)
            block = "both"
        self.blocks[server_round] = block
        self.history[server_round] = self.memberships.copy()
        metrics = self.train_metrics(replies) or MetricRecord({})
        metrics["block-theta"] = int(block in ("theta", "both"))
        metrics["block-membership"] = int(block in ("membership", "both"))
        metrics["membership-entropy"] = _entropy(self.memberships)
        if losses:
            objective = self._objective(losses, start)
            self.objective[server_round] = objective
            metrics["objective"] = objective
        return new_theta, metrics

    def _collect_histograms(self, server_round: int, grid: Grid, send: Send) -> None:
        """The ``affinity`` exchange: every connected client's label histogram and n_i."""
        nodes = self.ordered_nodes(grid)
        messages = [
            Message(
                content=RecordDict(
                    {keys.CONFIG: self._config(server_round, ppfl_keys.PHASE_AFFINITY)}
                ),
                message_type=MessageType.TRAIN,
                dst_node_id=node,
            )
            for node in nodes
        ]
        exchange = send(ppfl_keys.PHASE_AFFINITY, messages)
        histograms = np.zeros((self.num_clients, self.model.num_classes))
        for msg in self.valid_replies(exchange, self._check_histogram):
            client = self.client_ids[exchange.node_of(msg)]
            histograms[client] = msg.content[ppfl_keys.LABEL_COUNTS]["counts"].numpy()
            self.num_examples[client] = float(msg.content[keys.METRICS][keys.NUM_EXAMPLES])
        self.histograms = histograms
        self._affinity = None

    def _learn(self, exchange: Exchange, replies: Sequence[Message]) -> dict[int, float]:
        """n_i of every usable reply, and its client's loss at the round's start."""
        losses: dict[int, float] = {}
        for msg in replies:
            client = self.client_ids[exchange.node_of(msg)]
            metrics = msg.content[keys.METRICS]
            self.num_examples[client] = float(metrics[keys.NUM_EXAMPLES])
            if ppfl_keys.START_LOSS in metrics:
                losses[client] = float(metrics[ppfl_keys.START_LOSS])
        return losses

    def _aggregate_theta(
        self, exchange: Exchange, replies: Sequence[Message]
    ) -> ArrayRecord | None:
        if not replies:
            return None
        records = [msg.content[keys.ARRAYS] for msg in replies]
        if self.params.theta_weights == "uniform":
            weights = [1.0] * len(replies)
        else:
            weights = [float(msg.content[keys.METRICS][keys.NUM_EXAMPLES]) for msg in replies]
        return weighted_average(records, weights)

    def _may_fold(self, server_round: int, nodes: list[int], replies: Sequence[Message]) -> bool:
        """Whether round ``server_round``'s membership epoch (theta-first: at θ^{t+1}, with
        π_i(C^t)) can wait for the next round's message, which carries θ^{t+1} anyway, with
        the same arithmetic: every client trains every round (full participation) and all
        of this round's did; the next round's server still holds C^t, so it sends the same
        π_i, w_i and step size; the round is not evaluated (its evaluation reads the c_i
        after the epoch) and not the last."""
        if self.fraction_train < 1.0 or len(replies) != len(nodes):
            return False
        if len(nodes) != self.num_clients:
            return False
        last = self.num_rounds is not None and server_round >= self.num_rounds
        return not last and server_round % self.eval_every != 0

    def _theta_block(
        self,
        server_round: int,
        nodes: list[int],
        theta: ArrayRecord,
        send: Send,
        folded: int | None = None,
    ) -> tuple[ArrayRecord | None, list[Message], dict[int, float]]:
        """The θ-block; with ``folded`` (a round), each client first takes that round's
        membership epoch at θ (the message's θ is θ^{folded+1}) and replies its new c_i too."""
        if folded is None:
            messages = self._messages(nodes, server_round, ppfl_keys.PHASE_THETA, theta)
        else:
            messages = self._messages(
                nodes,
                server_round,
                ppfl_keys.PHASE_THETA,
                theta,
                with_penalty=True,
                fold={
                    f"{self.method}.folded-round": int(folded),
                    f"{self.method}.folded-membership-lr": self.params.membership_lr
                    * self.training.lr_factor(folded),
                },
            )
        exchange = send(ppfl_keys.PHASE_THETA, messages)
        check = self._check_alternate if folded is not None else self._check_theta
        replies = self.valid_replies(exchange, lambda c: check(c, theta))
        self.last_failed = exchange.failed
        if folded is not None:
            self._take_memberships(exchange, replies)
        losses = self._learn(exchange, replies)
        return self._aggregate_theta(exchange, replies), replies, losses

    def _membership_block(
        self, server_round: int, nodes: list[int], theta: ArrayRecord, send: Send
    ) -> tuple[list[Message], dict[int, float]]:
        """Algorithm 1's C-block: gradients up, one server-side step per client, c_i down."""
        exchange = send(
            ppfl_keys.PHASE_GRADIENT,
            self._messages(nodes, server_round, ppfl_keys.PHASE_GRADIENT, theta),
        )
        replies = self.valid_replies(exchange, self._check_gradient)
        self.last_failed = exchange.failed
        losses = self._learn(exchange, replies)
        if not replies:
            return replies, losses
        clients = [self.client_ids[exchange.node_of(m)] for m in replies]
        grads = np.stack(
            [
                m.content[ppfl_keys.MEMBERSHIP_GRADIENT][ppfl_keys.MEMBERSHIP_C].numpy()
                for m in replies
            ]
        )
        weights = self.client_weights()[clients]
        penalty = self.penalty_rows()[clients]  # at C^t, before any row moves
        step = membership_step_gradient(grads, weights, penalty, self.params.scaling)
        new = exponentiated_gradient_step(
            self.memberships[clients], step, self.params.membership_lr, self.params.membership_floor
        )
        self.memberships[clients] = new
        # Algorithm 1's synchronisation: each client gets its new c_i
        sync_nodes = [exchange.node_of(m) for m in replies]
        memberships = {node: new[i] for i, node in enumerate(sync_nodes)}
        sync = send(
            ppfl_keys.PHASE_SYNC,
            self._messages(
                sync_nodes, server_round, ppfl_keys.PHASE_SYNC, None, memberships=memberships
            ),
        )
        self.valid_replies(sync, lambda c: None)
        return replies, losses

    def _alternate(
        self, server_round: int, nodes: list[int], theta: ArrayRecord, send: Send
    ) -> tuple[ArrayRecord | None, list[Message], dict[int, float]]:
        """Algorithm 2: θ^t and π_i down; the client steps c_i, trains θ, returns both."""
        exchange = send(
            ppfl_keys.PHASE_ALTERNATE,
            self._messages(
                nodes, server_round, ppfl_keys.PHASE_ALTERNATE, theta, with_penalty=True
            ),
        )
        replies = self.valid_replies(exchange, lambda c: self._check_alternate(c, theta))
        self.last_failed = exchange.failed
        losses = self._learn(exchange, replies)
        self._take_memberships(exchange, replies)
        return self._aggregate_theta(exchange, replies), replies, losses

    def _membership_steps(
        self, server_round: int, nodes: list[int], theta: ArrayRecord, send: Send
    ) -> None:
        """The authors' code after the θ-block: θ^{t+1} and π_i down, c_i steps, c_i up."""
        exchange = send(
            ppfl_keys.PHASE_STEPS,
            self._messages(nodes, server_round, ppfl_keys.PHASE_STEPS, theta, with_penalty=True),
        )
        replies = self.valid_replies(exchange, self._check_steps)
        self.last_failed = sorted(set(self.last_failed) | set(exchange.failed))
        self._take_memberships(exchange, replies)

    def _take_memberships(self, exchange: Exchange, replies: Sequence[Message]) -> None:
        for msg in replies:
            client = self.client_ids[exchange.node_of(msg)]
            self.memberships[client] = msg.content[ppfl_keys.MEMBERSHIP][
                ppfl_keys.MEMBERSHIP_C
            ].numpy()

    def _objective(self, losses: dict[int, float], memberships: np.ndarray) -> float:
        """F(θ^t, C^t) (Eq. 9) from the reported losses (p renormalized over the clients that
        reported) and ``memberships`` = C^t."""
        clients = sorted(losses)
        weights = self.client_weights()[clients]
        value = float(np.dot(weights / weights.sum(), [losses[c] for c in clients]))
        w = self.affinity()
        if w is not None:
            value += self.params.lambda_ * laplacian_penalty(w, memberships)
        return value

    # ------------------------------------------------------------------ results
    def run_summary(self) -> dict[str, Any]:
        last = self.memberships
        return {
            "schedule": self.params.schedule,
            "form": self.params.form
            if self.params.form == "interpolate"
            else f"mix-{self.params.mix}",
            "num_canonical": self.params.num_canonical,
            "blocks": {
                "theta": sum(b in ("theta", "both") for b in self.blocks.values()),
                "membership": sum(b in ("membership", "both") for b in self.blocks.values()),
            },
            "objective_first": self.objective[min(self.objective)] if self.objective else None,
            "objective_last": self.objective[max(self.objective)] if self.objective else None,
            "membership_entropy": _entropy(last),
            "membership_max_mean": float(last.max(axis=1).mean()),
            "affinity": self.params.affinity,
        }

    def write_artifacts(self, output_dir: Path) -> list[Path]:
        """``memberships.csv`` (round, client, k, c_ik) and ``memberships.png``."""
        if not self.history:
            return []
        output_dir.mkdir(parents=True, exist_ok=True)
        csv = output_dir / "memberships.csv"
        lines = ["round,client," + ",".join(f"c{k}" for k in range(self.params.num_canonical))]
        for r in sorted(self.history):
            for client, row in enumerate(self.history[r]):
                lines.append(f"{r},{client}," + ",".join(f"{v:.6g}" for v in row))
        csv.write_text("\n".join(lines) + "\n")
        return [csv, membership_picture(output_dir / "memberships.png", self.history)]


def membership_picture(path: Path, history: dict[int, np.ndarray], panels: int = 4) -> Path:
    """The clients × K membership matrix as heatmaps at up to ``panels`` rounds (Fig. 5a):
    the first round, evenly spaced ones, and the last."""
    rounds = sorted(history)
    picks = sorted(
        {rounds[round(i * (len(rounds) - 1) / max(panels - 1, 1))] for i in range(panels)}
    )
    return drawing.heatmap_panels(
        path,
        {f"round {r}": history[r] for r in picks},
        title="PPFL memberships c_ik",
        colorbar_label="membership c_ik",
        xlabel="canonical model k",
        ylabel="client id",
        vmin=0.0,
        vmax=1.0,
    )
