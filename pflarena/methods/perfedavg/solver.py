"""Local solver for Per-FedAvg (Fallah et al., NeurIPS 2020, Algorithm 1 and Sec. 5).

One local step from w, on three minibatches D, D', D'' drawn in turn from shuffled passes
over the training split (:func:`meta_step`)::

    w̃ = w − α ∇f(w, D)                      (the adaptation step inside F_i)
    g = ∇f(w̃, D')
    FO: w ← w − β g
    HF: w ← w − β (g − α ∇²f(w, D'') g)      (Hessian-vector product by
                                              :func:`hvp_finite_difference` or
                                              :func:`hvp_autograd`)

τ = ``local-epochs`` × (minibatches per epoch) steps per round; β is the run's ``lr``. The
personalized model is the received model after ``personal-steps`` SGD steps of size α
(:func:`personalize`).

The reading of the paper, decisions and measurements: docs/methods/perfedavg.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from flwr.app import ArrayRecord
from torch import nn
from torch.nn import functional as F

from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.training import batches

__all__ = [
    "batch_stream",
    "evaluate",
    "hvp_autograd",
    "hvp_finite_difference",
    "loss_gradient",
    "meta_step",
    "personalize",
    "personalized_model",
    "train",
]


def _trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def loss_gradient(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> tuple[list[torch.Tensor], float]:
    """∇f(w; x, y) of the mean cross-entropy at the model's w, and f."""
    loss = F.cross_entropy(model(x), y)
    return list(torch.autograd.grad(loss, _trainable(model))), float(loss.detach())


def hvp_finite_difference(
    model: nn.Module,
    vector: Sequence[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    delta: float,
) -> list[torch.Tensor]:
    """∇²f(w; x, y) v ≈ [∇f(w + δv) − ∇f(w − δv)] / (2δ) (the paper's HF product); the
    model's parameters are restored afterwards."""
    params = _trainable(model)
    original = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p, v in zip(params, vector, strict=True):
                p.add_(delta * v)
        plus, _ = loss_gradient(model, x, y)
        with torch.no_grad():
            for p, w, v in zip(params, original, vector, strict=True):
                p.copy_(w - delta * v)
        minus, _ = loss_gradient(model, x, y)
    finally:
        with torch.no_grad():
            for p, w in zip(params, original, strict=True):
                p.copy_(w)
    return [(a - b) / (2.0 * delta) for a, b in zip(plus, minus, strict=True)]


def hvp_autograd(
    model: nn.Module, vector: Sequence[torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> list[torch.Tensor]:
    """∇²f(w; x, y) v exactly, by differentiating ⟨∇f(w), v⟩ (double backward)."""
    params = _trainable(model)
    loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    inner = sum((g * v.detach()).sum() for g, v in zip(grads, vector, strict=True))
    return [h.detach() for h in torch.autograd.grad(inner, params)]


def batch_stream(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Minibatch indices from one shuffled pass after another, without end."""
    while True:
        yield from batches(n, batch_size, generator=generator)


def meta_step(
    model: nn.Module,
    stream: Iterator[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    alpha: float,
    beta: float,
    variant: str,
    hvp: str = "finite-difference",
    delta: float = 0.001,
) -> float:
    """One Per-FedAvg local step on the model, in place; returns f(w̃, D')."""
    params = _trainable(model)
    start = [p.detach().clone() for p in params]
    first = next(stream)
    gradient, _ = loss_gradient(model, x[first], y[first])
    with torch.no_grad():
        for p, g in zip(params, gradient, strict=True):
            p.sub_(alpha * g)  # w̃ = w − α ∇f(w, D)
    second = next(stream)
    outer, loss = loss_gradient(model, x[second], y[second])  # g = ∇f(w̃, D')
    with torch.no_grad():
        for p, w in zip(params, start, strict=True):
            p.copy_(w)
    if variant == "hf":
        third = next(stream)
        if hvp == "autograd":
            product = hvp_autograd(model, outer, x[third], y[third])
        else:
            product = hvp_finite_difference(model, outer, x[third], y[third], delta)
        outer = [g - alpha * h for g, h in zip(outer, product, strict=True)]
    elif variant != "fo":
        raise ValueError(f"variant must be 'fo' or 'hf', got {variant!r}")
    with torch.no_grad():
        for p, g in zip(params, outer, strict=True):
            p.sub_(beta * g)
    return loss


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = job.global_model()
    kwargs = job.train_kwargs()
    n, batch_size = len(job.data.y_train), kwargs["batch_size"]
    steps = kwargs["epochs"] * -(-n // batch_size)
    stream = batch_stream(n, batch_size, job.generator("train"))
    model.train()
    losses = [
        meta_step(
            model,
            stream,
            job.data.x_train,
            job.data.y_train,
            alpha=float(job.param("alpha")),
            beta=kwargs["lr"],
            variant=str(job.param("variant")),
            hvp=str(job.param("hvp")),
            delta=float(job.param("delta")),
        )
        for _ in range(steps)
    ]
    loss = sum(losses) / max(len(losses), 1)
    return {keys.ARRAYS: state_record(model.state_dict())}, train_metrics(job, loss, len(losses))


def personalize(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    alpha: float,
    steps: int,
    batch_size: int,
    generator: torch.Generator,
) -> nn.Module:
    """``steps`` SGD steps of size α on minibatches of (x, y), in place."""
    model.train()
    stream = batch_stream(len(y), batch_size, generator)
    for _ in range(steps):
        idx = next(stream)
        gradient, _ = loss_gradient(model, x[idx], y[idx])
        with torch.no_grad():
            for p, g in zip(_trainable(model), gradient, strict=True):
                p.sub_(alpha * g)
    return model


def personalized_model(job: ClientJob) -> nn.Module:
    """The global model adapted by ``personal-steps`` steps of size α on the training split
    (the same minibatches for every call of a round)."""
    return personalize(
        job.global_model(),
        job.data.x_train,
        job.data.y_train,
        alpha=float(job.param("alpha")),
        steps=int(job.param("personal-steps")),
        batch_size=int(job.config[keys.BATCH_SIZE]),
        generator=job.generator("personalize"),
    )


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), job.test_global())
