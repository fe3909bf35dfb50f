"""Every picture pflarena draws fits its canvas and shows accuracy as the tables do: each
title, label and legend inside the figure, legends off the panels' data, the leaderboard's
error bars only over several seeds, and every accuracy axis ticked in percent. Drawn with
long names and many runs, methods and clients, where a picture stops fitting."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.transforms import Bbox

from pflarena.core import drawing
from pflarena.reporting.leaderboard import LEADERBOARD_METRICS
from pflarena.reporting.plots import compare_plot, leaderboard_plot
from pflarena.server.results import plot_run

LONG_METHODS = [
    "local",
    "fedavg",
    "fedavg-ft",
    "fedprox",
    "ditto,lambda=0.1",
    "ditto,lambda=1.0",
    "pfedgt",
    "pfedsv,variant=D,alpha=0.5",
    "fedfomo",
    "fedmgda",
    "ifca",
    "apfl",
    "fedamp",
    "fedper",
    "fedrep",
    "fedbabu",
]


@pytest.fixture
def figures(monkeypatch):
    """The figures saved, kept to be measured (and still written to disk)."""
    from matplotlib.figure import Figure

    saved = []
    original = Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def _renderer(fig):
    """The figure drawn as it was saved (pyplot, closing a figure, leaves it a bare canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _texts(fig):
    """The figure's texts that are not tick labels (those are in its tight bounding box):
    titles, axis labels, legends' entries, notes drawn in the panels."""
    texts = [fig._suptitle, fig._supxlabel, fig._supylabel, *fig.texts]
    for legend in _legends(fig):
        texts += legend.get_texts()
    for ax in fig.axes:
        texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        texts += ax.texts
    return [t for t in texts if t is not None and t.get_visible() and t.get_text().strip()]


def _legends(fig):
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]


def assert_inside_the_canvas(fig):
    """Catches a title cut off at both ends, a label or legend past the figure's edge."""
    renderer = _renderer(fig)
    width, height = fig.get_size_inches()
    tight = fig.get_tightbbox(renderer)  # inches: every drawn artist, tick labels included
    assert tight.x0 >= -0.01 and tight.y0 >= -0.01, tight
    assert tight.x1 <= width + 0.01 and tight.y1 <= height + 0.01, (tight, width, height)
    canvas = fig.bbox
    for text in _texts(fig):
        box = text.get_window_extent(renderer)
        assert box.x0 >= canvas.x0 - 1 and box.x1 <= canvas.x1 + 1, (text.get_text(), box)
        assert box.y0 >= canvas.y0 - 1 and box.y1 <= canvas.y1 + 1, (text.get_text(), box)


def assert_legends_off_the_data(fig):
    """Catches a legend drawn over bars or lines: no legend overlaps any panel."""
    renderer = _renderer(fig)
    legends = _legends(fig)
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            overlap = Bbox.intersection(box, ax.get_window_extent(renderer))
            assert overlap is None or overlap.width * overlap.height < 1, (
                [t.get_text() for t in legend.get_texts()],
                ax.get_title(),
            )


def assert_percent(ax):
    """Catches accuracy drawn as a fraction while the tables and console show %."""
    _renderer(ax.figure)
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(label.endswith("%") for label in labels), labels


def errorbars(fig):
    return [
        container
        for ax in fig.axes
        for container in ax.containers
        if isinstance(container, ErrorbarContainer)
        or (isinstance(container, BarContainer) and container.errorbar is not None)
    ]


def _bar_lines(container):
    """The vertical lines of an error-bar container (or of a bar chart's error bars)."""
    if isinstance(container, BarContainer):
        container = container.errorbar
    return container.lines[2][0]


