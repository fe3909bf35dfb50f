"""An edge node measured: memory, CPU per ClientApp message, bytes on its link, round time.

The federation: ``pflarena compose --num-supernodes 1 --edge-nodes 1 --edge-platform
linux/arm64`` (a SuperLink, the ServerApp executor, one x86-64 SuperNode with its ClientApp
executor, and one arm64 edge node limited to one CPU and 1 GiB), FedAvg over the two clients'
shards, both in every round, submitted with ``flwr run`` from the host. On an x86-64 host the
arm64 node runs under qemu-user emulation: its times and CPU are the emulator's, many times
the hardware's, and its memory includes the emulator's own (its translated code).

Per configuration (the edge node's ClientApp executor: pflarena's warm one or Flower's; the
workload: digits with its MLP, or MNIST with its CNN), on the edge container only
(``--edge-platform host`` runs the host's edge image instead, natively, for reference):

* peak memory: the cgroup's ``memory.max_usage_in_bytes`` (cgroup v1), reset once the node is
  ready, so the peak of the run's messages (SuperNode, executor, ClientApp together) against
  the 1 GiB limit; ``memory.failcnt`` (allocations refused at the limit);
* CPU: the cgroup's ``cpuacct.usage`` over the run divided by the node's messages (round 0's
  evaluation, then a train and an evaluate message per round), idle polling included; for the
  warm executor also each forked child's own CPU (its log);
* bytes on the link: the container's ``eth0`` receive and transmit counters over the run (HTTP
  requests, replies, polling), per round;
* wall time per round (``rounds.jsonl``);

and, first, every image's size and the largest installed packages of the edge and app images.
It writes what it measured to ``--output`` (JSON); ``benchmarks/results/edge.md`` reports it.

The images must exist: the x86-64 ones (``make images``) and the arm64 edge image
(``pflarena images --platform linux/arm64 --target edge``), with the same ``--tag``. MNIST is
read from ``--data-dir`` (``mnist/mnist-70k.npz`` or torchvision's files); the two clients
share ``--mnist-share`` of it (the rest is the server's share, which FedAvg never uses). Needs root (the cgroup and network counters).

Usage::

    python benchmarks/edge.py --tag latest --data-dir DATA --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pflarena.core.config import toml_value
from pflarena.deploy.compose import compose_files
from pflarena.deploy.executor import TASK_LOG_PREFIX
from pflarena.runtime.appdir import flwr_run_dir
from pflarena.runtime.launch import simulation_env
from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
PFLARENA = [sys.executable, "-m", "pflarena.cli"]
NUM_CLIENTS = 2
GIB = 2**30


def job(workload: str, rounds: int, out: str) -> dict[str, Any]:
    dataset = {"digits-mlp": "digits", "mnist-cnn": "mnist"}[workload]
    return {
        "strategy": "fedavg",
        "dataset": dataset,
        "partition": "iid",
        "seed": 0,
        "num-clients": NUM_CLIENTS,
        "num-rounds": rounds,
        "lr": 0.05,
        "local-epochs": 1,
        "fraction-train": 1.0,
        "round-timeout": 1800.0,
        "shards-dir": "/shards",
        "output-dir": out,
    }


def shards(workload: str, out: Path, data_dir: str, client_share: float) -> Path:
    dataset = {"digits-mlp": "digits", "mnist-cnn": "mnist"}[workload]
    args = ["--dataset", dataset, "--num-clients", str(NUM_CLIENTS), "--partition", "iid"]
    if dataset == "mnist":  # the clients' share; the rest is the server's, never sent
        args += ["--data-dir", data_dir, "--server-fraction", str(round(1 - client_share, 6))]
    subprocess.run([*PFLARENA, "shards", *args, "--out", str(out)], check=True)
    return out


def _cgroup(kind: str, container: str, name: str) -> Path:
    path = Path(f"/sys/fs/cgroup/{kind}/docker/{container}/{name}")
    if not path.exists():
        raise RuntimeError(f"{path} is missing: this measures on cgroup v1 (cgroupfs driver)")
    return path


def _link_bytes(pid: str) -> int:
    """Bytes received plus sent on the container's eth0 so far (``/proc/net/dev`` read in its
    network namespace: ``/sys`` would show the host's interfaces)."""
    text = subprocess.run(
        ["nsenter", "-t", pid, "-n", "cat", "/proc/net/dev"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for line in text.splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "eth0":
            fields = counters.split()
            return int(fields[0]) + int(fields[8])
    raise RuntimeError(f"no eth0 in the container's /proc/net/dev:\n{text}")


def _compose(work: Path, env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        ["docker-compose", "-f", "docker-compose.yml", *args],
        cwd=work, env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


def _logs(container: str) -> str:
    result = subprocess.run(["docker", "logs", container], capture_output=True, text=True)
    return result.stdout + result.stderr


def measure(
    work: Path,
    shard_dir: Path,
    workload: str,
    executor: str,
    rounds: int,
    tag: str,
    edge_platform: str | None = "linux/arm64",
) -> dict[str, Any]:
    """One run of ``workload`` with the edge node's ``executor``: its figures."""
    work.mkdir(parents=True)
    files = compose_files(
        NUM_CLIENTS - 1, edge_nodes=1, shards_dir=str(shard_dir), runs_dir=str(work / "runs"),
        edge_platform=edge_platform,
    )  # fmt: skip
    for name, text in files.items():
        (work / name).write_text(text)
    (work / "runs").mkdir()
    port = 19191
    env = os.environ | {
        "PFLARENA_TAG": tag,
        "PFLARENA_PORT": str(port),
        "PFLARENA_UID": str(os.getuid()),
        "PFLARENA_GID": str(os.getgid()),
        "PFLARENA_EDGE_EXECUTOR": executor,
        "COMPOSE_PROJECT_NAME": f"pflarena-edgebench-{os.getpid()}",
    }
    home = work / "home-cli"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "c"\n\n[superlink.c]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    try:
        _compose(work, env, "up", "-d")
        edge = _compose(work, env, "ps", "-q", "edge-0").split()[-1]
        pid = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Pid}}", edge],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        ready_s = None
        t0 = time.monotonic()
        if executor == "warm":  # its parent imports torch and the app first
            while "pflarena warm executor:" not in _logs(edge):
                if time.monotonic() - t0 > 1800:
                    raise RuntimeError(f"the warm executor never started\n{_logs(edge)[-3000:]}")
                time.sleep(2)
            ready_s = time.monotonic() - t0
        idle0, idle_t0 = (
            int(_cgroup("cpuacct", edge, "cpuacct.usage").read_text()),
            time.monotonic(),
        )
        time.sleep(30)
        idle_cpu_per_s = (
            (int(_cgroup("cpuacct", edge, "cpuacct.usage").read_text()) - idle0)
            / 1e9
            / (time.monotonic() - idle_t0)
        )
        _cgroup("memory", edge, "memory.max_usage_in_bytes").write_text("0")
        failcnt0 = int(_cgroup("memory", edge, "memory.failcnt").read_text())
        cpu0 = int(_cgroup("cpuacct", edge, "cpuacct.usage").read_text())
        link0 = _link_bytes(pid)
        overrides = work / "run-config.toml"
        overrides.write_text(
            "".join(f"{k} = {toml_value(v)}\n" for k, v in job(workload, rounds, "/runs/r").items())
        )
        t0 = time.monotonic()
        with open(work / "flwr-run.log", "wb") as log:
            subprocess.run(
                ["flwr", "run", str(flwr_run_dir(work / "app")), "c", "--run-config",
                 str(overrides), "--stream"],
                env=simulation_env(home), cwd=home, stdout=log, stderr=subprocess.STDOUT,
                check=True, timeout=4 * 3600,
            )  # fmt: skip
        wall = time.monotonic() - t0
        cpu = (int(_cgroup("cpuacct", edge, "cpuacct.usage").read_text()) - cpu0) / 1e9
        peak = int(_cgroup("memory", edge, "memory.max_usage_in_bytes").read_text())
        failcnt = int(_cgroup("memory", edge, "memory.failcnt").read_text()) - failcnt0
        link = _link_bytes(pid) - link0
        summary = json.loads((work / "runs" / "r" / "summary.json").read_text())
        if summary["status"] != "completed":
            raise RuntimeError(f"the run failed: {summary.get('error')}")
        records = read_rounds(work / "runs" / "r" / "rounds.jsonl")
        for record in records[1:]:
            if record["train"]["failures"] or record["train"]["clients"] != NUM_CLIENTS:
                raise RuntimeError(f"round {record['round']} lost a client: {record['train']}")
        children = [
            float(m.group(1))
            for m in re.finditer(rf"{TASK_LOG_PREFIX} \d+ pid \d+: exit 0, wall [\d.]+s, cpu ([\d.]+)s", _logs(edge))
        ]  # fmt: skip
        messages = 1 + 2 * rounds
        return {
            "workload": workload,
            "executor": executor,
            "edge_platform": edge_platform or "host",
            "ready_s": ready_s,
            "idle_cpu_per_s": idle_cpu_per_s,
            "wall_s": wall,
            "round_s": [r.get("round_time_s") for r in records[1:]],
            "messages": messages,
            "cpu_s": cpu,
            "cpu_per_message": cpu / messages,
            "child_cpu": children,
            "peak_mib": peak / 2**20,
            "failcnt": failcnt,
            "link_bytes_per_round": link / rounds,
            # what the ServerApp sent and received, both clients, train and evaluate
            "payload_bytes_per_round": sum(
                r.get("bytes_down", 0) + r.get("bytes_up", 0) + r.get("eval_bytes_down", 0)
                for r in records[1:]
            )
            / rounds,
            "accuracy": records[-1]["evaluation"]["personalized"]["mean"],
        }
    finally:
        subprocess.run(
            ["docker-compose", "-f", "docker-compose.yml", "down", "-v", "-t", "10"],
            cwd=work, env=env, capture_output=True,
        )  # fmt: skip


def sizes(tag: str) -> dict[str, Any]:
    """Every image's size, and what takes the space in the two edge images (their largest
    installed packages) and in the x86-64 app image."""
    from pflarena.deploy.images import TARGETS, image_name, local_base_name

    names = [image_name(t, tag) for t in TARGETS]
    names += [image_name(t, tag, platform="linux/arm64") for t in ("supernode", "edge")]
    names += [local_base_name(), local_base_name("linux/arm64")]
    found: dict[str, Any] = {"images": {}, "packages": {}}
    for name in names:
        inspected = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Size}} {{.Architecture}}", name],
            capture_output=True, text=True,
        )  # fmt: skip
        if inspected.returncode == 0:
            size, arch = inspected.stdout.split()
            found["images"][name] = {"bytes": int(size), "arch": arch}
    site = "/python/venv/lib/python3.11/site-packages"
    for name in (image_name("edge", tag, platform="linux/arm64"), image_name("edge", tag),
                 image_name("app", tag)):  # fmt: skip
        if name not in found["images"]:
            continue
        du = subprocess.run(
            ["docker", "run", "--rm", "--entrypoint", "sh", name, "-c",
             f"du -sk {site}/* | sort -n | tail -15; du -sk {site} /usr /python"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        found["packages"][name] = [
            (int(kib) // 1024, path.replace(f"{site}/", "")) for kib, path in
            (line.split("\t") for line in du.splitlines() if "\t" in line)
        ]  # fmt: skip
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default="latest", help="the images' tag (default latest)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-dir", default="data", help="holds MNIST (mnist/mnist-70k.npz)")
    parser.add_argument(
        "--mnist-share", type=float, default=0.02,
        help="the clients' share of MNIST's 70,000 images (default 0.02: 700 each)",
    )  # fmt: skip
    parser.add_argument(
        "--runs", default="warm:digits-mlp,warm:mnist-cnn,flower:digits-mlp,flower:mnist-cnn",
        help="executor:workload pairs (default every one)",
    )  # fmt: skip
    parser.add_argument(
        "--edge-platform", default="linux/arm64",
        help="the edge node's image: linux/arm64 (emulated on x86-64), or host for the host's",
    )  # fmt: skip
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "edge.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflarena-edge-bench-"))
    results: list[dict[str, Any]] = []
    found = sizes(args.tag)
    print(json.dumps(found), flush=True)

    def save() -> None:
        Path(args.output).write_text(
            json.dumps({"host": platform.node(), "cores": os.cpu_count(), "args": vars(args),
                        "sizes": found, "results": results}, indent=1) + "\n"
        )  # fmt: skip

    save()
    for pair in [p for p in args.runs.split(",") if p]:
        executor, workload = pair.split(":")
        shard_dir = work / f"shards-{workload}"
        if not shard_dir.exists():
            shards(workload, shard_dir, args.data_dir, args.mnist_share)
        load = os.getloadavg()[0]
        platform_ = None if args.edge_platform == "host" else args.edge_platform
        result = measure(work / pair.replace(":", "-"), shard_dir, workload, executor,
                         args.rounds, args.tag, platform_)  # fmt: skip
        result["load_before"] = load
        result["load_after"] = os.getloadavg()[0]
        print(json.dumps(result), flush=True)
        results.append(result)
        save()


if __name__ == "__main__":
    main()
