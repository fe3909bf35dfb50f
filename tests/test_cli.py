"""The CLI's fast paths: validation before anything starts, compare, shards."""

import json

import pytest

from pflarena.cli import main
from pflarena.core.shard_format import load_shard
from pflarena.reporting.compare import compare_table


def test_bad_config_stops_before_anything_starts(tmp_path, capsys):
    code = main(["run", "--num-rounds", "zero", "--output-dir", str(tmp_path / "x")])
    assert code == 2
    err = capsys.readouterr().err
    assert "num-rounds" in err and "zero" in err
    assert not (tmp_path / "x").exists()


def test_unknown_key_via_set_is_named(tmp_path, capsys):
    assert main(["run", "--set", "learning-rate=0.1", "--output-dir", str(tmp_path / "x")]) == 2
    assert "learning-rate" in capsys.readouterr().err


def test_superlink_with_the_in_process_engine_is_refused_before_anything_starts(tmp_path, capsys):
    """Catches ``--superlink --engine inprocess`` silently running on Ray (``flwr run`` on a
    SuperLink has no in-process engine)."""
    out = tmp_path / "x"
    assert main(["run", "--superlink", "--engine", "inprocess", "--output-dir", str(out)]) == 2
    assert "--engine inprocess" in capsys.readouterr().err
    assert not (out / "rounds.jsonl").exists()


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("shards-dir", "a\x00b", "NUL byte"),
        ("output-dir", "a\x00b", "NUL byte"),
        ("data-dir", "a\x00b", "NUL byte"),
        ("shards-dir", "~pflarena-no-such-user/shards", "cannot resolve the shard directory"),
    ],
)
def test_a_path_the_system_cannot_use_is_a_config_error_naming_its_key(
    key, value, expected, tmp_path, capsys
):
    code = main(
        ["run", "--check", "--output-dir", str(tmp_path / "run"), "--set", f"{key}={value}"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"{key}: " in err and expected in err
    assert not (tmp_path / "run").exists()


def test_existing_results_are_never_overwritten(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"keep": true}')
    assert main(["run", "--output-dir", str(run)]) == 1
    assert "already holds results" in capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text()) == {"keep": True}


def _fake_run(path, strategy, mean, global_=None):
    path.mkdir(parents=True)
    block = {
        "last": {"mean": mean, "weighted": mean, "std": 0.1, "worst10": mean / 2, "round": 5},
        "best": {"mean": mean, "weighted": mean, "std": 0.1, "worst10": mean / 2, "round": 4},
    }
    summary = {
        "strategy": strategy,
        "dataset": "digits",
        "num_clients": 10,
        "num_rounds": 5,
        "seed": 0,
        "status": "completed",
        "personalized": block,
        "global": {"last": {"weighted": global_}} if global_ else None,
        "wall_time_s": 12.0,
        "bytes_up": 2e6,
        "bytes_down": 4e6,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    rounds = [
        {"round": r, "evaluation": {"personalized": {"mean": mean * r / 5}, "global": None}}
        for r in range(6)
    ]
    (path / "rounds.jsonl").write_text("\n".join(json.dumps(r) for r in rounds) + "\n")


def test_compare_table_and_plot(tmp_path, capsys):
    _fake_run(tmp_path / "a", "local", 0.9)
    _fake_run(tmp_path / "b", "fedavg", 0.6, global_=0.7)
    table = compare_table([tmp_path / "a", tmp_path / "b"])
    lines = table.splitlines()
    assert len(lines) == 4
    assert "| a | completed | local | digits | 10 | 5/5 | 0 | 90.00 |" in lines[2]
    assert "| 70.00 |" in lines[3] and "| — |" in lines[2]
    assert (
        main(
            [
                "compare",
                str(tmp_path / "a"),
                str(tmp_path / "b"),
                "--plot",
                str(tmp_path / "c.png"),
                "--output",
                str(tmp_path / "c.md"),
            ]
        )
        == 0
    )
    assert (tmp_path / "c.png").stat().st_size > 1000
    written = (tmp_path / "c.md").read_text()
    assert written.startswith(table + "\n\nWhat differs between the runs:")
    assert "- `method`: local, fedavg" in written


def test_compare_plot_tells_more_than_ten_runs_apart(tmp_path, monkeypatch):
    """Catches runs 1 and 11 drawn in the same colour and style (matplotlib's cycle has 10)."""
    from matplotlib.figure import Figure

    from pflarena.reporting.plots import compare_plot

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    runs = [tmp_path / f"r{i}" for i in range(12)]
    for i, run in enumerate(runs):
        _fake_run(run, f"m{i}", 0.5 + i / 100)
    compare_plot(runs, tmp_path / "c.png")
    lines = figures[0].axes[0].get_lines()
    assert len(lines) == 12
    assert len({(line.get_color(), line.get_linestyle()) for line in lines}) == 12


def test_compare_adds_the_cross_evaluation_where_a_run_has_one(tmp_path):
    _fake_run(tmp_path / "a", "local", 0.9)
    _fake_run(tmp_path / "b", "fedavg", 0.6, global_=0.7)
    assert "S-acc" not in compare_table([tmp_path / "a", tmp_path / "b"])
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    summary["cross"] = {"synthetic": {"mean": 0.65}, "global": {"mean": 0.61}}
    (tmp_path / "b" / "summary.json").write_text(json.dumps(summary))
    header, _, a, b = compare_table([tmp_path / "a", tmp_path / "b"]).splitlines()
    assert header.endswith("| cross S-acc | cross G-acc |")
    assert a.endswith("| — | — |") and b.endswith("| 65.00 | 61.00 |")


def test_compare_rejects_a_directory_without_results(tmp_path, capsys):
    assert main(["compare", str(tmp_path)]) == 1
    assert "no summary.json" in capsys.readouterr().err


def test_shards_command_writes_one_file_per_client(tmp_path, capsys):
    out = tmp_path / "shards"
    assert (
        main(
            [
                "shards",
                "--dataset",
                "digits",
                "--partition",
                "iid",
                "--num-clients",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    files = sorted(out.glob("*.npz"))
    assert len(files) == 3
    data, info = load_shard(files[1])
    assert data.client_id == 1 and info.name == "digits" and len(data.y_train) > 0


def test_a_run_stored_before_another_methods_default_changed_still_resumes(tmp_path):
    """config.json holds every method's table as it was fused then: a default that changed
    since (pfedgt.lambda-rule was 'fixed') must not turn a ppfl run into one that sets
    pFedGT's parameters, which a fresh run config refuses."""
    from pflarena.core.config import ConfigError
    from pflarena.runtime.launch import resume_config
    from pflarena.server.build import parse_config

    stored = parse_config({"strategy": "ppfl", "ppfl.num-canonical": 2}).to_run_config()
    stored |= {"pfedgt.lambda-rule": "fixed", "ditto.lambda": 0.5}
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run_config": stored}))
    with pytest.raises(ConfigError, match="pfedgt parameters would be ignored"):
        parse_config(stored)
    cfg = parse_config(resume_config(run))
    assert cfg.strategy == "ppfl" and cfg.resume and cfg.output_dir == str(run.resolve())
    assert cfg.method_values("ppfl")["num-canonical"] == 2
    assert not cfg.method_values("pfedgt") and not cfg.method_values("ditto")


def test_simulate_resuming_continues_a_failed_run_from_its_checkpoint(tmp_path, monkeypatch):
    """A run that fails after its first checkpoint is resumed (not restarted) on the next
    attempt; one that fails before any checkpoint starts again; the last failure is raised."""
    from pflarena.runtime import launch
    from pflarena.server.build import parse_config
    from pflarena.server.results import OutputDirError

    out = tmp_path / "run"
    config = {"strategy": "fedavg", "num-rounds": 3, "output-dir": str(out)}
    calls: list[tuple[bool, str]] = []

    def fake_simulate(cfg, **kwargs):
        calls.append((cfg.resume, cfg.output_dir))
        out.mkdir(exist_ok=True)
        if len(calls) == 2:  # the second attempt got as far as a checkpoint
            stored = parse_config(config).to_run_config()
            (out / "config.json").write_text(json.dumps({"run_config": stored}))
            (out / "checkpoint.npz").write_bytes(b"")
        if len(calls) < 3 or kwargs.get("engine") == "always-fails":
            raise RuntimeError(f"attempt {len(calls)} failed")
        return {"status": "completed"}

    monkeypatch.setattr(launch, "simulate", fake_simulate)
    assert launch.simulate_resuming(config, retries=2) == {"status": "completed"}
    assert calls == [(False, str(out)), (False, str(out)), (True, str(out.resolve()))]

    calls.clear()
    with pytest.raises(RuntimeError, match="attempt 2 failed"):
        launch.simulate_resuming(config, retries=1, engine="always-fails")
    assert [resumed for resumed, _ in calls] == [True, True]

    # results without a checkpoint (stopped in round 0): refused by name, nothing touched
    (out / "checkpoint.npz").unlink()
    calls.clear()
    with pytest.raises(OutputDirError, match="already holds results"):
        launch.simulate_resuming(config, retries=2)
    assert calls == [] and (out / "config.json").exists()


def test_relative_shard_and_data_paths_reach_the_runtime_absolute(tmp_path, monkeypatch):
    """Catches a relative ``shards-dir`` or ``data-dir`` handed as it is to the runtime,
    whose process runs in a scratch directory (``--shards-dir shards`` then found no
    manifest there)."""
    from pflarena.runtime.launch import with_absolute_paths
    from pflarena.server.build import parse_config

    monkeypatch.chdir(tmp_path)
    args = ["shards", "--dataset", "digits", "--partition", "iid", "--num-clients", "3"]
    assert main([*args, "--out", "shards"]) == 0
    cfg = parse_config({"shards-dir": "shards", "num-clients": 3, "data-dir": "data"})
    absolute = with_absolute_paths(cfg)
    assert absolute.shards_dir == str(tmp_path.resolve() / "shards")
    assert absolute.data_dir == str(tmp_path.resolve() / "data")
    assert with_absolute_paths(parse_config({})).shards_dir == ""


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--seed", "99999999999999999999"], "seed: Input should be less than or equal to"),
        (["--num-clients", "1000000000"], "num-clients: Input should be less than or equal to"),
    ],
)
def test_check_refuses_a_seed_or_client_count_out_of_range(flags, expected, tmp_path, capsys):
    code = main(["run", "--check", "--output-dir", str(tmp_path / "run"), *flags])
    assert code == 2 and expected in capsys.readouterr().err


def test_check_refuses_an_output_dir_that_names_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("keep")
    for target, says in ((tmp_path / "file", "is a file"), (tmp_path / "file" / "x", "under")):
        assert main(["run", "--check", "--output-dir", str(target)]) == 1
        assert says in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "keep"


def test_compare_names_and_skips_a_malformed_run(tmp_path, capsys):
    _fake_run(tmp_path / "good", "fedavg", 0.6)
    _fake_run(tmp_path / "no-strategy", "local", 0.9)
    summary = json.loads((tmp_path / "no-strategy" / "summary.json").read_text())
    del summary["strategy"]
    (tmp_path / "no-strategy" / "summary.json").write_text(json.dumps(summary))
    _fake_run(tmp_path / "odd-values", "ditto", 0.5)
    summary = json.loads((tmp_path / "odd-values" / "summary.json").read_text())
    summary["personalized"]["last"] = "n/a"
    summary["bytes_up"] = None
    (tmp_path / "odd-values" / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "odd-values" / "rounds.jsonl").write_text('{"evaluation": {}}\n')
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / "summary.json").write_text("{")
    runs = [str(tmp_path / name) for name in ("good", "no-strategy", "odd-values", "garbled")]
    code = main(["compare", *runs, "--plot", str(tmp_path / "c.png")])
    out, err = capsys.readouterr()
    assert code == 0
    assert "'strategy' is missing" in err and "garbled" in err and "not readable JSON" in err
    assert "| good | completed | fedavg |" in out and "| odd-values | completed | ditto |" in out
    assert "no-strategy" not in out
    assert (tmp_path / "c.png").exists()
    assert main(["compare", runs[1]]) == 1


def test_a_run_on_a_gpu_where_none_is_visible_is_refused_at_once(tmp_path, capsys, monkeypatch):
    """Catches ``--device cuda`` on a machine without a GPU failing inside every client
    (after the start-up) instead of before anything starts."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "x"
    code = main(["run", "--device", "cuda", "--workers", "2", "--output-dir", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "--device cuda: no GPU is visible" in err and "--device cpu" in err
    assert not out.exists()
