"""Local solver for pFedGT: Algorithm 2 (ClientUpdate) and the c⁰ round.

The paper's reading: docs/papers/pfedgt.md §3.

The math is in :func:`corrected_gradient` and :func:`local_solve`, which work on any list of
parameter tensors and any gradient oracle, so the theory tests run them on quadratic games;
:func:`train` wires them to a model and this client's data.

Client state (persistent across rounds): the personalized model w_i (full state, buffers
included) and the stored message c_i (the one last uploaded, over the trainable parameters).
The BatchNorm running statistics in w_i are the client's own: local training starts from θ's
trainable parameters and the client's own statistics (:func:`start_model`,
docs/papers/pfedgt.md §9.14).

How it runs: docs/methods/pfedgt.md; the reading of the paper, decisions and measurements:
docs/papers/pfedgt.md.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn
from torch.nn import functional as F

from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.training import batches
from pflarena.methods.pfedgt import keys as pfedgt_keys

__all__ = [
    "GameWeights",
    "corrected_gradient",
    "local_solve",
    "full_gradient",
    "train",
    "evaluate",
    "personalized_model",
    "start_model",
    "PERSONAL_KEY",
    "MESSAGE_KEY",
]

PERSONAL_KEY = "pfedgt/personal-model"
MESSAGE_KEY = "pfedgt/message"

Tensors = list[torch.Tensor]


@dataclass(frozen=True)
class GameWeights:
    """User i's coefficients in Eq. 7: a = 1−γ_i on (c − c_i), b = (1−γ_i)/m on (c_i − c_i^t)."""

    gamma: float
    mu: float
    rho: float
    num_users: int

    @property
    def a(self) -> float:
        return 1.0 - self.gamma

    @property
    def b(self) -> float:
        return (1.0 - self.gamma) / self.num_users


def corrected_gradient(
    g: torch.Tensor,
    w: torch.Tensor,
    c_server: torch.Tensor,
    c_local: torch.Tensor,
    c_stored: torch.Tensor,
    *,
    a: float,
    b: float,
    rho: float,
) -> torch.Tensor:
    """Eq. 7: ``∇G_i = ∇f_i(w) + (1−γ_i)(c − c_i) + ((1−γ_i)/m)(c_i − c_i^t) + ρ w``.

    ``c_local`` is the message at the local iterate (one step stale in Algorithm 2) and
    ``c_stored`` the one this user last uploaded, which is the copy inside ``c_server``.
    """
    return g + a * (c_server - c_local) + b * (c_local - c_stored) + rho * w


def local_solve(
    params: Tensors,
    batch_gradients: Iterable[Callable[[], Tensors]],
    *,
    c_server: Tensors,
    c_stored: Tensors,
    weights: GameWeights,
    lr: float,
    variant: str = "paper",
    message_init: str = "server",
    full_grad: Callable[[], Tensors] | None = None,
) -> Tensors:
    """Run ClientUpdate's SGD on ``params`` in place and return the new message c_i.

    Parameters
    ----------
    batch_gradients
        One callable per local step; each returns ∇f_i on that step's minibatch at the
        current ``params``.
    variant
        ``"paper"`` (Algorithm 2 as written): step with the previous step's message, then
        ``c_i ← g − μ w`` with the step's gradient g and the updated w
        (docs/papers/pfedgt.md §9.3); the returned c_i is that of the last minibatch.
        ``"exact"``: step with the message at the current iterate (an unbiased step on ∇G_i),
        and return ``∇f_i(w) − μ w`` from ``full_grad`` at the final w.
    message_init
        The local message starts as c (``"server"``, the paper's choice) or as the stored
        c_i (``"stored"``).
    """
    if variant not in ("paper", "exact"):
        raise ValueError(f"variant must be 'paper' or 'exact', got {variant!r}")
    if variant == "exact" and full_grad is None:
        raise ValueError("the exact variant needs full_grad for the returned message")
    a, b, mu, rho = weights.a, weights.b, weights.mu, weights.rho
    start = c_server if message_init == "server" else c_stored
    c_local = [c.clone() for c in start]
    for gradient in batch_gradients:
        g = gradient()
        with torch.no_grad():
            if variant == "exact":
                c_local = [gi - mu * w for gi, w in zip(g, params, strict=True)]
            for w, gi, cs, cl, ci in zip(params, g, c_server, c_local, c_stored, strict=True):
                w.add_(corrected_gradient(gi, w, cs, cl, ci, a=a, b=b, rho=rho), alpha=-lr)
            if variant == "paper":
                c_local = [gi - mu * w for gi, w in zip(g, params, strict=True)]
    if variant == "exact":
        grads = full_grad()
        with torch.no_grad():
            c_local = [gi - mu * w for gi, w in zip(grads, params, strict=True)]
    return c_local


