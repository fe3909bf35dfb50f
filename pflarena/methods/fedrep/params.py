"""FedRep's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.fedrep.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pflarena.core.methods import MethodParams
from pflarena.core.model_split import split_problem

__all__ = ["FedRepParams"]


class FedRepParams(MethodParams):
    """FedRep's parameters; defaults from the authors' CIFAR-10 setting."""

    head_epochs: int = Field(
        10, ge=0, description="τ_h: local epochs of the head per round, the representation fixed"
    )
    body_epochs: int = Field(
        1, ge=0, description="τ: local epochs of the representation per round, the head fixed"
    )
    head_layers: int = Field(1, ge=1, description="final layers with weights in the local head")
    weighting: Literal["examples", "uniform"] = Field(
        "examples", description="representation average: by training examples (code) or uniform"
    )

    @model_validator(mode="after")
    def _something_trains(self) -> FedRepParams:
        if self.head_epochs + self.body_epochs == 0:
            raise ValueError("fedrep.head-epochs and fedrep.body-epochs are both 0: nothing trains")
        return self

    def run_problems(self, cfg) -> list[str]:
        return [] if cfg is None else split_problem(cfg, self.head_layers, "fedrep.head-layers")
