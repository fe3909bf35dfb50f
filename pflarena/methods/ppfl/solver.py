"""Local solver for PPFL: canonical-model SGD, membership gradients and steps.

How it runs: docs/methods/ppfl.md; the paper's reading: docs/papers/ppfl.md.

The server (``methods/ppfl/strategy.py``) holds θ (the trunk and the K canonical models, a stacked
state: :mod:`pflarena.algorithms.canonical`) and every client's membership c_i; each train message
carries θ and the client's c_i (ArrayRecord ``membership``). The client keeps the latest
c_i it was given or computed in its state (``ppfl/membership``), which is what its
evaluation and its exported personalized model use. The messages, told apart by
``job.phase``:

``affinity``
    Reply: the label histogram of the training split (``label-counts``) and ``n_i``. Sent
    only when the run builds W from label histograms (``ppfl.affinity``).
``theta`` (the θ-block, Eq. 11 / Algorithm 3)
    Local SGD on θ (trunk and every canonical model) with c_i fixed, for ``local-epochs``
    epochs or ``ppfl.local-steps`` steps. Reply: the trained θ and ``f_i(θ^t, c_i^t)``.
``membership-gradient`` (the C-block of Algorithm 1)
    Reply: ``∇_c f_i(θ^t, c_i^t)`` (``membership-gradient``): over the whole training split
    (``membership-steps=full``, σ₂ = 0 as the theory wants, §9.9) or one minibatch.
``membership`` (Algorithm 1's synchronisation)
    The server's new c_i, stored.
``membership-steps`` (the authors' code, after the θ-block)
    At θ^{t+1}: exponentiated-gradient steps on c_i with the server's penalty row π_i and
    weight w_i: one per minibatch for an epoch (``epoch``, the code), one full-gradient step
    (``full``) or one minibatch step. Reply: the new c_i.
``alternate`` (Algorithm 2)
    One such c_i step at θ^t, then the θ-block's SGD with the new c_i. Reply: θ and c_i.

Every step is :func:`~pflarena.methods.ppfl.population.exponentiated_gradient_step` on
``G = w_i ∇_c f_i + π_i`` (Eq. 14-15; ``w_i = p_i`` with the paper's scaling, 1 with the
normalized one, π_i from the server).

The reading of the paper, decisions and measurements: docs/papers/ppfl.md.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord
from torch import nn

from pflarena.algorithms.canonical import CanonicalModel, PersonalizedModel
from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import decode, torch_state
from pflarena.core.training import batches
from pflarena.methods.ppfl import keys as ppfl_keys
from pflarena.methods.ppfl.population import exponentiated_gradient_step, log_sum_exp

__all__ = [
    "evaluate",
    "membership_gradient",
    "membership_steps",
    "personalized_model",
    "table_loss",
    "table_loss_and_gradient",
    "train",
    "train_theta",
]

PREFIX = ppfl_keys.CANONICAL_PREFIX  # the stacked state's copy prefix (keys.py)


def _key(job: ClientJob, name: str) -> str:
    return f"{job.method}/{name}"


def _vector_record(**vectors: np.ndarray) -> ArrayRecord:
    return ArrayRecord(
        {
            n: Array(np.ascontiguousarray(np.asarray(v, dtype=np.float64)))
            for n, v in vectors.items()
        }
    )


def population_model(job: ClientJob) -> CanonicalModel:
    """θ from the message as a :class:`CanonicalModel` over this run's architecture."""
    if job.arrays is None or not len(job.arrays):
        raise RuntimeError(f"{job.method}: the message carries no θ (ArrayRecord 'arrays')")
    return CanonicalModel(job.new_model(), torch_state(job.arrays, job.device), PREFIX)


def _message_membership(job: ClientJob) -> tuple[np.ndarray | None, np.ndarray | None]:
    record = job.content.array_records.get(ppfl_keys.MEMBERSHIP)
    if record is None:
        return None, None
    c = decode(record[ppfl_keys.MEMBERSHIP_C]).astype(np.float64)
    penalty = (
        decode(record[ppfl_keys.MEMBERSHIP_PENALTY]).astype(np.float64)
        if ppfl_keys.MEMBERSHIP_PENALTY in record
        else None
    )
    return c, penalty