def full_gradient(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, chunk: int = 1024
) -> Tensors:
    """∇f_i: the gradient of the mean cross-entropy over all of ``(x, y)``.

    Computed in eval mode, so BatchNorm uses (and does not update) its running statistics.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    was_training = model.training
    model.eval()
    total = [torch.zeros_like(p) for p in params]
    for start in range(0, len(y), chunk):
        loss = F.cross_entropy(
            model(x[start : start + chunk]), y[start : start + chunk], reduction="sum"
        )
        for acc, g in zip(total, torch.autograd.grad(loss, params), strict=True):
            acc.add_(g)
    model.train(was_training)
    return [t / len(y) for t in total]


def _module_gradients(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    losses: list[float],
) -> Iterator[Callable[[], Tensors]]:
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(epochs):
        for idx in batches(len(y), batch_size, generator=generator, device=y.device):

            def gradient(idx: torch.Tensor = idx) -> Tensors:
                model.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x[idx]), y[idx])
                loss.backward()
                losses.append(float(loss.detach()))
                return [p.grad for p in params]

            yield gradient


def _trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def _record(names: list[str], tensors: Tensors) -> ArrayRecord:
    return ArrayRecord(
        {n: Array(t.detach().cpu().numpy()) for n, t in zip(names, tensors, strict=True)}
    )


def _tensors(record: ArrayRecord, names: list[str], device: torch.device) -> Tensors:
    return [torch.from_numpy(np.array(record[n].numpy(), copy=True)).to(device) for n in names]


def start_model(
    theta: nn.Module, personal: nn.Module, *, warm_start: str, buffers: str = "personal"
) -> nn.Module:
    """The model Algorithm 2 trains (its line 1), a new module.

    Its trainable parameters are θ's (``warm_start="theta"``, the paper) or the client's own
    w_i's (``"personal"``). Its other state, the BatchNorm running statistics, is the
    client's own (``buffers="personal"``, docs/papers/pfedgt.md §9.14 and PFLlib, which copies only
    ``parameters()`` into a client's model) or θ's, the mean of the last participants'
    (``"theta"``). With the client's own statistics, each client's w_i keeps statistics its own
    local training produced, and θ's averaged ones serve only to evaluate θ as a global model.
    """
    for name, value in (("warm_start", warm_start), ("buffers", buffers)):
        if value not in ("theta", "personal"):
            raise ValueError(f"{name} must be 'theta' or 'personal', got {value!r}")
    params_from = theta if warm_start == "theta" else personal
    model = copy.deepcopy(personal if buffers == "personal" else theta)
    trainable = {name for name, _ in _trainable(model)}
    state = model.state_dict()
    model.load_state_dict(
        {
            name: value if name in trainable else state[name]
            for name, value in params_from.state_dict().items()
        }
    )
    return model


def _init_phase(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    """c_i⁰ = ∇f_i(θ⁰) − μθ⁰ over the full training set; w_i⁰ = θ⁰ (docs/papers/pfedgt.md §3.2)."""
    theta = job.global_model()
    mu = float(job.param("mu"))
    names = [n for n, _ in _trainable(theta)]
    params = [p for _, p in _trainable(theta)]
    grads = full_gradient(theta, job.data.x_train, job.data.y_train)
    with torch.no_grad():
        message = [g - mu * w for g, w in zip(grads, params, strict=True)]
    record = _record(names, message)
    job.state[MESSAGE_KEY] = record
    if PERSONAL_KEY not in job.state:
        job.save_state_model(PERSONAL_KEY, theta)
    # no training happened: no loss to report (and a NaN metric would be rejected)
    metrics = train_metrics(job, 0.0, 0)
    del metrics[keys.TRAIN_LOSS]
    return {pfedgt_keys.MESSAGE: record}, metrics


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    if job.config.get(keys.PHASE) == keys.PHASE_INIT:
        return _init_phase(job)
    weights = GameWeights(
        gamma=float(job.param("gamma")),
        mu=float(job.param("mu")),
        rho=float(job.param("rho")),
        num_users=int(job.param("num-users")),
    )
    theta = job.global_model()
    personal = job.state_model_or_initial(PERSONAL_KEY)  # w_i^t (θ⁰ if never trained)
    model = start_model(
        theta,
        personal,
        warm_start=str(job.param("warm-start")),
        buffers=str(job.param("start-buffers")),
    )
    names = [n for n, _ in _trainable(model)]
    params = [p for _, p in _trainable(model)]
    c_server = _tensors(job.content.array_records[pfedgt_keys.MESSAGE], names, job.device)
    c_stored = (
        _tensors(job.state[MESSAGE_KEY], names, job.device)
        if MESSAGE_KEY in job.state
        else [torch.zeros_like(p) for p in params]
    )
    losses: list[float] = []
    model.train()
    kwargs = job.train_kwargs()
    c_new = local_solve(
        params,
        _module_gradients(
            model,
            job.data.x_train,
            job.data.y_train,
            epochs=kwargs["epochs"],
            batch_size=kwargs["batch_size"],
            generator=job.generator("train"),
            losses=losses,
        ),
        c_server=c_server,
        c_stored=c_stored,
        weights=weights,
        lr=kwargs["lr"],
        variant=str(job.param("variant")),
        message_init=str(job.param("message-init")),
        full_grad=lambda: full_gradient(model, job.data.x_train, job.data.y_train),
    )
    reference = dict(_trainable(personal if job.param("delta-ref") == "personal" else theta))
    with torch.no_grad():
        delta_w = [p - reference[n] for n, p in zip(names, params, strict=True)]
        delta_c = [cn - cs for cn, cs in zip(c_new, c_stored, strict=True)]
    job.save_state_model(PERSONAL_KEY, model)
    job.state[MESSAGE_KEY] = _record(names, c_new)
    records = {
        pfedgt_keys.DELTA_W: _record(names, delta_w),
        pfedgt_keys.DELTA_C: _record(names, delta_c),
    }
    buffers = {k: v for k, v in model.state_dict().items() if k not in set(names)}
    if buffers:
        records[pfedgt_keys.BUFFERS] = ArrayRecord(buffers)
    mean_loss = float(np.mean(losses)) if losses else float("nan")
    return records, train_metrics(job, mean_loss, len(losses))


def personalized_model(job: ClientJob) -> nn.Module:
    """w_i (θ⁰ for a client never sampled)."""
    return job.state_model_or_initial(PERSONAL_KEY)


def evaluate(job: ClientJob) -> dict:
    """Personalized: w_i; global: θ (the paper's "GM")."""
    return eval_metrics(job, job.test(personalized_model(job)), job.test_global())
