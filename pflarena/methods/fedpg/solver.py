"""Local solver for FedPG and FedMGDA+: gradients, line-search losses, P-models.

How it runs: docs/methods/fedpg.md; the paper's reading: docs/papers/fedpg.md.

The strategy (``methods/fedpg/strategy.py``) does all the multi-objective math; a client only
answers three kinds of train messages, told apart by ``job.phase``:

``gradients``
    The message carries θ^t. Reply: ``g_i`` over the trainable parameters
    (:data:`~pflarena.methods.fedpg.keys.GRADIENT`) and the training loss ``L_i(θ^t)``
    (``train-loss``). ``grad-mode=full`` (default, docs/papers/fedpg.md §9.1): the exact mean
    gradient of the cross-entropy over the whole training split, accumulated in mini-batches of
    ``batch-size`` (weighted by batch size, so it equals the full-batch gradient), with the
    model in train mode (§9.12). ``grad-mode=pseudo``: ``local-epochs`` of SGD at ``lr`` from
    θ^t and the pseudo-gradient ``(θ^t − θ_E)/lr`` (FedMGDA+ uses this one; with its
    ``personal-model=local-result`` θ_E is stored as the client's P-model). ``L_i`` is
    always the mean training loss at θ^t in eval mode (§9.2, §9.12), so that it is the same
    quantity the line search compares. With ``keep`` (FedPG with personalization or line
    search) θ^t and g_i are kept in the client's state for the round's later exchanges.
``line-search`` (S-FedPG)
    The first trial carries ``d`` (kept in state); each carries a trial step ``η``. Reply:
    ``L_i(θ^t − η d)`` over the training split, eval mode (metric ``fedpg-trial-loss``).
``personalize``
    Carries ``γ_i`` and ``η^t`` (and ``d`` unless a line search sent it). The client builds
    its P-model ``θ_i = θ^t − η^t ((1 − γ_i) d + γ_i g_i)`` (docs/papers/fedpg.md §2.7 in the sign
    convention of ``algorithms/mgda.py``, where ``d`` points up the losses) from the θ^t and g_i
    it kept, and stores it (``<method>/personal-model``). Buffers (none in the MLP/CNN
    models the paper uses) are θ^t's.

``evaluate`` tests the stored P-model (the global model before the client's first
personalization, docs/papers/fedpg.md §9.13) and the global model.

The readings of the papers, decisions and measurements: docs/methods/fedmgda.md and
docs/papers/fedpg.md (FedPG's page: docs/methods/fedpg.md).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn

from pflarena.client.common import eval_metrics, keeps_local_result, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.training import full_gradient, train_epochs, training_loss
from pflarena.methods.fedpg import keys as fedpg_keys

__all__ = [
    "evaluate",
    "personalized_model",
    "pseudo_gradient",
    "train",
]


def _key(job: ClientJob, name: str) -> str:
    return f"{job.method}/{name}"


def _trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def pseudo_gradient(job: ClientJob, model: nn.Module) -> list[torch.Tensor]:
    """``(θ^t − θ_E)/lr`` after ``local-epochs`` of SGD from θ^t (``model`` is trained in place)."""
    start = [p.detach().clone() for _, p in _trainable(model)]
    kwargs = job.train_kwargs()
    train_epochs(
        model, job.data.x_train, job.data.y_train, generator=job.generator("train"), **kwargs
    )
    return [
        (s - p.detach()) / kwargs["lr"] for s, (_, p) in zip(start, _trainable(model), strict=True)
    ]


def _record(names: list[str], tensors: list[torch.Tensor]) -> ArrayRecord:
    return ArrayRecord(
        {
            n: Array(np.ascontiguousarray(t.detach().cpu().numpy()))
            for n, t in zip(names, tensors, strict=True)
        }
    )


def _stepped(job: ClientJob, base: ArrayRecord, step: dict[str, np.ndarray]) -> nn.Module:
    """The model ``base − step`` on the trainable entries (``step`` by name)."""
    model = job.model_from(base)
    with torch.no_grad():
        for name, param in _trainable(model):
            param.sub_(torch.from_numpy(step[name]).to(param.device, param.dtype))
    return model


def _direction(job: ClientJob) -> ArrayRecord:
    record = job.content.array_records.get(fedpg_keys.DIRECTION)
    if record is not None:
        job.state[_key(job, "direction")] = record
        return record
    stored = job.state.get(_key(job, "direction"))
    if stored is None:
        raise RuntimeError("fedpg: no direction in the message nor in this client's state")
    return stored


def _kept(job: ClientJob, name: str) -> ArrayRecord:
    record = job.state.get(_key(job, name))
    if record is None:
        raise RuntimeError(
            f"fedpg: this client holds no {name!r} from the round's gradients exchange"
        )
    return record


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    if job.phase == fedpg_keys.PHASE_GRADIENTS:
        return _gradients(job)
    if job.phase == fedpg_keys.PHASE_LINE_SEARCH:
        return _line_search(job)
    if job.phase == fedpg_keys.PHASE_PERSONALIZE:
        return _personalize(job)
    raise ValueError(f"fedpg: unknown phase {job.phase!r}")


def _gradients(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = job.global_model()
    loss = training_loss(model, job.data.x_train, job.data.y_train)
    names = [n for n, _ in _trainable(model)]
    mode = str(job.param("grad-mode"))
    if mode == "full":
        grads = full_gradient(
            model, job.data.x_train, job.data.y_train, batch_size=int(job.config[keys.BATCH_SIZE])
        )
        steps = 0
    elif mode == "pseudo":
        grads = pseudo_gradient(job, model)
        steps = int(job.config[keys.LOCAL_EPOCHS])
        if keeps_local_result(job):
            job.save_state_model(_key(job, "personal-model"), model)  # θ_E, FedMGDA+'s P-model
    else:
        raise ValueError(f"fedpg: unknown grad-mode {mode!r}")
    record = _record(names, grads)
    if bool(job.param("keep")):
        job.state[_key(job, "round-model")] = job.arrays
        job.state[_key(job, "gradient")] = record
    return {fedpg_keys.GRADIENT: record}, train_metrics(job, loss, steps)


def _line_search(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    direction = _direction(job)
    step = float(job.param("step"))
    moved = _stepped(
        job, _kept(job, "round-model"), {n: step * direction[n].numpy() for n in direction.keys()}
    )
    loss = training_loss(moved, job.data.x_train, job.data.y_train)
    metrics = train_metrics(job, loss, 0)
    metrics[fedpg_keys.TRIAL_LOSS] = loss
    return {}, metrics


def _personalize(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    direction = _direction(job)
    gradient = _kept(job, "gradient")
    gamma = float(job.param("drift-gamma"))
    step = float(job.param("step"))
    drift = {
        n: step * ((1.0 - gamma) * direction[n].numpy() + gamma * gradient[n].numpy())
        for n in direction.keys()
    }
    personal = _stepped(job, _kept(job, "round-model"), drift)
    job.save_state_model(_key(job, "personal-model"), personal)
    metrics = {keys.CLIENT_ID: job.client_id, keys.NUM_EXAMPLES: int(len(job.data.y_train))}
    return {}, metrics


def personalized_model(job: ClientJob) -> nn.Module:
    """The P-model built at the client's latest personalization; the global model before."""
    stored = job.load_state_model(_key(job, "personal-model"))
    return stored if stored is not None else job.global_model()


def evaluate(job: ClientJob) -> dict:
    global_ = job.test_global()
    stored = job.load_state_model(_key(job, "personal-model"))
    personal = global_ if stored is None else job.test(stored)
    return eval_metrics(job, personal, global_)
