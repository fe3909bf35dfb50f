"""The body/head split of a model, by state-dict entry name.

Split-model methods (FedPer, FedRep, LG-FedAvg, FedBABU, Fed-ROD, FedRecon, SplitGP) say
which of a model's parameters are shared and which stay on the client. The split is taken
here, once for every model of the zoo (:mod:`pflarena.core.models`), so that a strategy and
its solver agree on it by name without knowing the architecture:

* a **weighted layer** is a module that owns trainable parameters directly (a ``Linear``,
  a ``Conv2d``, a ``BatchNorm2d``'s affine weight and bias, an ``LSTM``, an ``Embedding``),
  named by its module prefix (``classifier.2``, ``layer4.1.bn2``); :func:`layer_owners`
  lists them in state order;
* the **head** is every state entry (parameters *and* buffers, so a BatchNorm layer's running
  statistics go with it) of the last ``head_layers`` weighted layers; the **body** is every
  other entry. An entry belongs to the innermost weighted layer whose prefix contains it;
  an entry of a module without weights (a buffer of a weightless module) is in the body.

``head_layers = 1`` (the default) is the final classifier layer: ``fc`` of ResNet-18,
``classifier.2`` of the FedAvg CNN, ``output`` of the character LSTM. A head that would take
every weighted layer leaves no body and is refused (:class:`SplitError`): logistic regression
has one weighted layer and so no body/head split.

API (stable; the split-model strategies and solvers build on it):

* :class:`ModelSplit`: the frozen pair of name tuples ``body`` and ``head``, in state order;
* :func:`split_state` (a model) and :func:`split_names` (state names and trainable names,
  for the server side, which holds arrays rather than a model);
* :func:`weighted_layers` (a model) and :func:`layer_owners` (trainable names);
* :func:`layer_entries`: every state entry of given layers, :func:`copied_entries`, those
  of the last few (PPFL's canonical layers), and :func:`top_trainable`, their trainable
  parameters (FedALA's higher layers);
* :func:`split_problem`: whether a run's model has the split a method asks for, from the
  model's names alone (:mod:`pflarena.core.model_layouts`), so a run config is checked
  without torch.

Only :func:`split_state` and :func:`weighted_layers` take a model; the rest take names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pflarena.core.model_layouts import run_layout

if TYPE_CHECKING:  # the split is taken from names: checking a run config needs no torch
    from torch import nn

__all__ = [
    "ModelSplit",
    "SplitError",
    "copied_entries",
    "layer_entries",
    "layer_owners",
    "split_names",
    "split_problem",
    "split_state",
    "top_trainable",
    "weighted_layers",
]

V = TypeVar("V")


class SplitError(ValueError):
    """A body/head split that cannot be taken (the head would swallow the whole model)."""


@dataclass(frozen=True)
class ModelSplit:
    """A partition of a model's state-dict entries into a body and a head.

    Attributes
    ----------
    body : tuple of str
        The representation (feature extractor): state entries outside the head, in state
        order.
    head : tuple of str
        The state entries of the last weighted layer(s), in state order.
    """

    body: tuple[str, ...]
    head: tuple[str, ...]

    def __post_init__(self) -> None:
        overlap = set(self.body) & set(self.head)
        if overlap:
            raise SplitError(f"body and head share entries {sorted(overlap)}")

    @property
    def names(self) -> tuple[str, ...]:
        """Every entry: the body's, then the head's."""
        return self.body + self.head

    def body_of(self, state: Mapping[str, V]) -> dict[str, V]:
        """The body's entries of ``state`` (a state dict, an ArrayRecord's items), in body order."""
        return {name: state[name] for name in self.body}

    def head_of(self, state: Mapping[str, V]) -> dict[str, V]:
        """The head's entries of ``state``, in head order."""
        return {name: state[name] for name in self.head}


def _owner(name: str) -> str:
    """The module prefix of a state entry (``""``: the root module's own entry)."""
    return name.rsplit(".", 1)[0] if "." in name else ""


def layer_owners(trainable: Sequence[str]) -> list[str]:
    """The weighted layers' module prefixes, in order, from trainable parameter names.

    ``trainable`` lists the model's trainable parameter names in state order
    (``[n for n, p in model.named_parameters() if p.requires_grad]``, what the server gets
    as ``StrategySetup.trainable``). The root module's own parameters, if any, are owned by
    ``""``.
    """
    owners: list[str] = []
    for name in trainable:
        owner = _owner(name)
        if owner not in owners:
            owners.append(owner)
    return owners


