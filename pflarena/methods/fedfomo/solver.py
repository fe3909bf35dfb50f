"""Local solver for FedFomo (Zhang et al., ICLR 2021): a first-order step towards useful peers.

Per round, on the models the server sent (``peer/<client id>``, M at most, never the
client's own):

1. Pick the reference θ_ref and the candidates (``fedfomo.baseline``): with ``round-start``
   (the authors' code) θ_ref is the model the client started its last local training from,
   and the candidates are its own trained model (once it has one) and the peers; with
   ``trained`` θ_ref is its trained model and the candidates are the peers.
2. Weigh every candidate on the validation split: w_n = (L(θ_ref) − L(θ_n)) / ‖θ_n − θ_ref‖
   (:func:`first_order_weights`), keep the positive part and normalize
   (:func:`fomo_weights`), and step θ = θ_ref + Σ_n w_n (θ_n − θ_ref); with no positive
   weight θ = θ_ref.
3. Train θ locally (the run's local epochs, batch size and SGD settings), keep it as the
   personalized model, and upload it with the peers' weights and their affinity increments
   (:func:`affinity_increments`), which the server adds to its affinity matrix.

Client state: the personalized (trained) model, and with ``round-start`` the model the
training started from. Evaluation tests the personalized model on the test split.

The reading of the paper, decisions and measurements: docs/methods/fedfomo.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn

from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.training import evaluate as evaluate_model
from pflarena.core.training import train_epochs
from pflarena.methods.fedfomo import keys as fedfomo_keys

__all__ = [
    "FOMO",
    "MODEL_KEY",
    "PEER_PREFIX",
    "ROUND_START_KEY",
    "affinity_increments",
    "evaluate",
    "personalized_model",
    "first_order_weights",
    "fomo_weights",
    "model_distance",
    "train",
]

MODEL_KEY = "fedfomo/model"  # θ_i after local training: evaluated, uploaded
ROUND_START_KEY = "fedfomo/round-start"  # θ_i before its last local training (round-start)

PEER_PREFIX = fedfomo_keys.PEER_PREFIX  # the strategy's record names (keys.py)
FOMO = fedfomo_keys.WEIGHTS

#: Candidates closer than this to θ_ref are no move; their weight is 0.
MIN_DISTANCE = 1e-12


# --------------------------------------------------------------------------- the math
def first_order_weights(
    base_loss: float, losses: Sequence[float], distances: Sequence[float]
) -> np.ndarray:
    """FedFomo's raw weights: ``(base_loss − loss_n) / distance_n``, signed.

    A candidate at distance (almost) zero from the reference is no move and gets 0.
    """
    losses_ = np.asarray(losses, dtype=np.float64)
    distances_ = np.asarray(distances, dtype=np.float64)
    if losses_.shape != distances_.shape:
        raise ValueError(f"{losses_.shape[0]} losses but {distances_.shape[0]} distances")
    moved = distances_ > MIN_DISTANCE
    raw = np.zeros_like(losses_)
    raw[moved] = (float(base_loss) - losses_[moved]) / distances_[moved]
    return raw


def fomo_weights(
    base_loss: float, losses: Sequence[float], distances: Sequence[float]
) -> np.ndarray:
    """The update's weights: the positive part of :func:`first_order_weights`, normalized
    to sum to one; all zero (no move) when none is positive."""
    positive = np.maximum(first_order_weights(base_loss, losses, distances), 0.0)
    total = positive.sum()
    return positive / total if total > 0 else positive


def affinity_increments(raw: np.ndarray, weights: np.ndarray, rule: str) -> np.ndarray:
    """What each candidate adds to the client's row of the affinity matrix.

    ``signed`` (the authors' code): the raw weights divided by the absolute value of their
    sum (at least 1e-9), so harmful models lose affinity; ``positive``: the update's
    normalized positive weights.
    """
    if rule == "signed":
        return np.asarray(raw, dtype=np.float64) / max(abs(float(np.sum(raw))), 1e-9)
    if rule == "positive":
        return np.asarray(weights, dtype=np.float64).copy()
    raise ValueError(f"affinity rule must be 'signed' or 'positive', got {rule!r}")


def model_distance(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], names: Sequence[str], norm: str
) -> float:
    """‖a − b‖ over the entries ``names``, L2 or L1, in float64."""
    if norm not in ("l1", "l2"):
        raise ValueError(f"norm must be 'l1' or 'l2', got {norm!r}")
    total = 0.0
    for name in names:
        diff = a[name].double() - b[name].double()
        total += float(diff.abs().sum()) if norm == "l1" else float(diff.pow(2).sum())
    return total if norm == "l1" else float(np.sqrt(total))


def step(
    reference: dict[str, torch.Tensor],
    candidates: Sequence[dict[str, torch.Tensor]],
    weights: np.ndarray,
) -> dict[str, torch.Tensor]:
    """θ_ref + Σ_n w_n (θ_n − θ_ref) on floating-point entries; integer ones from θ_ref."""
    out = {}
    for name, ref in reference.items():
        value = ref.clone()
        if torch.is_floating_point(ref):
            for w, cand in zip(weights, candidates, strict=True):
                if w > 0:
                    value += float(w) * (cand[name] - ref)
        out[name] = value
    return out


# --------------------------------------------------------------------------- the solver
def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _peer_state(job: ClientJob, peer: int) -> dict[str, torch.Tensor]:
    name = f"{PEER_PREFIX}{peer}"
    if name not in job.content.array_records:
        raise ValueError(f"the message names peer {peer} but carries no {name!r} record")
    return _state(job.model_from(job.content[name]))


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    own = int(job.param("own"))
    peers = [int(p) for p in job.param("peers")]
    if own >= 0 and own != job.client_id:
        raise ValueError(f"the server addresses client {own}, this is client {job.client_id}")
    if job.client_id in peers:
        raise ValueError(f"the server sent this client's own model (client {job.client_id})")
    if len(job.data.y_val) == 0:
        raise RuntimeError("fedfomo needs a validation split (validation-fraction > 0)")
    baseline = str(job.param("baseline"))
    if baseline not in ("round-start", "trained"):
        raise ValueError(f"fedfomo.baseline must be 'round-start' or 'trained', got {baseline!r}")

    trained = job.load_state_model(MODEL_KEY)
    model = job.state_model_or_initial(MODEL_KEY)  # also the template of every candidate
    own_candidate: dict[str, torch.Tensor] | None = None
    if baseline == "round-start":
        start = job.load_state_model(ROUND_START_KEY)
        if start is not None and trained is not None:
            own_candidate = _state(trained)
            model.load_state_dict(_state(start))
    reference = _state(model)

    candidates = ([own_candidate] if own_candidate is not None else []) + [
        _peer_state(job, p) for p in peers
    ]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    x_val, y_val = job.data.x_val, job.data.y_val
    base_loss = evaluate_model(model, x_val, y_val).loss
    losses, distances = [], []
    probe = job.new_model()
    for cand in candidates:
        probe.load_state_dict(cand)
        losses.append(evaluate_model(probe, x_val, y_val).loss)
        distances.append(
            model_distance(cand, reference, trainable, str(job.param("distance-norm")))
        )
    raw = first_order_weights(base_loss, losses, distances)
    weights = fomo_weights(base_loss, losses, distances)
    increments = affinity_increments(raw, weights, str(job.param("affinity-update")))
    if weights.sum() > 0:
        model.load_state_dict(step(reference, candidates, weights))
    if baseline == "round-start":
        job.save_state_model(ROUND_START_KEY, model)

    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        **job.train_kwargs(),
    )
    job.save_state_model(MODEL_KEY, model)

    first_peer = 1 if own_candidate is not None else 0
    fomo = ArrayRecord(
        {
            fedfomo_keys.PEERS: Array(np.array(peers, dtype=np.int64)),
            fedfomo_keys.PEER_WEIGHTS: Array(np.ascontiguousarray(weights[first_peer:])),
            fedfomo_keys.AFFINITY: Array(np.ascontiguousarray(increments[first_peer:])),
        }
    )
    metrics = train_metrics(job, loss, steps)
    metrics |= {
        fedfomo_keys.PEERS_USED: int((weights[first_peer:] > 0).sum()),
        fedfomo_keys.OWN_WEIGHT: float(weights[0]) if own_candidate is not None else 0.0,
        fedfomo_keys.BASE_VAL_LOSS: float(base_loss),
    }
    return {keys.ARRAYS: state_record(model.state_dict()), FOMO: fomo}, metrics


def personalized_model(job: ClientJob) -> nn.Module:
    """θ_i after its last local training (θ⁰ before its first round)."""
    return job.state_model_or_initial(MODEL_KEY)


def evaluate(job: ClientJob) -> dict:
    return eval_metrics(job, job.test(personalized_model(job)), None)
