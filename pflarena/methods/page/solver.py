"""Local solver for PAGE (docs/papers/page.md §3.4): each client's own DDPG agent picks α and η.

Algorithm 2 as the reading, docs/papers/page.md §3.4, reconstructs it, once per train message:

1. ``w_i(t) ← W(t)``; the state ``s_i(t) = acc(W(t); D_i^train)`` (§2.5, §9.4 of the reading: the
   training split, never the test split);
2. the agent's pending transition of the client's previous round gets ``s_i(t)`` as its
   next state;
3. the first ``warmup-rounds`` actions are uniform in the box (the paper: round 1); later,
   one minibatch update, then ``a = clip(μ(s) + N(0, σ²))``;
4. the box is ``[α_min, α_max] × [ln η_min, ln η_max]``: ``α_i = round(a_0)``,
   ``η_i = exp(a_1)`` (log-scale, §9.8 of the reading; the agent stores ``a`` before rounding);
5. ``ŵ_i(t)``: α_i epochs of plain SGD at η_i from W(t) (Eq. 4; no proximal term, P0);
6. ``f_i = f_i(ŵ_i(t))``, the mean cross-entropy on the training split in eval mode (§9.3);
   the reward ``r_i = k_l / max(f_i, f_min)`` (Definition 1's u_i = 1/f_i, bounded, §9.11);
7. ``(s_i(t), a, r_i)`` waits for the next state;
8. ŵ_i(t) is the client's personalized model (§9.17) until its next round; it and the
   agent are kept in the client's versioned state, never sent anywhere but ŵ_i(t) itself.
   The agent object also stays in the process's memory for the client's next message
   (:func:`~pflarena.client.agents.open_agent`): rebuilding it from the stored
   arrays is taken only when this process did not write the version the message starts
   from (a resume, another simulation process, a rejected reply).

The reply's ``page-agent-time-s`` is everything the agent costs the client: the state
s_i(t), the agent's loading, update and action, the reward's evaluation, packing the agent
and writing it to the client's state (``page-agent-cpu-s``: the same in the thread's CPU
time, which other work on the machine does not inflate; ``page-sgd-time-s`` and
``page-sgd-cpu-s`` for the local SGD).

``agents=random`` (the control) draws ``a`` uniformly every round and keeps no agent.
``tune-epochs=false`` / ``tune-lr=false`` train with the run's ``local-epochs`` / ``lr``.
Randomness (initial weights, noise, minibatches, random actions) is seeded by (run seed,
client, round), so two runs of a config, or a resumed run, are identical.

The reading of the paper, decisions and measurements: docs/methods/page.md.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import ArrayRecord
from torch import nn

from pflarena.algorithms.ddpg import DDPGAgent, DDPGConfig
from pflarena.client import agents
from pflarena.client.common import (
    evaluate_stored_or_global,
    stored_or_global,
    train_metrics,
)
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.seeds import AGENT_SEED_BITS, derive_seed
from pflarena.core.training import evaluate as evaluate_model
from pflarena.core.training import train_epochs
from pflarena.methods.page import keys as page_keys
from pflarena.methods.page.utility import reciprocal_reward

__all__ = [
    "AGENT_KEY",
    "MODEL_KEY",
    "agent_config",
    "evaluate",
    "load_agent",
    "personalized_model",
    "train",
]

AGENT_KEY = "page/agent"
MODEL_KEY = "page/personal-model"


def agent_config(job: ClientJob) -> DDPGConfig:
    """The client agent the message describes: state of size 1, a box action (α, ln η)."""
    return agents.box_agent_config(job, state_dim=1)


def load_agent(job: ClientJob, config: DDPGConfig) -> DDPGAgent:
    """This client's agent from its state; a new one (seeded by run seed and client) if none."""
    return agents.load_agent(job, AGENT_KEY, config, "page-client")


def _accuracy(model: nn.Module, job: ClientJob) -> float:
    return evaluate_model(model, job.data.x_train, job.data.y_train).accuracy


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = job.global_model()
    started, started_cpu = time.perf_counter(), time.thread_time()
    state = np.array([_accuracy(model, job)])  # s_i(t)
    rng = np.random.default_rng(
        derive_seed(
            job.cfg.seed, job.client_id, job.server_round, "page-client", bits=AGENT_SEED_BITS
        )
    )
    config = agent_config(job)
    learning = str(job.param("agents")) == "ddpg"
    source = "none"
    if learning:
        agent, source = agents.open_agent(job, AGENT_KEY, config, "page-client")
    else:
        agent = DDPGAgent(config, seed=None)
    if learning:
        agent.complete(state)
        action, stats = agents.next_action(agent, state, rng, int(job.param("warmup-rounds")))
    else:
        action, stats = agent.random_action(rng), None
    agent_time = time.perf_counter() - started
    agent_cpu = time.thread_time() - started_cpu

    kwargs = agents.local_hyperparameters(job, action)
    started, started_cpu = time.perf_counter(), time.thread_time()
    running_loss, steps = train_epochs(
        model, job.data.x_train, job.data.y_train, generator=job.generator("train"), **kwargs
    )
    sgd_time = time.perf_counter() - started
    sgd_cpu = time.thread_time() - started_cpu

    started, started_cpu = time.perf_counter(), time.thread_time()
    trained = evaluate_model(model, job.data.x_train, job.data.y_train)
    loss = trained.loss  # f_i(ŵ_i(t))
    reward, clamped = reciprocal_reward(
        loss, float(job.param("loss-floor")), float(job.param("client-reward-scale"))
    )
    metrics = train_metrics(job, running_loss, steps)
    if learning:
        agent.set_pending(state, action, reward)
        # the write's seconds join page-agent-time-s once the state is saved
        agents.save_agent(
            job, AGENT_KEY, agent, metrics, (page_keys.AGENT_TIME, page_keys.AGENT_CPU)
        )
    agent_time += time.perf_counter() - started
    agent_cpu += time.thread_time() - started_cpu
    job.save_state_model(MODEL_KEY, model)

    metrics |= {
        page_keys.LOSS: loss,
        page_keys.STATE: float(state[0]),
        page_keys.EPOCHS: int(kwargs["epochs"]),
        page_keys.LR: float(kwargs["lr"]),
        page_keys.REWARD: reward,
        page_keys.CLAMPED: int(clamped),
        page_keys.AGENT_TIME: agent_time,
        page_keys.SGD_TIME: sgd_time,
        page_keys.AGENT_CPU: agent_cpu,
        page_keys.SGD_CPU: sgd_cpu,
        page_keys.AGENT_MEMORY: int(source == "memory"),
    }
    if stats is not None:
        metrics[page_keys.CRITIC_LOSS] = stats.critic_loss
    return {keys.ARRAYS: state_record(model.state_dict())}, metrics


def personalized_model(job: ClientJob) -> nn.Module:
    """ŵ_i of the client's latest round (the global model before its first)."""
    return stored_or_global(job, MODEL_KEY)


def evaluate(job: ClientJob) -> dict:
    """Local accuracy: ŵ_i(t) on the client's test split; global: W(t+1) on it."""
    return evaluate_stored_or_global(job, MODEL_KEY)
