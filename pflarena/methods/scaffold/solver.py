"""Local solver for SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1, client side).

One round on client i, from the received (x, c) and the client's stored c_i (zeros before
its first round):

- line 7: y_i ← x;
- lines 8–11: K minibatch steps y_i ← y_i − η_l (g_i(y_i) − c_i + c), K = ``local-epochs``
  passes of ``batch-size`` minibatches (the steps actually taken; a partial last minibatch
  is a step); g_i includes the weight decay, part of f_i;
- line 12: c_i⁺ by :func:`option_ii_control` (c_i − c + (x − y_i)/(K η_l)) or, with
  ``scaffold.control-update=I``, :func:`full_gradient` at x (a pass over the training split);
- line 13: the reply carries Δy_i = y_i − x and Δc_i = c_i⁺ − c_i (and the trained model's
  buffers, where it has any); line 14: c_i ← c_i⁺ is written to the client's state, which
  keeps it only once the server has used the reply.

Client state: ``scaffold/control`` (c_i, over the trainable parameters).

The reading of the paper, decisions and measurements: docs/methods/scaffold.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core.training import LossFn, batches, cross_entropy_loss, train_epochs
from pflarena.methods.scaffold import keys as scaffold_keys

__all__ = [
    "CONTROL_KEY",
    "evaluate",
    "full_gradient",
    "option_ii_control",
    "personalized_model",
    "train",
]

CONTROL_KEY = "scaffold/control"  # c_i


def option_ii_control(
    client_control: Mapping[str, torch.Tensor],
    server_control: Mapping[str, torch.Tensor],
    start: Mapping[str, torch.Tensor],
    end: Mapping[str, torch.Tensor],
    *,
    steps: int,
    lr: float,
) -> dict[str, torch.Tensor]:
    """Line 12, option II: c_i⁺ = c_i − c + (x − y_i) / (K η_l), x = ``start``, y_i = ``end``."""
    if steps < 1 or lr <= 0:
        raise ValueError(f"option II needs K >= 1 steps and η_l > 0, got K={steps}, η_l={lr}")
    scale = 1.0 / (steps * lr)
    return {
        name: client_control[name] - server_control[name] + (start[name] - end[name]) * scale
        for name in client_control
    }


def full_gradient(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    weight_decay: float = 0.0,
    loss_fn: LossFn | None = None,
) -> dict[str, torch.Tensor]:
    """Line 12, option I: g_i(x), the gradient of the mean loss over the whole ``(x, y)``
    (minibatch gradients weighted by their sizes) plus the weight decay's ``wd · x``."""
    loss_fn = loss_fn or cross_entropy_loss
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    total = {name: torch.zeros_like(p) for name, p in named}
    model.train()
    for idx in batches(len(y), batch_size, generator=torch.Generator().manual_seed(0)):
        grads = torch.autograd.grad(loss_fn(model, x[idx], y[idx]), [p for _, p in named])
        for (name, _), grad in zip(named, grads, strict=True):
            total[name] += grad * (len(idx) / len(y))
    return {name: total[name] + weight_decay * p.detach() for name, p in named}


def _stored_control(job: ClientJob, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    record = job.state.get(CONTROL_KEY)
    if record is None:  # c_i⁰ = 0
        return {name: torch.zeros_like(value) for name, value in like.items()}
    if list(record.keys()) != list(like):
        raise ValueError(
            f"stored {CONTROL_KEY} covers {list(record.keys())}, the model's trainable "
            f"parameters are {list(like)}"
        )
    return {name: torch.as_tensor(record[name].numpy()).to(like[name]) for name in like}


def train(job: ClientJob, *, loss_fn: LossFn | None = None) -> tuple[dict[str, ArrayRecord], dict]:
    """One round of Algorithm 1 on this client; ``loss_fn`` replaces the cross-entropy (tests)."""
    model = job.global_model()  # line 7: y_i ← x
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    start = {name: p.detach().clone() for name, p in params.items()}  # x
    received = job.content.array_records.get(scaffold_keys.CONTROL)
    if received is None:
        raise ValueError(f"the message has no {scaffold_keys.CONTROL!r} record (the server's c)")
    if list(received.keys()) != list(params):
        raise ValueError(
            f"the server's c covers {list(received.keys())}, the model's trainable parameters "
            f"are {list(params)}"
        )
    server_control = {
        name: torch.as_tensor(received[name].numpy()).to(start[name]) for name in params
    }
    client_control = _stored_control(job, start)
    correction = {name: server_control[name] - client_control[name] for name in params}

    def corrected(_: nn.Module) -> None:  # line 10: g_i(y_i) − c_i + c
        for name, param in params.items():
            if param.grad is not None:
                param.grad.add_(correction[name])

    kwargs = job.train_kwargs()
    if kwargs["momentum"]:
        raise ValueError("scaffold's local steps are plain SGD; the run must not set momentum")
    loss, steps = train_epochs(  # lines 8–11
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        grad_hook=corrected,
        loss_fn=loss_fn,
        **kwargs,
    )
    end = {name: p.detach().clone() for name, p in params.items()}  # y_i
    if steps == 0:  # no training data: nothing moved, c_i stays
        new_control = client_control
    elif str(job.param("control-update")) == "I":
        anchor = job.global_model()  # x, to differentiate at
        new_control = full_gradient(
            anchor,
            job.data.x_train,
            job.data.y_train,
            batch_size=kwargs["batch_size"],
            weight_decay=kwargs["weight_decay"],
            loss_fn=loss_fn,
        )
    else:  # line 12, option II
        new_control = option_ii_control(
            client_control, server_control, start, end, steps=steps, lr=kwargs["lr"]
        )
    job.state[CONTROL_KEY] = ArrayRecord({n: v.detach().cpu() for n, v in new_control.items()})
    # line 13: (Δy_i, Δc_i)
    records = {
        scaffold_keys.DELTA_Y: ArrayRecord({n: (end[n] - start[n]).cpu() for n in params}),
        scaffold_keys.DELTA_C: ArrayRecord(
            {n: (new_control[n] - client_control[n]).detach().cpu() for n in params}
        ),
    }
    buffers = {n: v for n, v in model.state_dict().items() if n not in params}
    if buffers:
        records[scaffold_keys.BUFFERS] = ArrayRecord(buffers)
    return records, train_metrics(job, loss, steps)


def personalized_model(job: ClientJob) -> nn.Module:
    """The global model x: SCAFFOLD has no other."""
    return job.global_model()


def evaluate(job: ClientJob) -> dict:
    """The global model is both the personalized and the global model."""
    result = job.test_global()
    return eval_metrics(job, result, result)
