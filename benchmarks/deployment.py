"""A deployed round against the same round simulated, where an exchange's time goes, and what
an idle deployment costs.

The job: FedAvg on ``digits`` (IID over N clients, default 3, as shard files), every client
trains every round and every round is evaluated (a round is two exchanges, train and
evaluate). In one run of this script, on the same shards and run config:

* ``pflarena run --shards-dir --engine inprocess`` (the simulated round);
* a loopback deployment (:class:`pflarena.deploy.local.LocalDeployment`: a SuperLink and one
  SuperNode per shard on 127.0.0.1, the warm executor, ``flwr run``) with Flower's waits (the
  SuperNode's fixed 3 s after an empty pull and 1 s pull back-off, the executor's fixed 1 s
  task poll: what ``local-deploy`` ran before its waits followed the work) and each array
  sent as Flower's own objects (``PFLARENA_PACK_ARRAYS=0``);
* the same deployment with waits that follow the work (:mod:`pflarena.deploy.waits`), each
  array sent as Flower's own objects (``PFLARENA_PACK_ARRAYS=0``);
* the same with ``local-deploy``'s defaults: waits that follow the work and each record's
  arrays packed into one object (:mod:`pflarena.core.packing`).

It reports the median round time over rounds 2.. for each, the deployments' difference to the
simulated round, whether their evaluations equal the simulation's, and, from the processes'
own timestamped log lines (``PFLARENA_TRACE=1``), where each exchange's time went
(:mod:`exchange_phases`). ``--idle`` measures instead what idle SuperNodes cost: their polls
per second (counted by the pollers themselves), their CPU and the SuperLink's.

Usage::

    python benchmarks/deployment.py --clients 3 --rounds 4      # writes benchmarks/results/deployment.md
    python benchmarks/deployment.py --clients 10 --rounds 4 --append
    python benchmarks/deployment.py --idle --clients 10 --seconds 60 --append
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exchange_phases import phase_table, read_timeline  # noqa: E402

from pflarena.core.config import parse_run_config, toml_value  # noqa: E402
from pflarena.core.federation import build_federation  # noqa: E402
from pflarena.core.shard_format import write_shards  # noqa: E402
from pflarena.deploy.executor import ACTIVE_POLL_ENV  # noqa: E402
from pflarena.deploy.local import CONNECTION, LocalDeployment  # noqa: E402
from pflarena.deploy.waits import TRACE_REPORT_S  # noqa: E402
from pflarena.server.polling import PACK_ENV  # noqa: E402
from pflarena.server.results import read_rounds  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "deployment.md"
PFLARENA = [sys.executable, "-m", "pflarena.cli"]
TICKS = os.sysconf("SC_CLK_TCK")
TRACE = {"PFLARENA_TRACE": "1"}
#: Flower's waits: the SuperNode's (no --active-poll) and a fixed 1 s executor task poll.
FLOWER_WAITS = {"active_poll": None, "env": TRACE | {ACTIVE_POLL_ENV: "1.0"}}
#: ... and each array sent as Flower's own objects: Flower's deployment as it comes.
FLOWER = {"active_poll": None, "env": FLOWER_WAITS["env"] | {PACK_ENV: "0"}}
FOLLOWING = {"env": TRACE}  # local-deploy's defaults
UNPACKED = {"env": TRACE | {PACK_ENV: "0"}}  # the same, arrays as Flower's objects
#: The deployments compared, by the row name that follows "deployment, ".
SETTINGS = {
    "Flower's waits, per-array objects": FLOWER,
    "waits that follow the work, per-array objects": UNPACKED,
    "waits that follow the work, packed arrays": FOLLOWING,
}
#: How long the pollers stay fast after a message (local-deploy's and the executor's default).
WINDOW_S = 30.0


def job(shards: Path, clients: int, rounds: int, out: Path) -> dict[str, Any]:
    return {
        "strategy": "fedavg",
        "shards-dir": str(shards),
        "num-clients": clients,
        "num-rounds": rounds,
        "eval-every": 1,
        "fraction-train": 1.0,
        "round-timeout": 600.0,
        "output-dir": str(out),
    }


def simulate(shards: Path, clients: int, rounds: int, out: Path) -> list[dict]:
    args = [f"--{k}={v}" for k, v in job(shards, clients, rounds, out).items()]
    subprocess.run(
        [*PFLARENA, "run", *args, "--engine", "inprocess", "--quiet"], check=True, cwd=out.parent
    )
    return read_rounds(out / "rounds.jsonl")


def deploy(shards: list[Path], rounds: int, root: Path, **settings: Any) -> dict[str, Any]:
    dep = LocalDeployment(root, shards, **settings)
    try:
        dep.start()
        time.sleep(3.0)  # the executors' imports are over
        out = root / "run"
        overrides = root / "run-config.toml"
        values = job(shards[0].parent, len(shards), rounds, out)
        overrides.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()))
        stream = root / "flwr-run.log"
        with open(stream, "wb") as log:
            subprocess.run(
                ["flwr", "run", str(dep.approved_app()), CONNECTION, "--run-config",
                 str(overrides), "--stream"],
                env=dep.cli_env(), cwd=dep.cli_home, stdout=log, stderr=subprocess.STDOUT,
                check=True,
            )  # fmt: skip
        summary = json.loads((out / "summary.json").read_text())
        if summary["status"] != "completed":
            raise RuntimeError(f"deployment run failed: {summary.get('error')}")
        logs = root / "logs"
        nodes = [
            (logs / f"supernode-{i}.log", logs / f"executor-supernode-{i}.log")
            for i in range(len(shards))
        ]
        return {
            "rounds": read_rounds(out / "rounds.jsonl"),
            "timeline": read_timeline(stream, nodes),
        }
    finally:
        dep.stop()


def round_times(rounds: list[dict]) -> list[float]:
    return [r["round_time_s"] for r in rounds if r["round"] >= 2]


def evaluations(rounds: list[dict]) -> list[float]:
    return [r["evaluation"]["personalized"]["mean"] for r in rounds if r.get("evaluation")]


# --------------------------------------------------------------------------- idle cost
def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def _polls(log: Path, since: float, until: float, name: str) -> float:
    """Empty polls per second counted by a tracing poller (its lines ``pflarena <name>: N
    empty polls in T s``, each covering the T s before it) over the reports that fall in
    ``since``..``until`` (wall time) and end within ``TRACE_REPORT_S`` after it."""
    from exchange_phases import _lines

    count = seconds = 0.0
    for when, text in _lines(log):
        match = re.search(rf"pflarena {name}: (\d+) empty polls in ([0-9.]+) s", text)
        if match and since < when - float(match.group(2)) and when < until + TRACE_REPORT_S:
            count += int(match.group(1))
            seconds += float(match.group(2))
    return count / seconds if seconds else float("nan")


def idle_cost(shards: list[Path], root: Path, seconds: float) -> list[str]:
    """Per setting and period: polls per second and CPU (cores) per SuperNode (its executor
    included), and the SuperLink's, with no run: right after the start (the SuperNodes'
    and executors' first :data:`WINDOW_S`, which they spend as after a message) and once idle
    (``seconds`` from the end of that window and its back-off on)."""
    rows = [
        "| setting | period | SuperNodes | SuperNode polls/s | executor polls/s | cores per "
        "SuperNode (node + executor) | SuperLink cores |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, settings in (
        ("Flower's waits", FLOWER_WAITS),
        ("waits that follow the work", FOLLOWING),
    ):
        dep = LocalDeployment(root / f"idle-{len(rows)}", shards, **settings)
        try:
            dep.start()
            started = time.time()
            nodes = [
                p.pid for p in (*dep.supernodes, *dep.executors) if p.name != "executor-superlink"
            ]
            link = [dep.superlink.pid] if dep.superlink else []
            # The executors' imports end a few seconds after their start.
            periods = (("first 30 s after a message", 8.0, WINDOW_S - 8.0),
                       ("idle", WINDOW_S + 10.0, seconds))  # fmt: skip
            for period, offset, length in periods:
                time.sleep(max(0.0, started + offset - time.time()))
                since, cpu_nodes, cpu_link = time.time(), _cpu(nodes), _cpu(link)
                time.sleep(length)
                spent = time.time() - since
                per_node = (_cpu(nodes) - cpu_nodes) / spent / len(shards)
                superlink = (_cpu(link) - cpu_link) / spent
                time.sleep(TRACE_REPORT_S + 1.0)  # the period's last poll reports are written
                logs = dep.root / "logs"
                node_polls = statistics.mean(
                    _polls(logs / f"supernode-{i}.log", since, since + spent, "supernode")
                    for i in range(len(shards))
                )
                executor_polls = statistics.mean(
                    _polls(logs / f"executor-supernode-{i}.log", since, since + spent, "executor")
                    for i in range(len(shards))
                )
                rows.append(
                    f"| {name} | {period} | {len(shards)} | {node_polls:.2f} | "
                    f"{executor_polls:.2f} | {per_node:.4f} | {superlink:.4f} |"
                )
        finally:
            dep.stop()
    return rows


# --------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--idle", action="store_true", help="measure the idle cost instead")
    parser.add_argument("--seconds", type=float, default=60.0, help="idle measurement length")
    parser.add_argument("--append", action="store_true", help="append to the results file")
    parser.add_argument("--output", default=str(RESULTS))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflarena-deploy-bench-"))
    cfg = parse_run_config(
        {"num-clients": str(args.clients), "dataset": "digits", "partition": "iid"}
    )
    spec = cfg.federation_spec()
    shards = write_shards(build_federation(spec), work / "shards", spec)
    command = f"python benchmarks/deployment.py {' '.join(sys.argv[1:])}"
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, flwr {__import__('flwr').__version__}, "
        f"torch {__import__('torch').__version__}"
    )
    if args.idle:
        load = os.getloadavg()[0]
        rows = idle_cost(shards, work, args.seconds)
        lines = [
            f"## What idle SuperNodes cost ({args.clients} SuperNodes)",
            "",
            f"Command: `{command}`. {args.clients} SuperNodes (warm executors) and the "
            f"SuperLink on 127.0.0.1, no run, {args.seconds:g} s; polls counted by the pollers "
            f"(`PFLARENA_TRACE=1`), CPU from /proc. {machine}; load average {load:.1f} before.",
            "",
            *rows,
        ]
    else:
        loads = [os.getloadavg()[0]]
        sim = simulate(work / "shards", args.clients, args.rounds, work / "sim")
        loads.append(os.getloadavg()[0])
        runs = {}
        for name, settings in SETTINGS.items():
            slug = re.sub(r"[^a-z]+", "-", name.lower()).strip("-")
            runs[f"deployment, {name}"] = deploy(shards, args.rounds, work / slug, **settings)
            loads.append(os.getloadavg()[0])
        simulated = statistics.median(round_times(sim))
        lines = [
            f"## {args.clients} SuperNodes, {args.rounds} rounds",
            "",
            f"Command: `{command}`. FedAvg on digits, IID over {args.clients} clients, every "
            "client trains every round, every round evaluated; simulation: `pflarena run "
            "--shards-dir --engine inprocess`; deployments: `LocalDeployment` (SuperLink and "
            "SuperNodes on 127.0.0.1, warm executors, `flwr run`). "
            f"{machine}; load average (1 min) {', '.join(f'{x:.1f}' for x in loads)} before and "
            "between the runs.",
            "",
            "| run | round s (median of rounds 2..) | rounds 2.. | deployed − simulated s | evaluations equal the simulation's |",
            "|---|---|---|---|---|",
            f"| simulation, in-process | {simulated:.2f} | "
            f"{' / '.join(f'{t:.2f}' for t in round_times(sim))} | — | — |",
        ]
        for name, run in runs.items():
            times = round_times(run["rounds"])
            equal = all(
                abs(a - b) < 1e-9
                for a, b in zip(evaluations(run["rounds"]), evaluations(sim), strict=True)
            )
            lines.append(
                f"| {name} | {statistics.median(times):.2f} | {' / '.join(f'{t:.2f}' for t in times)} "
                f"| {statistics.median(times) - simulated:+.2f} | {'yes' if equal else 'NO'} |"
            )
        lines += [
            "",
            "Where each exchange's time went (ms, median over the run's messages, max in "
            "brackets; `exchange_phases.py` defines the phases; `SuperNode pull` counts from the "
            "push's start, so it overlaps `ServerApp push`):",
            "",
            *phase_table({name: run["timeline"] for name, run in runs.items()}),
        ]
    text = "\n".join(lines) + "\n"
    output = Path(args.output)
    if args.append and output.exists():
        text = output.read_text().rstrip("\n") + "\n\n" + text
    else:
        text = "# Deployed rounds against simulated ones\n\n" + text
    output.write_text(text)
    print("\n".join(lines))
    print(f"work under {work}")


if __name__ == "__main__":
    main()
