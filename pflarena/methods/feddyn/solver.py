"""Local solver for FedDyn (Acar et al., ICLR 2021, Algorithm 1, client side).

One round on client k, from the received θ^{t−1} and the client's stored gradient state
g_k = ∇L_k(θ_k^{t−1}) (zero before its first round):

- θ_k^t ≈ argmin_θ L_k(θ) − ⟨g_k, θ⟩ + (α/2) ‖θ − θ^{t−1}‖², by the run's local training
  from θ^{t−1} (``local-epochs`` of minibatch SGD with its momentum and weight decay) on the
  gradient ∇L_k(θ) − g_k + α (θ − θ^{t−1}) (:func:`regularizer_gradient` adds the last two);
- :func:`gradient_state` g_k ← g_k − α (θ_k^t − θ^{t−1}), written to the client's state
  (kept once the server has used the reply);
- the reply carries θ_k^t (the whole trained model).

Client state: ``feddyn/gradient`` (g_k, over the trainable parameters).

The reading of the paper, decisions and measurements: docs/methods/feddyn.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.training import LossFn, train_epochs

__all__ = [
    "GRADIENT_KEY",
    "evaluate",
    "gradient_state",
    "personalized_model",
    "regularizer_gradient",
    "train",
]

GRADIENT_KEY = "feddyn/gradient"  # ∇L_k(θ_k^{t−1})


def regularizer_gradient(
    theta: torch.Tensor, previous: torch.Tensor, gradient: torch.Tensor, alpha: float
) -> torch.Tensor:
    """∇ of −⟨g_k, θ⟩ + (α/2)‖θ − θ^{t−1}‖²: −g_k + α (θ − θ^{t−1})."""
    return alpha * (theta - previous) - gradient


def gradient_state(
    gradient: Mapping[str, torch.Tensor],
    trained: Mapping[str, torch.Tensor],
    previous: Mapping[str, torch.Tensor],
    alpha: float,
) -> dict[str, torch.Tensor]:
    """∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α (θ_k^t − θ^{t−1})."""
    return {name: gradient[name] - alpha * (trained[name] - previous[name]) for name in gradient}


def _stored_gradient(job: ClientJob, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    record = job.state.get(GRADIENT_KEY)
    if record is None:  # ∇L_k(θ_k^0) = 0 (Algorithm 1's input)
        return {name: torch.zeros_like(value) for name, value in like.items()}
    if list(record.keys()) != list(like):
        raise ValueError(
            f"stored {GRADIENT_KEY} covers {list(record.keys())}, the model's trainable "
            f"parameters are {list(like)}"
        )
    return {name: torch.as_tensor(record[name].numpy()).to(like[name]) for name in like}


def train(job: ClientJob, *, loss_fn: LossFn | None = None) -> tuple[dict[str, ArrayRecord], dict]:
    """One round of Algorithm 1 on this client; ``loss_fn`` replaces the cross-entropy (tests)."""
    alpha = float(job.param("alpha"))
    model = job.global_model()  # starts at θ^{t−1}
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    previous = {name: p.detach().clone() for name, p in params.items()}  # θ^{t−1}
    gradient = _stored_gradient(job, previous)

    def regularized(_: nn.Module) -> None:
        for name, param in params.items():
            if param.grad is not None:
                param.grad.add_(
                    regularizer_gradient(param.detach(), previous[name], gradient[name], alpha)
                )

    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        grad_hook=regularized,
        loss_fn=loss_fn,
        **job.train_kwargs(),
    )
    trained = {name: p.detach() for name, p in params.items()}  # θ_k^t
    new_gradient = gradient_state(gradient, trained, previous, alpha)
    job.state[GRADIENT_KEY] = state_record(new_gradient)
    return {keys.ARRAYS: state_record(model.state_dict())}, train_metrics(job, loss, steps)


def personalized_model(job: ClientJob) -> nn.Module:
    """The global model θ: FedDyn has no other."""
    return job.global_model()


def evaluate(job: ClientJob) -> dict:
    """The global model is both the personalized and the global model."""
    result = job.test_global()
    return eval_metrics(job, result, result)
