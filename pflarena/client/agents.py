"""A client's DDPG agent kept in its state: the agents of PAGE's and Dap-FL's clients, which
choose their local epochs and learning rate (the agent itself: :mod:`pflarena.algorithms.ddpg`).
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict

import numpy as np
from flwr.app import Array, ArrayRecord

from pflarena.algorithms.ddpg import DDPGAgent, DDPGConfig, UpdateStats, box_config
from pflarena.client.job import ClientJob
from pflarena.core.seeds import AGENT_SEED_BITS, derive_seed

__all__ = [
    "box_agent_config",
    "load_agent",
    "local_hyperparameters",
    "next_action",
    "open_agent",
    "save_agent",
]


def box_agent_config(job: ClientJob, state_dim: int) -> DDPGConfig:
    """The client agent the message describes (:func:`~pflarena.algorithms.ddpg.box_config`
    with the method's values the message carries)."""
    return box_config(job.param, state_dim)


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
    packed into a few arrays (:func:`~pflarena.algorithms.ddpg.pack_arrays`), and, once the
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
