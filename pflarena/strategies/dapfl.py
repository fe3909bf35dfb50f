"""Dap-FL (Chen et al., IEEE TPDS 2023): clients tune their own learning rate and epochs
with DDPG.

"Dap-FL: Federated Learning Flourishes by Adaptive Tuning and Secure Aggregation", by the
authors of PAGE, who name it as PAGE's ancestor (docs/methods/page.md). Every client keeps a DDPG
agent that chooses its local learning rate and number of local epochs each round, so that
clients with different resources need not share one setting; the server aggregates the
uploads. The paper secures the aggregation with the Paillier cryptosystem; **that
encryption is left out here: the server aggregates the models in the clear**, which gives
the same global model (Paillier's additive homomorphism computes the same weighted sum) at
none of the cost, and none of the protection.

The client side is :mod:`pflarena.client.solvers.dapfl`: state (loss, accuracy, F1 score)
of the received global model on the client's training split, action (epochs, learning
rate) in configured ranges, reward the improvement of that state from one round to the
next, bounded by clipping the loss change. The first round's actions are random.

**Aggregation weights** (``weighting``, :func:`contribution_weights`): ``examples``, the
default, weights each upload by its client's training examples, p_i = n_i / Σ_j n_j, as the
authors' released code does (``weights`` = "the size of local data"). The paper's text was
not available; PAGE describes Dap-FL as adaptively controlling the clients' contributions,
which the released code does through each client's own learning rate and epochs (the size
of its update), not through the weights. ``work`` is a reading of "adaptive
contributions" through the weights, not from a source: p_i ∝ n_i α_i, the examples times
the epochs the client's agent chose (the sample gradients it computed). ``uniform``: 1/m.

There is no server agent (the paper has none): the strategy is stateless between rounds.
The parts of the authors' code left out, and why, are in docs/methods/dapfl.md
(decisions and measurements): the Paillier encryption, and the primal-dual resource constraint (a cost
critic whose cost the code draws at random).

The reading of the paper, decisions and measurements: docs/methods/dapfl.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from pydantic import Field, model_validator

from pflarena.core import keys
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.strategies.base import PflStrategy
from pflarena.strategies.page import aggregate, weight_entropy

__all__ = ["DapFL", "DapflParams", "contribution_weights"]

Weighting = Literal["examples", "uniform", "work"]


class DapflParams(MethodParams):
    """Dap-FL's parameters: the authors' released code where it gives them (ranges, reward,
    DDPG settings), PAGE's client agent where it does not (exploration noise)."""

    agents: Literal["ddpg", "random"] = Field(
        "ddpg", description="'ddpg' agents, or 'random' actions every round (the control)"
    )
    weighting: Weighting = Field(
        "examples",
        description="aggregation weights: 'examples' n_i (the authors' code), 'work' n_i·α_i "
        "(examples × chosen epochs; a reading, not from a source), 'uniform'",
    )
    loss_weight: float = Field(1.0, ge=0, description="ξ_1: reward weight of the loss decrease")
    accuracy_weight: float = Field(1.0, ge=0, description="ξ_2: reward weight of the accuracy gain")
    f1_weight: float = Field(1.0, ge=0, description="ξ_3: reward weight of the F1 gain")
    f1_average: Literal["micro", "macro"] = Field(
        "micro", description="the state's F1: 'micro' (= accuracy; the code) or 'macro'"
    )
    loss_change_clip: float = Field(
        1.0,
        ge=0,
        description="c: the reward's loss change clipped to [−c, c]; 0: unbounded (the code)",
    )
    min_epochs: int = Field(1, ge=1, description="the clients' fewest local epochs")
    max_epochs: int = Field(40, ge=1, description="the clients' most local epochs (code: 40)")
    min_lr: float = Field(1e-4, gt=0, description="the lowest local lr (log-scale; code: 1e-4)")
    max_lr: float = Field(1e-2, gt=0, description="the highest local lr (code: 1e-2)")
    warmup_rounds: int = Field(1, ge=0, description="first actions taken at random (code: 1)")
    critic_lr: float = Field(1e-4, gt=0, description="the critic's learning rate (code: 1e-4)")
    actor_lr: float = Field(1e-5, gt=0, description="the actor's learning rate (code: 1e-5)")
    tau: float = Field(0.001, gt=0, le=1, description="soft target-update rate (code: 0.001)")
    gamma: float = Field(0.99, ge=0, lt=1, description="discount factor γ (code: 0.99)")
    rl_batch_size: int = Field(2, ge=1, description="the DDPG minibatch size (code: 2)")
    rl_buffer: int = Field(10_000, ge=1, description="replay-buffer capacity (code: 10,000)")
    rl_optimizer: Literal["sgd", "adam"] = Field("adam", description="'adam' (the code) or 'sgd'")
    noise_sigma: float = Field(
        0.1, ge=0, description="exploration σ₀ (PAGE's; the code adds none: 0)"
    )
    noise_decay: float = Field(0.995, gt=0, le=1, description="σ multiplied by this per action")
    noise_min: float = Field(0.01, ge=0, description="exploration σ floor")
    hidden: int = Field(10, ge=1, description="width of the agents' 2 hidden layers (code: 10, 5)")
    tune_epochs: bool = Field(True, description="learn the epochs (false: the run's local-epochs)")
    tune_lr: bool = Field(True, description="learn the lr (false: the run's lr)")

    @model_validator(mode="after")
    def _ranges(self) -> DapflParams:
        """The action ranges are ranges, and the reward weighs something."""
        problems = []
        if self.min_epochs > self.max_epochs:
            problems.append(
                f"dapfl.min-epochs ({self.min_epochs}) exceeds dapfl.max-epochs ({self.max_epochs})"
            )
        if self.min_lr > self.max_lr:
            problems.append(f"dapfl.min-lr ({self.min_lr}) exceeds dapfl.max-lr ({self.max_lr})")
        if self.loss_weight == self.accuracy_weight == self.f1_weight == 0:
            problems.append(
                "dapfl.loss-weight, dapfl.accuracy-weight and dapfl.f1-weight are all 0: "
                "the reward would be 0 in every round"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def contribution_weights(
    examples: np.ndarray, epochs: np.ndarray, weighting: str = "examples"
) -> np.ndarray:
    """The aggregation weights of m uploads, on the simplex.

    ``examples``: p_i = n_i / Σ_j n_j (the authors' code); ``work``: p_i = n_i α_i /
    Σ_j n_j α_j, with α_i the epochs client i trained; ``uniform``: p_i = 1/m.
    """
    n = np.asarray(examples, dtype=np.float64)
    alpha = np.asarray(epochs, dtype=np.float64)
    if n.ndim != 1 or n.shape != alpha.shape or len(n) == 0:
        raise ValueError(
            f"contribution weights need one count and one epoch number per upload, got "
            f"{n.shape} and {alpha.shape}"
        )
    if not (np.all(np.isfinite(n)) and np.all(n > 0)):
        raise ValueError(f"examples must be finite and > 0, got {n}")
    if not (np.all(np.isfinite(alpha)) and np.all(alpha > 0)):
        raise ValueError(f"epochs must be finite and > 0, got {alpha}")
    if weighting == "examples":
        share = n
    elif weighting == "work":
        share = n * alpha
    elif weighting == "uniform":
        share = np.ones_like(n)
    else:
        raise ValueError(f"weighting must be 'examples', 'work' or 'uniform', got {weighting!r}")
    return share / share.sum()


class DapFL(PflStrategy):
    """Dap-FL: clients' DDPG agents choose their local lr and epochs; the server aggregates
    with :func:`contribution_weights` (in the clear: no Paillier encryption).

    Parameters
    ----------
    Others
        See :class:`DapflParams`.
    """

    declaration = MethodDeclaration(
        name="dapfl",
        kind="baseline",
        reference="Chen, Wang, Chen, Yan and Lin, Dap-FL: Federated Learning Flourishes by "
        "Adaptive Tuning and Secure Aggregation, IEEE TPDS 34(6), 2023",
        summary="each client's DDPG agent picks its local lr and epochs (state: loss, "
        "accuracy, F1 of the global model; reward: their improvement); data-size-weighted "
        "aggregation in the clear (the paper's Paillier encryption is left out)",
        solver="pflarena.client.solvers.dapfl",
        params=DapflParams,
        honours=frozenset({"local-epochs", "batch-size", "lr", "lr-milestones", "lr-gamma"}),
    )

    def train_config(self, server_round: int, node_id: int) -> dict:
        """The common settings plus what the clients' agents need."""
        client = self.params_config(exclude={"weighting"})
        return {**super().train_config(server_round, node_id), **client}

    def check_train_reply(self, content: RecordDict) -> str | None:
        """The model, and the metrics the aggregation and the round's report read."""
        metrics = content.metric_records[keys.METRICS]
        for name, valid, wanted in (
            (keys.NUM_EXAMPLES, lambda v: v >= 1, "a count >= 1"),
            (keys.DAPFL_EPOCHS, lambda v: v >= 1, "a number of epochs >= 1"),
            (keys.DAPFL_LR, lambda v: v > 0, "a learning rate > 0"),
        ):
            value = metrics.get(name)
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
                or not valid(value)
            ):
                return f"metric {name!r} must be {wanted}, got {value!r}"
        return super().check_train_reply(content)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(replies)
        if not valid:
            return None, None
        metrics = [m.content[keys.METRICS] for m in valid]
        examples = np.array([float(m[keys.NUM_EXAMPLES]) for m in metrics])
        epochs = np.array([float(m[keys.DAPFL_EPOCHS]) for m in metrics])
        lrs = np.array([float(m[keys.DAPFL_LR]) for m in metrics])
        weights = contribution_weights(examples, epochs, self.params.weighting)
        new_arrays = aggregate([m.content[keys.ARRAYS] for m in valid], weights)

        out = self.train_metrics(valid)
        assert out is not None
        entropy = weight_entropy(weights)
        out.update(
            {
                "weight-entropy-ratio": entropy / math.log(len(weights))
                if len(weights) > 1
                else 1.0,
                "max-weight": float(weights.max()),
                "mean-epochs": float(epochs.mean()),
                "mean-lr": float(np.exp(np.log(lrs).mean())),
                "state-accuracy": float(
                    np.mean([float(m.get(keys.DAPFL_STATE_ACCURACY, math.nan)) for m in metrics])
                ),
            }
        )
        rewards = [float(m[keys.DAPFL_REWARD]) for m in metrics if keys.DAPFL_REWARD in m]
        if rewards:
            out["client-reward"] = float(np.mean(rewards))
            out["client-clipped"] = int(sum(int(m.get(keys.DAPFL_CLIPPED, 0)) for m in metrics))
        return new_arrays, out

    def run_summary(self) -> dict[str, Any]:
        p = self.params
        return {
            "agents": p.agents,
            "weighting": p.weighting,
            "reward_weights": [p.loss_weight, p.accuracy_weight, p.f1_weight],
            "loss_change_clip": p.loss_change_clip,
            "epochs_range": [p.min_epochs, p.max_epochs],
            "lr_range": [p.min_lr, p.max_lr],
            "secure_aggregation": False,
        }
