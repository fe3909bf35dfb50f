"""FedMGDA+: multi-gradient descent on normalized client updates, λ near uniform.

Hu, Wang, Yu, Liang, "Federated Learning Meets Multi-objective Optimization", IEEE TNSE
2022 (the FedPG paper's baseline [20]). Each round the sampled clients run ``local-epochs``
of SGD from θ^t and send the pseudo-gradient ``g_i = (θ^t − θ_i)/lr`` (the FedPG solver in
``grad-mode=pseudo``; the division by ``lr`` is immaterial, every g_i is normalized); the
server normalizes ``ĝ_i = g_i/‖g_i‖``, solves the min-norm QP with the ε-ball around the
uniform weights,

    λ* = argmin ½‖Σ_i λ_i ĝ_i‖²  s.t.  λ ∈ Δ,  ‖λ − 1/|S|‖_∞ ≤ ε,

and steps ``θ ← θ − η_g d``, ``d = Σ_i λ*_i ĝ_i``, with the global learning rate η_g
(``server-lr``, decayed by ``lr-decay`` per round). ε = 0 is FedAvg on normalized updates,
ε = 1 is plain MGDA. No personalization of its own: the personalized model is the global
model, or with ``personal-model=local-result`` each client's latest local-training result
θ_i (the FedPG paper's P-model for FedMGDA+, docs/papers/fedpg.md §5.4).

Decisions: the ball is the ∞-norm ball around uniform weights over this round's usable
replies (the authors' formulation; data-size weights as the centre are not used because
FedPG weights clients equally, §9.3); zero updates (‖g_i‖ ≤ 1e-6) are dropped; the QP
(:func:`min_norm_weights_box`) is solved by accelerated projected gradient with an exact
projection onto ``{Σλ = 1, lo ≤ λ ≤ hi}`` (``solver=fast``, checked against cvxpy in the
tests) or by cvxpy (``solver=cvxpy``); with ε ≥ 1 - 1/|S| the box is inactive and the
exact simplex solver of ``algorithms/mgda.py`` is used. The declaration name is ``fedmgda``:
``+`` is not a TOML bare-key character, and ``[tool.flwr.app.config.<name>]`` is written
unquoted.

The reading of the paper, decisions and measurements: docs/methods/fedmgda.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from pydantic import Field

from pflarena.algorithms.mgda import (
    ZERO_GRAD_NORM,
    gram_matrix,
    min_norm_weights_from_gram,
    stacked_gram_footprint,
    weighted_rows,
)
from pflarena.core import keys
from pflarena.core.footprint import Federation, Footprint
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.fedavg.strategy import PERSONAL_MODEL_HELP, PersonalModel, local_result
from pflarena.methods.fedpg import keys as fedpg_keys
from pflarena.strategies.aggregation import (
    as_numpy,
    as_record,
    float_names,
    stack_flat,
    unflatten,
)
from pflarena.strategies.base import PflStrategy, StrategySetup, array_problem

__all__ = ["FedMGDA", "FedMGDAParams", "box_projection", "min_norm_weights_box"]


class FedMGDAParams(MethodParams):
    """FedMGDA+'s parameters."""

    epsilon: float = Field(
        0.1, ge=0, le=1, description="ε: λ within ε of 1/|S| per client (0: FedAvg, 1: MGDA)"
    )
    server_lr: float = Field(1.0, gt=0, description="global learning rate η_g (θ ← θ − η_g d)")
    lr_decay: float = Field(1.0, gt=0, le=1, description="η_g decays by this factor per round")
    solver: Literal["fast", "cvxpy"] = Field(
        "fast", description="QP solver: projected FISTA ('fast') or cvxpy (reference)"
    )
    personal_model: PersonalModel = Field("global", description=PERSONAL_MODEL_HELP)


