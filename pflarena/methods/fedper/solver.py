"""Local solver for FedPer (Arivazhagan et al., 2019).

Per round: the received base layers (the body) with the client's own personalization layers
(the head, ``fedper/head``; the run's initial head at first) are trained jointly by local SGD;
the head is kept, the body is sent back.

The reading of the paper, decisions and measurements: docs/methods/fedper.md.
"""

from __future__ import annotations

from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.common import assemble, eval_metrics, model_split, train_jointly
from pflarena.client.job import ClientJob

__all__ = ["HEAD_KEY", "evaluate", "personalized_model", "train"]

HEAD_KEY = "fedper/head"


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    split = model_split(job, int(job.param("head-layers")))
    return train_jointly(job, split.body, split.head, HEAD_KEY)


def personalized_model(job: ClientJob) -> nn.Module:
    """The latest body with this client's head."""
    split = model_split(job, int(job.param("head-layers")))
    return assemble(job, split.body, HEAD_KEY)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
