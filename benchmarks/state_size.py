"""Bytes of state per client, for every method: what a federation of thousands must store.

Each method runs twice as a real ``pflarena run`` simulation on digits (IID, every client
trained in both rounds, one local epoch), with a small and a larger federation. Measured from
the run's output directory:

- **client state per client**: each client's newest state version (the entries its method
  keeps between rounds, ``client-state/<key>/client-<id>/v<update>/<entry>.npz``), and the
  bytes every version kept on disk takes (the store keeps the last accepted version beside
  the newest);
- **server state**: ``checkpoint.npz`` (the strategy's arrays and the global model) and the
  server's pools (``server-state/``), at both sizes; the difference over the extra clients
  is what the server keeps per client.

Usage::

    python benchmarks/state_size.py --clients 10 40 --out benchmarks/results/state_size.md
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from commit_tree import head_commit
from scale import disk_bytes, method_flags

from pflarena.strategies import declarations

ROOT = Path(__file__).resolve().parents[1]


def client_state(out: Path) -> tuple[dict[str, float], float, int]:
    """Mean bytes per client of each entry in its newest version, mean bytes per client of
    every version on disk, and the number of clients with state."""
    entries: dict[str, int] = defaultdict(int)
    on_disk, clients = 0, 0
    for client in sorted((out / "client-state").glob("*/client-*")):
        versions = sorted(client.glob("v*"), key=lambda v: int(v.name[1:]))
        if not versions:
            continue
        clients += 1
        on_disk += disk_bytes(client)
        for entry in versions[-1].iterdir():
            entries[entry.name.removesuffix(".npz").replace("__", "/")] += entry.stat().st_size
    if not clients:
        return {}, 0.0, 0
    return {k: v / clients for k, v in sorted(entries.items())}, on_disk / clients, clients


def run(method: str, num_clients: int, workdir: Path, flags: str = "") -> dict:
    out = workdir / f"{method}-{num_clients}"
    cmd = [
        sys.executable, "-m", "pflarena.cli", "run", "--strategy", method,
        "--dataset", "digits", "--partition", "iid", "--num-clients", str(num_clients),
        "--num-rounds", "2", "--eval-every", "2", "--fraction-train", "1.0",
        "--output-dir", str(out), "--quiet",
    ]  # fmt: skip
    cmd += method_flags(method) + shlex.split(flags)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode not in (0, 3):  # 3: completed with client failures
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    entries, on_disk, clients = client_state(out)
    return {
        "entries": entries,
        "client_on_disk": on_disk,
        "clients_with_state": clients,
        "checkpoint": disk_bytes(out / "checkpoint.npz"),
        "server_state": disk_bytes(out / "server-state"),
        "wall_s": time.monotonic() - start,
    }


def _kb(value: float) -> str:
    return f"{value / 1024:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs=2, default=[10, 40])
    parser.add_argument("--methods", nargs="*", default=None)
    parser.add_argument(
        "--flags",
        default="",
        help="more `pflarena run` flags for every run (e.g. '--state-precision float16')",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "state_size.md"))
    args = parser.parse_args()
    small, large = args.clients
    methods = args.methods or sorted(declarations())
    commit = head_commit()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pflarena-state-") as tmp:
        for method in methods:
            found = {n: run(method, n, Path(tmp), args.flags) for n in (small, large)}
            print(method, found, flush=True)
            rows.append((method, found))
    lines = [
        "# State per client, every method",
        "",
        "Command: `python benchmarks/state_size.py " + shlex.join(sys.argv[1:]) + f"` at commit "
        f"`{commit}`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores "
        f"({platform.machine()}).",
        "",
        f"Each method: `pflarena run` on digits (1,797 images, IID), {small} and {large} clients, "
        "2 rounds, every client trained in both, 1 local epoch (where the method honours "
        "`local-epochs`). **Client, newest**: the mean "
        "bytes of a client's newest state version, by entry (what the method keeps between "
        "rounds); **on disk**: every version its store keeps (the newest and the last "
        "accepted). **Server per client**: how much `checkpoint.npz` and the server's pools "
        f"grow per extra client from {small} to {large} clients. Sizes in KB (1,024 bytes) "
        "of the `.npz` files as written; the models are digits' (the "
        "default MLP unless the method declares another), so a CNN's state is larger in "
        "proportion to its parameters.",
        "",
        f"| method | client, newest | entries (newest) | client, on disk | checkpoint at {small} "
        f"| checkpoint at {large} | server pools at {large} | server per client |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, found in rows:
        a, b = found[small], found[large]
        if "error" in a or "error" in b:
            lines.append(f"| {method} | failed: {(a.get('error') or b.get('error'))} |||||||")
            continue
        newest = sum(b["entries"].values())
        entries = ", ".join(f"`{k}` {_kb(v)}" for k, v in b["entries"].items()) or "none"
        grow = (b["checkpoint"] + b["server_state"] - a["checkpoint"] - a["server_state"]) / (
            large - small
        )
        lines.append(
            f"| {method} | {_kb(newest)} | {entries} | {_kb(b['client_on_disk'])} "
            f"| {_kb(a['checkpoint'])} | {_kb(b['checkpoint'])} | {_kb(b['server_state'])} "
            f"| {_kb(grow)} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
