"""The methods' pictures (pflarena/core/drawing.py): no strategy imports matplotlib, core
imports it only when drawing, each drawing function writes a PNG, and a matrix or labels
that do not fit raise a ValueError naming the problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pflarena.core import drawing

PACKAGE = Path(__file__).resolve().parents[1] / "pflarena"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG_SIGNATURE) and len(data) > len(PNG_SIGNATURE)


def test_no_strategy_module_mentions_matplotlib():
    """A method draws through :mod:`pflarena.core.drawing`, which imports matplotlib only
    when a picture is drawn."""
    sources = sorted(
        [*(PACKAGE / "strategies").rglob("*.py"), *(PACKAGE / "methods").rglob("*.py")]
    )
    assert len(sources) > 60
    assert [p.name for p in sources if "matplotlib" in p.read_text()] == []


def test_importing_the_drawing_module_leaves_matplotlib_unloaded():
    code = "import sys, pflarena.core.drawing; print('matplotlib' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    ).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("square", [False, True])
def test_heatmap_writes_a_png(tmp_path, square):
    matrix = np.array([[0.1, np.nan, 0.5], [0.9, 0.2, 0.0]])
    path = drawing.heatmap(
        tmp_path / "heat.png",
        matrix,
        title="a title",
        colorbar_label="value",
        xlabel="round",
        ylabel="client id",
        column_labels=["1", "2", "3"],
        row_labels=["0", "fair"],
        marks={(1, 2)},
        vmin=0.0,
        vmax=1.0,
        square=square,
    )
    assert path == tmp_path / "heat.png"
    assert _is_png(path)


def test_heatmap_without_labels_keeps_numeric_ticks(tmp_path):
    path = drawing.heatmap(
        tmp_path / "relevance.png",
        np.eye(4),
        title="t",
        colorbar_label="c",
        xlabel="peer",
        ylabel="client id",
        cmap="RdBu",
        square=True,
        dpi=120,
    )
    assert _is_png(path)


@pytest.mark.parametrize(
    ("matrix", "labels", "message"),
    [
        (np.empty((0, 3)), {}, "non-empty 2-D matrix"),
        (np.ones(3), {}, "non-empty 2-D matrix"),
        (np.ones((2, 3)), {"row_labels": ["a"]}, "1 row labels for a matrix of 2 rows"),
        (np.ones((2, 3)), {"column_labels": ["a", "b"]}, "2 column labels .* 3 columns"),
        (np.ones((2, 3)), {"marks": {(2, 0)}}, r"marks \[\(2, 0\)\] lie outside"),
    ],
)
def test_heatmap_rejects_what_does_not_fit(tmp_path, matrix, labels, message):
    with pytest.raises(ValueError, match=message):
        drawing.heatmap(
            tmp_path / "x.png",
            matrix,
            title="t",
            colorbar_label="c",
            xlabel="x",
            ylabel="y",
            **labels,
        )
    assert not (tmp_path / "x.png").exists()


def test_heatmap_panels_writes_a_png(tmp_path):
    rng = np.random.default_rng(0)
    panels = {f"round {r}": rng.dirichlet(np.ones(3), size=5) for r in (1, 4, 9)}
    path = drawing.heatmap_panels(
        tmp_path / "panels.png",
        panels,
        title="memberships",
        colorbar_label="c_ik",
        xlabel="k",
        ylabel="client id",
        vmin=0.0,
        vmax=1.0,
    )
    assert _is_png(path)


def test_heatmap_panels_rejects_no_panel_and_mixed_shapes(tmp_path):
    kwargs = {"title": "t", "colorbar_label": "c", "xlabel": "x", "ylabel": "y"}
    with pytest.raises(ValueError, match="at least one panel"):
        drawing.heatmap_panels(tmp_path / "x.png", {}, **kwargs)
    with pytest.raises(ValueError, match="differ in shape"):
        drawing.heatmap_panels(
            tmp_path / "x.png", {"a": np.ones((2, 3)), "b": np.ones((3, 3))}, **kwargs
        )
    with pytest.raises(ValueError, match="panel 'a' must be a non-empty 2-D matrix"):
        drawing.heatmap_panels(tmp_path / "x.png", {"a": np.ones((0, 3))}, **kwargs)


def _actions(rounds: int, clients: int) -> list[drawing.RoundPanel]:
    epochs = np.full((clients, rounds), 2.0)
    epochs[0, 1] = np.nan
    return [
        drawing.RoundPanel(epochs, "epochs", "epochs", cmap="magma", vmin=1, vmax=5),
        drawing.RoundPanel(
            np.full((clients, rounds), 0.01),
            "lr",
            "lr (log)",
            cmap="cividis",
            vmin=1e-3,
            vmax=0.1,
            log=True,
        ),
    ]


def test_round_heatmaps_writes_a_png(tmp_path):
    path = drawing.round_heatmaps(tmp_path / "actions.png", [1, 2, 3], _actions(3, 4), title="t")
    assert _is_png(path)


def test_round_heatmaps_rejects_a_round_count_other_than_the_columns(tmp_path):
    with pytest.raises(ValueError, match="2 rounds for panel 'epochs' of 3 columns"):
        drawing.round_heatmaps(tmp_path / "x.png", [1, 2], _actions(3, 4), title="t")
    with pytest.raises(ValueError, match="at least one panel"):
        drawing.round_heatmaps(tmp_path / "x.png", [1, 2], [], title="t")


def test_round_heatmap_with_lines_writes_a_png(tmp_path):
    weights = np.random.default_rng(1).dirichlet(np.ones(4), size=5)
    path = drawing.round_heatmap_with_lines(
        tmp_path / "weights.png",
        [1, 2, 3, 4, 5],
        weights.T,
        title="weights",
        colorbar_label="p_i(t)",
        lines=[("max p_i", weights.max(axis=1), "tab:red")],
    )
    assert _is_png(path)


def test_round_heatmap_with_lines_rejects_a_line_of_the_wrong_length(tmp_path):
    with pytest.raises(ValueError, match="line 'max' has 2 values for 3 rounds"):
        drawing.round_heatmap_with_lines(
            tmp_path / "x.png",
            [1, 2, 3],
            np.ones((4, 3)),
            title="t",
            colorbar_label="c",
            lines=[("max", [0.5, 0.6], "tab:red")],
        )
    with pytest.raises(ValueError, match="4 rounds for the matrix of 3 columns"):
        drawing.round_heatmap_with_lines(
            tmp_path / "x.png",
            [1, 2, 3, 4],
            np.ones((4, 3)),
            title="t",
            colorbar_label="c",
            lines=[],
        )
