"""Local solver for local-only training: the client's own model, never shared.

The reading of the paper, decisions and measurements: docs/methods/local.md.
"""

from __future__ import annotations

from torch import nn

from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core.training import train_epochs

__all__ = ["train", "evaluate", "personalized_model"]

MODEL_KEY = "local/model"


def _own_model(job: ClientJob):
    return job.state_model_or_initial(MODEL_KEY)


def train(job: ClientJob) -> tuple[dict, dict]:
    model = _own_model(job)
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        **job.train_kwargs(),
    )
    job.save_state_model(MODEL_KEY, model)
    return {}, train_metrics(job, loss, steps)


def personalized_model(job: ClientJob) -> nn.Module:
    return _own_model(job)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(_own_model(job)), None)
