"""Local solver for FedAvg, FedProx and FedAvg-FT: SGD from the global model.

FedProx adds the proximal gradient ``mu (w - w_global)`` (Li et al., 2020, Eq. 2);
FedAvg-FT fine-tunes a copy of the global model before evaluating it (Wang et al., 2019).
"""

from __future__ import annotations

import copy

from flwr.app import ArrayRecord

from pflarena.client.job import ClientJob
from pflarena.client.solvers.common import eval_metrics, prox_hook, train_metrics
from pflarena.core import keys
from pflarena.core.training import train_epochs

__all__ = ["train", "evaluate", "evaluate_finetuned"]


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = job.global_model()
    mu = float(job.config.get(keys.PROXIMAL_MU, 0.0))
    hook = prox_hook(model, mu) if mu > 0 else None
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        grad_hook=hook,
        **job.train_kwargs(),
    )
    return {keys.ARRAYS: ArrayRecord(model.state_dict())}, train_metrics(job, loss, steps)


def evaluate(job: ClientJob) -> dict:
    """The global model is both the personalized and the global model."""
    result = job.test(job.global_model())
    return eval_metrics(job, result, result)


def evaluate_finetuned(job: ClientJob) -> dict:
    """Fine-tune a copy of the global model locally, evaluate it; report the global model too."""
    global_model = job.global_model()
    tuned = copy.deepcopy(global_model)
    epochs = int(job.config.get(keys.PERSONAL_EPOCHS, 1))
    if epochs > 0:
        train_epochs(
            tuned,
            job.data.x_train,
            job.data.y_train,
            epochs=epochs,
            batch_size=int(job.config[keys.BATCH_SIZE]),
            lr=float(job.config[keys.LR]),
            generator=job.generator("finetune"),
        )
    return eval_metrics(job, job.test(tuned), job.test(global_model))
