"""State declared in ``checkpointed``: kept under the keys the hand-written pairs used, so that
checkpoints written before still restore."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import config

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
