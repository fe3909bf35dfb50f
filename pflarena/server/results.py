"""Run results: ``config.json``, ``rounds.jsonl`` (flushed every round), ``summary.json``, plots.

The files are the interface other tools read (``pflarena compare``, the benchmarks), so
their keys are documented here and in docs/guide.md ("What a run writes").
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from logging import WARNING
from pathlib import Path
from typing import Any

from pflarena.core.drawing import pyplot
from pflarena.server.metrics import HEADLINE, label

__all__ = [
    "comparable_rounds",
    "ResultsWriter",
    "OutputDirError",
    "read_rounds",
    "summarize_rounds",
    "plot_run",
    "run_title",
    "RESULT_FILES",
    "archive_run",
]

RESULT_FILES = ("config.json", "rounds.jsonl", "summary.json")
STAT_KEYS = ("mean", "weighted", "std", "worst10")


class OutputDirError(ValueError):
    """The output directory already holds results (they are never overwritten)."""


def check_output_dir(path: Path) -> None:
    """Refuse a directory that already holds a run's results, and a path that cannot be
    one: a file, or a path under a file."""
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                what = "is a file" if part == path else f"lies under the file {part}"
                raise OutputDirError(f"output directory {path} {what}; choose a directory")
            break
    existing = [name for name in RESULT_FILES if (path / name).exists()]
    if existing:
        raise OutputDirError(
            f"output directory {path} already holds results ({', '.join(existing)}); "
            "choose a new --output-dir (results are never overwritten)"
        )


def _finite(value: Any) -> Any:
    """JSON has no NaN: store non-finite floats as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_finite(data), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


class RoundsFileError(ValueError):
    """A ``rounds.jsonl`` that cannot be continued (a damaged line before its last)."""


def rounds_lines(path: Path) -> tuple[list[str], str | None]:
    """The raw lines (newline included) of a ``rounds.jsonl`` to continue, and what was
    repaired: a last line cut short by a crash while it was written (not JSON, or no
    newline) is dropped, and said so; a damaged line before the last is refused."""
    if not path.exists():
        return [], None
    raw = path.read_bytes().decode("utf-8", errors="replace")
    lines = raw.splitlines(keepends=True)
    repaired = None
    if lines and (not lines[-1].endswith("\n") or not _is_json(lines[-1])):
        torn = lines.pop()
        repaired = (
            f"the last line of {path} was cut short ({len(torn.encode())} bytes, a crash while "
            "it was written) and is dropped: that round runs again"
        )
    for number, line in enumerate(lines, start=1):
        if not _is_json(line):
            raise RoundsFileError(
                f"{path} line {number} is not a round record ({line[:60]!r}...): the file "
                "was damaged or edited. Restore it from a copy, or start the run again in a "
                "new output directory"
            )
    return [line for line in lines if line.strip()], repaired


def _is_json(line: str) -> bool:
    if not line.strip():
        return True
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and isinstance(record.get("round"), int)


