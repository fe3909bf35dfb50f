"""PPFL's parameters, without torch: the run config is checked against them before
anything imports torch or Flower (the strategy, :mod:`pflarena.methods.ppfl.strategy`, runs
with them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pflarena.core.methods import MethodParams
from pflarena.core.model_layouts import run_layout
from pflarena.core.model_split import copied_entries

__all__ = ["PPFLParams"]


class PPFLParams(MethodParams):
    """PPFL's parameters; defaults are the paper's settings and the resolutions of docs/papers/ppfl.md §9."""

    num_canonical: int = Field(3, ge=1, le=64, description="K, the number of canonical models")
    form: Literal["interpolate", "mix"] = Field(
        "mix",
        description="'interpolate': PPFL2, one model with parameters Σ c_k θ_k (Eq. 8); "
        "'mix': PPFL1, the canonical models' outputs mixed with weights c (Eq. 7)",
    )
    mix: Literal["prob", "logit", "loss"] = Field(
        "prob",
        description="PPFL1's mixture: of class probabilities (Eq. 7), of logits, or of the "
        "models' losses (Appendix O3.4; docs/papers/ppfl.md §9.1-§9.2)",
    )
    canonical_layers: int = Field(
        0,
        ge=0,
        description="the last N layers with weights are canonical, the rest the shared trunk "
        "θ_com (0: the whole model is canonical, no trunk)",
    )
    schedule: Literal["rbcd", "alternate", "theta-first"] = Field(
        "theta-first",
        description="'rbcd': Algorithm 1 (a random block per round); 'alternate': Algorithm 2 "
        "(c step, then θ); 'theta-first': the authors' code (θ, then c steps at θ^{t+1})",
    )
    theta_probability: float = Field(
        0.5, ge=0, le=1, description="rbcd: probability ρ_1 of the θ-block (the C-block: 1 − ρ_1)"
    )
    membership_lr: float = Field(0.5, gt=0, description="η_c, the membership step size (Eq. 15)")
    membership_steps: Literal["auto", "full", "minibatch", "epoch"] = Field(
        "auto",
        description="c steps: one with the full local gradient, one with a minibatch's, or one "
        "per minibatch over an epoch (the code); auto: epoch for theta-first, else full",
    )
    membership_floor: float = Field(
        1e-6, gt=0, lt=0.01, description="ε: every membership coordinate stays ≥ ε (Remark 3.2)"
    )
    scaling: Literal["normalized", "paper", "code"] = Field(
        "normalized",
        description="membership gradient: 'normalized' ∇f_i + π_i/p_i (Eq. 14 over p_i), "
        "'paper' p_i ∇f_i + π_i (Eq. 14), 'code' ∇f_i + π_i (the authors' code)",
    )
    lambda_: float = Field(1e-5, ge=0, description="λ, the Laplacian regularization strength")
    penalty: Literal["laplacian", "degree-only"] = Field(
        "laplacian",
        description="the Laplacian term of each c step: 2λ(LC)_i (Eq. 14) or the code's λ(DC)_i",
    )
    affinity: Literal["labels", "centered-labels", "complete", "none"] = Field(
        "labels",
        description="W: cosine of label histograms (clients reveal them), its centered variant, "
        "all ones (reveals nothing), or none (no Laplacian term)",
    )
    theta_weights: Literal["examples", "uniform"] = Field(
        "examples", description="θ aggregation weights: p_i = n_i/n (paper) or uniform (code)"
    )
    local_steps: int = Field(
        0, ge=0, description="local SGD steps E per θ-block (0: local-epochs epochs instead)"
    )
    persistent_momentum: bool = Field(
        False,
        description="keep each client's SGD momentum buffers from one θ-block to its next "
        "(the authors' code); false: fresh buffers every message",
    )

    # (K ≤ 64 and ε < 0.01 keep K·ε < 1, which the floor needs)
    @model_validator(mode="after")
    def _membership_steps(self) -> PPFLParams:
        if self.schedule == "rbcd" and self.membership_steps == "epoch":
            raise ValueError(
                "ppfl.membership-steps=epoch needs the client to step c itself; with "
                "schedule=rbcd the server takes one step per C-block: use full or minibatch"
            )
        return self

    def run_problems(self, cfg: Any) -> list[str]:
        return _canonical_problems(cfg, self.canonical_layers, self.form)


def _canonical_problems(cfg: Any, layers: int, form: str) -> list[str]:
    """The model must have the canonical layers asked for, and PPFL2, which interpolates
    parameters, needs canonical layers without buffers (from the model's names:
    :func:`run_layout`)."""
    layout = run_layout(cfg)
    trainable = list(layout.trainable)
    try:
        entries = copied_entries(list(layout.state), trainable, layers)
    except ValueError as exc:
        return [f"ppfl.canonical-layers={layers}: {exc}"]
    buffers = [n for n in entries if n not in set(trainable)]
    if buffers and form == "interpolate":
        return [
            f"ppfl.form=interpolate averages parameters, but ppfl.canonical-layers={layers} "
            f"of model {cfg.model_name()!r} holds buffers ({', '.join(buffers[:3])}); use "
            "form=mix or canonical layers without normalization"
        ]
    return []