def _run(path: Path, strategy: str, *, rounds=20, clients=10, global_model=True, seed=0):
    """A completed run's files (config, rounds with per-client accuracy, summary)."""
    rng = np.random.default_rng(seed)
    records = []
    for number in range(rounds + 1):
        accuracy = {str(c): float(rng.uniform(0, 1)) for c in range(clients)}
        mean = float(np.mean(list(accuracy.values())))
        records.append(
            {
                "round": number,
                "evaluation": {
                    "personalized": {"mean": mean, "weighted": mean},
                    "global": {"mean": mean / 2, "weighted": mean / 2} if global_model else None,
                    "per_client": {c: {"personalized": a} for c, a in accuracy.items()},
                },
            }
            | ({"train": {"loss": 2.0 / (number + 1)}} if number else {})
        )
    path.mkdir(parents=True)
    (path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run_config = {
        "strategy": strategy,
        "dataset": "tiny-imagenet",
        "shards-dir": "/data/shards/tiny-imagenet-dirichlet-alpha-0.05-min-50-samples-per-client",
        "num-clients": clients,
        "seed": seed,
    }
    (path / "config.json").write_text(json.dumps({"run_config": run_config, "method": strategy}))
    last = records[-1]["evaluation"]
    summary = {
        "strategy": strategy,
        "dataset": "tiny-imagenet",
        "num_clients": clients,
        "num_rounds": rounds,
        "seed": seed,
        "status": "completed",
        "wall_time_s": 1.0,
        "rounds_completed": rounds,
        "personalized": {"last": last["personalized"] | {"round": rounds}},
        "global": {"last": last["global"] | {"round": rounds}} if global_model else None,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.mark.parametrize("global_model", [True, False])
def test_a_run_s_own_pictures_fit_and_show_accuracy_in_percent(tmp_path, figures, global_model):
    plot_run(_run(tmp_path / "run", "pfedsv-private-variant", global_model=global_model))
    accuracy, clients = figures
    for fig in (accuracy, clients):
        assert_inside_the_canvas(fig)
        assert_legends_off_the_data(fig)
        assert_percent(fig.axes[0])
    assert "\n" in accuracy._suptitle.get_text()  # the long title wrapped, not cut


def test_compare_s_picture_of_many_runs_fits_with_its_legend_below(tmp_path, figures):
    sweep = tmp_path / "a-sweep-with-a-long-name"
    runs = [
        _run(sweep / f"alpha={alpha}" / method / "seed-0", method.split(",")[0], rounds=5)
        for alpha in (0.1, 1.0)
        for method in LONG_METHODS[:8]
    ]
    compare_plot(runs, tmp_path / "compare.png")
    (fig,) = figures
    assert_inside_the_canvas(fig)
    assert_legends_off_the_data(fig)
    assert_percent(fig.axes[0])
    (legend,) = fig.legends
    assert len(legend.get_texts()) == len(runs)


def _rows(methods, settings=("all",), seeds=1):
    """Leaderboard rows: each method in each setting, over ``seeds`` completed seeds."""
    rows = []
    for setting in settings:
        for i, method in enumerate(methods):
            row = {"setting": setting, "method": method, "completed": seeds, "planned": seeds}
            spread = 0.03 if seeds > 1 else 0.0
            row |= {name: (0.9 - i * 0.04, spread) for name, *_ in LEADERBOARD_METRICS}
            if method in ("local", "fedper", "ifca"):  # no global model
                row[LEADERBOARD_METRICS[2][0]] = None
            rows.append(row)
    return rows


def test_a_single_seed_leaderboard_has_no_error_bars_and_its_legend_off_the_bars(tmp_path, figures):
    """Catches the main job's legend over the bars and zero-width caps on one seed."""
    title = "sweep runs/main-20261129-090000 · digits · dirichlet α=0.1 · 10 clients · seed 0"
    leaderboard_plot(_rows(LONG_METHODS), tmp_path / "board.png", title)
    (fig,) = figures
    assert errorbars(fig) == []
    assert_legends_off_the_data(fig)
    assert_inside_the_canvas(fig)
    assert_percent(fig.axes[0])
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert not any("std" in text for text in texts)


def test_a_narrow_leaderboard_wraps_its_long_title_inside_the_canvas(tmp_path, figures):
    """Catches a sweep's title cut off at both ends (one method, a long sweep name)."""
    title = (
        "sweep runs/one-method-several-seeds-and-a-long-name · digits · dirichlet α=0.1 · "
        "10 clients · mean ± std over seeds [0, 1, 2]"
    )
    leaderboard_plot(_rows(["fedavg"], seeds=3), tmp_path / "board.png", title)
    (fig,) = figures
    assert_inside_the_canvas(fig)
    assert fig._suptitle.get_text().replace("\n", " · ") == title


def test_error_bars_are_drawn_over_several_seeds_only(tmp_path, figures):
    settings = ("alpha=0.1", "alpha=1.0", "alpha=10.0", "alpha=100.0")
    rows = _rows(LONG_METHODS[:6], settings, seeds=2)
    assert rows[1]["method"] == "fedavg"
    rows[1]["completed"] = 1  # one seed of two completed: no spread to show
    leaderboard_plot(
        rows, tmp_path / "board.png", "sweep s · digits · mean ± std over seeds [0, 1]"
    )
    (fig,) = figures
    bars = errorbars(fig)
    # a bar per method and figure with a value (not local's global model), but for the
    # one-seed row's two
    drawn = sum(len(_bar_lines(container).get_segments()) for container in bars)
    with_value = sum(
        1
        for row in rows
        for name in (LEADERBOARD_METRICS[0][0], LEADERBOARD_METRICS[2][0])
        if row[name]
    )
    assert drawn == with_value - 2
    assert_inside_the_canvas(fig)
    assert_legends_off_the_data(fig)
    for ax in fig.axes[:: min(3, len(settings))]:  # each row's first panel, ticked
        assert_percent(ax)
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[-1] == "± std over seeds" and texts.count("± std over seeds") == 1


@pytest.mark.parametrize("rounds, clients", [(5, 10), (900, 100)])
def test_the_methods_pictures_fit(tmp_path, figures, rounds, clients):
    rng = np.random.default_rng(0)
    long_title = (
        "PAGE server aggregation weights p_i(t) (ddpg, reward accuracy-gain); "
        f"uniform = {1 / clients:.3g}"
    )
    matrix = rng.random((clients, rounds))
    drawing.heatmap(
        tmp_path / "qp.png",
        matrix,
        title="FedPG QP weights λ* (×: stale gradient)\nby round (blank: not in the round)",
        colorbar_label="QP weights λ* (×: stale gradient)",
        xlabel="round",
        ylabel="client id",
        column_labels=[str(r) for r in range(rounds)],
        row_labels=[str(c) for c in range(clients)],
    )
    drawing.heatmap(
        tmp_path / "relevance.png",
        rng.normal(size=(clients, clients)),
        title="pFedSV relevance φ after round 20",
        colorbar_label="relevance φ of the peer to the client",
        xlabel="peer (client id)",
        ylabel="client id",
        square=True,
    )
    drawing.heatmap_panels(
        tmp_path / "memberships.png",
        {f"round {r}": rng.dirichlet(np.ones(3), size=clients) for r in (1, 7, 14, 20)},
        title="PPFL memberships c_ik",
        colorbar_label="membership c_ik",
        xlabel="canonical model k",
        ylabel="client id",
    )
    drawing.round_heatmaps(
        tmp_path / "actions.png",
        list(range(1, rounds + 1)),
        [
            drawing.RoundPanel(matrix * 40, "local epochs α_i(t)", "local epochs α_i(t)"),
            drawing.RoundPanel(matrix / 100 + 1e-4, "learning rate η_i(t)", "η_i(t)", log=True),
        ],
        title="PAGE clients' actions (ddpg; blank: no upload)",
    )
    drawing.round_heatmap_with_lines(
        tmp_path / "weights.png",
        list(range(1, rounds + 1)),
        matrix,
        title=long_title,
        colorbar_label="p_i(t)",
        lines=[("entropy / log N", [0.9] * rounds, "tab:blue"), ("max p_i", [0.2] * rounds, "r")],
    )
    assert len(figures) == 5
    for fig in figures:
        assert_inside_the_canvas(fig)
    assert_legends_off_the_data(figures[-1])  # the strip's legend is below it
