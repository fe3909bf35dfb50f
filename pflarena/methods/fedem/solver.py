"""Local solver for FedEM (Marfoq et al. 2021, Algorithm 1): E-step, M-steps, components back.

The message carries the M component models (a stacked state, ``component.<m>.<name>``);
the client keeps its mixture weights π_i (``fedem/mixture-weights``, uniform 1/M at first).
A train message runs the E-step (posteriors of each training sample), the M-step for π_i,
and ``local-epochs`` of q-weighted SGD on each component, and returns the M components.
Evaluation predicts with ``Σ_m π_im softmax(h_{θ_m}(x))``.

The reading of the paper, decisions and measurements: docs/methods/fedem.md.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch.nn import functional as F

from pflarena.algorithms.canonical import CanonicalModel, PersonalizedModel
from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record, torch_state
from pflarena.core.training import batches
from pflarena.methods.fedem import keys as fedem_keys

__all__ = ["e_step", "evaluate", "train", "weighted_sgd"]

PREFIX = fedem_keys.COMPONENT_PREFIX  # the strategy's array names (keys.py)


def _components(job: ClientJob) -> CanonicalModel:
    if job.arrays is None or not len(job.arrays):
        raise RuntimeError("fedem: the message carries no component models")
    state = torch_state(job.arrays, job.device)
    return CanonicalModel(job.new_model(), state, PREFIX)


def _weights(job: ClientJob, count: int) -> np.ndarray:
    record = job.state.get(f"{job.method}/mixture-weights")
    if record is not None:
        pi = record["pi"].numpy().astype(np.float64)
        if pi.shape == (count,):
            return pi
    return np.full(count, 1.0 / count)


@torch.no_grad()
def e_step(
    model: CanonicalModel, pi: np.ndarray, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """``(q, mixture loss)``: q[s, m] ∝ π_m exp(−ℓ(h_m(x_s), y_s)) for every sample, and the
    mean negative log-likelihood ``−log Σ_m π_m p_m(y_s|x_s)`` before the update."""
    model.eval()
    losses = []
    for start in range(0, len(y), 512):
        chunk = slice(start, start + 512)
        losses.append(
            torch.stack(
                [F.cross_entropy(z, y[chunk], reduction="none") for z in model.outputs(x[chunk])],
                dim=1,
            )
        )
    loss = torch.cat(losses).double()  # n × M
    log_joint = torch.log(torch.as_tensor(pi, dtype=torch.float64)) - loss
    q = torch.softmax(log_joint, dim=1)
    nll = float(-torch.logsumexp(log_joint, dim=1).mean())
    return q, nll


def weighted_sgd(
    model: CanonicalModel,
    component: int,
    x: torch.Tensor,
    y: torch.Tensor,
    q: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
) -> tuple[float, int]:
    """Local SGD on component m's q-weighted loss ``(1/|B|) Σ_B q_sm ℓ_s`` (the authors'
    weighted ``fit_epochs``); returns ``(mean loss, steps)``."""
    model.train()
    params = [p for p in model.copies[component].parameters() if p.requires_grad]
    params = model.trunk_parameters() + params
    optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    weights = q[:, component].to(x.device, torch.float32)
    total, steps = 0.0, 0
    for _ in range(epochs):
        for idx in batches(len(y), batch_size, generator=generator, device=y.device):
            optimizer.zero_grad(set_to_none=True)
            per_sample = F.cross_entropy(model.output(component, x[idx]), y[idx], reduction="none")
            loss = (per_sample * weights[idx]).sum() / len(idx)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            steps += 1
    return (total / steps if steps else float("nan")), steps


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model = _components(job)
    pi = _weights(job, model.count)
    q, nll = e_step(model, pi, job.data.x_train, job.data.y_train)
    pi = q.mean(dim=0).numpy()  # the M-step for the mixture weights
    kwargs = job.train_kwargs()
    steps = 0
    for component in range(model.count):
        _, taken = weighted_sgd(
            model,
            component,
            job.data.x_train,
            job.data.y_train,
            q,
            # component 0 draws FedAvg's batches, so that M = 1 is FedAvg
            generator=job.generator("train" if component == 0 else f"train/{component}"),
            **kwargs,
        )
        steps += taken
    job.state[f"{job.method}/mixture-weights"] = ArrayRecord(
        {"pi": Array(np.ascontiguousarray(pi, dtype=np.float64))}
    )
    metrics = train_metrics(job, nll, steps)
    safe = np.clip(pi, 1e-300, 1.0)
    metrics[fedem_keys.ENTROPY] = float(-(safe * np.log(safe)).sum())
    return {keys.ARRAYS: state_record(model.stacked_state())}, metrics


def evaluate(job: ClientJob) -> dict:
    """The client's mixture ``Σ_m π_im p_m(y|x)`` on its test split."""
    model = _components(job)
    pi = torch.as_tensor(_weights(job, model.count), dtype=torch.float32, device=job.device)
    return eval_metrics(job, job.test(PersonalizedModel(model, pi, "mix", "prob")), None)
