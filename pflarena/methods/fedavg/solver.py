"""Local solver for FedAvg and FedProx: SGD from the global model.

FedProx adds the proximal gradient ``mu (w - w_global)`` (Li et al., 2020, Eq. 2).

With ``<method>.personal-model=local-result`` the client keeps the model it returns in its
state (``<method>/local-result``) and reports it as its personalized model: the FedPG
paper's P-model for FedAvg and FedProx (docs/papers/fedpg.md §5.4). Otherwise the personalized
model is the global model.

The readings of the papers, decisions and measurements: docs/methods/fedavg.md and
docs/methods/fedprox.md.
"""

from __future__ import annotations

from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.common import (
    evaluate_stored_or_global,
    keeps_local_result,
    local_result_key,
    prox_hook,
    stored_or_global,
    train_metrics,
)
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.training import LossFn, train_epochs

__all__ = ["evaluate", "personalized_model", "train"]


def train(job: ClientJob, *, loss_fn: LossFn | None = None) -> tuple[dict[str, ArrayRecord], dict]:
    """Local SGD from the global model; ``loss_fn`` replaces the cross-entropy (tests)."""
    model = job.global_model()
    mu = float(job.config.get(f"{job.method}.mu", 0.0))  # FedProx's μ (FedAvg sends none)
    hook = prox_hook(model, mu) if mu > 0 else None
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        grad_hook=hook,
        loss_fn=loss_fn,
        **job.train_kwargs(),
    )
    if keeps_local_result(job):
        job.save_state_model(local_result_key(job), model)
    return {keys.ARRAYS: state_record(model.state_dict())}, train_metrics(job, loss, steps)


def personalized_model(job: ClientJob) -> nn.Module:
    """The kept local-training result if the run keeps one, else the global model."""
    return stored_or_global(job, local_result_key(job))


def evaluate(job: ClientJob) -> dict:
    """The personalized model (:func:`personalized_model`) and the global model."""
    return evaluate_stored_or_global(job, local_result_key(job))