def stored_membership(job: ClientJob, count: int) -> np.ndarray:
    """The client's membership: the latest it stored, else uniform ``1/K`` (O4.3)."""
    record = job.state.get(_key(job, "membership"))
    if record is not None:
        c = decode(record[ppfl_keys.MEMBERSHIP_C]).astype(np.float64)
        if c.shape == (count,):
            return c
    return np.full(count, 1.0 / count)


def _store(job: ClientJob, c: np.ndarray) -> None:
    job.state[_key(job, "membership")] = _vector_record(**{ppfl_keys.MEMBERSHIP_C: c})


def _check_membership(c: np.ndarray, count: int) -> np.ndarray:
    if c.shape != (count,):
        raise ValueError(f"ppfl: membership of shape {c.shape} for {count} canonical models")
    if not np.isfinite(c).all() or (c < 0).any() or abs(float(c.sum()) - 1.0) > 1e-6:
        raise ValueError(f"ppfl: the membership {c.tolist()} is not on the simplex")
    return c


def _personalized(job: ClientJob, model: CanonicalModel, c: np.ndarray) -> PersonalizedModel:
    membership = torch.as_tensor(c, dtype=torch.float32, device=job.device)
    return PersonalizedModel(model, membership, str(job.param("form")), str(job.param("mix")))


