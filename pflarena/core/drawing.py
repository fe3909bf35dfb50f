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

Every picture pflarena draws fits its canvas: matplotlib's constrained layout, titles wrapped
to the figure's width (:func:`fit_text`), legends outside the data (:func:`legend_below`),
whole-number ticks for rounds and clients (:func:`integer_ticks`) and accuracy in percent
(:func:`percent_ticks`) are the helpers the server's and the reporting side's pictures use too.
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
    "fit_text",
    "heatmap",
    "heatmap_panels",
    "integer_ticks",
    "legend_below",
    "legend_columns",
    "percent_ticks",
    "pyplot",
    "round_heatmap_with_lines",
    "round_heatmaps",
]

#: The separator of a title's parts (``ditto on digits · dirichlet α=0.1 · 10 clients``),
#: where :func:`fit_text` breaks a title that is wider than its figure.
TITLE_SEPARATOR = " · "


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display): every picture
    pflarena draws gets it here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fit_text(
    fig: Any, text: str, fontsize: float | str | None = None, fraction: float = 0.94
) -> str:
    """``text`` broken into lines no wider than ``fraction`` of ``fig``'s width at
    ``fontsize`` points (matplotlib's large title size by default): between the parts of a
    title (``a · b · c``) where it has them, else between words. A line already shorter is
    left whole; a single word wider than the figure stays on its own line."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties

    renderer = fig.canvas.get_renderer()
    font = FontProperties(size=fontsize if fontsize is not None else rcParams["figure.titlesize"])
    room = fraction * fig.bbox.width

    def width(line: str) -> float:
        return renderer.get_text_width_height_descent(line, font, ismath=False)[0]

    def greedy(parts: list[str], joint: str) -> list[str]:
        lines: list[str] = []
        for part in parts:
            if lines and width(lines[-1] + joint + part) <= room:
                lines[-1] += joint + part
            else:
                lines.append(part)
        return lines

    out: list[str] = []
    for line in text.split("\n"):
        if width(line) <= room:
            out.append(line)
            continue
        for part in greedy(line.split(TITLE_SEPARATOR), TITLE_SEPARATOR):
            out += [part] if width(part) <= room else greedy(part.split(" "), " ")
    return "\n".join(out)


def percent_ticks(axis: Any) -> None:
    """Tick labels in percent (``80%``) on an axis whose values are percentages (0-100)."""
    from matplotlib.ticker import PercentFormatter

    axis.set_major_formatter(PercentFormatter(xmax=100, decimals=0))


def integer_ticks(axis: Any) -> None:
    """Ticks on whole numbers only (rounds, client counts): never "2.5 clients"."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def legend_columns(fig: Any, labels: Sequence[str], fontsize: float = 9) -> int:
    """How many columns of ``labels`` (each with its handle) fit ``fig``'s width at
    ``fontsize`` points, measured as matplotlib draws them; at least one, at most one per
    label."""
    from matplotlib.font_manager import FontProperties

    renderer = fig.canvas.get_renderer()
    font = FontProperties(size=fontsize)
    em = fontsize * fig.dpi / 72
    widest = max(
        (renderer.get_text_width_height_descent(t, font, ismath=False)[0] for t in labels),
        default=em,
    )
    column = widest + 5 * em  # the handle (2 em), the gap to its text and to the next column
    return max(1, min(len(labels), int(0.95 * fig.bbox.width / column)))


def legend_below(
    fig: Any,
    handles: Sequence[Any] | None = None,
    labels: Sequence[str] | None = None,
    fontsize: float = 9,
    **options: Any,
) -> Any:
    """One legend for the whole figure, below its panels, off every panel's data (a figure
    drawn with ``layout="constrained"`` makes room for it); as many columns as fit the
    figure's width (:func:`legend_columns`). ``handles``/``labels`` default to every labelled
    artist of the figure's axes, each label once."""
    if handles is None:
        found: dict[str, Any] = {}
        for ax in fig.axes:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                found.setdefault(label, handle)
        labels, handles = list(found), list(found.values())
    labels = list(labels if labels is not None else [h.get_label() for h in handles])
    options.setdefault("ncols", legend_columns(fig, labels, fontsize))
    return fig.legend(
        handles, labels, loc="outside lower center", fontsize=fontsize, frameon=False, **options
    )


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
        size = min(12.0, max(6.0, 3.0 + 0.35 * rows))
        fig, ax = plt.subplots(figsize=(size, size * 0.85), layout="constrained")
        image = ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax)
    else:
        fig, ax = plt.subplots(
            figsize=(
                min(14.0, max(6.0, 3.0 + 0.2 * columns)),
                min(10.0, max(4.0, 2.0 + 0.3 * rows)),
            ),
            layout="constrained",
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
    from matplotlib import rcParams

    # centred over the image, the colour bar beside it: the image's share of the width
    ax.set_title(fit_text(fig, title, rcParams["axes.titlesize"], fraction=0.75))
    fig.colorbar(image, ax=ax, shrink=0.8, label=colorbar_label)
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
            max(6.0, 2.2 + 1.6 * len(matrices) * max(1.0, columns / 4)),
            min(12.0, max(4.0, 2.0 + 0.12 * rows)),
        ),
        squeeze=False,
        sharey=True,  # the client ids once, on the left
        layout="constrained",
    )
    image = None
    for ax, (name, matrix) in zip(axes[0], matrices.items(), strict=True):
        image = ax.imshow(
            matrix, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest"
        )
        ax.set_title(name)
        ax.set_xticks(range(columns))
        ax.set_yticks(range(0, rows, max(1, math.ceil(rows / 25))))
    axes[0][0].set_ylabel(ylabel)
    fig.supxlabel(xlabel)  # once under the panels: narrow panels' labels ran into each other
    fig.suptitle(fit_text(fig, title))
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
        1,
        count,
        figsize=(max(6.0, min(8.0 * count, 3.5 * count + 0.08 * len(rounds))), 6.0),
        squeeze=False,
        layout="constrained",
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
        integer_ticks(ax.xaxis)
        integer_ticks(ax.yaxis)
    fig.suptitle(fit_text(fig, title))
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
        figsize=(min(14.0, max(7.0, 4.0 + 0.05 * len(rounds))), 7.5),
        height_ratios=[3, 1],
        sharex=True,
        layout="constrained",
    )
    image = _round_image(top, rounds, matrix, cmap="viridis")
    top.set_ylabel("client id")
    integer_ticks(top.yaxis)
    fig.suptitle(fit_text(fig, title))
    fig.colorbar(image, ax=[top, bottom], shrink=0.8, label=colorbar_label)
    for label, values, color in lines:
        bottom.plot(rounds, values, color=color, label=label)
    bottom.set_ylim(0, 1.05)
    bottom.set_xlim(rounds[0] - 0.5, rounds[-1] + 0.5)
    bottom.set_xlabel("round")
    integer_ticks(bottom.xaxis)
    bottom.grid(alpha=0.3)
    legend_below(fig)  # under the strip, off its lines
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
