"""The pictures a researcher looks at: titled with the run's setting, accuracy and loss by
round, each client's accuracy by round, compare's legend in every panel (methods without a
global model marked, not dropped), compare over sweep folders and globs, the partition
picture with its labelled colour bar."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pflarena.cli import main
from pflarena.reporting.compare import (
    RunArgumentError,
    compare_table,
    expand_runs,
)
from pflarena.reporting.plots import compare_plot
from pflarena.server.results import plot_run, run_title


def _write_run(path: Path, strategy: str, *, global_model=True, params=None, alpha=0.1, seed=0):
    """A completed run of 3 rounds and 4 clients whose client 3 never learns."""
    records = []
    for number in range(4):
        per_client = {
            str(c): {"personalized": 0.0 if c == 3 else 0.2 * number + 0.05 * c, "test_samples": 5}
            for c in range(4)
        }
        accs = [v["personalized"] for v in per_client.values()]
        evaluation = {
            "personalized": {"mean": float(np.mean(accs)), "weighted": float(np.mean(accs))},
            "global": {"mean": 0.1 * number, "weighted": 0.1 * number + 0.01}
            if global_model
            else None,
            "per_client": per_client,
        }
        record = {"round": number, "elapsed_s": float(number), "evaluation": evaluation}
        if number:
            record["train"] = {"loss": 2.0 - 0.5 * number, "clients": 4}
        records.append(record)
    path.mkdir(parents=True, exist_ok=True)
    (path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run_config = {
        "strategy": strategy,
        "dataset": "digits",
        "partition": "dirichlet",
        "alpha": alpha,
        "num-clients": 4,
        "num-rounds": 3,
        "seed": seed,
        "output-dir": str(path),
    }
    (path / "config.json").write_text(
        json.dumps({"run_config": run_config, "method": strategy, "method_params": params or {}})
    )
    last = records[-1]["evaluation"]
    summary = {
        "strategy": strategy,
        "dataset": "digits",
        "num_clients": 4,
        "num_rounds": 3,
        "seed": seed,
        "status": "completed",
        "wall_time_s": 3.0,
        "rounds_completed": 3,
        "personalized": {"last": last["personalized"] | {"round": 3}},
        "global": {"last": last["global"] | {"round": 3}} if global_model else None,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    return records


@pytest.fixture
def figures(monkeypatch):
    """The figures saved, kept to be read (and still written to disk)."""
    from matplotlib.figure import Figure

    saved = []
    original = Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def test_a_run_s_plots_are_titled_and_show_loss_and_each_client_by_round(tmp_path, figures):
    records = _write_run(tmp_path / "run", "ditto")
    written = plot_run(tmp_path / "run")
    assert [p.name for p in written] == ["accuracy.png", "client_accuracy.png"]
    accuracy, clients = figures
    title = "ditto on digits · dirichlet α=0.1 · 4 clients · seed 0"
    assert run_title(json.loads((tmp_path / "run" / "config.json").read_text())) == title
    assert accuracy._suptitle.get_text() == title and clients._suptitle.get_text() == title
    loss_ax = accuracy.axes[1]
    (loss,) = loss_ax.get_lines()
    assert list(loss.get_xdata()) == [1, 2, 3]
    assert list(loss.get_ydata()) == [r["train"]["loss"] for r in records[1:]]
    trajectories = clients.axes[0]
    thin = [
        line for line in trajectories.get_lines() if len(line.get_xdata()) and line.get_lw() < 1
    ]
    assert len(thin) == 4  # one line per client
    # client 3 stays at 0: its line says so, and the 10 % edge of the band sits below the mean
    assert list(thin[3].get_ydata()) == [0.0] * 4
    mean = next(
        line for line in trajectories.get_lines() if line.get_label() == "mean over clients"
    )
    # in percent, as the tables and the console show accuracy
    assert np.allclose(
        mean.get_ydata(), [100 * r["evaluation"]["personalized"]["mean"] for r in records]
    )
    (band,) = trajectories.collections
    lows = band.get_paths()[0].vertices[:, 1]
    assert lows.min() == pytest.approx(0.0, abs=5)


def test_a_run_without_a_global_model_says_so_in_its_accuracy_plot(tmp_path, figures):
    _write_run(tmp_path / "run", "local", global_model=False)
    plot_run(tmp_path / "run")
    (legend,) = figures[0].legends  # below the panels
    labels = [t.get_text() for t in legend.get_texts()]
    assert any("no global model" in text for text in labels)


def test_compare_plot_has_one_legend_for_both_panels_and_marks_runs_without_a_global_model(
    tmp_path, figures
):
    _write_run(tmp_path / "ditto", "ditto", params={"lambda": 0.1})
    _write_run(tmp_path / "local", "local", global_model=False)
    compare_plot([tmp_path / "ditto", tmp_path / "local"], tmp_path / "compare.png")
    (fig,) = figures
    personalized, global_ = fig.axes
    assert [len(personalized.get_lines()), len(global_.get_lines())] == [2, 1]
    (legend,) = fig.legends  # one colour and style per run in both panels: named once
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == ["ditto", "local: no global model"]
    assert "digits" in fig._suptitle.get_text() and "dirichlet α=0.1" in fig._suptitle.get_text()


def test_compare_expands_sweep_folders_and_globs_and_names_runs_by_their_place(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for alpha in (0.1, 1.0):
        for seed in (0, 1):
            _write_run(
                sweep / f"alpha={alpha}" / "ditto" / f"seed-{seed}", "ditto", alpha=alpha, seed=seed
            )
    (sweep / "leaderboard.md").write_text("not a run\n")
    runs = expand_runs([str(sweep)])
    assert [r.relative_to(sweep).as_posix() for r in runs] == [
        "alpha=0.1/ditto/seed-0",
        "alpha=0.1/ditto/seed-1",
        "alpha=1.0/ditto/seed-0",
        "alpha=1.0/ditto/seed-1",
    ]
    # a glob the shell did not expand; a run named twice is compared once
    assert expand_runs([str(sweep / "alpha=1.0" / "*" / "seed-*"), str(runs[2])]) == runs[2:]
    table = compare_table(runs)
    assert "| alpha=0.1/ditto/seed-1 |" in table
    assert "alpha=0.1" in table.splitlines()[2] and "alpha=1.0" in table.splitlines()[4]
    for bad, why in (
        ([str(tmp_path / "none*")], "matches no file"),
        ([str(tmp_path / "missing")], "does not exist"),
        ([str(sweep / "leaderboard.md")], "is a file"),
    ):
        with pytest.raises(RunArgumentError, match=why):
            expand_runs(bad)
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty")]) == 1
    assert "holds no run below it" in capsys.readouterr().err
    assert main(["compare", str(sweep), "--plot", str(tmp_path / "c.png")]) == 0
    assert capsys.readouterr().out.count("| completed |") == 4


def test_compare_leaves_out_the_parameters_of_a_method_compared_once(tmp_path):
    """Catches every default of a method listed as a difference beside a run of another
    method: its parameters are compared only between runs of that method."""
    _write_run(tmp_path / "a", "ditto", params={"lambda": 0.1})
    _write_run(tmp_path / "b", "local")
    table = compare_table([tmp_path / "a", tmp_path / "b"])
    assert "ditto.lambda" not in table and "settings that differ" not in table


def test_shards_stats_print_each_client_and_draw_the_partition(tmp_path, capsys, figures):
    picture = tmp_path / "partition.png"
    code = main(
        ["shards", "--stats", "--num-clients", "5", "--alpha", "0.1", "--plot", str(picture)]
    )
    assert code == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("client ")]
    assert len(lines) == 5
    assert "partition of digits (dirichlet α=0.1): 5 clients, 10 classes" in out
    (fig,) = figures
    colour_bar = fig.axes[-1]
    assert colour_bar.get_ylabel() == "samples of the class at the client"
    assert picture.is_file()
    # the printed counts are the federation's
    from pflarena.core.federation import FederationSpec, build_federation
    from pflarena.core.partition_stats import partition_summary

    federation = build_federation(FederationSpec(num_clients=5, alpha=0.1))
    summary = partition_summary(federation)
    for client, line in zip(federation.clients, lines, strict=True):
        total = len(client.y_train) + len(client.y_val) + len(client.y_test)
        assert f"{total} samples" in line
        top = np.bincount(np.concatenate([client.y_train, client.y_test]), minlength=10)
        assert f"{int(top.argmax())}:{int(top.max())}" in line
    assert summary.matrix().sum() == sum(
        len(c.y_train) + len(c.y_val) + len(c.y_test) for c in federation.clients
    )


def test_shards_needs_out_or_stats(capsys):
    assert main(["shards"]) == 2
    assert "needs --out DIR" in capsys.readouterr().err


def test_a_config_check_can_print_the_partition_of_its_run(tmp_path, capsys):
    from pflarena.core.partition_stats import print_partition_summary
    from pflarena.server.build import parse_config

    cfg = parse_config({"num-clients": 4, "partition": "pathological", "classes-per-client": 2})
    summary = print_partition_summary(cfg.federation_spec(), plot=tmp_path / "p.png")
    out = capsys.readouterr().out
    assert "(pathological 2 classes/client): 4 clients" in out
    assert all(client.classes == 2 for client in summary.clients)
    assert (tmp_path / "p.png").is_file()


def test_a_large_federations_check_lists_its_first_clients_and_the_spread_of_all(capsys):
    """The first ``max_clients`` clients, each as the whole federation has it, then how
    many more and the spread of every client's size."""
    from pflarena.core.federation import build_federation, client_sizes
    from pflarena.core.partition_stats import print_partition_summary
    from pflarena.server.build import parse_config

    cfg = parse_config({"num-clients": 30, "partition": "iid"})
    spec = cfg.federation_spec()
    summary = print_partition_summary(spec, max_clients=10)
    out = capsys.readouterr().out
    assert [c.client_id for c in summary.clients] == list(range(10))
    whole = build_federation(spec)
    assert [c.num_train for c in summary.clients] == [len(c.y_train) for c in whole.clients[:10]]
    assert "... and 20 more clients" in out
    totals = np.sum(client_sizes(spec), axis=0)
    assert f"min {totals.min()}, median {int(np.median(totals))}, max {totals.max()}" in out
    assert "classes per client (of the 10 listed)" in out
    assert out.count("\nclient ") + out.startswith("client ") == 10
    print_partition_summary(spec, max_clients=30)
    assert "more clients" not in capsys.readouterr().out


