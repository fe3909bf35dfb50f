"""Helpers shared by the local solvers: reply metrics, the proximal hook, the clients'
DDPG agents that choose local epochs and learning rate (PAGE, Dap-FL), and the split-model
parts (FedPer, FedRep, LG-FedAvg, FedBABU)."""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord
from torch import nn

from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.ddpg import DDPGAgent, DDPGConfig, UpdateStats
from pflarena.core.model_split import ModelSplit, split_state
from pflarena.core.seeds import AGENT_SEED_BITS, derive_seed
from pflarena.core.training import EvalResult, train_epochs

__all__ = [
    "assemble",
    "box_agent_config",
    "eval_metrics",
    "load_agent",
    "local_hyperparameters",
    "model_split",
    "next_action",
    "open_agent",
    "part_record",
    "prox_hook",
    "save_agent",
    "train_jointly",
    "train_metrics",
    "train_part",
]


def train_metrics(job: ClientJob, loss: float, steps: int) -> dict:
    return {
        keys.CLIENT_ID: job.client_id,
        keys.NUM_EXAMPLES: int(len(job.data.y_train)),
        keys.TRAIN_LOSS: float(loss),
        keys.TRAIN_STEPS: int(steps),
    }


def eval_metrics(job: ClientJob, personalized: EvalResult, global_: EvalResult | None) -> dict:
    """Evaluation counts; the global entries only where the method has a global model."""
    metrics = {
        keys.CLIENT_ID: job.client_id,
        keys.NUM_EXAMPLES: personalized.count,
        keys.PERSONALIZED_CORRECT: personalized.correct,
        keys.PERSONALIZED_COUNT: personalized.count,
        keys.PERSONALIZED_LOSS_SUM: personalized.loss_sum,
    }
    if global_ is not None:
        metrics |= {
            keys.GLOBAL_CORRECT: global_.correct,
            keys.GLOBAL_COUNT: global_.count,
            keys.GLOBAL_LOSS_SUM: global_.loss_sum,
        }
    return metrics


def fine_tuned(job: ClientJob, model: nn.Module, default_epochs: int) -> nn.Module:
    """``model`` fine-tuned whole, in place, on the local training split for the method's
    ``finetune-epochs`` (``default_epochs`` when the message has none; 0: unchanged), with the same
    batches for every call of a round (the generator is seeded by the round); returned."""
    epochs = int(job.config.get(f"{job.method}.finetune-epochs", default_epochs))
    if epochs > 0:
        train_epochs(
            model,
            job.data.x_train,
            job.data.y_train,
            generator=job.generator("finetune"),
            **(job.train_kwargs() | {"epochs": epochs}),
        )
    return model


def prox_hook(anchor: nn.Module, weight: float):
    """A gradient hook adding ``weight * (w - anchor)``: the gradient of (weight/2)||w - anchor||^2."""
    anchor_params = [p.detach().clone() for p in anchor.parameters()]

    def hook(model: nn.Module) -> None:
        for param, ref in zip(model.parameters(), anchor_params, strict=True):
            if param.grad is not None:
                param.grad.add_(param.detach() - ref, alpha=weight)

    return hook


# --------------------------------------------------------------------------- client agents
def box_agent_config(job: ClientJob, state_dim: int) -> DDPGConfig:
    """A client agent that chooses (α, ln η) in ``[min-epochs, max-epochs] × [ln min-lr,
    ln max-lr]`` from a state of ``state_dim`` values, with the DDPG settings the message
    carries under the method's names (``hidden``: two layers of that width)."""
    hidden = int(job.param("hidden"))
    return DDPGConfig(
        state_dim=state_dim,
        action_dim=2,
        action_space="box",
        low=(float(job.param("min-epochs")), math.log(float(job.param("min-lr")))),
        high=(float(job.param("max-epochs")), math.log(float(job.param("max-lr")))),
        actor_hidden=(hidden, hidden),
        critic_hidden=(hidden, hidden),
        critic_lr=float(job.param("critic-lr")),
        actor_lr=float(job.param("actor-lr")),
        tau=float(job.param("tau")),
        gamma=float(job.param("gamma")),
        batch_size=int(job.param("rl-batch-size")),
        buffer_capacity=int(job.param("rl-buffer")),
        optimizer=str(job.param("rl-optimizer")),
        noise_sigma=float(job.param("noise-sigma")),
        noise_decay=float(job.param("noise-decay")),
        noise_min=float(job.param("noise-min")),
    )


