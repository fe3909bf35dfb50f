"""The reporting side's pictures: ``pflarena compare``'s plot of several runs
(:func:`compare_plot`) and a sweep's leaderboard picture (:func:`leaderboard_plot`).

A run's own pictures (``accuracy.png``, ``client_accuracy.png``) are written by the
ServerApp at the end of the run: :func:`pflarena.server.results.plot_run`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from pflarena.core.drawing import pyplot
from pflarena.reporting.compare import (
    common_parent,
    entry,
    load_run,
    rounds_done,
    run_label,
)
from pflarena.reporting.leaderboard import LEADERBOARD_METRICS
from pflarena.server.metrics import label

__all__ = ["compare_plot", "leaderboard_plot"]


def _common_setting(summaries: list[dict[str, Any]], run_dirs: list[Path]) -> str:
    """What every compared run shares, for the plot's title (data, partition, clients)."""
    from pflarena.core.partition_stats import partition_text

    parts = []
    datasets = {s["dataset"] for s in summaries}
    if len(datasets) == 1:
        parts.append(f"on {datasets.pop()}")
    partitions = set()
    for run_dir in run_dirs:
        try:
            config = json.loads((run_dir / "config.json").read_text())
            partitions.add(partition_text(config.get("run_config") or {}))
        except (OSError, ValueError, AttributeError):
            partitions.add("?")
    if len(partitions) == 1 and "?" not in partitions:
        parts.append(partitions.pop())
    clients = {s["num_clients"] for s in summaries}
    if len(clients) == 1:
        parts.append(f"{clients.pop()} clients")
    seeds = {s["seed"] for s in summaries}
    parts.append(f"seed {seeds.pop()}" if len(seeds) == 1 else f"seeds {sorted(seeds)}")
    return " · ".join(parts)


def compare_plot(run_dirs: list[Path], out: Path) -> Path:
    """Each run's headline accuracies by round, personalized and global side by side, a
    legend in each panel; a run whose method has no global model is named in the global
    panel's legend as such, not left out."""
    plt = pyplot()
    from pflarena.server.results import integer_ticks, read_rounds

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    common = common_parent(run_dirs)
    summaries = []
    for index, run_dir in enumerate(run_dirs):
        s = load_run(run_dir)
        summaries.append(s)
        try:
            rounds = [
                (int(r["round"]), r["evaluation"])
                for r in read_rounds(run_dir / "rounds.jsonl")
                if isinstance(r, dict) and isinstance(r.get("evaluation"), dict)
            ]
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(
                f"pflarena compare: {run_dir}/rounds.jsonl left out of the plot: {error!r}",
                file=sys.stderr,
            )
            continue
        where = run_label(run_dir, common)
        same = where == s["strategy"] or len(run_dirs) == 1
        name = s["strategy"] if same else f"{s['strategy']} ({where})"
        if s.get("status") != "completed":
            name += f" [{s.get('status')} at round {rounds_done(s)}/{s['num_rounds']}]"
        # One colour and line style per run, the same in both panels: past ten runs the
        # colours repeat with another line style.
        color, style = f"C{index % 10}", ("-", "--", ":", "-.")[index // 10 % 4]
        for ax, scope, key in ((axes[0], "personalized", "mean"), (axes[1], "global", "weighted")):
            ys = [entry(evaluation, scope).get(key) for _, evaluation in rounds]
            ys = [y if isinstance(y, int | float) else None for y in ys]
            if any(y is not None for y in ys):
                ax.plot(
                    [number for number, _ in rounds],
                    [float("nan") if y is None else y for y in ys],
                    marker="o",
                    ms=2,
                    label=name,
                    color=color,
                    linestyle=style,
                )
            else:  # in the legend, greyed, so that its absence is seen
                ax.plot(
                    [],
                    [],
                    color=color,
                    linestyle=style,
                    alpha=0.4,
                    label=f"{name}: no {scope} model",
                )
    axes[0].set_title(label("personalized", "mean"))
    axes[1].set_title(label("global", "weighted"))
    for ax in axes:
        ax.set_xlabel("round")
        integer_ticks(ax.xaxis)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[0].set_ylabel("test accuracy")
    fig.suptitle("compared runs " + _common_setting(summaries, run_dirs))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def leaderboard_plot(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Bars of personalized and global accuracy (last round, ± std) per method and setting."""
    plt = pyplot()

    settings = list(dict.fromkeys(r["setting"] for r in rows))
    columns = min(3, len(settings))
    lines = math.ceil(len(settings) / columns)
    methods = max(len([r for r in rows if r["setting"] == s]) for s in settings)
    fig, axes = plt.subplots(
        lines, columns, figsize=(max(5, 0.9 * methods + 2) * columns, 3.8 * lines), squeeze=False
    )
    for ax, setting in zip(axes.flat, settings, strict=False):
        members = [r for r in rows if r["setting"] == setting]
        xs = range(len(members))
        columns_ = ((-0.2, LEADERBOARD_METRICS[0][0], "C0"), (0.2, LEADERBOARD_METRICS[2][0], "C1"))
        for offset, name, color in columns_:
            stats = [r[name] for r in members]
            ax.bar(
                [x + offset for x in xs],
                [s[0] if s else math.nan for s in stats],
                width=0.4,
                yerr=[s[1] if s else math.nan for s in stats],
                capsize=3,
                color=color,
                label=label("personalized", "mean")
                if name == LEADERBOARD_METRICS[0][0]
                else label("global", "weighted"),
            )
            for x, stat in zip(xs, stats, strict=True):
                if not stat:  # no figure (a method without a global model): said, not blank
                    ax.text(
                        x + offset,
                        0.02,
                        "no global model",
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=7,
                    )
        ax.set_xticks(list(xs), [r["method"] for r in members], rotation=30, ha="right")
        ax.set_xlim(-0.6, len(members) - 0.4)  # a missing last bar keeps its place
        ax.set_ylim(0, 1)
        ax.set_title(setting, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(settings) :]:
        ax.axis("off")
    axes.flat[0].set_ylabel("test accuracy (last round)")
    axes.flat[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