def train_theta(
    person: PersonalizedModel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    max_steps: int | None = None,
    momentum_buffers: list[torch.Tensor] | None = None,
) -> tuple[float, int]:
    """Local SGD on θ with the membership fixed (Eq. 11): ``(mean loss, steps)``.

    The loop of :func:`pflarena.core.training.train_epochs` with the personalized loss, so
    that K = 1 trains exactly like FedAvg (same batches, same optimizer, same arithmetic).
    ``momentum_buffers`` (one per shared parameter, in order) continue an earlier call's
    momentum (the authors' clients keep their optimizer between rounds); after the call
    the list holds the new buffers.
    """
    person.train()
    parameters = list(person.model.shared_parameters())
    optimizer = torch.optim.SGD(parameters, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if momentum_buffers:
        if len(momentum_buffers) != len(parameters):
            raise ValueError(
                f"ppfl: {len(momentum_buffers)} momentum buffers for {len(parameters)} parameters"
            )
        for param, buffer in zip(parameters, momentum_buffers, strict=True):
            optimizer.state[param]["momentum_buffer"] = buffer.to(param).clone()
    try:
        return _sgd_loop(person, optimizer, x, y, epochs, batch_size, generator, max_steps)
    finally:
        if momentum_buffers is not None and momentum > 0:
            # a parameter that got no gradient has no buffer: zero continues it exactly
            momentum_buffers[:] = [
                optimizer.state[p]["momentum_buffer"].detach().clone()
                if optimizer.state[p].get("momentum_buffer") is not None
                else torch.zeros_like(p.detach())
                for p in parameters
            ]


def _sgd_loop(
    person: PersonalizedModel,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    max_steps: int | None,
) -> tuple[float, int]:
    total, steps = 0.0, 0
    for _ in range(epochs):
        for idx in batches(len(y), batch_size, generator=generator, device=y.device):
            optimizer.zero_grad(set_to_none=True)
            loss = person.loss(x[idx], y[idx])
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            steps += 1
            if max_steps is not None and steps >= max_steps:
                return total / steps, steps
    return (total / steps if steps else float("nan")), steps


def membership_gradient(
    person: PersonalizedModel, x: torch.Tensor, y: torch.Tensor, *, batch_size: int
) -> tuple[np.ndarray, float]:
    """``(∇_c f_i, f_i)`` at the person's membership, over all of ``(x, y)``.

    ``f_i`` is the mean training loss; summed per minibatch and divided once, so it is the
    full-batch gradient of the mean.
    """
    person.train()
    membership = person.membership.detach().clone().requires_grad_(True)
    person.membership = membership
    total = torch.zeros_like(membership, dtype=torch.float64)
    loss_sum = 0.0
    n = len(y)
    for start in range(0, n, batch_size):
        loss = person.loss(x[start : start + batch_size], y[start : start + batch_size], "sum")
        (grad,) = torch.autograd.grad(loss, membership)
        total += grad.to(torch.float64)
        loss_sum += float(loss.detach())
    person.membership = membership.detach()
    return (total / max(n, 1)).cpu().numpy(), loss_sum / max(n, 1)


@torch.no_grad()
def training_loss(person: PersonalizedModel, x: torch.Tensor, y: torch.Tensor) -> float:
    """``f_i``: the mean training loss of the personalized model, in eval mode."""
    person.eval()
    total = 0.0
    for start in range(0, len(y), 512):
        total += float(person.loss(x[start : start + 512], y[start : start + 512], "sum"))
    return total / max(len(y), 1)


def membership_steps(
    person: PersonalizedModel,
    x: torch.Tensor,
    y: torch.Tensor,
    c: np.ndarray,
    *,
    mode: str,
    lr: float,
    weight: float,
    penalty: np.ndarray,
    batch_size: int,
    generator: torch.Generator,
    floor: float,
    table: torch.Tensor | None = None,
) -> tuple[np.ndarray, float, int]:
    """Exponentiated-gradient steps on c_i: ``(new c_i, f_i at the start, steps)``.

    ``full``: one step with the full local gradient. ``minibatch``: one step with the
    gradient of one minibatch's mean loss. ``epoch``: one step per minibatch over one
    shuffled pass (the authors' code). Each step's gradient is ``weight · ∇_c f + penalty``.
    ``table``: :func:`copy_log_likelihoods` of ``(x, y)`` when the caller has it.
    """
    device, dtype = person.membership.device, person.membership.dtype
    if mode in ("minibatch", "epoch") and per_copy_outputs_apply(person):
        if table is None:
            table = copy_log_likelihoods(person, x, y)
        return _membership_steps_on_outputs(
            person, table, y, c, mode, lr, weight, penalty, batch_size, generator, floor
        )
    if mode == "full":
        person.membership = torch.as_tensor(c, dtype=dtype, device=device)
        grad, loss = membership_gradient(person, x, y, batch_size=batch_size)
        return exponentiated_gradient_step(c, weight * grad + penalty, lr, floor), loss, 1
    if mode not in ("minibatch", "epoch"):
        raise ValueError(f"ppfl: unknown membership-steps {mode!r}")
    start_loss = float("nan")
    steps = 0
    for idx in batches(len(y), batch_size, generator=generator, device=y.device):
        person.membership = torch.as_tensor(c, dtype=dtype, device=device)
        grad, loss = membership_gradient(person, x[idx], y[idx], batch_size=len(idx))
        if steps == 0:
            start_loss = loss
        c = exponentiated_gradient_step(c, weight * grad + penalty, lr, floor)
        steps += 1
        if mode == "minibatch":
            break
    return c, start_loss, steps


def per_copy_outputs_apply(person: PersonalizedModel) -> bool:
    """Whether a membership epoch may run on the copies' outputs computed once: PPFL1
    (``form=mix``), whose loss depends on c only through the mixture of the K copies'
    outputs, which θ (fixed during the epoch) determines; and a model whose output for a
    sample depends on that sample alone and is the same in training and evaluation mode
    (no dropout, no batch normalization)."""
    if person.form != "mix":
        return False
    batch_dependent = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)
    return not any(isinstance(m, batch_dependent) for m in person.model.modules())


@torch.no_grad()
def copy_log_likelihoods(
    person: PersonalizedModel, x: torch.Tensor, y: torch.Tensor, chunk: int = 1024
) -> torch.Tensor:
    """What the mixture's loss needs of each copy k on each sample i, computed once: for
    ``mix=prob`` and ``loss`` ``log p_k(y_i | x_i)`` (n × K); for ``logit`` the copies'
    logits (K × n × C)."""
    person.train()
    parts = []
    for start in range(0, len(y), chunk):
        outputs = person.model.outputs(x[start : start + chunk])
        if person.mix == "logit":
            parts.append(torch.stack(outputs))
        else:
            target = y[start : start + chunk, None]
            parts.append(
                torch.stack(
                    [F.log_softmax(z, dim=-1).gather(1, target)[:, 0] for z in outputs], dim=1
                )
            )
    if not parts:
        return torch.zeros(0)
    return torch.cat(parts, dim=1 if person.mix == "logit" else 0)


