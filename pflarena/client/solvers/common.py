"""Reply helpers shared by the local solvers."""

from __future__ import annotations

from torch import nn

from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.training import EvalResult

__all__ = ["eval_metrics", "train_metrics", "prox_hook"]


def train_metrics(job: ClientJob, loss: float, steps: int) -> dict:
    return {
        keys.CLIENT_ID: job.client_id,
        keys.NUM_EXAMPLES: int(len(job.data.y_train)),
        keys.TRAIN_LOSS: float(loss),
        keys.TRAIN_STEPS: int(steps),
    }


def eval_metrics(job: ClientJob, personalized: EvalResult, global_: EvalResult | None) -> dict:
    """Evaluation counts; the global entries only where the method has a global model."""
    metrics = {
        keys.CLIENT_ID: job.client_id,
        keys.NUM_EXAMPLES: personalized.count,
        keys.PERSONALIZED_CORRECT: personalized.correct,
        keys.PERSONALIZED_COUNT: personalized.count,
        keys.PERSONALIZED_LOSS_SUM: personalized.loss_sum,
    }
    if global_ is not None:
        metrics |= {
            keys.GLOBAL_CORRECT: global_.correct,
            keys.GLOBAL_COUNT: global_.count,
            keys.GLOBAL_LOSS_SUM: global_.loss_sum,
        }
    return metrics


def prox_hook(anchor: nn.Module, weight: float):
    """A gradient hook adding ``weight * (w - anchor)``: the gradient of (weight/2)||w - anchor||^2."""
    anchor_params = [p.detach().clone() for p in anchor.parameters()]

    def hook(model: nn.Module) -> None:
        for param, ref in zip(model.parameters(), anchor_params, strict=True):
            if param.grad is not None:
                param.grad.add_(param.detach() - ref, alpha=weight)

    return hook
