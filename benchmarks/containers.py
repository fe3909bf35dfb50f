"""The compose federation against ``pflarena run`` on the same shards: per-round wall time,
where each exchange's time goes, CPU, and the images' sizes.

The job: FedAvg on ``digits``, IID over 3 clients (the container tests' shards), every client
every round. It runs

* in-process, as ``pflarena run --shards-dir`` runs it (Flower's simulation runtime);
* as the compose federation ``pflarena compose --num-supernodes 3`` writes (SuperLink,
  ServerApp executor, three SuperNodes and their ClientApp executors, each a container),
  submitted with ``flwr run`` from the host through the published port: once as written
  (the SuperLink's state in a SQLite file on its volume) and once with its state in memory
  (``PFLARENA_SUPERLINK_DATABASE=:flwr-in-memory:``).

Every round trains every client and is evaluated (two exchanges). Per round it reads
``rounds.jsonl`` (``round_time_s``); the containers run with ``PFLARENA_TRACE=1`` and their
logs give the per-phase table of each exchange (``exchange_phases.py``). CPU:
the containers' cgroup CPU time (``cpuacct.usage``, cgroup v1, or ``cpu.stat``, v2) over the
run, against the CPU time of the ``pflarena run`` process and its children. The images must
exist (``make images``; ``--tag`` names them). Results go to ``benchmarks/results/containers.md``.

Usage::

    python benchmarks/containers.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exchange_phases import phase_table, read_timeline  # noqa: E402

from pflarena.core.config import toml_value
from pflarena.core.federation import FederationSpec, build_federation
from pflarena.core.shard_format import write_shards
from pflarena.deploy.compose import DATABASE_ENV, compose_files
from pflarena.deploy.images import TARGETS, image_name
from pflarena.runtime.appdir import flwr_run_dir
from pflarena.runtime.launch import simulation_env
from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
PFLARENA = [sys.executable, "-m", "pflarena.cli"]
NUM_CLIENTS = 3


def job(rounds: int, shards: str, out: str) -> dict[str, Any]:
    return {
        "strategy": "fedavg",
        "dataset": "digits",
        "partition": "iid",
        "seed": 0,
        "num-clients": NUM_CLIENTS,
        "num-rounds": rounds,
        "lr": 0.1,
        "local-epochs": 2,
        "fraction-train": 1.0,
        "eval-every": 1,
        "round-timeout": 600.0,
        "shards-dir": shards,
        "output-dir": out,
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def in_process(shards: Path, rounds: int, out: Path) -> tuple[list[dict[str, Any]], float, float]:
    args = [f"--{k}={v}" for k, v in job(rounds, str(shards), str(out)).items()]
    cpu0, t0 = _children_cpu(), time.monotonic()
    subprocess.run(
        [*PFLARENA, "run", *args, "--engine", "inprocess", "--quiet"], check=True, cwd=out.parent
    )
    return read_rounds(out / "rounds.jsonl"), time.monotonic() - t0, _children_cpu() - cpu0


def _container_cpu(container: str) -> float:
    """Seconds of CPU the container's cgroup used so far."""
    for path in (
        Path(f"/sys/fs/cgroup/cpuacct/docker/{container}/cpuacct.usage"),
        Path(f"/sys/fs/cgroup/system.slice/docker-{container}.scope/cpu.stat"),
    ):
        if path.exists():
            text = path.read_text()
            if path.name == "cpuacct.usage":
                return int(text) / 1e9
            return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6
    raise RuntimeError(f"no cgroup CPU accounting found for container {container}")


def _compose(work: Path, env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        ["docker-compose", "-f", "docker-compose.yml", *args],
        cwd=work, env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


def in_containers(
    work: Path, shards: list[Path], rounds: int, tag: str, extra_env: dict[str, str]
) -> tuple[list[dict[str, Any]], float, float, float, int, Any]:
    """The job on the compose federation (``extra_env`` for compose's variables): rounds,
    wall, CPU, ``up`` seconds, containers, the exchanges' timeline."""
    work.mkdir(parents=True)
    files = compose_files(
        NUM_CLIENTS, shards_dir=str(shards[0].parent), runs_dir=str(work / "runs")
    )
    for name, text in files.items():
        (work / name).write_text(text)
    (work / "runs").mkdir(exist_ok=True)
    port = 19091
    env = os.environ | {
        "PFLARENA_TAG": tag,
        "PFLARENA_PORT": str(port),
        "PFLARENA_UID": str(os.getuid()),
        "PFLARENA_GID": str(os.getgid()),
        "COMPOSE_PROJECT_NAME": f"pflarena-bench-{os.getpid()}",
        "PFLARENA_TRACE": "1",
        **extra_env,
    }
    home = work / "home-cli"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "c"\n\n[superlink.c]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    t0 = time.monotonic()
    try:
        _compose(work, env, "up", "-d")
        up = time.monotonic() - t0
        containers = _compose(work, env, "ps", "-q").split()
        overrides = work / "run-config.toml"
        overrides.write_text(
            "".join(
                f"{k} = {toml_value(v)}\n" for k, v in job(rounds, "/shards", "/runs/bench").items()
            )
        )
        cpu0 = sum(_container_cpu(c) for c in containers)
        t0 = time.monotonic()
        with open(work / "flwr-run.log", "wb") as log:
            subprocess.run(
                ["flwr", "run", str(flwr_run_dir(work / "app")), "c", "--run-config", str(overrides), "--stream"],
                env=simulation_env(home), cwd=home, stdout=log, stderr=subprocess.STDOUT, check=True,
            )  # fmt: skip
        wall = time.monotonic() - t0
        cpu = sum(_container_cpu(c) for c in containers) - cpu0
        summary = json.loads((work / "runs" / "bench" / "summary.json").read_text())
        if summary["status"] != "completed":
            raise RuntimeError(f"the compose run failed: {summary.get('error')}")
        rounds_ = read_rounds(work / "runs" / "bench" / "rounds.jsonl")
        nodes = []
        for i in range(NUM_CLIENTS):
            for service in (f"supernode-{i}", f"clientapp-{i}"):
                log = subprocess.run(
                    ["docker-compose", "-f", "docker-compose.yml", "logs", "--no-color", service],
                    cwd=work, env=env, capture_output=True, text=True,
                ).stdout  # fmt: skip
                (work / f"{service}.log").write_text(log)
            nodes.append((work / f"supernode-{i}.log", work / f"clientapp-{i}.log"))
        timeline = read_timeline(work / "flwr-run.log", nodes)
        return rounds_, wall, cpu, up, len(containers), timeline
    finally:
        subprocess.run(
            ["docker-compose", "-f", "docker-compose.yml", "down", "-v", "-t", "10"],
            cwd=work, env=env, capture_output=True,
        )  # fmt: skip


def image_sizes(tag: str) -> list[str]:
    rows = []
    for target in TARGETS:
        name = image_name(target, tag)
        size = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Size}}", name],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        rows.append(f"| {name} | {int(size) / 1e9:.2f} |")
    return rows


