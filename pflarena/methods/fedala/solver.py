"""Local solver for FedALA (Zhang et al., AAAI 2023, Algorithm 1, client side).

Per round, from the received global model Θ and the client's local model Θ_i (its trained
model of its previous round):

1. Adaptive local aggregation (skipped at the client's first round, when Θ_i = Θ):
   :func:`higher_layers` picks the trainable parameters of the p highest layers;
   :func:`learn_weights` trains their element-wise weights W ∈ [0, 1] (Eq. 6) on a seeded
   random s % of the training split, with Θ and Θ_i fixed; :func:`aggregate` builds
   Θ̂_i = Θ_i + (Θ − Θ_i) ⊙ [1; W] (Eq. 5).
2. Local training of Θ̂_i (the run's local epochs and SGD settings); the result is the new
   Θ_i, kept as the personalized model and uploaded.

Client state: ``fedala/model`` (Θ_i), ``fedala/weights`` (W, one array per higher
parameter) and ``fedala/started`` (present once the first, long weight training is done).

The reading of the paper, decisions and measurements: docs/methods/fedala.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from pflarena.client.common import (
    evaluate_stored_or_global,
    stored_or_global,
    train_metrics,
)
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.model_split import top_trainable
from pflarena.core.training import batches, train_epochs
from pflarena.methods.fedala import keys as fedala_keys

__all__ = [
    "MODEL_KEY",
    "STARTED_KEY",
    "WEIGHTS_KEY",
    "aggregate",
    "evaluate",
    "higher_layers",
    "learn_weights",
    "personalized_model",
    "train",
]

MODEL_KEY = "fedala/model"
WEIGHTS_KEY = "fedala/weights"
STARTED_KEY = "fedala/started"


def higher_layers(model: nn.Module, layers: int) -> list[str]:
    """Names of the trainable parameters of the ``layers`` highest layers (a layer: the
    trainable parameters of one module, e.g. a weight and its bias), in model order; the
    layers are the body/head split's (``core/model_split.py``)."""
    return top_trainable([name for name, p in model.named_parameters() if p.requires_grad], layers)


def aggregate(
    local: Mapping[str, torch.Tensor],
    global_: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Eq. 5: Θ̂ = Θ_i + (Θ − Θ_i) ⊙ W on the entries ``weights`` names; every other entry
    is the global model's (weight 1)."""
    out = {}
    for name, value in global_.items():
        if name in weights:
            out[name] = local[name] + (value - local[name]) * weights[name]
        else:
            out[name] = value.clone()
    return out


def learn_weights(
    model: nn.Module,
    local: Mapping[str, torch.Tensor],
    global_: Mapping[str, torch.Tensor],
    weights: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    eta: float,
    batch_size: int,
    generator: torch.Generator,
    until_settled: bool,
    threshold: float,
    window: int,
    max_epochs: int,
) -> int:
    """Train the weights in place (Eq. 6); returns the epochs run.

    Each minibatch: the loss of Θ̂ = aggregate(Θ_i, Θ, W) (the model run with those
    parameters), its gradient g with respect to Θ̂'s weighted entries, then
    W ← clip(W − η g ⊙ (Θ − Θ_i), 0, 1). One epoch, or with ``until_settled`` epochs until
    the standard deviation of the last ``window`` epoch losses (each epoch's last minibatch
    loss, as the authors' code records) is below ``threshold``, at most ``max_epochs``.
    """
    fixed = {k: v.detach() for k, v in model.state_dict().items()}
    gaps = {name: (global_[name] - local[name]).detach() for name in weights}
    losses: list[float] = []
    epochs = 0
    model.train()
    while True:
        loss_value = float("nan")
        for idx in batches(len(y), batch_size, generator=generator, device=y.device):
            params = aggregate(local, global_, weights)
            for name in weights:
                params[name] = params[name].detach().requires_grad_(True)
            loss = F.cross_entropy(functional_call(model, {**fixed, **params}, (x[idx],)), y[idx])
            grads = torch.autograd.grad(loss, [params[name] for name in weights])
            with torch.no_grad():
                for name, grad in zip(weights, grads, strict=True):
                    weights[name] = torch.clamp(weights[name] - eta * grad * gaps[name], 0.0, 1.0)
            loss_value = float(loss.detach())
        losses.append(loss_value)
        epochs += 1
        if not until_settled or epochs >= max_epochs:
            return epochs
        if len(losses) > window and float(np.std(losses[-window:])) < threshold:
            return epochs


def _weights(job: ClientJob, names: Sequence[str], like: Mapping[str, torch.Tensor]):
    record = job.state.get(WEIGHTS_KEY)
    if record is None or list(record.keys()) != list(names):
        return {name: torch.ones_like(like[name]) for name in names}
    return {name: torch.as_tensor(record[name].numpy()).to(like[name].device) for name in names}


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = job.global_model()
    ala_epochs, mean_weight = 0, 1.0
    local_model = job.load_state_model(MODEL_KEY)
    if local_model is not None:  # the first round has nothing to aggregate: Θ_i = Θ
        global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        local_state = {k: v.detach().clone() for k, v in local_model.state_dict().items()}
        names = higher_layers(model, int(job.param("layers")))
        weights = _weights(job, names, global_state)
        x, y = job.data.x_train, job.data.y_train
        count = max(1, int(len(y) * int(job.param("rand-percent")) / 100))
        chosen = torch.randperm(len(y), generator=job.generator("ala-sample"))[:count]
        chosen = chosen.to(x.device)
        started = job.state.get(STARTED_KEY) is not None
        ala_epochs = learn_weights(
            model,
            local_state,
            global_state,
            weights,
            x[chosen],
            y[chosen],
            eta=float(job.param("eta")),
            batch_size=int(job.config[keys.BATCH_SIZE]),
            generator=job.generator("ala"),
            until_settled=not started,
            threshold=float(job.param("threshold")),
            window=int(job.param("loss-window")),
            max_epochs=int(job.param("start-max-epochs")),
        )
        model.load_state_dict(aggregate(local_state, global_state, weights))
        job.state[WEIGHTS_KEY] = ArrayRecord(
            {name: Array(weights[name].detach().cpu().numpy()) for name in names}
        )
        job.state[STARTED_KEY] = ArrayRecord({"started": Array(np.ones(1))})
        total = sum(int(w.numel()) for w in weights.values())
        mean_weight = float(sum(float(w.sum()) for w in weights.values()) / max(total, 1))
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        **job.train_kwargs(),
    )
    job.save_state_model(MODEL_KEY, model)
    metrics = train_metrics(job, loss, steps) | {
        fedala_keys.EPOCHS: ala_epochs,
        fedala_keys.MEAN_WEIGHT: mean_weight,
    }
    return {keys.ARRAYS: state_record(model.state_dict())}, metrics


def personalized_model(job: ClientJob) -> nn.Module:
    """Θ_i, the client's trained local model; the global model before its first round."""
    return stored_or_global(job, MODEL_KEY)


def evaluate(job: ClientJob) -> dict:
    return evaluate_stored_or_global(job, MODEL_KEY)
