"""LG-FedAvg's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.lgfedavg.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pflarena.core.methods import MethodParams
from pflarena.core.model_split import split_problem

__all__ = ["LGFedAvgParams"]


class LGFedAvgParams(MethodParams):
    """LG-FedAvg's parameters; defaults from the authors' CIFAR-10 setting."""

    global_layers: int = Field(
        2, ge=1, description="final layers with weights that are shared (the rest stay local)"
    )
    weighting: Literal["examples", "uniform"] = Field(
        "uniform", description="global-layer average: uniform (code) or by training examples"
    )

    def run_problems(self, cfg) -> list[str]:
        return split_problem(cfg, self.global_layers, "lgfedavg.global-layers") if cfg else []
