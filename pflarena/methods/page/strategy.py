"""PAGE: a client-server co-opetition game, each side played by DDPG agents.

"PAGE: Equilibrate Personalization and Generalization in Federated Learning"
(docs/methods/page.md). The clients (leaders) choose their local epochs α_i(t) and learning rates
η_i(t); the server (follower) chooses the aggregation weights p(t) on the simplex; each side
learns its choice with DDPG (:mod:`pflarena.algorithms.ddpg`). This module is the server's side,
Algorithm 1 as docs/papers/page.md §3.3 reconstructs it; the clients' side is
:mod:`pflarena.methods.page.solver`.

One round (one exchange, §3.5):

1. every client gets W(t), runs its own agent (state: the accuracy of W(t) on its training
   split; action: α_i, η_i), trains ŵ_i(t) = Train(η_i, α_i; W(t)) (Eq. 4) and uploads it
   with the loss f_i(ŵ_i(t)) (docs/papers/page.md §9.5);
2. the server's state is s_CS(t) = [acc(ŵ_i(t); D_CS)]_i (§2.4), computed by the server on
   its own data; the pending transition of the previous round gets it as its next state;
3. round 1 (``warmup-rounds``): p(t) ~ Dirichlet(1_N), "DDPG models cannot update without
   prior experience"; later rounds: one minibatch update, then p(t) = softmax(μ(s) + noise);
4. W(t+1) = Σ_i p_i(t) ŵ_i(t) (Eq. 5), no data-size factor;
5. the reward r_CS(t) (below) waits in the pending transition for s_CS(t+1).

**Reward, bounded by default (docs/papers/page.md §9.11, §9.12).** Definition 1: u_CS = 1/F(W(t+1))
and then identifies F(W(t+1)) with Σ_i p_i f_i(ŵ_i(t)), the weighted clients' own losses.
That identification has a degenerate myopic optimum: all weight on the client with the
smallest training loss. The default ``server-reward=global-loss`` computes F(W(t+1))
itself, the mean cross-entropy of the aggregated model on the server's data, whose optimum
is an interior mixture; ``client-loss`` is Algorithm 1's form. Both are bounded with the
loss floor, r = k_g / max(F, f_min), f_min = ``loss-floor`` = 0.01 (rewards ≤ 100 k_g);
``loss-floor=0`` is the paper's unbounded 1/F (a loss of exactly 0 is then taken as 1e-12,
so the reward stays finite). The paper's form is ``server-reward=client-loss loss-floor=0``.
Clients bound theirs the same way, r_i = k_l / max(f_i, f_min).

**The server's learner** (docs/papers/page.md §12.5). ``server-optimizer=sgd`` (default):
Algorithm 1's plain gradient step at Table 7's rates. ``adam`` (DDPG's usual optimizer) drives
p onto one client within about 30 rounds on ``page-synthetic``: its critic's ∂Q/∂p is
uninformed (cosine about 0 with the reward's true gradient), Adam takes full-size steps
along it whatever its size, and a saturated softmax is never left; plain SGD scales the
same step by μ_i ≈ 1/N, so p stays near uniform (Eq. 1: p_i in (0, 1); Appendix A: no
client selection). ``client-optimizer=adam`` (default) keeps the clients' agents learning
their (α, η).
``critic-check`` logs per round ``critic-cosine``: the cosine, on the simplex's tangent
space, between the critic's ∂Q/∂p at the executed p and the reward's true gradient in p
(autograd through W = Σ p_i ŵ_i on D_CS, or the reported losses f_i for ``client-loss``).

**The server's data.** ``server-data=held-out`` (default) is the run's server-held split
(``server-fraction`` > 0), disjoint from every client's data. ``client-test`` is the paper's
choice, the global test set, here the union of the clients' test splits: the agent then
learns from the data the results are measured on, and the run warns that it leaks.

**Biased variants** (§3.7, Table 4): ``server-reward-scale`` k_g and
``client-reward-scale`` k_l, 10:1 (generalization) or 1:10 (personalization).
**Control**: ``agents=random`` draws p ~ Dirichlet(1_N) and every client's (α, η)
uniformly in their ranges every round, with no learning, so a run can show what the RL adds.
**Ablations** (Fig. 3): ``tune-weights=false`` aggregates with data-size weights,
``tune-epochs=false`` / ``tune-lr=false`` train with the run's ``local-epochs`` / ``lr``.

Participation is full by default (the state has one slot per client, §9.15). With
``fraction-train`` < 1, an extension not in the paper: a client that did not upload keeps
its last accuracy in the state (the accuracy of W(t) until it first uploads) and p is
renormalized over those that did.

The server's agent, its pending transition and the histories for the pictures are in the
checkpoint, so a resumed run continues identically; the clients' agents live in their own
versioned state and never leave them.

The reading of the paper, decisions and measurements: docs/methods/page.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from torch import nn

from pflarena.algorithms.ddpg import DDPGAgent, DDPGConfig, box_config, saved_bytes
from pflarena.core import drawing, keys
from pflarena.core.datasets import to_tensors
from pflarena.core.federation import build_federation
from pflarena.core.footprint import FLOAT32, FLOAT64, Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.core.models import build_model
from pflarena.core.seeds import AGENT_SEED_BITS, derive_seed
from pflarena.core.training import evaluate
from pflarena.methods.page import keys as page_keys
from pflarena.methods.page.params import PageParams
from pflarena.methods.page.utility import reciprocal_reward
from pflarena.strategies.aggregation import weight_entropy, weighted_combination
from pflarena.strategies.base import PflStrategy, StrategySetup

__all__ = [
    "Page",
    "PageParams",
    "aggregate_loss_gradient",
    "data_size_weights",
    "tangent_cosine",
]


#: settings only the server and its agent use; the clients' agents are sent the others
SERVER_SIDE = {
    "server_reward",
    "server_reward_scale",
    "server_data",
    "state_samples",
    "weight_floor",
    "server_optimizer",
    "critic_check",
    "server_hidden",
    "tune_weights",
}
#: client-agent settings the shared client agent (``client/agents.box_agent_config``)
#: reads under DAP-FL's names: field -> the key they travel under
SHARED_AGENT_KEYS = {"client_optimizer": "rl-optimizer", "client_hidden": "hidden"}


# --------------------------------------------------------------------------- the math
def data_size_weights(examples: np.ndarray) -> np.ndarray:
    """FedAvg's n_i / Σ n_j (the untuned p of the ablation, docs/papers/page.md §9.25)."""
    n = np.asarray(examples, dtype=np.float64)
    return n / n.sum()