class ResultsWriter:
    """Writes one run's result files into ``output_dir``.

    A new run's directory is created and must not hold results. ``resume_after=r`` continues
    a run: its ``rounds.jsonl`` keeps the lines up to round ``r`` byte for byte (later ones,
    written after the last checkpoint, are dropped and will be written again; a last line
    cut short by a crash is dropped and said so in ``repaired``) and new lines are appended.
    With ``checkpoint`` the kept lines must be the ones that checkpoint was written after
    (:func:`~pflarena.server.checkpoint.check_rounds`), or nothing is changed and it raises.
    The writer keeps the SHA-256 of the file (:meth:`rounds_sha256`) for the checkpoints.
    """

    def __init__(
        self, output_dir: str | Path, resume_after: int | None = None, checkpoint: Any = None
    ) -> None:
        self.dir = Path(output_dir).resolve()
        self.repaired: str | None = None
        self._hash = hashlib.sha256()
        rounds_path = self.dir / "rounds.jsonl"
        if resume_after is None:
            check_output_dir(self.dir)
            self.dir.mkdir(parents=True, exist_ok=True)
        else:
            if not (self.dir / "config.json").exists():
                raise OutputDirError(f"{self.dir} holds no run to resume (no config.json)")
            lines, self.repaired = rounds_lines(rounds_path)
            kept = [line for line in lines if json.loads(line)["round"] <= resume_after]
            if checkpoint is not None:
                from pflarena.server.checkpoint import check_rounds

                check_rounds(checkpoint, kept, rounds_path)
            if self.repaired:
                from flwr.common.logger import log

                log(WARNING, "pflarena: %s", self.repaired)
            tmp = rounds_path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(kept))
            os.replace(tmp, rounds_path)
            self._hash.update("".join(kept).encode())
            (self.dir / "summary.json").unlink(missing_ok=True)
        self._rounds = open(rounds_path, "a", encoding="utf-8")  # noqa: SIM115

    def rounds_sha256(self) -> str:
        """The SHA-256 of ``rounds.jsonl`` as written so far."""
        return self._hash.hexdigest()

    def write_config(self, config: dict[str, Any]) -> None:
        _write_json_atomic(self.dir / "config.json", config)

    def append_round(self, record: dict[str, Any]) -> None:
        """Append one round's line and push it to disk, so a crash loses nothing."""
        line = json.dumps(_finite(record)) + "\n"
        self._hash.update(line.encode())
        self._rounds.write(line)
        self._rounds.flush()
        os.fsync(self._rounds.fileno())

    def write_summary(self, summary: dict[str, Any]) -> None:
        _write_json_atomic(self.dir / "summary.json", summary)

    def close(self) -> None:
        if not self._rounds.closed:
            self._rounds.close()


