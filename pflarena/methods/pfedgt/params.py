"""pFedGT's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.pfedgt.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pflarena.core.config import parse_float_list
from pflarena.core.methods import MethodParams

__all__ = ["PFedGTParams", "PAPER_LAMBDA"]


#: λ in the paper's experiments (Eq. 5); used when ``lambda-rule=fixed``.
PAPER_LAMBDA = 0.7


class PFedGTParams(MethodParams):
    """pFedGT's parameters; defaults are the paper's experimental settings.

    The paper's reading: docs/papers/pfedgt.md.
    """

    gamma: float = Field(0.8, ge=0, le=1, description="personalization coefficient γ")
    gammas: str = Field(
        "", description="per-client γ_i as comma-separated values, one per client id"
    )
    mu: float = Field(0.05, ge=0, description="surrogate curvature μ")
    rho: float = Field(0.0, ge=0, description="ridge weight ρ (theory needs ρ > L)")
    lambda_: float = Field(
        PAPER_LAMBDA,
        gt=0,
        description="step size λ of the message average c under lambda-rule=fixed (the "
        "paper's 0.7)",
    )
    lambda_rule: Literal["tracking", "fixed"] = Field(
        "tracking",
        description="'tracking': λ = |S^t|/m each round (S^t: the clients whose update was "
        "used), which keeps c the exact mean of the stored messages (Lemma 1) and kept θ and c "
        "bounded on CIFAR-10 where the paper's 0.7 did not (docs/papers/pfedgt.md §11); 'fixed': "
        "λ = pfedgt.lambda",
    )
    server_lr: float = Field(1.0, gt=0, description="step size η_s of the server model θ")
    variant: Literal["paper", "exact"] = Field(
        "paper",
        description="'paper': Algorithm 2 as written (one-step-stale message); "
        "'exact': unbiased ∇G_i steps and a full-pass message at the end",
    )
    c_init: Literal["round", "zeros"] = Field(
        "round", description="c⁰: a full-participation gradient exchange at θ⁰, or zeros"
    )
    warm_start: Literal["theta", "personal"] = Field(
        "theta", description="local training starts from θ (paper) or the client's own w_i"
    )
    message_init: Literal["server", "stored"] = Field(
        "server", description="the local message starts from c (paper) or the client's stored c_i"
    )
    delta_ref: Literal["theta", "personal"] = Field(
        "theta",
        description="Δw is w_new − θ (default; stable with η_s=1 under partial "
        "participation) or w_new − w_i (Eq. 6 read literally; see docs/papers/pfedgt.md §11)",
    )
    start_buffers: Literal["personal", "theta"] = Field(
        "personal",
        description="BatchNorm running statistics local training starts from: the client's "
        "own (docs/papers/pfedgt.md §9.14, as PFLlib) or θ's, the mean of the last participants'",
    )

    @field_validator("gammas")
    @classmethod
    def _gamma_list(cls, value: str) -> str:
        if value.strip():
            gammas = parse_float_list(value, "pfedgt.gammas")
            if any(not 0.0 <= g <= 1.0 for g in gammas):
                raise ValueError(f"every γ_i must be in [0, 1], got {value!r}")
        return value

    def run_problems(self, cfg) -> list[str]:
        problems = []
        try:
            self.client_gammas(cfg.num_clients)
        except ValueError as exc:
            problems.append(str(exc))
        if self.lambda_rule == "tracking" and self.lambda_ != PAPER_LAMBDA:
            problems.append(
                f"pfedgt.lambda={self.lambda_:g} takes effect only with "
                "pfedgt.lambda-rule=fixed (the default rule, tracking, sets λ = |S^t|/m)"
            )
        return problems

    def client_gammas(self, num_clients: int) -> list[float]:
        """γ_i for every client id; raises ValueError when ``gammas`` has another length."""
        if not self.gammas.strip():
            return [self.gamma] * num_clients
        gammas = parse_float_list(self.gammas, "pfedgt.gammas")
        if len(gammas) != num_clients:
            raise ValueError(
                f"pfedgt.gammas has {len(gammas)} values but num-clients is {num_clients}"
            )
        return gammas
