"""Local solver for SplitGP (Han et al., INFOCOM 2023): a client-side part with an auxiliary
classifier for personalization, a server-side part for generalization.

The model w = (φ, θ) is split at the head (:mod:`pflarena.core.model_split`): φ, the body, is the
client-side part and θ, the last ``head-layers`` weighted layers, the server-side part. Each
client also has an auxiliary classifier κ_k, one linear layer on φ's output, so that
(φ_k, κ_k) alone predicts: the client-side (personalized) model; (φ_k, θ) is the full
(generalized) model. For a train message:

1. **Personalized start** (the paper's client-side model aggregation): the client starts
   from ``φ_k ← λ φ_k + (1 − λ) φ̄`` and ``κ_k ← λ κ_k + (1 − λ) κ̄``, its own last trained
   client-side model mixed with the server's averages (:func:`personalize`); at its first
   round, from φ̄ and κ̄ themselves;
2. **Split training**: for every minibatch, the smashed data ``z = φ_k(x)`` feeds both
   exits, and φ_k, κ_k and θ take one SGD step on the multi-exit loss
   ``γ ℓ(κ_k(z), y) + (1 − γ) ℓ(θ(z), y)`` (:func:`splitgp_loss`);
3. the reply carries φ_k and κ_k (the paper's upload of the client-side model) and θ_k.

**How the split training maps onto Flower messages.** In the paper the client computes φ
and κ, sends the smashed data z and the labels to the server every minibatch, the server
computes θ's exit and its loss, updates its copy θ_k and sends back the gradient of that
loss at z; after the local epochs the client uploads (φ_k, κ_k) for aggregation while θ_k
never leaves the server. This solver runs both sides of that exchange in the client's
process, so one train message per round replaces the per-minibatch traffic: the message
down carries θ̄ (in the paper it stays on the server) and the reply carries θ_k back to the
server (in the paper the server holds it). What the paper's protocol sends is in the
reply's metrics: ``splitgp-smashed-bytes-up`` (z and the labels, every step) and
``splitgp-smashed-bytes-down`` (the gradients at z), the size of those tensors as this run
computed them; the uploaded client-side model is the ``arrays`` and ``aux-classifier``
records; the ``server-side`` record is not an upload of the paper's protocol.

**Inference** (the paper's rule): a test sample is predicted by the client-side model
(φ_k, κ_k) when the entropy of its softmax output is at most ``entropy-threshold``, and
offloaded to the server, which predicts with θ̄ on φ_k's output, otherwise
(:func:`splitgp_predict`). That prediction is the personalized one; the global model is
(φ̄, θ̄). The client-side model evaluated is the one the client would start its next round
from (step 1). The evaluation reply also counts the offloaded samples and the client-side
model's own correct predictions (``splitgp-offloaded``, ``splitgp-client-side-correct``).

The reading of the paper, decisions and measurements: docs/methods/splitgp.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord
from torch import nn
from torch.nn import functional as F

from pflarena.algorithms.heads import first_head_layer, head_input
from pflarena.client.common import eval_metrics, train_metrics
from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.model_split import split_state
from pflarena.core.training import EvalResult, batches
from pflarena.methods.splitgp import keys as splitgp_keys

__all__ = [
    "entropy",
    "evaluate",
    "personalize",
    "splitgp_loss",
    "splitgp_predict",
    "train",
]

CLIENT_KEY = "splitgp/client-side"  # φ_k as the client trained it last
AUX_KEY = "splitgp/aux-classifier"  # κ_k as the client trained it last


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """The Shannon entropy (nats) of each row's softmax distribution."""
    log_p = F.log_softmax(logits, dim=1)
    return -(log_p.exp() * log_p).sum(dim=1)


