"""Local solver for pFedMe (T Dinh et al., NeurIPS 2020, Algorithm 1, client side).

One round on client i, from the received global model w^t:

- the local copy of the global model starts at w_{i,0} = w^t, the personalized model at
  θ = w^t;
- for each local round r (one per minibatch: ``local-epochs`` shuffled passes of
  ``batch-size``): :func:`solve_personalized` runs at most K gradient steps on the
  personalized problem h̃_i(θ) = f̃_i(θ; D) + (λ/2) ‖θ − w_{i,r}‖² on that minibatch D,
  from the previous θ̃ (Eq. 7), stopping early once ‖∇h̃_i‖ ≤ ν; then
  :func:`local_copy_step` moves w_{i,r+1} = w_{i,r} − ηλ (w_{i,r} − θ̃) (Eq. 8);
- the client uploads w_{i,R} and keeps θ̃ as its personalized model.

Reply metrics: ``inner-grad-norm`` (mean over the round's local rounds of ‖∇h̃_i(θ̃)‖ at
the θ̃ used), ``inner-grad-norm-max`` and ``inner-steps-taken`` (mean K actually run).

The reading of the paper, decisions and measurements: docs/methods/pfedme.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from flwr.app import ArrayRecord
from torch import nn
from torch.nn import functional as F

from pflarena.client.common import (
    evaluate_stored_or_global,
    stored_or_global,
    train_metrics,
)
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.training import batches
from pflarena.methods.pfedme import keys as pfedme_keys

__all__ = [
    "PERSONAL_KEY",
    "evaluate",
    "local_copy_step",
    "personalized_gradient",
    "personalized_model",
    "solve_personalized",
    "train",
]

PERSONAL_KEY = "pfedme/personal-model"  # θ_i: the personalized model


def _trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def personalized_gradient(
    model: nn.Module,
    anchor: Sequence[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    lam: float,
) -> tuple[list[torch.Tensor], float]:
    """∇h̃(θ) = ∇f̃(θ; x, y) + λ (θ − anchor) at the model's θ, and f̃(θ) (mean cross-entropy)."""
    params = _trainable(model)
    loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params)
    full = [g + lam * (p.detach() - a) for g, p, a in zip(grads, params, anchor, strict=True)]
    return full, float(loss.detach())


def solve_personalized(
    model: nn.Module,
    anchor: Sequence[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lam: float,
    lr: float,
    steps: int,
    tolerance: float = 0.0,
) -> tuple[int, float, float]:
    """Solve min_θ f̃(θ; x, y) + (λ/2)‖θ − anchor‖² approximately, in place (Eq. 7).

    Gradient descent with step ``lr`` from the model's current θ, at most ``steps`` steps,
    stopping as soon as ‖∇h̃(θ)‖ ≤ ``tolerance``.

    Returns
    -------
    (steps taken, ‖∇h̃(θ̃)‖ at the returned θ̃, f̃(θ̃))
    """
    params = _trainable(model)
    taken = 0
    while True:
        grads, loss = personalized_gradient(model, anchor, x, y, lam)
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
        if norm <= tolerance or taken >= steps:
            return taken, norm, loss
        with torch.no_grad():
            for param, grad in zip(params, grads, strict=True):
                param.sub_(lr * grad)
        taken += 1


def local_copy_step(
    local_copy: Sequence[torch.Tensor], personalized: Sequence[torch.Tensor], lr: float, lam: float
) -> None:
    """Eq. 8, in place: w ← w − ηλ (w − θ̃), a step along ∇F_i(w) = λ (w − θ̂_i(w))."""
    with torch.no_grad():
        for w, theta in zip(local_copy, personalized, strict=True):
            w.sub_(lr * lam * (w - theta))


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = job.global_model()  # θ, starting at w^t
    local_copy = [p.detach().clone() for p in _trainable(model)]  # w_{i,0} = w^t
    lam = float(job.param("lambda"))
    inner_steps = int(job.param("inner-steps"))
    personal_lr = float(job.param("personal-lr"))
    tolerance = float(job.param("inner-tolerance"))
    kwargs = job.train_kwargs()
    x, y = job.data.x_train, job.data.y_train
    generator = job.generator("train")
    model.train()
    losses, norms, taken = [], [], []
    for _ in range(kwargs["epochs"]):
        for idx in batches(len(y), kwargs["batch_size"], generator=generator, device=y.device):
            steps, norm, loss = solve_personalized(
                model,
                local_copy,
                x[idx],
                y[idx],
                lam=lam,
                lr=personal_lr,
                steps=inner_steps,
                tolerance=tolerance,
            )
            local_copy_step(local_copy, [p.detach() for p in _trainable(model)], kwargs["lr"], lam)
            losses.append(loss)
            norms.append(norm)
            taken.append(steps)
    job.save_state_model(PERSONAL_KEY, model)
    upload = model.state_dict()  # the buffers (BatchNorm statistics) from the θ passes
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    for name, w in zip(names, local_copy, strict=True):
        upload[name] = w
    metrics = train_metrics(job, sum(losses) / max(len(losses), 1), len(losses))
    metrics |= {
        pfedme_keys.INNER_GRAD_NORM: float(sum(norms) / max(len(norms), 1)),
        pfedme_keys.INNER_GRAD_NORM_MAX: float(max(norms, default=0.0)),
        pfedme_keys.INNER_STEPS: float(sum(taken) / max(len(taken), 1)),
    }
    return {keys.ARRAYS: state_record(upload)}, metrics


def personalized_model(job: ClientJob) -> nn.Module:
    """θ_i from the client's last round; the global model before its first."""
    return stored_or_global(job, PERSONAL_KEY)


def evaluate(job: ClientJob) -> dict:
    return evaluate_stored_or_global(job, PERSONAL_KEY)
