"""Local solver for FedAvg-FT (Wang et al., 2019): FedAvg's training, fine-tuned evaluation.

At evaluation the client fine-tunes a copy of the global model on its training split and
evaluates that copy; the copy is discarded, so fine-tuning never feeds back into training.
"""

from __future__ import annotations

import copy

from pflarena.client.job import ClientJob
from pflarena.client.solvers.common import eval_metrics
from pflarena.client.solvers.fedavg import train
from pflarena.core import keys
from pflarena.core.training import train_epochs

__all__ = ["train", "evaluate"]


def evaluate(job: ClientJob) -> dict:
    """Fine-tune a copy of the global model locally, evaluate it; report the global model too."""
    global_model = job.global_model()
    tuned = copy.deepcopy(global_model)
    epochs = int(job.config.get(keys.PERSONAL_EPOCHS, 1))
    if epochs > 0:
        train_epochs(
            tuned,
            job.data.x_train,
            job.data.y_train,
            generator=job.generator("finetune"),
            **(job.train_kwargs() | {"epochs": epochs}),
        )
    return eval_metrics(job, job.test(tuned), job.test(global_model))
