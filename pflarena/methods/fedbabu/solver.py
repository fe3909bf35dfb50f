"""Local solver for FedBABU (Oh, Kim and Yun, ICLR 2022).

Training: the received body under the run's initial head (fixed, the same on every client,
so it is neither sent nor stored) is trained by local SGD with the head frozen; the body is
sent back. Evaluation: a copy of that global model is fine-tuned whole (body and head) for
``personal-epochs`` epochs on the training split and evaluated; the copy is discarded.

The reading of the paper, decisions and measurements: docs/methods/fedbabu.md.
"""

from __future__ import annotations

from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.common import (
    assemble,
    eval_metrics,
    fine_tuned,
    model_split,
    part_record,
    train_metrics,
    train_part,
)
from pflarena.client.job import ClientJob
from pflarena.core import keys

__all__ = ["evaluate", "global_model", "personalized_model", "train"]


def global_model(job: ClientJob) -> nn.Module:
    """The received body under the run's initial (random, never trained) head."""
    split = model_split(job, int(job.param("head-layers")))
    return assemble(job, split.body, None)


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    split = model_split(job, int(job.param("head-layers")))
    model = assemble(job, split.body, None)
    loss, steps = train_part(model, split.body, job, "train")
    return {keys.ARRAYS: part_record(model, split.body)}, train_metrics(job, loss, steps)


def personalized_model(job: ClientJob) -> nn.Module:
    """A copy of the global model fine-tuned whole on the local training split (the same
    batches for every call of a round: the generator is seeded by the round)."""
    return fine_tuned(job, global_model(job), default_epochs=5)


def evaluate(job: ClientJob) -> dict:
    """The fine-tuned copy is the personalized model; the un-tuned one the global model."""
    return eval_metrics(job, job.test(personalized_model(job)), job.test(global_model(job)))
