"""Where a run's start-up goes: ``pflarena run`` through a SuperLink against Flower's runtime
started by pflarena, side by side, plus the cost of each ingredient alone.

Each repetition runs the same one-round job both ways, one after the other under the same
load: ``pflarena run --superlink`` (a private simulation SuperLink, ``flwr run`` building,
uploading and installing the FAB, a ``flwr-simulation`` process, as before) and ``pflarena
run`` (:mod:`pflarena.runtime.simulation`). Phases are read from Flower's own log lines
(``FLWR_LOG_LEVEL=DEBUG`` puts a timestamp on each) and from when lines arrive; CPU time is
summed over the whole process tree (sampled from ``/proc``), which on a shared machine says
more than wall time about what an idle one would take. With ``--sweep`` it also times the
main job's strategies for one round each, run separately against ``pflarena sweep``.

Usage::

    python benchmarks/startup.py --repeats 2 --sweep
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from pflarena.server.results import comparable_rounds

ROOT = Path(__file__).resolve().parents[1]
PFLARENA = [sys.executable, "-m", "pflarena.cli"]
JOB = ["--strategy", "fedavg", "--dataset", "digits", "--num-clients", "10", "--num-rounds", "1"]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STAMP = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR)\S*\s+(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")

#: (event, pattern) in the order they happen; the first line matching each one counts.
SUPERLINK_EVENTS = [
    ("flwr run started (SuperLink healthy)", "Using SuperLink"),
    ("FAB built and run submitted", "Successfully started run"),
    ("flwr-simulation process started", "Starting Flower Simulation"),
    ("FAB installed", "Pre-registering run"),
    ("ServerApp started (apps imported)", r"pflarena: \S+ on "),
    ("Ray init begins", "Initialising: RayBackend"),
    ("Ray up, actors created", "Constructed ActorPool"),
    ("round 0 evaluated (actors import the ClientApp, load data)", r"\[round 0/"),
    ("round 1 trained and evaluated", r"\[round 1/"),
    ("results and plots written", "pflarena: results in"),
    ("actors terminated, Ray shut down", "Terminated RayBackend"),
]
RUNTIME_EVENTS = [
    # "Ray started in X s": its start is X seconds before that line
    ("simulation process started, Ray init begins", r"pflarena: Ray started in ([\d.]+)s"),
    ("Ray up", "pflarena: Ray started"),
    ("actors created", "actors created"),
    ("ServerApp started (Flower and the apps imported meanwhile)", r"pflarena: \S+ on "),
    ("round 0 evaluated (actors import the ClientApp, load data)", r"\[round 0/"),
    ("round 1 trained and evaluated", r"\[round 1/"),
    ("results and plots written", "pflarena: results in"),
    ("actors terminated, Ray shut down", "Terminated ReusableRayBackend"),
]


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
    """CPU seconds of a process and all its descendants, sampled every ``period`` seconds.

    A descendant that lives less than a period may be missed; one that outlives the root
    (Ray's daemons are reparented when the driver dies) keeps being counted while seen.
    """

    def __init__(self, root: int, period: float = 0.25) -> None:
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
        while changed:  # add children of members until nothing new
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


# --------------------------------------------------------------------------- one run
def _epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def timed_run(args: list[str], events: list[tuple[str, str]], out: Path) -> dict:
    """Run a pflarena command, timing the events its log shows and its CPU use."""
    env = dict(os.environ, FLWR_LOG_LEVEL="DEBUG")
    load = os.getloadavg()[0]
    start = time.time()
    proc = subprocess.Popen(
        [*PFLARENA, *args, "--verbose", "--output-dir", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=out.parent,
    )
    cpu = TreeCPU(proc.pid)
    found: dict[str, float] = {}
    log = []
    assert proc.stdout is not None
    for line in proc.stdout:
        arrived = time.time() - start
        log.append(f"{arrived:8.2f} {line}")
        if "ClientAppActor" in line or line.startswith("(pid="):
            continue
        for name, pattern in events:
            if name not in found and (match := re.search(pattern, line)):
                stamp = STAMP.search(line)
                found[name] = _epoch(stamp.group(1)) - start if stamp else arrived
                if match.groups():
                    found[name] -= float(match.group(1))
    proc.wait()
    wall = time.time() - start
    total_cpu = cpu.stop()
    (out.parent / f"{out.name}.log").write_text("".join(log))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}; see {out}.log")
    summary = json.loads((out / "summary.json").read_text())
    return {
        "events": [(name, found.get(name)) for name, _ in events],
        "wall": wall,
        "cpu": total_cpu,
        "load": load,
        "accuracy": summary["personalized"]["last"]["mean"],
        "rounds": (out / "rounds.jsonl").read_text(),
    }


# --------------------------------------------------------------------------- ingredients
INGREDIENTS = {
    "python + import torch": "import torch",
    "python + import flwr.simulation": "import flwr.simulation",
    "python + import the ClientApp (torch, flwr, pflarena)": "import pflarena.client.app",
    "python + build digits over 10 clients (flwr-datasets, scikit-learn)": (
        "from pflarena.core.federation import FederationSpec, build_federation;"
        "build_federation(FederationSpec(dataset='digits', num_clients=10, alpha=0.5))"
    ),
    "python + ray.init() + ray.shutdown() (Ray's daemons included)": (
        "import ray; ray.init(include_dashboard=False, logging_level='WARNING'); ray.shutdown()"
    ),
}


def ingredient(code: str) -> tuple[float, float]:
    start = time.time()
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    cpu = TreeCPU(proc.pid, period=0.1)
    proc.wait()
    return time.time() - start, cpu.stop()


# --------------------------------------------------------------------------- sweep
def sweep_comparison(work: Path, strategies: list[str]) -> dict:
    """The main job's strategies for one round: separate `pflarena run`s, then one sweep."""
    main_job = ["--preset", "digits-main", "--num-rounds", "1", "--quiet"]
    load = os.getloadavg()[0]
    start = time.time()
    for strategy in strategies:
        subprocess.run(
            [*PFLARENA, "run", *main_job, "--strategy", strategy, "--output-dir",
             str(work / "separate" / strategy)],
            check=True, stdout=subprocess.DEVNULL, cwd=work,
        )  # fmt: skip
    separate = time.time() - start
    start = time.time()
    subprocess.run(
        [*PFLARENA, "sweep", "--preset", "digits-main", "--set", "num-rounds=1",
         "--strategies", ",".join(strategies), "--out", str(work / "sweep"), "--quiet"],
        check=True, stdout=subprocess.DEVNULL, cwd=work,
    )  # fmt: skip
    swept = time.time() - start
    same = all(
        _comparable(work / "separate" / s / "rounds.jsonl")
        == _comparable(next((work / "sweep").rglob(f"{s}/**/rounds.jsonl")))
        for s in strategies
    )
    return {"separate": separate, "sweep": swept, "load": load, "identical": same}


def _comparable(path: Path) -> list[dict]:
    return comparable_rounds([json.loads(line) for line in path.read_text().splitlines()])


# --------------------------------------------------------------------------- report
def _phase_table(runs: list[dict], events: list[tuple[str, str]]) -> list[str]:
    rows = ["| phase ends when | at s (each run) | phase s (median) |", "|---|---|---|"]
    previous = [0.0] * len(runs)
    for index, (name, _) in enumerate(events):
        ats = [run["events"][index][1] for run in runs]
        phases = [at - prev for at, prev in zip(ats, previous, strict=True) if at is not None]
        rows.append(
            f"| {name} | {' / '.join('—' if at is None else f'{at:.1f}' for at in ats)} "
            f"| {statistics.median(phases):.1f} |"
            if phases
            else f"| {name} | — | — |"
        )
        previous = [at if at is not None else prev for at, prev in zip(ats, previous, strict=True)]
    walls = [run["wall"] for run in runs]
    tails = [w - p for w, p in zip(walls, previous, strict=True)]
    rows.append(
        f"| process exited | {' / '.join(f'{w:.1f}' for w in walls)} "
        f"| {statistics.median(tails):.1f} |"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="pairs of runs (default 2)")
    parser.add_argument("--sweep", action="store_true", help="also time the sweep")
    parser.add_argument("--output", default=str(ROOT / "benchmarks/results/startup.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflarena-startup-"))
    before: list[dict] = []
    after: list[dict] = []
    for index in range(args.repeats):
        before.append(
            timed_run(["run", *JOB, "--superlink"], SUPERLINK_EVENTS, work / f"superlink{index}")
        )
        after.append(timed_run(["run", *JOB], RUNTIME_EVENTS, work / f"runtime{index}"))
        print(
            f"pair {index}: superlink {before[-1]['wall']:.1f}s, runtime {after[-1]['wall']:.1f}s"
        )
    identical = all(
        _comparable(work / f"{kind}{i}" / "rounds.jsonl")
        == _comparable(work / "superlink0" / "rounds.jsonl")
        for kind in ("superlink", "runtime")
        for i in range(args.repeats)
    )
    ingredients = {name: ingredient(code) for name, code in INGREDIENTS.items()}
    sweep = (
        sweep_comparison(work, ["local", "fedavg", "fedavg-ft", "fedprox", "ditto", "pfedgt"])
        if args.sweep
        else None
    )

    median = statistics.median
    loads = ", ".join(f"{run['load']:.1f}" for run in before + after)
    lines = [
        "# Start-up: `pflarena run` through a SuperLink against Flower's runtime started by pflarena",
        "",
        f"Command: `python benchmarks/startup.py --repeats {args.repeats}"
        f"{' --sweep' if args.sweep else ''}`",
        "",
        f"Job: `pflarena run {' '.join(JOB)}` (2 actors, one CPU each). Machine: "
        f"{platform.machine()}, {os.cpu_count()} cores, **shared with other jobs**: load "
        f"average {loads} at the start of "
        "each run, so wall times include that load and only the side-by-side ratios "
        "and CPU seconds carry over to an idle machine.",
        "",
        "| | SuperLink + `flwr run` (before) | pflarena's runtime (after) | after / before |",
        "|---|---|---|---|",
        f"| wall s, median | {median(r['wall'] for r in before):.1f} "
        f"| {median(r['wall'] for r in after):.1f} "
        f"| {median(r['wall'] for r in after) / median(r['wall'] for r in before):.2f} |",
        f"| CPU s of the whole process tree, median | {median(r['cpu'] for r in before):.1f} "
        f"| {median(r['cpu'] for r in after):.1f} "
        f"| {median(r['cpu'] for r in after) / median(r['cpu'] for r in before):.2f} |",
        f"| personalized accuracy after round 1 | {before[0]['accuracy']:.4f} "
        f"| {after[0]['accuracy']:.4f} | |",
        "",
        f"`rounds.jsonl` identical (but for wall-clock fields) across all {2 * args.repeats} "
        f"runs: {'yes' if identical else '**no**'}.",
        "",
        "## Before: phases of `pflarena run --superlink`",
        "",
        *_phase_table(before, SUPERLINK_EVENTS),
        "",
        "## After: phases of `pflarena run`",
        "",
        *_phase_table(after, RUNTIME_EVENTS),
        "",
        "## Ingredients alone (a fresh process each, same machine, same load)",
        "",
        "| what | wall s | CPU s |",
        "|---|---|---|",
        *[f"| {name} | {wall:.1f} | {cpu:.1f} |" for name, (wall, cpu) in ingredients.items()],
    ]
    if sweep:
        lines += [
            "",
            "## A sweep pays the start-up once",
            "",
            f"The main job's six strategies for one round (`--preset digits-main --num-rounds 1`), "
            f"load average {sweep['load']:.1f}:",
            "",
            "| | wall s |",
            "|---|---|",
            f"| six `pflarena run` calls | {sweep['separate']:.1f} |",
            f"| one `pflarena sweep` | {sweep['sweep']:.1f} |",
            f"| ratio | {sweep['sweep'] / sweep['separate']:.2f} |",
            "",
            f"Each strategy's `rounds.jsonl` identical in both: "
            f"{'yes' if sweep['identical'] else '**no**'}.",
        ]
    Path(args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nlogs and runs: {work}")


if __name__ == "__main__":
    main()
