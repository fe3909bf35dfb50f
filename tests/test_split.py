"""The body/head split of every model: a partition of the state, the head named by hand.

The expected heads are written out from each architecture's definition in
``core/models.py`` (module indices counted by hand), not recomputed by the split, so a
split that picks the wrong layer, drops a buffer or puts an entry on both sides fails.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pflarena.core.model_split import (
    ModelSplit,
    SplitError,
    layer_entries,
    layer_owners,
    split_names,
    split_state,
    weighted_layers,
)
from pflarena.core.models import MODEL_NAMES, build_model

SHAPES = {
    "digits": ((1, 8, 8), 10),
    "mnist": ((1, 28, 28), 10),
    "cifar": ((3, 32, 32), 10),
    "har": ((9, 1, 128), 6),
    "tiny": ((3, 64, 64), 200),
    "chars": ((80,), 80),
}

BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _entries(module: str, names=("weight", "bias")) -> tuple[str, ...]:
    return tuple(f"{module}.{n}" for n in names)


LSTM = tuple(
    f"lstm.{kind}_{part}_l{layer}"
    for layer in (0, 1)
    for kind, part in (("weight", "ih"), ("weight", "hh"), ("bias", "ih"), ("bias", "hh"))
)

#: model -> (data, {head_layers: expected head}). The heads are the last weighted layers,
#: named from the module definitions: e.g. the FedAvg CNN's classifier is
#: Sequential(Linear 0, ReLU 1, Linear 2), TF-CNN's Sequential(Linear 0, Dropout 1, ReLU 2,
#: Linear 3, Dropout 4, ReLU 5, Linear 6), cnn-bn's features (Conv 0, BN 1, ReLU 2, MaxPool 3,
#: Conv 4, BN 5, ...).
EXPECTED: dict[str, tuple[str, dict[int, tuple[str, ...]]]] = {
    "mlp": ("digits", {1: _entries("net.5"), 2: _entries("net.3") + _entries("net.5")}),
    "mlp-128": ("mnist", {1: _entries("net.3")}),
    "cnn": (
        "mnist",
        {1: _entries("classifier.2"), 2: _entries("classifier.0") + _entries("classifier.2")},
    ),
    "cnn-bn": (
        "cifar",
        {
            1: _entries("classifier.2"),
            3: _entries("features.5", BN) + _entries("classifier.0") + _entries("classifier.2"),
            4: ("features.4.weight",)  # the convolution before BatchNorm has no bias
            + _entries("features.5", BN)
            + _entries("classifier.0")
            + _entries("classifier.2"),
        },
    ),
    "cnn-pfllib": ("mnist", {1: _entries("classifier.2")}),
    "small-cnn": ("digits", {1: _entries("classifier.2")}),
    "small-cnn-bn": (
        "digits",
        {
            1: _entries("classifier.2"),
            3: _entries("features.4", BN) + _entries("classifier.0") + _entries("classifier.2"),
        },
    ),
    "tf-cnn": (
        "cifar",
        {1: _entries("classifier.6"), 2: _entries("classifier.3") + _entries("classifier.6")},
    ),
    "tf-cnn-same": ("cifar", {1: _entries("classifier.4")}),
    "lenet5": (
        "mnist",
        {
            1: _entries("classifier.4"),
            4: _entries("features.3")
            + _entries("classifier.0")
            + _entries("classifier.2")
            + _entries("classifier.4"),
        },
    ),
    "harcnn": ("har", {1: _entries("classifier.4")}),
    "char-lstm": ("chars", {1: _entries("output"), 2: LSTM + _entries("output")}),
    "char-lstm-100": ("chars", {1: _entries("output")}),
    "nf-resnet18-slim": (
        "cifar",
        {
            1: _entries("head"),
            2: _entries("blocks.5.conv2", ("weight", "bias", "gain")) + _entries("head"),
        },
    ),
    "resnet18": (
        "cifar",
        {
            1: _entries("fc"),
            2: _entries("layer4.1.bn2", BN) + _entries("fc"),
            3: ("layer4.1.conv2.weight",) + _entries("layer4.1.bn2", BN) + _entries("fc"),
        },
    ),
    "resnet18-gn": ("cifar", {1: _entries("fc"), 2: _entries("layer4.1.bn2") + _entries("fc")}),
    "resnet18-cifar": ("cifar", {1: _entries("fc")}),
    "resnet18-cifar-gn": ("cifar", {1: _entries("fc")}),
    "resnet18-64": ("tiny", {1: _entries("fc")}),
    "resnet18-64-gn": ("tiny", {1: _entries("fc")}),
}

#: weighted layers of each model with few of them (the rest have many)
LAYER_COUNTS = {"mlp": 3, "mlp-128": 2, "cnn": 4, "small-cnn": 4, "char-lstm": 3, "lenet5": 5}


def test_every_model_but_logistic_regression_has_a_split_here():
    assert set(EXPECTED) | {"logreg"} == set(MODEL_NAMES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_split_partitions_the_state_and_the_head_is_the_last_layers(name):
    data, heads = EXPECTED[name]
    shape, classes = SHAPES[data]
    model = build_model(name, shape, classes, seed=0)
    state = list(model.state_dict())
    for head_layers, expected in heads.items():
        split = split_state(model, head_layers)
        assert split.head == expected, (name, head_layers)
        assert set(split.body) | set(split.head) == set(state)
        assert not set(split.body) & set(split.head)
        assert len(split.body) + len(split.head) == len(state)
        assert split.body == tuple(n for n in state if n not in set(expected))  # state order
        assert split.body  # a body is left
    assert split_state(model) == split_state(model, 1)  # the default head is one layer
    if name in LAYER_COUNTS:
        assert len(weighted_layers(model)) == LAYER_COUNTS[name]


def test_logistic_regression_and_a_head_of_every_layer_are_refused_by_name():
    logreg = build_model("logreg", (1, 8, 8), 10)
    with pytest.raises(SplitError, match="swallow the whole model.*one-layer model"):
        split_state(logreg)
    mlp = build_model("mlp", (1, 8, 8), 10)
    assert len(split_state(mlp, 2).head) == 4
    with pytest.raises(SplitError, match="head of 3 layer.*3 layer.*at most 2"):
        split_state(mlp, 3)
    with pytest.raises(SplitError, match=">= 1"):
        split_state(mlp, 0)
    with pytest.raises(SplitError, match="share"):
        ModelSplit(body=("a", "b"), head=("b",))


def test_names_alone_give_the_same_split_as_the_model():
    """The server holds arrays and trainable names, not a model: split_names agrees."""
    model = build_model("small-cnn-bn", (1, 8, 8), 10)
    trainable = [n for n, p in model.named_parameters()]
    for layers in (1, 2, 3):
        assert split_names(list(model.state_dict()), trainable, layers) == split_state(
            model, layers
        )


class _Nested(nn.Module):
    """A module owning a parameter directly *and* through a child, a weightless buffer
    module, and a root parameter: the cases the zoo does not have."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.block = nn.Linear(2, 2)
        self.block.inner = nn.Linear(2, 2)
        self.stats = nn.BatchNorm1d(2, affine=False)
        self.out = nn.Linear(2, 2)


def test_entries_go_to_their_innermost_weighted_layer():
    model = _Nested()
    assert weighted_layers(model) == ["", "block", "block.inner", "out"]
    names = list(model.state_dict())
    owners = layer_owners([n for n, _ in model.named_parameters()])
    # "block" owns block.weight/bias but not block.inner.*; the root owns only "scale"
    assert layer_entries(names, owners, ["block"]) == ["block.weight", "block.bias"]
    assert layer_entries(names, owners, [""]) == ["scale"]
    split = split_state(model, 2)
    assert split.head == ("block.inner.weight", "block.inner.bias", "out.weight", "out.bias")
    # the non-affine BatchNorm owns no weights: its statistics stay in the body
    assert "stats.running_mean" in split.body
    with pytest.raises(SplitError, match="not weighted layers"):
        layer_entries(names, owners, ["stats"])


def test_body_of_and_head_of_pick_entries_in_order():
    split = ModelSplit(body=("a", "c"), head=("b",))
    state = {"a": 1, "b": 2, "c": 3}
    assert split.body_of(state) == {"a": 1, "c": 3}
    assert split.head_of(state) == {"b": 2}
    assert split.names == ("a", "c", "b")
