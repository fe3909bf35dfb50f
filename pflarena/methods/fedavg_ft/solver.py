"""Local solver for FedAvg-FT (Wang et al., 2019): FedAvg's training, fine-tuned evaluation.

At evaluation the client fine-tunes a copy of the global model on its training split and
evaluates that copy; the copy is discarded, so fine-tuning never feeds back into training.

The reading of the paper, decisions and measurements: docs/methods/fedavg-ft.md.
"""

from __future__ import annotations

from torch import nn

from pflarena.client.common import eval_metrics, fine_tuned
from pflarena.client.job import ClientJob
from pflarena.methods.fedavg.solver import train

__all__ = ["train", "evaluate", "personalized_model"]


def personalized_model(job: ClientJob) -> nn.Module:
    """A copy of the global model fine-tuned on the local training split (the same batches
    for every call of a round: the generator is seeded by the round)."""
    return fine_tuned(job, job.global_model(), default_epochs=1)


def evaluate(job: ClientJob) -> dict:
    """Fine-tune a copy of the global model locally, evaluate it; report the global model too."""
    return eval_metrics(job, job.test(personalized_model(job)), job.test_global())
