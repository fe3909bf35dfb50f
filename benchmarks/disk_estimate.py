"""The state a run keeps on disk, estimated before it starts against what it really takes.

``pflarena run --check`` states what a run's state is expected to take at most in its
output directory (``pflarena.server.build.disk_estimate``: each method's per-client state,
``client_footprint``, times the versions the clients are expected to hold at once; the
server's per-client pools; the checkpoint, twice while a new one replaces it), and a run
refuses to start when that exceeds the free space.
This benchmark runs real ``pflarena run`` simulations of stateful methods (the FedAvg CNN
on MNIST, IID, one local epoch where the method honours it) and samples the bytes under
``client-state/``, ``server-state/`` and the checkpoint (with the one being written
beside it) every 0.2 s while each runs: the peak and the end
are reported beside the estimate. Hard links (the entries a version carries over
unchanged) count once, as on disk.

Usage::

    python benchmarks/disk_estimate.py --data-dir ../shared/data \\
        --methods ditto fedper splitgp fedfomo pfedgt --clients 1000 --fraction 0.1 --rounds 4
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from commit_tree import head_commit
from scale import MB, method_flags

from pflarena.core.footprint import disk_used
from pflarena.server.build import disk_estimate, parse_config

ROOT = Path(__file__).resolve().parents[1]


def _flags(args: argparse.Namespace, method: str, out: Path) -> list[str]:
    return [
        "--strategy", method, "--dataset", "mnist", "--data-dir", args.data_dir,
        "--partition", "iid", "--num-clients", str(args.clients),
        "--fraction-train", str(args.fraction), "--num-rounds", str(args.rounds),
        "--checkpoint-every", str(args.checkpoint_every),
        "--fraction-evaluate", "0.05", "--output-dir", str(out),
        *method_flags(method), *shlex.split(args.flags),
    ]  # fmt: skip


def _estimate(flags: list[str]) -> float:
    """The estimate ``pflarena run`` checks, from the run config its flags resolve to."""
    check = subprocess.run(
        [sys.executable, "-m", "pflarena", "run", "--check", *flags],
        capture_output=True,
        text=True,
        check=True,
    )
    import tomllib

    return disk_estimate(parse_config(tomllib.loads(check.stdout))).total


def _state(out: Path) -> int:
    """The bytes the run's state takes on disk: its clients', its pools, its checkpoint
    and the one being written beside it (``pflarena.server.checkpoint``)."""
    files = [out / "checkpoint.npz", out / ".checkpoint.npz.tmp"]
    return disk_used(out / "client-state", out / "server-state", *files)


def measure(method: str, args: argparse.Namespace, workdir: Path) -> dict:
    out = workdir / method
    flags = _flags(args, method, out)
    estimate = _estimate(flags)
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            peak[0] = max(peak[0], _state(out))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pflarena", "run", "--quiet", *flags],
            capture_output=True,
            text=True,
        )
    finally:
        stop.set()
        sampler.join()
    end = _state(out)
    shutil.rmtree(out, ignore_errors=True)
    if run.returncode != 0:
        tail = " ".join(run.stderr.split())[-300:]
        return {"method": method, "estimate": estimate, "outcome": f"failed: {tail}"}
    peak[0] = max(peak[0], end)
    return {"method": method, "estimate": estimate, "peak": peak[0], "end": end, "outcome": "ok"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="where MNIST is (../shared/data)")
    parser.add_argument("--methods", nargs="+", default=["ditto", "fedper", "splitgp"])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--flags", default="", help="more `pflarena run` flags, one string")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/disk_estimate.md")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="pflarena-disk-") as work:
        for method in args.methods:
            row = measure(method, args, Path(work))
            rows.append(row)
            print(row, flush=True)
    command = "python benchmarks/disk_estimate.py " + shlex.join(sys.argv[1:])
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# The state a run keeps on disk: estimated at `--check` and measured",
        "",
        f"Command: `{command}` at commit `{head_commit()}`, {when}, {platform.machine()}.",
        "",
        f"MNIST IID over {args.clients:,} clients, {args.fraction:.0%} a round, "
        f"{args.rounds} rounds, checkpoint-every {args.checkpoint_every}, the FedAvg CNN. "
        "**Estimate**: what `pflarena run --check` states and a run is refused on "
        "(`disk_estimate`); **peak** and **end**: the bytes under the run's `client-state/` "
        "and `server-state/` and of its checkpoint (with the one written beside it while it "
        "is replaced), sampled every 0.2 s while it ran and at its end (a file with several "
        "hard links once). MB: 2^20 bytes.",
        "",
        "| method | estimate (MB) | peak (MB) | peak / estimate | end (MB) | outcome |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["outcome"] != "ok":
            lines.append(
                f"| {row['method']} | {row['estimate'] / MB:,.1f} | | | | {row['outcome']} |"
            )
            continue
        ratio = row["peak"] / row["estimate"] if row["estimate"] else float("nan")
        lines.append(
            f"| {row['method']} | {row['estimate'] / MB:,.1f} | {row['peak'] / MB:,.1f} | "
            f"{ratio:.2f} | {row['end'] / MB:,.1f} | ok |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
