"""The strategies' one averaging, flattening and decoding module, against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from helpers import config, grid_for

from pflarena.core import keys
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy
from pflarena.strategies import aggregation as module
from pflarena.strategies.aggregation import (
    as_numpy,
    as_record,
    flatten,
    float_names,
    unflatten,
    weighted_average,
    weighted_mean,
)


def _record(w, b, counter, flag) -> ArrayRecord:
    return ArrayRecord(
        {
            "w": Array(np.array(w, dtype=np.float32)),
            "b": Array(np.array(b, dtype=np.float64)),
            "bn.num_batches_tracked": Array(np.array(counter, dtype=np.int64)),  # 0-d
            "flag": Array(np.array(flag, dtype=np.bool_)),
        }
    )


RECORDS = [
    _record([1.0, 2.0], [0.5], 10, [True, False]),
    _record([3.0, 4.0], [1.5], 13, [False, False]),
    _record([5.0, -2.0], [-1.0], 20, [True, True]),
]
WEIGHTS = [1.0, 1.0, 2.0]  # factors 1/4, 1/4, 1/2


@pytest.mark.parametrize("like_fedavg", [False, True])
def test_the_weighted_mean_by_hand(like_fedavg):
    got = weighted_mean(RECORDS, WEIGHTS, like_fedavg=like_fedavg)
    assert list(got) == ["w", "b", "bn.num_batches_tracked", "flag"]
    # w: (1 + 3 + 2·5)/4 = 3.5, (2 + 4 − 2·2)/4 = 0.5
    np.testing.assert_array_equal(got["w"], np.array([3.5, 0.5], dtype=np.float32))
    assert got["w"].dtype == np.float32
    # b: (0.5 + 1.5 − 2·1)/4 = 0
    np.testing.assert_array_equal(got["b"], [0.0])
    assert got["b"].dtype == np.float64
    # the counter: (10 + 13 + 2·20)/4 = 15.75, rounded: 16, still a 0-d int64
    assert got["bn.num_batches_tracked"].dtype == np.int64
    assert got["bn.num_batches_tracked"].shape == ()
    assert int(got["bn.num_batches_tracked"]) == 16
    # flags: (1 + 0 + 2·1)/4 = 0.75 → True; (0 + 0 + 2·1)/4 = 0.5 → half to even: False
    np.testing.assert_array_equal(got["flag"], [True, False])
    assert got["flag"].dtype == np.bool_


def test_integer_entries_round_half_to_even_and_equal_weights_by_default():
    def counters(*values):
        return [ArrayRecord({"n": Array(np.array(v, dtype=np.int32))}) for v in values]

    assert int(weighted_mean(counters(1, 2))["n"]) == 2  # 1.5
    assert int(weighted_mean(counters(2, 3))["n"]) == 2  # 2.5
    assert int(weighted_mean(counters(2, 3, 3))["n"]) == 3  # 2.67
    assert weighted_mean(counters(7, 9))["n"].dtype == np.int32


def test_float64_output_for_a_step_that_goes_on_in_float64():
    got = weighted_mean(RECORDS, WEIGHTS, dtype=np.float64)
    assert got["w"].dtype == np.float64
    np.testing.assert_array_equal(got["w"], [3.5, 0.5])
    assert got["bn.num_batches_tracked"].dtype == np.int64  # dtype is for the floats only


def test_names_and_plain_maps():
    maps = [{"a": np.array([2.0]), "z": np.array([1])}, {"a": np.array([6.0]), "z": np.array([5])}]
    assert list(weighted_mean(maps, [3, 1], names=["a"])) == ["a"]
    np.testing.assert_array_equal(weighted_mean(maps, [3, 1])["a"], [3.0])  # (3·2 + 6)/4
    np.testing.assert_array_equal(weighted_mean(maps, [3, 1])["z"], [2])  # (3 + 5)/4


@pytest.mark.parametrize("weights", [[1.0], [1.0, -1.0, 1.0], [0.0, 0.0, 0.0], [1.0, np.nan, 1]])
def test_unusable_weights_are_refused(weights):
    with pytest.raises(ValueError, match="weights"):
        weighted_mean(RECORDS, weights)


def test_nothing_to_average_is_refused():
    with pytest.raises(ValueError, match="no arrays"):
        weighted_mean([], [])


def test_fedavg_arithmetic_is_flowers_on_floats_bit_for_bit():
    rng = np.random.default_rng(0)
    records = [
        ArrayRecord(
            {
                "w": Array(rng.standard_normal((7, 5)).astype(np.float32)),
                "s": Array(np.array(rng.standard_normal(), dtype=np.float32)),
            }
        )
        for _ in range(4)
    ]
    examples = [13, 7, 29, 1]
    contents = [
        {"arrays": r, "metrics": {keys.NUM_EXAMPLES: n}}
        for r, n in zip(records, examples, strict=True)
    ]

    flower = aggregate_arrayrecords(
        [
            RecordDict({keys.ARRAYS: c["arrays"], keys.METRICS: MetricRecord(c["metrics"])})
            for c in contents
        ],
        keys.NUM_EXAMPLES,
    )
    ours = weighted_average(records, [float(n) for n in examples])
    for name in flower.keys():
        assert ours[name].numpy().tobytes() == flower[name].numpy().tobytes()
        assert ours[name].numpy().dtype == flower[name].numpy().dtype


def test_weighted_average_keeps_a_0d_counter_0d():
    out = weighted_average(RECORDS, WEIGHTS)
    counter = out["bn.num_batches_tracked"].numpy()
    assert counter.shape == () and counter.dtype == np.int64 and int(counter) == 16


def test_as_numpy_decodes_through_core_decode(monkeypatch):
    calls = []
    real = module.decode

    def counting(array):
        calls.append(array)
        return real(array)

    monkeypatch.setattr(module, "decode", counting)
    got = as_numpy(RECORDS[0])
    assert len(calls) == 4
    np.testing.assert_array_equal(got["w"], [1.0, 2.0])
    got["w"][0] = 9.0  # its own memory
    np.testing.assert_array_equal(RECORDS[0]["w"].numpy(), [1.0, 2.0])
    assert list(as_numpy(RECORDS[0], ["b"])) == ["b"]


def test_as_record_round_trips_a_0d_array():
    record = as_record({"n": np.array(5, dtype=np.int64), "w": np.ones((2, 3))[:, ::2]})
    assert record["n"].numpy().shape == ()
    np.testing.assert_array_equal(record["w"].numpy(), np.ones((2, 2)))


def test_flatten_and_unflatten_by_hand():
    record = ArrayRecord(
        {
            "a": Array(np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)),
            "n": Array(np.array(3, dtype=np.int64)),
            "b": Array(np.array([5.0], dtype=np.float32)),
        }
    )
    assert float_names(record) == ["a", "b"]
    vector = flatten(record, ["b", "a"])
    np.testing.assert_array_equal(vector, [5.0, 1.0, 2.0, 3.0, 4.0])
    assert vector.dtype == np.float64
    assert flatten(record, ["a"], np.float32).dtype == np.float32
    assert flatten(record, []).shape == (0,)
    back = unflatten(np.array([-5.0, 10.0, 20.0, 30.0, 40.0]), record, ["b", "a"])
    np.testing.assert_array_equal(back["b"], [-5.0])
    np.testing.assert_array_equal(back["a"], [[10.0, 20.0], [30.0, 40.0]])
    assert back["a"].dtype == np.float32


def test_fedavg_keeps_batchnorm_counters_integer():
    """Flower's averaging turned num_batches_tracked into float64, and the next round's
    replies (int64, as the model keeps it) were refused for their dtype."""
    cfg = config(strategy="fedavg", model="small-cnn-bn", num_clients=3)
    grid = grid_for(cfg)
    strategy = build_strategy(cfg)
    arrays = initial_arrays(cfg)
    replies = list(grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord(), grid)))
    aggregated, _ = strategy.aggregate_train(1, replies)
    counters = [n for n in aggregated.keys() if n.endswith("num_batches_tracked")]
    assert counters
    for name in counters:
        assert aggregated[name].numpy().dtype == arrays[name].numpy().dtype
        assert aggregated[name].numpy().shape == arrays[name].numpy().shape
    replies = list(
        grid.send_and_receive(strategy.configure_train(2, aggregated, ConfigRecord(), grid))
    )
    assert strategy.aggregate_train(2, replies)[0] is not None
    assert not strategy.last_failed


def _records(count: int, seed: int = 0) -> list[ArrayRecord]:
    rng = np.random.default_rng(seed)
    return [
        ArrayRecord(
            {
                "w": Array(
                    (rng.standard_normal((7, 5)) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
                ),
                "b": Array(rng.standard_normal(5).astype(np.float32)),
            }
        )
        for _ in range(count)
    ]


@pytest.mark.parametrize("count", [1, 2, 7, 64])
def test_running_sums_are_numpys_sums_of_the_stacked_entries_to_the_bit(count):
    """sum_of and mean_of read one record's entry at a time and give np.sum's and np.mean's
    values of the stacked entries exactly (float64, and the entries' own float32); stack_flat
    is np.stack of flatten."""
    records = _records(count)
    before = np.random.default_rng(9).standard_normal((7, 5))
    stacked = np.stack([r["w"].numpy() for r in records])
    assert np.array_equal(module.sum_of(records, "w", dtype=None), np.sum(stacked, axis=0))
    assert module.sum_of(records, "w", dtype=None).dtype == np.float32
    assert np.array_equal(module.mean_of(records, "w"), np.mean(stacked.astype(np.float64), axis=0))
    assert np.array_equal(
        module.sum_of(records, "w", minus=before),
        np.sum([s.astype(np.float64) - before for s in stacked], axis=0),
    )
    names = ["w", "b"]
    assert np.array_equal(
        module.stack_flat(records, names, np.float32),
        np.stack([module.flatten(r, names, np.float32) for r in records]),
    )
    with pytest.raises(ValueError, match="no arrays"):
        module.sum_of([], "w")


def test_a_record_is_read_in_place_and_left_as_it_was():
    """Averaging reads a reply's bytes through a read-only view: no copy, and nothing can
    write into the reply."""
    (record,) = _records(1)
    view = module._value(record, "w")
    assert not view.flags.writeable and not view.flags.owndata
    data = bytes(record["w"].data)
    module.weighted_mean([record, record], [1.0, 3.0])
    assert record["w"].data == data