#: Client agents kept in memory between messages, per process (a simulation's ClientApp
#: process, the in-process engine): (the client's store, entry) -> (the stamp of the stored
#: version the agent is, the agent, the stored record, kept alive for its stamp). At most
#: this many (least recently used dropped; about 0.4 MB each at PAGE's default sizes);
#: the environment's ``PFLARENA_AGENT_CACHE_SIZE`` sets it (0: every agent is rebuilt from
#: the stored state, as a deployment's fresh ClientApp process does).
AGENT_CACHE_SIZE = int(os.environ.get("PFLARENA_AGENT_CACHE_SIZE", "256"))
_AGENTS: OrderedDict[tuple[str, str], tuple[tuple, DDPGAgent, object]] = OrderedDict()
_AGENTS_LOCK = threading.Lock()


def open_agent(job: ClientJob, key: str, config: DDPGConfig, purpose: str) -> tuple[DDPGAgent, str]:
    """This client's agent under ``key`` and where it came from: ``"memory"`` (the object
    this process saved as the version the message starts from), ``"state"`` (rebuilt from
    the stored arrays: a first message in this process, a resume, another process's
    version, a deployment's new ClientApp process) or ``"new"`` (none stored: seeded by
    (run seed, client, ``purpose``)).

    The cached object is taken out of the cache: it comes back (as the new version) only
    when this message's state is saved, so a message that fails, or whose reply the server
    rejects, leaves the stored version to be read again. A stamp that differs from the
    stored file's (a version rewritten after a resume) is a miss.
    """
    slot = (job.state.store.location, key)
    with _AGENTS_LOCK:
        cached = _AGENTS.pop(slot, None)
    stamp = job.state.stamp(key)
    if (
        cached is not None
        and stamp is not None
        and cached[0] == stamp
        and cached[1].config == config
    ):
        return cached[1], "memory"
    record = job.state.get(key)
    if record is None:
        return DDPGAgent(
            config, seed=derive_seed(job.cfg.seed, job.client_id, purpose, bits=AGENT_SEED_BITS)
        ), "new"
    return DDPGAgent.from_arrays({k: record[k].numpy() for k in record.keys()}, config), "state"


def load_agent(job: ClientJob, key: str, config: DDPGConfig, purpose: str) -> DDPGAgent:
    """This client's agent from its state under ``key`` (or from memory: :func:`open_agent`);
    a new one, seeded by (run seed, client, ``purpose``), if there is none."""
    return open_agent(job, key, config, purpose)[0]


def save_agent(
    job: ClientJob,
    key: str,
    agent: DDPGAgent,
    metrics: dict | None = None,
    time_keys: tuple[str, str] | None = None,
) -> None:
    """Keep the agent (networks, optimizers, buffer, pending step) in the client's state,
    packed into a few arrays (:func:`~pflarena.core.ddpg.pack_arrays`), and, once the
    state is saved, in this process's memory for the client's next message.

    With ``metrics`` and ``time_keys`` (wall, CPU), the seconds spent writing the agent to
    the store are added to those metrics (the reply's metrics are sent after the save).
    """
    record = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in agent.to_packed().items()})
    job.state[key] = record
    state = job.state

    def remember() -> None:
        version = state.saved_version
        stamp = None if version is None else state.store.stamp(version, key)
        if stamp is not None:
            with _AGENTS_LOCK:
                _AGENTS[(state.store.location, key)] = (stamp, agent, record)
                while len(_AGENTS) > AGENT_CACHE_SIZE:
                    _AGENTS.popitem(last=False)
        if metrics is not None and time_keys is not None:
            spent = (state.store.write_seconds, state.store.write_cpu_seconds)
            for name, seconds in zip(time_keys, spent, strict=True):
                metrics[name] = float(metrics.get(name, 0.0)) + float(seconds.get(key, 0.0))

    state.on_save(remember)