def read_rounds(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``rounds.jsonl`` file (a torn last line from a crash is skipped)."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


#: Fields of a round record that two identical runs may differ in: wall-clock and CPU times.
TIMING_KEYS = frozenset({"elapsed_s", "round_time_s", "train_time_s", "data_s"})
TRAIN_TIMING_KEYS = frozenset({"client_time_s", "client_cpu_s"})


def comparable_rounds(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The round records without their timings (:data:`TIMING_KEYS`, and the clients'
    solver times in ``train``): what two runs of the same seed must agree on."""
    out = []
    for record in rounds:
        record = {k: v for k, v in record.items() if k not in TIMING_KEYS}
        if "train" in record:
            record["train"] = {
                k: v for k, v in record["train"].items() if k not in TRAIN_TIMING_KEYS
            }
        out.append(record)
    return out


def completed_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """A run directory's ``summary.json`` when the run completed, else None (no summary, or
    a failed or interrupted run)."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("status") == "completed" else None


def archive_run(run_dir: str | Path, archive_dir: str | Path, extra: tuple[str, ...] = ()) -> Path:
    """Copy a completed run's result files (:data:`RESULT_FILES`, and those of ``extra`` the
    run has, such as a method's own pictures; no checkpoint, no client state) to
    ``archive_dir/<run name>`` and return that directory. Benchmarks keep the runs behind a
    published table this way, beside the table, so that it can be rewritten
    (``--report-only``) and plotted on a machine that no longer holds the runs."""
    run_dir = Path(run_dir)
    if completed_summary(run_dir) is None:
        raise ValueError(f"{run_dir} holds no completed run to archive")
    dest = Path(archive_dir) / run_dir.name
    dest.mkdir(parents=True, exist_ok=True)
    for name in (*RESULT_FILES, *(n for n in extra if (run_dir / n).exists())):
        (dest / name).write_bytes((run_dir / name).read_bytes())
    return dest


def _stats_block(evals: list[tuple[int, dict]]) -> dict[str, Any] | None:
    """``last`` and ``best`` (by unweighted mean) of one accuracy series."""
    evals = [(r, s) for r, s in evals if s is not None and s.get("mean") is not None]
    if not evals:
        return None
    last_round, last = evals[-1]
    best_round, best = max(evals, key=lambda item: item[1]["mean"])
    return {
        "last": {k: last.get(k) for k in STAT_KEYS} | {"round": last_round},
        "best": {k: best.get(k) for k in STAT_KEYS} | {"round": best_round},
    }


def summarize_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The accuracy and traffic part of ``summary.json``, from the round records."""
    evaluated = [r for r in rounds if r.get("evaluation")]
    personalized = _stats_block(
        [(r["round"], r["evaluation"].get("personalized")) for r in evaluated]
    )
    global_ = _stats_block([(r["round"], r["evaluation"].get("global")) for r in evaluated])
    summary = {
        "personalized": personalized,
        "global": global_,
        "bytes_up": sum(r.get("bytes_up", 0) for r in rounds),
        "bytes_down": sum(r.get("bytes_down", 0) for r in rounds),
        "eval_bytes_down": sum(r.get("eval_bytes_down", 0) for r in rounds),
        "rounds_completed": max((r["round"] for r in rounds), default=0),
    }
    if lost := state_problems(rounds):
        summary["state_problems"] = lost
    crossed = [r for r in evaluated if r["evaluation"].get("cross")]
    if crossed:  # the latest cross-evaluation's means and spreads (server/crosseval.py)
        last = crossed[-1]["evaluation"]["cross"]
        summary["cross"] = {
            "round": crossed[-1]["round"],
            **{k: last[k] for k in ("local", "synthetic", "global", "owners", "fraction")},
        }
        for direction in ("down", "up"):
            key = f"cross_eval_bytes_{direction}"
            summary[key] = sum(r.get(key, 0) for r in rounds)
    return summary


def state_problems(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per client whose state was missing or unreadable (its replies not used): the problem,
    the first round it was seen in and the number of rounds, from the round records."""
    found: dict[Any, dict[str, Any]] = {}
    for record in rounds:
        entries = ((record.get("train") or {}).get("state_problems") or []) + (
            (record.get("evaluation") or {}).get("state_problems") or []
        )
        for client in {str(e.get("client")): e for e in entries}.values():
            entry = found.setdefault(
                client.get("client"),
                {
                    "client": client.get("client"),
                    "problem": client.get("problem"),
                    "first_round": record["round"],
                    "rounds": 0,
                },
            )
            entry["rounds"] += 1
    return sorted(found.values(), key=lambda e: (e["client"] is None, e["client"] or 0))


def _run_config(out: Path) -> dict[str, Any]:
    try:
        config = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def run_title(config: dict[str, Any]) -> str:
    """One line naming a run for a plot's title: method, data, partition, clients, seed
    (from its ``config.json``; what it lacks is left out)."""
    from pflarena.core.partition_stats import partition_text

    run_config = config.get("run_config") or {}
    method = config.get("method") or run_config.get("strategy") or "?"
    parts = [f"{method} on {run_config.get('dataset', '?')}", partition_text(run_config)]
    if "num-clients" in run_config:
        parts.append(f"{run_config['num-clients']} clients")
    if "seed" in run_config:
        parts.append(f"seed {run_config['seed']}")
    return " · ".join(parts)


def plot_run(output_dir: str | Path) -> list[Path]:
    """A run's pictures, each titled with :func:`run_title`:

    * ``accuracy.png``: the headline accuracies by round (left) and the training loss by
      round (right: the clients' mean training loss, as the round lines show it);
    * ``client_accuracy.png``: each client's personalized accuracy by round (a thin line per
      client, their mean and the 10-90 % band between the clients' 10th and 90th
      percentiles), and beside it the distribution over clients at the last evaluated round.
    """
    plt = pyplot()
    import numpy as np

    out = Path(output_dir)
    records = read_rounds(out / "rounds.jsonl")
    rounds = [r for r in records if r.get("evaluation")]
    if not rounds:
        return []
    title = run_title(_run_config(out))
    written = []

    fig, (ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    xs = [r["round"] for r in rounds]
    for scope, style in (("personalized", "-"), ("global", "--")):
        # each model's headline figure (pflarena/server/metrics.py): personalized mean over
        # clients, global pooled, as the console, the leaderboard and compare show them
        ys = [(r["evaluation"].get(scope) or {}).get(HEADLINE[scope]) for r in rounds]
        if any(y is not None for y in ys):
            ax.plot(
                xs,
                [math.nan if y is None else y for y in ys],
                style,
                marker="o",
                ms=3,
                label=label(scope),
            )
        elif scope == "global":  # said, not silently missing
            ax.plot([], [], style, label=f"{label(scope)}: none (no global model)")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title("test accuracy")
    integer_ticks(ax.xaxis)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    losses = [
        (r["round"], (r.get("train") or {}).get("loss"))
        for r in records
        if isinstance((r.get("train") or {}).get("loss"), int | float)
    ]
    if losses:
        loss_ax.plot(
            [x for x, _ in losses],
            [y for _, y in losses],
            marker="o",
            ms=3,
            color="C3",
            label="training loss (mean over the round's clients)",
        )
        loss_ax.legend(fontsize=8)
    else:
        loss_ax.text(
            0.5, 0.5, "no training loss recorded", ha="center", transform=loss_ax.transAxes
        )
    loss_ax.set_xlabel("round")
    loss_ax.set_ylabel("training loss")
    loss_ax.set_title("training loss")
    integer_ticks(loss_ax.xaxis)
    loss_ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=120)
    plt.close(fig)
    written.append(out / "accuracy.png")

    clients = sorted(
        {c for r in rounds for c in (r["evaluation"].get("per_client") or {})},
        key=lambda c: (not str(c).isdigit(), int(c) if str(c).isdigit() else 0, str(c)),
    )
    if clients:
        matrix = np.full((len(rounds), len(clients)), np.nan)
        for i, record in enumerate(rounds):
            per_client = record["evaluation"].get("per_client") or {}
            for j, client in enumerate(clients):
                value = (per_client.get(client) or {}).get("personalized")
                if isinstance(value, int | float):
                    matrix[i, j] = value
        fig, (ax, hist_ax) = plt.subplots(
            1, 2, figsize=(11, 4.5), sharey=True, gridspec_kw={"width_ratios": [3, 1]}
        )
        for j in range(len(clients)):
            ax.plot(xs, matrix[:, j], color="0.55", lw=0.6, alpha=0.5)
        ax.plot([], [], color="0.55", lw=0.6, label=f"one client ({len(clients)})")
        import warnings

        with warnings.catch_warnings():  # a round no client evaluated in: NaN, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            low, high = np.nanpercentile(matrix, [10, 90], axis=1)
            mean = np.nanmean(matrix, axis=1)
        ax.fill_between(xs, low, high, color="C0", alpha=0.2, label="10-90 % of clients")
        ax.plot(xs, mean, color="C0", lw=2.2, label="mean over clients")
        ax.set_xlabel("round")
        ax.set_ylabel("personalized test accuracy")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title("each client's personalized accuracy by round")
        integer_ticks(ax.xaxis)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        last = matrix[-1][~np.isnan(matrix[-1])]
        hist_ax.hist(
            last,
            bins=np.linspace(0, 1, 21),
            orientation="horizontal",
            color="C0",
            edgecolor="black",
        )
        hist_ax.set_xlabel("clients")
        hist_ax.set_title(f"round {rounds[-1]['round']}")
        integer_ticks(hist_ax.xaxis)
        hist_ax.grid(alpha=0.3)
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(out / "client_accuracy.png", dpi=120)
        plt.close(fig)
        written.append(out / "client_accuracy.png")
    return written


def integer_ticks(axis: Any) -> None:
    """Ticks on whole numbers only (rounds, client counts): never "2.5 clients"."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))
