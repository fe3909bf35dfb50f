"""Framework-free training and evaluation loops shared by every local solver.

Client data is small enough to live in memory as tensors, so batches are cut from a
seeded permutation instead of going through a ``DataLoader`` (which would cost a worker
or a collate call per batch and dominate the time of small models). On a GPU the data stay
on the device across a client's epochs (:mod:`pflarena.client.job` moves a shard there
once per process): the permutation is drawn on the CPU, as on the CPU (the same batches
everywhere), and copied to the device once per pass, and the losses are summed on the
device and read once per call, so a step waits for the GPU only where a method needs a
value on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "EvalResult",
    "GradHook",
    "LossFn",
    "batches",
    "cross_entropy_loss",
    "evaluate",
    "full_gradient",
    "get_state",
    "set_state",
    "state_vector",
    "train_epochs",
    "trainable_names",
    "training_loss",
]

#: Called after ``loss.backward()`` and before the optimizer step, to add terms to the
#: gradients (a proximal pull, a message correction). Gets the model.
GradHook = Callable[[nn.Module], None]

#: The loss of a model on one minibatch, ``loss_fn(model, x, y)`` (a scalar tensor).
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def warm_optimizers() -> None:
    """One SGD-with-momentum and one Adam step (with a state round trip) on a scalar: what a
    process's first ``torch.optim`` call imports lazily (``torch._dynamo``, ~1.5 s) is then
    imported. A parent that forks ClientApp children (the warm executor, the in-process
    engine's workers) calls it once, so that no child pays it."""
    import torch._dynamo  # noqa: F401 - imported lazily by the first torch.optim call

    parameter = nn.Parameter(torch.zeros(1))
    parameter.grad = torch.zeros(1)
    for optimizer in (
        torch.optim.SGD([parameter], lr=0.1, momentum=0.9),
        torch.optim.Adam([parameter]),
    ):
        optimizer.step()
        optimizer.zero_grad()
        optimizer.load_state_dict(optimizer.state_dict())


def cross_entropy_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``model`` on ``(x, y)``: the training loss of every solver."""
    return F.cross_entropy(model(x), y)


@dataclass(frozen=True)
class EvalResult:
    """Sums over a test set, so results from several clients add up exactly."""

    loss_sum: float
    correct: int
    count: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else float("nan")

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count if self.count else float("nan")


def batches(
    n: int,
    batch_size: int,
    *,
    generator: torch.Generator,
    drop_last: bool = False,
    device: torch.device | None = None,
) -> Iterator[torch.Tensor]:
    """Yield index tensors of one shuffled pass over ``n`` samples, on ``device`` (the
    data's: one copy per pass instead of one per batch) if given. The order is drawn from
    ``generator`` on the CPU, so it is the same on every device."""
    order = torch.randperm(n, generator=generator)
    if device is not None and order.device != torch.device(device):
        order = order.to(device)
    stop = n - n % batch_size if drop_last and n >= batch_size else n
    for start in range(0, stop, batch_size):
        yield order[start : start + batch_size]


def train_epochs(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    grad_hook: GradHook | None = None,
    max_steps: int | None = None,
    loss_fn: LossFn | None = None,
) -> tuple[float, int]:
    """Minibatch SGD on mean cross-entropy (or ``loss_fn``) for ``epochs`` passes over ``(x, y)``.

    ``loss_fn`` replaces the cross-entropy; tests use it to train on objectives whose
    minimiser is known in closed form.

    Returns
    -------
    (mean training loss over the steps taken, number of steps)
    """
    model.train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
    )
    # Summed in float64 one loss after another: the Python float sum this replaced, without
    # waiting for the device at every step.
    total = torch.zeros((), dtype=torch.float64, device=y.device)
    steps = 0
    for _ in range(epochs):
        for idx in batches(len(y), batch_size, generator=generator, device=y.device):
            optimizer.zero_grad(set_to_none=True)
            loss = (loss_fn or cross_entropy_loss)(model, x[idx], y[idx])
            loss.backward()
            if grad_hook is not None:
                grad_hook(model)
            optimizer.step()
            total += loss.detach().to(torch.float64)
            steps += 1
            if max_steps is not None and steps >= max_steps:
                return float(total) / steps, steps
    return (float(total) / steps if steps else float("nan")), steps


@torch.no_grad()
def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 512
) -> EvalResult:
    """Cross-entropy loss sum and correct-prediction count of ``model`` on ``(x, y)``."""
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=y.device)
    correct = torch.zeros((), dtype=torch.int64, device=y.device)
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss_sum += F.cross_entropy(logits, target, reduction="sum").to(torch.float64)
        correct += (logits.argmax(dim=1) == target).sum()
    return EvalResult(loss_sum=float(loss_sum), correct=int(correct), count=len(y))


def full_gradient(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int
) -> list[torch.Tensor]:
    """``∇ (1/N) Σ_j ℓ(model(x_j), y_j)`` over the trainable parameters, in train mode.

    Accumulated over consecutive mini-batches of ``batch_size`` (summed losses, divided by
    N once), so it is the exact full-batch gradient for models without batch statistics.
    """
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    n = len(y)
    for start in range(0, n, batch_size):
        loss = F.cross_entropy(
            model(x[start : start + batch_size]), y[start : start + batch_size], reduction="sum"
        )
        for acc, grad in zip(total, torch.autograd.grad(loss, params), strict=True):
            acc.add_(grad)
    return [t / max(n, 1) for t in total]


def training_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cross-entropy over ``(x, y)`` in eval mode (FedPG's ``L_i`` of the fair
    objective, IFCA's cluster estimate)."""
    result = evaluate(model, x, y)
    return result.loss_sum / max(result.count, 1)


def get_state(model: nn.Module) -> dict[str, np.ndarray]:
    """The model's ``state_dict`` (parameters and buffers) as numpy arrays, in order."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def set_state(model: nn.Module, state: dict[str, np.ndarray]) -> None:
    """Load numpy arrays produced by :func:`get_state` (same keys, shapes)."""
    own = model.state_dict()
    missing = set(own) - set(state)
    unexpected = set(state) - set(own)
    if missing or unexpected:
        raise ValueError(
            f"model state mismatch: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )
    for key, value in state.items():
        if tuple(value.shape) != tuple(own[key].shape):
            raise ValueError(
                f"model state mismatch for {key!r}: expected shape {tuple(own[key].shape)}, "
                f"got {tuple(value.shape)}"
            )
    model.load_state_dict(
        {k: torch.as_tensor(np.asarray(v)).to(own[k].dtype) for k, v in state.items()}
    )


def trainable_names(model: nn.Module) -> list[str]:
    """Names of the ``state_dict`` entries that are trainable parameters (no buffers)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def state_vector(state: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    """Concatenate the named entries of a state into one float64 vector."""
    return np.concatenate([state[k].astype(np.float64).ravel() for k in names])
