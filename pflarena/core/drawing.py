"""The methods' own pictures: plain data in (numpy matrices, rounds, labels, titles), one PNG
out, its path returned.

The strategies gather their data and call these functions; the module lives in ``core``
because the strategies may import only ``core`` (``pflarena.reporting`` reads finished runs
and nothing below it may import it). matplotlib is imported on the first drawing, through
:func:`pyplot`, so that importing ``core`` stays cheap.

- :func:`heatmap`: one matrix with row and column labels (FedPG's γ_i and QP weights by
  round, pFedSV's relevance of each peer to each client);
- :func:`heatmap_panels`: matrices of one shape side by side on one colour scale (PPFL's
  memberships at a few rounds);
- :func:`round_heatmaps`: clients × rounds matrices side by side, each on its own colour
  scale (PAGE's clients' actions);
- :func:`round_heatmap_with_lines`: a clients × rounds matrix above lines by round (PAGE's
  aggregation weights and their entropy).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "RoundPanel",
    "pyplot",
    "heatmap",
    "heatmap_panels",
    "round_heatmap_with_lines",
    "round_heatmaps",
]


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display): every picture
    pflarena draws gets it here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _matrix(values: Any, what: str) -> np.ndarray:
    """``values`` as an array, which must be 2-D and hold at least one cell."""
    matrix = np.asarray(values)
    if matrix.ndim != 2 or matrix.size == 0:
        raise ValueError(f"{what} must be a non-empty 2-D matrix, got shape {matrix.shape}")
    return matrix


def _check_count(labels: Sequence[Any] | None, count: int, what: str, of: str) -> None:
    if labels is not None and len(labels) != count:
        raise ValueError(f"{len(labels)} {what} for a matrix of {count} {of}")


def heatmap(
    path: str | Path,
    matrix: np.ndarray,
    *,
    title: str,
    colorbar_label: str,
    xlabel: str,
    ylabel: str,
    column_labels: Sequence[str] | None = None,
    row_labels: Sequence[str] | None = None,
    marks: Collection[tuple[int, int]] = (),
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    square: bool = False,
    dpi: int = 110,
) -> Path:
    """One matrix as coloured cells with a colour bar; NaN cells are left blank.

    Parameters
    ----------
    matrix
        Rows drawn top to bottom, columns left to right.
    column_labels, row_labels
        One label per column (row); about 20 (25) of them are shown, evenly spaced.
        ``None`` leaves matplotlib's own numeric ticks.
    marks
        ``(row, column)`` cells marked with a white ×.
    square
        Square cells in a figure sized by the row count (a clients × clients matrix);
        otherwise cells stretch to a figure sized by both counts, at most 14 × 10 inches.

    Raises
    ------
    ValueError
        An empty or non-2-D matrix, a label count other than the row (column) count, or a
        mark outside the matrix.
    """
    matrix = _matrix(matrix, "the heatmap's matrix")
    rows, columns = matrix.shape
    _check_count(column_labels, columns, "column labels", "columns")
    _check_count(row_labels, rows, "row labels", "rows")
    outside = [m for m in marks if not (0 <= m[0] < rows and 0 <= m[1] < columns)]
    if outside:
        raise ValueError(f"marks {sorted(outside)} lie outside the {rows} x {columns} matrix")
    plt = pyplot()
    if square:
        size = min(12.0, 3.0 + 0.35 * rows)
        fig, ax = plt.subplots(figsize=(size, size * 0.85))
        image = ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax)
    else:
        fig, ax = plt.subplots(
            figsize=(min(14.0, 3.0 + 0.2 * columns), min(10.0, 2.0 + 0.3 * rows))
        )
        image = ax.imshow(
            matrix, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest"
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if column_labels is not None:
        step = max(1, columns // 20)
        ax.set_xticks(range(0, columns, step), list(column_labels)[::step])
    if row_labels is not None:
        step = max(1, rows // 25)
        ax.set_yticks(range(0, rows, step), list(row_labels)[::step])
    for row, column in sorted(marks, key=lambda m: (m[1], m[0])):
        ax.text(column, row, "×", ha="center", va="center", color="white", fontsize=8)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, shrink=0.8, label=colorbar_label)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def heatmap_panels(
    path: str | Path,
    panels: Mapping[str, np.ndarray],
    *,
    title: str,
    colorbar_label: str,
    xlabel: str,
    ylabel: str,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
) -> Path:
    """Matrices of one shape side by side, each titled by its key, on one colour scale: one
    tick per column, rows ticked about 25 times.

    Raises
    ------
    ValueError
        No panel, an empty or non-2-D matrix, or matrices of different shapes.
    """
    if not panels:
        raise ValueError("heatmap_panels needs at least one panel")
    matrices = {name: _matrix(m, f"panel {name!r}") for name, m in panels.items()}
    shapes = {m.shape for m in matrices.values()}
    if len(shapes) > 1:
        raise ValueError(f"the panels' matrices differ in shape: {sorted(shapes)}")
    (rows, columns) = shapes.pop()
    plt = pyplot()
    fig, axes = plt.subplots(
        1,
        len(matrices),
        figsize=(
            1.2 + 1.6 * len(matrices) * max(1.0, columns / 4),
            min(12.0, 2.0 + 0.12 * rows),
        ),
        squeeze=False,
    )
    image = None
    for ax, (name, matrix) in zip(axes[0], matrices.items(), strict=True):
        image = ax.imshow(
            matrix, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest"
        )
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.set_xticks(range(columns))
        ax.set_yticks(range(0, rows, max(1, math.ceil(rows / 25))))
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label=colorbar_label)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


class RoundPanel(NamedTuple):
    """One panel of :func:`round_heatmaps`: a clients × rounds matrix and its colour scale
    (logarithmic when ``log``)."""

    matrix: np.ndarray
    title: str
    colorbar_label: str
    cmap: str = "viridis"
    vmin: float | None = None
    vmax: float | None = None
    log: bool = False


def _round_image(ax: Any, rounds: Sequence[int], matrix: np.ndarray, **style: Any) -> Any:
    """``matrix`` (clients × rounds) drawn with its columns at their rounds on the x axis."""
    extent = (rounds[0] - 0.5, rounds[-1] + 0.5, matrix.shape[0] - 0.5, -0.5)
    return ax.imshow(matrix, aspect="auto", interpolation="nearest", extent=extent, **style)


def _round_matrix(values: Any, rounds: Sequence[int], what: str) -> np.ndarray:
    matrix = _matrix(values, what)
    if len(rounds) != matrix.shape[1]:
        raise ValueError(
            f"{len(rounds)} rounds for {what} of {matrix.shape[1]} columns (one per round)"
        )
    return matrix


def round_heatmaps(
    path: str | Path, rounds: Sequence[int], panels: Sequence[RoundPanel], *, title: str
) -> Path:
    """Clients × rounds matrices side by side, each with its own colour bar; x is the round,
    y the client id, NaN cells blank.

    Raises
    ------
    ValueError
        No panel, an empty or non-2-D matrix, or one whose column count is not the number
        of rounds.
    """
    if not panels:
        raise ValueError("round_heatmaps needs at least one panel")
    matrices = [_round_matrix(p.matrix, rounds, f"panel {p.title!r}") for p in panels]
    plt = pyplot()
    from matplotlib.colors import LogNorm

    count = len(panels)
    fig, axes = plt.subplots(
        1, count, figsize=(min(8.0 * count, 3.5 * count + 0.08 * len(rounds)), 6.0), squeeze=False
    )
    for ax, panel, matrix in zip(axes[0], panels, matrices, strict=True):
        scale = (
            {"norm": LogNorm(vmin=panel.vmin, vmax=panel.vmax)}
            if panel.log
            else {"vmin": panel.vmin, "vmax": panel.vmax}
        )
        image = _round_image(ax, rounds, matrix, cmap=panel.cmap, **scale)
        ax.set_title(panel.title)
        fig.colorbar(image, ax=ax, shrink=0.8, label=panel.colorbar_label)
    for ax in axes[0]:
        ax.set_xlabel("round")
        ax.set_ylabel("client id")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def round_heatmap_with_lines(
    path: str | Path,
    rounds: Sequence[int],
    matrix: np.ndarray,
    *,
    title: str,
    colorbar_label: str,
    lines: Sequence[tuple[str, Sequence[float], str]],
) -> Path:
    """A clients × rounds matrix (viridis, x the round, y the client id) above a strip of
    ``lines`` by round, each ``(label, one value per round, colour)`` on a 0-1 scale.

    Raises
    ------
    ValueError
        An empty or non-2-D matrix, or a matrix or line whose length is not the number of
        rounds.
    """
    matrix = _round_matrix(matrix, rounds, "the matrix")
    for label, values, _ in lines:
        if len(values) != len(rounds):
            raise ValueError(f"line {label!r} has {len(values)} values for {len(rounds)} rounds")
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(min(14.0, 4.0 + 0.05 * len(rounds)), 7.5),
        height_ratios=[3, 1],
        layout="constrained",
    )
    image = _round_image(top, rounds, matrix, cmap="viridis")
    top.set_ylabel("client id")
    top.set_title(title)
    fig.colorbar(image, ax=[top, bottom], shrink=0.8, label=colorbar_label)
    for label, values, color in lines:
        bottom.plot(rounds, values, color=color, label=label)
    bottom.set_ylim(0, 1.05)
    bottom.set_xlim(rounds[0] - 0.5, rounds[-1] + 0.5)
    bottom.set_xlabel("round")
    bottom.legend(loc="lower left", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
