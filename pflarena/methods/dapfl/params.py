"""Dap-FL's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.dapfl.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pflarena.core.methods import MethodParams

__all__ = ["DapflParams"]


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
