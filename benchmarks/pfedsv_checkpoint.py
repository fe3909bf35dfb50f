"""pFedSV's checkpoint at a federation's size: its relevance rows as arrays against JSON.

pFedSV's server keeps, for each client that has reported one, its latest relevance vector:
a row of N values (the run's relevance picture). Checkpoints kept those rows in their JSON
part until they became arrays of their own (``pfedsv/relevance``). This benchmark builds
the strategy for N clients, gives every client a row (a long run, where every client has
reported), and writes its checkpoint both ways with the checkpoint writer itself
(:func:`pflarena.server.checkpoint.save_checkpoint`, the JSON form by putting the rows back
into the JSON part as older versions wrote them): the file's size and the time to write
and to load it, best of ``--repeat``.

Usage::

    python benchmarks/pfedsv_checkpoint.py --clients 1000 3550
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from commit_tree import head_commit
from flwr.app import Array, ArrayRecord

from pflarena.server.build import build_strategy, parse_config
from pflarena.server.checkpoint import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
MB = 2**20


class _AsJson:
    """The strategy, its relevance rows written into the JSON part (the older layout)."""

    def __init__(self, strategy) -> None:
        self.strategy = strategy
        self.method = strategy.method

    def checkpoint_state(self):
        arrays, meta = self.strategy.checkpoint_state()
        clients = arrays.pop("pfedsv/relevance-clients")
        rows = arrays.pop("pfedsv/relevance")
        meta["pfedsv"]["relevance"] = {
            str(int(c)): [float(v) for v in row] for c, row in zip(clients, rows, strict=True)
        }
        return arrays, meta


def measure(clients: int, repeat: int) -> list[dict]:
    cfg = parse_config(
        {"strategy": "pfedsv", "dataset": "digits", "num-clients": clients,
         "validation-fraction": 0.2, "alpha": 0.5}
    )  # fmt: skip
    strategy = build_strategy(cfg)
    rng = np.random.default_rng(0)
    strategy.relevance = {c: rng.standard_normal(clients) for c in range(clients)}
    model = ArrayRecord({"w": Array(np.zeros(1000, dtype=np.float32))})
    rows = []
    for layout, writer in (("arrays", strategy), ("JSON", _AsJson(strategy))):
        writes, loads = [], []
        with tempfile.TemporaryDirectory(prefix="pflarena-pfedsv-") as work:
            out = Path(work)
            for _ in range(repeat):
                started = time.perf_counter()
                path = save_checkpoint(out, 1, model, writer)
                writes.append(time.perf_counter() - started)
                started = time.perf_counter()
                loaded = load_checkpoint(out, "pfedsv")
                loads.append(time.perf_counter() - started)
            size = path.stat().st_size
            assert loaded is not None
            twin = build_strategy(cfg)
            twin.restore_state(loaded.strategy_arrays, loaded.strategy_meta)
            same = all(
                np.array_equal(twin.relevance[c], strategy.relevance[c]) for c in range(clients)
            )
        rows.append(
            {"clients": clients, "layout": layout, "size": size, "write": min(writes),
             "load": min(loads), "restored": same}
        )  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 3550])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/pfedsv_checkpoint.md"
    )
    args = parser.parse_args()
    rows = [row for n in args.clients for row in measure(n, args.repeat)]
    command = "python benchmarks/pfedsv_checkpoint.py " + shlex.join(sys.argv[1:])
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# pFedSV's checkpoint: relevance rows as arrays against JSON",
        "",
        f"Command: `{command}` at commit `{head_commit()}`, {when}, {platform.machine()}; "
        f"best of {args.repeat}. Every client holds a relevance row of N float64 (a long run). "
        "**restored**: a strategy restored from the file holds every row bit for bit.",
        "",
        "| clients | rows kept as | checkpoint (MB) | write (s) | load (s) | restored |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['clients']:,} | {r['layout']} | {r['size'] / MB:,.1f} | {r['write']:.2f} | "
        f"{r['load']:.2f} | {'yes' if r['restored'] else 'no'} |"
        for r in rows
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
