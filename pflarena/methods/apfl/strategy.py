"""APFL (Deng, Kamani and Mahdavi, 2020): a per-client mixture of a local and the global model.

"Adaptive Personalized Federated Learning" (arXiv:2003.13461). Each client keeps a local
model v_i and a mixing weight α_i ∈ [0, 1]; its personalized model is the mixture of
parameters v̄_i = α_i v_i + (1 − α_i) w, where w is the global model. Algorithm 1 (local
descent APFL), at each local step with a minibatch ξ:

- w_i ← w_i − η ∇f_i(w_i; ξ) (the copy of the global model trains as in FedAvg);
- v_i ← v_i − η ∇_v f_i(v̄_i; ξ) = v_i − η α_i ∇f_i(v̄_i; ξ);
- α_i ← α_i − η_α ∇_α f_i(v̄_i; ξ) = α_i − η_α ⟨v_i − w_i, ∇f_i(v̄_i; ξ)⟩, kept in [0, 1]
  (the adaptive α of Sec. 3.3: the derivative of the mixed loss along the segment from w
  to v);

every τ steps (one round) the server averages the clients' w_i into w and sends it back.
Here the three updates of a step are taken at the same point (v_i, w_i, α_i before the
step), with one backward pass at w_i and one at v̄_i.

Decisions (reasons and measurements in ``docs/methods/apfl.md``):

- **Initial α** (``apfl.alpha``) 0.5, adapted (``apfl.adaptive``), as in the authors' code
  (MLOPTPSU/FedTorch, ``--fed_personal_alpha 0.5``, ``--fed_adaptive_alpha``) and the reading
  of the pFedGT paper's APFL baseline (docs/papers/pfedgt.md §7); ``adaptive=false`` keeps it fixed
  (the paper's fixed-α runs).
- **α's step** ``apfl.alpha-lr``: 0 takes the run's ``lr``, the η of the other two updates.
- **The mixture is of parameters**, as the paper defines v̄. The authors' code mixes the
  two models' outputs instead, α v(x) + (1 − α) w(x), which differs for nonlinear models;
  it also updates α once per round with an extra 0.02·α term. The paper's form is built.
- **Evaluation** uses the latest global model the client is sent: v̄_i = α_i v_i +
  (1 − α_i) w^t, as after the paper's synchronisation step (w_i = w).
- **Averaging** (``apfl.weighting``): the paper averages the w_i uniformly; ``examples``
  weights them by training examples.

The reading of the paper, decisions and measurements: docs/methods/apfl.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from pydantic import Field

from pflarena.core import keys
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.apfl import keys as apfl_keys
from pflarena.methods.fedavg.strategy import FedAvg
from pflarena.strategies.aggregation import as_record, weighted_mean

__all__ = ["APFL", "APFLParams"]


class APFLParams(MethodParams):
    """APFL's parameters; the initial α from the authors' code."""

    alpha: float = Field(
        0.5, ge=0, le=1, description="initial mixing weight α_i of v̄ = αv + (1 − α)w"
    )
    adaptive: bool = Field(True, description="learn α_i by gradient steps on the mixed loss")
    alpha_lr: float = Field(0.0, ge=0, description="step size of α_i (0: the run's lr)")
    weighting: Literal["uniform", "examples"] = Field(
        "uniform", description="average of the clients' w_i: 'uniform' (paper) or by examples"
    )


class APFL(FedAvg):
    """APFL: FedAvg on w, a local model v_i and an adaptive mixing weight α_i per client.

    Parameters
    ----------
    Others
        See :class:`APFLParams`.
    """

    declaration = MethodDeclaration(
        name="apfl",
        kind="baseline",
        reference="Deng, Kamani and Mahdavi, Adaptive Personalized Federated Learning, "
        "arXiv:2003.13461, 2020",
        summary="personalized model α_i·v_i + (1−α_i)·w of a local and the global model, "
        "with α_i learned by gradient steps on the mixed loss",
        solver="pflarena.methods.apfl.solver",
        params=APFLParams,
        honours=frozenset({"local-epochs", "batch-size", "lr", "lr-milestones", "lr-gamma"}),
    )
    client_models = (1, "its local model v_i")

    def solver_config(self) -> dict[str, Any]:
        """What the solver reads: α, whether it adapts, and α's step (0: the run's lr)."""
        return self.params_config(exclude={"weighting"}) | self.method_config(
            **{"alpha-lr": self.params.alpha_lr or self.training.lr}
        )

    def train_config(self, server_round: int, node_id: int) -> dict:
        return {**super().train_config(server_round, node_id), **self.solver_config()}

    def evaluate_config(self, server_round: int) -> dict:
        return {**super().evaluate_config(server_round), **self.solver_config()}

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(replies)
        if not valid or self._round_arrays is None:
            return None, None
        metrics = [msg.content[keys.METRICS] for msg in valid]
        weights = (
            [float(m[keys.NUM_EXAMPLES]) for m in metrics]
            if self.params.weighting == "examples"
            else None
        )
        uploads = [msg.content[keys.ARRAYS] for msg in valid]
        average = as_record(weighted_mean(uploads, weights))
        out = self.train_metrics(valid)
        assert out is not None
        alphas = [float(m.get(apfl_keys.ALPHA, float("nan"))) for m in metrics]
        out["mean-alpha"] = float(np.mean(alphas))
        out["min-alpha"] = float(np.min(alphas))
        out["max-alpha"] = float(np.max(alphas))
        return average, out

    def check_train_reply(self, content) -> str | None:
        problem = super().check_train_reply(content)
        if problem is not None:
            return problem
        alpha = content.metric_records[keys.METRICS].get(apfl_keys.ALPHA)
        if not isinstance(alpha, int | float) or not 0.0 <= alpha <= 1.0:
            return f"metric {apfl_keys.ALPHA!r} must be in [0, 1], got {alpha!r}"
        return None

    def run_summary(self) -> dict[str, Any]:
        return self.params.model_dump(by_alias=True) | {
            "alpha-lr": self.params.alpha_lr or self.training.lr
        }
