"""FedBABU's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.fedbabu.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pflarena.core.methods import MethodParams
from pflarena.core.model_split import split_problem

__all__ = ["FedBABUParams"]


class FedBABUParams(MethodParams):
    """FedBABU's parameters; defaults from the authors' code."""

    finetune_epochs: int = Field(
        5, ge=0, description="τ_f: epochs of fine-tuning the whole model before evaluation"
    )
    head_layers: int = Field(
        1, ge=1, description="final layers with weights in the fixed random head"
    )
    weighting: Literal["examples", "uniform"] = Field(
        "uniform", description="body average: uniform (code) or by training examples"
    )

    def run_problems(self, cfg) -> list[str]:
        return split_problem(cfg, self.head_layers, "fedbabu.head-layers") if cfg else []