def table_loss_and_gradient(
    table: np.ndarray, y: np.ndarray, c: np.ndarray, mix: str
) -> tuple[float, np.ndarray]:
    """The summed mixture loss of the samples of ``table`` (:func:`copy_log_likelihoods`, in
    float64, rows already chosen) and its gradient in c, in closed form:

    * ``prob``: ``−Σ_i log Σ_k c_k p_ik``, gradient ``−Σ_i p_ik / Σ_j c_j p_ij``;
    * ``loss``: ``−Σ_i Σ_k c_k log p_ik``, gradient ``−Σ_i log p_ik``;
    * ``logit``: ``Σ_i CE(Σ_k c_k z_ik, y_i)``, gradient ``Σ_i (softmax(z_i) − e_{y_i})·z_ik``.

    The same values :func:`~pflarena.algorithms.canonical.mixture_loss` and autograd give from the
    outputs (a test holds them equal); written out because a K-vector's autograd costs far
    more than its arithmetic on every minibatch of the membership epoch.
    """
    if mix == "logit":
        z = np.einsum("k,kbc->bc", c, table)
        lse = log_sum_exp(z)
        rows = np.arange(len(y))
        soft = np.exp(z - lse[:, None])
        soft[rows, y] -= 1.0
        return float((lse - z[rows, y]).sum()), np.einsum("bc,kbc->k", soft, table)
    if mix == "loss":
        return float(-(table @ c).sum()), -table.sum(axis=0)
    lse = log_sum_exp(table + np.log(np.maximum(c, np.finfo(np.float64).tiny)))
    return float(-lse.sum()), -np.exp(table - lse[:, None]).sum(axis=0)


def _as_table(table: torch.Tensor) -> np.ndarray:
    return table.detach().to(torch.float64).cpu().numpy()


@torch.no_grad()
def table_loss(table: torch.Tensor, y: torch.Tensor, c: np.ndarray, mix: str) -> float:
    """``f_i``, the mean mixture loss at membership ``c``, from :func:`copy_log_likelihoods`
    (what :func:`training_loss` computes with K more forward passes)."""
    n = len(y)
    if n == 0:
        return float("nan")
    loss, _ = table_loss_and_gradient(_as_table(table), y.cpu().numpy(), c, mix)
    return loss / n


def _membership_steps_on_outputs(
    person: PersonalizedModel,
    table: torch.Tensor,
    y: torch.Tensor,
    c: np.ndarray,
    mode: str,
    lr: float,
    weight: float,
    penalty: np.ndarray,
    batch_size: int,
    generator: torch.Generator,
    floor: float,
) -> tuple[np.ndarray, float, int]:
    """:func:`membership_steps` (``minibatch``/``epoch``) with each copy's outputs computed
    once (:func:`per_copy_outputs_apply`): the same batches, gradients and steps, each step
    on an n × K table (``table``, :func:`copy_log_likelihoods`) instead of K forward passes."""
    values, labels = _as_table(table), y.cpu().numpy()
    start_loss = float("nan")
    steps = 0
    for idx in batches(len(y), batch_size, generator=generator, device=y.device):
        rows = idx.cpu().numpy()
        part = values[:, rows] if person.mix == "logit" else values[rows]
        loss, grad = table_loss_and_gradient(part, labels[rows], c, person.mix)
        if steps == 0:
            start_loss = loss / max(len(rows), 1)
        c = exponentiated_gradient_step(c, weight * grad / max(len(rows), 1) + penalty, lr, floor)
        steps += 1
        if mode == "minibatch":
            break
    device, dtype = person.membership.device, person.membership.dtype
    person.membership = torch.as_tensor(c, dtype=dtype, device=device)
    return c, start_loss, steps


# ------------------------------------------------------------------ messages
def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    handlers = {
        ppfl_keys.PHASE_AFFINITY: _affinity,
        ppfl_keys.PHASE_THETA: _theta,
        ppfl_keys.PHASE_GRADIENT: _gradient,
        ppfl_keys.PHASE_SYNC: _sync,
        ppfl_keys.PHASE_STEPS: _steps,
        ppfl_keys.PHASE_ALTERNATE: _alternate,
    }
    if job.phase not in handlers:
        raise ValueError(f"ppfl: unknown phase {job.phase!r}")
    return handlers[job.phase](job)


def _ids(job: ClientJob) -> dict:
    return {keys.CLIENT_ID: job.client_id, keys.NUM_EXAMPLES: int(len(job.data.y_train))}


