"""Local solver for Fed-ROD (Chen and Chao, ICLR 2022): a generic head trained with the
balanced-softmax loss, and a personalized head on its residual.

The model the server sends is the shared body θ with the generic head ψ. For every
minibatch (Algorithm 1 of the paper, as its Section 4 and Figure 2 describe it):

1. one forward pass gives the body's features ``z = f(x; θ)`` and the generic logits
   ``g = h^G(z; ψ)``; θ and ψ take an SGD step on the balanced-softmax loss (Eq. 5 with the
   class counts ``N_{m,c}`` of this client's training split, :func:`balanced_softmax_loss`);
2. the personalized head φ_m takes an SGD step on the ordinary cross-entropy of the
   combined logits ``g + h^P(z; φ_m)``, with ``z`` and ``g`` held fixed: φ_m learns the
   residual of the generic predictor, and the personal loss reaches neither θ nor ψ.

θ and ψ are returned for averaging (FedAvg); φ_m stays in the client's state
(``fedrod/personal-head``) and never leaves it. φ_m has the generic head's layers and starts
from the run's initial head. The personalized prediction is ``g + h^P(z; φ_m)``; the global
model is θ with ψ.

The reading of the paper, decisions and measurements: docs/methods/fedrod.md.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord
from torch import nn
from torch.nn import functional as F

from pflarena.algorithms.heads import first_head_layer, head_forward, head_input
from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.client.solvers import SolverError
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.model_split import split_state
from pflarena.core.training import EvalResult, batches
from pflarena.methods.fedrod import keys as fedrod_keys

__all__ = [
    "balanced_softmax_loss",
    "class_counts",
    "evaluate",
    "personalized_logits",
    "personalized_model",
    "train",
]

PERSONAL_KEY = "fedrod/personal-head"


def class_counts(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``N_{m,c}``: how many training samples of each class the client holds (float)."""
    return torch.bincount(y, minlength=num_classes).to(torch.float64)


def balanced_softmax_loss(
    logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """The balanced-softmax loss (Fed-ROD Eq. 5; Ren et al., 2020), averaged over the batch::

        ℓ(x, y) = −log( N_y^γ e^{g_y} / Σ_c N_c^γ e^{g_c} )

    ``counts`` holds ``N_c``, the client's number of training samples of class c. A class the
    client does not hold (``N_c = 0``) has ``N_c^γ = 0`` for γ > 0 and drops out of the sum;
    γ = 0 gives the plain cross-entropy.
    """
    counts = counts.to(device=logits.device, dtype=logits.dtype)
    if gamma == 0:
        return F.cross_entropy(logits, y)
    shift = torch.where(counts > 0, gamma * torch.log(counts), torch.full_like(counts, -torch.inf))
    return F.cross_entropy(logits + shift, y)


def _head_layers(job: ClientJob) -> int:
    return int(job.param("head-layers"))


def _personal_head(job: ClientJob, model: nn.Module, head: tuple[str, ...]) -> dict:
    """φ_m from this client's state; on first use the run's initial head (a client whose
    state is lost starts from the received generic head)."""
    record = job.state.get(PERSONAL_KEY)
    if record is not None:
        stored = record.to_torch_state_dict()
        return {name: stored[name].to(job.device) for name in head}
    source = model if job.state.missing else job.new_model()
    state = source.state_dict()
    personal = {name: state[name].detach().clone() for name in head}
    if str(job.param("personal-init")) == "zero":
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        for name in head:
            if name in trainable:
                personal[name].zero_()
    return personal


def personalized_logits(
    model: nn.Module, layer: str, personal: Mapping[str, torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """``h^G(z) + h^P(z)``: the generic and the personalized head on the same features."""
    with head_input(model, layer) as seen:
        generic = model(x)
    return generic + head_forward(model, layer, x, seen[-1], personal)


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = job.global_model()
    head_layers = _head_layers(job)
    layer = first_head_layer(model, head_layers)
    head = split_state(model, head_layers).head
    personal = _personal_head(job, model, head)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    leaves = [
        personal[name].requires_grad_(True) for name in head if name in trainable
    ]  # φ_m's parameters; its buffers (if any) are updated in place
    kwargs = job.train_kwargs()
    sgd = {k: kwargs[k] for k in ("lr", "momentum", "weight_decay")}
    generic_optimizer = torch.optim.SGD(model.parameters(), **sgd)
    personal_optimizer = torch.optim.SGD(leaves, **sgd)
    counts = class_counts(job.data.y_train, job.data.info.num_classes)
    gamma = float(job.param("gamma"))
    x, y = job.data.x_train, job.data.y_train
    generator = job.generator("train")
    model.train()
    generic_total = personal_total = 0.0
    steps = 0
    for _ in range(kwargs["epochs"]):
        for idx in batches(len(y), kwargs["batch_size"], generator=generator, device=y.device):
            xb, yb = x[idx], y[idx]
            with head_input(model, layer) as seen:
                generic = model(xb)
            features = seen[-1].detach()
            loss = balanced_softmax_loss(generic, yb, counts, gamma)
            generic_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            generic_optimizer.step()
            residual = head_forward(model, layer, xb, features, personal)
            personal_loss = F.cross_entropy(generic.detach() + residual, yb)
            personal_optimizer.zero_grad(set_to_none=True)
            personal_loss.backward()
            personal_optimizer.step()
            generic_total += float(loss.detach())
            personal_total += float(personal_loss.detach())
            steps += 1
    job.state[PERSONAL_KEY] = state_record({name: personal[name].detach() for name in head})
    metrics = train_metrics(job, generic_total / steps if steps else float("nan"), steps)
    metrics[fedrod_keys.PERSONAL_LOSS] = personal_total / steps if steps else float("nan")
    return {keys.ARRAYS: state_record(model.state_dict())}, metrics


@torch.no_grad()
def _test_personalized(job: ClientJob, model: nn.Module, layer: str, personal: dict) -> EvalResult:
    model.eval()
    x, y = job.data.x_test, job.data.y_test
    loss_sum, correct = 0.0, 0
    for start in range(0, len(y), 512):
        logits = personalized_logits(model, layer, personal, x[start : start + 512])
        target = y[start : start + 512]
        loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(dim=1) == target).sum())
    return EvalResult(loss_sum=loss_sum, correct=correct, count=len(y))


def evaluate(job: ClientJob) -> dict:
    """The personalized prediction ``g + h^P`` and the generic model (θ, ψ)."""
    model = job.global_model()
    head_layers = _head_layers(job)
    layer = first_head_layer(model, head_layers)
    personal = _personal_head(job, model, split_state(model, head_layers).head)
    return eval_metrics(job, _test_personalized(job, model, layer, personal), job.test(model))


def personalized_model(job: ClientJob) -> nn.Module:
    """The personalized predictor as one model of the run's architecture, where it is one.

    With a one-layer linear head, ``h^G(z) + h^P(z) = (W_G + W_P) z + (b_G + b_P)``: the
    model with the summed head. A deeper head has no such form, and is refused.
    """
    model = job.global_model()
    head_layers = _head_layers(job)
    layer = first_head_layer(model, head_layers)
    if head_layers != 1 or not isinstance(model.get_submodule(layer), nn.Linear):
        raise SolverError(
            "fedrod's personalized predictor is a model of the run's architecture only with "
            "a one-layer linear head (fedrod.head-layers=1): it cannot be cross-evaluated"
        )
    head = split_state(model, head_layers).head
    personal = _personal_head(job, model, head)
    combined = copy.deepcopy(model)
    state = combined.state_dict()
    combined.load_state_dict({**state, **{n: state[n] + personal[n] for n in head}})
    return combined
