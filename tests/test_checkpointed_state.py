"""State declared in ``checkpointed`` and ``checkpointed_values``: kept under the keys and JSON
paths the hand-written pairs used, so that checkpoints written before still restore."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import config

from pflarena.core.federation import load_server_data
from pflarena.server.build import build_strategy
from pflarena.strategies.base import PflStrategy


def _strategy(method: str, **overrides) -> PflStrategy:
    return build_strategy(config(strategy=method, num_clients=4, **overrides))


def _base_meta(strategy: PflStrategy) -> dict:
    return strategy.checkpoint_state()[1]


def test_matrices_restore_from_the_old_layout():
    """FedAMP's attention and FedFOMO's affinity: one array each, under ``<method>/<name>``."""
    attention = np.arange(16, dtype=np.float64).reshape(4, 4) / 10
    fedamp = _strategy("fedamp")
    fedamp.restore_state({"fedamp/attention": attention}, _base_meta(fedamp))
    np.testing.assert_array_equal(fedamp.attention, attention)
    assert fedamp.attention.dtype == np.float64
    arrays, _ = fedamp.checkpoint_state()
    assert list(arrays) == ["fedamp/attention"]
    np.testing.assert_array_equal(arrays["fedamp/attention"], attention)

    affinity = -np.eye(4)
    fomo = _strategy("fedfomo", validation_fraction=0.2)
    meta = _base_meta(fomo)
    meta["fedfomo"] = {"epsilon": 0.25}
    fomo.restore_state({"fedfomo/affinity": affinity}, meta)
    np.testing.assert_array_equal(fomo.affinity, affinity)
    assert fomo.epsilon == 0.25
    arrays, meta = fomo.checkpoint_state()
    assert list(arrays) == ["fedfomo/affinity"] and meta["fedfomo"] == {"epsilon": 0.25}


def test_a_matrix_of_another_shape_is_refused():
    fedamp = _strategy("fedamp")
    with pytest.raises(ValueError, match="fedamp/attention"):
        fedamp.restore_state({"fedamp/attention": np.zeros((3, 3))}, _base_meta(fedamp))


@pytest.mark.parametrize(
    ("method", "attribute", "prefix"),
    [("feddyn", "state", "h/"), ("scaffold", "control", "control/")],
)
def test_server_states_restore_from_the_old_layout(method, attribute, prefix):
    strategy = _strategy(method)
    assert getattr(strategy, attribute) is None  # before the first round: nothing to keep
    assert strategy.checkpoint_state()[0] == {}
    old = {f"{prefix}layer.weight": np.full((2, 3), 0.5, np.float32)}
    old[f"{prefix}layer.bias"] = np.array([1.0, -1.0], np.float32)
    strategy.restore_state(old, _base_meta(strategy))
    state = getattr(strategy, attribute)
    assert list(state) == ["layer.weight", "layer.bias"]
    np.testing.assert_array_equal(state["layer.weight"], np.full((2, 3), 0.5))
    np.testing.assert_array_equal(state["layer.bias"], [1.0, -1.0])
    arrays, _ = strategy.checkpoint_state()
    assert list(arrays) == [f"{prefix}layer.weight", f"{prefix}layer.bias"]
    state["layer.bias"][0] = 7.0  # the checkpoint holds copies
    assert arrays[f"{prefix}layer.bias"][0] == 1.0


def test_a_checkpoint_without_the_state_leaves_it_as_constructed():
    strategy = _strategy("scaffold")
    strategy.restore_state({}, _base_meta(strategy))
    assert strategy.control is None


def test_pfedgt_messages_restore_from_the_old_layout():
    strategy = _strategy("pfedgt")
    old = {
        "message/w": np.array([1.0, 2.0], np.float32),
        "message-mean/w": np.array([3.0, 4.0], np.float32),
    }
    strategy.restore_state(old, _base_meta(strategy))
    np.testing.assert_array_equal(strategy.message["w"], [1.0, 2.0])
    np.testing.assert_array_equal(strategy.message_mean["w"], [3.0, 4.0])
    arrays, _ = strategy.checkpoint_state()
    assert list(arrays) == ["message/w", "message-mean/w"]


def test_splitgp_aux_restores_from_the_old_layout():
    strategy = _strategy("splitgp")
    names = list(strategy.aux)
    arrays, _ = strategy.checkpoint_state()
    assert list(arrays) == [f"splitgp-aux/{n}" for n in names]
    old = {f"splitgp-aux/{n}": np.full(strategy.aux[n].shape, 0.125, np.float32) for n in names}
    twin = _strategy("splitgp")
    twin.restore_state(old, _base_meta(twin))
    assert list(twin.aux) == names
    for name in names:
        np.testing.assert_array_equal(twin.aux[name], np.full(strategy.aux[name].shape, 0.125))
    assert twin._aux_record is None


def _resumed(strategy: PflStrategy, twin: PflStrategy) -> PflStrategy:
    """``twin`` (a fresh strategy) restored from ``strategy``'s checkpoint, its JSON part
    through JSON as in ``checkpoint.npz``."""
    arrays, meta = strategy.checkpoint_state()
    twin.restore_state(arrays, json.loads(json.dumps(meta)))
    return twin


def test_fedfomo_epsilon_is_a_declared_value_restored_as_a_float():
    fomo = _strategy("fedfomo", validation_fraction=0.2)
    fomo.epsilon, fomo.affinity[1, 2] = 0.125, 3.0
    twin = _resumed(fomo, _strategy("fedfomo", validation_fraction=0.2))
    assert twin.epsilon == 0.125 and type(twin.epsilon) is float
    np.testing.assert_array_equal(twin.affinity, fomo.affinity)
    # a value JSON gives back as an int is restored as the constructor's float
    meta = _base_meta(twin) | {"fedfomo": {"epsilon": 0}}
    twin.restore_state({}, meta)
    assert twin.epsilon == 0.0 and type(twin.epsilon) is float
    # a numpy scalar is written as its Python value
    twin.epsilon = np.float64(0.5)
    assert type(twin.checkpoint_state()[1]["fedfomo"]["epsilon"]) is float


def test_a_checkpoint_without_a_declared_value_leaves_it_as_constructed():
    fomo = _strategy("fedfomo", validation_fraction=0.2)
    constructed = fomo.epsilon
    fomo.restore_state({}, _base_meta(_strategy("fedamp")))  # no "fedfomo" part at all
    assert fomo.epsilon == constructed


def test_pfedsv_features_restore_from_the_old_layout():
    strategy = _strategy("pfedsv", validation_fraction=0.2)
    assert strategy.features is None and strategy.checkpoint_state()[0] == {}
    features = {"conv.weight": np.full((2, 3), 0.5, np.float32), "conv.bias": np.ones(2)}
    old = {f"features/{n}": v for n, v in features.items()}
    meta = _base_meta(strategy) | {"pfedsv": {"relevance": {"1": [0.5, 0.25]}, "uploads": {}}}
    strategy.restore_state(old, meta)
    assert list(strategy.features) == list(features)
    for name, value in features.items():
        np.testing.assert_array_equal(strategy.features[name], value)
        assert strategy.features[name].dtype == value.dtype
    # the relevance rows of an older checkpoint's JSON part, as arrays
    assert list(strategy.relevance) == [1]
    np.testing.assert_array_equal(strategy.relevance[1], [0.5, 0.25])
    twin = _resumed(strategy, _strategy("pfedsv", validation_fraction=0.2))
    arrays, meta = strategy.checkpoint_state()
    assert sorted(arrays) == sorted(old) + ["pfedsv/relevance", "pfedsv/relevance-clients"]
    assert "relevance" not in meta["pfedsv"]
    np.testing.assert_array_equal(arrays["pfedsv/relevance"], [[0.5, 0.25]])
    np.testing.assert_array_equal(arrays["pfedsv/relevance-clients"], [1])
    for name, value in features.items():
        np.testing.assert_array_equal(twin.features[name], value)
    assert list(twin.relevance) == [1]
    np.testing.assert_array_equal(twin.relevance[1], [0.5, 0.25])


def test_page_last_accuracy_restores_from_the_old_layout():
    cfg = config(strategy="page", dataset="synthetic", num_clients=4, server_fraction=0.2)
    strategy = build_strategy(cfg, load_server_data(cfg.federation_spec()))
    accuracy = np.array([0.5, np.nan, 0.25, 1.0])
    strategy.last_accuracy = accuracy.copy()
    arrays, meta = strategy.checkpoint_state()
    assert "page/last-accuracy" in arrays
    np.testing.assert_array_equal(arrays["page/last-accuracy"], accuracy)
    twin = build_strategy(cfg, load_server_data(cfg.federation_spec()))
    twin.restore_state(arrays, json.loads(json.dumps(meta)))
    np.testing.assert_array_equal(twin.last_accuracy, accuracy)
    assert twin.last_accuracy.dtype == np.float64
    strategy.last_accuracy[0] = 7.0  # the checkpoint holds a copy
    assert arrays["page/last-accuracy"][0] == 0.5


@pytest.mark.parametrize("folded", [None, 3])
def test_ppfl_memberships_and_folded_round_restore_from_the_old_layout(folded):
    """C, n_i and the label histograms under ``ppfl-*``; the folded round in ``meta["ppfl"]``."""
    overrides = {"ppfl.affinity": "labels"}
    strategy = _strategy("ppfl", **overrides)
    memberships = np.full((4, strategy.params.num_canonical), 1 / strategy.params.num_canonical)
    memberships[0] = np.eye(strategy.params.num_canonical)[0]
    histograms = np.arange(4 * 10, dtype=np.float64).reshape(4, 10)
    old_arrays = {
        "ppfl-memberships": memberships,
        "ppfl-num-examples": np.array([10.0, 0.0, 5.0, 7.0]),
        "ppfl-histograms": histograms,
        "ppfl-history": np.zeros((0, 4, strategy.params.num_canonical)),
    }
    old_meta = _base_meta(strategy)
    old_meta["ppfl"] = {
        "block_rng": strategy.block_rng.bit_generator.state,
        "blocks": {},
        "objective": {},
        "history_rounds": [],
        "folded_round": folded,
    }
    strategy.restore_state(old_arrays, json.loads(json.dumps(old_meta)))
    np.testing.assert_array_equal(strategy.memberships, memberships)
    np.testing.assert_array_equal(strategy.num_examples, [10.0, 0.0, 5.0, 7.0])
    np.testing.assert_array_equal(strategy.histograms, histograms)
    assert strategy.folded_round == folded and type(strategy.folded_round) is type(folded)
    arrays, meta = strategy.checkpoint_state()
    assert sorted(arrays) == sorted(old_arrays)
    assert meta["ppfl"] == old_meta["ppfl"]
    twin = _resumed(strategy, _strategy("ppfl", **overrides))
    for name in ("memberships", "num_examples", "histograms"):
        np.testing.assert_array_equal(getattr(twin, name), getattr(strategy, name))
        assert getattr(twin, name).dtype == np.float64
    assert twin.folded_round == folded and type(twin.folded_round) is type(folded)


def test_ppfl_without_histograms_keeps_none():
    strategy = _strategy("ppfl", **{"ppfl.affinity": "none"})
    assert "ppfl-histograms" not in strategy.checkpoint_state()[0]
    twin = _resumed(strategy, _strategy("ppfl", **{"ppfl.affinity": "none"}))
    assert twin.histograms is None and twin.folded_round is None
