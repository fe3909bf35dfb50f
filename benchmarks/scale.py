"""Memory and time of a simulation as the number of clients grows.

Ditto (a personal model per client, kept in the client's state) with the FedAvg CNN on MNIST,
IID over N clients, 10% of them per round. Each run is a real `pflarena run` simulation; its
whole process tree (the SuperLink, Flower's simulation process, Ray and its actors) is
sampled every 0.5 s and the peak of the summed resident memory (RSS) is reported, with the
mean wall time of a training round (rounds 2.., round 1 includes Ray's start) and the size
of the clients' state on disk. Every client is evaluated before round 1 and after the last.

Summed RSS counts memory shared between processes (Ray's object store, shared libraries)
once per process, so it overstates the machine's use; it is the same measure at every N.

Usage::

    python benchmarks/scale.py --data-dir ../shared/data --clients 100 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [root], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):  # a process that ended
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    return total


def _du(path: Path) -> int:
    seen, total = set(), 0
    for file in path.rglob("*"):
        if file.is_file():
            stat = file.stat()
            if stat.st_ino not in seen:  # hard links count once
                seen.add(stat.st_ino)
                total += stat.st_size
    return total


def measure(num_clients: int, args: argparse.Namespace, workdir: Path) -> dict:
    out = workdir / f"ditto-{num_clients}"
    cmd = [
        sys.executable, "-m", "pflarena.cli", "run",
        "--strategy", "ditto", "--dataset", "mnist", "--data-dir", args.data_dir,
        "--model", "cnn", "--partition", "iid", "--num-clients", str(num_clients),
        "--fraction-train", str(args.fraction), "--num-rounds", str(args.rounds),
        "--eval-every", "100000", "--local-epochs", "1", "--batch-size", "32", "--lr", "0.05",
        "--output-dir", str(out), "--quiet",
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, samples = 0, []

    def sample() -> None:
        nonlocal peak
        while proc.poll() is None:
            rss = _rss(_tree(proc.pid))
            peak = max(peak, rss)
            samples.append(rss)
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"run with {num_clients} clients failed:\n{output[-3000:]}")
    rounds = read_rounds(out / "rounds.jsonl")
    timed = [r["train_time_s"] for r in rounds if r["round"] >= 2]
    return {
        "clients": num_clients,
        "per_round": int(num_clients * args.fraction),
        "peak_rss_mb": peak / 2**20,
        "round_s": statistics.mean(timed) if timed else float("nan"),
        "wall_s": time.monotonic() - start,
        "state_mb": _du(out / "client-state") / 2**20,
        "accuracy": rounds[-1]["evaluation"]["personalized"]["mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.md"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pflarena-scale-") as tmp:
        results = []
        for n in args.clients:
            print(f"== {n} clients", flush=True)
            results.append(measure(n, args, Path(tmp)))
            print(json.dumps(results[-1]), flush=True)
    base = results[0]
    lines = [
        "# Scale: memory and round time against the number of simulated clients",
        "",
        f"Command: `python benchmarks/scale.py --clients {' '.join(map(str, args.clients))} "
        f"--rounds {args.rounds}` on {os.cpu_count()} CPU cores ({platform.machine()}), "
        f"Python {platform.python_version()}.",
        "",
        "Ditto, FedAvg CNN, MNIST (`../shared/data`, 70,000 images) IID over N clients, "
        f"{args.fraction:.0%} per round, 1 local epoch; every client evaluated before round 1 "
        "and after the last. Peak memory: the summed RSS of the run's whole process tree.",
        "",
        "| clients | per round | peak RSS (MB) | vs first | round (s) | client state on disk (MB) "
        "| wall (s) | personalized acc |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['clients']} | {r['per_round']} | {r['peak_rss_mb']:.0f} "
            f"| {r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x | {r['round_s']:.1f} "
            f"| {r['state_mb']:.1f} | {r['wall_s']:.0f} | {100 * r['accuracy']:.2f} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
