"""What a researcher reads: one meaning per accuracy figure (summary, plots, leaderboard,
compare), compare telling runs apart, short help, sweep flags, the local-deploy line, and
pFedSV+DP's log lines printed once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pflarena.cli import main
from pflarena.cli import sweep as sweep_command
from pflarena.cli.command import build_parser
from pflarena.reporting.compare import compare_table
from pflarena.runtime.launch import project_root
from pflarena.server.build import parse_config
from pflarena.server.loop import summary_record
from pflarena.server.metrics import HEADLINE, definitions, label
from pflarena.server.results import plot_run


def _rounds(path: Path, last: int, per_client: dict | None = None) -> list[dict]:
    """Round records whose global mean and pooled accuracies differ (0.1 apart)."""
    records = []
    for number in range(last + 1):
        records.append(
            {
                "round": number,
                "elapsed_s": float(number),
                "evaluation": {
                    "personalized": {"mean": 0.5 + number / 100, "weighted": 0.45},
                    "global": {"mean": 0.2 + number / 100, "weighted": 0.3 + number / 100},
                    "per_client": per_client or {},
                },
            }
        )
    path.mkdir(parents=True, exist_ok=True)
    (path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def _run(path: Path, strategy: str, params: dict, *, status="completed", done=30, planned=30):
    records = _rounds(path, done)
    run_config = {"strategy": strategy, "dataset": "digits", "num-rounds": planned, "seed": 0}
    run_config |= {"output-dir": str(path), "lr": 0.1, "num-clients": 10}
    (path / "config.json").write_text(
        json.dumps({"run_config": run_config, "method": strategy, "method_params": params})
    )
    if status is None:  # killed: no summary
        return
    cfg = parse_config({"strategy": "fedavg", "num-rounds": planned})
    summary = summary_record(cfg, records, status=status, wall_time_s=9.0, startup_s=4.0)
    summary["strategy"] = strategy
    (path / "summary.json").write_text(json.dumps(summary))


def test_summary_names_its_figures_and_keeps_the_start_up_apart(tmp_path):
    records = _rounds(tmp_path, 3)
    summary = summary_record(
        parse_config({"num-rounds": 3}),
        records,
        status="completed",
        wall_time_s=10.0,
        startup_s=6.5,
    )
    assert summary["metric_definitions"] == definitions()
    assert summary["metric_definitions"]["headline"] == {
        "personalized": "mean",
        "global": "weighted",
    }
    assert "union of the clients' test splits" in summary["metric_definitions"]["weighted"]
    assert summary["startup_s"] == 6.5 and summary["rounds_time_s"] == pytest.approx(3.5)


def test_the_accuracy_plot_shows_the_headline_figures_named_and_whole_rounds(tmp_path, monkeypatch):
    """Catches the plot showing the global model's mean over clients while the console shows
    its pooled accuracy, half-round ticks and fractional client counts."""
    from matplotlib.figure import Figure

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    clients = {str(i): {"personalized": 0.1 * i, "test_samples": 5} for i in range(3)}
    records = _rounds(tmp_path, 3, clients)
    plot_run(tmp_path)
    accuracy, clients_figure = figures
    ax = accuracy.axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {  # in percent
        label("personalized"): [
            100 * r["evaluation"]["personalized"][HEADLINE["personalized"]] for r in records
        ],
        label("global"): [100 * r["evaluation"]["global"]["weighted"] for r in records],
    }
    assert label("global") == "global accuracy (pooled)"
    accuracy.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks())
    clients_figure.canvas.draw()  # the last round's distribution: whole clients
    assert all(float(t).is_integer() for t in clients_figure.axes[1].get_xticks())


def test_compare_marks_partial_runs_and_shows_the_parameters_that_differ(tmp_path):
    _run(tmp_path / "a", "pfedgt", {"lambda": 0.7, "gamma": 0.8})
    _run(tmp_path / "b", "pfedgt", {"lambda": 0.25, "gamma": 0.8})
    _run(tmp_path / "c", "pfedgt", {"lambda": 0.7, "gamma": 0.8}, status="failed", done=5)
    _run(tmp_path / "d", "fedavg", {"personal-model": "global"}, status=None, done=2)
    table = compare_table([tmp_path / n for n in "abcd"])
    header, _, a, b, c, d = table.splitlines()
    assert "| settings that differ |" in header
    assert "pers. mean (last)" in header and "global pooled (last)" in header
    assert "| a | completed | pfedgt | digits | 10 | 30/30 | 0 | pfedgt.lambda=0.7 |" in a
    assert "| b | completed | pfedgt | digits | 10 | 30/30 | 0 | pfedgt.lambda=0.25 |" in b
    assert "gamma" not in table  # the same in every run that has it
    # a run stopped at round 5 of 30 says so, with its round-5 figures
    assert "| c | **failed** at round 5 of 30 | pfedgt | digits | 10 | 5/30 |" in c
    assert "| 55.00 |" in c
    # a killed run (no summary) is read from its config and rounds
    assert "| d | **interrupted** at round 2 of 30 | fedavg | digits | 10 | 2/30 |" in d
    # one run alone: no parameter column
    assert "settings that differ" not in compare_table([tmp_path / "a"])


def test_compare_and_the_leaderboard_show_the_privacy_spent(tmp_path):
    _run(tmp_path / "a", "pfedsv", {"dp-noise": 1.0})
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    summary["method"] = {"dp": {"epsilon": 16.48, "delta": 1e-5}}
    (tmp_path / "a" / "summary.json").write_text(json.dumps(summary))
    header, _, row = compare_table([tmp_path / "a"]).splitlines()
    assert header.endswith("| DP ε (δ) |") and row.endswith("| 16.5 (1e-05) |")

    from pflarena.reporting.leaderboard import leaderboard_markdown

    rows = [
        {
            "setting": "all",
            "method": "pfedsv",
            "planned": 1,
            "completed": 1,
            "rounds": 30,
            "rounds_time_s": (5.0, 0.0),
            "epsilon": (16.48, 0.0),
        }
        | {name: (0.9, 0.0) for name in ("pers. mean last", "pers. mean best")}
        | {name: None for name in ("global pooled last", "global pooled at best")}
    ]
    markdown = leaderboard_markdown(rows)
    assert "| rounds | rounds s | DP ε |" in markdown and "| 30 | 5 | 16.5 |" in markdown


def test_run_help_is_short_and_help_all_lists_everything(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    short = capsys.readouterr().out
    # The common flags described, and by name every flag a built-in preset sets or a method
    # needs (a paper's setting is reachable from --help); --help-all describes all ~1,100 lines.
    assert len(short.splitlines()) < 120
    assert "--ppfl.num-canonical" in short and "--validation-fraction" in short
    assert "--help-all" in short and "pflarena methods NAME" in short and "--num-rounds" in short
    assert "--ditto.lambda" not in short.split("Common flags only")[0]
    with pytest.raises(SystemExit) as done:
        main(["run", "--help-all"])
    assert done.value.code == 0
    full = capsys.readouterr().out
    assert "--ditto.lambda" in full and "--cross-eval-fraction" in full
    assert len(full.splitlines()) > 5 * len(short.splitlines())


def test_sweep_takes_the_run_flags_it_passes_on(tmp_path, monkeypatch):
    """Catches ``pflarena sweep ... --num-rounds 2`` answered with "unrecognized arguments"."""
    seen = []

    def fake_run_simulations(configs, **kwargs):
        seen.extend(configs)
        return 0, []

    monkeypatch.setattr(sweep_command, "run_simulations", fake_run_simulations)
    code = main(
        [
            "sweep",
            "--strategies",
            "fedavg,ditto",
            "--num-rounds",
            "2",
            "--num-clients",
            "3",
            "--ditto.lambda",
            "0.5",
            "--out",
            str(tmp_path / "sweep"),
        ]
    )
    assert code == 1  # the faked runs wrote nothing: the sweep says they did not complete
    assert [(c.strategy, c.num_rounds, c.num_clients) for c in seen] == [
        ("fedavg", 2, 3),
        ("ditto", 2, 3),
    ]
    assert seen[1].method_values("ditto") == {"lambda": 0.5}
    with pytest.raises(SystemExit):  # where each run is written is the sweep's (--out)
        main(["sweep", "--output-dir", str(tmp_path), "--out", str(tmp_path)])


def test_local_deploy_prints_flwr_run_of_the_laid_out_app(tmp_path, monkeypatch, capsys):
    """Catches ``flwr run <clone>``: Flower walks every file of the directory it is given,
    a clone's .venv included."""
    from pflarena.deploy import local as deploy
    from pflarena.runtime.appdir import flwr_run_dir

    for name in ("start", "save", "stop"):
        monkeypatch.setattr(deploy.LocalDeployment, name, lambda self, *a, **k: None)
    monkeypatch.setenv("PFLARENA_APP_DIR", str(tmp_path / "apps"))
    code = main(["local-deploy", "--num-supernodes", "2", "--dir", str(tmp_path / "d"), "--detach"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"flwr run {flwr_run_dir()} " in out
    assert f"flwr run {project_root()} " not in out


def test_pfedsv_privacy_accounting_leaves_the_log_alone():
    """Catches every log line printed twice once opacus is imported (its module calls
    logging.basicConfig, and Flower's logger propagates to the root logger)."""
    code = (
        "from logging import INFO\n"
        "from flwr.common.logger import log\n"
        "from pflarena.methods.pfedsv.strategy import dp_epsilon\n"
        "assert dp_epsilon(1.0, 3, 1e-5) > 0\n"
        "log(INFO, 'marker-line')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert (done.stdout + done.stderr).count("marker-line") == 1
