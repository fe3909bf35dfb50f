"""Sweeps: the grid a sweep plans, which runs it skips, and its leaderboard."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from pflarena.cli.sweep import (
    build_sweep,
    configs_to_run,
    load_sweep_file,
    parse_value,
    plan_runs,
)
from pflarena.core.config import ConfigError
from pflarena.reporting.leaderboard import LEADERBOARD_METRICS, leaderboard, leaderboard_markdown

SMALL = {"num-clients": 3, "num-rounds": 2, "fraction-train": 1.0}


def test_a_grid_multiplies_common_keys_and_only_its_own_methods_keys(tmp_path):
    sweep = build_sweep(
        strategies=["fedavg", "ditto"],
        seeds=[0, 1],
        settings=SMALL,
        grid={"alpha": [0.1, 1.0], "ditto.lambda": [0.1, 0.5, 1.0]},
        out=tmp_path,
    )
    runs = plan_runs(sweep)
    # 2 alphas x (fedavg once + ditto three times) x 2 seeds
    assert len(runs) == 2 * (1 + 3) * 2
    assert len({run.directory for run in runs}) == len(runs)
    assert {run.status for run in runs} == {"new"}
    fedavg = [run for run in runs if run.strategy == "fedavg"]
    assert len(fedavg) == 4 and all("ditto.lambda" not in run.run_config for run in fedavg)
    ditto = {
        (run.setting_name, run.method, run.seed): run.run_config
        for run in runs
        if run.strategy == "ditto"
    }
    assert ditto[("alpha=0.1", "ditto,lambda=0.5", 1)]["ditto.lambda"] == 0.5
    assert ditto[("alpha=0.1", "ditto,lambda=0.5", 1)]["alpha"] == 0.1
    assert ditto[("alpha=0.1", "ditto,lambda=0.5", 1)]["seed"] == 1
    run = runs[0]
    assert run.directory == tmp_path.resolve() / "alpha=0.1" / "fedavg" / "seed-0"
    assert run.run_config["output-dir"] == str(run.directory)
    assert run.run_config["num-clients"] == 3 and run.run_config["strategy"] == "fedavg"


def test_a_sweep_file_and_flags_combine_flags_winning(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(
        """
preset = "digits-main"
strategies = ["fedavg", "fedprox"]
seeds = [3, 4]
out = "somewhere"

[config]
num-rounds = 5
[config.fedprox]
mu = 0.5

