"""Running and re-initialising a model's head, for split methods that need more than names.

:mod:`pflarena.core.model_split` names a model's head (its last weighted layers) and body. Fed-ROD,
FedRecon and SplitGP also compute with the two parts apart, on every model of the zoo and
without knowing its architecture:

* :func:`head_input` records the input of the head's first layer during an ordinary forward
  pass: the body's features ``z`` (Fed-ROD's representation, SplitGP's smashed data);
* :func:`head_forward` runs the model's head on given features with other head entries (a
  second head: Fed-ROD's personalized head);
* :func:`reset_layers` draws fresh initial values for some layers, seeded (FedRecon's
  reconstruction from scratch).

:func:`head_forward` runs the whole model through :func:`torch.func.functional_call` and
swaps the first head layer's input for the given features, so whatever the model's forward
does between its head layers (activations, dropout, a flatten) is done exactly. The body
is computed once more and thrown away: it costs a forward pass of the body, builds no graph
through it (no body tensor requires a gradient there), and touches no running statistics
(the call gets copies of the buffers).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from torch.func import functional_call

from pflarena.core.model_split import weighted_layers

__all__ = [
    "feature_size",
    "first_head_layer",
    "head_forward",
    "head_input",
    "reset_layers",
]


def first_head_layer(model: nn.Module, head_layers: int) -> str:
    """The module prefix of the first of the model's last ``head_layers`` weighted layers."""
    owners = weighted_layers(model)
    if not 1 <= head_layers < len(owners):
        raise ValueError(
            f"head_layers must be in [1, {len(owners) - 1}] for this model, got {head_layers}"
        )
    return owners[-head_layers]


@contextmanager
def head_input(model: nn.Module, layer: str) -> Iterator[list[torch.Tensor]]:
    """Record the input of ``layer`` (the head's first layer) at every forward pass.

    Yields a list that each forward pass of ``model`` inside the block appends the layer's
    input tensor to (with its graph: a loss on it reaches the body).
    """
    seen: list[torch.Tensor] = []

    def record(_module: nn.Module, args: tuple) -> None:
        seen.append(args[0])

    handle = model.get_submodule(layer).register_forward_pre_hook(record)
    try:
        yield seen
    finally:
        handle.remove()


@torch.no_grad()
def feature_size(model: nn.Module, layer: str, sample: torch.Tensor) -> int:
    """How many values the input of ``layer`` has per sample (flattened), found by one
    forward pass of ``sample`` (a batch of one) in evaluation mode."""
    was_training = model.training
    model.eval()
    try:
        with head_input(model, layer) as seen:
            model(sample)
    finally:
        model.train(was_training)
    return int(seen[-1][0].numel())


def head_forward(
    model: nn.Module,
    layer: str,
    x: torch.Tensor,
    features: torch.Tensor,
    head: Mapping[str, torch.Tensor],
) -> torch.Tensor:
    """The model's output with ``features`` as the input of ``layer`` and the head entries
    ``head`` in place of the model's own.

    ``x`` is the batch the features came from (the body runs on it and its result is
    replaced); ``head`` maps state names of the head (parameters, and buffers where the head
    has them) to tensors. Running statistics of the head's BatchNorm layers, in training
    mode, are updated in ``head``'s tensors; the model's own buffers are left alone.
    """

    def replace(_module: nn.Module, _args: tuple) -> tuple:
        return (features,)

    tensors = {name: param.detach() for name, param in model.named_parameters()}
    tensors.update({name: buffer.clone() for name, buffer in model.named_buffers()})
    tensors.update(head)
    handle = model.get_submodule(layer).register_forward_pre_hook(replace)
    try:
        return functional_call(model, tensors, (x,))
    finally:
        handle.remove()


def reset_layers(model: nn.Module, layers: Sequence[str], seed: int) -> None:
    """Give the weighted layers ``layers`` of ``model`` fresh initial values, drawn from the
    layers' own initialisation (``reset_parameters``) under ``seed``.

    The caller's torch RNG is left untouched. A BatchNorm layer's running statistics are
    reset with its affine parameters.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name in layers:
            module = model.get_submodule(name)
            reset = getattr(module, "reset_parameters", None)
            if reset is None:
                raise ValueError(
                    f"layer {name!r} ({type(module).__name__}) has no reset_parameters; "
                    "it cannot be re-initialised"
                )
            reset()
