"""Local solver for CFL (Sattler et al. 2020, Algorithm 3): local SGD, the weight update back.

A train message carries the client's cluster model θ_c under the model's own names; the
client runs ``local-epochs`` of SGD from it and returns Δθ_i = θ_i − θ_c for every state
entry. An evaluate message carries every cluster model (``cluster.<j>.<name>``) and the
assignment (``cfl.assignment``, a cluster per client id); the client tests its cluster's
model. Nothing is kept on the client.

The reading of the paper, decisions and measurements: docs/methods/cfl.md.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord
from torch import nn

from pflarena.algorithms.canonical import copy_name, parse_stacked
from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.training import train_epochs
from pflarena.methods.cfl import keys as cfl_keys

__all__ = ["evaluate", "personalized_model", "train", "weight_update"]

PREFIX = cfl_keys.CLUSTER_PREFIX  # the strategy's array names (keys.py)


def weight_update(before: dict, after: dict) -> ArrayRecord:
    """Δθ = after − before, entry by entry, in the model's state order and dtypes."""
    return ArrayRecord(
        {
            name: Array(
                np.ascontiguousarray(
                    after[name].detach().cpu().numpy() - before[name].detach().cpu().numpy()
                )
            )
            for name in after
        }
    )


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = job.global_model()
    before = {n: v.detach().clone() for n, v in model.state_dict().items()}
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        **job.train_kwargs(),
    )
    return {keys.ARRAYS: weight_update(before, model.state_dict())}, train_metrics(job, loss, steps)


def personalized_model(job: ClientJob) -> nn.Module:
    """The model of the client's cluster."""
    if job.arrays is None or not len(job.arrays):
        raise RuntimeError("cfl: the message carries no cluster models")
    _, entries, count = parse_stacked(list(job.arrays.keys()), PREFIX)
    assignment = list(job.param("assignment"))
    cluster = int(assignment[job.client_id]) if job.client_id < len(assignment) else 0
    if not 0 <= cluster < count:
        raise RuntimeError(f"cfl: cluster {cluster} of client {job.client_id} is not sent")
    record = ArrayRecord({name: job.arrays[copy_name(PREFIX, cluster, name)] for name in entries})
    return job.model_from(record)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