def tangent_cosine(a: np.ndarray, b: np.ndarray) -> float | None:
    """The cosine of two gradients in the weights after projecting each onto the
    simplex's tangent space (the mean removed: only moves that keep Σ p = 1 count);
    None when either projection is zero."""
    a = np.asarray(a, dtype=np.float64) - np.mean(a)
    b = np.asarray(b, dtype=np.float64) - np.mean(b)
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if not norms > 0 or not math.isfinite(norms):
        return None
    return float(a @ b / norms)


def aggregate_loss_gradient(
    model: nn.Module,
    records: list[ArrayRecord],
    weights: np.ndarray,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 2048,
) -> np.ndarray:
    """``∂F/∂p`` at ``p = weights``, F the mean cross-entropy on ``(x, y)`` of the model
    whose floating-point arrays are ``Σ_i p_i`` of the records' (non-float arrays from the
    most-weighted record, as
    :func:`~pflarena.strategies.aggregation.weighted_combination`); ``model`` gives the
    architecture and is run in eval mode."""
    if len(records) != len(weights) or not records:
        raise ValueError(f"{len(records)} models and {len(weights)} weights")
    heaviest = records[int(np.argmax(weights))]
    stacked, fixed = {}, {}
    for name in records[0].keys():
        first = records[0][name].numpy()
        if np.issubdtype(first.dtype, np.floating):
            stacked[name] = torch.from_numpy(
                np.stack([r[name].numpy() for r in records]).astype(np.float32)
            )
        else:
            fixed[name] = torch.from_numpy(np.array(heaviest[name].numpy()))
    p = torch.tensor(np.asarray(weights, dtype=np.float32), requires_grad=True)
    model.eval()
    total = torch.zeros(len(weights), dtype=torch.float32)
    for start in range(0, len(y), batch_size):
        arrays = {k: torch.tensordot(p, v, dims=1) for k, v in stacked.items()} | fixed
        logits = torch.func.functional_call(model, arrays, (x[start : start + batch_size],))
        loss = nn.functional.cross_entropy(
            logits, y[start : start + batch_size], reduction="sum"
        ) / len(y)
        (grad,) = torch.autograd.grad(loss, p)
        total += grad
    return total.double().numpy()


