"""``pflarena compare``: a Markdown table of several runs' results (the plot:
:func:`pflarena.reporting.plots.compare_plot`).

Each run is a results directory (:mod:`pflarena.server.results`). Runs that did not
complete are shown too, marked: ``failed`` (the ServerApp wrote a failed summary) or
``interrupted`` (by a signal, named; or killed: rounds recorded but no summary), with the
rounds they completed out of those planned; their figures are those of their last evaluated
round. A completed run some of whose clients failed says so in its status (``completed, 1 of
4 clients failed in every round``) and its clients column (``4 (3 evaluated)``). The settings
that differ between the compared runs (the run config's but for where they are written and
how they are tracked, the model; a method's own parameters only between runs of that method)
get a column of their own, and :func:`differences_markdown` says each once with what it means,
so that two runs of one method with different settings can be told apart and the partition's
Dirichlet α (``partition.alpha``) is not read as a method's α (``pfedsv.alpha``). Accuracy
columns name their figure as :mod:`pflarena.server.metrics` defines it.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pflarena.server.metrics import short_label
from pflarena.server.results import failure_text, recorded_failures

__all__ = [
    "SUMMARY_FIELDS",
    "Difference",
    "compare_table",
    "comparable_runs",
    "differences",
    "differences_markdown",
    "expand_runs",
    "load_run",
]

#: What ``compare`` reads of every run's ``summary.json``, and the types it needs.
SUMMARY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "strategy": str,
    "dataset": str,
    "num_clients": int,
    "num_rounds": int,
    "seed": int,
    "wall_time_s": (int, float),
}

#: Run-config keys never shown as a difference: where a run is written, how it was
#: continued and tracked, and those with columns of their own.
NOT_PARAMETERS = frozenset(
    {
        "output-dir",
        "resume",
        "tracker",
        "tracking-uri",
        "tracking-experiment",
        "tracking-parent",
        "tracking-group",
        "strategy",
        "seed",
        "dataset",
        "num-clients",
        "num-rounds",
    }
)


class RunArgumentError(ValueError):
    """A ``compare`` argument that names no run: a missing path, a glob matching nothing, a
    folder with no run below it."""


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run's results (a summary, or a config with its rounds)."""
    return (path / "summary.json").is_file() or (
        (path / "config.json").is_file() and (path / "rounds.jsonl").is_file()
    )


def _runs_below(folder: Path) -> list[Path]:
    """The run directories below ``folder`` (a sweep's ``<setting>/<method>/seed-<s>``),
    sorted; a run's own subfolders (its TensorBoard files) are not searched."""
    found: list[Path] = []
    for path in sorted(p for p in folder.iterdir() if p.is_dir()):
        if is_run_dir(path):
            found.append(path)
        else:
            found += _runs_below(path)
    return found


def expand_runs(arguments: list[str]) -> list[Path]:
    """The run directories ``compare``'s arguments name, in order, each once: a run
    directory itself; a sweep folder (or any folder) as the runs below it; a glob (``*``,
    ``?``, ``[``; for a shell that passed it unexpanded) as the runs it matches, each
    expanded the same way. :class:`RunArgumentError` for an argument that names no run."""
    runs: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if not path.exists() and any(ch in argument for ch in "*?["):
            matches = [Path(m) for m in sorted(glob.glob(argument))]
            if not matches:
                raise RunArgumentError(f"{argument!r} matches no file or folder")
            candidates = matches
        elif not path.exists():
            raise RunArgumentError(f"{argument} does not exist")
        else:
            candidates = [path]
        for candidate in candidates:
            if is_run_dir(candidate):
                runs.append(candidate)
            elif candidate.is_dir():
                below = _runs_below(candidate)
                if not below and len(candidates) == 1:
                    raise RunArgumentError(
                        f"{candidate} is not a run directory (no summary.json, nor config.json "
                        "and rounds.jsonl) and holds no run below it"
                    )
                runs += below
            elif len(candidates) == 1:
                raise RunArgumentError(
                    f"{candidate} is a file, not a run directory or a sweep folder"
                )
    seen: set[Path] = set()
    unique = []
    for run in runs:
        key = run.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(run)
    return unique


