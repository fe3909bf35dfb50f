"""Local solver for APFL (Deng et al., 2020, Algorithm 1, client side).

Per minibatch ξ (``local-epochs`` shuffled passes of ``batch-size``), with w the client's copy
of the global model, v its local model and α its mixing weight (:func:`apfl_step`):

    g_w = ∇f(w; ξ)                       one backward pass at w
    g   = ∇f(v̄; ξ),  v̄ = α v + (1 − α) w  one backward pass at the mixture
    w ← w − η g_w
    v ← v − η α g                        (∇_v f(v̄) = α ∇f(v̄))
    α ← clip(α − η_α ⟨v − w, g⟩, 0, 1)    (∇_α f(v̄) = ⟨v − w, ∇f(v̄)⟩; :func:`alpha_gradient`)

The client uploads w and keeps v and α (state ``apfl/local-model``, ``apfl/alpha``). Its
personalized model is α v + (1 − α) w^t with the latest global model w^t it was sent.

The reading of the paper, decisions and measurements: docs/methods/apfl.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.training import batches
from pflarena.methods.apfl import keys as apfl_keys

__all__ = [
    "ALPHA_KEY",
    "LOCAL_KEY",
    "alpha_gradient",
    "apfl_step",
    "evaluate",
    "mixed_state",
    "personalized_model",
    "train",
]

LOCAL_KEY = "apfl/local-model"  # v_i
ALPHA_KEY = "apfl/alpha"  # α_i, one float64


def _named_trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def mixed_state(local: nn.Module, global_: nn.Module, alpha: float) -> dict[str, torch.Tensor]:
    """α v + (1 − α) w on the trainable parameters (detached)."""
    w = _named_trainable(global_)
    return {
        name: (alpha * v.detach() + (1.0 - alpha) * w[name].detach())
        for name, v in _named_trainable(local).items()
    }


def alpha_gradient(
    local: Sequence[torch.Tensor],
    global_: Sequence[torch.Tensor],
    mixed_grad: Sequence[torch.Tensor],
) -> float:
    """∂/∂α f(α v + (1 − α) w) = ⟨v − w, ∇f(v̄)⟩, by the chain rule."""
    return float(
        sum(((v - w) * g).sum() for v, w, g in zip(local, global_, mixed_grad, strict=True))
    )


def apfl_step(
    local: nn.Module,
    global_: nn.Module,
    alpha: float,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lr: float,
    alpha_lr: float,
    adaptive: bool,
) -> tuple[float, float, float]:
    """One APFL step on (x, y), in place on both models; returns (new α, f(w), f(v̄))."""
    w_params = _named_trainable(global_)
    v_params = _named_trainable(local)
    loss_w = F.cross_entropy(global_(x), y)
    grad_w = torch.autograd.grad(loss_w, list(w_params.values()))
    mixture = {
        name: (alpha * v.detach() + (1.0 - alpha) * w_params[name].detach()).requires_grad_(True)
        for name, v in v_params.items()
    }
    loss_mixed = F.cross_entropy(functional_call(local, mixture, (x,)), y)
    grad_mixed = torch.autograd.grad(loss_mixed, list(mixture.values()))
    new_alpha = alpha
    if adaptive:
        slope = alpha_gradient(
            [v.detach() for v in v_params.values()],
            [w.detach() for w in w_params.values()],
            grad_mixed,
        )
        new_alpha = float(np.clip(alpha - alpha_lr * slope, 0.0, 1.0))
    with torch.no_grad():
        for v, g in zip(v_params.values(), grad_mixed, strict=True):
            v.sub_(lr * alpha * g)
        for w, g in zip(w_params.values(), grad_w, strict=True):
            w.sub_(lr * g)
    return new_alpha, float(loss_w.detach()), float(loss_mixed.detach())


def _alpha(job: ClientJob) -> float:
    record = job.state.get(ALPHA_KEY)
    if record is None:
        return float(job.param("alpha"))
    return float(record["alpha"].numpy()[0])


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    global_ = job.global_model()  # w_i, starting at w^t
    local = job.state_model_or_initial(LOCAL_KEY)  # v_i
    alpha = _alpha(job)
    kwargs = job.train_kwargs()
    alpha_lr = float(job.param("alpha-lr"))
    adaptive = bool(job.param("adaptive"))
    x, y = job.data.x_train, job.data.y_train
    generator = job.generator("train")
    global_.train()
    local.train()
    losses, mixed_losses = [], []
    for _ in range(kwargs["epochs"]):
        for idx in batches(len(y), kwargs["batch_size"], generator=generator, device=y.device):
            alpha, loss, mixed = apfl_step(
                local,
                global_,
                alpha,
                x[idx],
                y[idx],
                lr=kwargs["lr"],
                alpha_lr=alpha_lr,
                adaptive=adaptive,
            )
            losses.append(loss)
            mixed_losses.append(mixed)
    job.save_state_model(LOCAL_KEY, local)
    job.state[ALPHA_KEY] = ArrayRecord({"alpha": Array(np.array([alpha], dtype=np.float64))})
    metrics = train_metrics(job, sum(losses) / max(len(losses), 1), len(losses))
    metrics |= {
        apfl_keys.ALPHA: alpha,
        apfl_keys.MIXED_LOSS: sum(mixed_losses) / max(len(mixed_losses), 1),
    }
    return {keys.ARRAYS: state_record(global_.state_dict())}, metrics


def personalized_model(job: ClientJob) -> nn.Module:
    """v̄_i = α_i v_i + (1 − α_i) w^t (buffers, e.g. BatchNorm statistics, are v_i's)."""
    local = job.state_model_or_initial(LOCAL_KEY)
    mixed = mixed_state(local, job.global_model(), _alpha(job))
    with torch.no_grad():
        for name, param in _named_trainable(local).items():
            param.copy_(mixed[name])
    return local


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), job.test_global())
