"""Local solver for LG-FedAvg (Liang et al., 2020).

Per round: the client's local layers (the body, ``lgfedavg/local-layers``; the run's initial
body at first) under the received global layers (the head) are trained jointly by local
SGD; the local layers are kept, the global layers sent back.

The reading of the paper, decisions and measurements: docs/methods/lgfedavg.md.
"""

from __future__ import annotations

from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.common import assemble, eval_metrics, model_split, train_jointly
from pflarena.client.job import ClientJob

__all__ = ["LOCAL_KEY", "evaluate", "personalized_model", "train"]

LOCAL_KEY = "lgfedavg/local-layers"


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    split = model_split(job, int(job.param("global-layers")))
    return train_jointly(job, split.head, split.body, LOCAL_KEY)


def personalized_model(job: ClientJob) -> nn.Module:
    """This client's local layers under the latest global layers."""
    split = model_split(job, int(job.param("global-layers")))
    return assemble(job, split.head, LOCAL_KEY)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