def run_label(run_dir: Path, common: Path | None = None) -> str:
    """A run's name in a table or legend: its path below the folder all compared runs share
    (a sweep's ``<setting>/<method>/seed-<s>``), else its folder's name."""
    if common is not None:
        try:
            relative = run_dir.resolve().relative_to(common)
        except ValueError:
            return run_dir.name
        if str(relative) not in ("", "."):
            return relative.as_posix()
    return run_dir.name


def common_parent(run_dirs: list[Path]) -> Path | None:
    """The folder every compared run lies below (none for fewer than two runs)."""
    import os

    if len(run_dirs) < 2:
        return None
    try:
        return Path(os.path.commonpath([str(p.resolve()) for p in run_dirs]))
    except ValueError:
        return None


def _interrupted_summary(path: Path) -> dict[str, Any]:
    """What a run killed before it wrote a summary has: its config and recorded rounds."""
    from pflarena.server.results import read_rounds, summarize_rounds

    config = json.loads((path / "config.json").read_text())
    run_config = config.get("run_config", {})
    rounds = read_rounds(path / "rounds.jsonl")
    return {
        "strategy": str(run_config.get("strategy", config.get("method", "?"))),
        "dataset": str(run_config.get("dataset", "?")),
        "num_clients": int(run_config.get("num-clients", 0)),
        "num_rounds": int(run_config.get("num-rounds", 0)),
        "seed": int(run_config.get("seed", 0)),
        "status": "interrupted",
        "wall_time_s": float(max((r.get("elapsed_s", 0.0) for r in rounds), default=0.0)),
    } | summarize_rounds(rounds, int(run_config.get("num-clients", 0)) or None)


def load_run(path: Path) -> dict[str, Any]:
    """A run's ``summary.json`` (or, for a run killed before it wrote one, the same figures
    from its ``config.json`` and ``rounds.jsonl``, status ``interrupted``); ValueError
    naming the run and what is wrong with it."""
    summary_path = path / "summary.json"
    if not summary_path.exists():
        if (path / "config.json").exists() and (path / "rounds.jsonl").exists():
            try:
                return _interrupted_summary(path)
            except (OSError, ValueError, TypeError, AttributeError) as error:
                raise ValueError(
                    f"{path}: an interrupted run that cannot be read: {error}"
                ) from None
        raise FileNotFoundError(f"{path} is not a run directory (no summary.json)")
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{summary_path} is not readable JSON: {error}") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{summary_path} is not a JSON object")
    for key, kind in SUMMARY_FIELDS.items():
        value = summary.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{summary_path}: {key!r} is missing or malformed ({value!r})")
    for key in ("personalized", "global", "cross", "method", "client_failures"):
        if not isinstance(summary.get(key) or {}, dict):
            raise ValueError(f"{summary_path}: {key!r} is malformed")
    summary["client_failures"] = recorded_failures(path, summary)
    return summary


def comparable_runs(run_dirs: list[Path]) -> tuple[list[Path], list[str]]:
    """The runs ``compare`` can read, and why each other one is left out."""
    kept, skipped = [], []
    for run_dir in run_dirs:
        try:
            load_run(run_dir)
        except (OSError, ValueError) as error:
            skipped.append(str(error))
        else:
            kept.append(run_dir)
    return kept, skipped


def run_status(summary: dict[str, Any]) -> str:
    """``completed`` (with the clients that failed, if any: ``completed, **1 of 4 clients
    failed in every round**``), or ``failed``/``interrupted`` (with its signal) and the
    round it stopped at."""
    status = str(summary.get("status", "unknown"))
    done, planned = rounds_done(summary), summary.get("num_rounds")
    if status == "completed":
        lost = failure_text(entry(summary, "client_failures"))
        return f"{status}, **{lost}**" if lost else status
    by = f" by {summary['signal']}" if status == "interrupted" and summary.get("signal") else ""
    return f"**{status}**{by} at round {done} of {planned}"


