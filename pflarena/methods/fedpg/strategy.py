"""FedPG: a global model by multi-gradient descent, personalized models by direction drift.

"Preserving Global Performance in Personalized Federated Learning" (docs/methods/fedpg.md). The
server math is :mod:`pflarena.algorithms.mgda` (re-exported here: :func:`common_descent_direction`,
:func:`drift_coefficient`); this module runs it as a Flower strategy. Signs follow
``algorithms/mgda.py``: ``d`` points up the losses and the update is ``θ ← θ − η d`` (the
reading's ``d``, docs/papers/fedpg.md §2, is ``−d`` here).

A round (Algorithm 1, §3.2) is two exchanges, or more with S-FedPG's line search:

1. ``gradients``: the sampled clients get θ^t and reply with ``g_i`` (full-batch training
   gradient at θ^t by default; the pseudo-gradient of local epochs with
   ``grad-mode=pseudo``) and ``L_i`` (mean training loss at θ^t). The server keeps each
   client's latest raw gradient in a pool (``self.pool("gradients")``, on disk, rolled back
   with the checkpoints).
2. Server: the stale gradients of recently absent clients (window ``τ = ⌈M/|S^t|⌉``, §2.5,
   §9.8) join the QP; :func:`common_descent_direction` gives ``u`` and the weights λ* (fair
   column on, zero gradients dropped, norms equalized); ``d = u ‖d_r‖/‖u‖`` (Algorithm 1
   line 11, σ = ‖d_r‖/‖u‖ kept for the line search's lower bound); the step
   ``η^t = lr · lr-decay^(t−1)``; ``θ^{t+1} = θ^t − η^t d``; each online client's drift
   coefficient ``γ_i`` (eq. 8 closed form against the other online clients, or a floor).
3. ``line-search-k`` (S-FedPG only, ``line-search=true``): trial steps from ``2^s η``
   halving; each trial is one exchange in which the clients return ``L_i(θ^t − η_try d)``;
   the first trial carries ``d``. Armijo on every ``L_i`` and on ``F'`` (§3.3).
4. ``personalize``: each online client gets ``d`` (unless the line search sent it), its
   ``γ_i`` and ``η^t`` and builds its P-model ``θ_i = θ^t − η^t((1 − γ_i) d + γ_i g_i)``
   from the θ^t and g_i it kept. **Why an exchange of its own:** the P-model depends only
   on the round's θ^t, g_i, d, γ_i and η^t (§2.7, §9.17), and the paper sends ``d``, ``γ_i``,
   ``η^t`` to the online clients in the round (§3.2, §3.5). Riding on the client's next
   message would leave it without a P-model until it is sampled again, which at 10%
   participation is ~10 rounds of evaluations on a model from an older round or none; a
   per-client evaluate message cannot carry it either (evaluate messages write no client
   state). The exchange costs one n-float download per online client (the "d^t
   download" of docs/papers/fedpg.md §3.5) and a metrics-only reply.

Ablations (Table 2): ``direction=average`` (M1, d = d_r), ``fairness=false`` (M2),
``personalize=false`` (M3: no drift, no personalize exchange, P-model = the global model),
``absent-clients=false`` (M4). ``gamma`` = a number gives the "FedPG γ = 0.3/0.6/1.0"
variants of Table 1 as a floor, ``γ_i = max(eq. 8, γ)`` (docs/papers/fedpg.md §9.9).

Every decision where the paper leaves room (the gradient, the step size, the
stale window, the fair column, the line search's fallback), with the measurements behind
it, is in ``docs/papers/fedpg.md`` §11.

How it runs: docs/methods/fedpg.md; the reading of the paper, decisions and measurements:
docs/papers/fedpg.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
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
from flwr.serverapp import Grid

from pflarena.algorithms.mgda import (
    ZERO_GRAD_NORM,
    common_descent_direction,
    drift_coefficient,
    drift_coefficients,
    fair_objective,
    fairness_weights,
)
from pflarena.core import drawing, keys
from pflarena.core.footprint import FLOAT64, Federation, Footprint
from pflarena.core.methods import MethodDeclaration
from pflarena.methods.fedpg import keys as fedpg_keys
from pflarena.methods.fedpg.params import FedPGParams, parse_gamma
from pflarena.strategies.aggregation import as_numpy, as_record, flatten, float_names, unflatten
from pflarena.strategies.base import (
    Exchange,
    MultiExchangeStrategy,
    Send,
    StrategySetup,
    array_problem,
)

__all__ = [
    "FedPG",
    "FedPGParams",
    "common_descent_direction",
    "drift_coefficient",
    "parse_gamma",
    "stale_window",
]

GRADIENT, DIRECTION = fedpg_keys.GRADIENT, fedpg_keys.DIRECTION
POOL = "gradients"  # the server pool of each client's latest raw gradient
_RESCALE = {"scaled-mean": "scaled_mean", "raw-mean": "raw_mean", "none": "none"}


def stale_window(
    last_seen: dict[int, int], online: Sequence[int], server_round: int
) -> tuple[int, list[int]]:
    """``(τ, A^t)``: τ = ⌈M/|S^t|⌉ and the absent clients last seen in ``[t − τ, t − 1]``.

    ``last_seen`` must already count this round's online clients (M includes them).
    """
    if not online:
        return 0, []
    tau = math.ceil(len(last_seen) / len(online))
    present = set(online)
    absent = [
        c
        for c, seen in sorted(last_seen.items())
        if c not in present and server_round - tau <= seen <= server_round - 1
    ]
    return tau, absent


class FedPG(MultiExchangeStrategy):
    """FedPG and S-FedPG (Algorithm 1 with the absent-client handling of §2.5).

    Parameters
    ----------
    trainable
        The model's trainable parameter names, in order: the layout of g_i, d and the update.
    Others
        See :class:`FedPGParams`.
    """

    declaration = MethodDeclaration(
        name="fedpg",
        kind="paper",
        reference="Preserving Global Performance in Personalized Federated Learning, "
        "ICCV submission 6989 (docs/methods/fedpg.md)",
        summary="global model by a fair min-norm common descent direction over client "
        "gradients (MGDA), P-models by drifting it toward each client's own gradient",
        solver="pflarena.methods.fedpg.solver",
        params=FedPGParams,
        default_fraction_train=0.1,
        honours=frozenset({"local-epochs", "batch-size", "lr"}),
    )
    pool_models = (1, "its latest gradient")

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        terms = []
        if params.personalize or params.line_search:  # the round's model and gradient kept
            trainable = federation.entry_bytes(federation.trainable)
            terms += [
                Footprint("the round's model", federation.entry_bytes()),
                Footprint("its gradient", trainable),
                Footprint("the common direction", trainable),
            ]
        if params.personalize:
            terms.append(Footprint("its personal model", federation.state_bytes()))
        return terms

    @classmethod
    def checkpoint_records(cls, params: Any, federation: Federation) -> float:
        """Beside the run's bookkeeping, each client's last round and whether its gradient
        is held (``"3549": 100, `` and ``3549, ``: 19 bytes), and every round's γ and
        online weight of each sampled client and, with ``absent-clients``, the weight of each
        client of the stale window (up to all the others), 29 bytes each
        (``"3549": 0.12345678901234567, ``)."""
        n, m, rounds = federation.num_clients, federation.sampled, max(federation.num_rounds, 0)
        weights = m * (2 if params.personalize else 1)
        weights += max(n - m, 0) if params.absent_clients else 0
        own = 19 * n + 29 * rounds * weights
        return super().checkpoint_records(params, federation) + own

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The round's gradients and, with ``absent-clients``, the stale gradients of the
        window (every client seen in the last ⌈N/S⌉ rounds: up to all the others), flattened
        in float64, and the QP's Gram matrix over them."""
        n, f = federation.num_clients, federation
        columns = n if params.absent_clients else f.sampled
        terms = [
            *super().server_footprint(params, federation),
            Footprint(f"the round's gradients, flattened ({f.sampled} x {f.model_params} "
                      "float64)", f.sampled * f.model_params * FLOAT64),
            Footprint(f"the QP's Gram matrix ({columns + 1} x {columns + 1} float64)",
                      (columns + 1) ** 2 * FLOAT64),
        ]  # fmt: skip
        if params.absent_clients:
            stale = max(n - f.sampled, 0)
            terms.append(
                Footprint(f"the stale window's gradients, flattened ({stale} x "
                          f"{f.model_params} float64)", stale * f.model_params * FLOAT64)
            )  # fmt: skip
        return terms

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> FedPG:
        return cls(setup.params, trainable=setup.trainable, **setup.common(cls.declaration))

    def __init__(
        self,
        params: FedPGParams | None = None,
        *,
        trainable: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(params, **kwargs)
        self.trainable = list(trainable)
        #: γ's floor (None: adaptive), parsed from ``gamma``
        self.gamma_floor = parse_gamma(self.params.gamma)
        #: whether the latest line search ended without a step meeting Armijo
        self.search_fallback = False
        #: client id -> the round its latest accepted gradient was uploaded (M = its size)
        self.last_seen: dict[int, int] = {}
        #: clients whose gradient the pool holds (not evicted)
        self.held: set[int] = set()
        #: round -> client id -> γ_i
        self.gammas: dict[int, dict[int, float]] = {}
        #: round -> QP weights: {"online": {client: λ}, "fair": λ, "stale": {client: λ}}
        self.weights: dict[int, dict[str, Any]] = {}
        #: round -> {"tau", "stale", "held", "bytes"}
        self.window: dict[int, dict[str, int]] = {}

    def step_size(self, server_round: int) -> float:
        """The scheduled ``η^t = lr · lr-decay^(t−1)``."""
        return self.training.lr * self.params.lr_decay ** (server_round - 1)

    # ------------------------------------------------------------------ checkpoints
    # dicts keyed by client id and round (JSON keys them by string) and a set: by hand
    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = super().checkpoint_state()
        meta["fedpg"] = {
            "last_seen": {str(c): r for c, r in self.last_seen.items()},
            "held": sorted(self.held),
            "gammas": {str(r): {str(c): g for c, g in v.items()} for r, v in self.gammas.items()},
            "weights": {
                str(r): {
                    "online": {str(c): w for c, w in v["online"].items()},
                    "fair": v["fair"],
                    "stale": {str(c): w for c, w in v["stale"].items()},
                }
                for r, v in self.weights.items()
            },
            "window": {str(r): v for r, v in self.window.items()},
        }
        return arrays, meta

    def restore_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        super().restore_state(arrays, meta)
        own = meta.get("fedpg", {})
        self.last_seen = {int(c): int(r) for c, r in own.get("last_seen", {}).items()}
        self.held = {int(c) for c in own.get("held", [])}
        self.gammas = {
            int(r): {int(c): float(g) for c, g in v.items()}
            for r, v in own.get("gammas", {}).items()
        }
        self.weights = {
            int(r): {
                "online": {int(c): float(w) for c, w in v["online"].items()},
                "fair": float(v["fair"]),
                "stale": {int(c): float(w) for c, w in v["stale"].items()},
            }
            for r, v in own.get("weights", {}).items()
        }
        self.window = {int(r): dict(v) for r, v in own.get("window", {}).items()}

    # ------------------------------------------------------------------ messages
    def _config(self, server_round: int, phase: str, **extra: Any) -> ConfigRecord:
        keep = self.params.personalize or self.params.line_search
        return ConfigRecord(
            self.round_config(server_round)
            | {keys.PHASE: phase}
            | self.method_config(**{"grad-mode": self.params.grad_mode, "keep": keep})
            | extra
        )

    @staticmethod
    def _messages(nodes: Sequence[int], content_for) -> list[Message]:
        return [
            Message(content=content_for(n), message_type=MessageType.TRAIN, dst_node_id=n)
            for n in nodes
        ]

    def _check_gradient(self, content: RecordDict, reference: ArrayRecord) -> str | None:
        problem = array_problem(content, reference, GRADIENT)
        if problem is not None:
            return problem
        loss = content[keys.METRICS].get(keys.TRAIN_LOSS)
        if not isinstance(loss, int | float) or isinstance(loss, bool) or loss < 0:
            return f"metric {keys.TRAIN_LOSS!r} must be a loss >= 0, got {loss!r}"
        return None

    @staticmethod
    def _check_trial(content: RecordDict) -> str | None:
        loss = content[keys.METRICS].get(fedpg_keys.TRIAL_LOSS)
        if not isinstance(loss, int | float) or isinstance(loss, bool) or loss < 0:
            return f"metric {fedpg_keys.TRIAL_LOSS!r} must be a loss >= 0, got {loss!r}"
        return None

    # ------------------------------------------------------------------ the round
    def train_round(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, send: Send
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.server_round = server_round
        self._round_arrays = arrays
        self.last_sampled = nodes = self.sample_train_nodes(grid)
        names = self.trainable or float_names(arrays)
        reference = ArrayRecord({n: arrays[n] for n in names})
        config = self._config(server_round, fedpg_keys.PHASE_GRADIENTS)
        first = send(
            fedpg_keys.PHASE_GRADIENTS,
            self._messages(nodes, lambda n: RecordDict({keys.ARRAYS: arrays, keys.CONFIG: config})),
        )
        replies = self.valid_replies(first, lambda c: self._check_gradient(c, reference))
        if not replies:
            return None, None
        online_nodes = [first.node_of(m) for m in replies]
        clients = [self.client_ids[n] for n in online_nodes]
        grads = np.stack([flatten(m.content[GRADIENT], names) for m in replies])
        losses = np.array([float(m.content[keys.METRICS][keys.TRAIN_LOSS]) for m in replies])

        # the stale window (§2.5): this round's clients count in M
        pool = self.pool(POOL)
        for client, msg in zip(clients, replies, strict=True):
            pool.put(client, server_round, {GRADIENT: msg.content[GRADIENT]})
            self.last_seen[client] = server_round
            self.held.add(client)
        tau, absent = stale_window(self.last_seen, clients, server_round)
        stale_clients, stale = [], []
        if self.params.absent_clients:
            for client in absent:
                record = pool.get(client, GRADIENT) if client in self.held else None
                if record is not None and len(record):
                    stale_clients.append(client)
                    stale.append(flatten(record, names))
        stale_grads = np.stack(stale) if stale else None

        # the common direction (Algorithm 1 lines 5-11)
        direction, weights, sigma = self.common_direction(grads, losses, stale_grads)
        eta = self.step_size(server_round)
        metrics: dict[str, float] = {}
        search: list[Exchange] = []
        if self.params.line_search and np.linalg.norm(direction) > 0:
            eta, trials = self.search_step(
                server_round,
                arrays,
                names,
                online_nodes,
                grads,
                losses,
                direction,
                sigma,
                send,
                search,
            )
            metrics["line-search-trials"] = trials
            metrics["line-search-fallback"] = int(self.search_fallback)

        # the drift coefficients (eq. 8) and the global update
        gammas = self.drift(grads, direction, stale_grads) if self.params.personalize else None
        new = as_numpy(arrays)
        step = unflatten(eta * direction, reference, names)
        for name in names:
            new[name] = (new[name] - step[name]).astype(new[name].dtype)
        new_arrays = as_record(new)

        if gammas is not None:
            self.gammas[server_round] = dict(zip(clients, map(float, gammas), strict=True))
            self._personalize(
                server_round, online_nodes, gammas, eta, direction, reference, names, send, search
            )
        k = len(clients)
        self.weights[server_round] = {
            "online": dict(zip(clients, map(float, weights[:k]), strict=True)),
            "fair": float(weights[k]),
            "stale": dict(zip(stale_clients, map(float, weights[k + 1 :]), strict=True)),
        }
        self._evict(server_round, tau, clients)
        held_bytes = sum(4 * grads.shape[1] for _ in self.held)  # float32 gradients
        self.window[server_round] = {
            "tau": tau,
            "stale": len(stale_clients),
            "held": len(self.held),
            "bytes": held_bytes,
        }
        base = self.train_metrics(replies)
        assert base is not None
        base.update(
            {
                "step": float(eta),
                "direction-norm": float(np.linalg.norm(direction)),
                "fair-weight": float(weights[k]),
                "window-tau": tau,
                "window-stale": len(stale_clients),
                "window-bytes": held_bytes,
                **metrics,
            }
        )
        if gammas is not None and len(gammas):
            base["mean-gamma"] = float(np.mean(gammas))
            base["min-gamma"] = float(np.min(gammas))
        return new_arrays, base

    def common_direction(
        self, grads: np.ndarray, losses: np.ndarray, stale_grads: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """``(d, λ*, σ)``: the rescaled direction, the QP weights, and ``σ = ‖d‖/‖u‖``."""
        k = grads.shape[0]
        r = 0 if stale_grads is None else stale_grads.shape[0]
        if self.params.direction == "average":  # M1: the FedSGD direction d_r
            norms = np.linalg.norm(grads, axis=1)
            kept = norms > ZERO_GRAD_NORM
            weights = np.zeros(k + 1 + r)
            if not kept.any():
                return np.zeros(grads.shape[1]), weights, 1.0
            weights[:k][kept] = 1.0 / kept.sum()
            return self._fedsgd(grads), weights, 1.0
        u, weights = common_descent_direction(
            grads,
            fairness=self.params.fairness,
            losses=losses if self.params.fairness else None,
            rescale="none",
            stale_grads=stale_grads,
        )
        norm = float(np.linalg.norm(u))
        if norm == 0.0 or self.params.rescale == "none":
            return u, weights, 1.0
        sigma = float(np.linalg.norm(self._fedsgd(grads))) / norm
        return u * sigma, weights, sigma

    def _fedsgd(self, grads: np.ndarray) -> np.ndarray:
        """``d_r``: the mean of the kept gradients, norm-equalized (``scaled-mean``) or raw.

        The rule of :func:`common_descent_direction` (step 6); kept here so that σ is known.
        """
        norms = np.linalg.norm(grads, axis=1)
        kept = norms > ZERO_GRAD_NORM
        g = grads[kept]
        if self.params.rescale == "raw-mean":
            return g.mean(axis=0)
        mu = norms[kept].mean()
        return (g * (mu / norms[kept])[:, None]).mean(axis=0)

    def drift(
        self, grads: np.ndarray, direction: np.ndarray, stale_grads: np.ndarray | None
    ) -> np.ndarray:
        """Each online client's γ_i (eq. 8) against the others, with the floor if any."""
        if self.params.drift_absent and stale_grads is not None:
            gammas = np.array(
                [
                    drift_coefficient(
                        grads[i], direction, np.concatenate([np.delete(grads, i, 0), stale_grads])
                    )
                    for i in range(grads.shape[0])
                ]
            )
        else:
            gammas = drift_coefficients(grads, direction)
        if self.gamma_floor is not None:
            gammas = np.maximum(gammas, self.gamma_floor)
        return gammas

    def search_step(
        self,
        server_round: int,
        arrays: ArrayRecord,
        names: list[str],
        nodes: list[int],
        grads: np.ndarray,
        losses: np.ndarray,
        direction: np.ndarray,
        sigma: float,
        send: Send,
        exchanges: list[Exchange],
    ) -> tuple[float, int]:
        """S-FedPG's Armijo line search (§3.3): ``(η^t, number of trials)``."""
        eta = self.step_size(server_round)
        scale = 0.5**self.params.line_search_s
        lower = (
            scale * eta * sigma
            if self.params.line_search_lower == "times-sigma"
            else scale * eta / sigma
        )
        slopes = grads @ direction  # g_i·d ≥ 0: the first-order decrease per unit step
        record = as_record(unflatten(direction, arrays, names))
        index = {node: i for i, node in enumerate(nodes)}
        active = list(nodes)
        trial = 2.0**self.params.line_search_s * eta
        tried: list[tuple[float, float]] = []  # (η, mean loss change)
        count = 0
        while trial >= lower and active:
            count += 1
            extra = self.method_config(step=trial)
            config = self._config(server_round, fedpg_keys.PHASE_LINE_SEARCH, **extra)
            with_d = count == 1

            def content(_node, config=config, with_d=with_d):
                body = {keys.CONFIG: config}
                if with_d:
                    body[DIRECTION] = record
                return RecordDict(body)

            exchange = send(
                f"{fedpg_keys.PHASE_LINE_SEARCH}-{count}", self._messages(active, content)
            )
            exchanges.append(exchange)
            answers = self.valid_replies(exchange, self._check_trial)
            active = [exchange.node_of(m) for m in answers]
            if not active:
                break
            rows = np.array([index[n] for n in active])
            new = np.array([float(m.content[keys.METRICS][fedpg_keys.TRIAL_LOSS]) for m in answers])
            old = losses[rows]
            tried.append((trial, float(np.max(new - old))))
            ok = bool(np.all(new <= old - self.params.line_search_beta * trial * slopes[rows]))
            if ok and self.params.fairness and len(rows) > 1:
                h = fairness_weights(old)
                fair_slope = float(h @ slopes[rows])  # −∇F'·d: F' decreases along −d iff > 0
                # d descends the fair column of the QP (scaled gradients), not necessarily F'
                # of the raw losses; where it does not, no step meets F''s Armijo condition
                if fair_slope > 0:
                    ok = fair_objective(new) <= (
                        fair_objective(old) - self.params.line_search_beta * trial * fair_slope
                    )
            if ok:
                self.search_fallback = False
                return trial, count
            trial /= 2.0
        self.search_fallback = True
        if not tried:
            return eta, count
        # the largest tried step that raised no online client's loss, else the smallest tried
        safe = [t for t, worst in tried if worst <= 0]
        return (max(safe) if safe else min(t for t, _ in tried)), count

    def _personalize(
        self,
        server_round: int,
        nodes: list[int],
        gammas: np.ndarray,
        eta: float,
        direction: np.ndarray,
        reference: ArrayRecord,
        names: list[str],
        send: Send,
        search: list[Exchange],
    ) -> None:
        """The ``personalize`` exchange: d (unless held), γ_i and η^t to each online client."""
        record = as_record(unflatten(direction, reference, names))
        holds = set()
        if search:  # the first trial carried d; those who answered it keep it
            holds = {search[0].node_of(m) for m in search[0].replies if not m.has_error()}
            holds -= set(search[0].rejected)
        gamma_of = dict(zip(nodes, map(float, gammas), strict=True))

        def content(node: int) -> RecordDict:
            body: dict[str, Any] = {
                keys.CONFIG: self._config(
                    server_round,
                    fedpg_keys.PHASE_PERSONALIZE,
                    **self.method_config(**{"drift-gamma": gamma_of[node], "step": float(eta)}),
                )
            }
            if node not in holds:
                body[DIRECTION] = record
            return RecordDict(body)

        exchange = send(fedpg_keys.PHASE_PERSONALIZE, self._messages(nodes, content))
        self.valid_replies(exchange, lambda c: None)

    def _evict(self, server_round: int, tau: int, online: Sequence[int]) -> None:
        """Drop gradients that even the next round's window (same τ) would not use."""
        pool = self.pool(POOL)
        present = set(online)
        for client in sorted(self.held):
            if client not in present and self.last_seen[client] < server_round + 1 - tau:
                pool.put(client, server_round, {GRADIENT: ArrayRecord()})
                self.held.discard(client)

    # ------------------------------------------------------------------ results
    def run_summary(self) -> dict[str, Any]:
        window = list(self.window.values())
        all_gammas = [g for v in self.gammas.values() for g in v.values()]
        return {
            "grad_mode": self.params.grad_mode,
            "line_search": self.params.line_search,
            "gamma": "adaptive" if self.gamma_floor is None else self.gamma_floor,
            "ablations": {
                "direction": self.params.direction,
                "fairness": self.params.fairness,
                "absent_clients": self.params.absent_clients,
                "personalize": self.params.personalize,
            },
            "stale_window": {
                "max_tau": max((w["tau"] for w in window), default=0),
                "max_stale_columns": max((w["stale"] for w in window), default=0),
                "max_gradients_held": max((w["held"] for w in window), default=0),
                "max_bytes_held": max((w["bytes"] for w in window), default=0),
                "last": window[-1] if window else None,
            },
            "mean_gamma": float(np.mean(all_gammas)) if all_gammas else None,
        }

    def write_artifacts(self, output_dir: Path) -> list[Path]:
        """``gammas.csv``/``gammas.png`` and ``qp-weights.csv``/``qp-weights.png``."""
        written: list[Path] = []
        output_dir.mkdir(parents=True, exist_ok=True)
        if self.gammas:
            csv = output_dir / "gammas.csv"
            lines = ["round,client,gamma"] + [
                f"{r},{c},{g:.6g}"
                for r, v in sorted(self.gammas.items())
                for c, g in sorted(v.items())
            ]
            csv.write_text("\n".join(lines) + "\n")
            written += [csv, self._heatmap(output_dir / "gammas.png", self.gammas, "γ_i", 0.0, 1.0)]
        if self.weights:
            csv = output_dir / "qp-weights.csv"
            lines = ["round,column,client,weight"]
            for r, v in sorted(self.weights.items()):
                lines += [f"{r},online,{c},{w:.6g}" for c, w in sorted(v["online"].items())]
                lines.append(f"{r},fair,,{v['fair']:.6g}")
                lines += [f"{r},stale,{c},{w:.6g}" for c, w in sorted(v["stale"].items())]
            csv.write_text("\n".join(lines) + "\n")
            per_client = {
                r: {**v["online"], **v["stale"], -1: v["fair"]} for r, v in self.weights.items()
            }
            written += [
                csv,
                self._heatmap(
                    output_dir / "qp-weights.png",
                    per_client,
                    "QP weights λ* (×: stale gradient)",
                    marks={(r, c) for r, v in self.weights.items() for c in v["stale"]},
                ),
            ]
        return written

    def _heatmap(
        self,
        path: Path,
        values: dict[int, dict[int, float]],
        title: str,
        vmin: float | None = None,
        vmax: float | None = None,
        marks: set[tuple[int, int]] = frozenset(),
    ) -> Path:
        """``values`` (round -> client -> value) as a clients × rounds heatmap, blank where a
        client was not in the round; ``marks`` are the (round, client) cells marked ×."""
        rounds = sorted(values)
        rows = sorted({c for v in values.values() for c in v})
        matrix = np.full((len(rows), len(rounds)), np.nan)
        for j, r in enumerate(rounds):
            for i, c in enumerate(rows):
                if c in values[r]:
                    matrix[i, j] = values[r][c]
        return drawing.heatmap(
            path,
            matrix,
            title=f"FedPG {title}\nby round (blank: not in the round)",
            colorbar_label=title,
            xlabel="round",
            ylabel="client id",
            column_labels=[str(r) for r in rounds],
            row_labels=["fair" if c == -1 else str(c) for c in rows],
            marks={
                (i, j) for j, r in enumerate(rounds) for i, c in enumerate(rows) if (r, c) in marks
            },
            vmin=vmin,
            vmax=vmax,
        )
