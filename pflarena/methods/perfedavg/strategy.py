"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020): federated MAML.

"Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic
Meta-Learning Approach". The federation learns an initial model w that each client adapts
with one step of gradient descent on its own data (Eq. 3)::

    min_w F(w) = (1/n) Σ_i F_i(w),   F_i(w) = f_i(w − α ∇f_i(w))

Algorithm 1 (Per-FedAvg): each sampled client starts from w^t and runs τ local steps of
w ← w − β ∇̃F_i(w), where the stochastic gradient of F_i uses three independent minibatches
D, D', D''::

    ∇̃F_i(w) = (I − α ∇̃²f_i(w, D'')) ∇̃f_i(w − α ∇̃f_i(w, D), D')

and the server averages the returned models. The paper's two efficient versions (Sec. 5):

- **FO** (first order, ``perfedavg.variant=fo``): drop the Hessian term,
  ∇̃F_i(w) ≈ ∇̃f_i(w̃, D') with w̃ = w − α ∇̃f_i(w, D);
- **HF** (Hessian-free, ``hf``): replace the Hessian-vector product by the central
  difference of gradients, with g = ∇̃f_i(w̃, D')::

      ∇̃²f_i(w, D'') g ≈ [∇̃f_i(w + δ g, D'') − ∇̃f_i(w − δ g, D'')] / (2δ)

  (``perfedavg.hvp=finite-difference``; ``autograd`` takes the exact product by double
  backward, the method's Eq. 3 gradient without approximation).

Personalization (the paper's evaluation): a client's personalized model is the global
model after ``personal-steps`` steps of SGD with step α on minibatches of its training
split; the global model is w.

The run's ``lr`` is β (the step that moves the model, FedAvg's learning rate) and
``local-epochs`` × (minibatches per epoch) is τ, so Per-FedAvg takes as many model
updates per round as FedAvg (each consumes two minibatches, three with HF). α = 0.001 and
δ = 0.001 are the paper's experimental settings (Sec. 6); the paper averages the returned
models uniformly (``weighting=uniform``).

The reading of the paper, decisions and measurements: docs/methods/perfedavg.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from flwr.app import ArrayRecord, Message, MetricRecord
from pydantic import Field

from pflarena.core import keys
from pflarena.core.methods import MethodDeclaration, MethodParams
from pflarena.methods.fedavg.strategy import FedAvg
from pflarena.strategies.aggregation import as_record, weighted_mean

__all__ = ["PerFedAvg", "PerFedAvgParams"]


class PerFedAvgParams(MethodParams):
    """Per-FedAvg's parameters; α and δ from the paper's experiments."""

    variant: Literal["fo", "hf"] = Field(
        "hf", description="'fo': first-order gradient; 'hf': Hessian-free (Hessian term kept)"
    )
    alpha: float = Field(
        0.001, gt=0, description="α: the adaptation step of F_i(w) = f_i(w − α∇f_i(w))"
    )
    delta: float = Field(
        0.001, gt=0, description="δ: the finite-difference step of the HF Hessian-vector product"
    )
    hvp: Literal["finite-difference", "autograd"] = Field(
        "finite-difference",
        description="HF's Hessian-vector product: the paper's central difference or the exact "
        "double backward",
    )
    personal_steps: int = Field(
        1, ge=0, description="SGD steps of size α on local minibatches that personalize w"
    )
    weighting: Literal["uniform", "examples"] = Field(
        "uniform", description="average of the returned models: 'uniform' (paper) or by examples"
    )


class PerFedAvg(FedAvg):
    """Per-FedAvg: local MAML steps (FO or HF) and a uniform average of the models.

    Parameters
    ----------
    params
        :class:`PerFedAvgParams` (or the same values as keywords).
    """

    declaration = MethodDeclaration(
        name="perfedavg",
        kind="baseline",
        reference="Fallah, Mokhtari and Ozdaglar, Personalized Federated Learning with "
        "Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach, NeurIPS 2020",
        summary="a MAML initial model (first-order or Hessian-free steps); personalized by "
        "a few local gradient steps of size α",
        solver="pflarena.methods.perfedavg.solver",
        params=PerFedAvgParams,
        honours=frozenset({"local-epochs", "batch-size", "lr", "lr-milestones", "lr-gamma"}),
    )

    def train_config(self, server_round: int, node_id: int) -> dict:
        return {
            **super().train_config(server_round, node_id),
            **self.params_config(exclude={"weighting"}),
        }

    def evaluate_config(self, server_round: int) -> dict:
        # evaluation personalizes: the client needs α, the steps and the batch size
        return {
            **super().evaluate_config(server_round),
            **self.params_config(exclude={"weighting"}),
            **self.training.to_config(server_round),
        }

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = self.valid_train_replies(replies)
        if not valid or self._round_arrays is None:
            return None, None
        uploads = [msg.content[keys.ARRAYS] for msg in valid]
        weights = (
            [float(msg.content[keys.METRICS][keys.NUM_EXAMPLES]) for msg in valid]
            if self.params.weighting == "examples"
            else None
        )
        average = as_record(weighted_mean(uploads, weights))
        return average, self.train_metrics(valid)

    def run_summary(self) -> dict[str, Any]:
        return self.params.model_dump(by_alias=True)
