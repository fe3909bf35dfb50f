"""PAGE's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.page.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pflarena.core.methods import MethodParams

__all__ = ["PageParams"]


class PageParams(MethodParams):
    """PAGE's parameters: the paper's Synthetic settings (Table 7) where it gives them, the
    resolutions of docs/papers/page.md §4.2 and §9 where it does not."""

    agents: Literal["ddpg", "random"] = Field(
        "ddpg", description="'ddpg' agents, or 'random' actions every round (the control)"
    )
    server_reward: Literal["global-loss", "client-loss"] = Field(
        "global-loss",
        description="F in r_CS = k_g/F: the loss of W(t+1) on the server's data, or the "
        "paper's Σ p_i f_i(ŵ_i) of the clients' reported losses (degenerate optimum, A12)",
    )
    loss_floor: float = Field(
        0.01, ge=0, description="f_min in r = k/max(f, f_min); 0: the paper's unbounded 1/f"
    )
    server_reward_scale: float = Field(1.0, gt=0, description="k_g (biased variants: 10 or 1)")
    client_reward_scale: float = Field(1.0, gt=0, description="k_l (biased variants: 1 or 10)")
    server_data: Literal["held-out", "client-test"] = Field(
        "held-out",
        description="D_CS: the server-held split, or the paper's global test set (the "
        "clients' test splits; leaks them into the server's agent)",
    )
    state_samples: int = Field(
        0, ge=0, description="samples of D_CS the server state is computed on; 0: all"
    )
    weight_floor: float = Field(
        0.0, ge=0, lt=1, description="ε: p ← (1 − ε) p + ε/n over the uploads (0: the paper)"
    )
    min_epochs: int = Field(1, ge=1, description="α_min, the clients' fewest local epochs")
    max_epochs: int = Field(5, ge=1, description="α_max, the clients' most local epochs")
    min_lr: float = Field(1e-3, gt=0, description="η_min (the action is log-scale)")
    max_lr: float = Field(0.1, gt=0, description="η_max")
    warmup_rounds: int = Field(1, ge=0, description="first actions taken at random (paper: 1)")
    critic_lr: float = Field(0.01, gt=0, description="l^Cri, both sides (Table 7, Synthetic)")
    actor_lr: float = Field(0.001, gt=0, description="l^Act, both sides (Table 7, Synthetic)")
    tau: float = Field(0.01, gt=0, le=1, description="β, the soft target-update rate (Table 7)")
    gamma: float = Field(0.99, ge=0, lt=1, description="discount factor γ")
    rl_batch_size: int = Field(32, ge=1, description="the DDPG minibatch size (the paper's B)")
    rl_buffer: int = Field(10_000, ge=1, description="replay-buffer capacity (FIFO)")
    server_optimizer: Literal["sgd", "adam"] = Field(
        "sgd",
        description="the server agent's optimizer: 'sgd', Algorithm 1's plain gradient step "
        "at Table 7's rates (the weights stay spread), or 'adam' (DDPG's usual optimizer; "
        "drives the weights onto one client, docs/papers/page.md §12.3)",
    )
    client_optimizer: Literal["sgd", "adam"] = Field(
        "adam",
        description="the clients' agents' optimizer: 'adam' (learns their (α, η) at Table "
        "7's rates) or 'sgd', Algorithm 2's plain gradient step",
    )
    critic_check: bool = Field(
        True,
        description="log per round the cosine between the server critic's ∂Q/∂p and the "
        "reward's true gradient in p (autograd through W = Σ p_i ŵ_i on D_CS)",
    )
    noise_sigma: float = Field(0.1, ge=0, description="exploration σ₀ (server: on the logits)")
    noise_decay: float = Field(0.995, gt=0, le=1, description="σ multiplied by this per action")
    noise_min: float = Field(0.01, ge=0, description="exploration σ floor")
    server_hidden: int = Field(256, ge=1, description="width of the server agent's 2 layers")
    client_hidden: int = Field(64, ge=1, description="width of the client agents' 2 layers")
    tune_weights: bool = Field(True, description="learn p (false: data-size weights)")
    tune_epochs: bool = Field(True, description="learn α (false: the run's local-epochs)")
    tune_lr: bool = Field(True, description="learn η (false: the run's lr)")

    @model_validator(mode="after")
    def _ranges(self) -> PageParams:
        problems = []
        if self.min_epochs > self.max_epochs:
            problems.append(
                f"page.min-epochs ({self.min_epochs}) exceeds page.max-epochs ({self.max_epochs})"
            )
        if self.min_lr > self.max_lr:
            problems.append(f"page.min-lr ({self.min_lr}) exceeds page.max-lr ({self.max_lr})")
        if problems:
            raise ValueError("; ".join(problems))
        return self
