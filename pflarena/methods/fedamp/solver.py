"""Local solver for FedAMP (Huang et al., AAAI 2021): the clients' proximal step.

The message carries the client's personalized cloud model u_i (built by the server's
attentive message passing). The client approximately solves

    w_i = argmin_w F_i(w) + (λ / (2α_k)) ‖w − u_i‖²

by ``local-epochs`` of minibatch SGD with the proximal gradient (λ/α_k)(w − u_i) added,
starting from u_i (``fedamp.start=cloud``) or from its previous w_i (``own``). It keeps w_i
as its personalized model and uploads it.

The reading of the paper, decisions and measurements: docs/methods/fedamp.md.
"""

from __future__ import annotations

from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.common import eval_metrics, prox_hook, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.training import train_epochs

__all__ = ["MODEL_KEY", "evaluate", "personalized_model", "train"]

MODEL_KEY = "fedamp/model"  # w_i


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    cloud = job.global_model()  # u_i
    start = str(job.param("start"))
    if start == "cloud":
        model = job.model_from(job.arrays)
    elif start == "own":
        model = job.state_model_or_initial(MODEL_KEY)
    else:
        raise ValueError(f"fedamp.start must be 'cloud' or 'own', got {start!r}")
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        grad_hook=prox_hook(cloud, float(job.param("proximal")), copy=False),  # never trained
        **job.train_kwargs(),
    )
    job.save_state_model(MODEL_KEY, model)
    return {keys.ARRAYS: state_record(model.state_dict())}, train_metrics(job, loss, steps)


def personalized_model(job: ClientJob) -> nn.Module:
    """w_i from the client's last round; the run's initial model before its first."""
    return job.state_model_or_initial(MODEL_KEY)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
