"""``pflarena compare`` telling runs apart: runs of different methods differ in their method
and shared settings, never in every default of one method's parameters; a method's own
parameters are compared between runs of that method; the partition's Dirichlet α and a
method's α carry names (and meanings) that cannot be confused."""

from __future__ import annotations

import json
from pathlib import Path

from pflarena.cli import main
from pflarena.reporting.compare import compare_table, differences, differences_markdown

PFEDSV = {"alpha": 0.5, "initial-k": 5, "max-k": 0, "variant": "D", "dp-noise": 0.0}


def _run(path: Path, strategy: str, params: dict, *, alpha=0.1, seed=0, rounds=3) -> Path:
    """A completed run's files: its config (run config and method parameters) and summary."""
    path.mkdir(parents=True)
    run_config = {
        "strategy": strategy,
        "dataset": "digits",
        "partition": "dirichlet",
        "alpha": alpha,
        "num-clients": 4,
        "num-rounds": rounds,
        "seed": seed,
        "lr": 0.1,
        "output-dir": str(path),
    }
    run_config |= {f"{strategy}.{k}": v for k, v in params.items()}
    (path / "config.json").write_text(
        json.dumps({"run_config": run_config, "method": strategy, "method_params": params})
    )
    last = {"mean": 0.5, "weighted": 0.5, "round": rounds}
    summary = {
        "strategy": strategy,
        "dataset": "digits",
        "num_clients": 4,
        "num_rounds": rounds,
        "seed": seed,
        "status": "completed",
        "wall_time_s": 3.0,
        "rounds_completed": rounds,
        "personalized": {"last": last},
        "global": None,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "rounds.jsonl").write_text(json.dumps({"round": 0, "evaluation": {}}) + "\n")
    return path


def test_runs_of_different_methods_differ_in_their_method_not_in_its_parameters(tmp_path):
    """Catches all of pFedSV's defaults listed as "parameters that differ" beside FedAvg."""
    runs = [
        _run(tmp_path / "sv", "pfedsv", PFEDSV),
        _run(tmp_path / "avg", "fedavg", {"personal-model": "global"}, seed=1, rounds=5),
    ]
    per_run, found = differences(runs)
    assert [d.name for d in found] == ["method", "num-rounds", "seed"]
    assert found[0].values == ("pfedsv", "fedavg")
    assert per_run == [{}, {}]  # rounds and seed have columns of their own
    text = differences_markdown(runs)
    assert "- `method`: pfedsv, fedavg" in text
    assert "- `num-rounds`: 3, 5 — training rounds" in text
    table = compare_table(runs)
    for name in [*PFEDSV, "personal-model"]:
        assert name not in table and f".{name}" not in text


def test_a_method_s_own_parameter_is_compared_between_its_runs(tmp_path):
    runs = [
        _run(tmp_path / "a", "pfedsv", PFEDSV),
        _run(tmp_path / "b", "pfedsv", PFEDSV | {"alpha": 0.3}),
        _run(tmp_path / "c", "local", {}),
    ]
    per_run, found = differences(runs)
    assert [(d.name, d.between) for d in found] == [("method", None), ("pfedsv.alpha", "pfedsv")]
    assert per_run == [{"pfedsv.alpha": 0.5}, {"pfedsv.alpha": 0.3}, {}]
    _, _, a, b, c = compare_table(runs).splitlines()
    assert "| pfedsv.alpha=0.5 |" in a and "| pfedsv.alpha=0.3 |" in b and "| — |" in c
    assert "initial-k" not in compare_table(runs)  # the same in both pFedSV runs
    # its meaning is the help text the method declares
    line = next(x for x in differences_markdown(runs).splitlines() if "pfedsv.alpha" in x)
    assert line.startswith("- `pfedsv.alpha`, between the pfedsv runs: 0.5, 0.3 — pfedsv's ")
    assert "moving-average factor α" in line


def test_the_partition_s_alpha_and_a_method_s_alpha_are_named_apart(tmp_path):
    runs = [
        _run(tmp_path / "a", "pfedsv", PFEDSV, alpha=0.1),
        _run(tmp_path / "b", "pfedsv", PFEDSV | {"alpha": 0.3}, alpha=1.0),
    ]
    per_run, found = differences(runs)
    assert per_run == [
        {"partition.alpha": 0.1, "pfedsv.alpha": 0.5},
        {"partition.alpha": 1.0, "pfedsv.alpha": 0.3},
    ]
    meanings = {d.name: d.meaning for d in found}
    assert meanings["partition.alpha"].startswith("Dirichlet α")
    assert "Dirichlet" not in meanings["pfedsv.alpha"]
    table = compare_table(runs)
    # no bare `alpha=`: each α says whose it is
    assert "| partition.alpha=0.1, pfedsv.alpha=0.5 |" in table
    assert " alpha=" not in table.replace("partition.alpha=", "").replace("pfedsv.alpha=", "")


def test_the_command_prints_and_writes_what_differs_under_the_table(tmp_path, capsys):
    runs = [_run(tmp_path / "a", "ditto", {"lambda": 0.1}), _run(tmp_path / "b", "local", {})]
    out = tmp_path / "c.md"
    code = main(
        ["compare", *map(str, runs), "--plot", str(tmp_path / "c.png"), "--output", str(out)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "What differs between the runs:\n\n- `method`: ditto, local\n" in printed
    assert out.read_text() == printed.split("\n\nplot: ")[0] + "\n"
    # runs that differ in nothing: no list
    same = [_run(tmp_path / "c", "local", {}), _run(tmp_path / "d", "local", {})]
    assert differences_markdown(same) == ""
