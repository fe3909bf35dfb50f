"""Local solver for FedRecon (Singhal et al., NeurIPS 2021, Algorithm 1): local parameters
reconstructed from scratch every round, never kept and never sent.

The model is split into global parameters g (the body, which the server sends) and local
parameters l (the head: the last ``head-layers`` weighted layers). For a train message:

1. the client's training split gives a support set D_s and a query set D_q
   (:func:`support_query`: with ``support-fraction`` 1, the default, both are the whole
   split; below 1, a fixed seeded division of it into two disjoint sets);
2. **reconstruction**: l starts afresh (:func:`initial_local`: a new draw from the layers'
   own initialisation, seeded by run, client and round, or the run's initial values), then
   ``reconstruction-epochs`` epochs of SGD on D_s update l with g frozen;
3. **global update**: ``local-epochs`` epochs of SGD on D_q update g with l frozen;
4. the reply holds g only; l is discarded with the model. Nothing is written to the
   client's state: a client is stateless across rounds, as the paper's cross-device setting
   requires.

Evaluation reconstructs l the same way on the whole training split (the support) and tests
the model (g, l) on the test split (the query); that model is the personalized one. There
is no global model: g alone makes no prediction.

The reading of the paper, decisions and measurements: docs/methods/fedrecon.md.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord
from torch import nn

from pflarena.algorithms.heads import reset_layers
from pflarena.client.common import (
    assemble,
    eval_metrics,
    model_split,
    part_record,
    train_metrics,
)
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.model_split import ModelSplit, weighted_layers
from pflarena.core.seeds import AGENT_SEED_BITS, derive_seed
from pflarena.core.training import train_epochs

__all__ = [
    "evaluate",
    "initial_local",
    "personalized_model",
    "reconstruct",
    "support_query",
    "train",
]


def support_query(
    n: int, fraction: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the support and the query set of ``n`` samples.

    ``fraction`` = 1: both are every sample. Otherwise a random ``round(fraction·n)``
    samples (at least one, and at least one left over when ``n`` > 1) form the support and
    the rest the query: two disjoint sets.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"the support fraction must be in (0, 1], got {fraction}")
    every = torch.arange(n)
    if fraction == 1.0 or n < 2:
        return every, every
    size = min(max(round(fraction * n), 1), n - 1)
    order = torch.randperm(n, generator=generator)
    return order[:size].sort().values, order[size:].sort().values


def _split(job: ClientJob) -> tuple[ModelSplit, list[str]]:
    """The split, and the weighted layers forming the local part."""
    head_layers = int(job.param("head-layers"))
    return model_split(job, head_layers), weighted_layers(job.new_model())[-head_layers:]


def initial_local(job: ClientJob, model: nn.Module, layers: list[str]) -> None:
    """Start the local layers afresh for this message (``local-init``): ``fresh`` draws new
    values from each layer's initialisation, seeded by (run seed, client, round); ``initial``
    keeps the run's initial values (the model is built from them)."""
    if str(job.param("local-init")) == "fresh":
        seed = derive_seed(
            job.cfg.seed, job.client_id, job.server_round, "reconstruct", bits=AGENT_SEED_BITS
        )
        reset_layers(model, layers, seed)


def _train_only(model: nn.Module, names: set[str]) -> None:
    """Let only the parameters named in ``names`` receive gradients."""
    for name, param in model.named_parameters():
        param.requires_grad_(name in names)


def reconstruct(
    job: ClientJob, model: nn.Module, split: ModelSplit, layers: list[str], x, y
) -> tuple[float, int]:
    """Reconstruction: the local layers afresh, then SGD on them alone over ``(x, y)``."""
    initial_local(job, model, layers)
    _train_only(model, set(split.head))
    kwargs = job.train_kwargs()
    recon_lr = float(job.param("reconstruction-lr")) or kwargs["lr"]
    epochs = int(job.param("reconstruction-epochs"))
    if epochs == 0 or len(y) == 0:
        return float("nan"), 0
    return train_epochs(
        model,
        x,
        y,
        generator=job.generator("reconstruct"),
        **(kwargs | {"epochs": epochs, "lr": recon_lr}),
    )


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    split, layers = _split(job)
    model = assemble(job, split.body, None)  # the local part: the run's initial values
    generator = torch.Generator().manual_seed(
        derive_seed(job.cfg.seed, job.client_id, "support", bits=AGENT_SEED_BITS)
    )
    support, query = support_query(
        len(job.data.y_train), float(job.param("support-fraction")), generator
    )
    x, y = job.data.x_train, job.data.y_train
    reconstruct(job, model, split, layers, x[support], y[support])
    _train_only(model, set(split.body))
    loss, steps = train_epochs(
        model, x[query], y[query], generator=job.generator("train"), **job.train_kwargs()
    )
    metrics = train_metrics(job, loss, steps)
    metrics[keys.NUM_EXAMPLES] = int(len(query))  # the examples that updated g
    return {keys.ARRAYS: part_record(model, split.body)}, metrics


def personalized_model(job: ClientJob) -> nn.Module:
    """The received global part with local layers reconstructed on the training split."""
    split, layers = _split(job)
    model = assemble(job, split.body, None)
    reconstruct(job, model, split, layers, job.data.x_train, job.data.y_train)
    return model


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
