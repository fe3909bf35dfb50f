"""SplitGP's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.splitgp.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pflarena.core.methods import MethodParams
from pflarena.core.model_split import split_problem

__all__ = ["SplitGPParams"]


class SplitGPParams(MethodParams):
    """SplitGP's parameters."""

    lambda_: float = Field(
        0.2,
        ge=0,
        le=1,
        description="λ: weight of the client's own client-side model against the average "
        "(1: personal, 0: shared)",
    )
    gamma: float = Field(
        0.5, ge=0, le=1, description="γ: weight of the client-side exit's loss (1 − γ: full model)"
    )
    entropy_threshold: float = Field(
        0.5,
        ge=0,
        description="inference: offload a sample to the server when the client-side output's "
        "entropy (nats) exceeds this",
    )
    head_layers: int = Field(
        2, ge=1, description="final weighted layers forming the server-side part θ"
    )

    def run_problems(self, cfg: Any) -> list[str]:
        return split_problem(cfg, self.head_layers, "splitgp.head-layers")
