"""DDPG (Lillicrap et al., 2016) for agents that a federated round drives one step at a time.

PAGE (docs/papers/page.md §3.2) puts one DDPG agent on the server (state: the accuracies of the
uploaded models; action: aggregation weights on the simplex) and one on every client
(state: the accuracy of the received global model; action: local epochs and learning rate
in a box). Both are :class:`DDPGAgent` with a different :class:`DDPGConfig`.

**Why hand-written.** The well-kept RL libraries (Stable-Baselines3, TorchRL, Tianshou) own
the training loop: they call ``env.step`` and collect rollouts themselves. Here the
federated round is the loop: each round an agent observes one state, takes one action,
gets its reward once the round is over, sees the next state only in the next round, takes
one minibatch update (Algorithms 1 and 2 of the paper), and in between it must be stored
as plain arrays (a client's versioned state, the server's checkpoint). So this module is a
small set of explicit steps, checked by tests against problems with known answers
(``tests/test_ddpg.py``): contextual bandits whose best action is a known function of the
state, a constant-reward chain whose value is ``r / (1 − γ)``, the bounds and the simplex.

One round of an agent, as the paper's algorithms use it::

    agent.complete(state)                     # the previous (s, a, r) gets its s'
    if agent.steps < warmup:                  # round 1: random (the paper)
        action = agent.random_action(rng)
    else:
        agent.update(rng)                     # one minibatch step (Alg. 1/2 lines 4-9)
        action = agent.act(state, rng)        # μ(s) + exploration noise
    ...                                       # the round runs with ``action``
    agent.set_pending(state, action, reward)  # completed next round

The update (Alg. 1 lines 4-9, its typos read as docs/papers/page.md §3.2 does):

* ``y = r + γ Q'(s', μ'(s'))`` (no terminal states: the game is a continuing task);
* critic: one step on ``(1/b) Σ (y − Q(s, a))²``;
* actor: one step up ``(1/b) Σ Q(s, μ(s))`` (the deterministic policy gradient);
* targets: ``θ' ← τ θ + (1 − τ) θ'`` with the post-update θ (docs/papers/page.md §9.23).

Action spaces:

``box``
    The actor ends in a sigmoid, ``u ∈ [0, 1]^d``; the action is ``low + u (high − low)``.
    Exploration adds ``N(0, σ²)`` to ``u`` and clips to ``[0, 1]``, so every action lies in
    the bounds. The buffer stores ``u``.
``simplex``
    The actor ends in a softmax: non-negative weights that sum to 1. Exploration adds
    ``N(0, σ²)`` to the logits (docs/papers/page.md §9.9); the buffer stores the executed weights.

Randomness comes only from the generators the caller passes (``rng`` for noise and
minibatches) and the seed given at construction (initial weights), so a caller that derives
them from (run seed, client, round) gets identical runs and resumes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

__all__ = [
    "DDPGAgent",
    "DDPGConfig",
    "ReplayBuffer",
    "UpdateStats",
    "box_config",
    "pack_arrays",
    "saved_bytes",
    "soft_update",
    "unpack_arrays",
]

ActionSpace = Literal["box", "simplex"]


PACKED_INDEX = "packed/index"
#: About the bytes one array's line takes in a packed index (its name, dtype and shape).
INDEX_LINE = 40


def pack_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` as one flat array per dtype plus an index (JSON bytes of each array's
    name, dtype, shape, in order): a saved agent's 67 small arrays become 4 or 5, which is
    what a store's per-array costs (Flower's ``Array`` serialization, npz members) are paid
    on. :func:`unpack_arrays` gives back the same arrays, bit for bit."""
    index, groups = [], {}
    for name, value in arrays.items():
        value = np.asarray(value)
        index.append([name, value.dtype.str, list(value.shape)])
        groups.setdefault(value.dtype.str, []).append(value.reshape(-1))
    out = {f"packed/{dtype}": np.concatenate(parts) for dtype, parts in groups.items()}
    out[PACKED_INDEX] = np.frombuffer(json.dumps(index).encode(), dtype=np.uint8)
    return out


def saved_bytes(config: DDPGConfig, transitions: int) -> int:
    """The bytes of an agent's saved arrays (:meth:`DDPGAgent.to_packed`) once it has
    taken steps and holds ``transitions`` transitions (at most its buffer's capacity): its
    networks and their targets as built, Adam's two moments and step count per parameter,
    and the buffer's rows (state, action, reward, next state, float32)."""
    agent = DDPGAgent(config, seed=0)
    built = sum(int(a.nbytes) for a in agent.to_packed().values())
    params = [p for net in (agent.actor, agent.critic) for p in net.parameters()]
    optimizer = 0
    if config.optimizer == "adam":
        # exp_avg and exp_avg_sq as float32, a float32 step, and each one's index line
        optimizer = sum(2 * 4 * p.numel() + 4 for p in params) + 3 * len(params) * INDEX_LINE
    rows = min(max(transitions, 0), config.buffer_capacity)
    row = 2 * config.state_dim + config.action_dim + 1
    return built + optimizer + 4 * rows * row


