"""Local solver for FedPer (Arivazhagan et al., 2019).

Per round: the received base layers (the body) with the client's own personalization layers
(the head, ``fedper/head``; the run's initial head at first) are trained jointly by local SGD;
the head is kept, the body is sent back.
"""

from __future__ import annotations

from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.job import ClientJob
from pflarena.client.solvers.common import (
    assemble,
    eval_metrics,
    model_split,
    part_record,
    train_metrics,
)
from pflarena.core import keys
from pflarena.core.training import train_epochs

__all__ = ["HEAD_KEY", "evaluate", "personalized_model", "train"]

HEAD_KEY = "fedper/head"


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    split = model_split(job, int(job.param("head-layers")))
    model = assemble(job, split.body, HEAD_KEY)
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        **job.train_kwargs(),
    )
    job.state[HEAD_KEY] = part_record(model, split.head)
    return {keys.ARRAYS: part_record(model, split.body)}, train_metrics(job, loss, steps)


def personalized_model(job: ClientJob) -> nn.Module:
    """The latest body with this client's head."""
    split = model_split(job, int(job.param("head-layers")))
    return assemble(job, split.body, HEAD_KEY)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
