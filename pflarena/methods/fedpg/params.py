"""FedPG's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.fedpg.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from pflarena.core.methods import MethodParams

__all__ = ["FedPGParams", "parse_gamma"]


def parse_gamma(value: Any) -> float | None:
    """``"adaptive"`` -> None; a number in [0, 1] (or its text) -> that number."""
    if isinstance(value, str) and value.strip().lower() == "adaptive":
        return None
    if isinstance(value, bool):
        raise ValueError(f"gamma must be 'adaptive' or a number in [0, 1], got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"gamma must be 'adaptive' or a number in [0, 1], got {value!r}") from None
    if not 0.0 <= number <= 1.0:  # NaN fails too
        raise ValueError(f"gamma must be 'adaptive' or a number in [0, 1], got {value!r}")
    return number


class FedPGParams(MethodParams):
    """FedPG's parameters; defaults are the paper's FedPG and docs/papers/fedpg.md §9's
    resolutions."""

    gamma: str = Field(
        "adaptive",
        description="drift coefficient: 'adaptive' (eq. 8, largest γ_i harming no other online "
        "client) or a number in [0, 1], a floor γ_i = max(eq. 8, value) (Table 1's γ variants)",
    )
    lr_decay: float = Field(
        0.999, gt=0, le=1, description="step size η^t = lr · lr-decay^(t−1) (paper: 0.999)"
    )
    grad_mode: Literal["full", "pseudo"] = Field(
        "full",
        description="g_i: 'full' training-set gradient at θ^t (docs/papers/fedpg.md §9.1), or 'pseudo' "
        "(θ^t − θ_E)/lr after local-epochs of SGD",
    )
    fairness: bool = Field(True, description="the fair column ∇F' in the QP (false: ablation M2)")
    absent_clients: bool = Field(
        True, description="recently absent clients' stale gradients in the QP (false: M4)"
    )
    personalize: bool = Field(
        True, description="build P-models by direction drift (false: M3, P-model = G-model)"
    )
    direction: Literal["min-norm", "average"] = Field(
        "min-norm", description="'min-norm' QP direction, or 'average' d = d_r (ablation M1)"
    )
    rescale: Literal["scaled-mean", "raw-mean", "none"] = Field(
        "scaled-mean",
        description="‖d‖ = ‖mean of norm-equalized g̃_i‖ (docs/papers/fedpg.md §9.7), of raw g_i, or no rescaling",
    )
    drift_absent: bool = Field(
        False,
        description="the drift also protects the stale absent gradients (docs/papers/fedpg.md §9.18)",
    )
    line_search: bool = Field(False, description="S-FedPG: Armijo line search on η^t (§3.3)")
    line_search_s: int = Field(5, ge=0, le=20, description="S-FedPG: first trial η = 2^s η^t")
    line_search_beta: float = Field(1e-4, gt=0, lt=1, description="S-FedPG: Armijo constant β")
    line_search_lower: Literal["times-sigma", "over-sigma"] = Field(
        "times-sigma",
        description="S-FedPG: lower bound (1/2)^s η σ (paper) or (1/2)^s η / σ (docs/papers/fedpg.md §9.10)",
    )

    @field_validator("gamma", mode="before")
    @classmethod
    def _gamma(cls, value: Any) -> str:
        number = parse_gamma(value)
        return "adaptive" if number is None else (value if isinstance(value, str) else repr(value))
