"""Deployment rounds against simulation rounds, and what each deployment message costs.

The job: FedAvg on ``digits``, Dirichlet(0.1) over N clients (default 10, the main job's
data), as shard files; every client trains every round, evaluation at round 0 and the last.
The same shards and run config go through

* ``pflarena run --shards-dir`` with ``--engine ray`` (Flower's simulation runtime, one CPU
  per Ray actor) and ``--engine inprocess``;
* a loopback deployment (:class:`pflarena.deploy.local.LocalDeployment`: a SuperLink and one
  SuperNode per shard on 127.0.0.1, the app submitted with ``flwr run``), with

  - Flower's stock executor (a fresh ``flwr-clientapp`` process per message),
  - pflarena's warm executor (:mod:`pflarena.deploy.executor`),
  - the warm executor with the SuperNode's wait after an empty pull set to ``--idle-poll``
    (``pflarena supernode``; Flower's is a fixed 3 s);

  every deployment with the executors polling for tasks every 0.1 s and the ServerApp checking
  for replies every 0.1 s, as the container images do.

Per run it reports the train phase's wall time per round (``train_time_s`` of
``rounds.jsonl``) and, for the deployments, the CPU-seconds of the processes that served the
messages (every ClientApp process or forked child, summed from ``/proc``: their executors'
reaped children plus those still there) per message, next to the CPU the clients' solvers
report for their own work (``client_cpu_s``); the executors' own idle CPU is reported apart.
``--idle`` measures what an idle deployment costs per SuperNode at each poll setting.

Usage::

    python benchmarks/deployment.py --rounds 3            # writes benchmarks/results/deployment.md
    python benchmarks/deployment.py --idle --seconds 30   # appends the idle cost
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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pflarena.core.config import parse_run_config, toml_value
from pflarena.core.federation import build_federation, write_shards
from pflarena.deploy.local import CONNECTION, LocalDeployment
from pflarena.runtime.appdir import flwr_run_dir
from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
PFLARENA = [sys.executable, "-m", "pflarena.cli"]
TICKS = os.sysconf("SC_CLK_TCK")
#: What the deployments share: Flower's task poll and pflarena's reply poll at 0.1 s.
POLL_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1", "PFLARENA_REPLY_POLL_S": "0.1"}


def job(shards: Path, clients: int, rounds: int, out: Path) -> dict[str, Any]:
    return {
        "strategy": "fedavg",
        "shards-dir": str(shards),
        "num-clients": clients,
        "num-rounds": rounds,
        "eval-every": rounds,
        "fraction-train": 1.0,
        "round-timeout": 600.0,
        "output-dir": str(out),
    }


def simulate(engine: str, shards: Path, clients: int, rounds: int, out: Path) -> list[dict]:
    args = [f"--{k}={v}" for k, v in job(shards, clients, rounds, out).items()]
    subprocess.run(
        [*PFLARENA, "run", *args, "--engine", engine, "--quiet"], check=True, cwd=out.parent
    )
    return read_rounds(out / "rounds.jsonl")


# --------------------------------------------------------------------------- CPU from /proc
def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _cpu(pids: list[int]) -> float:
    """utime + stime (s) of the processes."""
    return sum((int(s[11]) + int(s[12])) / TICKS for p in pids if (s := _stat(p)))


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _descendants(pids: list[int]) -> list[int]:
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        kids = _children(pid)
        out += kids
        todo += kids
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@dataclass
class ExecutorCpu:
    """CPU (s) of a deployment's ClientApp executors: ``own``, the executors' polling loops;
    ``messages``, the processes that served messages (reaped children of the executors, and
    those still there)."""

    own: float = 0.0
    messages: float = 0.0
    executors: list[int] = field(default_factory=list)

    @classmethod
    def read(cls, dep: LocalDeployment) -> ExecutorCpu:
        tops = [p.pid for p in dep.processes()]
        everything = tops + _descendants(tops)
        serverside = set(dep_superlink_side(dep))
        matches = {
            p for p in everything
            if p not in serverside and ("executor" in _cmdline(p) or "superexec" in _cmdline(p))
        }  # fmt: skip
        # a forked child keeps its parent's command line: the executors are the top matches
        executors = [p for p in matches if (s := _stat(p)) is None or int(s[1]) not in matches]
        cpu = cls(executors=executors)
        for pid in executors:
            stat = _stat(pid)
            if stat is None:
                continue
            cpu.own += (int(stat[11]) + int(stat[12])) / TICKS
            cpu.messages += (int(stat[13]) + int(stat[14])) / TICKS  # reaped children
            for child in _descendants([pid]):
                if (child_stat := _stat(child)) is not None:
                    cpu.messages += (int(child_stat[11]) + int(child_stat[12])) / TICKS
        return cpu


def dep_superlink_side(dep: LocalDeployment) -> list[int]:
    """The SuperLink and everything below it (its ServerApp executor and ServerApps)."""
    if dep.superlink is None:
        return []
    return [dep.superlink.pid, *_descendants([dep.superlink.pid])]


def _messages(rounds: list[dict]) -> int:
    sent = sum(e["sent"] for r in rounds for e in r.get("exchanges", []))
    for record in rounds:
        evaluation = record.get("evaluation")
        if evaluation:
            sent += evaluation["personalized"]["num_clients"] + evaluation.get("failures", 0)
    return sent


def phases(logs: Path) -> dict[str, list[float]]:
    """The warm executors' per-message phase times (s), from their logs."""
    out: dict[str, list[float]] = {}
    for log in sorted(logs.glob("executor-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if " phases: " not in line:
                continue
            for name, value in re.findall(r"(\w+) ([0-9.]+)s", line.split(" phases: ", 1)[1]):
                out.setdefault(name, []).append(float(value))
    return out


def deploy(
    shards: list[Path],
    clients: int,
    rounds: int,
    root: Path,
    executor: str,
    idle_poll: float | None,
) -> dict[str, Any]:
    dep = LocalDeployment(
        root, shards, env=POLL_ENV, task_poll=0.1, executor=executor, idle_poll=idle_poll
    )
    start = time.monotonic()
    try:
        dep.start()
        up = time.monotonic() - start
        time.sleep(3.0)  # the executors' imports are over
        before = ExecutorCpu.read(dep)
        out = root / "run"
        overrides = root / "run-config.toml"
        overrides.write_text(
            "".join(
                f"{k} = {toml_value(v)}\n"
                for k, v in job(shards[0].parent, clients, rounds, out).items()
            )
        )
        t0 = time.monotonic()
        with open(root / "flwr-run.log", "wb") as log:
            subprocess.run(
                ["flwr", "run", str(flwr_run_dir()), CONNECTION, "--run-config", str(overrides), "--stream"],
                env=dep.cli_env(), cwd=dep.cli_home, stdout=log, stderr=subprocess.STDOUT, check=True,
            )  # fmt: skip
        wall = time.monotonic() - t0
        time.sleep(1.0)  # the last children are reaped
        after = ExecutorCpu.read(dep)
        summary = json.loads((out / "summary.json").read_text())
        if summary["status"] != "completed":
            raise RuntimeError(f"deployment run failed: {summary.get('error')}")
        recorded = read_rounds(out / "rounds.jsonl")
        return {
            "rounds": recorded,
            "up_s": up,
            "run_s": wall,
            "messages": _messages(recorded),
            "message_cpu_s": after.messages - before.messages,
            "executor_own_cpu_s": after.own - before.own,
            "phases": phases(root / "logs"),
        }
    finally:
        dep.stop()


def idle_cost(work: Path, shards: list[Path], seconds: float) -> list[str]:
    """Cores busy while a deployment of ``len(shards)`` SuperNodes waits for work."""
    rows = []
    settings = [
        ("flower", None, 1.0),
        ("flower", None, 0.1),
        ("warm", None, 0.1),
        ("warm", 0.2, 0.1),
    ]
    for executor, idle_poll, task_poll in settings:
        dep = LocalDeployment(
            work / f"idle-{executor}-{idle_poll}-{task_poll}",
            shards,
            task_poll=task_poll,
            executor=executor,
            idle_poll=idle_poll,
        )
        try:
            dep.start()
            time.sleep(5)
            pids = [p.pid for p in dep.processes()]
            pids += _descendants(pids)
            before, t0 = _cpu(pids), time.monotonic()
            time.sleep(seconds)
            used = (_cpu(pids) - before) / (time.monotonic() - t0)
            rows.append(
                f"| {executor} | {idle_poll if idle_poll else '3 (Flower)'} | {task_poll} | "
                f"{len(pids)} | {used:.2f} | {used / len(shards):.3f} |"
            )
        finally:
            dep.stop()
    return rows


def _fmt(values: list[float], digits: int = 1) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--idle-poll", type=float, default=0.2)
    parser.add_argument("--idle", action="store_true", help="only the idle cost, appended")
    parser.add_argument("--seconds", type=float, default=30.0, help="idle measurement length")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "deployment.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflarena-deploy-bench-"))
    cfg = parse_run_config(
        {
            "num-clients": str(args.clients),
            "dataset": "digits",
            "partition": "dirichlet",
            "alpha": "0.1",
        }
    )
    spec = cfg.federation_spec()
    shards = write_shards(build_federation(spec), work / "shards", spec)
    if args.idle:
        rows = idle_cost(work, shards, args.seconds)
        text = [
            "",
            "## What an idle deployment costs",
            "",
            f"Command: `python benchmarks/deployment.py --idle --seconds {args.seconds:g} "
            f"--clients {args.clients}` ({args.clients} SuperNodes and the SuperLink on "
            f"127.0.0.1, no run; CPU of all their processes over {args.seconds:g} s; load "
            f"average {os.getloadavg()[0]:.1f}).",
            "",
            "| executor | SuperNode wait after an empty pull, s | task poll, s | processes | cores busy | per SuperNode |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
        with open(args.output, "a") as handle:
            handle.write("\n".join(text) + "\n")
        print("\n".join(text))
        return

    loads = [os.getloadavg()[0]]
    runs: dict[str, dict[str, Any]] = {}
    for engine in ("ray", "inprocess"):
        t0 = time.monotonic()
        recorded = simulate(
            engine, work / "shards", args.clients, args.rounds, work / f"sim-{engine}"
        )
        runs[f"simulation, {engine}"] = {"rounds": recorded, "run_s": time.monotonic() - t0}
        loads.append(os.getloadavg()[0])
    variants = {
        "deployment, Flower's executor": ("flower", None),
        "deployment, warm executor": ("warm", None),
        f"deployment, warm executor, --idle-poll {args.idle_poll:g}": ("warm", args.idle_poll),
    }
    for name, (executor, idle_poll) in variants.items():
        root = work / name.replace(", ", "-").replace(" ", "_")
        runs[name] = deploy(shards, args.clients, args.rounds, root, executor, idle_poll)
        loads.append(os.getloadavg()[0])

    def train_times(run: dict[str, Any]) -> list[float]:
        return [r["train_time_s"] for r in run["rounds"][1:]]

    def solver_cpu(run: dict[str, Any]) -> float:
        return sum(r["train"]["client_cpu_s"] for r in run["rounds"][1:])

    ray_round = statistics.mean(train_times(runs["simulation, ray"]))
    lines = [
        "# Deployment rounds against simulation rounds",
        "",
        f"Command: `python benchmarks/deployment.py --rounds {args.rounds} --clients {args.clients} "
        f"--idle-poll {args.idle_poll:g}`",
        "",
        f"Job: FedAvg on digits, Dirichlet(0.1), {args.clients} clients, every client trains every "
        f"round, {args.rounds} rounds, evaluation at rounds 0 and {args.rounds}. Simulation: "
        "`pflarena run --shards-dir` (Ray: one CPU per actor; in-process). Deployment: a "
        f"SuperLink and {args.clients} SuperNodes on 127.0.0.1, one shard each, `flwr run`; "
        "task poll and reply poll 0.1 s. "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, flwr "
        f"{__import__('flwr').__version__}, torch {__import__('torch').__version__}; load "
        f"average (1 min) {', '.join(f'{x:.1f}' for x in loads)} before and between the runs: "
        "the machine was shared, so compare the rows of this table with each other only.",
        "",
        "| run | train phase s, rounds 1.. | mean / Ray simulation's | CPU s per message | of it the solver's | beyond the solver | executors' own CPU s | wall s (start-up excluded for deployments) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        times = train_times(run)
        ratio = statistics.mean(times) / ray_round
        if "messages" in run:
            per = run["message_cpu_s"] / run["messages"]
            solver = solver_cpu(run) / run["messages"]
            cpu = f"{per:.2f} | {solver:.2f} | {per - solver:.2f} | {run['executor_own_cpu_s']:.1f}"
        else:
            cpu = "— | — | — | —"
        lines.append(f"| {name} | {_fmt(times)} | {ratio:.2f} | {cpu} | {run['run_s']:.0f} |")
    lines += [
        "",
        "CPU per message counts every message of the run (train and evaluate); the solver's "
        "column spreads the train messages' solver CPU (`client_cpu_s`) over all of them.",
        "",
        "Where a warm child's wall time goes, per message (median / max, s; from the "
        "executors' logs): `pull` the message (waiting until the SuperNode holds its objects), "
        "`install` the FAB, `load` the app, `call` it, `push` the reply.",
        "",
        "| run | pull | install | load | call | push |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        if run.get("phases"):
            cells = [
                f"{statistics.median(v):.2f} / {max(v):.2f}"
                for v in (
                    run["phases"].get(k, [0.0]) for k in ("pull", "install", "load", "call", "push")
                )
            ]
            lines.append(f"| {name} | {' | '.join(cells)} |")
    text = "\n".join(lines) + "\n"
    Path(args.output).write_text(text)
    print(text)
    (work / "runs.json").write_text(
        json.dumps(
            {k: {kk: vv for kk, vv in v.items() if kk != "rounds"} for k, v in runs.items()},
            indent=2,
        )
    )
    print(f"runs under {work}")


if __name__ == "__main__":
    main()
