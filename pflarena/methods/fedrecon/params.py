"""FedRecon's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.fedrecon.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pflarena.core.methods import MethodParams
from pflarena.core.model_split import split_problem

__all__ = ["FedReconParams"]


class FedReconParams(MethodParams):
    """FedRecon's parameters."""

    head_layers: int = Field(
        1, ge=1, description="final weighted layers forming the local parameters l"
    )
    support_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="share of the training split in the support set (the rest: query); "
        "1: both are all of it",
    )
    reconstruction_epochs: int = Field(
        1, ge=0, description="epochs of SGD on l over the support set, g frozen"
    )
    reconstruction_lr: float = Field(
        0.0, ge=0, description="step size of the reconstruction (0: the run's lr)"
    )
    local_init: Literal["fresh", "initial"] = Field(
        "fresh",
        description="where l starts each round: a fresh seeded draw, or the run's initial values",
    )
    weighting: Literal["examples", "uniform"] = Field(
        "examples", description="average of g: by query examples (the code), or uniform"
    )

    def run_problems(self, cfg: Any) -> list[str]:
        return split_problem(cfg, self.head_layers, "fedrecon.head-layers")