def test_the_leaderboard_picture_is_titled_with_what_the_sweep_s_runs_share(tmp_path, figures):
    from types import SimpleNamespace

    from pflarena.reporting.leaderboard import sweep_title
    from pflarena.reporting.plots import leaderboard_plot

    runs = [
        SimpleNamespace(
            seed=seed,
            run_config={
                "dataset": "digits",
                "partition": "dirichlet",
                "alpha": alpha,
                "num-clients": 10,
            },
        )
        for seed in (0, 1)
        for alpha in (0.1, 1.0)
    ]
    title = sweep_title(runs, "s")
    assert title == "sweep s · digits · 10 clients · mean ± std over seeds [0, 1]"
    runs = [SimpleNamespace(seed=3, run_config=runs[0].run_config)]
    assert sweep_title(runs, "s") == "sweep s · digits · dirichlet α=0.1 · 10 clients · seed 3"
    row = {
        "setting": "all",
        "method": "ditto",
        "completed": 1,
        "personalized_mean_last": (0.5, 0.1),
        "global_weighted_last": (0.4, 0.0),
    }
    from pflarena.reporting.leaderboard import LEADERBOARD_METRICS

    row |= {name: (0.5, 0.1) for name, *_ in LEADERBOARD_METRICS}
    local = row | {"method": "local", LEADERBOARD_METRICS[2][0]: None}
    leaderboard_plot([row, local], tmp_path / "board.png", title)
    assert figures[0]._suptitle.get_text() == title
    # local's missing global bar is marked
    assert [t.get_text() for t in figures[0].axes[0].texts] == ["no global model"]
