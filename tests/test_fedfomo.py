"""FedFomo: the first-order weights, the ε-greedy routing, the affinity matrix, real runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType
from helpers import (
    comparable,
    config,
    die_in_round,
    grid_for,
    run_local,
    run_resumable,
    stateful_grid,
    stored,
)

from pflarena.core import keys
from pflarena.methods.fedfomo import keys as fedfomo_keys
from pflarena.methods.fedfomo.solver import (
    FOMO,
    MODEL_KEY,
    ROUND_START_KEY,
    affinity_increments,
    first_order_weights,
    fomo_weights,
    model_distance,
    step,
)
from pflarena.methods.fedfomo.strategy import PEER_PREFIX, epsilon_at, select_peers
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy, parse_config
from pflarena.server.results import read_rounds


# --------------------------------------------------------------------------- the math
def test_weights_are_the_positive_part_of_the_first_order_step_normalized():
    # gains 0.5, 0.2, −0.2 over distances 1, 2, 0.5: raw 0.5, 0.1, −0.4
    raw = first_order_weights(1.0, [0.5, 0.8, 1.2], [1.0, 2.0, 0.5])
    np.testing.assert_allclose(raw, [0.5, 0.1, -0.4])
    np.testing.assert_allclose(
        fomo_weights(1.0, [0.5, 0.8, 1.2], [1.0, 2.0, 0.5]), [5 / 6, 1 / 6, 0]
    )
    # every candidate worse than the reference (or equal to it): no move
    np.testing.assert_array_equal(fomo_weights(1.0, [1.5, 1.0], [1.0, 3.0]), [0.0, 0.0])
    # a candidate at distance zero is no move, whatever its loss
    np.testing.assert_allclose(fomo_weights(1.0, [0.2, 0.5], [0.0, 1.0]), [0.0, 1.0])
    assert fomo_weights(1.0, [], []).shape == (0,)


def test_affinity_increments_signed_and_positive():
    raw = np.array([0.5, 0.1, -0.4])
    weights = fomo_weights(1.0, [0.5, 0.8, 1.2], [1.0, 2.0, 0.5])
    # the authors' rule: raw / |Σ raw| = raw / 0.2
    np.testing.assert_allclose(affinity_increments(raw, weights, "signed"), [2.5, 0.5, -2.0])
    np.testing.assert_allclose(affinity_increments(raw, weights, "positive"), [5 / 6, 1 / 6, 0])
    # a zero sum does not divide by zero
    assert np.isfinite(affinity_increments(np.array([1.0, -1.0]), weights[:2], "signed")).all()


def test_step_and_distance():
    ref = {"w": torch.tensor([0.0, 0.0]), "count": torch.tensor(3)}
    a = {"w": torch.tensor([3.0, 4.0]), "count": torch.tensor(7)}
    b = {"w": torch.tensor([-1.0, 1.0]), "count": torch.tensor(9)}
    assert model_distance(a, ref, ["w"], "l2") == pytest.approx(5.0)
    assert model_distance(a, ref, ["w"], "l1") == pytest.approx(7.0)
    out = step(ref, [a, b], np.array([0.25, 0.75]))
    torch.testing.assert_close(out["w"], torch.tensor([0.0, 1.75]))
    assert int(out["count"]) == 3  # integer entries (batch counters) are not averaged
    assert torch.equal(step(ref, [a, b], np.zeros(2))["w"], ref["w"])


def test_epsilon_decays_linearly_from_round_two():
    assert [round(epsilon_at(t, 0.3, 0.05), 10) for t in (1, 2, 3, 7, 8, 50)] == [
        0.3,
        0.25,
        0.2,
        0.0,
        0.0,
        0.0,
    ]


def test_selection_is_greedy_without_exploration_and_random_with_it():
    affinity = np.array([9.0, 3.0, -1.0, 5.0, 0.0, 4.0])
    candidates = [1, 2, 3, 4, 5]  # client 0 asks; it is not a candidate
    for seed in range(5):
        order = select_peers(affinity, candidates, 0.0, np.random.default_rng(seed))
        assert order == [3, 5, 1, 4, 2]
        explored = select_peers(affinity, candidates, 1.0, np.random.default_rng(seed))
        assert sorted(explored) == candidates
    firsts = {
        tuple(select_peers(affinity, candidates, 1.0, np.random.default_rng(s))[:2])
        for s in range(30)
    }
    assert len(firsts) > 5  # exploration reaches peers the greedy choice never takes
    # ties (a fresh affinity row) are broken at random
    tied = {
        select_peers(np.zeros(6), candidates, 0.0, np.random.default_rng(s))[0] for s in range(30)
    }
    assert tied == set(candidates)
    assert select_peers(affinity, [], 0.5, np.random.default_rng(0)) == []


# --------------------------------------------------------------------------- runs
def _run(tmp_path, num_rounds=3, **overrides):
    cfg = config(strategy="fedfomo", validation_fraction=0.2, num_rounds=num_rounds, **overrides)
    grid = grid_for(cfg)
    replies = []
    grid.reply_filter = lambda reply: replies.append(reply) or reply
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    return cfg, grid, strategy, outcome, replies


def _train_messages(grid):
    return [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]


def test_a_run_routes_peers_updates_affinity_and_personalizes(tmp_path):
    cfg, grid, strategy, outcome, replies = _run(
        tmp_path, num_rounds=3, fraction_train=0.6, **{"fedfomo.num-models": 2}
    )
    final = outcome.rounds[-1]["evaluation"]
    assert len(final["per_client"]) == 5
    assert all(0.0 <= c["personalized"] <= 1.0 for c in final["per_client"].values())
    assert all(math.isfinite(c["personalized"]) for c in final["per_client"].values())
    assert final["personalized"]["mean"] > 0.2  # above chance (10 classes) after 3 rounds
    assert all(r["train"]["failures"] == 0 for r in outcome.rounds[1:])

    uploaded: set[int] = set()  # clients whose model the pool holds before each round
    for server_round in (1, 2, 3):
        messages = [
            m
            for m in _train_messages(grid)
            if m.content[keys.CONFIG][keys.SERVER_ROUND] == server_round
        ]
        assert len(messages) == 3
        shared: dict[int, object] = {}
        for msg in messages:
            config_ = msg.content[keys.CONFIG]
            own = strategy.client_ids[msg.metadata.dst_node_id]
            peers = list(config_["fedfomo.peers"])
            assert config_["fedfomo.own"] == own
            assert own not in peers  # never its own model
            assert len(peers) == min(2, len(uploaded - {own}))
            assert set(peers) <= uploaded
            records = sorted(n for n in msg.content.array_records if n.startswith(PEER_PREFIX))
            assert records == sorted(f"{PEER_PREFIX}{p}" for p in peers)
            assert keys.ARRAYS not in msg.content.array_records  # no server model goes down
            for p in peers:  # one object per peer and round, shared by every message
                assert shared.setdefault(p, msg.content[f"{PEER_PREFIX}{p}"]) is shared[p]
        uploaded |= {strategy.client_ids[m.metadata.dst_node_id] for m in messages}

    # P is exactly the sum of the increments the clients reported
    expected = np.zeros((5, 5))
    train_replies = [r for r in replies if FOMO in r.content.array_records]
    assert len(train_replies) == 9
    for reply in train_replies:
        client = int(reply.content[keys.METRICS][keys.CLIENT_ID])
        record = reply.content[FOMO]
        weighed = record[fedfomo_keys.PEERS].numpy()
        expected[client, weighed] += record[fedfomo_keys.AFFINITY].numpy()
    np.testing.assert_allclose(strategy.affinity, expected)
    assert np.abs(strategy.affinity).sum() > 0 and np.all(np.diag(strategy.affinity) == 0)
    # the pool holds each client's latest upload
    pool = strategy.pool("models")
    for client in pool.clients():
        latest = [
            r for r in train_replies if int(r.content[keys.METRICS][keys.CLIENT_ID]) == client
        ][-1]
        for name, array in pool.get(client, "models").items():
            np.testing.assert_array_equal(array.numpy(), latest.content[keys.ARRAYS][name].numpy())
    for context in grid.contexts.values():
        assert stored(context, MODEL_KEY) is not None
        assert stored(context, ROUND_START_KEY) is not None
    assert (tmp_path / "affinity.csv").name in [p.name for p in strategy.write_artifacts(tmp_path)]


def test_checkpoint_restores_affinity_and_epsilon(tmp_path):
    cfg = config(strategy="fedfomo", validation_fraction=0.2, num_rounds=2)
    grid = grid_for(cfg)
    strategy = build_strategy(cfg, state_dir=tmp_path / "server-state")
    run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    assert strategy.epsilon == pytest.approx(0.25) and np.abs(strategy.affinity).sum() > 0
    arrays, meta = strategy.checkpoint_state()
    twin = build_strategy(cfg, state_dir=tmp_path / "server-state")
    twin.restore_state(arrays, meta)
    np.testing.assert_array_equal(twin.affinity, strategy.affinity)
    assert twin.epsilon == strategy.epsilon and twin.client_ids == strategy.client_ids
    # the next round routes the same peers (selection is seeded by round and client)
    routes = [
        [
            (m.metadata.dst_node_id, list(m.content[keys.CONFIG]["fedfomo.peers"]))
            for m in s.configure_train(3, initial_arrays(cfg), ConfigRecord(), grid)
        ]
        for s in (strategy, twin)
    ]
    assert routes[0] == routes[1] and all(len(peers) == 4 for _, peers in routes[0])
    assert twin.peers_for(3, None) == []  # a node whose client id is unknown gets no peers


def test_a_run_killed_mid_round_resumes_to_the_uninterrupted_results(tmp_path):
    cfg = config(
        strategy="fedfomo",
        validation_fraction=0.2,
        num_clients=4,
        num_rounds=4,
        fraction_train=0.5,
        **{"fedfomo.num-models": 2},
    )

    _, whole = run_resumable(
        cfg, tmp_path / "whole", stateful_grid(cfg, tmp_path / "state-whole", 1_000_003)
    )
    broken = stateful_grid(cfg, tmp_path / "state-broken", 2_000_003)
    die_in_round(broken, 3)
    with pytest.raises(KeyboardInterrupt):
        run_resumable(cfg, tmp_path / "broken", broken)
    _, resumed = run_resumable(
        cfg,
        tmp_path / "broken",
        stateful_grid(cfg, tmp_path / "state-broken", 3_000_017),
        resume=True,
    )

    assert comparable(read_rounds(tmp_path / "broken" / "rounds.jsonl")) == comparable(
        read_rounds(tmp_path / "whole" / "rounds.jsonl")
    )
    np.testing.assert_array_equal(resumed.affinity, whole.affinity)


def test_replies_that_do_not_match_what_was_sent_are_rejected(tmp_path):
    cfg = config(strategy="fedfomo", validation_fraction=0.2, num_rounds=2)
    grid = grid_for(cfg)

    def tamper(reply):
        if (
            FOMO in reply.content.array_records
            and int(reply.content[keys.METRICS][keys.CLIENT_ID]) == 0
            and len(reply.content[FOMO][fedfomo_keys.PEERS].numpy())
        ):
            record = reply.content[FOMO]
            peers = record[fedfomo_keys.PEERS].numpy()
            reply.content[FOMO] = ArrayRecord(
                {
                    fedfomo_keys.PEERS: Array(peers[::-1].copy()),
                    fedfomo_keys.PEER_WEIGHTS: record[fedfomo_keys.PEER_WEIGHTS],
                    fedfomo_keys.AFFINITY: Array(np.full(len(peers), np.nan)),
                }
            )
        return reply

    grid.reply_filter = tamper
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    assert outcome.rounds[1]["train"]["failures"] == 0  # round 1: no peers, nothing to tamper
    assert outcome.rounds[2]["train"]["failures"] == 1
    assert np.all(strategy.affinity[0] == 0) and np.isfinite(strategy.affinity).all()


def test_the_solver_refuses_its_own_model_as_a_peer(tmp_path):
    cfg = config(strategy="fedfomo", validation_fraction=0.2, num_rounds=1, num_clients=3)
    grid = grid_for(cfg)
    strategy = build_strategy(cfg)
    run_local(cfg, tmp_path, grid=grid, strategy=strategy)  # the pool now holds every model
    node = grid.node_ids[0]
    own = strategy.client_ids[node]
    messages = list(strategy.configure_train(2, initial_arrays(cfg), ConfigRecord(), grid))
    msg = next(m for m in messages if m.metadata.dst_node_id == node)
    msg.content[keys.CONFIG]["fedfomo.peers"] = [own]
    msg.content[f"{PEER_PREFIX}{own}"] = strategy.pool("models").get(own, "models")
    (reply,) = grid.send_and_receive([msg])
    assert reply.has_error() and "own model" in reply.error.reason


def test_it_runs_under_flowers_own_start_and_with_the_trained_baseline(tmp_path):
    """One exchange per round: Flower's Strategy.start drives it; client ids come from the
    first round's replies, so peers go out from round 2."""
    cfg = config(
        strategy="fedfomo",
        validation_fraction=0.2,
        num_clients=4,
        num_rounds=2,
        **{"fedfomo.baseline": "trained"},
    )
    grid = grid_for(cfg)
    result = build_strategy(cfg).start(grid=grid, initial_arrays=initial_arrays(cfg), num_rounds=2)
    assert result.evaluate_metrics_clientapp[2]["personalized-mean"] > 0.1
    sent = [len(m.content[keys.CONFIG]["fedfomo.peers"]) for m in _train_messages(grid)]
    assert sent == [0] * 4 + [3] * 4
    assert result.train_metrics_clientapp[2]["mean-own-weight"] == 0.0  # peers only
    for context in grid.contexts.values():
        assert stored(context, MODEL_KEY) is not None and stored(context, ROUND_START_KEY) is None


def test_fedfomo_needs_a_validation_split():
    with pytest.raises(ValueError, match="validation-fraction"):
        parse_config({"strategy": "fedfomo"})
