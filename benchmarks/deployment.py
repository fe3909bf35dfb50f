"""Where a deployment round's time goes: the main job's FedAvg as a loopback deployment of
one SuperNode per client, against the same run in Flower's simulation.

The job: FedAvg on ``digits``, Dirichlet(0.1) over 10 clients (the main job's data), as
shard files; every client trains every round. It runs

* in simulation (``pflarena run --shards-dir``: Flower's simulation runtime, Ray actors);
* as a deployment (:class:`pflarena.server.deploy.LocalDeployment`: a SuperLink and one
  SuperNode per shard on 127.0.0.1, the app submitted with ``flwr run``), once with Flower's
  defaults (the SuperExecs poll for tasks every 1 s, the ServerApp checks for replies every
  3 s) and once with the settings pflarena uses (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1``,
  replies checked every 0.1 s: :mod:`pflarena.server.polling`).

Per round it reads ``rounds.jsonl``: the train phase's wall time (``train_time_s``) and the
clients' own solver time (``client_time_s``). It also times what every deployment message
costs before the solver starts: a fresh Python process importing Flower's ClientApp runtime,
torch and pflarena's ClientApp (Flower 1.41 starts one ``flwr-clientapp`` process per
message). Results go to ``benchmarks/results/deployment.md``.

Usage::

    python benchmarks/deployment.py --rounds 2
    python benchmarks/deployment.py --idle     # appends the idle cost of the task poll
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pflarena.core.federation import FederationSpec, build_federation, write_shards
from pflarena.server.appdir import flwr_run_dir
from pflarena.server.cli import _toml_value
from pflarena.server.deploy import CONNECTION, LocalDeployment
from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
PFLARENA = [sys.executable, "-m", "pflarena.server.cli"]
VARIANTS = {
    "Flower's defaults": {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "1.0", "PFLARENA_REPLY_POLL_S": "3"},
    "pflarena's settings": {
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
        "PFLARENA_REPLY_POLL_S": "0.1",
    },
}


def job(shards: Path, rounds: int, out: Path) -> dict[str, Any]:
    return {
        "strategy": "fedavg",
        "shards-dir": str(shards),
        "num-clients": 10,
        "num-rounds": rounds,
        "eval-every": rounds,
        "fraction-train": 1.0,
        "round-timeout": 600.0,
        "output-dir": str(out),
    }


def simulate(shards: Path, rounds: int, out: Path) -> list[dict[str, Any]]:
    args = [f"--{k}={v}" for k, v in job(shards, rounds, out).items()]
    subprocess.run([*PFLARENA, "run", *args, "--quiet"], check=True, cwd=out.parent)
    return read_rounds(out / "rounds.jsonl")


def deploy(
    shards: list[Path], rounds: int, root: Path, env: dict[str, str]
) -> tuple[list[dict[str, Any]], float]:
    dep = LocalDeployment(root, shards, env=env)
    start = time.monotonic()
    try:
        dep.start()
        up = time.monotonic() - start
        out = root / "run"
        overrides = root / "run-config.toml"
        overrides.write_text(
            "".join(
                f"{k} = {_toml_value(v)}\n" for k, v in job(shards[0].parent, rounds, out).items()
            )
        )
        with open(root / "flwr-run.log", "wb") as log:
            subprocess.run(
                ["flwr", "run", str(flwr_run_dir()), CONNECTION, "--run-config", str(overrides), "--stream"],
                env=dep.cli_env(), cwd=dep.cli_home, stdout=log, stderr=subprocess.STDOUT, check=True,
            )  # fmt: skip
        summary = json.loads((out / "summary.json").read_text())
        if summary["status"] != "completed":
            raise RuntimeError(f"deployment run failed: {summary.get('error')}")
        return read_rounds(out / "rounds.jsonl"), up
    finally:
        dep.stop()


def process_start_cost(repeats: int = 3) -> float:
    """Median wall time of a fresh process importing what a ClientApp process imports."""
    code = "import flwr.supernode.cli.flwr_clientapp, torch, pflarena.client.app"
    times = []
    for _ in range(repeats):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def _cpu_seconds(pids: set[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / os.sysconf("SC_CLK_TCK")


def idle_cost(output: Path, seconds: float = 30.0) -> None:
    """CPU that an idle 10-SuperNode loopback deployment burns, per task poll interval;
    appended to ``output``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from processes import descendants

    work = Path(tempfile.mkdtemp(prefix="pflarena-deploy-idle-"))
    spec = FederationSpec(
        dataset="digits", num_clients=10, partition="dirichlet", alpha=0.1, seed=0
    )
    shards = write_shards(build_federation(spec), work / "shards", spec)
    rows = []
    for poll in ("1.0", "0.1"):
        dep = LocalDeployment(work / f"poll-{poll}", shards, task_poll=float(poll))
        try:
            dep.start()
            time.sleep(5)
            pids = {p.pid for p in dep.processes()}
            pids |= descendants(pids)
            before, t0 = _cpu_seconds(pids), time.monotonic()
            time.sleep(seconds)
            used = (_cpu_seconds(pids) - before) / (time.monotonic() - t0)
            rows.append(f"| {poll} | {len(pids)} | {used:.2f} | {used / 10:.3f} |")
        finally:
            dep.stop()
    text = [
        "",
        "## What the task poll costs when nothing happens",
        "",
        f"Command: `python benchmarks/deployment.py --idle` (10 SuperNodes and the SuperLink on "
        f"127.0.0.1, no run, CPU of all their processes over {seconds:.0f} s; load average "
        f"{os.getloadavg()[0]:.1f}).",
        "",
        "| FLWR_SUPEREXEC_TASK_POLL_INTERVAL s | processes | cores busy | per SuperNode |",
        "|---|---|---|---|",
        *rows,
        "",
        "Every SuperExec asks its SuperNode's (or the SuperLink's) Runtime API for a task at "
        "this interval, an HTTP request on both sides. One SuperNode per host or GPU pays a few "
        "hundredths of a core for answering 0.9 s sooner per exchange; ten on 2 cores pay a "
        "large share of the machine, which is why `pflarena local-deploy` keeps Flower's 1 s "
        "(`--task-poll` changes it) and the container images use 0.1 s.",
    ]
    with open(output, "a") as handle:
        handle.write("\n".join(text) + "\n")
    print("\n".join(text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "deployment.md"))
    parser.add_argument(
        "--idle", action="store_true", help="only measure an idle deployment's CPU, appended"
    )
    args = parser.parse_args()
    if args.idle:
        idle_cost(Path(args.output))
        return
    work = Path(tempfile.mkdtemp(prefix="pflarena-deploy-bench-"))
    spec = FederationSpec(
        dataset="digits", num_clients=10, partition="dirichlet", alpha=0.1, seed=0
    )
    shards = write_shards(build_federation(spec), work / "shards", spec)
    loads = [os.getloadavg()[0]]

    t0 = time.monotonic()
    sim = simulate(work / "shards", args.rounds, work / "sim")
    sim_wall = time.monotonic() - t0
    loads.append(os.getloadavg()[0])
    deployed: dict[str, tuple[list[dict[str, Any]], float]] = {}
    for name, env in VARIANTS.items():
        deployed[name] = deploy(shards, args.rounds, work / name.split()[0].strip("'"), env)
        loads.append(os.getloadavg()[0])
    start_cost = process_start_cost()

    def train_times(rounds: list[dict[str, Any]]) -> list[float]:
        return [r["train_time_s"] for r in rounds[1:]]

    def client_times(rounds: list[dict[str, Any]]) -> list[float]:
        return [r["train"]["client_time_s"] for r in rounds[1:]]

    sim_train = statistics.mean(train_times(sim))
    lines = [
        "# Deployment rounds against simulation rounds",
        "",
        f"Command: `python benchmarks/deployment.py --rounds {args.rounds}`",
        "",
        f"Job: FedAvg on digits, Dirichlet(0.1), 10 clients, every client trains every round, "
        f"{args.rounds} rounds, evaluation at rounds 0 and {args.rounds}. Simulation: `pflarena "
        "run --shards-dir` (2 Ray actors, one CPU each). Deployment: a SuperLink and 10 "
        f"SuperNodes on 127.0.0.1, one shard each, `flwr run`. Machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, shared with other jobs: load average (1 min) "
        f"{', '.join(f'{x:.1f}' for x in loads)} before/between the runs, so wall times carry "
        "that load.",
        "",
        "| | train phase s, per round | clients' solver s, summed per round | phase / simulation's |",
        "|---|---|---|---|",
        f"| simulation | {' / '.join(f'{t:.1f}' for t in train_times(sim))} | "
        f"{' / '.join(f'{t:.2f}' for t in client_times(sim))} | 1.00 |",
    ]
    for name, (rounds, _) in deployed.items():
        mean = statistics.mean(train_times(rounds))
        lines.append(
            f"| deployment, {name} | {' / '.join(f'{t:.1f}' for t in train_times(rounds))} | "
            f"{' / '.join(f'{t:.2f}' for t in client_times(rounds))} | {mean / sim_train:.1f} |"
        )
    lines += [
        "",
        f"Simulation wall time, start-up included: {sim_wall:.0f} s. Deployment start "
        "(SuperLink healthy, 10 SuperNodes online): "
        + ", ".join(f"{name} {up:.0f} s" for name, (_, up) in deployed.items())
        + ".",
        "",
        f"A fresh process importing Flower's ClientApp runtime, torch and pflarena's ClientApp: "
        f"{start_cost:.1f} s (median of 3). Flower 1.41 starts one such process per message, so "
        f"a train phase of 10 clients pays 10 of them ({10 * start_cost:.0f} s of one core) "
        "before any training.",
    ]
    cores = os.cpu_count() or 1
    names = list(deployed)
    per_client = [statistics.mean(client_times(sim)) / 10] + [
        statistics.mean(client_times(rounds)) / 10 for rounds, _ in deployed.values()
    ]
    phase = [sim_train] + [statistics.mean(train_times(r)) for r, _ in deployed.values()]
    # Worst-case waits per exchange: the ServerApp's reply check, the executor's task poll,
    # the SuperNode's sleep after an empty pull (3 s, fixed in flwr 1.41).
    waits = [0.1] + [
        float(VARIANTS[n]["PFLARENA_REPLY_POLL_S"])
        + float(VARIANTS[n]["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"])
        + 3.0
        for n in names
    ]
    lines += [
        "",
        f"Where a train phase goes ({cores} cores, 10 clients; means over the rounds):",
        "",
        "| | simulation | " + " | ".join(f"deployment, {n}" for n in names) + " |",
        "|---|---|" + "---|" * len(names),
        "| train phase, wall s | " + " | ".join(f"{v:.1f}" for v in phase) + " |",
        "| a client's solver, wall s (cold process, sharing the cores, in deployment) | "
        + " | ".join(f"{v:.2f}" for v in per_client)
        + " |",
        "| ClientApp process starts: 10 x the import above, CPU s | 0 (actors stay) | "
        + " | ".join(f"{10 * start_cost:.0f}" for _ in names)
        + " |",
        "| polling, worst case per exchange, s | " + " | ".join(f"{v:.1f}" for v in waits) + " |",
    ]
    ratios = [p / phase[0] for p in phase[1:]]
    lines += [
        "",
        "## Reading",
        "",
        f"Target, a deployment round within 2x a simulation round: **not reached** "
        f"({', '.join(f'{r:.0f}x' for r in ratios)} here). Flower 1.41 starts a fresh "
        f"`flwr-clientapp` process for every message (no ClientApp outlives a message), and its "
        f"imports alone take {start_cost:.1f} s here, so a train phase of 10 clients needs "
        f"{10 * start_cost:.0f} CPU-seconds before any training on {cores} cores, and each "
        "solver then runs cold (torch's first calls, data read from the shard) while sharing "
        "the cores with nine others; the simulation's two actors import once and stay warm "
        f"(its round 2: {train_times(sim)[-1]:.1f} s). The polling settings remove at most "
        f"{waits[1] - waits[2]:.1f} s of waiting per exchange "
        f"({waits[1]:.1f} s -> {waits[2]:.1f} s worst case); under this load that is within "
        "the difference between two runs of the same deployment. What is left to wait is the "
        "SuperNode's 3 s sleep after an empty pull, which flwr 1.41 does not let one set.",
        "",
        "With a core (or host, or GPU) per SuperNode, as a real deployment has, the process "
        "starts run side by side: a phase then costs about one start "
        f"(~{start_cost:.0f} s here, less on an idle core), the solver, and up to "
        f"{waits[2]:.1f} s of polling, against the simulation's round of "
        f"{phase[0]:.1f} s; still above 2x for this small model, whose training takes well "
        "under a second. Dead-node detection (a ~24 s heartbeat, 60 s patience) has no "
        "setting in flwr 1.41.",
    ]
    (work / "measurements.json").write_text(
        json.dumps({"loads": loads, "start_cost": start_cost, "phase": phase, "waits": waits})
    )
    Path(args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten to {args.output}; work files in {work}")


if __name__ == "__main__":
    main()
