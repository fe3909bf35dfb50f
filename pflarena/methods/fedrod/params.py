"""Fed-ROD's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.fedrod.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pflarena.core.methods import MethodParams
from pflarena.core.model_split import split_problem

__all__ = ["FedRoDParams"]


class FedRoDParams(MethodParams):
    """Fed-ROD's parameters."""

    gamma: float = Field(
        1.0,
        ge=0,
        description="γ: exponent of the class counts in the balanced softmax (1: Ren et al.; "
        "0: plain cross-entropy)",
    )
    head_layers: int = Field(
        1, ge=1, description="final weighted layers forming the generic head (and φ_m's copy)"
    )

    personal_init: Literal["initial", "zero"] = Field(
        "initial",
        description="φ_m's start: the run's initial head, or zero (the personalized prediction "
        "starts as the generic one)",
    )

    def run_problems(self, cfg: Any) -> list[str]:
        return split_problem(cfg, self.head_layers, "fedrod.head-layers")