def splitgp_predict(
    client_logits: torch.Tensor, server_logits: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's inference rule: the client-side output where its entropy is at most
    ``threshold``, the server-side output elsewhere. Returns the chosen logits and the mask
    of offloaded samples."""
    offloaded = entropy(client_logits) > threshold
    return torch.where(offloaded[:, None], server_logits, client_logits), offloaded


def splitgp_loss(
    client_logits: torch.Tensor, server_logits: torch.Tensor, y: torch.Tensor, gamma: float
) -> torch.Tensor:
    """The multi-exit loss ``γ ℓ(client exit) + (1 − γ) ℓ(full model)`` (cross-entropy)."""
    return gamma * F.cross_entropy(client_logits, y) + (1.0 - gamma) * F.cross_entropy(
        server_logits, y
    )


def personalize(
    local: Mapping[str, torch.Tensor] | None, average: Mapping[str, torch.Tensor], lam: float
) -> dict[str, torch.Tensor]:
    """``λ local + (1 − λ) average`` for each floating-point entry; ``average`` where there
    is no local model yet, and for integer entries (BatchNorm's batch counters)."""
    if local is None:
        return {name: value.clone() for name, value in average.items()}
    return {
        name: (lam * local[name] + (1.0 - lam) * value)
        if value.is_floating_point()
        else value.clone()
        for name, value in average.items()
    }


def _aux_module(record: ArrayRecord, device: torch.device) -> nn.Linear:
    """The auxiliary classifier κ from its record (``weight``, ``bias``)."""
    state = {name: value.to(device) for name, value in record.to_torch_state_dict().items()}
    out_features, in_features = state["weight"].shape
    module = nn.Linear(in_features, out_features).to(device)
    module.load_state_dict(state)
    return module


def _setup(job: ClientJob):
    """The received full model, its split, the head's first layer, and κ̄."""
    model = job.global_model()
    head_layers = int(job.param("head-layers"))
    split = split_state(model, head_layers)
    layer = first_head_layer(model, head_layers)
    if splitgp_keys.AUX not in job.content.array_records:
        raise RuntimeError("splitgp needs the server's auxiliary classifier in the message")
    return model, split, layer, job.content.array_records[splitgp_keys.AUX]


def _personal_client_side(
    job: ClientJob, model: nn.Module, split, aux_record: ArrayRecord
) -> nn.Linear:
    """Load the personalized φ_k into ``model`` (θ stays the received θ̄) and return κ_k."""
    lam = float(job.param("lambda"))
    state = model.state_dict()
    stored = job.state.get(CLIENT_KEY)
    local = None if stored is None else stored.to_torch_state_dict()
    if local is not None:
        local = {name: value.to(job.device) for name, value in local.items()}
    state.update(personalize(local, {name: state[name] for name in split.body}, lam))
    model.load_state_dict(state)
    aux = _aux_module(aux_record, job.device)
    stored_aux = job.state.get(AUX_KEY)
    local_aux = None if stored_aux is None else stored_aux.to_torch_state_dict()
    if local_aux is not None:
        local_aux = {name: value.to(job.device) for name, value in local_aux.items()}
    aux.load_state_dict(personalize(local_aux, aux.state_dict(), lam))
    return aux


def train(job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
    model, split, layer, aux_record = _setup(job)
    aux = _personal_client_side(job, model, split, aux_record)
    kwargs = job.train_kwargs()
    optimizer = torch.optim.SGD(
        [*model.parameters(), *aux.parameters()],
        lr=kwargs["lr"],
        momentum=kwargs["momentum"],
        weight_decay=kwargs["weight_decay"],
    )
    gamma = float(job.param("gamma"))
    x, y = job.data.x_train, job.data.y_train
    generator = job.generator("train")
    model.train()
    aux.train()
    total = client_total = server_total = 0.0
    steps = smashed_up = smashed_down = 0
    for _ in range(kwargs["epochs"]):
        for idx in batches(len(y), kwargs["batch_size"], generator=generator, device=y.device):
            xb, yb = x[idx], y[idx]
            with head_input(model, layer) as seen:
                server_logits = model(xb)
            smashed = seen[-1]
            client_logits = aux(smashed.flatten(1))
            loss = splitgp_loss(client_logits, server_logits, yb, gamma)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            size = smashed.numel() * smashed.element_size()
            smashed_up += size + yb.numel() * yb.element_size()  # z and the labels
            smashed_down += size  # the gradient at z
            total += float(loss.detach())
            client_total += float(F.cross_entropy(client_logits.detach(), yb))
            server_total += float(F.cross_entropy(server_logits.detach(), yb))
            steps += 1
    state = model.state_dict()
    client_side = state_record({name: state[name] for name in split.body})
    aux_side = state_record(aux.state_dict())
    job.state[CLIENT_KEY] = client_side
    job.state[AUX_KEY] = aux_side
    metrics = train_metrics(job, total / steps if steps else float("nan"), steps)
    metrics |= {
        splitgp_keys.CLIENT_LOSS: client_total / steps if steps else float("nan"),
        splitgp_keys.SERVER_LOSS: server_total / steps if steps else float("nan"),
        splitgp_keys.SMASHED_UP: smashed_up,
        splitgp_keys.SMASHED_DOWN: smashed_down,
    }
    records = {
        keys.ARRAYS: client_side,
        splitgp_keys.AUX: aux_side,
        splitgp_keys.SERVER_SIDE: state_record({name: state[name] for name in split.head}),
    }
    return records, metrics


@torch.no_grad()
def _test_split(
    job: ClientJob, model: nn.Module, layer: str, aux: nn.Linear, threshold: float
) -> tuple[EvalResult, int, int]:
    """The inference rule's result, the number of samples it offloaded, and how many the
    client-side model alone gets right."""
    model.eval()
    aux.eval()
    x, y = job.data.x_test, job.data.y_test
    loss_sum, correct, offloaded, client_correct = 0.0, 0, 0, 0
    for start in range(0, len(y), 512):
        with head_input(model, layer) as seen:
            server_logits = model(x[start : start + 512])
        client_logits = aux(seen[-1].flatten(1))
        logits, sent = splitgp_predict(client_logits, server_logits, threshold)
        target = y[start : start + 512]
        loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(dim=1) == target).sum())
        offloaded += int(sent.sum())
        client_correct += int((client_logits.argmax(dim=1) == target).sum())
    return EvalResult(loss_sum=loss_sum, correct=correct, count=len(y)), offloaded, client_correct


def evaluate(job: ClientJob) -> dict:
    """The paper's inference with the personalized client-side model; the global model
    (φ̄, θ̄)."""
    model, split, layer, aux_record = _setup(job)
    global_result = job.test(model)
    aux = _personal_client_side(job, model, split, aux_record)
    personalized, offloaded, client_correct = _test_split(
        job, model, layer, aux, float(job.param("entropy-threshold"))
    )
    metrics = eval_metrics(job, personalized, global_result)
    metrics[splitgp_keys.OFFLOADED] = offloaded
    metrics[splitgp_keys.CLIENT_SIDE_CORRECT] = client_correct
    return metrics
