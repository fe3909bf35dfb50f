"""pFedSV: the peer-selection rule, the weights, the private variant, and real runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import config, grid_for, run_local, stored
from scipy.optimize import brentq
from scipy.stats import norm

from pflarena.core import keys
from pflarena.core.federation import load_client
from pflarena.core.models import build_model
from pflarena.methods.pfedsv.solver import (
    PERSONAL_KEY,
    TRAINED_KEY,
    _Game,
    aggregation_weights,
    clip_and_noise,
    eq6_distances,
    private_release,
    select_peers,
    update_relevance,
)
from pflarena.methods.pfedsv.strategy import PFedSVParams, dp_epsilon, split_head
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy, parse_config
from pflarena.server.loop import run_rounds
from pflarena.server.results import ResultsWriter


# --------------------------------------------------------------------------- top-k rule
def _search(n, relevant, k0, rule, seed, rounds=40, stop=True):
    """Client 0 with an oracle SV (+1 relevant, −1 not): rounds until it knows its peers."""
    rng = np.random.default_rng(seed)
    relevance, explored = np.zeros(n), np.zeros(n, dtype=bool)
    candidates = list(range(1, n))
    ks = []
    for t in range(1, rounds + 1):
        request, k = select_peers(
            relevance, explored, candidates, initial_k=k0, max_k=None, rule=rule, rng=rng
        )
        chosen = request[:k]
        assert sorted(request) == candidates and len(set(chosen)) == k
        values = {p: 1.0 if p in relevant else -1.0 for p in chosen}
        relevance = update_relevance(relevance, values, alpha=0.5)
        explored[chosen] = True
        ks.append(k)
        if stop and set(np.flatnonzero(relevance > 0)) == relevant:
            return t, ks
    return None, ks


@pytest.mark.parametrize("seed", range(20))
def test_topk_finds_the_relevant_peers_within_the_papers_bound_when_m_lt_k(seed):
    n, m, k0 = 20, 2, 5
    relevant = set(np.random.default_rng(seed).choice(np.arange(1, n), m, replace=False).tolist())
    rounds, ks = _search(n, relevant, k0, "explore", seed)
    # the bound of T-TopK, docs/papers/pfedsv.md §8
    assert rounds is not None and rounds <= math.ceil((n - m - 1) / k0) + 1
    # once every peer is explored, k is the number of relevant peers
    _, ks = _search(n, relevant, k0, "explore", seed, rounds=n, stop=False)
    assert ks[-1] == m


def test_literal_topk_stalls_when_m_gt_k_and_explore_does_not():
    n, m, k0 = 20, 8, 5
    relevant = set(range(1, m + 1))
    stalled = [_search(n, relevant, k0, "literal", seed)[0] for seed in range(10)]
    found = [_search(n, relevant, k0, "explore", seed)[0] for seed in range(10)]
    assert any(r is None for r in stalled)
    assert all(r is not None and r <= n for r in found)


def test_relevance_update_touches_only_the_valued_players():
    out = update_relevance(np.array([1.0, 2.0, -1.0]), {0: 3.0, 2: 1.0}, alpha=0.25)
    assert out.tolist() == [0.25 * 1 + 0.75 * 3, 2.0, 0.25 * -1 + 0.75 * 1]


def test_aggregation_weights_are_positive_part_over_distance_normalized():
    w = aggregation_weights([0.4, -0.1, 0.2], [2.0, 1.0, 0.5])
    assert w == pytest.approx(np.array([0.2, 0.0, 0.4]) / 0.6)
    assert aggregation_weights([0.4, 0.2], None) == pytest.approx([2 / 3, 1 / 3])
    assert aggregation_weights([-0.1, 0.0], [1.0, 1.0]) is None  # keep the own model
    # a zero distance is floored, not a division by zero
    assert aggregation_weights([0.1, 0.1], [0.0, 1.0]) == pytest.approx([1.0, 0.0], abs=1e-9)


def test_eq6_distances_from_the_round_start_or_from_the_own_model():
    own, a, b, c = (np.array(v, dtype=float) for v in ([0, 0], [3, 4], [0, 1], [6, 8]))
    # round-start: everyone's distance from the reference, the own model's included
    ref = np.array([1.0, 0.0])
    assert eq6_distances([own, a, b, c], ref) == pytest.approx(
        [1.0, math.sqrt(20), math.sqrt(2), math.sqrt(89)]
    )
    # current-self-median: the peers' from the own model (5, 1, 10), the own model the median
    assert eq6_distances([own, a, b, c], None) == pytest.approx([5.0, 5.0, 1.0, 10.0])
    assert eq6_distances([own, a, b], None) == pytest.approx([3.0, 5.0, 1.0])


def test_every_distance_reference_reaches_the_clients_weights(tmp_path):
    """The three ``distance-ref`` settings give the own model different weights on the same
    seed (an ignored setting would give equal ones); with none the weights are ∝ SV."""
    own_weight = {}
    for ref in ("round-start", "current-self-median", "none"):
        _, _, _, outcome = _run(
            tmp_path / ref, num_clients=4, num_rounds=2, **{"pfedsv.distance-ref": ref}
        )
        own_weight[ref] = outcome.rounds[-1]["train"]["server"]["mean-own-weight"]
    assert all(0 < w <= 1 for w in own_weight.values()), own_weight
    assert len({round(w, 9) for w in own_weight.values()}) == 3, own_weight


# --------------------------------------------------------------------------- the game
def test_linear_head_shortcut_gives_the_accuracy_of_the_averaged_model():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10, seed=0)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    head = list(base)[-2:]  # the last Linear layer
    states = {}
    for p in range(4):
        states[p] = {
            k: (v + 0.5 * torch.randn_like(v) if k in head else v) for k, v in base.items()
        }
    x, y = torch.randn(200, 1, 8, 8), torch.randint(0, 10, (200,))
    fast = _Game(model, [0, 1, 2, 3], states, x, y, 0.0, linear_head=tuple(head))
    slow = _Game(build_model("mlp", (1, 8, 8), 10, seed=0), [0, 1, 2, 3], states, x, y, 0.0)
    for size in range(1, 5):
        for members in __import__("itertools").combinations(range(4), size):
            assert fast.utility(frozenset(members)) == slow.utility(frozenset(members))


def test_utilities_equal_the_averaged_models_accuracy_computed_apart():
    # Each utility against an independent computation: the coalition's plain parameter
    # average loaded into a fresh CNN, all 260 validation images in one forward pass (the
    # game runs them in chunks of EVAL_CHUNK, the last one partial).
    from pflarena.methods.pfedsv.solver import EVAL_CHUNK

    torch.manual_seed(0)
    base = build_model("cnn", (1, 16, 16), 10, seed=0).state_dict()
    states = {p: {k: v + 0.05 * torch.randn_like(v) for k, v in base.items()} for p in range(3)}
    x, y = torch.rand(260, 1, 16, 16), torch.randint(0, 10, (260,))
    assert len(y) % EVAL_CHUNK and len(y) > EVAL_CHUNK
    game = _Game(build_model("cnn", (1, 16, 16), 10, seed=1), [0, 1, 2], states, x, y, 0.0)
    reference = build_model("cnn", (1, 16, 16), 10, seed=2).eval()
    accuracies = set()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a simulated client; also quicker on a busy machine
    try:
        _check_coalitions(game, reference, states, base, x, y, accuracies)
    finally:
        torch.set_num_threads(threads)
    assert len(accuracies) > 3  # the coalitions' models differ


def _check_coalitions(game, reference, states, base, x, y, accuracies):
    import itertools

    for size in range(1, 4):
        for members in itertools.combinations(range(3), size):
            reference.load_state_dict(
                {k: torch.stack([states[p][k] for p in members]).mean(0) for k in base}
            )
            with torch.no_grad():
                expected = (reference(x).argmax(1) == y).double().mean().item()
            assert game.utility(frozenset(members)) == pytest.approx(expected, abs=1e-12)
            accuracies.add(expected)


def test_the_own_models_logged_accuracy_reuses_its_utility():
    from pflarena.methods.pfedsv.shapley import shapley_values
    from pflarena.methods.pfedsv.solver import own_accuracy

    torch.manual_seed(1)
    base = build_model("mlp", (1, 8, 8), 10, seed=0).state_dict()
    states = {p: {k: v + 0.3 * torch.randn_like(v) for k, v in base.items()} for p in range(3)}
    x, y = torch.randn(300, 1, 8, 8), torch.randint(0, 10, (300,))
    game = _Game(build_model("mlp", (1, 8, 8), 10, seed=0), [2, 0, 1], states, x, y, 0.0)
    utilities: dict = {}
    shapley_values(game.utility, [2, 0, 1], cache=utilities)
    passes = game.evaluations
    reused = own_accuracy(game, utilities, 2)
    assert game.evaluations == passes  # no forward pass added
    assert reused == game.accuracy(states[2])  # bit for bit the pass it replaces
    assert own_accuracy(game, {}, 2) == reused  # not evaluated: one more pass


def test_split_head_takes_the_last_weighted_layers():
    names = [
        "c.weight",
        "c.bias",
        "bn.running_mean",
        "f1.weight",
        "f1.bias",
        "f2.weight",
        "f2.bias",
    ]
    trainable = ["c.weight", "c.bias", "f1.weight", "f1.bias", "f2.weight", "f2.bias"]
    assert split_head(names, trainable, 1) == ["f2.weight", "f2.bias"]
    assert split_head(names, trainable, 2) == ["f1.weight", "f1.bias", "f2.weight", "f2.bias"]
    with pytest.raises(ValueError, match="no feature extractor"):
        split_head(names, trainable, 3)


# --------------------------------------------------------------------------- privacy
def test_clip_and_noise():
    delta = {"a": torch.full((1000,), 0.1), "b": torch.full((300,), -0.2)}
    clipped, norm_before = clip_and_noise(delta, 1.0, 0.0, torch.Generator().manual_seed(0))
    assert norm_before == pytest.approx(math.sqrt(1000 * 0.01 + 300 * 0.04), rel=1e-6)
    total = math.sqrt(sum(float(t.pow(2).sum()) for t in clipped.values()))
    assert total == pytest.approx(1.0, rel=1e-5)
    noised, _ = clip_and_noise(delta, 0.5, 2.0, torch.Generator().manual_seed(0))
    residual = torch.cat([noised[k] - clipped[k] * 0.5 for k in delta])
    assert float(residual.std()) == pytest.approx(2.0 * 0.5, rel=0.1)


def _analytic_gaussian_epsilon(sigma: float, compositions: int, delta: float, sensitivity=2.0):
    """Exact ε of the Gaussian mechanism (Balle & Wang 2018, Theorem 8), composed.

    T adaptive Gaussian releases of sensitivity Δ and noise std σ (in units of C) are
    exactly one of sensitivity √T·Δ: μ = √T·Δ/σ.
    """
    mu = math.sqrt(compositions) * sensitivity / sigma

    def gap(eps):
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta

    return brentq(gap, 1e-9, 500)


@pytest.mark.parametrize(("sigma", "uploads"), [(1.0, 1), (1.0, 20), (2.0, 5), (4.0, 100)])
def test_reported_epsilon_is_a_valid_and_tight_bound_at_sensitivity_2c(sigma, uploads):
    """Replace adjacency: each release moves by up to 2C. The reported ε (RDP) is at least
    the exact ε of the composed Gaussian mechanism at sensitivity 2C, computed here with
    scipy, and at most 1.5 times it; at sensitivity C it would be below the exact value."""
    exact = _analytic_gaussian_epsilon(sigma, uploads, 1e-5)
    reported = dp_epsilon(sigma, uploads, 1e-5)
    assert exact <= reported <= 1.5 * exact
    assert reported > 1.5 * _analytic_gaussian_epsilon(sigma, uploads, 1e-5, sensitivity=1.0)
    assert dp_epsilon(sigma, 0, 1e-5) == 0.0 and dp_epsilon(0.0, 3, 1e-5) == math.inf


def test_a_release_moves_only_through_the_clipped_difference():
    """r + clip(θ − r, C) + z: for two trained models θ, θ' (two private datasets) and the same
    noise draw, the releases differ by exactly clip(θ − r) − clip(θ' − r), at most 2C; every
    floating entry (buffers too) goes through it, integer entries are r's."""
    torch.manual_seed(0)
    reference = {"w": torch.randn(50), "b": torch.randn(3), "count": torch.tensor(7)}
    first = {
        "w": reference["w"] + 3 * torch.randn(50),
        "b": torch.randn(3),
        "count": torch.tensor(9),
    }
    second = {
        "w": reference["w"] - 2 * torch.randn(50),
        "b": torch.randn(3),
        "count": torch.tensor(1),
    }
    clip = 0.5

    def clipped(model):
        diff = torch.cat([model[k] - reference[k] for k in ("w", "b")])
        return diff * min(1.0, clip / float(diff.norm()))

    one, norm_one = private_release(reference, first, clip, 2.0, torch.Generator().manual_seed(3))
    two, _ = private_release(reference, second, clip, 2.0, torch.Generator().manual_seed(3))
    assert norm_one == pytest.approx(
        float(torch.cat([first[k] - reference[k] for k in "wb"]).norm())
    )
    gap = torch.cat([one[k] - two[k] for k in ("w", "b")])
    torch.testing.assert_close(gap, clipped(first) - clipped(second), rtol=1e-5, atol=1e-5)
    assert float(gap.norm()) <= 2 * clip + 1e-5
    assert int(one["count"]) == int(two["count"]) == 7
    quiet, _ = private_release(reference, first, clip, 1e-9, torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        torch.cat([quiet[k] - reference[k] for k in "wb"]), clipped(first), rtol=1e-5, atol=1e-6
    )


def test_the_private_variants_replies_change_only_through_the_clipped_release(
    tmp_path, monkeypatch
):
    """Two runs of the private variant that differ only in client 0's validation labels,
    with the same noise draws: every field of every train-phase reply is the same in both,
    except the releases, and each release minus its reference (the client's previous
    release, θ⁰ first) differs between the runs by at most 2C. The runs do differ: client 0's
    clean aggregate is another model."""
    import dataclasses

    import pflarena.client.app as client_app_module
    import pflarena.methods.pfedsv.solver as solver

    monkeypatch.setattr(solver.secrets, "randbits", lambda bits: 12345)
    original = client_app_module.load_node_data
    clip = 0.05

    def run(name: str, change: bool):
        def load(cfg, node_config, device):
            data = original(cfg, node_config, device)
            if change and data.client_id == 0:
                data = dataclasses.replace(data, y_val=(data.y_val + 3) % 10)
            return data

        monkeypatch.setattr(client_app_module, "load_node_data", load)
        cfg = config(
            strategy="pfedsv", validation_fraction=0.3, num_clients=4, num_rounds=3,
            local_epochs=2, eval_every=10,
            **{"pfedsv.dp-noise": 1e-3, "pfedsv.dp-clip": clip},
        )  # fmt: skip
        grid = grid_for(cfg)
        replies: list = []

        def keep(reply):
            replies.append(reply)
            return reply

        grid.reply_filter = keep
        strategy = build_strategy(cfg)
        outcome = run_local(cfg, tmp_path / name, grid=grid, strategy=strategy)
        sent = {m.metadata.message_id: m for m in grid.sent}
        out = {}
        for reply in replies:
            config_ = sent[reply.metadata.reply_to_message_id].content[keys.CONFIG]
            phase = config_.get(keys.PHASE)
            if phase not in (keys.PHASE_TRAIN, "personalize"):
                continue  # the evaluation's test accuracies: not covered, see the docs
            client = int(reply.content[keys.METRICS][keys.CLIENT_ID])
            out[(config_[keys.SERVER_ROUND], phase, client)] = reply.content
        personal = {
            strategy.client_ids[n]: stored(c, PERSONAL_KEY).to_torch_state_dict()
            for n, c in grid.contexts.items()
        }
        return cfg, outcome, out, personal

    cfg, outcome, same, personal_same = run("same", False)
    _, _, changed, personal_changed = run("changed", True)
    assert same.keys() == changed.keys() and len(same) == 3 * 2 * 4
    names = list(initial_arrays(cfg).keys())
    theta0 = initial_arrays(cfg)
    previous = {
        (side, c): np.concatenate([theta0[n].numpy().ravel() for n in names])
        for side in ("same", "changed")
        for c in range(4)
    }
    for key in sorted(same):
        a, b = same[key], changed[key]
        # the client app's wall-clock and CPU times are a side channel the accounting does
        # not cover; the state version counts messages, whatever the data
        timing = {keys.TRAIN_TIME, keys.TRAIN_CPU, keys.DATA_TIME}
        assert {k: v for k, v in a[keys.METRICS].items() if k not in timing} == {
            k: v for k, v in b[keys.METRICS].items() if k not in timing
        }
        assert set(a[keys.METRICS]) - timing <= {
            keys.CLIENT_ID,
            keys.NUM_EXAMPLES,
            keys.STATE_VERSION,
        }
        assert {keys.CLIENT_ID, keys.NUM_EXAMPLES} <= set(a[keys.METRICS])
        assert set(a.metric_records) == {keys.METRICS} == set(b.metric_records)
        assert list(a.config_records) == list(b.config_records)
        for name in a.config_records:
            assert dict(a[name]) == dict(b[name])
        assert set(a.array_records) == set(b.array_records)
        assert set(a.array_records) <= {keys.ARRAYS}  # no relevance, no values
        if keys.ARRAYS in a.array_records:
            client = key[2]
            moved = {}
            for side, content in (("same", a), ("changed", b)):
                release = np.concatenate([content[keys.ARRAYS][n].numpy().ravel() for n in names])
                moved[side] = release - previous[(side, client)]
                previous[(side, client)] = release
            assert np.linalg.norm(moved["same"] - moved["changed"]) <= 2 * clip * (1 + 1e-5)
    assert outcome.rounds[-1]["train"]["server"]["dp-epsilon"] == pytest.approx(
        dp_epsilon(1e-3, 3, 1e-5)
    )
    assert any(
        not torch.equal(personal_same[0][n], personal_changed[0][n]) for n in personal_same[0]
    )


# --------------------------------------------------------------------------- runs
def _run(tmp_path, **overrides):
    cfg = config(strategy="pfedsv", validation_fraction=0.2, **overrides)
    grid = grid_for(cfg)
    strategy = build_strategy(cfg)
    writer = ResultsWriter(tmp_path / "run")
    try:
        outcome = run_rounds(grid, cfg, strategy, initial_arrays(cfg), writer)
    finally:
        writer.close()
    return cfg, grid, strategy, outcome


def _personalize_messages(grid):
    return [m for m in grid.sent if m.content[keys.CONFIG].get(keys.PHASE) == "personalize"]


def test_relevance_ranks_label_sharing_peers_first(tmp_path):
    """Pathological digits: each client holds classes {i, i+1} (mod 10), so exactly its two
    ring neighbours share a label. After 5 rounds, at least 8 of 10 clients rank both
    neighbours above every other peer, and value them positively and the others not."""
    cfg, grid, strategy, _ = _run(
        tmp_path,
        partition="pathological",
        class_assignment="deterministic",
        num_clients=10,
        num_rounds=5,
        local_epochs=5,
    )
    labels = [set(np.unique(load_client(cfg.federation_spec(), c)[0].y_train)) for c in range(10)]
    matrix = strategy.relevance_matrix()
    ranked = signs = 0
    for i in range(10):
        share = [j for j in range(10) if j != i and labels[i] & labels[j]]
        others = [j for j in range(10) if j != i and not labels[i] & labels[j]]
        assert len(share) == 2
        ranked += min(matrix[i, share]) > max(matrix[i, others])
        signs += bool((matrix[i, share] > 0).all() and (matrix[i, others] <= 0).all())
    assert ranked >= 8 and signs >= 8
    for msg in _personalize_messages(grid):
        config_ = msg.content[keys.CONFIG]
        own, peers = config_["pfedsv.own"], list(config_["pfedsv.peers"])
        assert own not in peers
        assert sorted(n for n in msg.content.array_records if n.startswith("peer/")) == sorted(
            f"peer/{p}" for p in peers
        )
    files = strategy.write_artifacts(tmp_path)
    assert [f.name for f in files] == ["relevance.csv", "relevance.png"]
    assert np.isnan(np.loadtxt(files[0], delimiter=",")).sum() == 10  # the diagonal only


def test_round_exchanges_and_client_state(tmp_path):
    cfg, grid, strategy, outcome = _run(tmp_path, num_clients=5, num_rounds=2)
    for record in outcome.rounds[1:]:
        assert [e["name"] for e in record["exchanges"]] == ["train", "personalize"]
        assert record["exchanges"][0]["bytes_down"] == 0  # clients train their own models
        assert record["train"]["failures"] == 0
        assert record["train"]["server"]["mean-coalition-size"] >= 2
    final = outcome.rounds[-1]["evaluation"]["personalized"]["mean"]
    assert 0.0 < final <= 1.0
    for context in grid.contexts.values():
        assert (
            stored(context, PERSONAL_KEY) is not None and stored(context, TRAINED_KEY) is not None
        )
    for msg in _personalize_messages(grid):
        own = msg.content[keys.CONFIG]["pfedsv.own"]
        assert own not in list(msg.content[keys.CONFIG]["pfedsv.peers"])
    # a checkpoint carries the relevance and the upload counts
    arrays, meta = strategy.checkpoint_state()
    twin = build_strategy(cfg)
    twin.restore_state(arrays, meta)
    np.testing.assert_array_equal(twin.relevance_matrix(), strategy.relevance_matrix())
    assert twin.uploads == strategy.uploads == {c: 2 for c in range(5)}


def test_a_peers_model_is_one_record_in_every_message_of_the_round(tmp_path):
    """Read once from the pool and shared: a round's memory holds each peer's model once,
    not once per message that sends it."""
    _, grid, _, _ = _run(tmp_path, num_clients=6, num_rounds=2)
    by_round: dict[int, dict[str, list]] = {}
    for msg in _personalize_messages(grid):
        server_round = int(msg.content[keys.CONFIG][keys.SERVER_ROUND])
        for name, record in msg.content.array_records.items():
            if name.startswith("peer/"):
                by_round.setdefault(server_round, {}).setdefault(name, []).append(record)
    shared = [records for rounds in by_round.values() for records in rounds.values()]
    assert any(len(records) > 1 for records in shared), by_round  # a peer sent twice
    for records in shared:
        assert all(record is records[0] for record in records)


def test_feature_extractor_variant_sends_heads_only(tmp_path):
    _, _, _, plain = _run(tmp_path / "d", num_clients=5, num_rounds=1)
    cfg, grid, strategy, shared = _run(
        tmp_path / "dc", num_clients=5, num_rounds=1, **{"pfedsv.variant": "D+C"}
    )
    down = {
        name: run.rounds[1]["exchanges"][1]["bytes_down"]
        / run.rounds[1]["train"]["server"]["mean-coalition-size"]
        for name, run in (("D", plain), ("D+C", shared))
    }
    assert down["D+C"] < down["D"]
    head = split_head(list(initial_arrays(cfg).keys()), strategy.trainable, 1)
    for context in grid.contexts.values():
        personal = stored(context, PERSONAL_KEY)
        for name, value in strategy.features.items():
            assert name not in head
            np.testing.assert_allclose(personal[name].numpy(), value, rtol=1e-6, atol=1e-7)


def test_private_variant_noises_uploads_and_reports_epsilon(tmp_path):
    cfg, grid, strategy, outcome = _run(
        tmp_path, num_clients=4, num_rounds=2, **{"pfedsv.dp-noise": 1.0, "pfedsv.dp-clip": 0.5}
    )
    assert outcome.rounds[-1]["train"]["server"]["dp-epsilon"] == pytest.approx(
        dp_epsilon(1.0, 2, 1e-5)
    )
    assert strategy.run_summary()["dp"]["epsilon"] == pytest.approx(dp_epsilon(1.0, 2, 1e-5))
    pool = strategy.pool("models")
    for node, context in grid.contexts.items():
        client = strategy.client_ids[node]
        trained = stored(context, TRAINED_KEY)
        upload = pool.get(client, "models")
        gap = np.sqrt(
            sum(np.sum((upload[n].numpy() - trained[n].numpy()) ** 2) for n in strategy.trainable)
        )
        assert gap > 1.0  # noise of std 0.5 on every parameter, not the clean model


def test_pfedsv_needs_a_validation_split():
    with pytest.raises(ValueError, match="validation-fraction"):
        parse_config({"strategy": "pfedsv"})


def _val_accuracy(cfg, record, client: int, split: str = "val") -> float:
    data, info = load_client(cfg.federation_spec(), client)
    model = build_model(cfg.model_name(), tuple(info.input_shape), info.num_classes)
    model.load_state_dict(record.to_torch_state_dict())
    model.eval()
    x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
    with torch.no_grad():
        predicted = model(torch.as_tensor(x)).argmax(dim=1).numpy()
    return float((predicted == y).mean())


@pytest.mark.parametrize("guard", ["none", "validation"])
def test_the_validation_guard_never_keeps_an_aggregate_worse_than_the_own_model(tmp_path, guard):
    """guard=validation (not in the paper): every client's personalized model validates at
    least as well as its own trained model; the paper's rule (none) gives no such bound, and
    on this pathological split some client's aggregate does validate worse."""
    cfg, grid, _, outcome = _run(
        tmp_path,
        partition="pathological",
        class_assignment="deterministic",
        num_clients=10,
        num_rounds=3,
        local_epochs=5,
        lr=0.05,
        seed=1,
        **{"pfedsv.guard": guard},
    )
    gaps, trained_test = [], []
    for context in grid.contexts.values():
        client = int(context.node_config["partition-id"])
        personal = _val_accuracy(cfg, stored(context, PERSONAL_KEY), client)
        own = _val_accuracy(cfg, stored(context, TRAINED_KEY), client)
        gaps.append(personal - own)
        trained_test.append(_val_accuracy(cfg, stored(context, TRAINED_KEY), client, "test"))
    server = outcome.rounds[-1]["train"]["server"]
    kept, below = server["mean-kept-own"], server["mean-aggregate-below-own"]
    # the logged θ_i^t test accuracy (docs/papers/pfedsv.md §9.8) is the trained model's, measured
    # apart
    assert server["mean-trained-test-accuracy"] == pytest.approx(np.mean(trained_test))
    if guard == "validation":
        assert min(gaps) >= 0, gaps
        assert kept >= below > 0  # the guard acted on every aggregate logged as below
    else:
        assert min(gaps) < 0, gaps
        assert kept == 0
        assert below == pytest.approx(np.mean([g < 0 for g in gaps]))


# --------------------------------------------------------------------------- θ_i^{t*}
def _brute_force_shapley(utility, n: int) -> np.ndarray:
    """Eq. 2 literally: the mean marginal contribution over all n! orderings, v(∅) = 0."""
    values = np.zeros(n)
    orderings = list(__import__("itertools").permutations(range(n)))
    for ordering in orderings:
        before: frozenset = frozenset()
        previous = 0.0
        for player in ordering:
            before = before | {player}
            current = utility(before)
            values[player] += current - previous
            previous = current
    return values / len(orderings)


def _expected_personalized(model, players, x_val, y_val, reference, measured):
    """θ_i^{t*} computed apart from the solver: exact Shapley values of the coalition game
    (utility: validation accuracy of the members' uniform average), then Eq. 6-7 with every
    distance from ``reference`` over the ``measured`` entries; the own model (first) when no
    value is positive."""
    floats = [k for k, v in players[0].items() if torch.is_floating_point(v)]
    memo: dict = {}

    def utility(members: frozenset) -> float:
        if members not in memo:
            average = {
                k: (
                    torch.stack([players[m][k].double() for m in sorted(members)]).mean(0).float()
                    if k in floats
                    else players[min(members)][k]
                )
                for k in players[0]
            }
            model.load_state_dict(average)
            model.eval()
            with torch.no_grad():
                memo[members] = float((model(x_val).argmax(1) == y_val).double().mean())
        return memo[members]

    values = _brute_force_shapley(utility, len(players))
    flat = [np.concatenate([p[k].double().numpy().ravel() for k in measured]) for p in players]
    ref = np.concatenate([reference[k].double().numpy().ravel() for k in measured])
    raw = np.array(
        [
            max(v, 0.0) / max(np.linalg.norm(f - ref), 1e-12)
            for v, f in zip(values, flat, strict=True)
        ]
    )
    if raw.sum() <= 0:
        return {k: v.double() for k, v in players[0].items()}, values
    weights = raw / raw.sum()
    return {
        k: sum(w * p[k].double() for w, p in zip(weights, players, strict=True))
        if k in floats
        else players[0][k]
        for k in players[0]
    }, values


def _round_two_games(cfg, grid, strategy):
    """For each client, round 2's players (own trained model first, then the peers in the
    order the server sent them), its round-start model and its stored θ_i^{2*}."""
    from pflarena.core.datasets.tensors import to_tensors

    sent = [
        m for m in _personalize_messages(grid) if m.content[keys.CONFIG][keys.SERVER_ROUND] == 2
    ]
    for msg in sent:
        node = msg.metadata.dst_node_id
        context = grid.contexts[node]
        client = strategy.client_ids[node]
        config_ = msg.content[keys.CONFIG]
        assert config_["pfedsv.own"] == strategy.pids[client]
        peers = list(config_["pfedsv.peers"])
        own = stored(context, TRAINED_KEY).to_torch_state_dict()
        players = [own] + [
            {k: torch.from_numpy(np.array(v.numpy())) for k, v in msg.content[f"peer/{p}"].items()}
            for p in peers
        ]
        data, info = load_client(cfg.federation_spec(), client)
        x_val, y_val = to_tensors(data.x_val, data.y_val, info)
        model = build_model(cfg.model_name(), tuple(info.input_shape), info.num_classes)
        reference = stored(context, PERSONAL_KEY, accepted=1 * 100 + 2).to_torch_state_dict()
        personal = stored(context, PERSONAL_KEY).to_torch_state_dict()
        yield client, model, players, x_val, y_val, reference, personal, msg, data


def test_the_stored_personalized_model_is_the_shapley_weighted_sum_computed_apart(tmp_path):
    """Round 2 (where the relevance φ, a moving average, is no longer ∝ the round's SVs and
    the distance reference θ_i^{1*} is neither θ⁰ nor the own trained model): every client's
    stored θ_i^{2*} is Σ_j w_j θ_j^2 with exact Shapley values on its validation split,
    computed here from the models the server sent and the client's own trained model."""
    cfg, grid, strategy, _ = _run(
        tmp_path,
        partition="pathological",
        class_assignment="deterministic",
        num_clients=6,
        num_rounds=2,
        local_epochs=2,
        seed=3,
    )
    checked = negative = 0
    for client, model, players, x, y, reference, personal, _, _ in _round_two_games(
        cfg, grid, strategy
    ):
        measured = [n for n, p in model.named_parameters() if p.requires_grad]
        expected, values = _expected_personalized(model, players, x, y, reference, measured)
        for name, value in expected.items():
            np.testing.assert_allclose(
                personal[name].double().numpy(), value.numpy(), rtol=1e-5, atol=1e-6,
                err_msg=f"client {client}, {name}",
            )  # fmt: skip
        assert len(values) >= 2
        checked += 1
        negative += int((values <= 0).any())
    assert checked == 6 and negative > 0  # some player was left out of some aggregate


def test_the_feature_extractor_average_and_the_heads_aggregate_computed_apart(tmp_path):
    """D+C: the feature extractor every client stores is the uploads' average weighted by
    training-set size, computed here from the clients' trained models; the head is the
    Shapley-weighted sum of the coalition's heads on that extractor, distances over the head."""
    cfg, grid, strategy, _ = _run(
        tmp_path,
        partition="pathological",
        class_assignment="deterministic",
        num_clients=5,
        num_rounds=2,
        local_epochs=2,
        seed=1,
        **{"pfedsv.variant": "D+C"},
    )
    names = list(initial_arrays(cfg).keys())
    head = split_head(names, strategy.trainable, 1)
    trained, sizes = {}, {}
    for node, context in grid.contexts.items():
        client = strategy.client_ids[node]
        trained[client] = stored(context, TRAINED_KEY).to_torch_state_dict()
        sizes[client] = len(load_client(cfg.federation_spec(), client)[0].y_train)
    assert len(set(sizes.values())) > 1  # unequal sizes: a plain mean would differ
    total = sum(sizes.values())
    features = {
        n: sum(sizes[c] * trained[c][n].double() for c in trained) / total
        for n in names
        if n not in head
    }
    for client, model, players, x, y, reference, personal, msg, _ in _round_two_games(
        cfg, grid, strategy
    ):
        assert sorted(
            msg.content["peer/" + str(msg.content[keys.CONFIG]["pfedsv.peers"][0])]
        ) == sorted(head)
        for name, value in features.items():
            np.testing.assert_allclose(
                personal[name].double().numpy(), value.numpy(), rtol=1e-5, atol=1e-6,
                err_msg=f"client {client}, {name}",
            )  # fmt: skip
        shared = {n: v.float() for n, v in features.items()}
        games = [{n: (shared[n] if n in shared else p[n]) for n in names} for p in players]
        expected, _ = _expected_personalized(model, games, x, y, reference, head)
        for name in head:
            np.testing.assert_allclose(
                personal[name].double().numpy(), expected[name].numpy(), rtol=1e-5, atol=1e-6,
                err_msg=f"client {client}, {name}",
            )  # fmt: skip


def test_the_validation_subsample_is_off_by_default_and_draws_distinct_images():
    from pflarena.methods.pfedsv.solver import validation_subsample

    assert PFedSVParams().validation_subsample == 0  # the paper: the whole split
    x = torch.arange(40, dtype=torch.float32).reshape(20, 2)
    y = torch.arange(20)
    whole = validation_subsample(x, y, 0, torch.Generator().manual_seed(0))
    assert whole[0] is x and whole[1] is y
    assert validation_subsample(x, y, 20, torch.Generator().manual_seed(0))[1] is y
    xs, ys = validation_subsample(x, y, 7, torch.Generator().manual_seed(1))
    assert len(ys) == 7 == len(set(ys.tolist()))
    torch.testing.assert_close(xs, x[ys])  # each image keeps its label
    other = validation_subsample(x, y, 7, torch.Generator().manual_seed(2))[1]
    assert set(other.tolist()) != set(ys.tolist())  # another round, another draw
