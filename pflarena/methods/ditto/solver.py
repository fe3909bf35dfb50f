"""Local solver for Ditto (Li et al., 2021, Algorithm 1).

Per round: (1) the global-model update, plain local SGD from the received ``w^t`` (sent
back for averaging); (2) the personal update, SGD on ``f_i(v) + (lambda/2)||v - w^t||^2``
starting from the client's stored ``v_i`` (initially ``w^0``).

The reading of the paper, decisions and measurements: docs/methods/ditto.md.
"""

from __future__ import annotations

from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.common import eval_metrics, prox_hook, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.training import train_epochs

__all__ = ["train", "evaluate", "personalized_model"]

PERSONAL_KEY = "ditto/personal-model"


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    received = job.global_model()
    personal = job.state_model_or_initial(PERSONAL_KEY)
    kwargs = job.train_kwargs()
    personal_epochs = int(job.param("personal-epochs"))
    if personal_epochs > 0:
        train_epochs(
            personal,
            job.data.x_train,
            job.data.y_train,
            generator=job.generator("personal"),
            # `received` is trained only after this: the anchor needs no copy
            grad_hook=prox_hook(received, float(job.param("lambda")), copy=False),
            **(kwargs | {"epochs": personal_epochs}),
        )
    job.save_state_model(PERSONAL_KEY, personal)
    # The global update starts from the received model; `received` is trained in place.
    loss, steps = train_epochs(
        received, job.data.x_train, job.data.y_train, generator=job.generator("train"), **kwargs
    )
    return {keys.ARRAYS: state_record(received.state_dict())}, train_metrics(job, loss, steps)


def personalized_model(job: ClientJob) -> nn.Module:
    """The personal model v_i."""
    return job.state_model_or_initial(PERSONAL_KEY)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), job.test_global())