[grid]
alpha = [0.1, 0.5]
fedprox.mu = [0.01, 0.1]
"""
    )
    file = load_sweep_file(path)
    assert file["grid"] == {"alpha": [0.1, 0.5], "fedprox.mu": [0.01, 0.1]}
    sweep = build_sweep(
        file, seeds=[7], settings={"num-rounds": 2}, grid={"alpha": [1.0]}, out=tmp_path / "x"
    )
    assert sweep.seeds == [7] and sweep.out == tmp_path / "x"
    assert sweep.strategies == ["fedavg", "fedprox"]
    assert sweep.grid == {"alpha": [1.0], "fedprox.mu": [0.01, 0.1]}
    runs = plan_runs(sweep)
    assert len(runs) == 1 * (1 + 2) * 1
    for run in runs:
        # the preset's keys, the file's, then the flags
        assert run.run_config["num-clients"] == 10 and run.run_config["num-rounds"] == 2
        assert run.run_config["partition"] == "dirichlet" and run.run_config["alpha"] == 1.0
    assert {r.run_config.get("fedprox.mu") for r in runs if r.strategy == "fedprox"} == {0.01, 0.1}
    # the preset's strategies when none are given
    assert build_sweep({"preset": "digits-main", "out": "o"}).strategies[:2] == ["local", "fedavg"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"grid": {"seed": [0, 1]}}, "'seed' cannot be a grid key; list them in seeds"),
        ({"grid": {"strategy": ["a"]}}, "list them in strategies"),
        ({"grid": {"ditto.lambda": [0.1]}}, "ditto.lambda is given but ditto is not among"),
        ({"settings": {"pfedgt.mu": 0.1}}, "pfedgt.mu is given but pfedgt is not among"),
        ({"seeds": [1, 1]}, "seeds repeat"),
        ({"grid": {"alpha": [0.1, 0.5, 0.1]}}, r"grid key 'alpha' repeats value\(s\) \['0.1'\]"),
        ({"grid": {"local-epochs": [1, "1"]}}, "grid key 'local-epochs' repeats"),
        ({"out": None}, "needs an output directory"),
        ({"strategies": []}, "no strategies to sweep"),
        ({"grid": {"alpha": [-1.0]}}, r"run alpha=-1\.0/fedavg/seed-0: invalid run config"),
        ({"settings": {"num-clientz": 3}}, "unknown key 'num-clientz'"),
    ],
)
def test_a_bad_sweep_is_refused_naming_the_problem(tmp_path, kwargs, message):
    options = {"strategies": ["fedavg"], "seeds": [0], "settings": SMALL, "out": tmp_path}
    with pytest.raises(ConfigError, match=message):
        plan_runs(build_sweep(**(options | kwargs)))


@pytest.mark.parametrize(
    "text, message",
    [
        ("strategies = [", "not valid TOML"),
        ("colour = 1", "unknown entries"),
        ("[grid]\nalpha = 0.1", "needs a non-empty list"),
        ("[grid]\nalpha = []", "needs a non-empty list"),
    ],
)
def test_a_bad_sweep_file_is_refused(tmp_path, text, message):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_sweep_file(path)


def test_flag_values_are_read_as_toml():
    assert [parse_value(v) for v in ("0.1", "3", "true", "dirichlet", '"a b"')] == [
        0.1,
        3,
        True,
        "dirichlet",
        "a b",
    ]


def _fake_run(run, personalized, global_, status="completed", config=None):
    run.directory.mkdir(parents=True, exist_ok=True)
    (run.directory / "config.json").write_text(json.dumps({"run_config": config or run.run_config}))
    if status is None:
        return
    summary = {
        "strategy": run.strategy,
        "seed": run.seed,
        "status": status,
        "wall_time_s": 10.0 + run.seed,
        "rounds_completed": 2,
        "personalized": {
            "last": {"mean": personalized[0]},
            "best": {"mean": personalized[1]},
        },
        "global": None
        if global_ is None
        else {"last": {"weighted": global_[0]}, "best": {"weighted": global_[1]}},
    }
    (run.directory / "summary.json").write_text(json.dumps(summary))


def test_completed_runs_are_skipped_and_unfinished_ones_resumed(tmp_path):
    sweep = build_sweep(strategies=["fedavg"], seeds=[0, 1, 2], settings=SMALL, out=tmp_path)
    first, second, third = plan_runs(sweep)
    _fake_run(first, (0.5, 0.6), (0.4, 0.5))
    _fake_run(second, (0.5, 0.6), (0.4, 0.5), status="failed")
    _fake_run(third, (0.5, 0.6), (0.4, 0.5), status=None)  # killed: config.json, no summary
    statuses = [run.status for run in plan_runs(sweep)]
    assert statuses == ["completed", "resume", "resume"]
    todo = configs_to_run(plan_runs(sweep))
    assert [(cfg.seed, cfg.resume) for cfg in todo] == [(1, True), (2, True)]
    # a folder holding a run of another config is not taken for this one
    other = dict(first.run_config, lr=0.05)
    _fake_run(first, (0.5, 0.6), (0.4, 0.5), config=other)
    with pytest.raises(
        ConfigError, match=r"another config \(differs in lr: 0\.05 there, 0\.1 here"
    ):
        plan_runs(sweep)


def test_leaderboard_means_and_stds_over_seeds(tmp_path):
    sweep = build_sweep(
        strategies=["fedavg", "local"],
        seeds=[0, 1, 2],
        settings=SMALL,
        grid={"alpha": [0.1, 1.0]},
        out=tmp_path,
    )
    runs = plan_runs(sweep)
    rng = np.random.default_rng(0)
    values: dict[tuple[str, str], list[list[float]]] = {}
    for run in runs:
        if run.strategy == "fedavg" and run.seed == 2 and run.setting_name == "alpha=1.0":
            continue  # one run did not complete: its group averages the other two
        numbers = rng.random(4).tolist()
        glob = None if run.strategy == "local" else (numbers[2], numbers[3])
        _fake_run(run, (numbers[0], numbers[1]), glob)
        values.setdefault((run.setting_name, run.method), []).append(numbers)
    rows = leaderboard(plan_runs(sweep))
    assert [
        (r["setting"], r["completed"], r["planned"]) for r in rows if r["method"] == "fedavg"
    ] == [
        ("alpha=0.1", 3, 3),
        ("alpha=1.0", 2, 3),
    ]
    for row in rows:
        observed = np.array(values[(row["setting"], row["method"])])
        for column, (name, *_) in enumerate(LEADERBOARD_METRICS):
            if row["method"] == "local" and column >= 2:
                assert row[name] is None  # no global model
                continue
            mean, std = row[name]
            assert mean == pytest.approx(np.mean(observed[:, column]))
            assert std == pytest.approx(np.std(observed[:, column]))
    for setting in ("alpha=0.1", "alpha=1.0"):  # best personalized accuracy first
        lasts = [r[LEADERBOARD_METRICS[0][0]][0] for r in rows if r["setting"] == setting]
        assert lasts == sorted(lasts, reverse=True)
    markdown = leaderboard_markdown(rows)
    assert "## alpha=0.1" in markdown and "| fedavg | 2/3 |" in markdown


def _sweep_cli(tmp_path, *extra):
    return subprocess.run(
        [
            sys.executable, "-m", "pflarena.cli", "sweep",
            "--strategies", "fedavg,local", "--seeds", "0,1",
            "--set", "num-clients=3", "--set", "num-rounds=2", "--set", "fraction-train=1.0",
            "--out", str(tmp_path / "sweep"), "--quiet", *extra,
        ],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.slow
def test_a_2x2_sweep_twice_runs_nothing_new_and_its_leaderboard_matches_the_runs(tmp_path):
    # The sweep's bookkeeping and leaderboard do not depend on the engine: in-process here,
    # on Ray in the killed-sweep test below.
    first = _sweep_cli(tmp_path, "--engine", "inprocess")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "4 runs, 0 completed, 0 to resume, 4 to start" in first.stdout
    summaries = sorted((tmp_path / "sweep").rglob("summary.json"))
    assert len(summaries) == 4
    stamps = {path: path.stat().st_mtime_ns for path in summaries}

    second = _sweep_cli(tmp_path, "--engine", "inprocess")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "4 runs, 4 completed, 0 to resume, 0 to start" in second.stdout
    assert {path: path.stat().st_mtime_ns for path in summaries} == stamps  # nothing ran

    with open(tmp_path / "sweep" / "leaderboard.csv") as handle:
        rows = {row["method"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"fedavg", "local"}
    for method, row in rows.items():
        runs = [json.loads(p.read_text()) for p in summaries if p.parts[-3] == method]
        assert len(runs) == 2 and int(row["completed"]) == 2
        for name, section, point, stat in LEADERBOARD_METRICS:
            found = [(r[section] or {}).get(point, {}).get(stat) for r in runs]
            if None in found:
                assert row[f"{name} mean"] == ""
                continue
            assert float(row[f"{name} mean"]) == pytest.approx(np.mean(found), abs=1e-12)
            assert float(row[f"{name} std"]) == pytest.approx(np.std(found), abs=1e-12)
    assert (tmp_path / "sweep" / "leaderboard.png").stat().st_size > 0
    assert "| fedavg | 2/2 |" in second.stdout


@pytest.mark.slow
def test_a_killed_sweep_continues_where_it_died_to_the_uninterrupted_results(tmp_path):
    """SIGKILL a sweep (all its processes) in its second run, after a checkpoint; run it again."""
    import time

    from processes import kill_tree
    from test_resume import comparable

    from pflarena.server.results import read_rounds

    args = [
        sys.executable, "-m", "pflarena.cli", "sweep", "--strategies", "local,ditto",
        "--set", "num-clients=3", "--set", "num-rounds=5", "--set", "fraction-train=1.0",
        "--quiet",
    ]  # fmt: skip
    # The uninterrupted reference runs in-process: the same rounds as on Ray
    # (test_startup.py), without a second Ray start.
    whole = subprocess.run(
        [*args, "--engine", "inprocess", "--out", str(tmp_path / "whole")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert whole.returncode == 0, whole.stdout + whole.stderr

    victim = subprocess.Popen(
        [*args, "--out", str(tmp_path / "sweep")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ditto = tmp_path / "sweep" / "all" / "ditto" / "seed-0" / "rounds.jsonl"
    deadline = time.monotonic() + 900
    # A round's record is written before its checkpoint: round 3's record means round 2's
    # checkpoint is on disk (a kill just after round 2's record resumed after round 1).
    while not ditto.exists() or max((r["round"] for r in read_rounds(ditto)), default=0) < 3:
        assert victim.poll() is None and time.monotonic() < deadline, "the sweep ended early"
        time.sleep(0.2)
    kill_tree(victim.pid)  # all of it, no chance to clean up
    victim.wait(timeout=30)
    assert not ditto.with_name("summary.json").exists()

    again = subprocess.run(
        [*args, "--out", str(tmp_path / "sweep")], capture_output=True, text=True, timeout=900
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 runs, 1 completed, 1 to resume, 0 to start" in again.stdout
    for method in ("local", "ditto"):
        path = f"all/{method}/seed-0"
        assert comparable(read_rounds(tmp_path / "sweep" / path / "rounds.jsonl")) == comparable(
            read_rounds(tmp_path / "whole" / path / "rounds.jsonl")
        ), method
    resumes = json.loads(ditto.with_name("config.json").read_text())["resumes"]
    assert len(resumes) == 1 and resumes[0]["after_round"] >= 2