def box_config(param: Callable[[str], Any], state_dim: int) -> DDPGConfig:
    """A client agent that chooses (α, ln η) in ``[min-epochs, max-epochs] × [ln min-lr,
    ln max-lr]`` from a state of ``state_dim`` values, with the DDPG settings ``param``
    gives under their message names (``hidden``: two layers of that width; PAGE's and
    Dap-FL's clients)."""
    hidden = int(param("hidden"))
    return DDPGConfig(
        state_dim=state_dim,
        action_dim=2,
        action_space="box",
        low=(float(param("min-epochs")), math.log(float(param("min-lr")))),
        high=(float(param("max-epochs")), math.log(float(param("max-lr")))),
        actor_hidden=(hidden, hidden),
        critic_hidden=(hidden, hidden),
        critic_lr=float(param("critic-lr")),
        actor_lr=float(param("actor-lr")),
        tau=float(param("tau")),
        gamma=float(param("gamma")),
        batch_size=int(param("rl-batch-size")),
        buffer_capacity=int(param("rl-buffer")),
        optimizer=str(param("rl-optimizer")),
        noise_sigma=float(param("noise-sigma")),
        noise_decay=float(param("noise-decay")),
        noise_min=float(param("noise-min")),
    )


def unpack_arrays(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays :func:`pack_arrays` packed (a dict without an index is returned as is)."""
    if PACKED_INDEX not in packed:
        return packed
    index = json.loads(bytes(np.asarray(packed[PACKED_INDEX], dtype=np.uint8)).decode())
    offsets: dict[str, int] = {}
    out = {}
    for name, dtype, shape in index:
        flat = packed.get(f"packed/{dtype}")
        size = math.prod(shape)
        start = offsets.get(dtype, 0)
        if flat is None or start + size > flat.size:
            raise ValueError(f"packed arrays: {name} ({dtype}, {shape}) is missing")
        out[name] = np.asarray(flat[start : start + size], dtype=np.dtype(dtype)).reshape(shape)
        offsets[dtype] = start + size
    return out


@dataclass(frozen=True)
class DDPGConfig:
    """An agent's shape and learning settings.

    Defaults are PAGE's Synthetic row of Table 7 (critic lr 0.01, actor lr 0.001,
    τ = β = 0.01), γ = 0.99 (docs/papers/page.md §4.1) and its readings where the paper is
    silent (§4.2: gradient-norm clipping at 10, Gaussian noise σ₀ = 0.1 decaying ×0.995
    per action to a floor of 0.01, minibatches of 32, a buffer of 10 000), with Adam, the
    optimizer of DDPG itself: at Table 7's Synthetic rates and γ = 0.99, plain SGD (the
    literal reading of Algorithm 1's gradient steps) leaves a contextual bandit unlearned
    after 1,000 steps, a PAGE-length run, where Adam reaches its best action
    (``tests/test_ddpg.py``, docs/papers/page.md §11).

    Parameters
    ----------
    state_dim, action_dim
        Sizes of a state and an action.
    action_space
        ``"box"`` (bounded by ``low``/``high``) or ``"simplex"`` (weights summing to 1).
    low, high
        Box bounds per action dimension (default ``[0, 1]`` each); ignored for a simplex.
    actor_hidden, critic_hidden
        Widths of the ReLU hidden layers.
    critic_lr, actor_lr
        Learning rates ``l^Cri`` and ``l^Act``.
    tau
        Soft target-update rate (the paper's β).
    gamma
        Discount factor γ (0 makes the agent a contextual-bandit learner).
    batch_size
        Minibatch size ``|B|``; an update samples ``min(|B|, |R|)`` transitions.
    buffer_capacity
        Replay-buffer capacity (FIFO).
    optimizer
        ``"adam"`` (DDPG's) or ``"sgd"`` (Algorithm 1 line 9 as written).
    grad_clip
        Gradient-norm clip of both networks; 0 turns it off.
    noise_sigma, noise_decay, noise_min
        Exploration noise ``σ_k = max(σ₀ · decay^k, σ_min)`` at the agent's k-th action.
    final_layer_init
        The output layers start uniform in ``±final_layer_init`` (Lillicrap et al.), so a
        new actor outputs the middle of the box or the uniform simplex point.
    min_transitions
        Updates wait until the buffer holds this many transitions.
    """

    state_dim: int
    action_dim: int
    action_space: ActionSpace = "box"
    low: tuple[float, ...] | None = None
    high: tuple[float, ...] | None = None
    actor_hidden: tuple[int, ...] = (64, 64)
    critic_hidden: tuple[int, ...] = (64, 64)
    critic_lr: float = 0.01
    actor_lr: float = 0.001
    tau: float = 0.01
    gamma: float = 0.99
    batch_size: int = 32
    buffer_capacity: int = 10_000
    optimizer: Literal["sgd", "adam"] = "adam"
    grad_clip: float = 10.0
    noise_sigma: float = 0.1
    noise_decay: float = 0.995
    noise_min: float = 0.01
    final_layer_init: float = 3e-3
    min_transitions: int = 1

    def __post_init__(self) -> None:
        problems = []
        if self.state_dim < 1 or self.action_dim < 1:
            problems.append(
                f"state_dim and action_dim must be >= 1, got {self.state_dim}, {self.action_dim}"
            )
        if self.action_space not in ("box", "simplex"):
            problems.append(f"action_space must be 'box' or 'simplex', got {self.action_space!r}")
        if self.action_space == "simplex" and self.action_dim < 2:
            problems.append("a simplex action needs action_dim >= 2")
        low, high = self.bounds()
        if len(low) != self.action_dim or len(high) != self.action_dim:
            problems.append(f"low and high need {self.action_dim} values each")
        elif not np.all(np.isfinite(low)) or not np.all(np.isfinite(high)) or np.any(low > high):
            problems.append(f"box bounds must be finite with low <= high, got {low}, {high}")
        for name in ("critic_lr", "actor_lr"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.tau <= 1:
            problems.append(f"tau must be in (0, 1], got {self.tau}")
        if not 0 <= self.gamma < 1:
            problems.append(f"gamma must be in [0, 1), got {self.gamma}")
        if self.batch_size < 1 or self.buffer_capacity < 1 or self.min_transitions < 1:
            problems.append("batch_size, buffer_capacity and min_transitions must be >= 1")
        if self.optimizer not in ("sgd", "adam"):
            problems.append(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        if self.grad_clip < 0 or self.noise_sigma < 0 or self.noise_min < 0:
            problems.append("grad_clip, noise_sigma and noise_min must be >= 0")
        if not 0 < self.noise_decay <= 1:
            problems.append(f"noise_decay must be in (0, 1], got {self.noise_decay}")
        if problems:
            raise ValueError("invalid DDPG config: " + "; ".join(problems))

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(low, high)`` as float64 arrays (``[0, 1]`` per dimension unless given)."""
        low = np.zeros(self.action_dim) if self.low is None else np.asarray(self.low, float)
        high = np.ones(self.action_dim) if self.high is None else np.asarray(self.high, float)
        return low, high


@dataclass(frozen=True)
class UpdateStats:
    """What one :meth:`DDPGAgent.update` did: the critic's TD loss before its step, the
    actor's objective ``mean Q(s, μ(s))`` before its step, and the minibatch size."""

    critic_loss: float
    actor_objective: float
    batch: int


def _linear(
    width_in: int, width_out: int, bound: float, generator: torch.Generator | None
) -> nn.Linear:
    """A linear layer uniform in ``±bound``; uninitialized without a generator (its
    weights are about to be loaded)."""
    if generator is None:
        return nn.utils.skip_init(nn.Linear, width_in, width_out)
    layer = nn.utils.skip_init(nn.Linear, width_in, width_out)
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        layer.bias.uniform_(-bound, bound, generator=generator)
    return layer


def _mlp(
    width_in: int,
    hidden: tuple[int, ...],
    width_out: int,
    final: float,
    g: torch.Generator | None,
) -> nn.Sequential:
    """ReLU MLP; hidden layers start in ``±1/sqrt(fan-in)``, the output in ``±final``."""
    layers: list[nn.Module] = []
    width = width_in
    for h in hidden:
        layers += [_linear(width, h, 1.0 / math.sqrt(width), g), nn.ReLU()]
        width = h
    layers.append(_linear(width, width_out, final, g))
    return nn.Sequential(*layers)


class Actor(nn.Module):
    """``μ(s)``: a sigmoid box point in ``[0, 1]^d`` or a softmax point of the simplex."""

    def __init__(self, config: DDPGConfig, generator: torch.Generator | None) -> None:
        super().__init__()
        self.space = config.action_space
        self.body = _mlp(
            config.state_dim,
            config.actor_hidden,
            config.action_dim,
            config.final_layer_init,
            generator,
        )

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """The pre-activation output (the simplex's logits)."""
        return self.body(state)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        z = self.body(state)
        return torch.sigmoid(z) if self.space == "box" else torch.softmax(z, dim=-1)


class Critic(nn.Module):
    """``Q(s, a)`` on the concatenation ``[s ‖ a]`` (``a`` normalized: ``u`` or weights)."""

    def __init__(self, config: DDPGConfig, generator: torch.Generator | None) -> None:
        super().__init__()
        self.body = _mlp(
            config.state_dim + config.action_dim,
            config.critic_hidden,
            1,
            config.final_layer_init,
            generator,
        )

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.body(torch.cat([state, action], dim=-1)).squeeze(-1)


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``θ' ← τ θ + (1 − τ) θ'`` for every parameter (the paper's β is τ)."""
    targets, sources = list(target.parameters()), list(source.parameters())
    if len(targets) != len(sources):
        raise ValueError(f"soft update: {len(targets)} target and {len(sources)} parameters")
    with torch.no_grad():
        torch._foreach_mul_(targets, 1.0 - tau)
        torch._foreach_add_(targets, sources, alpha=tau)


@dataclass
class ReplayBuffer:
    """A FIFO buffer of transitions ``(s, a, r, s')`` in preallocated float32 arrays."""

    capacity: int
    state_dim: int
    action_dim: int
    states: np.ndarray = field(init=False)
    actions: np.ndarray = field(init=False)
    rewards: np.ndarray = field(init=False)
    next_states: np.ndarray = field(init=False)
    size: int = 0
    position: int = 0

    def __post_init__(self) -> None:
        self.states = np.zeros((self.capacity, self.state_dim), np.float32)
        self.actions = np.zeros((self.capacity, self.action_dim), np.float32)
        self.rewards = np.zeros(self.capacity, np.float32)
        self.next_states = np.zeros((self.capacity, self.state_dim), np.float32)

    def __len__(self) -> int:
        return self.size

    def add(self, state, action, reward: float, next_state) -> None:
        i = self.position
        self.states[i] = state
        self.actions[i] = action
        self.rewards[i] = reward
        self.next_states[i] = next_state
        self.position = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``min(count, len)`` distinct indices, drawn uniformly."""
        return rng.choice(self.size, size=min(count, self.size), replace=False)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """The logistic function in a form that cannot overflow."""
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _vector(value, size: int, what: str) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64).reshape(-1)
    if array.size != size:
        raise ValueError(f"{what} must have {size} entries, got {array.size}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{what} must be finite, got {array}")
    return array


def _layers(net: nn.Module) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(weight, bias)`` of each linear layer of an Actor's or Critic's MLP, as numpy views
    of the parameters' memory (writing them writes the network)."""
    return [
        (m.weight.detach().numpy(), m.bias.detach().numpy())
        for m in net.body
        if isinstance(m, nn.Linear)
    ]


def _forward(layers, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The MLP's output on ``x`` (ReLU between the layers) and each layer's input."""
    inputs = []
    for i, (w, b) in enumerate(layers):
        inputs.append(x)
        x = x @ w.T + b
        if i < len(layers) - 1:
            np.maximum(x, 0, out=x)
    return x, inputs


def _backward(layers, inputs, grad: np.ndarray, need_input: bool = False):
    """Gradients of the MLP's weights and biases (in parameter order) for the output
    gradient ``grad``, and the input's gradient when ``need_input``."""
    grads: list[np.ndarray] = [None] * (2 * len(layers))  # type: ignore[list-item]
    for i in range(len(layers) - 1, -1, -1):
        w, _ = layers[i]
        x = inputs[i]
        grads[2 * i] = grad.T @ x
        grads[2 * i + 1] = grad.sum(axis=0)
        if i > 0 or need_input:
            grad = grad @ w
            if i > 0:
                grad = grad * (x > 0)  # the ReLU whose output was this layer's input
    return grads, (grad if need_input else None)


class DDPGAgent:
    """An actor, a critic, their target copies, two optimizers and a replay buffer.

    Parameters
    ----------
    config
        The agent's shape and settings.
    seed
        Seeds the initial weights (targets start as copies, "TargetNet is a copy of
        MainNet").

    Attributes
    ----------
    steps
        Actions taken (random or by the actor); the exploration noise decays with it.
    updates
        Minibatch updates taken.
    pending
        ``(state, action, reward)`` of the latest step, waiting for its next state.
    engine
        ``"numpy"`` (default): the update and the actions computed with numpy on the
        networks' memory, the gradients written out by hand; ``"torch"``: the same steps
        with autograd and torch's optimizers. The same arithmetic in float32 (equal to
        float tolerance, ``tests/test_ddpg.py``); for networks this small torch's per-call
        overhead is most of an update's time (``benchmarks/results/page_cost.md``). The
        environment's ``PFLARENA_DDPG_ENGINE`` sets the default of every agent of a
        process (the benchmark's before/after comparison).
    """

    engine: str = os.environ.get("PFLARENA_DDPG_ENGINE", "numpy")

    def __init__(self, config: DDPGConfig, seed: int | None = 0) -> None:
        if self.engine not in ("numpy", "torch"):
            raise ValueError(f"DDPG engine must be 'numpy' or 'torch', got {self.engine!r}")
        self.config = config
        # seed None: weights left uninitialized, for from_arrays to load
        generator = None if seed is None else torch.Generator().manual_seed(int(seed) % 2**63)
        self.actor = Actor(config, generator)
        self.critic = Critic(config, generator)
        self.target_actor = Actor(config, None)
        self.target_critic = Critic(config, None)
        self.target_actor.load_state_dict(self.actor.state_dict())
        self.target_critic.load_state_dict(self.critic.state_dict())
        for net in (self.target_actor, self.target_critic):
            net.requires_grad_(False)
        self.actor_optimizer = self._optimizer(self.actor, config.actor_lr)
        self.critic_optimizer = self._optimizer(self.critic, config.critic_lr)
        self._parameters = {
            "actor": list(self.actor.parameters()),
            "critic": list(self.critic.parameters()),
        }
        # numpy views of the four networks' weights (the numpy update writes them in place)
        self._np = {name: _layers(net) for name, net in self._networks().items()}
        self._config_bytes: np.ndarray | None = None  # the config's JSON, made once
        self.buffer = ReplayBuffer(config.buffer_capacity, config.state_dim, config.action_dim)
        self.steps = 0
        self.updates = 0
        self.pending: tuple[np.ndarray, np.ndarray, float] | None = None

    def _optimizer(self, net: nn.Module, lr: float) -> torch.optim.Optimizer:
        # foreach: one call per step for all of a network's tensors (the same arithmetic)
        if self.config.optimizer == "adam":
            return torch.optim.Adam(net.parameters(), lr=lr, foreach=True)
        return torch.optim.SGD(net.parameters(), lr=lr, foreach=True)

    # ------------------------------------------------------------------ acting
    @property
    def noise_scale(self) -> float:
        """The exploration σ of the next action."""
        c = self.config
        return max(c.noise_sigma * c.noise_decay**self.steps, c.noise_min)

    def _to_action(self, normalized: np.ndarray) -> np.ndarray:
        if self.config.action_space == "simplex":
            return normalized
        low, high = self.config.bounds()
        return np.clip(low + normalized * (high - low), low, high)

    def _normalized(self, action) -> np.ndarray:
        action = _vector(action, self.config.action_dim, "action")
        if self.config.action_space == "simplex":
            if np.any(action < 0) or not math.isclose(action.sum(), 1.0, abs_tol=1e-6):
                raise ValueError(f"a simplex action must be >= 0 and sum to 1, got {action}")
            return action
        low, high = self.config.bounds()
        if np.any(action < low - 1e-9) or np.any(action > high + 1e-9):
            raise ValueError(f"action {action} is outside the bounds [{low}, {high}]")
        span = np.where(high > low, high - low, 1.0)
        return np.clip((action - low) / span, 0.0, 1.0)

    def policy(self, state) -> np.ndarray:
        """``μ(s)`` without noise, in action units (the box or the simplex)."""
        state = _vector(state, self.config.state_dim, "state")
        return self._from_logits(self._logits(state))

    def _logits(self, state: np.ndarray) -> np.ndarray:
        """The actor's pre-activation output for one state, in float64 (computed in
        float32, as the network is)."""
        if self.engine == "numpy":
            z, _ = _forward(self._np["actor"], state.astype(np.float32)[None])
            return z[0].astype(np.float64)
        with torch.no_grad():
            z = self.actor.logits(torch.as_tensor(state, dtype=torch.float32)[None])[0]
        return z.double().numpy()

    def _from_logits(self, z: np.ndarray) -> np.ndarray:
        if self.config.action_space == "simplex":
            e = np.exp(z - z.max())  # in float64, so the weights sum to 1 to 1e-15
            return e / e.sum()
        return self._to_action(_sigmoid(z))

    def action_gradient(self, state, action) -> np.ndarray:
        """``∂Q(s, a)/∂a`` of the critic at one state and action (action units; a simplex
        action is its weights): the direction the critic tells the actor to move."""
        s = torch.as_tensor(_vector(state, self.config.state_dim, "state"), dtype=torch.float32)
        a = torch.as_tensor(self._normalized(action), dtype=torch.float32).requires_grad_(True)
        q = self.critic(s[None], a[None]).sum()
        (grad,) = torch.autograd.grad(q, a)
        return grad.double().numpy()

    def act(self, state, rng: np.random.Generator, *, explore: bool = True) -> np.ndarray:
        """The action for ``state``: ``μ(s)`` plus Gaussian exploration noise (on the box
        coordinates ``u``, clipped to ``[0, 1]``; on the simplex's logits)."""
        state = _vector(state, self.config.state_dim, "state")
        z = self._logits(state)
        sigma = self.noise_scale if explore else 0.0
        self.steps += 1 if explore else 0
        if self.config.action_space == "simplex":
            return self._from_logits(z + sigma * rng.standard_normal(z.shape))
        u = _sigmoid(z)
        return self._to_action(np.clip(u + sigma * rng.standard_normal(u.shape), 0.0, 1.0))

    def random_action(self, rng: np.random.Generator) -> np.ndarray:
        """A uniform random action: uniform in the box, Dirichlet(1, ..., 1) on the simplex
        (the paper's first round, "DDPG models cannot update without prior experience")."""
        self.steps += 1
        d = self.config.action_dim
        if self.config.action_space == "simplex":
            return rng.dirichlet(np.ones(d))
        return self._to_action(rng.uniform(0.0, 1.0, d))

    # ------------------------------------------------------------------ learning
    def remember(self, state, action, reward: float, next_state) -> None:
        """Add the transition ``(s, a, r, s')``; ``a`` in action units."""
        if not math.isfinite(float(reward)):
            raise ValueError(f"reward must be finite, got {reward}")
        self.buffer.add(
            _vector(state, self.config.state_dim, "state"),
            self._normalized(action),
            float(reward),
            _vector(next_state, self.config.state_dim, "next state"),
        )

    def set_pending(self, state, action, reward: float) -> None:
        """Hold ``(s, a, r)`` until the next state is observed (:meth:`complete`)."""
        if not math.isfinite(float(reward)):
            raise ValueError(f"reward must be finite, got {reward}")
        self.pending = (
            _vector(state, self.config.state_dim, "state"),
            _vector(action, self.config.action_dim, "action"),
            float(reward),
        )

    def complete(self, next_state, reward: float | None = None) -> bool:
        """Store the pending step with its next state; whether there was one.

        ``reward`` replaces the pending reward, for a reward that is known only with the
        next state (Dap-FL's improvement from one state to the next); None keeps the
        reward given to :meth:`set_pending` (PAGE's).
        """
        if self.pending is None:
            return False
        state, action, pending_reward = self.pending
        reward = pending_reward if reward is None else float(reward)
        self.remember(state, action, reward, next_state)
        self.pending = None
        return True

    def update(self, rng: np.random.Generator) -> UpdateStats | None:
        """One minibatch step of critic, actor and targets; None while the buffer is short."""
        c = self.config
        if len(self.buffer) < c.min_transitions:
            return None
        idx = self.buffer.sample(c.batch_size, rng)
        if self.engine == "numpy":
            stats = self._update_numpy(idx)
            self.updates += 1
            return stats
        s = torch.from_numpy(self.buffer.states[idx])
        a = torch.from_numpy(self.buffer.actions[idx])
        r = torch.from_numpy(self.buffer.rewards[idx])
        s2 = torch.from_numpy(self.buffer.next_states[idx])

        with torch.no_grad():
            target = r + c.gamma * self.target_critic(s2, self.target_actor(s2))
        critic_params, actor_params = self._parameters["critic"], self._parameters["actor"]
        critic_loss = torch.mean((target - self.critic(s, a)) ** 2)
        self._step(critic_params, torch.autograd.grad(critic_loss, critic_params))
        self.critic_optimizer.step()

        # the actor's step moves the actor only: the gradient of Q(s, μ(s)) in μ's weights
        objective = self.critic(s, self.actor(s)).mean()
        self._step(actor_params, torch.autograd.grad(-objective, actor_params))
        self.actor_optimizer.step()

        soft_update(self.target_critic, self.critic, c.tau)
        soft_update(self.target_actor, self.actor, c.tau)
        self.updates += 1
        return UpdateStats(float(critic_loss.detach()), float(objective.detach()), len(idx))

    def _activate(self, z: np.ndarray) -> np.ndarray:
        """The actor's output layer: sigmoid (box) or softmax (simplex) of the logits."""
        if self.config.action_space == "box":
            return np.float32(0.5) * (np.float32(1.0) + np.tanh(np.float32(0.5) * z))
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def _update_numpy(self, idx: np.ndarray) -> UpdateStats:
        """:meth:`update`'s steps after the sampling, in numpy: the same float32
        arithmetic as the torch path (forward, the hand-written backward, norm clipping,
        Adam or SGD as torch computes them, the soft updates)."""
        c, b = self.config, self.buffer
        s, a, r, s2 = b.states[idx], b.actions[idx], b.rewards[idx], b.next_states[idx]
        n = len(idx)
        actor, critic = self._np["actor"], self._np["critic"]

        z2, _ = _forward(self._np["target-actor"], s2)
        q2, _ = _forward(self._np["target-critic"], np.concatenate([s2, self._activate(z2)], 1))
        target = r + np.float32(c.gamma) * q2[:, 0]

        q, inputs = _forward(critic, np.concatenate([s, a], 1))
        error = target - q[:, 0]
        critic_loss = float(np.mean(error**2, dtype=np.float32))
        grads, _ = _backward(critic, inputs, (np.float32(-2.0 / n) * error)[:, None])
        self._apply(critic, grads, self.critic_optimizer, self._parameters["critic"])

        # the actor's step moves the actor only: dQ/da through the (updated) critic
        z, actor_inputs = _forward(actor, s)
        mu = self._activate(z)
        q, inputs = _forward(critic, np.concatenate([s, mu], 1))
        objective = float(np.mean(q[:, 0], dtype=np.float32))
        _, grad_in = _backward(
            critic, inputs, np.full((n, 1), -1.0 / n, np.float32), need_input=True
        )
        g = grad_in[:, c.state_dim :]
        if c.action_space == "box":
            g = g * mu * (1.0 - mu)
        else:
            g = mu * (g - (g * mu).sum(axis=-1, keepdims=True))
        grads, _ = _backward(actor, actor_inputs, g)
        self._apply(actor, grads, self.actor_optimizer, self._parameters["actor"])

        keep, take = np.float32(1.0 - c.tau), np.float32(c.tau)
        for target_name, name in (("target-critic", "critic"), ("target-actor", "actor")):
            for t_layer, layer in zip(self._np[target_name], self._np[name], strict=True):
                for t, v in zip(t_layer, layer, strict=True):
                    t *= keep
                    t += take * v
        return UpdateStats(critic_loss, objective, n)

    def _apply(self, layers, grads, optimizer: torch.optim.Optimizer, params) -> None:
        """Clip ``grads`` to the norm ``grad_clip`` (as torch's clip_grad_norm_) and take
        the optimizer's step on the parameters ``layers`` views, in place."""
        c = self.config
        if c.grad_clip > 0:
            total = np.float32(
                np.linalg.norm(np.array([np.linalg.norm(g) for g in grads], np.float32))
            )
            coef = min(np.float32(c.grad_clip) / (total + np.float32(1e-6)), np.float32(1.0))
            grads = [g * np.float32(coef) for g in grads]
        values = [v for layer in layers for v in layer]
        group = optimizer.param_groups[0]
        lr = group["lr"]
        if c.optimizer == "sgd":
            for v, g in zip(values, grads, strict=True):
                v -= np.float32(lr) * g
            return
        beta1, beta2 = group["betas"]
        eps = group["eps"]
        for param, v, g in zip(params, values, grads, strict=True):
            state = optimizer.state[param]
            if not state:  # as torch's Adam starts a parameter's state
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            step = state["step"].numpy()
            step += 1
            m, v2 = state["exp_avg"].numpy(), state["exp_avg_sq"].numpy()
            m += np.float32(1.0 - beta1) * (g - m)
            v2 *= np.float32(beta2)
            v2 += np.float32(1.0 - beta2) * g * g
            t = float(step)
            step_size = lr / (1.0 - beta1**t)
            denom = np.sqrt(v2) / np.float32((1.0 - beta2**t) ** 0.5) + np.float32(eps)
            v -= np.float32(step_size) * (m / denom)

    def _step(self, params: list[nn.Parameter], grads: tuple[torch.Tensor, ...]) -> None:
        """Set ``params``' gradients to ``grads``, clipped to the norm ``grad_clip``."""
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad
        if self.config.grad_clip > 0:
            nn.utils.clip_grad_norm_(params, self.config.grad_clip, foreach=True)

    # ------------------------------------------------------------------ storage
    def to_arrays(self) -> dict[str, np.ndarray]:
        """Everything the agent is, as named numpy arrays (for an ArrayRecord or an npz):
        the four networks, the optimizers' state, the buffer, the counters, the pending
        step and the config (as JSON bytes, checked on loading)."""
        return self._arrays(copy=True)

    def _arrays(self, copy: bool) -> dict[str, np.ndarray]:
        """:meth:`to_arrays`; without ``copy`` the arrays may be views of the agent's own
        memory (for :meth:`to_packed`, whose concatenation copies them)."""
        if self._config_bytes is None:
            self._config_bytes = np.frombuffer(
                json.dumps(asdict(self.config)).encode(), dtype=np.uint8
            )
        out: dict[str, np.ndarray] = {
            "config": self._config_bytes.copy() if copy else self._config_bytes,
            "counters": np.array([self.steps, self.updates], dtype=np.int64),
        }
        # the networks' state_dict entries (parameters only: no buffers), in its order
        for name, net in self._networks().items():
            for key, value in net.named_parameters():
                array = value.detach().numpy()
                out[f"{name}/{key}"] = array.copy() if copy else array
        # the optimizers' state_dict()["state"]: parameter index -> its state, in the
        # order the state was created
        for name, optimizer in self._optimizers().items():
            index = {id(p): i for i, p in enumerate(optimizer.param_groups[0]["params"])}
            for param, state in optimizer.state.items():
                for key, value in state.items():
                    array = np.asarray(
                        value.detach().cpu().numpy() if torch.is_tensor(value) else value
                    )
                    out[f"{name}/{index[id(param)]}/{key}"] = array.copy() if copy else array
        b = self.buffer
        out["buffer/states"] = b.states[: b.size]
        out["buffer/actions"] = b.actions[: b.size]
        out["buffer/rewards"] = b.rewards[: b.size]
        out["buffer/next-states"] = b.next_states[: b.size]
        out["buffer/position"] = np.array([b.position], dtype=np.int64)
        if self.pending is not None:
            state, action, reward = self.pending
            out["pending/state"] = state
            out["pending/action"] = action
            out["pending/reward"] = np.array([reward])
        if copy:
            for key in ("buffer/states", "buffer/actions", "buffer/rewards", "buffer/next-states"):
                out[key] = out[key].copy()
            if self.pending is not None:
                out["pending/state"] = out["pending/state"].copy()
                out["pending/action"] = out["pending/action"].copy()
        return out

    def to_packed(self) -> dict[str, np.ndarray]:
        """:meth:`to_arrays` packed into one array per dtype (:func:`pack_arrays`);
        :meth:`from_arrays` reads either form."""
        return pack_arrays(self._arrays(copy=False))

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], config: DDPGConfig | None = None):
        """Rebuild an agent saved by :meth:`to_arrays`.

        ``config``, when given, must equal the saved one: a run whose settings changed
        cannot continue an agent built for others. Raises ValueError naming the problem.
        ``arrays`` may be packed (:func:`pack_arrays`).
        """
        arrays = unpack_arrays(arrays)
        if "config" not in arrays:
            raise ValueError("not a saved DDPG agent: no 'config' entry")
        saved = json.loads(bytes(np.asarray(arrays["config"], dtype=np.uint8)).decode())
        for key in ("low", "high", "actor_hidden", "critic_hidden"):
            if saved.get(key) is not None:
                saved[key] = tuple(saved[key])
        saved_config = DDPGConfig(**saved)
        if config is not None and config != saved_config:
            changed = sorted(k for k, v in asdict(config).items() if saved[k] != v)
            raise ValueError(f"the saved DDPG agent was built with other settings: {changed}")
        agent = cls(saved_config, seed=None)
        for name, net in agent._networks().items():
            own = net.state_dict()
            loaded = {}
            for key, value in own.items():
                array = arrays.get(f"{name}/{key}")
                if array is None or tuple(array.shape) != tuple(value.shape):
                    raise ValueError(f"saved DDPG agent: {name}/{key} is missing or misshapen")
                loaded[key] = torch.as_tensor(np.array(array), dtype=value.dtype)
            net.load_state_dict(loaded)
        for name, optimizer in agent._optimizers().items():
            state_dict = optimizer.state_dict()
            prefix = f"{name}/"
            for full, value in arrays.items():
                parts = full[len(prefix) :].split("/") if full.startswith(prefix) else []
                if len(parts) == 2 and parts[0].isdigit():
                    tensor = torch.as_tensor(np.array(value))
                    state_dict["state"].setdefault(int(parts[0]), {})[parts[1]] = tensor
            optimizer.load_state_dict(state_dict)
        b = agent.buffer
        size = len(arrays["buffer/rewards"])
        if size > b.capacity:
            raise ValueError(f"saved DDPG agent: {size} transitions exceed the capacity")
        b.states[:size] = arrays["buffer/states"]
        b.actions[:size] = arrays["buffer/actions"]
        b.rewards[:size] = arrays["buffer/rewards"]
        b.next_states[:size] = arrays["buffer/next-states"]
        b.size, b.position = size, int(arrays["buffer/position"][0])
        agent.steps, agent.updates = (int(v) for v in arrays["counters"])
        if "pending/state" in arrays:
            agent.pending = (
                np.asarray(arrays["pending/state"], dtype=np.float64),
                np.asarray(arrays["pending/action"], dtype=np.float64),
                float(arrays["pending/reward"][0]),
            )
        return agent

    def _networks(self) -> dict[str, nn.Module]:
        return {
            "actor": self.actor,
            "critic": self.critic,
            "target-actor": self.target_actor,
            "target-critic": self.target_critic,
        }

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor-optimizer": self.actor_optimizer, "critic-optimizer": self.critic_optimizer}
