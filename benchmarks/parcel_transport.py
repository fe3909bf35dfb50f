"""How long a model-sized reply takes to come back from a worker process: through the pool's
pipe, in a file of its own, or in a reply slot (``pflarena.runtime.parcel``).

Two forked workers (``ProcessPoolExecutor``, as the engine's) each make ``--calls`` replies
of ``--megabytes`` (``--calls`` in all per round) and send them back with
:func:`~pflarena.runtime.parcel.pack`: carried through the pool's result pipe, as the
in-process engine's replies once were; written to a new file (``spill_to``), read back with
``os.pread``; or written into a reply slot (:class:`~pflarena.runtime.parcel.ReplySlots`)
and mapped. The run's process unpacks each reply and holds a round's replies until the
round ends, as a server holds them until it aggregates; the ways alternate, ``--repeats``
rounds each. The figure is the run's process's wall time per reply, round end included, so
a slower parent or worker shows. The first round of each way is not counted: it starts the
workers and a slot's first use writes into new pages, as every round's replies did before
the slots.

Usage::

    python benchmarks/parcel_transport.py --out benchmarks/results/parcel_transport.md
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from commit_tree import head_commit
from flwr.app import ArrayRecord, Message, RecordDict

from pflarena.core.array_decoding import decode
from pflarena.runtime.parcel import ParcelFiles, ReplySlots, pack, unpack

ROOT = Path(__file__).resolve().parents[1]
_SIZE = {"bytes": 0}
WAYS = {
    "pipe": "pipe (pickled bytes)",
    "file": "file of its own (read with `os.pread`)",
    "slot": "reply slot (written into used pages, mapped)",
}


def _reply(call: int, spill_to: str | None, slot: str | None):
    from flwr.app import Metadata
    from flwr.app.message.message import make_message

    values = np.full(_SIZE["bytes"] // 4, float(call), dtype=np.float32)
    metadata = Metadata(
        run_id=1,
        message_id=str(call),
        src_node_id=call,
        dst_node_id=0,
        reply_to_message_id="m",
        group_id="1",
        created_at=0.0,
        ttl=30.0,
        message_type="train",
    )
    message = make_message(metadata, RecordDict({"model": ArrayRecord([values])}))
    return pack(message, spill_to=None if spill_to is None else Path(spill_to), slot=slot)


def round_time(
    pool: ProcessPoolExecutor, way: str, calls: int, files: ParcelFiles, slots: ReplySlots
) -> float:
    """One round of ``calls`` replies the ``way`` given, held until the round ends: seconds
    per reply."""
    start = time.perf_counter()
    held: list[Message] = []
    futures = []
    for call in range(calls):
        spill_to = str(files.once) if way == "file" else None
        slot = slots.take() if way == "slot" else None
        futures.append((pool.submit(_reply, call, spill_to, slot), slot))
    for call, (future, slot) in enumerate(futures):
        reply = unpack(future.result(), slots)
        if slot is not None:
            slots.done(slot)
        assert decode(reply.content["model"]["0"], copy=False)[-1] == float(call)
        held.append(reply)
    del held, reply
    gc.collect()
    slots.end_push()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=6.6, help="MNIST's CNN: 6.6")
    parser.add_argument("--calls", type=int, default=200, help="replies a round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/parcel_transport.md")
    args = parser.parse_args()
    _SIZE["bytes"] = int(args.megabytes * 1e6)
    files, slots = ParcelFiles(), ReplySlots()
    if not slots.usable:
        raise SystemExit("reply slots need Linux's memory files")
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    loads = []
    try:
        for way in WAYS:  # not counted: the workers' start, the slots' first pages
            round_time(pool, way, args.calls, files, slots)
        for _ in range(args.repeats):
            for way in WAYS:
                times[way].append(round_time(pool, way, args.calls, files, slots))
            loads.append(os.getloadavg()[0])
    finally:
        pool.shutdown()
        files.close()
        slots.close()
    median = {way: statistics.median(values) for way, values in times.items()}
    lines = [
        "# A model-sized reply from a worker: the pool's pipe, a file, a reply slot",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`.",
        f"- Command: `python benchmarks/parcel_transport.py --megabytes {args.megabytes} "
        f"--calls {args.calls} --repeats {args.repeats}`.",
        f"- Machine: {os.cpu_count()} cores, shared: load average (1 min) "
        f"{min(loads):.1f} to {max(loads):.1f}. Compare the rows only with each other.",
        "",
        f"Two forked workers send back rounds of {args.calls} replies of {args.megabytes} MB, "
        "each held by the run's process until its round ends; the run's process's wall time "
        f"per reply, median of {args.repeats} alternating rounds per way (each round's figure "
        "in brackets), after one round per way not counted.",
        "",
        "| way | ms per reply | against the pipe |",
        "|---|---|---|",
        *(
            f"| {label} | {1000 * median[way]:.1f} "
            f"({', '.join(f'{1000 * t:.1f}' for t in times[way])}) "
            f"| {median[way] / median['pipe']:.2f}x |"
            for way, label in WAYS.items()
        ),
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
