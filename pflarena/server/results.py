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

from pflarena.core.drawing import (
    fit_text,
    integer_ticks,
    legend_below,
    percent_ticks,
    pyplot,
)
from pflarena.server.metrics import HEADLINE, label

__all__ = [
    "COMPLETED",
    "FAILED",
    "INTERRUPTED",
    "RunInterrupted",
    "client_failures",
    "comparable_rounds",
    "failure_text",
    "format_rounds",
    "interruption_signal",
    "recorded_failures",
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

#: ``summary.json``'s ``status``: every round ran (clients may still have failed in some:
#: its ``client_failures`` says), the run stopped on an error (``error``), or a signal
#: stopped it (``signal``; ``pflarena run --resume`` continues it).
COMPLETED, FAILED, INTERRUPTED = "completed", "failed", "interrupted"


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by a signal: Ctrl-C's ``SIGINT`` or a process manager's ``SIGTERM``
    (the simulation process raises it from its signal handler, and the ServerApp records
    the run as :data:`INTERRUPTED` with the signal's name). A ``KeyboardInterrupt``, so
    that every ``except KeyboardInterrupt`` stays the way out."""

    #: the signal of a subclass made by :meth:`for_signal` (raised without arguments)
    default_signum: int | None = None

    def __init__(self, signum: int | None = None) -> None:
        self.signum = signum if signum is not None else self.default_signum
        super().__init__(f"interrupted by {self.signal_name or 'a signal'}")

    @property
    def signal_name(self) -> str | None:
        """``SIGINT``, ``SIGTERM``, ...; None when no signal is known."""
        import signal

        if self.signum is None:
            return None
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @classmethod
    def for_signal(cls, signum: int) -> type[RunInterrupted]:
        """A subclass that stands for ``signum`` when raised as a class (a thread is
        interrupted from another with an exception class, not an instance)."""
        return type(cls.__name__, (cls,), {"default_signum": signum})


def interruption_signal(exc: BaseException) -> str | None:
    """The signal's name a ``KeyboardInterrupt`` stands for (None when not known)."""
    return exc.signal_name if isinstance(exc, RunInterrupted) else None


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
    return {"last": _point(last, last_round), "best": _point(best, best_round)}


def _point(stats: dict[str, Any], server_round: int) -> dict[str, Any]:
    """One evaluation's figures, its round, and the clients they are over (``clients``,
    where the round's record counts them: the clients that were evaluated)."""
    point = {k: stats.get(k) for k in STAT_KEYS} | {"round": server_round}
    if isinstance(stats.get("num_clients"), int):
        point["clients"] = stats["num_clients"]
    return point


def summarize_rounds(
    rounds: list[dict[str, Any]], num_clients: int | None = None
) -> dict[str, Any]:
    """The accuracy, traffic and failure part of ``summary.json``, from the round records
    (``num_clients``: the run's, which ``client_failures`` counts against)."""
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
        "client_failures": client_failures(rounds, num_clients),
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


#: Distinct errors ``client_failures`` lists (the others are counted in ``other_errors``).
MAX_ERRORS = 20
#: Runs of consecutive rounds :func:`format_rounds` writes before it counts the rest.
MAX_ROUND_RUNS = 8


def format_rounds(rounds: list[int] | set[int]) -> str:
    """Round numbers as runs of consecutive rounds: ``0-1, 5, 7-9`` (past
    :data:`MAX_ROUND_RUNS` runs, the rest counted: ``..., 40 rounds in all``)."""
    numbers = sorted(set(rounds))
    runs: list[tuple[int, int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:MAX_ROUND_RUNS])
    if len(runs) > MAX_ROUND_RUNS:
        text += f", ... ({len(numbers)} rounds in all)"
    return text


def _round_failures(record: dict[str, Any]) -> list[tuple[Any, str, str]]:
    """The failures a round's record names: (who, exchange, problem) per client and
    exchange; who is the client id, else ``node <id>`` (a node that never said which client
    it holds), else ``unknown``."""
    found = []
    train = record.get("train") or {}
    evaluation = record.get("evaluation") or record.get("evaluation_failures") or {}
    for part, default in ((train, "train"), (evaluation, "evaluate")):
        for problem in part.get("problems") or []:
            if not isinstance(problem, dict):
                continue
            client, node = problem.get("client"), problem.get("node")
            who = client if client is not None else f"node {node}" if node else "unknown"
            exchange = str(problem.get("exchange") or default)
            found.append((who, exchange, " ".join(str(problem.get("problem") or "").split())))
    return found


def client_failures(rounds: list[dict[str, Any]], num_clients: int | None = None) -> dict[str, Any]:
    """Every client failure the round records name, for ``summary.json``.

    ``clients``: how many clients failed at least once (of ``of``, the run's clients);
    ``rounds``: the rounds any failed in (:func:`format_rounds`), ``every_round`` whether
    each failed client failed in every round recorded; ``by_client``: per client (its id,
    else ``node``: the node that never said which client it holds) its rounds, exchanges
    (``train``, ``evaluate``, the method's own) and first problem; ``errors``: one entry
    per distinct error with the clients and rounds it hit (the first :data:`MAX_ERRORS`,
    most clients first); ``never_evaluated``: the client ids no evaluation counted, when
    some failed; ``text``: the one line the console, ``results.md``, the leaderboard and
    ``compare`` show (:func:`failure_text`). With no failure, ``clients`` 0 (and ``of``)."""
    recorded = sorted({int(r["round"]) for r in rounds if isinstance(r.get("round"), int)})
    clients: dict[Any, dict[str, Any]] = {}
    errors: dict[str, dict[str, Any]] = {}
    cross: dict[int, int] = {}
    for record in rounds:
        number = record.get("round")
        for who, exchange, problem in _round_failures(record):
            entry = clients.setdefault(who, {"rounds": set(), "exchanges": [], "problem": problem})
            entry["rounds"].add(number)
            if exchange not in entry["exchanges"]:
                entry["exchanges"].append(exchange)
            error = errors.setdefault(problem, {"clients": set(), "rounds": set(), "exchanges": []})
            error["clients"].add(who)
            error["rounds"].add(number)
            if exchange not in error["exchanges"]:
                error["exchanges"].append(exchange)
        lost = ((record.get("evaluation") or {}).get("cross") or {}).get("failures")
        if isinstance(lost, int) and lost > 0:
            cross[number] = lost
    block: dict[str, Any] = {"clients": len(clients)}
    if num_clients is not None:
        block["of"] = num_clients
    if not clients and not cross:
        return block
    if clients:
        every = all(entry["rounds"] >= set(recorded) for entry in clients.values())
        block |= {
            "rounds": format_rounds(set().union(*(e["rounds"] for e in clients.values()))),
            "every_round": every,
            "by_client": [
                _who(who)
                | {
                    "rounds": format_rounds(entry["rounds"]),
                    "failed_rounds": len(entry["rounds"]),
                    "exchanges": entry["exchanges"],
                    "problem": entry["problem"],
                }
                for who, entry in sorted(clients.items(), key=lambda item: _who_order(item[0]))
            ],
        }
        ranked = sorted(errors.items(), key=lambda item: -len(item[1]["clients"]))
        block["errors"] = [
            {
                "error": text,
                "clients": len(error["clients"]),
                "rounds": format_rounds(error["rounds"]),
                "exchanges": error["exchanges"],
            }
            for text, error in ranked[:MAX_ERRORS]
        ]
        if len(ranked) > MAX_ERRORS:
            block["other_errors"] = len(ranked) - MAX_ERRORS
        if num_clients is not None:
            evaluated = {
                str(c)
                for r in rounds
                for c in ((r.get("evaluation") or {}).get("per_client") or {})
            }
            never = [c for c in range(num_clients) if str(c) not in evaluated]
            if never:
                block["never_evaluated"] = never
    if cross:
        block["cross_evaluation"] = {
            "failures": sum(cross.values()),
            "rounds": format_rounds(set(cross)),
        }
    block["text"] = failure_text(block)
    return block


def _who(who: Any) -> dict[str, Any]:
    """A failed client as ``by_client`` names it: its id, else its node (or neither)."""
    if isinstance(who, int):
        return {"client": who}
    if str(who).startswith("node "):
        node = str(who).split(" ", 1)[1]
        return {"client": None, "node": int(node) if node.isdigit() else node}
    return {"client": None}


def _who_order(who: Any) -> tuple[bool, int, str]:
    """Client ids in order, then the nodes that never said which client they hold."""
    return (not isinstance(who, int), who if isinstance(who, int) else 0, str(who))


def recorded_failures(run_dir: str | Path, summary: dict[str, Any]) -> dict[str, Any]:
    """A run's ``client_failures``: its summary's, or for a summary written before runs
    recorded them, :func:`client_failures` of its ``rounds.jsonl`` (none without one)."""
    if isinstance(summary.get("client_failures"), dict):
        return summary["client_failures"]
    path = Path(run_dir) / "rounds.jsonl"
    rounds = read_rounds(path) if path.is_file() else []
    clients = summary.get("num_clients")
    return client_failures(rounds, clients if isinstance(clients, int) else None)


def failure_text(block: dict[str, Any] | None) -> str | None:
    """The one line that says a run lost clients (``1 of 4 clients failed in every
    round``), from ``summary.json``'s ``client_failures``; None when none failed."""
    if not isinstance(block, dict):
        return None
    parts = []
    count = block.get("clients")
    if isinstance(count, int) and count > 0:
        of = f" of {block['of']}" if isinstance(block.get("of"), int) else ""
        noun = "client" if count == 1 and not of else "clients"
        rounds = str(block.get("rounds", ""))
        if block.get("every_round"):
            where = "in every round"
        else:
            plural = "s" if ("," in rounds or "-" in rounds) else ""
            where = f"in round{plural} {rounds}"
        parts.append(f"{count}{of} {noun} failed {where}")
    cross = block.get("cross_evaluation") or {}
    if isinstance(cross.get("failures"), int) and cross["failures"] > 0:
        parts.append(f"{cross['failures']} cross-evaluation replies lost")
    return "; ".join(parts) or None


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
    """A run's pictures, each titled with :func:`run_title`, accuracy in percent and the
    legend below the panels:

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

    fig, (ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4.6), sharex=True, layout="constrained")
    xs = [r["round"] for r in rounds]
    for scope, style in (("personalized", "-"), ("global", "--")):
        # each model's headline figure (pflarena/server/metrics.py): personalized mean over
        # clients, global pooled, as the console, the leaderboard and compare show them
        ys = [(r["evaluation"].get(scope) or {}).get(HEADLINE[scope]) for r in rounds]
        if any(y is not None for y in ys):
            ax.plot(
                xs,
                [math.nan if y is None else 100 * y for y in ys],
                style,
                marker="o",
                ms=3,
                label=label(scope),
            )
        elif scope == "global":  # said, not silently missing
            ax.plot([], [], style, label=f"{label(scope)}: none (no global model)")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(-2, 102)
    percent_ticks(ax.yaxis)
    ax.set_title("test accuracy")
    integer_ticks(ax.xaxis)
    ax.grid(alpha=0.3)
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
    else:
        loss_ax.text(
            0.5, 0.5, "no training loss recorded", ha="center", transform=loss_ax.transAxes
        )
    loss_ax.set_xlabel("round")
    loss_ax.set_ylabel("training loss")
    loss_ax.set_title("training loss")
    integer_ticks(loss_ax.xaxis)
    loss_ax.grid(alpha=0.3)
    legend_below(fig)
    fig.suptitle(fit_text(fig, title))
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
                    matrix[i, j] = 100 * value
        fig, (ax, hist_ax) = plt.subplots(
            1,
            2,
            figsize=(11, 5),
            sharey=True,
            gridspec_kw={"width_ratios": [3, 1]},
            layout="constrained",
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
        ax.set_ylim(-2, 102)
        percent_ticks(ax.yaxis)
        ax.set_title("each client's personalized accuracy by round")
        integer_ticks(ax.xaxis)
        ax.grid(alpha=0.3)
        last = matrix[-1][~np.isnan(matrix[-1])]
        hist_ax.hist(
            last,
            bins=np.linspace(0, 100, 21),
            orientation="horizontal",
            color="C0",
            edgecolor="black",
        )
        hist_ax.set_xlabel("clients")
        hist_ax.set_title(f"round {rounds[-1]['round']}")
        integer_ticks(hist_ax.xaxis)
        hist_ax.grid(alpha=0.3)
        legend_below(fig)
        fig.suptitle(fit_text(fig, title))
        fig.savefig(out / "client_accuracy.png", dpi=120)
        plt.close(fig)
        written.append(out / "client_accuracy.png")
    return written
