"""Server-side behaviour of the strategies, driven through an in-process grid."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message
from helpers import config, grid_for, run_local

from pflarena.core import keys
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy


def _train_round(cfg, grid=None, strategy=None):
    grid = grid or grid_for(cfg)
    strategy = strategy or build_strategy(cfg)
    arrays = initial_arrays(cfg)
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    replies = list(grid.send_and_receive(messages))
    return grid, strategy, arrays, messages, replies


def test_sampling_is_seeded_and_sized():
    cfg = config(num_clients=20, fraction_train=0.25)
    grid = grid_for(cfg)
    picks = [build_strategy(cfg).sample_train_nodes(grid) for _ in range(2)]
    assert len(picks[0]) == 5 and len(set(picks[0])) == 5
    assert picks[0] == picks[1]
    other = build_strategy(config(num_clients=20, fraction_train=0.25, seed=1))
    assert other.sample_train_nodes(grid) != picks[0]


def test_sampling_respects_minimum():
    cfg = config(num_clients=10, fraction_train=0.05, min_train_clients=3)
    assert len(build_strategy(cfg).sample_train_nodes(grid_for(cfg))) == 3


def test_fedavg_is_the_example_weighted_mean():
    cfg = config(strategy="fedavg")
    grid, strategy, _, _, replies = _train_round(cfg)
    aggregated, metrics = strategy.aggregate_train(1, replies)
    weights = np.array([r.content[keys.METRICS][keys.NUM_EXAMPLES] for r in replies], float)
    assert len(set(weights)) > 1  # the test needs unequal client sizes to mean anything
    for name in aggregated.keys():
        stacked = np.stack([r.content[keys.ARRAYS][name].numpy() for r in replies])
        expected = np.tensordot(weights / weights.sum(), stacked, axes=1)
        np.testing.assert_allclose(aggregated[name].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert metrics["clients-trained"] == cfg.num_clients


@pytest.mark.parametrize("tamper", ["nan", "shape", "missing"])
def test_malformed_updates_are_rejected(tamper):
    cfg = config(strategy="fedavg")
    grid, strategy, arrays, _, replies = _train_round(cfg)
    bad = replies[0]
    name = next(iter(bad.content[keys.ARRAYS].keys()))
    if tamper == "nan":
        values = bad.content[keys.ARRAYS][name].numpy().copy()
        values.flat[0] = np.nan
        bad.content[keys.ARRAYS][name] = Array(values)
    elif tamper == "shape":
        bad.content[keys.ARRAYS][name] = Array(np.zeros((2, 2), np.float32))
    else:
        del bad.content[keys.ARRAYS]
    aggregated, _ = strategy.aggregate_train(1, replies)
    assert strategy.last_failed == [bad.metadata.src_node_id]
    # The result is the weighted mean of the remaining replies only.
    rest = replies[1:]
    weights = np.array([r.content[keys.METRICS][keys.NUM_EXAMPLES] for r in rest], float)
    stacked = np.stack([r.content[keys.ARRAYS][name].numpy() for r in rest])
    np.testing.assert_allclose(
        aggregated[name].numpy(),
        np.tensordot(weights / weights.sum(), stacked, axes=1),
        rtol=1e-5,
        atol=1e-6,
    )


def test_failed_client_counts_as_failure_and_round_goes_on(tmp_path):
    cfg = config(strategy="fedavg", num_rounds=2)
    node_configs = [{"partition-id": i, "num-partitions": 5} for i in range(5)]
    node_configs[2] = {"data-path": str(tmp_path / "missing.npz")}
    grid = grid_for(cfg, node_configs=node_configs)
    outcome = run_local(cfg, tmp_path, grid=grid)
    assert [r["train"]["failures"] for r in outcome.rounds[1:]] == [1, 1]
    assert outcome.rounds[-1]["evaluation"]["personalized"]["num_clients"] == 4


def test_local_sends_no_arrays_and_has_no_global_model(tmp_path):
    cfg = config(strategy="local", num_rounds=1)
    outcome = run_local(cfg, tmp_path)
    assert outcome.rounds[1]["bytes_down"] == 0 and outcome.rounds[1]["bytes_up"] == 0
    assert outcome.rounds[1]["evaluation"]["global"] is None


def test_every_client_is_evaluated_not_only_the_sampled(tmp_path):
    cfg = config(strategy="fedavg", num_clients=8, fraction_train=0.25, num_rounds=2)
    outcome = run_local(cfg, tmp_path)
    assert all(len(r["train"]["sampled"]) == 2 for r in outcome.rounds[1:])
    assert len(outcome.rounds[-1]["evaluation"]["per_client"]) == 8


def test_sampled_clients_reproducible_across_runs(tmp_path):
    cfg = config(strategy="fedavg", num_clients=8, fraction_train=0.25, num_rounds=3)
    first = run_local(cfg, tmp_path / "a")
    # Different node ids, same client ids: the same clients are sampled.
    second = run_local(cfg, tmp_path / "b", grid=grid_for(cfg, node_id_base=7_777_777))
    assert [r["train"]["sampled"] for r in first.rounds[1:]] == [
        r["train"]["sampled"] for r in second.rounds[1:]
    ]


def test_fedprox_and_ditto_send_their_weights():
    for strategy, key, value in (
        ("fedprox", "fedprox.mu", 0.3),
        ("ditto", "ditto.lambda", 0.7),  # a method's setting travels under its run-config key
    ):
        param = {"fedprox": "fedprox.mu", "ditto": "ditto.lambda"}[strategy]
        cfg = config(strategy=strategy, **{param: value})
        grid = grid_for(cfg)
        messages = list(
            build_strategy(cfg).configure_train(1, initial_arrays(cfg), ConfigRecord(), grid)
        )
        assert all(m.content[keys.CONFIG][key] == value for m in messages)


def test_strategy_runs_under_flowers_own_start():
    """The strategies are plain Flower strategies: Strategy.start drives them too."""
    cfg = config(strategy="fedavg", num_rounds=2)
    grid = grid_for(cfg)
    result = build_strategy(cfg).start(grid=grid, initial_arrays=initial_arrays(cfg), num_rounds=2)
    assert isinstance(result.arrays, ArrayRecord) and len(result.arrays)
    assert result.evaluate_metrics_clientapp[2]["personalized-mean"] > 0.2


def test_error_reply_from_the_superlink_is_charged_to_the_node_that_died():
    cfg = config(strategy="fedavg")
    grid, strategy, _, messages, replies = _train_round(cfg)
    dead = messages[0]
    error = Message(Error(code=0, reason="Node Unavailable"), reply_to=dead)
    error.metadata.__dict__["_src_node_id"] = 1  # Flower sends these from the SuperLink
    strategy.aggregate_train(1, [error, *replies[1:]])
    assert strategy.last_failed == [dead.metadata.dst_node_id]


def test_aggregation_does_not_depend_on_the_order_replies_arrive_in():
    """Replies come back in any order (Ray actors, SuperNodes): the sums must not care."""
    cfg = config(strategy="fedavg", num_clients=5)
    grid, arrays = grid_for(cfg), initial_arrays(cfg)
    results = []
    for order in (lambda r: r, lambda r: r[::-1], lambda r: r[2:] + r[:2]):
        strategy = build_strategy(cfg)
        messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
        replies = list(grid.send_and_receive(messages))
        aggregated, _ = strategy.aggregate_train(1, order(replies))
        results.append({k: v.numpy().tobytes() for k, v in aggregated.items()})
    assert results[0] == results[1] == results[2]
