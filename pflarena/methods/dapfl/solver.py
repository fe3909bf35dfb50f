"""Local solver for Dap-FL (Chen et al., IEEE TPDS 2023): each client's own DDPG agent picks
its local learning rate and number of epochs.

Once per train message (the design of the authors' released code, XDUJiaweiChen/Dap-FL,
``ddpg_enhanced_second_train.py``; see docs/methods/dapfl.md):

1. ``w_i(t) ← W(t)``; the state ``s_i(t) = (L, A, F1)``: the loss, accuracy and F1 score of
   W(t) on the client's training split (:func:`observe`);
2. the agent's pending step of the client's previous round, ``(s_i(t−1), a_i(t−1))``, now
   gets its reward, the improvement of the state (:func:`improvement_reward`)::

       r_i(t−1) = ξ_1 clip(L(t−1) − L(t), ±c) + ξ_2 (A(t) − A(t−1)) + ξ_3 (F1(t) − F1(t−1))

   and ``s_i(t)`` as its next state; ``c`` = ``loss-change-clip`` bounds the reward
   (|r| ≤ ξ_1 c + ξ_2 + ξ_3); ``c = 0`` is the code's unbounded form;
3. the first ``warmup-rounds`` actions are uniform in the box (the code: round 0); later,
   one minibatch update, then ``a = clip(μ(s) + N(0, σ²))``;
4. the box is ``[α_min, α_max] × [ln η_min, ln η_max]``: α_i = round(a_0) epochs and
   η_i = exp(a_1), log-scale as the code's ``10^(a−3)`` (PAGE's mapping, shared in
   ``client/agents``);
5. α_i epochs of plain SGD at η_i from W(t); the trained model is uploaded and kept as the
   client's personalized model until its next round (PAGE's reading of Dap-FL's local
   model);
6. ``(s_i(t), a_i(t))`` waits in the agent for the next round's state and reward.

The agent (networks, optimizers, buffer, pending step) is the ``dapfl/agent`` entry of the
client's versioned state and never leaves the client. ``agents=random`` (the control)
draws the action uniformly every round and keeps no agent; ``tune-epochs=false`` /
``tune-lr=false`` train with the run's ``local-epochs`` / ``lr`` (the code's DDPG-η and
DDPG-α settings).

The reading of the paper, decisions and measurements: docs/methods/dapfl.md.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn
from torch.nn import functional as F

from pflarena.algorithms.ddpg import DDPGAgent
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
from pflarena.core.training import train_epochs
from pflarena.methods.dapfl import keys as dapfl_keys

__all__ = [
    "AGENT_KEY",
    "MODEL_KEY",
    "evaluate",
    "f1_score",
    "improvement_reward",
    "observe",
    "personalized_model",
    "train",
]

AGENT_KEY = "dapfl/agent"
MODEL_KEY = "dapfl/personal-model"
SEED_PURPOSE = "dapfl-client"


def f1_score(predicted: np.ndarray, target: np.ndarray, average: str) -> float:
    """The F1 score of class predictions: ``micro`` (pooled counts, which for one label per
    sample equals the accuracy; the authors' code) or ``macro`` (the mean of the per-class
    F1 over the classes present in ``target`` or ``predicted``, as scikit-learn)."""
    predicted = np.asarray(predicted).ravel()
    target = np.asarray(target).ravel()
    if len(predicted) != len(target) or len(target) == 0:
        raise ValueError(f"F1 needs as many predictions as targets (> 0), got {len(predicted)}")
    if average not in ("micro", "macro"):
        raise ValueError(f"F1 average must be 'micro' or 'macro', got {average!r}")
    labels = np.union1d(predicted, target)
    tp = np.array([np.sum((predicted == c) & (target == c)) for c in labels], dtype=np.float64)
    fp = np.array([np.sum((predicted == c) & (target != c)) for c in labels], dtype=np.float64)
    fn = np.array([np.sum((predicted != c) & (target == c)) for c in labels], dtype=np.float64)
    if average == "micro":
        return float(2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()))
    denominator = 2 * tp + fp + fn
    return float(np.mean(np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 0.0)))


@torch.no_grad()
def observe(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, average: str, *, batch_size: int = 512
) -> np.ndarray:
    """The state ``(L, A, F1)``: mean cross-entropy, accuracy and F1 score of ``model`` on
    ``(x, y)`` in eval mode."""
    if len(y) == 0:
        raise ValueError("Dap-FL's state needs a non-empty training split")
    model.eval()
    loss_sum, predictions = 0.0, []
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        loss_sum += float(F.cross_entropy(logits, y[start : start + batch_size], reduction="sum"))
        predictions.append(logits.argmax(dim=1).cpu().numpy())
    predicted = np.concatenate(predictions)
    target = y.cpu().numpy()
    return np.array(
        [
            loss_sum / len(y),
            float(np.mean(predicted == target)),
            f1_score(predicted, target, average),
        ]
    )


def improvement_reward(
    previous: np.ndarray,
    current: np.ndarray,
    weights: tuple[float, float, float] = (1.0, 1.0, 1.0),
    loss_change_clip: float = 1.0,
) -> tuple[float, bool]:
    """``(r, whether the loss change was clipped)`` for the step from state ``previous`` to
    ``current`` (both ``(L, A, F1)``)::

        r = ξ_1 clip(L_prev − L, −c, c) + ξ_2 (A − A_prev) + ξ_3 (F1 − F1_prev)

    ``c = 0`` leaves the loss change unclipped (the authors' code); with ``c > 0`` the
    reward lies in ``[−(ξ_1 c + ξ_2 + ξ_3), ξ_1 c + ξ_2 + ξ_3]``.
    """
    previous = np.asarray(previous, dtype=np.float64)
    current = np.asarray(current, dtype=np.float64)
    if previous.shape != (3,) or current.shape != (3,):
        raise ValueError(f"Dap-FL states are (loss, accuracy, F1), got {previous}, {current}")
    if not (np.all(np.isfinite(previous)) and np.all(np.isfinite(current))):
        raise ValueError(f"Dap-FL's reward needs finite states, got {previous}, {current}")
    if loss_change_clip < 0:
        raise ValueError(f"loss_change_clip must be >= 0, got {loss_change_clip}")
    loss_change = previous[0] - current[0]
    clipped = loss_change_clip > 0 and abs(loss_change) > loss_change_clip
    if clipped:
        loss_change = math.copysign(loss_change_clip, loss_change)
    xi_loss, xi_accuracy, xi_f1 = weights
    reward = (
        xi_loss * loss_change
        + xi_accuracy * (current[1] - previous[1])
        + xi_f1 * (current[2] - previous[2])
    )
    return float(reward), bool(clipped)


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = job.global_model()
    average = str(job.param("f1-average"))
    state = observe(model, job.data.x_train, job.data.y_train, average)  # s_i(t)
    rng = np.random.default_rng(
        derive_seed(
            job.cfg.seed, job.client_id, job.server_round, SEED_PURPOSE, bits=AGENT_SEED_BITS
        )
    )
    config = agents.box_agent_config(job, state_dim=3)
    learning = str(job.param("agents")) == "ddpg"
    reward: float | None = None
    clipped = False
    stats = None
    if learning:
        agent = agents.load_agent(job, AGENT_KEY, config, SEED_PURPOSE)
        if agent.pending is not None:
            reward, clipped = improvement_reward(
                agent.pending[0],
                state,
                (
                    float(job.param("loss-weight")),
                    float(job.param("accuracy-weight")),
                    float(job.param("f1-weight")),
                ),
                float(job.param("loss-change-clip")),
            )
            agent.complete(state, reward)
        action, stats = agents.next_action(agent, state, rng, int(job.param("warmup-rounds")))
    else:
        agent = DDPGAgent(config, seed=None)
        action = agent.random_action(rng)

    kwargs = agents.local_hyperparameters(job, action)
    started = time.perf_counter()
    running_loss, steps = train_epochs(
        model, job.data.x_train, job.data.y_train, generator=job.generator("train"), **kwargs
    )
    sgd_time = time.perf_counter() - started
    if learning:
        # the reward of this action is the next round's improvement: filled in then
        agent.set_pending(state, action, 0.0)
        agents.save_agent(job, AGENT_KEY, agent)
    job.save_state_model(MODEL_KEY, model)

    metrics = train_metrics(job, running_loss, steps)
    metrics |= {
        dapfl_keys.STATE_LOSS: float(state[0]),
        dapfl_keys.STATE_ACCURACY: float(state[1]),
        dapfl_keys.STATE_F1: float(state[2]),
        dapfl_keys.EPOCHS: int(kwargs["epochs"]),
        dapfl_keys.LR: float(kwargs["lr"]),
        dapfl_keys.SGD_TIME: sgd_time,
    }
    if reward is not None:
        metrics[dapfl_keys.REWARD] = reward
        metrics[dapfl_keys.CLIPPED] = int(clipped)
    if stats is not None:
        metrics[dapfl_keys.CRITIC_LOSS] = stats.critic_loss
    return {keys.ARRAYS: state_record(model.state_dict())}, metrics


def personalized_model(job: ClientJob) -> nn.Module:
    """The client's trained model of its latest round (the global model before its first)."""
    return stored_or_global(job, MODEL_KEY)


def evaluate(job: ClientJob) -> dict:
    """Personalized: the latest trained local model on the test split; global: W."""
    return evaluate_stored_or_global(job, MODEL_KEY)
