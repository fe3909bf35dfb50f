"""CFL (Sattler et al. 2020): the optimal bipartition against enumeration, the split criterion,
the cluster-wise update, resume, and the recovery of label-permuted groups on digits."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import (
    comparable,
    config,
    die_in_round,
    grid_for,
    run_local,
    run_resumable,
    stateful_grid,
)
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform

from pflarena.core import keys
from pflarena.methods.cfl.strategy import (
    cosine_similarities,
    max_cross_similarity,
    optimal_bipartition,
    split_criterion,
)
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy
from pflarena.server.results import read_rounds


def _exhaustive_minimum(similarity: np.ndarray) -> float:
    """min over every bipartition (both parts non-empty) of the largest cross similarity."""
    count = len(similarity)
    best = np.inf
    for code in range(1, 2 ** (count - 1)):  # client count-1 always in the second part
        part = np.array([(code >> i) & 1 for i in range(count)], dtype=bool)
        best = min(best, similarity[np.ix_(part, ~part)].max())
    return float(best)


def _unit_vectors(seed: int, count: int, dim: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(count, dim))
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(("count", "dim"), [(3, 2), (5, 3), (7, 4), (9, 20)])
def test_the_bipartition_minimises_the_largest_cross_similarity(seed, count, dim):
    updates = _unit_vectors(seed, count, dim) * np.random.default_rng(seed + 99).uniform(
        0.1, 3.0, size=(count, 1)
    )  # norms do not matter, only directions
    similarity = cosine_similarities(updates)
    literal = np.array(
        [[u @ v / (np.linalg.norm(u) * np.linalg.norm(v)) for v in updates] for u in updates]
    )
    np.testing.assert_allclose(similarity, literal, atol=1e-12)
    first, second = optimal_bipartition(similarity)
    assert sorted(first + second) == list(range(count)) and first and second
    assert 0 in first
    mask = np.zeros(count, dtype=bool)
    mask[first] = True
    assert max_cross_similarity(similarity, mask) == pytest.approx(
        _exhaustive_minimum(similarity), abs=1e-12
    )


def test_complete_linkage_the_authors_code_can_miss_the_optimum():
    """Why the bipartition is single linkage: a case where complete linkage is not optimal."""
    similarity = cosine_similarities(_unit_vectors(0, 6, 4))
    distance = 1.0 - similarity
    np.fill_diagonal(distance, 0.0)
    labels = fcluster(linkage(squareform(distance, checks=False), "complete"), 2, "maxclust")
    complete = max_cross_similarity(similarity, labels == labels[0])
    first, _ = optimal_bipartition(similarity)
    mask = np.isin(np.arange(6), first)
    ours = max_cross_similarity(similarity, mask)
    assert ours == pytest.approx(_exhaustive_minimum(similarity))
    assert complete > ours + 0.1  # 0.281 against 0.133


def test_two_groups_of_opposite_directions_are_separated():
    rng = np.random.default_rng(5)
    direction = rng.normal(size=30)
    updates = np.stack(
        [direction + 0.3 * rng.normal(size=30) for _ in range(4)]
        + [-direction + 0.3 * rng.normal(size=30) for _ in range(3)]
    )
    assert optimal_bipartition(cosine_similarities(updates)) == ([0, 1, 2, 3], [4, 5, 6])


def test_bad_similarity_matrices_are_refused():
    with pytest.raises(ValueError, match="at least 2 rows"):
        optimal_bipartition(np.ones((1, 1)))
    with pytest.raises(ValueError, match="symmetric"):
        optimal_bipartition(np.array([[1.0, 0.2], [0.5, 1.0]]))


@pytest.mark.parametrize(
    ("mean", "largest", "expected"),
    [(0.1, 2.0, True), (0.5, 2.0, False), (0.1, 1.0, False), (0.4, 2.0, False), (0.1, 1.6, False)],
)
def test_the_split_criterion_needs_a_small_mean_and_a_large_member_update(mean, largest, expected):
    assert split_criterion(mean, largest, eps_1=0.4, eps_2=1.6) is expected


def test_a_split_round_gives_each_part_the_parent_plus_its_own_mean_update(tmp_path):
    """Round 1 with a criterion always met: the clusters against the replies' literal updates."""
    cfg = config(
        strategy="cfl", num_clients=6, num_rounds=1, partition="iid",
        **{"label-permutation-groups": 2, "cfl.eps-1": 1e6, "cfl.eps-2": 1e-9,
           "cfl.warmup-rounds": 0, "local-epochs": 2},
    )  # fmt: skip
    strategy = build_strategy(cfg)
    grid = grid_for(cfg)
    updates, examples = {}, {}

    def keep(reply):
        content = reply.content
        if keys.ARRAYS in content and keys.PERSONALIZED_COUNT not in content[keys.METRICS]:
            client = int(content[keys.METRICS][keys.CLIENT_ID])
            updates[client] = {k: v.numpy().copy() for k, v in content[keys.ARRAYS].items()}
            examples[client] = float(content[keys.METRICS][keys.NUM_EXAMPLES])
        return reply

    grid.reply_filter = keep
    new = {}
    original = strategy.train_round

    def train_round(*args):
        out = original(*args)
        new["arrays"] = out[0]
        return out

    strategy.train_round = train_round
    run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    start = {k: v.numpy() for k, v in initial_arrays(cfg).items()}
    trainable = [n for n in start if n.endswith(("weight", "bias"))]
    flat = np.stack([np.concatenate([updates[c][n].ravel() for n in trainable]) for c in range(6)])
    weights = np.array([examples[c] for c in range(6)])
    mean_norm = np.linalg.norm((weights / weights.sum()) @ flat)
    (split,) = strategy.splits
    assert split["round"] == 1 and split["parent"] == 0 and split["children"] == [0, 1]
    assert split["mean_update_norm"] == pytest.approx(mean_norm, rel=1e-9)
    assert split["max_update_norm"] == pytest.approx(np.linalg.norm(flat, axis=1).max(), rel=1e-9)
    assert sorted(split["members"][0] + split["members"][1]) == list(range(6))
    for cluster, members in enumerate(split["members"]):
        w = np.array([examples[c] for c in members])
        w = w / w.sum()
        for name in start:
            expected = start[name] + sum(
                wi * updates[c][name] for wi, c in zip(w, members, strict=True)
            )
            got = new["arrays"][f"cluster.{cluster}.{name}"].numpy()
            np.testing.assert_allclose(got, expected, atol=1e-6)
        for client in members:
            assert strategy.cluster_of(client) == cluster