def clients_cell(summary: dict[str, Any]) -> str:
    """The run's clients, and how many its last evaluation counted where that is fewer:
    ``4 (3 evaluated)``."""
    total = summary["num_clients"]
    evaluated = entry(entry(summary, "personalized"), "last").get("clients")
    if isinstance(evaluated, int) and evaluated != total:
        return f"{total} ({evaluated} evaluated)"
    return f"{total}"


def rounds_done(summary: dict[str, Any]) -> int:
    """The rounds a run completed: ``rounds_completed``, else (an older summary) the
    latest round any of its figures comes from."""
    if isinstance(summary.get("rounds_completed"), int):
        return summary["rounds_completed"]
    rounds = [
        block.get("round")
        for scope in ("personalized", "global")
        for block in ((summary.get(scope) or {}).get("last"),)
        if isinstance(block, dict)
    ]
    found = [r for r in rounds if isinstance(r, int)]
    if found:
        return max(found)
    return summary["num_rounds"] if summary.get("status") == "completed" else 0


#: The columns of ``compare``'s table that are settings (``strategy`` is the method).
COLUMN_SETTINGS = ("dataset", "num-clients", "num-rounds", "seed")

#: Run-config keys shown under another name, so that none reads like another: the
#: partition's Dirichlet α beside a method's own α (``pfedsv.alpha``, ``apfl.alpha``).
SHOWN_AS = {"alpha": "partition.alpha"}

#: What a shown name means where the run-config schema's description is not enough.
MEANINGS = {
    "method": "",
    "partition.alpha": "Dirichlet α, the partition's concentration over classes (smaller: "
    "fewer classes per client; the run-config key `alpha`)",
}


@dataclass(frozen=True)
class Difference:
    """One setting whose value differs between compared runs: its shown name, what it
    means, its distinct values in the runs' order, and the method whose runs alone it
    was compared between (a method's own parameter), else None."""

    name: str
    meaning: str
    values: tuple[str, ...]
    between: str | None = None


@dataclass(frozen=True)
class RunSettings:
    """A run's settings as ``compare`` compares them: its method, the settings every run
    has (the run config's common keys by their shown names, the model, the table's
    columns), and the method's own parameters as ``<method>.<param>``."""

    method: str
    shared: dict[str, Any]
    own: dict[str, Any]