def round_times(rounds: list[dict[str, Any]]) -> list[float]:
    """Each round's time from round 2 on (round 1 pays the clients' first messages)."""
    return [r["round_time_s"] for r in rounds if r["round"] >= 2]


#: The compose runs: the generated files as they are (the SuperLink's state in SQLite on its
#: volume), and the same with the state in memory (``PFLARENA_SUPERLINK_DATABASE``).
VARIANTS = {
    "SuperLink state on its volume (the default)": {},
    "SuperLink state in memory": {DATABASE_ENV: ":flwr-in-memory:"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tag", default="latest", help="the images' tag (default latest)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "containers.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflarena-containers-bench-"))
    spec = FederationSpec(
        dataset="digits", num_clients=NUM_CLIENTS, partition="iid", seed=0,
        validation_fraction=0.2, server_fraction=0.1,
    )  # fmt: skip
    shards = write_shards(build_federation(spec), work / "shards", spec)
    loads = [os.getloadavg()[0]]
    local, local_wall, local_cpu = in_process(work / "shards", args.rounds, work / "local")
    loads.append(os.getloadavg()[0])
    runs = {}
    for name, extra in VARIANTS.items():
        slug = "memory" if extra else "durable"
        runs[name] = in_containers(work / slug, shards, args.rounds, args.tag, extra)
        loads.append(os.getloadavg()[0])
    fmt = ", ".join
    simulated = statistics.median(round_times(local))
    rows, timelines, notes = [], {}, []
    for name, (deployed, wall, cpu, up, num_containers, timeline) in runs.items():
        composed = statistics.median(round_times(deployed))
        same = [r["evaluation"]["personalized"]["mean"] for r in local] == [
            r["evaluation"]["personalized"]["mean"] for r in deployed
        ]
        rows.append(
            f"| compose, {name}: {num_containers} containers | {wall:.1f} | {cpu:.1f} | "
            f"{composed:.2f} ({composed - simulated:+.2f}) | "
            f"{fmt(f'{t:.2f}' for t in round_times(deployed))} | {'yes' if same else 'NO'} |"
        )
        timelines[f"compose, {name}"] = timeline
        notes.append(f"{up:.1f} s ({name})")
    text = [
        "# Containers: the compose federation against `pflarena run`",
        "",
        f"Command: `python benchmarks/containers.py --rounds {args.rounds} --tag {args.tag}` on "
        f"{platform.node()} ({os.cpu_count()} cores, shared; load average "
        f"{fmt(f'{x:.1f}' for x in loads)} before, between and after). FedAvg on digits, IID over "
        f"{NUM_CLIENTS} clients, every client every round, every round evaluated, "
        f"{args.rounds} rounds.",
        "",
        "| | wall s (run) | CPU s | round s, median of rounds 2.. (− simulated) | rounds 2.. "
        "| evaluations equal the simulation's |",
        "|---|---|---|---|---|---|",
        f"| `pflarena run --engine inprocess` | {local_wall:.1f} | {local_cpu:.1f} | "
        f"{simulated:.2f} | {fmt(f'{t:.2f}' for t in round_times(local))} | — |",
        *rows,
        "",
        "Where each exchange's time went (ms, median over the messages, max in brackets; "
        "`benchmarks/exchange_phases.py` defines the phases):",
        "",
        *phase_table(timelines),
        "",
        "`flwr run` from the host; `docker-compose up -d` to every service started "
        f"(healthchecks passed): {fmt(notes)}. The `pflarena run` time includes "
        "its start (the in-process engine); the compose run's is from `flwr run` to "
        "its end, the containers already up. CPU of the compose run is every container's "
        "cgroup; of `pflarena run`, its process tree.",
        "",
        "| image | size GB (uncompressed; app and edge share every layer but the last) |",
        "|---|---|",
        *image_sizes(args.tag),
    ]
    Path(args.output).write_text("\n".join(text) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