def top_trainable(trainable: Sequence[str], layers: int) -> list[str]:
    """The trainable parameters of the last ``layers`` weighted layers, in state order
    (FedALA's higher layers)."""
    owners = layer_owners(trainable)
    return layer_entries(trainable, owners, owners[-layers:])


def weighted_layers(model: nn.Module) -> list[str]:
    """The module prefixes that own trainable parameters, in order (:func:`layer_owners`)."""
    return layer_owners([name for name, p in model.named_parameters() if p.requires_grad])


def _layer_of(name: str, owners: Sequence[str]) -> str | None:
    """The innermost weighted layer holding entry ``name``, or None."""
    path = _owner(name)
    best: str | None = None
    for owner in owners:
        inside = path == owner if owner == "" else path == owner or path.startswith(owner + ".")
        if inside and (best is None or len(owner) > len(best)):
            best = owner
    return best


def layer_entries(
    state_names: Sequence[str], owners: Sequence[str], layers: Sequence[str]
) -> list[str]:
    """Every entry of ``state_names`` (parameters and buffers) that belongs to one of
    ``layers``, a subset of the weighted layers ``owners``, in state order."""
    chosen = set(layers)
    unknown = chosen - set(owners)
    if unknown:
        raise SplitError(f"{sorted(unknown)} are not weighted layers of the model")
    return [name for name in state_names if _layer_of(name, owners) in chosen]


def copied_entries(state_names: Sequence[str], trainable: Sequence[str], layers: int) -> list[str]:
    """The state entries copied K times: those of the last ``layers`` weighted layers.

    ``layers = 0`` copies every state entry (the whole model is canonical). Every entry of
    a chosen layer is copied, buffers included (a BatchNorm layer's statistics belong to it):
    the head of :func:`split_names`, where ``layers`` may also take every weighted layer.
    """
    if layers < 0:
        raise ValueError(f"the number of copied layers must be >= 0, got {layers}")
    if layers == 0:
        return list(state_names)
    owners = layer_owners(trainable)
    if layers > len(owners):
        raise ValueError(
            f"{layers} copied layers requested, but the model has {len(owners)} layers with "
            "weights; use at most that many (0 copies the whole model)"
        )
    return layer_entries(state_names, owners, owners[-layers:])


def split_names(
    state_names: Sequence[str], trainable: Sequence[str], head_layers: int = 1
) -> ModelSplit:
    """The body/head split from the model's state names and trainable parameter names.

    Parameters
    ----------
    state_names : sequence of str
        Every state-dict entry, in order (``model.state_dict().keys()``, an ArrayRecord's
        keys).
    trainable : sequence of str
        The trainable parameter names, in state order.
    head_layers : int
        How many final weighted layers form the head (at least 1, fewer than the model has).

    Raises
    ------
    SplitError
        When ``head_layers`` < 1, or when the head would take every weighted layer.
    """
    if head_layers < 1:
        raise SplitError(f"head_layers must be >= 1, got {head_layers}")
    owners = layer_owners(trainable)
    if head_layers >= len(owners):
        raise SplitError(
            f"a head of {head_layers} layer(s) would swallow the whole model: it has "
            f"{len(owners)} layer(s) with weights ({', '.join(o or '<root>' for o in owners)}), "
            f"so head_layers must be at most {len(owners) - 1}"
            + ("; a one-layer model (logreg) has no body/head split" if len(owners) == 1 else "")
        )
    head = layer_entries(state_names, owners, owners[-head_layers:])
    head_set = set(head)
    return ModelSplit(
        body=tuple(n for n in state_names if n not in head_set),
        head=tuple(head),
    )


def split_state(model: nn.Module, head_layers: int = 1) -> ModelSplit:
    """The body/head split of ``model``'s state dict: the head is every entry of its last
    ``head_layers`` weighted layers (see :func:`split_names`)."""
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    return split_names(list(model.state_dict().keys()), trainable, head_layers)


def split_problem(cfg: Any, head_layers: int, key: str) -> list[str]:
    """The run's model must have a body/head split with ``head_layers`` head layers
    (checked before a run starts, from the model's names: :func:`run_layout`; ``key`` names
    the setting in the message)."""
    layout = run_layout(cfg)
    try:
        split_names(layout.state, layout.trainable, head_layers)
    except SplitError as exc:
        return [f"{key}={head_layers} with model {cfg.model_name()!r}: {exc}"]
    return []
