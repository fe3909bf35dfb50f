"""A sweep's leaderboard: per setting and method, the mean and standard deviation over
seeds of each run's ``summary.json`` values, as rows, Markdown and CSV (the picture:
:func:`pflarena.reporting.plots.leaderboard_plot`). The completed runs some of whose clients
failed, and the runs that did not complete, are named under the tables.

``pflarena sweep`` (:mod:`pflarena.cli.sweep`) writes them as ``leaderboard.md``,
``leaderboard.csv`` and ``leaderboard.png`` into its output folder.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from pflarena.server.metrics import label, short_label
from pflarena.server.results import failure_text, recorded_failures

__all__ = [
    "LEADERBOARD_METRICS",
    "SORT_METRIC",
    "BoardRun",
    "leaderboard",
    "leaderboard_csv",
    "leaderboard_markdown",
    "sweep_title",
]

#: The leaderboard's columns: (name, summary.json section, point, statistic).
#: Each figure as pflarena/server/metrics.py names it: personalized accuracy, mean over
#: clients; the global model's accuracy, pooled.
LEADERBOARD_METRICS: tuple[tuple[str, str, str, str], ...] = (
    (f"{short_label('personalized', 'mean')} last", "personalized", "last", "mean"),
    (f"{short_label('personalized', 'mean')} best", "personalized", "best", "mean"),
    (f"{short_label('global', 'weighted')} last", "global", "last", "weighted"),
    # summary.json's `best` is the round with the best mean over clients, so this is the
    # pooled figure of that round, not the largest pooled figure (it can be below `last`)
    (f"{short_label('global', 'weighted')} at best", "global", "best", "weighted"),
)
#: The column the rows are sorted by.
SORT_METRIC = LEADERBOARD_METRICS[0][0]


class BoardRun(Protocol):
    """What the leaderboard reads of a sweep's run (:class:`pflarena.cli.sweep.PlannedRun`)."""

    @property
    def setting_name(self) -> str:
        """The grid values of the common keys, as a name (``all`` when none)."""
        ...

    @property
    def method(self) -> str:
        """The strategy and its swept parameters, e.g. ``ditto,lambda=0.1``."""
        ...

    @property
    def seed(self) -> int: ...

    @property
    def directory(self) -> Path:
        """The run's results directory (its ``summary.json``)."""
        ...

    @property
    def run_config(self) -> dict[str, Any]: ...


