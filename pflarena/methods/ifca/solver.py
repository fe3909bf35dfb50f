"""Local solver for IFCA (Ghosh et al. 2020, Algorithm 1): cluster estimate, then local work.

The message carries the k cluster models (a stacked state, ``cluster.<j>.<name>``). The
client estimates its cluster ``ĵ = argmin_j F_i(θ_j)`` with its mean training loss (eval
mode, ties to the lowest j), then either runs local SGD on θ_ĵ and returns it (Option II,
model averaging) or returns ``∇F_i(θ_ĵ)`` over its training split (Option I), with ĵ in the
metrics. Evaluation tests the cluster model it would choose now.

The reading of the paper, decisions and measurements: docs/methods/ifca.md.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn

from pflarena.algorithms.canonical import copy_name, parse_stacked
from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.training import full_gradient, train_epochs, training_loss
from pflarena.methods.ifca import keys as ifca_keys

__all__ = ["cluster_models", "estimate_cluster", "evaluate", "personalized_model", "train"]

PREFIX = ifca_keys.CLUSTER_PREFIX  # the strategy's array names (keys.py)


def cluster_models(job: ClientJob) -> list[nn.Module]:
    """The k cluster models of the message, each as the run's architecture."""
    if job.arrays is None or not len(job.arrays):
        raise RuntimeError("ifca: the message carries no cluster models")
    _, entries, count = parse_stacked(list(job.arrays.keys()), PREFIX)
    models = []
    for cluster in range(count):
        record = ArrayRecord(
            {name: job.arrays[copy_name(PREFIX, cluster, name)] for name in entries}
        )
        models.append(job.model_from(record))
    return models


def estimate_cluster(
    models: list[nn.Module], x: torch.Tensor, y: torch.Tensor
) -> tuple[int, list[float]]:
    """``(ĵ, [F_i(θ_j)])``: the cluster whose model has the lowest mean training loss."""
    losses = [training_loss(model, x, y) for model in models]
    return int(np.argmin(losses)), losses


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    models = cluster_models(job)
    cluster, losses = estimate_cluster(models, job.data.x_train, job.data.y_train)
    model = models[cluster]
    if str(job.param("averaging")) == "gradient":
        grads = full_gradient(
            model, job.data.x_train, job.data.y_train, batch_size=int(job.config[keys.BATCH_SIZE])
        )
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        by_name = dict(zip(names, grads, strict=True))
        record = ArrayRecord(
            {
                n: Array(
                    np.ascontiguousarray(
                        (by_name[n] if n in by_name else torch.zeros_like(v)).detach().cpu().numpy()
                    )
                )
                for n, v in model.state_dict().items()
            }
        )
        metrics = train_metrics(job, losses[cluster], 0)
    else:
        loss, steps = train_epochs(
            model,
            job.data.x_train,
            job.data.y_train,
            generator=job.generator("train"),
            **job.train_kwargs(),
        )
        record = state_record(model.state_dict())
        metrics = train_metrics(job, loss, steps)
    metrics[ifca_keys.CLUSTER] = cluster
    return {keys.ARRAYS: record}, metrics


def personalized_model(job: ClientJob) -> nn.Module:
    """The cluster model with the lowest loss on this client's training split."""
    models = cluster_models(job)
    cluster, _ = estimate_cluster(models, job.data.x_train, job.data.y_train)
    return models[cluster]


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
