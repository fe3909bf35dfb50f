"""Helpers shared by the local solvers: reply metrics, fine-tuning, the proximal hook and the
split-model parts (FedPer, FedRep, LG-FedAvg, FedBABU). A client's DDPG agent (PAGE, Dap-FL):
:mod:`pflarena.client.agents`."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.job import ClientJob
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.model_split import ModelSplit, split_state
from pflarena.core.training import EvalResult, train_epochs

__all__ = [
    "KeptPartSolver",
    "assemble",
    "eval_metrics",
    "evaluate_stored_or_global",
    "keeps_local_result",
    "local_result_key",
    "model_split",
    "part_record",
    "prox_hook",
    "stored_or_global",
    "train_jointly",
    "train_metrics",
    "train_part",
]


def train_metrics(job: ClientJob, loss: float, steps: int) -> dict:
    return {
        keys.CLIENT_ID: job.client_id,
        keys.NUM_EXAMPLES: int(len(job.data.y_train)),
        keys.TRAIN_LOSS: float(loss),
        keys.TRAIN_STEPS: int(steps),
    }


def eval_metrics(job: ClientJob, personalized: EvalResult, global_: EvalResult | None) -> dict:
    """Evaluation counts; the global entries only where the method has a global model."""
    metrics = {
        keys.CLIENT_ID: job.client_id,
        keys.NUM_EXAMPLES: personalized.count,
        keys.PERSONALIZED_CORRECT: personalized.correct,
        keys.PERSONALIZED_COUNT: personalized.count,
        keys.PERSONALIZED_LOSS_SUM: personalized.loss_sum,
    }
    if global_ is not None:
        metrics |= {
            keys.GLOBAL_CORRECT: global_.correct,
            keys.GLOBAL_COUNT: global_.count,
            keys.GLOBAL_LOSS_SUM: global_.loss_sum,
        }
    return metrics


def keeps_local_result(job: ClientJob) -> bool:
    """Whether the strategy asked for the local-training result as the P-model (its
    ``<method>.personal-model``; strategies that never send it mean the global model)."""
    return job.config.get(f"{job.method}.personal-model", "global") == "local-result"


def local_result_key(job: ClientJob) -> str:
    """Where the client keeps its latest local-training result."""
    return f"{job.method}/local-result"


def stored_or_global(job: ClientJob, key: str) -> nn.Module:
    """The model this client keeps under ``key`` in its state, or the server's model while
    it keeps none (before its first training round)."""
    stored = job.load_state_model(key)
    return stored if stored is not None else job.global_model()


def evaluate_stored_or_global(job: ClientJob, key: str) -> dict:
    """Reply metrics of a method whose personalized model is the one kept under ``key``
    (:func:`stored_or_global`; the server's model, tested once, while there is none) and
    whose global model is the server's."""
    global_ = job.test_global()
    stored = job.load_state_model(key)
    return eval_metrics(job, global_ if stored is None else job.test(stored), global_)


def fine_tuned(job: ClientJob, model: nn.Module, default_epochs: int) -> nn.Module:
    """``model`` fine-tuned whole, in place, on the local training split for the method's
    ``finetune-epochs`` (``default_epochs`` when the message has none; 0: unchanged), with the same
    batches for every call of a round (the generator is seeded by the round); returned."""
    epochs = int(job.config.get(f"{job.method}.finetune-epochs", default_epochs))
    if epochs > 0:
        train_epochs(
            model,
            job.data.x_train,
            job.data.y_train,
            generator=job.generator("finetune"),
            **(job.train_kwargs() | {"epochs": epochs}),
        )
    return model


def prox_hook(anchor: nn.Module, weight: float, *, copy: bool = True):
    """A gradient hook adding ``weight * (w - anchor)``: the gradient of (weight/2)||w - anchor||^2.

    The anchor's values are copied when the hook is made (``copy``): FedProx trains the
    model it is anchored to. A solver whose anchor stays as it is while the hook is used
    (Ditto's and FedAMP's received model, trained after or never) passes ``copy=False``
    and saves a model's copy per message (1.7 ms for MNIST's CNN,
    ``benchmarks/results/client_message.md``)."""
    anchor_params = [p.detach().clone() if copy else p.detach() for p in anchor.parameters()]

    def hook(model: nn.Module) -> None:
        for param, ref in zip(model.parameters(), anchor_params, strict=True):
            if param.grad is not None:
                param.grad.add_(param.detach() - ref, alpha=weight)

    return hook


# --------------------------------------------------------------------------- split models
# A model assembled from a received part and a part the client keeps, and training
# restricted to one part. The split is pflarena.core.model_split.split_state of the run's model
# with the number of head layers the strategy sends (``<method>.head-layers``, or
# LG-FedAvg's ``global-layers``), so server and client take the same one by name. The
# received record holds exactly the shared entries; the private ones come from the
# client's state under the method's key, or from the run's initial model before the client
# first trained.
def model_split(job: ClientJob, head_layers: int) -> ModelSplit:
    """The body/head split of the run's model with ``head_layers`` head layers."""
    return split_state(job.new_model(), head_layers)


def assemble(job: ClientJob, shared: Sequence[str], private_key: str | None) -> nn.Module:
    """The run's model with the message's arrays (exactly the ``shared`` entries) and the
    rest from the client's state under ``private_key`` (None, or nothing stored yet: the run's
    initial values)."""
    received = job.arrays
    names = [] if received is None else list(received.keys())
    if names != list(shared):
        raise RuntimeError(
            f"{job.method}: the message must carry exactly the shared part of the model "
            f"({len(shared)} entries, first {list(shared)[:2]}), got {len(names)} entries "
            f"(first {names[:2]})"
        )
    model = job.new_model()
    state = model.state_dict()
    private = job.state.get(private_key) if private_key else None
    for record in (private, received):
        if record is None:
            continue
        for name, value in record.to_torch_state_dict().items():
            state[name] = value.to(job.device)
    model.load_state_dict(state)
    return model


def part_record(model: nn.Module, names: Sequence[str]) -> ArrayRecord:
    """The model's ``names`` entries as an ArrayRecord, in that order."""
    state = model.state_dict()
    return state_record({name: state[name].detach() for name in names})


def train_jointly(
    job: ClientJob, shared: Sequence[str], private: Sequence[str], private_key: str
) -> tuple[dict[str, ArrayRecord], dict]:
    """A round of a model split in a shared and a private part trained together (FedPer:
    shared body, private head; LG-FedAvg: the reverse): the received shared part with the
    client's private part (:func:`assemble`) trained by local SGD; the private part is kept
    under ``private_key``, the shared part is the reply."""
    model = assemble(job, shared, private_key)
    loss, steps = train_epochs(
        model,
        job.data.x_train,
        job.data.y_train,
        generator=job.generator("train"),
        **job.train_kwargs(),
    )
    job.state[private_key] = part_record(model, private)
    return {keys.ARRAYS: part_record(model, shared)}, train_metrics(job, loss, steps)


@dataclass(frozen=True)
class KeptPartSolver:
    """The solver of a model split in two parts trained together, one of them kept on the
    client under ``key`` (:func:`train_jointly`): FedPer keeps the head, LG-FedAvg the body.
    ``layers`` names the parameter that counts the head's weighted layers."""

    layers: str
    kept: Literal["head", "body"]
    key: str

    def parts(self, job: ClientJob) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the shared part's names, the kept part's)."""
        split = model_split(job, int(job.param(self.layers)))
        return (split.body, split.head) if self.kept == "head" else (split.head, split.body)

    def train(self, job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
        shared, kept = self.parts(job)
        return train_jointly(job, shared, kept, self.key)

    def personalized_model(self, job: ClientJob) -> nn.Module:
        """The latest shared part with this client's kept part."""
        return assemble(job, self.parts(job)[0], self.key)

    def evaluate(self, job: ClientJob) -> dict:
        return eval_metrics(job, job.test(self.personalized_model(job)), None)


def train_part(
    model: nn.Module, trained: Collection[str], job: ClientJob, purpose: str, **overrides
) -> tuple[float, int]:
    """Local SGD on the parameters named in ``trained`` only, the others frozen (no
    gradient, so SGD, momentum and weight decay leave them exactly as they were); the
    run's training settings with ``overrides``."""
    chosen = set(trained)
    frozen = [p for name, p in model.named_parameters() if name not in chosen]
    for param in frozen:
        param.requires_grad_(False)
    try:
        return train_epochs(
            model,
            job.data.x_train,
            job.data.y_train,
            generator=job.generator(purpose),
            **(job.train_kwargs() | overrides),
        )
    finally:
        for param in frozen:
            param.requires_grad_(True)