def test_no_split_before_the_warmup_or_below_the_minimum_size(tmp_path):
    always = {"cfl.eps-1": 1e6, "cfl.eps-2": 1e-9}
    cfg = config(strategy="cfl", num_clients=4, num_rounds=2,
                 **always, **{"cfl.warmup-rounds": 2})  # fmt: skip
    strategy = build_strategy(cfg)
    run_local(cfg, tmp_path / "warm", strategy=strategy)
    assert strategy.splits == [] and sorted(strategy.norms) == [1, 2]
    cfg = config(strategy="cfl", num_clients=4, num_rounds=1,
                 **always, **{"cfl.warmup-rounds": 0, "cfl.min-split-size": 5})  # fmt: skip
    strategy = build_strategy(cfg)
    run_local(cfg, tmp_path / "small", strategy=strategy)
    assert strategy.splits == []


@pytest.mark.parametrize(("clients", "seed", "rounds"), [(6, 0, 4), (8, 1, 6)])
def test_cfl_recovers_two_label_permuted_groups_on_digits(tmp_path, clients, seed, rounds):
    """The acceptance: clients 0..m/2-1 see the digits' labels, the others a permutation of
    them; CFL must end with exactly those two clusters (up to renaming)."""
    cfg = config(
        strategy="cfl", dataset="digits", num_clients=clients, num_rounds=rounds,
        partition="iid", seed=seed, local_epochs=2, lr=0.1,
        **{"label-permutation-groups": 2, "cfl.eps-1": 0.28, "cfl.eps-2": 0.4,
           "cfl.warmup-rounds": 1},
    )  # fmt: skip
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, strategy=strategy)
    groups = [set(range(clients // 2)), set(range(clients // 2, clients))]
    final = strategy._assignment_list()
    found = [{c for c in range(clients) if final[c] == j} for j in sorted(set(final))]
    assert sorted(found, key=min) == groups
    assert len(strategy.splits) == 1
    split = strategy.splits[0]
    assert split["mean_update_norm"] < 0.28 < 0.4 < split["max_update_norm"]
    assert split["max_cross_similarity"] < 0.5
    start = outcome.rounds[0]["evaluation"]["personalized"]["mean"]
    assert outcome.rounds[-1]["evaluation"]["personalized"]["mean"] > start + 0.2
    written = strategy.write_artifacts(tmp_path)
    assert [p.name for p in written] == ["cfl_tree.json", "clusters.csv"]
    tree = json.loads(written[0].read_text())
    assert tree["splits"][0]["members"] == [sorted(groups[0]), sorted(groups[1])]
    assert tree["assignment"] == final
    assert sorted(int(r) for r in tree["norms"]) == list(range(1, rounds + 1))
    lines = written[1].read_text().splitlines()
    assert lines[0] == "round,client,cluster" and len(lines) == 1 + rounds * clients
    assert lines[-1] == f"{rounds},{clients - 1},{final[-1]}"
    assert strategy.run_summary()["cluster_sizes"] == [clients // 2, clients // 2]


def test_a_run_killed_after_its_split_resumes_to_the_uninterrupted_results(tmp_path):
    cfg = config(
        strategy="cfl", num_clients=6, num_rounds=4, partition="iid", local_epochs=2,
        fraction_train=0.84,
        **{"label-permutation-groups": 2, "cfl.eps-1": 1e6, "cfl.eps-2": 1e-9,
           "cfl.warmup-rounds": 1, "cfl.min-split-size": 4},
    )  # fmt: skip
    _, whole = run_resumable(
        cfg, tmp_path / "whole", stateful_grid(cfg, tmp_path / "state-whole", 1_000_003)
    )
    assert whole.splits, "the run must split before the interruption"
    broken = stateful_grid(cfg, tmp_path / "state-broken", 2_000_003)
    die_in_round(broken, 4)
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
    assert resumed.splits == whole.splits
    assert resumed.history == whole.history
    assert resumed.assignment == whole.assignment