def run_settings(path: Path, summary: dict[str, Any]) -> RunSettings:
    """A run's :class:`RunSettings`: the table's columns from ``summary``, the rest from its
    ``config.json`` (the run config's common keys but those of :data:`NOT_PARAMETERS`, the
    model the run resolved, the method's parameters, defaults included)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if not isinstance(config, dict):
        config = {}
    run_config = config.get("run_config") if isinstance(config.get("run_config"), dict) else {}
    method = str(summary.get("strategy") or config.get("method") or run_config.get("strategy"))
    shared: dict[str, Any] = {
        "dataset": summary.get("dataset"),
        "num-clients": summary.get("num_clients"),
        "num-rounds": summary.get("num_rounds"),
        "seed": summary.get("seed"),
    }
    for key, value in run_config.items():
        if "." not in key and key not in NOT_PARAMETERS:
            shared[SHOWN_AS.get(key, key)] = value
    if config.get("model"):  # the model the run resolved (an empty `model` key names none)
        shared["model"] = config["model"]
    params = config.get("method_params") if isinstance(config.get("method_params"), dict) else {}
    own = {f"{method}.{key}": value for key, value in params.items()}
    return RunSettings(method, shared, own)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _distinct(values: list[Any]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(_text(v) for v in values))


def _setting_meanings() -> dict[str, str]:
    """The run config's common keys (by their shown names) and their schema descriptions,
    each to its first clause."""
    from pflarena.core.config import RunConfig

    meanings = {}
    for name, field in RunConfig.model_fields.items():
        key = field.alias or name
        meanings[SHOWN_AS.get(key, key)] = (field.description or "").split("; ")[0]
    return meanings | MEANINGS


def _own_meanings(method: str) -> dict[str, str]:
    """``<method>.<param>`` and the help text the method declares for it; nothing for a
    method not installed here."""
    try:
        # the declared methods, as the server validates a run config against them
        from pflarena.server.build import declarations

        declaration = declarations()[method]
    except Exception:  # a plugin method not installed here: its names alone
        return {}
    return {key: description for key, _, _, description in declaration.param_docs()}


def differences(
    run_dirs: list[Path], summaries: list[dict[str, Any]] | None = None
) -> tuple[list[dict[str, Any]], list[Difference]]:
    """What tells the runs apart: per run, its settings that differ (``{shown name:
    value}``, the table's own columns left out), and each differing setting once
    (:class:`Difference`).

    The method differs or not; a setting every run has (dataset, partition,
    ``partition.alpha``, clients, rounds, seed, lr, model, ...) differs when the runs that
    have it hold more than one value; a method's own parameter (``pfedsv.alpha``) is
    compared only between the runs of that method, so that runs of different methods show
    none of them."""
    if summaries is None:
        summaries = [load_run(path) for path in run_dirs]
    settings = [run_settings(p, s) for p, s in zip(run_dirs, summaries, strict=True)]
    per_run: list[dict[str, Any]] = [{} for _ in settings]
    found: list[Difference] = []
    if len(settings) < 2:
        return per_run, found
    methods = _distinct([s.method for s in settings])
    if len(methods) > 1:
        found.append(Difference("method", MEANINGS["method"], methods))
    meanings = _setting_meanings()
    names = sorted(
        {k for s in settings for k in s.shared},
        key=lambda k: (
            k not in COLUMN_SETTINGS,
            COLUMN_SETTINGS.index(k) if k in COLUMN_SETTINGS else 0,
            k,
        ),
    )
    for name in names:
        having = [(i, s.shared[name]) for i, s in enumerate(settings) if name in s.shared]
        values = _distinct([v for _, v in having])
        if len(having) < 2 or len(values) < 2:
            continue
        found.append(Difference(name, meanings.get(name, ""), values))
        if name not in COLUMN_SETTINGS:
            for i, value in having:
                per_run[i][name] = value
    for method in methods:
        group = [(i, s) for i, s in enumerate(settings) if s.method == method]
        if len(group) < 2:
            continue
        keys = sorted({k for _, s in group for k in s.own})
        described: dict[str, str] | None = None
        for key in keys:
            having = [(i, s.own[key]) for i, s in group if key in s.own]
            values = _distinct([v for _, v in having])
            if len(having) < 2 or len(values) < 2:
                continue
            if described is None:
                described = _own_meanings(method)
            found.append(Difference(key, described.get(key, ""), values, between=method))
            for i, value in having:
                per_run[i][key] = value
    return per_run, found


def differences_markdown(run_dirs: list[Path]) -> str:
    """What differs between the compared runs, one line per setting with what it means
    and its values (a method's own parameter: between that method's runs); empty when
    nothing does (or for one run)."""
    _, found = differences(run_dirs)
    if not found:
        return ""
    lines = ["What differs between the runs:", ""]
    for item in found:
        where = f", between the {item.between} runs" if item.between else ""
        meaning = f" — {item.between}'s {item.meaning}" if item.between else f" — {item.meaning}"
        line = f"- `{item.name}`{where}: {', '.join(item.values)}"
        lines.append(line + (meaning if item.meaning else ""))
    return "\n".join(lines)


def _fmt(value: Any, pct: bool = True) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "—"
    return f"{100 * value:.2f}" if pct else f"{value}"


def entry(record: dict, key: str) -> dict:
    """``record[key]`` when it is a dict, else an empty one (an absent or damaged entry)."""
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def _megabytes(value: Any) -> str:
    return f"{value / 1e6:.1f}" if isinstance(value, int | float) else "0.0"


def _epsilon(summary: dict[str, Any]) -> float | None:
    value = entry(entry(summary, "method"), "dp").get("epsilon")
    return float(value) if isinstance(value, int | float) else None


def _seconds(summary: dict[str, Any]) -> tuple[str, str]:
    """(start-up s, rounds s): the rounds' own time apart from the start-up (an older
    summary has only the whole wall time, shown as the rounds')."""
    startup, rounds = summary.get("startup_s"), summary.get("rounds_time_s")
    if not isinstance(rounds, int | float):
        return "—", f"{summary['wall_time_s']:.0f}"
    return (f"{startup:.0f}" if isinstance(startup, int | float) else "—"), f"{rounds:.0f}"


def compare_table(run_dirs: list[Path]) -> str:
    """A Markdown table of personalized and global accuracy (in %) of several runs."""
    summaries = [load_run(run_dir) for run_dir in run_dirs]
    common = common_parent(run_dirs)
    per_run, _ = differences(run_dirs, summaries)
    shown_params = any(per_run)
    header = (
        "| run | status | strategy | dataset | clients | rounds | seed "
        + ("| settings that differ " if shown_params else "")
        + f"| {short_label('personalized', 'mean')} (last) "
        + f"| {short_label('personalized', 'weighted')} "
        + f"| {short_label('personalized', 'worst10')} "
        + f"| {short_label('personalized', 'mean')} best (round) "
        + f"| {short_label('global', 'weighted')} (last) "
        + f"| {short_label('global', 'mean')} (last) "
        + "| start-up s | rounds s | MB up | MB down |"
    )
    crossed = any(s.get("cross") for s in summaries)
    if crossed:  # the cross-evaluation's synthetic and global accuracy of personalized models
        header += " cross S-acc | cross G-acc |"
    private = any(_epsilon(s) is not None for s in summaries)
    if private:
        header += " DP ε (δ) |"
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    for run_dir, s, diff in zip(run_dirs, summaries, per_run, strict=True):
        pers = s.get("personalized") or {}
        last, best = entry(pers, "last"), entry(pers, "best")
        glob = entry(s.get("global") or {}, "last")
        best_txt = f"{_fmt(best.get('mean'))} ({best.get('round')})" if best else "—"
        startup, rounds_s = _seconds(s)
        rows.append(
            f"| {run_label(run_dir, common)} | {run_status(s)} | {s['strategy']} | {s['dataset']} "
            f"| {clients_cell(s)} | {rounds_done(s)}/{s['num_rounds']} | {s['seed']} "
            + (
                "| " + (", ".join(f"{k}={_text(v)}" for k, v in diff.items()) or "—") + " "
                if shown_params
                else ""
            )
            + f"| {_fmt(last.get('mean'))} "
            f"| {_fmt(last.get('weighted'))} | {_fmt(last.get('worst10'))} | {best_txt} "
            f"| {_fmt(glob.get('weighted'))} | {_fmt(glob.get('mean'))} | {startup} | {rounds_s} "
            f"| {_megabytes(s.get('bytes_up'))} | {_megabytes(s.get('bytes_down'))} |"
        )
        if crossed:
            cross = s.get("cross") or {}
            rows[-1] += "".join(
                f" {_fmt(entry(cross, scope).get('mean'))} |" for scope in ("synthetic", "global")
            )
        if private:
            epsilon = _epsilon(s)
            delta = entry(entry(s, "method"), "dp").get("delta")
            rows[-1] += f" {epsilon:.3g} ({delta:g}) |" if epsilon is not None else " — |"
    return "\n".join(rows)