@contextlib.contextmanager
def torch_threads() -> Iterator[None]:
    """Torch's thread count as ``PFLARENA_TORCH_THREADS`` says (``pflarena run`` sets it for
    every process of a simulation, 1 by default), restored after: the server's evaluation
    of N small models is many short forward passes, which a second thread on a busy CPU
    only slows down (100 logistic models on 1,500 samples: 11 s with 2 threads on a loaded
    2-core machine, 0.2 s with 1)."""
    wanted = os.environ.get("PFLARENA_TORCH_THREADS")
    before = torch.get_num_threads()
    if wanted:
        torch.set_num_threads(int(wanted))
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- the strategy
class Page(PflStrategy):
    """The server side of PAGE (Algorithm 1, reconstructed in docs/papers/page.md §3.3).

    Parameters
    ----------
    server_x, server_y
        D_CS as model-ready tensors: the server state and the ``global-loss`` reward are
        computed on it.
    model_builder
        Makes a model of the run's architecture (its weights are replaced by each evaluated
        record).
    params
        :class:`PageParams` (or the same values as keywords).
    """

    declaration = MethodDeclaration(
        name="page",
        kind="paper",
        reference="PAGE: Equilibrate Personalization and Generalization in Federated "
        "Learning, WWW 2024 submission 1206 / arXiv 2310.08961 (docs/methods/page.md)",
        summary="a co-opetition game: client DDPG agents choose local epochs and learning "
        "rate, a server DDPG agent chooses the aggregation weights",
        solver="pflarena.methods.page.solver",
        params=PageParams,
        honours=frozenset({"local-epochs", "batch-size", "lr"}),
        needs_server_data=True,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The personal model and the client's agent (state 1, action (α, ln η)), with a
        transition for each round it trained in, at most every round."""
        names = {key: name for name, key in SHARED_AGENT_KEYS.items()}
        config = box_config(lambda key: getattr(params, names.get(key, key.replace("-", "_"))), 1)
        agent = saved_bytes(config, federation.num_rounds)
        return [
            Footprint("its personal model", federation.state_bytes()),
            Footprint(f"its agent (hidden {params.client_hidden})", agent),
        ]

    checkpointed = {"last_accuracy": "page/last-accuracy"}

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The server agent, whose state and action have an entry per client: its actor
        (N → h → h → N) and critic (2N → h → h → 1), each with a target copy and Adam's two
        moments; the replay buffer's rows written so far (a row a round, up to its
        capacity: state, action and next state of N each); the history of each round's N
        weights, epochs, learning rates and state."""
        n, h = federation.num_clients, params.server_hidden
        weights = (n * h + h * h + h * n + 2 * h + n) + (2 * n * h + h * h + h + 2 * h + 1)
        rows = min(federation.num_rounds, params.rl_buffer)
        return [
            *super().server_footprint(params, federation),
            Footprint(f"the server agent's networks (width {n}, hidden {h}; with target "
                      "copies and Adam's moments)", 4 * weights * FLOAT32),
            Footprint(f"its replay buffer ({rows} rows of 3 x {n} float32)",
                      rows * 3 * n * FLOAT32),
            Footprint(f"the per-round history ({federation.num_rounds} x 4 x {n} float64)",
                      federation.num_rounds * 4 * n * FLOAT64),
        ]  # fmt: skip

    @classmethod
    def checkpoint_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The server agent as it saves itself (networks, targets, Adam's moments, the
        replay buffer's rows), the clients' last accuracies, and the per-round history."""
        n, rounds = federation.num_clients, federation.num_rounds
        agent = saved_bytes(cls.server_agent_config(params, n), rounds)
        return [
            *super().checkpoint_footprint(params, federation),
            Footprint(f"the server agent (width {n}, its buffer's {rounds} rows at most)", agent),
            Footprint(f"the last accuracies and the per-round history ({rounds} x (4 x {n} + 6)"
                      " float64)", n * FLOAT64 + rounds * (4 * n + 6) * FLOAT64),
        ]  # fmt: skip

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> Page:
        params = setup.params
        assert isinstance(params, PageParams)
        cfg = setup.cfg
        if params.server_data == "client-test":
            federation = build_federation(cfg.federation_spec())
            info = federation.info
            x = np.concatenate([c.x_test for c in federation.clients])
            y = np.concatenate([c.y_test for c in federation.clients])
            log(
                WARNING,
                "page.server-data=client-test: the server's agent learns from the clients' "
                "test splits (%d samples), the data the results are measured on; the "
                "accuracies of this run are not held-out results (the paper's choice)",
                len(y),
            )
        else:
            if setup.server_data is None:
                raise ValueError(
                    "page needs server-held data: set server-fraction > 0 (or "
                    "page.server-data=client-test, the paper's leaking choice)"
                )
            info, x, y = setup.server_data.info, setup.server_data.x, setup.server_data.y
        server_x, server_y = to_tensors(x, y, info)

        def model_builder() -> nn.Module:
            return build_model(cfg.model_name(), info.input_shape, info.num_classes, seed=0)

        return cls(
            params,
            server_x=server_x,
            server_y=server_y,
            model_builder=model_builder,
            **setup.common(cls.declaration),
        )

    def __init__(
        self,
        params: MethodParams | None = None,
        *,
        server_x: torch.Tensor,
        server_y: torch.Tensor,
        model_builder: Callable[[], nn.Module],
        **kwargs: Any,
    ) -> None:
        super().__init__(params, **kwargs)
        if self.num_clients is None:
            raise ValueError("page needs num_clients: the server state has one slot per client")
        if len(server_y) == 0:
            raise ValueError("page needs a non-empty server dataset D_CS")
        self.server_x, self.server_y = server_x, server_y
        state_samples = self.params.state_samples
        if 0 < state_samples < len(server_y):  # seeded subsample (docs/papers/page.md §10)
            rng = np.random.default_rng(
                derive_seed(self.seed, "page-state-samples", bits=AGENT_SEED_BITS)
            )
            pick = torch.from_numpy(np.sort(rng.choice(len(server_y), state_samples, False)))
            self.state_x, self.state_y = server_x[pick], server_y[pick]
        else:
            self.state_x, self.state_y = server_x, server_y
        self._model = model_builder()
        self.agent = DDPGAgent(
            self.agent_config(), seed=derive_seed(self.seed, "page-server", bits=AGENT_SEED_BITS)
        )
        n = self.num_clients
        #: s_CS entries of clients that did not upload: their last accuracy (NaN: unknown)
        self.last_accuracy = np.full(n, np.nan)
        #: per round, for the pictures and the summary: p(t), α_i(t), η_i(t), s_CS(t), ...
        self.history: dict[str, list[np.ndarray]] = {
            name: [] for name in ("round", "weights", "epochs", "lrs", "state", "server")
        }

    def agent_config(self) -> DDPGConfig:
        """The server agent: state and action of size N, simplex actions (§2.4, §4.2)."""
        return self.server_agent_config(self.params, int(self.num_clients or 0))

    @staticmethod
    def server_agent_config(p: Any, n: int) -> DDPGConfig:
        """:meth:`agent_config` from the method's ``params`` and the federation's size."""
        return DDPGConfig(
            state_dim=n,
            action_dim=n,
            action_space="simplex",
            actor_hidden=(p.server_hidden, p.server_hidden),
            critic_hidden=(p.server_hidden, p.server_hidden),
            critic_lr=p.critic_lr,
            actor_lr=p.actor_lr,
            tau=p.tau,
            gamma=p.gamma,
            batch_size=p.rl_batch_size,
            buffer_capacity=p.rl_buffer,
            optimizer=p.server_optimizer,
            noise_sigma=p.noise_sigma,
            noise_decay=p.noise_decay,
            noise_min=p.noise_min,
        )

    # ------------------------------------------------------------------ messages
    def train_config(self, server_round: int, node_id: int) -> dict:
        """The common settings plus what the clients' agents need (§3.4)."""
        p = self.params
        # the clients' agent settings by their run-config keys; the two the shared client
        # agent reads under other names (DAP-FL's) under those
        agent = {key: getattr(p, name) for name, key in SHARED_AGENT_KEYS.items()}
        return {
            **super().train_config(server_round, node_id),
            **self.params_config(exclude=SERVER_SIDE | set(SHARED_AGENT_KEYS)),
            **self.method_config(**agent),
        }

    def check_train_reply(self, content: RecordDict) -> str | None:
        """The model, and the metrics the server's agent reads: f_i, α_i, η_i, n_i."""
        metrics = content.metric_records[keys.METRICS]
        for name, valid, wanted in (
            (page_keys.LOSS, lambda v: v >= 0, "a loss >= 0"),
            (page_keys.EPOCHS, lambda v: v >= 1, "a number of epochs >= 1"),
            (page_keys.LR, lambda v: v > 0, "a learning rate > 0"),
            (keys.NUM_EXAMPLES, lambda v: v >= 1, "a count >= 1"),
        ):
            value = metrics.get(name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not valid(value):
                return f"metric {name!r} must be {wanted}, got {value!r}"
        if keys.CLIENT_ID not in metrics:
            return f"metric {keys.CLIENT_ID!r} is missing: the server state is per client"
        return super().check_train_reply(content)

    # ------------------------------------------------------------------ the round
    def evaluate_record(self, record: ArrayRecord, x: torch.Tensor, y: torch.Tensor):
        """A model's loss sum, correct count and count on ``(x, y)``."""
        self._model.load_state_dict(record.to_torch_state_dict())
        return evaluate(self._model, x, y)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Algorithm 1 on this round's uploads: state, agent step, p(t), W(t+1), reward."""
        valid = self.valid_train_replies(replies)
        if not valid:
            return None, None
        with torch_threads():
            return self._algorithm_1(server_round, valid)

    def _algorithm_1(
        self, server_round: int, valid: list[Message]
    ) -> tuple[ArrayRecord, MetricRecord]:
        p = self.params
        n = int(self.num_clients or 0)
        clients = [int(m.content[keys.METRICS][keys.CLIENT_ID]) for m in valid]
        models = [m.content[keys.ARRAYS] for m in valid]
        metrics = [m.content[keys.METRICS] for m in valid]
        losses = np.array([float(m[page_keys.LOSS]) for m in metrics])

        # 1. s_CS(t): each upload's accuracy on D_CS (absent clients: their last one)
        started = time.perf_counter()
        state = self.last_accuracy.copy()
        for client, record in zip(clients, models, strict=True):
            state[client] = self.evaluate_record(record, self.state_x, self.state_y).accuracy
        self.last_accuracy = state.copy()
        if np.isnan(state).any():  # clients that never uploaded: the accuracy of W(t)
            assert self._round_arrays is not None
            state[np.isnan(state)] = self.evaluate_record(
                self._round_arrays, self.state_x, self.state_y
            ).accuracy
        state_time = time.perf_counter() - started

        # 2-3. the pending transition gets its next state; the agent acts
        started = time.perf_counter()
        rng = np.random.default_rng(
            derive_seed(self.seed, "page-server", server_round, bits=AGENT_SEED_BITS)
        )
        stats = None
        if p.agents == "random":
            weights = rng.dirichlet(np.ones(n))
        elif not p.tune_weights:
            weights = np.zeros(n)
            examples = np.array([float(m[keys.NUM_EXAMPLES]) for m in metrics])
            weights[clients] = data_size_weights(examples)
        else:
            self.agent.complete(state)
            if self.agent.steps < p.warmup_rounds:
                weights = self.agent.random_action(rng)
            else:
                stats = self.agent.update(rng)
                weights = self.agent.act(state, rng)
        agent_time = time.perf_counter() - started

        # 4. the weights executed: over the uploads, with the floor ε; Eq. 5
        executed = np.zeros(n)
        chosen = weights[clients]
        total = chosen.sum()
        chosen = chosen / total if total > 0 else np.full(len(clients), 1.0 / len(clients))
        chosen = (1.0 - p.weight_floor) * chosen + p.weight_floor / len(clients)
        executed[clients] = chosen
        new_arrays = weighted_combination(models, chosen)

        # 5. the reward, bounded (docs/papers/page.md §9.11); W on D_CS is also the paper's
        # global accuracy when D_CS is the global test set
        started = time.perf_counter()
        global_eval = self.evaluate_record(new_arrays, self.server_x, self.server_y)
        reward_time = time.perf_counter() - started
        client_loss = float(chosen @ losses)
        objective = global_eval.loss if p.server_reward == "global-loss" else client_loss
        reward, clamped = reciprocal_reward(objective, p.loss_floor, p.server_reward_scale)
        if p.agents == "ddpg" and p.tune_weights:
            self.agent.set_pending(state, executed, reward)

        epochs = np.full(n, np.nan)
        lrs = np.full(n, np.nan)
        epochs[clients] = [float(m[page_keys.EPOCHS]) for m in metrics]
        lrs[clients] = [float(m[page_keys.LR]) for m in metrics]
        client_agent = [float(m.get(page_keys.AGENT_TIME, 0.0)) for m in metrics]
        client_sgd = [float(m.get(page_keys.SGD_TIME, 0.0)) for m in metrics]
        client_agent_cpu = [float(m.get(page_keys.AGENT_CPU, 0.0)) for m in metrics]
        client_sgd_cpu = [float(m.get(page_keys.SGD_CPU, 0.0)) for m in metrics]
        entropy = weight_entropy(executed)
        server = {
            "reward": reward,
            "reward-objective": objective,
            "reward-clamped": int(clamped),
            "weight-entropy": entropy,
            "weight-entropy-ratio": entropy / math.log(n) if n > 1 else 1.0,
            "max-weight": float(executed.max()),
            "server-accuracy": global_eval.accuracy,
            "server-loss": global_eval.loss,
            "state-mean": float(state.mean()),
            "mean-epochs": float(np.nanmean(epochs)),
            "mean-lr": float(np.exp(np.nanmean(np.log(lrs)))),
            "client-clamped": int(sum(int(m.get(page_keys.CLAMPED, 0)) for m in metrics)),
            "client-reward": float(np.mean([float(m.get(page_keys.REWARD, 0.0)) for m in metrics])),
            "server-state-time-s": state_time,
            "server-agent-time-s": agent_time,
            "server-reward-time-s": reward_time,
            "client-agent-time-s": float(np.sum(client_agent)),
            "client-sgd-time-s": float(np.sum(client_sgd)),
            "client-agent-cpu-time-s": float(np.sum(client_agent_cpu)),
            "client-sgd-cpu-time-s": float(np.sum(client_sgd_cpu)),
            "client-agents-in-memory": int(
                sum(int(m.get(page_keys.AGENT_MEMORY, 0)) for m in metrics)
            ),
        }
        if stats is not None:
            server["critic-loss"] = stats.critic_loss
            server["actor-objective"] = stats.actor_objective
            if p.critic_check:
                started = time.perf_counter()
                if p.server_reward == "global-loss":
                    loss_gradient = self.loss_gradient(models, chosen)
                else:
                    loss_gradient = losses.copy()  # ∂(Σ p_i f_i)/∂p_i = f_i
                critic = self.agent.action_gradient(state, executed)[clients]
                # the reward k/max(F, f_min) falls as F rises; flat where the floor holds
                cosine = None if clamped else tangent_cosine(critic, -loss_gradient)
                if cosine is not None:
                    server["critic-cosine"] = cosine
                server["critic-check-time-s"] = time.perf_counter() - started
        self.history["round"].append(np.array([server_round], dtype=np.float64))
        self.history["weights"].append(executed)
        self.history["epochs"].append(epochs)
        self.history["lrs"].append(lrs)
        self.history["state"].append(state)
        self.history["server"].append(
            np.array([reward, entropy, server["server-accuracy"], objective, int(clamped)])
        )
        log(
            INFO,
            "page: round %d reward %.4g, weight entropy %.3f of %.3f, max weight %.3f",
            server_round,
            reward,
            entropy,
            math.log(n) if n > 1 else 0.0,
            executed.max(),
        )
        out = self.train_metrics(valid)
        assert out is not None
        out.update(server)
        return new_arrays, out

    def loss_gradient(self, records: list[ArrayRecord], weights: np.ndarray) -> np.ndarray:
        """``∂F/∂p``: the gradient in the weights of the mean cross-entropy on D_CS of the
        aggregate ``Σ_i p_i ŵ_i`` (Eq. 5), by autograd through the aggregation."""
        return aggregate_loss_gradient(self._model, records, weights, self.server_x, self.server_y)

    # ------------------------------------------------------------------ checkpoints
    # the DDPG agent is rebuilt from its arrays, the history's lists are stacked: by hand
    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = super().checkpoint_state()  # the last accuracies: ``checkpointed``
        arrays |= {f"page/agent/{k}": v for k, v in self.agent.to_arrays().items()}
        for name, rows in self.history.items():
            arrays[f"page/history/{name}"] = (
                np.stack(rows) if rows else np.zeros((0, 1), dtype=np.float64)
            )
        return arrays, meta

    def restore_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        super().restore_state(arrays, meta)
        prefix = "page/agent/"
        saved = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
        self.agent = DDPGAgent.from_arrays(saved, self.agent_config())
        self.history = {
            name: list(np.array(arrays[f"page/history/{name}"], dtype=np.float64))
            for name in self.history
        }

    # ------------------------------------------------------------------ results
    def run_summary(self) -> dict[str, Any]:
        p = self.params
        out: dict[str, Any] = {
            "agents": p.agents,
            "server_reward": p.server_reward,
            "loss_floor": p.loss_floor,
            "reward_scales": {"server": p.server_reward_scale, "client": p.client_reward_scale},
            "server_data": p.server_data,
            "server_data_leaks": p.server_data == "client-test",
            "server_samples": len(self.server_y),
            "state_samples": len(self.state_y),
        }
        if not self.history["round"]:
            return out
        server = np.stack(self.history["server"])
        n = int(self.num_clients or 0)
        ratio = server[:, 1] / math.log(n) if n > 1 else np.ones(len(server))
        out |= {
            "rounds": len(server),
            "weight_entropy_ratio": {
                "min": float(ratio.min()),
                "mean": float(ratio.mean()),
                "last": float(ratio[-1]),
            },
            "max_weight_last": float(np.max(self.history["weights"][-1])),
            "server_reward_clamped_rounds": int(server[:, 4].sum()),
            "server_accuracy_last": float(server[-1, 2]),
            "mean_epochs_last": float(np.nanmean(self.history["epochs"][-1])),
            "mean_lr_last": float(np.exp(np.nanmean(np.log(self.history["lrs"][-1])))),
            "agent_updates": self.agent.updates,
        }
        return out

    def write_artifacts(self, output_dir: Path) -> list[Path]:
        """``page-weights.csv/.png`` (p(t) per client and round, with its entropy) and
        ``page-client-actions.csv/.png`` (α_i(t) and η_i(t) per client and round)."""
        if not self.history["round"]:
            return []
        output_dir.mkdir(parents=True, exist_ok=True)
        rounds = [int(r[0]) for r in self.history["round"]]
        weights = np.stack(self.history["weights"])
        epochs = np.stack(self.history["epochs"])
        lrs = np.stack(self.history["lrs"])
        state = np.stack(self.history["state"])
        weights_csv = output_dir / "page-weights.csv"
        lines = ["round,client,weight,state"]
        for i, r in enumerate(rounds):
            lines += [
                f"{r},{c},{weights[i, c]:.6g},{state[i, c]:.6g}" for c in range(weights.shape[1])
            ]
        weights_csv.write_text("\n".join(lines) + "\n")
        actions_csv = output_dir / "page-client-actions.csv"
        lines = ["round,client,epochs,lr"]
        for i, r in enumerate(rounds):
            lines += [
                f"{r},{c},{epochs[i, c]:.0f},{lrs[i, c]:.6g}"
                for c in range(epochs.shape[1])
                if not np.isnan(epochs[i, c])
            ]
        actions_csv.write_text("\n".join(lines) + "\n")
        return [
            weights_csv,
            self._plot_weights(output_dir / "page-weights.png", rounds, weights),
            actions_csv,
            self._plot_actions(output_dir / "page-client-actions.png", rounds, epochs, lrs),
        ]

    def _plot_weights(self, path: Path, rounds: list[int], weights: np.ndarray) -> Path:
        """p_i(t) by client and round, above its entropy / log N and its largest weight."""
        n = weights.shape[1]
        ratio = [weight_entropy(w) / math.log(n) if n > 1 else 1.0 for w in weights]
        return drawing.round_heatmap_with_lines(
            path,
            rounds,
            weights.T,
            title=f"PAGE server aggregation weights p_i(t) ({self.params.agents}, "
            f"reward {self.params.server_reward}); uniform = {1 / n:.3g}",
            colorbar_label="p_i(t)",
            lines=[
                ("entropy / log N", ratio, "tab:blue"),
                ("max p_i", weights.max(axis=1), "tab:red"),
            ],
        )

    def _plot_actions(
        self, path: Path, rounds: list[int], epochs: np.ndarray, lrs: np.ndarray
    ) -> Path:
        """α_i(t) and η_i(t) (log scale) by client and round, blank where a client did not
        upload."""
        p = self.params
        return drawing.round_heatmaps(
            path,
            rounds,
            [
                drawing.RoundPanel(
                    epochs.T,
                    "local epochs α_i(t)",
                    "local epochs α_i(t)",
                    cmap="magma",
                    vmin=p.min_epochs,
                    vmax=p.max_epochs,
                ),
                drawing.RoundPanel(
                    lrs.T,
                    "learning rate η_i(t)",
                    "learning rate η_i(t) (log scale)",
                    cmap="cividis",
                    vmin=p.min_lr,
                    vmax=p.max_lr,
                    log=True,
                ),
            ],
            title=f"PAGE clients' actions ({p.agents}; blank: no upload)",
        )