def box_projection(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{x : Σ x = 1, lo ≤ x ≤ hi}`` (exact).

    ``x = clip(v − τ, lo, hi)`` with ``τ`` where the (non-increasing, piecewise linear)
    sum crosses 1, found among the breakpoints ``v − lo`` and ``v − hi``. Needs
    ``Σ lo ≤ 1 ≤ Σ hi``.
    """
    points = np.sort(np.concatenate([v - lo, v - hi]))
    sums = np.clip(v[None, :] - points[:, None], lo, hi).sum(axis=1)  # non-increasing
    above = np.nonzero(sums >= 1.0)[0]
    j = above[-1] if above.size else 0
    if j + 1 >= points.size or sums[j] == 1.0:
        tau = points[j]
    else:
        s0, s1 = sums[j], sums[j + 1]
        tau = points[j] + (s0 - 1.0) * (points[j + 1] - points[j]) / max(s0 - s1, 1e-300)
    return np.clip(v - tau, lo, hi)


def min_norm_weights_box(
    gram: np.ndarray,
    epsilon: float,
    *,
    solver: str = "fast",
    tol: float = 1e-12,
    max_iter: int = 50_000,
) -> np.ndarray:
    """``argmin_λ ½ λᵀPλ`` over ``Δ_K ∩ {|λ_k − 1/K| ≤ ε}`` for a Gram matrix ``P``.

    ``fast``: FISTA with adaptive restarts and the exact projection
    :func:`box_projection`, stopped when the projected-gradient step moves λ by less than
    ``tol`` (relative to its scale); ``cvxpy``: the same QP in cvxpy (the reference).
    """
    p = np.asarray(gram, dtype=np.float64)
    k = p.shape[0]
    if k == 1:
        return np.ones(1)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    centre = 1.0 / k
    lo = np.full(k, max(0.0, centre - epsilon))
    hi = np.full(k, min(1.0, centre + epsilon))
    if epsilon == 0:
        return np.full(k, centre)
    scale = float(np.max(np.diag(p)))
    if scale <= 0.0:
        return np.full(k, centre)
    p = (p + p.T) / (2 * scale)
    if solver == "cvxpy":
        import cvxpy as cp

        lam = cp.Variable(k)
        problem = cp.Problem(
            cp.Minimize(0.5 * cp.quad_form(lam, cp.psd_wrap(p))),
            [cp.sum(lam) == 1, lam >= lo, lam <= hi],
        )
        if "CLARABEL" in cp.installed_solvers():
            problem.solve(solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
        else:
            problem.solve()
        if lam.value is None:
            raise RuntimeError(f"cvxpy could not solve the FedMGDA+ QP: {problem.status}")
        return box_projection(np.asarray(lam.value, dtype=np.float64), lo, hi)
    if solver != "fast":
        raise ValueError(f"solver must be 'fast' or 'cvxpy', got {solver!r}")
    if lo.sum() == 0.0 and hi.min() >= 1.0:  # the box is inactive: the simplex QP
        return min_norm_weights_from_gram(p)
    step = 1.0 / (float(np.linalg.eigvalsh(p)[-1]) * (1.0 + 1e-9) + 1e-300)
    x = box_projection(np.full(k, centre), lo, hi)
    y, t = x.copy(), 1.0
    for _ in range(max_iter):
        x_new = box_projection(y - step * (p @ y), lo, hi)
        if np.max(np.abs(x_new - y)) <= tol and np.max(np.abs(x_new - x)) <= tol:
            x = x_new
            break
        if (y - x_new) @ (x_new - x) > 0:  # gradient restart
            t, y = 1.0, x_new
        else:
            t_new = (1.0 + np.sqrt(1.0 + 4.0 * t * t)) / 2.0
            y = x_new + ((t - 1.0) / t_new) * (x_new - x)
            t = t_new
        x = x_new
    return x


class FedMGDA(PflStrategy):
    """FedMGDA+ (one exchange per round; runs under Flower's ``Strategy.start`` too)."""

    declaration = MethodDeclaration(
        name="fedmgda",
        kind="baseline",
        reference="Hu et al., Federated Learning Meets Multi-objective Optimization, "
        "IEEE TNSE 2022 (FedMGDA+)",
        summary="FedMGDA+: min-norm combination of normalized client updates with λ in an "
        "ε-ball around uniform weights, global learning rate",
        solver="pflarena.methods.fedpg.solver",
        params=FedMGDAParams,
    )

    @classmethod
    def client_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        return local_result(params, federation)

    @classmethod
    def server_footprint(cls, params: Any, federation: Federation) -> list[Footprint]:
        """The round's gradients stacked in float32 for their Gram matrix, and its float64
        chunk, beside the replies."""
        f = federation
        return [
            *super().server_footprint(params, federation),
            *stacked_gram_footprint("the round's gradients", f.sampled, f.model_params),
        ]  # fmt: skip

    @classmethod
    def from_setup(cls, setup: StrategySetup) -> FedMGDA:
        return cls(setup.params, trainable=setup.trainable, **setup.common(cls.declaration))

    def __init__(
        self,
        params: FedMGDAParams | None = None,
        *,
        trainable: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(params, **kwargs)
        self.trainable = list(trainable)
        self._names: list[str] = []
        #: the latest round's weights by client id
        self.last_weights: dict[int, float] = {}

    def train_config(self, server_round: int, node_id: int) -> dict:
        return {
            **super().train_config(server_round, node_id),
            keys.PHASE: fedpg_keys.PHASE_GRADIENTS,
            **self.method_config(
                **{
                    "grad-mode": "pseudo",
                    "keep": False,
                    "personal-model": self.params.personal_model,
                }
            ),
        }

    def _names_of(self, arrays: ArrayRecord) -> list[str]:
        return self.trainable or float_names(arrays)

    def check_train_reply(self, content: RecordDict) -> str | None:
        arrays = self._round_arrays
        reference = ArrayRecord({n: arrays[n] for n in self._names_of(arrays)})
        return array_problem(content, reference, fedpg_keys.GRADIENT)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(replies)
        if not valid:
            return None, None
        arrays = self._round_arrays
        names = self._names_of(arrays)
        # The gradients stacked in their own dtype (float32: one copy of the round's replies),
        # and everything else from their float64 Gram matrix G: the norms are √G_ii, the
        # unit gradients' Gram is G_ij / (‖g_i‖‖g_j‖), and Σ λ_i g_i/‖g_i‖ is summed over
        # column chunks. No float64 copy of the round's gradients, normalised or not.
        dtype = np.result_type(*(np.dtype(arrays[n].dtype) for n in names))
        grads = stack_flat([m.content[fedpg_keys.GRADIENT] for m in valid], names, dtype)
        gram = gram_matrix(grads)
        norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
        kept = np.nonzero(norms > ZERO_GRAD_NORM)[0]
        metrics = self.train_metrics(valid)
        if kept.size == 0:
            return None, metrics
        unit_gram = gram[np.ix_(kept, kept)] / np.outer(norms[kept], norms[kept])
        lam = min_norm_weights_box(unit_gram, self.params.epsilon, solver=self.params.solver)
        coefficients = np.zeros(len(valid))
        coefficients[kept] = lam / norms[kept]
        direction = weighted_rows(coefficients, grads)
        eta = self.params.server_lr * self.params.lr_decay ** (server_round - 1)
        reference = ArrayRecord({n: arrays[n] for n in names})
        step = unflatten(eta * direction, reference, names)
        new = as_numpy(arrays)
        for name in names:
            new[name] = (new[name] - step[name]).astype(new[name].dtype)
        clients = [
            self.client_ids.get(m.metadata.src_node_id, m.metadata.src_node_id) for m in valid
        ]
        self.last_weights = {clients[i]: float(w) for i, w in zip(kept, lam, strict=True)}
        assert metrics is not None
        metrics["step"] = float(eta)
        metrics["direction-norm"] = float(np.linalg.norm(direction))
        metrics["min-weight"] = float(lam.min())
        metrics["max-weight"] = float(lam.max())
        return as_record(new), metrics

    def run_summary(self) -> dict[str, Any]:
        return {
            "epsilon": self.params.epsilon,
            "last_weights": {str(c): w for c, w in self.last_weights.items()},
        }