def next_action(
    agent: DDPGAgent, state: np.ndarray, rng: np.random.Generator, warmup_rounds: int
) -> tuple[np.ndarray, UpdateStats | None]:
    """The agent's action of this round: uniform in the box during its first
    ``warmup_rounds`` actions, afterwards one minibatch update and then μ(s) + noise."""
    if agent.steps < warmup_rounds:
        return agent.random_action(rng), None
    stats = agent.update(rng)
    return agent.act(state, rng), stats


def local_hyperparameters(job: ClientJob, action: np.ndarray) -> dict:
    """The run's training settings with the action's α = round(a₀) epochs and η = exp(a₁)
    (each only where ``tune-epochs`` / ``tune-lr`` is on), as plain SGD: no momentum and no
    weight decay."""
    kwargs = job.train_kwargs()
    if bool(job.param("tune-epochs")):
        kwargs["epochs"] = int(round(action[0]))
    if bool(job.param("tune-lr")):
        kwargs["lr"] = float(math.exp(action[1]))
    kwargs["momentum"], kwargs["weight_decay"] = 0.0, 0.0
    return kwargs


# --------------------------------------------------------------------------- split models
# A model assembled from a received part and a part the client keeps, and training
# restricted to one part. The split is pflarena.core.model_split.split_state of the run's model
# with the number of head layers the strategy sends (``<method>.head-layers``, or
# LG-FedAvg's ``global-layers``), so server and client take the same one by name. The
# received record holds exactly the shared entries; the private ones come from the
# client's state under the method's key, or from the run's initial model before the client
# first trained.
def model_split(job: ClientJob, head_layers: int) -> ModelSplit:
    """The body/head split of the run's model with ``head_layers`` head layers."""
    return split_state(job.new_model(), head_layers)


def assemble(job: ClientJob, shared: Sequence[str], private_key: str | None) -> nn.Module:
    """The run's model with the message's arrays (exactly the ``shared`` entries) and the
    rest from the client's state under ``private_key`` (None, or nothing stored yet: the run's
    initial values)."""
    received = job.arrays
    names = [] if received is None else list(received.keys())
    if names != list(shared):
        raise RuntimeError(
            f"{job.method}: the message must carry exactly the shared part of the model "
            f"({len(shared)} entries, first {list(shared)[:2]}), got {len(names)} entries "
            f"(first {names[:2]})"
        )
    model = job.new_model()
    state = model.state_dict()
    private = job.state.get(private_key) if private_key else None
    for record in (private, received):
        if record is None:
            continue
        for name, value in record.to_torch_state_dict().items():
            state[name] = value.to(job.device)
    model.load_state_dict(state)
    return model


def part_record(model: nn.Module, names: Sequence[str]) -> ArrayRecord:
    """The model's ``names`` entries as an ArrayRecord, in that order."""
    state = model.state_dict()
    return state_record({name: state[name].detach() for name in names})


def train_jointly(
    job: ClientJob, shared: Sequence[str], private: Sequence[str], private_key: str
) -> tuple[dict[str, ArrayRecord], dict]:
    """A round of a model split in a shared and a private part trained together (FedPer:
    shared body, private head; LG-FedAvg: the reverse): the received shared part with the
    client's private part (:func:`assemble`) trained by local SGD; the private part is kept
    under ``private_key``, the shared part is the reply."""
    model = assemble(job, shared, private_key)
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        **job.train_kwargs(),
    )
    job.state[private_key] = part_record(model, private)
    return {keys.ARRAYS: part_record(model, shared)}, train_metrics(job, loss, steps)


def train_part(
    model: nn.Module, trained: Collection[str], job: ClientJob, purpose: str, **overrides
) -> tuple[float, int]:
    """Local SGD on the parameters named in ``trained`` only, the others frozen (no
    gradient, so SGD, momentum and weight decay leave them exactly as they were); the
    run's training settings with ``overrides``."""
    chosen = set(trained)
    frozen = [p for name, p in model.named_parameters() if name not in chosen]
    for param in frozen:
        param.requires_grad_(False)
    try:
        return train_epochs(
            model,
            job.data.x_train,
            job.data.y_train,
            generator=job.generator(purpose),
            **(job.train_kwargs() | overrides),
        )
    finally:
        for param in frozen:
            param.requires_grad_(True)
