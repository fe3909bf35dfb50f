"""Local solver for LG-FedAvg (Liang et al., 2020).

Per round: the client's local layers (the body, ``lgfedavg/local-layers``; the run's initial
body at first) under the received global layers (the head) are trained jointly by local
SGD; the local layers are kept, the global layers sent back.
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

__all__ = ["LOCAL_KEY", "evaluate", "personalized_model", "train"]

LOCAL_KEY = "lgfedavg/local-layers"


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    split = model_split(job, int(job.param("global-layers")))
    model = assemble(job, split.head, LOCAL_KEY)
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        **job.train_kwargs(),
    )
    job.state[LOCAL_KEY] = part_record(model, split.body)
    return {keys.ARRAYS: part_record(model, split.head)}, train_metrics(job, loss, steps)


def personalized_model(job: ClientJob) -> nn.Module:
    """This client's local layers under the latest global layers."""
    split = model_split(job, int(job.param("global-layers")))
    return assemble(job, split.head, LOCAL_KEY)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