def _mean_std(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    # numpy's default (population) standard deviation, as the other benchmarks report it
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _metric(summary: Mapping[str, Any], section: str, point: str, stat: str) -> float | None:
    value = ((summary.get(section) or {}).get(point) or {}).get(stat)
    return None if value is None else float(value)


def leaderboard(runs: Sequence[BoardRun]) -> list[dict[str, Any]]:
    """One row per setting and method: mean and std over seeds of each metric.

    Rows of a setting are sorted by personalized accuracy (last round), best first. A
    row counts the runs that completed (``completed``) out of those planned (``planned``).
    """
    groups: dict[tuple[str, str], list[BoardRun]] = {}
    for run in runs:
        groups.setdefault((run.setting_name, run.method), []).append(run)
    rows = []
    for (setting, method), members in groups.items():
        summaries = []
        lost: list[tuple[str, str]] = []
        unfinished: list[tuple[str, str]] = []
        for run in members:
            name = f"{setting}/{method}/seed-{run.seed}"
            summary = _summary(run.directory)
            if summary is None:
                continue
            if summary.get("status") != "completed":
                unfinished.append((name, _why_unfinished(summary)))
                continue
            summaries.append(summary)
            if text := failure_text(summary.get("client_failures")):
                lost.append((name, _with_first_error(text, summary["client_failures"])))
        row: dict[str, Any] = {
            "setting": setting,
            "method": method,
            "planned": len(members),
            "completed": len(summaries),
            # completed runs some of whose clients failed (run, what failed), and runs
            # begun that did not complete (run, why): each named under the tables
            "lost_clients": lost,
            "unfinished": unfinished,
            "seeds": [s["seed"] for s in summaries],
            "rounds": max((s.get("rounds_completed", 0) for s in summaries), default=0),
            # the rounds' own time: the start-up (the runtime, the clients' first data
            # build, round 0) is the sweep's, shown on its own, not the first run's
            "rounds_time_s": _mean_std([_rounds_time(s) for s in summaries]),
            "epsilon": _mean_std([e for s in summaries if (e := _epsilon(s)) is not None]),
        }
        for name, section, point, stat in LEADERBOARD_METRICS:
            values = [_metric(s, section, point, stat) for s in summaries]
            row[name] = _mean_std([v for v in values if v is not None])
        rows.append(row)
    order = {name: index for index, name in enumerate(dict.fromkeys(r.setting_name for r in runs))}
    rows.sort(
        key=lambda r: (
            order[r["setting"]],
            -(r[SORT_METRIC][0] if r[SORT_METRIC] else -1.0),
        )
    )
    return rows


def _summary(run_dir: Path) -> dict[str, Any] | None:
    """A run's ``summary.json``, with its ``client_failures`` (for a summary written before
    runs recorded them, from its ``rounds.jsonl``); for a run begun and killed before it
    wrote one, ``{"status": "interrupted"}``; None for a run not begun."""
    path = run_dir / "summary.json"
    if not path.exists():
        return {"status": "interrupted"} if (run_dir / "config.json").exists() else None
    summary = json.loads(path.read_text())
    summary["client_failures"] = recorded_failures(run_dir, summary)
    return summary


def _why_unfinished(summary: Mapping[str, Any]) -> str:
    """A run that did not complete, in a few words: its status, signal or error."""
    status = str(summary.get("status", "unknown"))
    if summary.get("signal"):
        return f"{status} by {summary['signal']}"
    error = " ".join(str(summary.get("error") or "").split())
    return f"{status}: {error[:200]}" if error else status


def _with_first_error(text: str, failures: Mapping[str, Any]) -> str:
    """``text`` with the most common error the failed clients had (cut at 200 characters)."""
    errors = failures.get("errors") or []
    if not errors:
        return text
    first = " ".join(str(errors[0].get("error", "")).split())
    return f"{text} ({first[:200]})"


def _rounds_time(summary: Mapping[str, Any]) -> float:
    """A run's rounds time (``rounds_time_s``; an older summary: its whole wall time)."""
    value = summary.get("rounds_time_s")
    return float(value if isinstance(value, int | float) else summary["wall_time_s"])


def _epsilon(summary: Mapping[str, Any]) -> float | None:
    """pFedSV's private variant: the (ε, δ) guarantee's ε the run reached."""
    value = (((summary.get("method") or {}).get("dp")) or {}).get("epsilon")
    return float(value) if isinstance(value, int | float) else None


def _pct(stats: tuple[float, float] | None, count: int) -> str:
    if stats is None:
        return "—"
    mean, std = stats
    return f"{100 * mean:.2f} ± {100 * std:.2f}" if count > 1 else f"{100 * mean:.2f}"


def leaderboard_markdown(rows: list[dict[str, Any]], title: str = "Leaderboard") -> str:
    """The leaderboard as Markdown: one table per setting, accuracy in %."""
    lines = [
        f"# {title}",
        "",
        "Per setting and method: mean ± standard deviation over seeds (population std), in "
        f"percent, of each run's `summary.json`: {label('personalized', 'mean')} and "
        f"{label('global', 'weighted')}: the global model on the union of the clients' test "
        "splits, at the last round and at the best round (the round whose mean over clients "
        "is best, so `at best` can be below `last`). `rounds s`: the rounds' own time "
        "(the start-up, the clients' first data build and round 0, not included).",
    ]
    private = any(r.get("epsilon") for r in rows)
    for setting in dict.fromkeys(r["setting"] for r in rows):
        names = [name for name, *_ in LEADERBOARD_METRICS]
        head = ["method", "seeds", *names, "rounds", "rounds s"] + (["DP ε"] if private else [])
        lines += ["", f"## {setting}", "", "| " + " | ".join(head) + " |"]
        lines.append("|" + "---|" * len(head))
        for row in (r for r in rows if r["setting"] == setting):
            count = row["completed"]
            seeds = f"{count}/{row['planned']}"
            if row.get("lost_clients"):
                seeds += f", {len(row['lost_clients'])} with failed clients"
            took = f"{row['rounds_time_s'][0]:.0f}" if row["rounds_time_s"] else "—"
            cells = [row["method"], seeds, *(_pct(row[n], count) for n in names)]
            cells += [str(row["rounds"]), took]
            if private:
                cells.append(f"{row['epsilon'][0]:.3g}" if row.get("epsilon") else "—")
            lines.append("| " + " | ".join(cells) + " |")
    lost = [item for row in rows for item in row.get("lost_clients") or []]
    if lost:  # completed, counted in the figures above, but over fewer clients
        lines += ["", "## Runs with failed clients", ""]
        lines.append(
            "These runs completed and are counted above, but some of their clients failed "
            "(their `summary.json`'s `client_failures` says which, where and why):"
        )
        lines += [""] + [f"- `{name}`: {text}" for name, text in lost]
    unfinished = [item for row in rows for item in row.get("unfinished") or []]
    if unfinished:
        lines += ["", "## Runs that did not complete", ""]
        lines += [f"- `{name}`: {why}" for name, why in unfinished]
    return "\n".join(lines) + "\n"


def leaderboard_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """The leaderboard as CSV (fractions, not %), one line per setting and method."""
    fields = ["setting", "method", "completed", "planned", "rounds"]
    for name, *_ in LEADERBOARD_METRICS:
        fields += [f"{name} mean", f"{name} std"]
    fields += ["rounds s mean", "dp epsilon mean"]
    lost = any(row.get("lost_clients") for row in rows)
    if lost:  # only then: a sweep whose clients never failed keeps its columns
        fields.append("runs with failed clients")
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for row in rows:
            values = [row[k] for k in fields[:5]]
            for name, *_ in LEADERBOARD_METRICS:
                values += list(row[name]) if row[name] else ["", ""]
            for key in ("rounds_time_s", "epsilon"):
                values.append(row[key][0] if row.get(key) else "")
            if lost:
                values.append(len(row.get("lost_clients") or []))
            writer.writerow(values)
    return path


def sweep_title(runs: Sequence[BoardRun], name: str) -> str:
    """The leaderboard picture's title: the sweep, and the data set, partition, clients and
    seeds its runs share (what differs is in each panel's setting)."""
    from pflarena.core.partition_stats import partition_text

    def shared(values: list[Any]) -> Any:
        distinct = list(dict.fromkeys(json.dumps(v, sort_keys=True, default=str) for v in values))
        return values[0] if len(distinct) == 1 else None

    configs = [run.run_config for run in runs]
    parts = [f"sweep {name}"]
    if (dataset := shared([c.get("dataset") for c in configs])) is not None:
        parts.append(str(dataset))
    if (partition := shared([partition_text(c) for c in configs])) is not None:
        parts.append(partition)
    if (clients := shared([c.get("num-clients") for c in configs])) is not None:
        parts.append(f"{clients} clients")
    seeds = sorted({run.seed for run in runs})
    parts.append(f"seed {seeds[0]}" if len(seeds) == 1 else f"mean ± std over seeds {seeds}")
    return " · ".join(parts)
