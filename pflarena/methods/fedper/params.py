"""FedPer's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.fedper.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pflarena.core.methods import MethodParams
from pflarena.core.model_split import split_problem

__all__ = ["FedPerParams"]


class FedPerParams(MethodParams):
    """FedPer's parameters."""

    head_layers: int = Field(
        1, ge=1, description="K_P: final layers with weights kept on the client (the head)"
    )
    weighting: Literal["examples", "uniform"] = Field(
        "examples", description="base-layer average: by training examples n_j/n (FedAvg) or uniform"
    )

    def run_problems(self, cfg) -> list[str]:
        return split_problem(cfg, self.head_layers, "fedper.head-layers") if cfg else []