def _affinity(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    counts = np.bincount(
        job.data.y_train.cpu().numpy(), minlength=job.data.info.num_classes
    ).astype(np.float64)
    return {ppfl_keys.LABEL_COUNTS: _vector_record(counts=counts)}, _ids(job)


def _current(job: ClientJob, model: CanonicalModel) -> tuple[np.ndarray, np.ndarray | None]:
    c, penalty = _message_membership(job)
    if c is None:
        c = stored_membership(job, model.count)
    return _check_membership(c, model.count), penalty


def _local_sgd(job: ClientJob, person: PersonalizedModel) -> tuple[float, int]:
    kwargs = job.train_kwargs()
    local_steps = int(job.param("local-steps"))
    if local_steps > 0:  # exactly E steps (the theory's E), cycling through epochs
        kwargs["epochs"] = 1 + local_steps * kwargs["batch_size"] // max(len(job.data.y_train), 1)
    keep = bool(job.config.get(f"{job.method}.persistent-momentum", False))
    buffers = _stored_momentum(job, person.model.shared_parameters()) if keep else None
    result = train_theta(
        person,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        max_steps=local_steps if local_steps > 0 else None,
        momentum_buffers=buffers,
        **kwargs,
    )
    if keep and buffers:
        # one flat array: each array of a stored record costs its own zip member to write
        # and read (about 0.1 ms each), and the shapes are θ's own
        flat = torch.cat([b.detach().reshape(-1) for b in buffers]).cpu().numpy()
        job.state[_key(job, "momentum")] = ArrayRecord({MOMENTUM_FLAT: Array(flat)})
    return result


#: The stored momentum record's one array: every buffer flattened, in θ's parameter order.
MOMENTUM_FLAT = "flat"


def _stored_momentum(job: ClientJob, parameters: list[torch.Tensor]) -> list[torch.Tensor]:
    """The client's momentum buffers from its last θ-block, shaped as ``parameters`` (empty
    before its first). Records written one array per buffer (``"0"``, ``"1"``, ...) by
    earlier versions are read too, so a run resumes across the change."""
    record = job.state.get(_key(job, "momentum"))
    if record is None:
        return []
    if MOMENTUM_FLAT not in record:
        return [
            torch.as_tensor(record[str(i)].numpy(), device=job.device) for i in range(len(record))
        ]
    flat = torch.as_tensor(decode(record[MOMENTUM_FLAT]), device=job.device)
    sizes = [p.numel() for p in parameters]
    if flat.numel() != sum(sizes):
        raise ValueError(
            f"ppfl: stored momentum of {flat.numel()} values for θ of {sum(sizes)} parameters"
        )
    return [part.reshape(p.shape) for part, p in zip(flat.split(sizes), parameters, strict=True)]


def _theta(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = population_model(job)
    c, penalty = _current(job, model)
    records: dict[str, ArrayRecord] = {}
    x, y = job.data.x_train, job.data.y_train
    person = _personalized(job, model, c)
    # what the membership epoch and f_i need of each copy at the message's θ, computed once
    # (PPFL1 without batch-dependent layers); else each does its own forward passes
    table = copy_log_likelihoods(person, x, y) if per_copy_outputs_apply(person) else None
    folded = job.config.get(f"{job.method}.folded-round")
    if folded is not None:
        # the previous round's membership epoch (theta-first), folded into this message: at
        # the message's θ (θ^{t+1} of that round), with its π_i, step size and batches
        c, _, _ = _step_membership(
            job,
            person,
            c,
            penalty,
            lr=float(job.config[f"{job.method}.folded-membership-lr"]),
            generator=job.generator("membership", server_round=int(folded)),
            table=table,
        )
        records[ppfl_keys.MEMBERSHIP] = _vector_record(**{ppfl_keys.MEMBERSHIP_C: c})
        person = _personalized(job, model, c)
    start = (
        table_loss(table, y, c, person.mix) if table is not None else training_loss(person, x, y)
    )
    loss, steps = _local_sgd(job, person)
    _store(job, c)
    metrics = train_metrics(job, loss, steps)
    metrics[ppfl_keys.START_LOSS] = start
    return {keys.ARRAYS: ArrayRecord(model.stacked_state()), **records}, metrics


def _gradient(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = population_model(job)
    c, _ = _current(job, model)
    person = _personalized(job, model, c)
    if str(job.param("membership-steps")) == "full":
        grad, loss = membership_gradient(
            person, job.data.x_train, job.data.y_train, batch_size=int(job.config[keys.BATCH_SIZE])
        )
    else:  # one minibatch: Algorithm 1's stochastic ξ_i^t
        idx = next(
            batches(
                len(job.data.y_train),
                int(job.config[keys.BATCH_SIZE]),
                generator=job.generator("membership"),
            )
        )
        grad, _ = membership_gradient(
            person, job.data.x_train[idx], job.data.y_train[idx], batch_size=len(idx)
        )
        loss = training_loss(person, job.data.x_train, job.data.y_train)
    _store(job, c)
    metrics = train_metrics(job, loss, 0)
    metrics[ppfl_keys.START_LOSS] = loss
    return {
        ppfl_keys.MEMBERSHIP_GRADIENT: _vector_record(**{ppfl_keys.MEMBERSHIP_C: grad})
    }, metrics


def _sync(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    c, _ = _message_membership(job)
    if c is None:
        raise ValueError("ppfl: a membership message without a membership")
    _store(job, _check_membership(c, len(c)))
    return {}, _ids(job)


def _step_membership(
    job: ClientJob,
    person: PersonalizedModel,
    c: np.ndarray,
    penalty: np.ndarray | None,
    *,
    lr: float | None = None,
    generator: torch.Generator | None = None,
    table: torch.Tensor | None = None,
) -> tuple[np.ndarray, float, int]:
    if penalty is None:
        raise ValueError("ppfl: a membership step needs the server's penalty row")
    return membership_steps(
        person,
        job.data.x_train,
        job.data.y_train,
        c,
        mode=str(job.param("membership-steps")),
        lr=float(job.param("membership-lr")) if lr is None else lr,
        weight=float(job.param("loss-weight")),
        penalty=penalty,
        batch_size=int(job.config[keys.BATCH_SIZE]),
        generator=job.generator("membership") if generator is None else generator,
        floor=float(job.param("membership-floor")),
        table=table,
    )


def _steps(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = population_model(job)
    c, penalty = _current(job, model)
    person = _personalized(job, model, c)
    new, loss, steps = _step_membership(job, person, c, penalty)
    _store(job, new)
    metrics = train_metrics(job, loss, steps)
    return {ppfl_keys.MEMBERSHIP: _vector_record(**{ppfl_keys.MEMBERSHIP_C: new})}, metrics


def _alternate(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = population_model(job)
    c, penalty = _current(job, model)
    person = _personalized(job, model, c)
    new, start, _ = _step_membership(job, person, c, penalty)
    if str(job.param("membership-steps")) != "full":
        start = training_loss(_personalized(job, model, c), job.data.x_train, job.data.y_train)
    person = _personalized(job, model, new)
    loss, steps = _local_sgd(job, person)
    _store(job, new)
    metrics = train_metrics(job, loss, steps)
    metrics[ppfl_keys.START_LOSS] = start
    return {
        keys.ARRAYS: ArrayRecord(model.stacked_state()),
        ppfl_keys.MEMBERSHIP: _vector_record(**{ppfl_keys.MEMBERSHIP_C: new}),
    }, metrics


# ------------------------------------------------------------------ evaluation
def _evaluated(job: ClientJob) -> PersonalizedModel:
    model = population_model(job)
    return _personalized(job, model, stored_membership(job, model.count))


def personalized_model(job: ClientJob) -> nn.Module:
    """PPFL2's personalized model ``θ̃_i = Σ_k c_ik θ_k`` as the run's architecture.

    PPFL1 mixes K models' outputs, which no single model of the architecture computes, so
    it has none to export (cross-evaluation needs ``ppfl.form=interpolate``).
    """
    person = _evaluated(job)
    if person.form != "interpolate":
        raise ValueError(
            "ppfl: PPFL1 (form=mix) combines K models' outputs and has no single personalized "
            "model of the run's architecture to export; cross-evaluate with form=interpolate"
        )
    model = job.new_model()
    model.load_state_dict(person.model.personalized_state(person.membership))
    return model


def evaluate(job: ClientJob) -> dict:
    """The personalized model (θ from the message, this client's stored c_i) on its test split."""
    return eval_metrics(job, job.test(_evaluated(job)), None)
