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

from pflarena.core.drawing import (
    fit_text,
    integer_ticks,
    legend_below,
    legend_columns,
    percent_ticks,
    pyplot,
)
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

#: The leaderboard legend's entry for the error bars (drawn only over several seeds).
SPREAD = "± std over seeds"


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
    """Each run's headline accuracies (in %) by round, personalized and global side by
    side, one colour and line style per run in both panels and one legend below them; a
    run whose method has no global model is named so in the legend, not left out."""
    plt = pyplot()
    from pflarena.server.results import read_rounds

    common = common_parent(run_dirs)
    summaries = []
    curves: list[tuple[str, str, str, list[int], dict[str, list[float | None]]]] = []
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
        values = {}
        for scope, key in (("personalized", "mean"), ("global", "weighted")):
            ys = [entry(evaluation, scope).get(key) for _, evaluation in rounds]
            values[scope] = [100 * y if isinstance(y, int | float) else None for y in ys]
        curves.append((name, color, style, [number for number, _ in rounds], values))

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True, layout="constrained")
    handles = []
    for name, color, style, xs, values in curves:
        handle = None
        for ax, scope in zip(axes, ("personalized", "global"), strict=True):
            ys = values[scope]
            if any(y is not None for y in ys):
                (line,) = ax.plot(
                    xs,
                    [math.nan if y is None else y for y in ys],
                    marker="o",
                    ms=2,
                    label=name,
                    color=color,
                    linestyle=style,
                )
                handle = handle or line
        if not xs:
            note = ": no evaluated round"
        else:
            note = "".join(
                f": no {scope} model"
                for scope in ("personalized", "global")
                if all(y is None for y in values[scope])
            )
        if handle is None:  # nothing to draw: in the legend, greyed, so that it is seen
            (handle,) = axes[0].plot([], [], color=color, linestyle=style, alpha=0.4)
        label_ = name + note
        handles.append((handle, label_))
    axes[0].set_title(label("personalized", "mean"))
    axes[1].set_title(label("global", "weighted"))
    for ax in axes:
        ax.set_xlabel("round")
        integer_ticks(ax.xaxis)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-2, 102)
    percent_ticks(axes[0].yaxis)
    axes[0].set_ylabel("test accuracy")
    texts = [t for _, t in handles]
    columns = legend_columns(fig, texts, fontsize=8)
    fig.set_figheight(5 + 0.2 * math.ceil(len(texts) / columns))  # room for the legend's rows
    legend_below(fig, [h for h, _ in handles], texts, fontsize=8, ncols=columns)
    fig.suptitle(fit_text(fig, "compared runs " + _common_setting(summaries, run_dirs)))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def leaderboard_plot(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Bars of personalized and global accuracy (last round, in %) per method and setting:
    the mean over the completed seeds, and their standard deviation as an error bar where
    there are several; one legend below the panels, the title wrapped to the width."""
    plt = pyplot()

    settings = list(dict.fromkeys(r["setting"] for r in rows))
    columns = min(3, len(settings))
    lines = math.ceil(len(settings) / columns)
    methods = max(len([r for r in rows if r["setting"] == s]) for s in settings)
    longest = max((len(str(r["method"])) for r in rows), default=1)
    fig, axes = plt.subplots(
        lines,
        columns,
        # a method's pair of bars about 0.7 inch wide; its slanted name below takes height
        figsize=(
            max(6.0 / columns, 0.7 * methods + 1.2) * columns,
            (3.2 + 0.06 * longest) * lines + 0.8,
        ),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    bars = (
        (-0.2, LEADERBOARD_METRICS[0][0], "C0", label("personalized", "mean")),
        (0.2, LEADERBOARD_METRICS[2][0], "C1", label("global", "weighted")),
    )
    spread = False
    for ax, setting in zip(axes.flat, settings, strict=False):
        members = [r for r in rows if r["setting"] == setting]
        xs = range(len(members))
        for offset, name, color, text in bars:
            stats = [r[name] for r in members]
            ax.bar(
                [x + offset for x in xs],
                [100 * s[0] if s else math.nan for s in stats],
                width=0.4,
                color=color,
                label=text,
            )
            # the spread over seeds only where there are several: one seed has none
            several = [
                (x + offset, stat)
                for x, stat, row in zip(xs, stats, members, strict=True)
                if stat and int(row.get("completed", 1)) > 1
            ]
            if several:
                ax.errorbar(
                    [x for x, _ in several],
                    [100 * stat[0] for _, stat in several],
                    yerr=[100 * stat[1] for _, stat in several],
                    fmt="none",
                    ecolor="black",
                    elinewidth=1,
                    capsize=3,
                    label="_" if spread else SPREAD,  # in the legend once
                )
                spread = True
            for x, stat in zip(xs, stats, strict=True):
                if not stat:  # no figure (a method without a global model): said, not blank
                    ax.text(
                        x + offset,
                        2,
                        "no global model",
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=8,
                    )
        ax.set_xticks(list(xs), [r["method"] for r in members], rotation=30, ha="right")
        ax.set_xlim(-0.6, len(members) - 0.4)  # a missing last bar keeps its place
        ax.set_ylim(0, 100)
        percent_ticks(ax.yaxis)
        if len(settings) > 1 or setting != "all":  # a sweep without a grid has one setting
            ax.set_title(setting, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(settings) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy, last round")
    found: dict[str, Any] = {}
    for ax in axes.flat:  # each label once, the spread's last
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            found.setdefault(text, handle)
    texts = sorted(found, key=lambda text: text == SPREAD)
    legend_below(fig, [found[t] for t in texts], texts)
    if title:
        fig.suptitle(fit_text(fig, title))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
