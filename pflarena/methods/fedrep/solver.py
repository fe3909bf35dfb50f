"""Local solver for FedRep (Collins et al., ICML 2021, Algorithm 1, client side).

Per round, from the received representation φ^t (the body) and the client's head h_i
(``fedrep/head``; the run's initial head at first):

1. ``head-epochs`` epochs of SGD on the head, the representation fixed;
2. ``body-epochs`` epochs of SGD on the representation, the new head fixed;
3. the head is kept, the representation sent back.

The reading of the paper, decisions and measurements: docs/methods/fedrep.md.
"""

from __future__ import annotations

from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.common import (
    assemble,
    eval_metrics,
    model_split,
    part_record,
    train_metrics,
    train_part,
)
from pflarena.client.job import ClientJob
from pflarena.core import keys

__all__ = ["HEAD_KEY", "evaluate", "personalized_model", "train"]

HEAD_KEY = "fedrep/head"


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    split = model_split(job, int(job.param("head-layers")))
    model = assemble(job, split.body, HEAD_KEY)
    head_epochs, body_epochs = int(job.param("head-epochs")), int(job.param("body-epochs"))
    total, steps = 0.0, 0
    for part, epochs, purpose in (
        (split.head, head_epochs, "head"),
        (split.body, body_epochs, "body"),
    ):
        if epochs > 0:
            loss, taken = train_part(model, part, job, purpose, epochs=epochs)
            total, steps = total + loss * taken, steps + taken
    job.state[HEAD_KEY] = part_record(model, split.head)
    metrics = train_metrics(job, total / steps if steps else float("nan"), steps)
    return {keys.ARRAYS: part_record(model, split.body)}, metrics


def personalized_model(job: ClientJob) -> nn.Module:
    """The latest representation with this client's head."""
    split = model_split(job, int(job.param("head-layers")))
    return assemble(job, split.body, HEAD_KEY)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
