"""``pflarena run``'s start-up, this tree against an earlier one, side by side.

Each repetition runs the same commands with both source trees, one right after the other
under the same load, with this Python environment (the earlier tree first on
``PYTHONPATH``):

* the job, ``pflarena run --strategy fedavg --dataset digits --num-clients 4 --num-rounds 1
  --seed 0``: wall time from the command's start to its exit, and the CPU seconds of its
  whole process tree (sampled from ``/proc``), which say more than wall time on a shared
  machine;
* ``pflarena run --check`` of the same job, and a configuration error (``--num-clients 0``
  unless ``--error-flags`` says otherwise).

The tree under test notes its moments (``PFLARENA_PHASES``, :mod:`pflarena.core.phases`):
their medians make the phase table. The results of every run of the job must be equal
(``rounds.jsonl`` and ``summary.json`` but for wall-clock fields).

Usage (the earlier tree exported from git with ``git archive``, or given as a directory)::

    python benchmarks/startup.py --before-commit <commit> --repeats 5
    python benchmarks/startup.py --before /tmp/before --repeats 5

``--checks-only`` measures ``--check`` and the configuration error alone (no job), and adds
its section to the results file, whose content it keeps; ``--flags`` adds run flags to every
command and ``--error-flags`` says what makes the configuration error, e.g. a method whose
parameters have rules of their own, refused for one of them::

    python benchmarks/startup.py --before-commit <commit> --checks-only \
        --flags="--strategy page --server-fraction 0.2" --error-flags="--set page.min-epochs=9"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from commit_tree import export_commit, tree_env

ROOT = Path(__file__).resolve().parents[1]
JOB = [
    "run",
    "--strategy", "fedavg", "--dataset", "digits", "--num-clients", "4", "--num-rounds", "1",
    "--seed", "0",
]  # fmt: skip
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: Fields of summary.json that are wall-clock times, not results.
CLOCK_FIELDS = ("wall_time_s", "startup_s", "rounds_time_s")


# --------------------------------------------------------------------------- process tree CPU
def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, start time) of a process, from /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[19])


class TreeCPU:
    """CPU seconds of a process and all its descendants, sampled every ``period`` seconds
    (a descendant that lives less than a period may be missed)."""

    def __init__(self, root: int, period: float = 0.1) -> None:
        self.root, self.period = root, period
        self.seen: dict[tuple[int, int], float] = {}
        self.members: set[int] = {root}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period)

    def sample(self) -> None:
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _stat(int(entry))) is not None:
                stats[int(entry)] = stat
        changed = True
        while changed:
            changed = False
            for pid, (ppid, _, _) in stats.items():
                if ppid in self.members and pid not in self.members:
                    self.members.add(pid)
                    changed = True
        for pid in self.members:
            if pid in stats:
                _, cpu, start = stats[pid]
                self.seen[(pid, start)] = max(cpu, self.seen.get((pid, start), 0.0))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self.seen.values())


# --------------------------------------------------------------------------- one command
def timed(tree: Path, args: list[str], work: Path, phases: Path | None = None) -> dict:
    """Run ``python -m pflarena.cli ARGS`` from ``tree``; its wall and CPU seconds."""
    env = tree_env(tree)
    env.pop("PFLARENA_PHASES", None)
    if phases is not None:
        env["PFLARENA_PHASES"] = str(phases)
    load = os.getloadavg()[0]
    start = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pflarena.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=work,
    )
    cpu = TreeCPU(proc.pid)
    output, _ = proc.communicate()
    wall = time.time() - start
    return {"wall": wall, "cpu": cpu.stop(), "load": load, "code": proc.returncode, "out": output}


def comparable(run_dir: Path) -> tuple[list[dict], dict]:
    """A run's rounds and summary without their wall-clock fields."""
    sys.path.insert(0, str(ROOT))
    from pflarena.server.results import comparable_rounds

    rounds = comparable_rounds(
        [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    return rounds, {k: v for k, v in summary.items() if k not in CLOCK_FIELDS}


def phase_medians(files: list[Path]) -> list[tuple[str, float, float]]:
    """Each moment's median time since the command's start, and the median phase before it,
    over the runs whose moments ``files`` hold (in the order of the first run)."""
    from pflarena.core.phases import phase_rows, read_marks

    runs = []
    for path in files:
        marks = read_marks(path)
        runs.append({name: (phase, at) for name, phase, at in phase_rows(marks, marks[0][0])})
    order = list(runs[0])
    return [
        (
            name,
            statistics.median(run[name][0] for run in runs if name in run),
            statistics.median(run[name][1] for run in runs if name in run),
        )
        for name in order
    ]


def _commit(tree: Path, output: Path) -> str:
    """``tree``'s commit, and whether its tracked files differ from it (but ``output``)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout.splitlines()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    mine = str(output.resolve().relative_to(tree)) if output.resolve().is_relative_to(tree) else ""
    changed = [line for line in dirty if line[3:].strip() != mine]
    return head + (" (with uncommitted changes of the working tree)" if changed else "")


# --------------------------------------------------------------------------- report
def checks_section(
    args: argparse.Namespace,
    kinds: dict[str, list[str]],
    results: dict[tuple[str, str], list[dict]],
    started: datetime,
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
) -> list[str]:
    """The Markdown section of a ``--checks-only`` measurement."""
    median = statistics.median
    loads = [r["load"] for rs in results.values() for r in rs]
    lines = [
        "## `--check` and a configuration error "
        + (f"with `{args.flags}`" if args.flags else "of the job")
        + ": before and after",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC.",
        f"- Command: `python benchmarks/startup.py {shlex.join(sys.argv[1:])}`, at commit "
        f"{_commit(ROOT, Path(args.output))}.",
        *[f"- {name}: `{shlex.join(['pflarena', *command])}`" for name, command in kinds.items()],
        f"- Before and after alternate, {args.repeats} times each; before: "
        f"{args.before_name or args.before}, the same Python environment.",
        f"- Machine: {platform.machine()}, {os.cpu_count()} cores, **shared with other "
        f"jobs**: load average (1 min) {load_start[0]:.2f} at the start, {load_end[0]:.2f} "
        f"at the end, {min(loads):.2f} to {max(loads):.2f} at the runs' starts (median "
        f"{median(loads):.2f}).",
        "",
        f"Medians of {args.repeats}:",
        "",
        "| command | wall s before | wall s after | after / before | CPU s before | CPU s after |",
        "|---|---|---|---|---|---|",
    ]
    for name in kinds:
        b = median(r["wall"] for r in results[("before", name)])
        a = median(r["wall"] for r in results[("after", name)])
        cpu_b = median(r["cpu"] for r in results[("before", name)])
        cpu_a = median(r["cpu"] for r in results[("after", name)])
        lines.append(f"| {name} | {b:.2f} | {a:.2f} | {a / b:.2f} | {cpu_b:.2f} | {cpu_a:.2f} |")
    lines.append("")
    for name in kinds:
        lines.append(
            f"Each run's wall seconds ({name}): before "
            + ", ".join(f"{r['wall']:.2f}" for r in results[("before", name)])
            + "; after "
            + ", ".join(f"{r['wall']:.2f}" for r in results[("after", name)])
            + "."
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--before", help="the earlier source tree")
    which.add_argument("--before-commit", help="the earlier commit (exported with git archive)")
    parser.add_argument("--before-name", default="", help="what to call it")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default=str(ROOT / "benchmarks/results/startup.md"))
    parser.add_argument(
        "--checks-only",
        action="store_true",
        help="only --check and the configuration error; their section added to --output",
    )
    parser.add_argument("--flags", default="", help="run flags added to every command")
    parser.add_argument(
        "--error-flags", default="--num-clients 0", help="what makes the configuration error"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflarena-startup-"))
    if args.before_commit:
        before = export_commit(args.before_commit, work / "before")
        args.before_name = args.before_name or f"commit {args.before_commit}"
    else:
        before = Path(args.before).resolve()
    after = ROOT
    started = datetime.now(timezone.utc)
    load_start = os.getloadavg()
    flags = shlex.split(args.flags)
    kinds = {
        "job": [*JOB, *flags],
        "check": [*JOB, *flags, "--check"],
        "config error": [*JOB, *flags, *shlex.split(args.error_flags)],
    }
    if args.checks_only:
        del kinds["job"]
    results: dict[tuple[str, str], list[dict]] = {}
    phase_files: list[Path] = []
    for index in range(args.repeats):
        for name, command in kinds.items():
            for side, tree in (("before", before), ("after", after)):
                extra = ["--output-dir", str(work / f"{side}-{name}-{index}")]
                phases = None
                if side == "after" and name == "job":
                    phases = work / f"phases-{index}"
                    phase_files.append(phases)
                result = timed(tree, [*command, *extra], work, phases)
                results.setdefault((side, name), []).append(result)
                expected = 2 if name == "config error" else 0
                if result["code"] != expected:
                    raise SystemExit(f"{side} {name} exited {result['code']}:\n{result['out']}")
        first = next(iter(kinds))
        walls = results[("before", first)][-1]["wall"], results[("after", first)][-1]["wall"]
        print(
            f"repetition {index + 1}: {first} before {walls[0]:.1f}s, after {walls[1]:.1f}s",
            flush=True,
        )
    load_end = os.getloadavg()
    if args.checks_only:
        section = checks_section(args, kinds, results, started, load_start, load_end)
        output = Path(args.output)
        kept = output.read_text().rstrip("\n") + "\n\n" if output.exists() else ""
        output.write_text(kept + "\n".join(section) + "\n")
        print("\n".join(section))
        print(f"\nruns: {work}")
        return
    reference = comparable(work / "before-job-0")
    identical = all(
        comparable(work / f"{side}-job-{i}") == reference
        for side in ("before", "after")
        for i in range(args.repeats)
    )
    median = statistics.median

    def cell(side: str, name: str, key: str) -> float:
        return median(r[key] for r in results[(side, name)])

    loads = [r["load"] for rs in results.values() for r in rs]
    command = " ".join(["pflarena", *kinds["job"]])
    lines = [
        "# Start-up of `pflarena run`: before and after",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC.",
        f"- Command: `python benchmarks/startup.py {shlex.join(sys.argv[1:])}`, at commit "
        f"{_commit(after, Path(args.output))}.",
        f"- Job: `{command}` (before and after alternate, {args.repeats} times each); also "
        f"its `--check`, and a configuration error (`{args.error_flags}`).",
        f"- Before: {args.before_name or before}, the same Python environment.",
        f"- Machine: {platform.machine()}, {os.cpu_count()} cores, **shared with other "
        f"jobs**: load average (1 min) {load_start[0]:.2f} at the start, {load_end[0]:.2f} "
        f"at the end, {min(loads):.2f} to {max(loads):.2f} at the runs' starts (median "
        f"{median(loads):.2f}). Wall times include that load; the ratios compare runs "
        "made one right after the other, and CPU seconds depend less on it.",
        "",
        "Medians of " + str(args.repeats) + ":",
        "",
        "| command | wall s before | wall s after | after / before | CPU s before | CPU s after |",
        "|---|---|---|---|---|---|",
    ]
    for name in kinds:
        b, a = cell("before", name, "wall"), cell("after", name, "wall")
        lines.append(
            f"| {name} | {b:.2f} | {a:.2f} | {a / b:.2f} "
            f"| {cell('before', name, 'cpu'):.2f} | {cell('after', name, 'cpu'):.2f} |"
        )
    lines += [
        "",
        "Each run's wall seconds (job): before "
        + ", ".join(f"{r['wall']:.1f}" for r in results[("before", "job")])
        + "; after "
        + ", ".join(f"{r['wall']:.1f}" for r in results[("after", "job")])
        + ".",
        "",
        f"Results (`rounds.jsonl`, and `summary.json` but for its wall-clock fields) identical "
        f"across all {2 * args.repeats} runs of the job: {'yes' if identical else '**no**'}.",
        "",
        "## Where the time goes (after)",
        "",
        "Each moment the run's processes note (`PFLARENA_PHASES`), median over the "
        f"{args.repeats} runs; a phase is the time since the moment before, from the "
        "command's process start to the last line it prints.",
        "",
        "| phase ends with | phase s | at s |",
        "|---|---|---|",
        *[f"| {name} | {phase:.2f} | {at:.2f} |" for name, phase, at in phase_medians(phase_files)],
        f"| process exited (wall) | | {cell('after', 'job', 'wall'):.2f} |",
    ]
    Path(args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nruns: {work}")


if __name__ == "__main__":
    main()
