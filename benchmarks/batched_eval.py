"""Would one forward pass over many clients' test sets pay, on this machine's CPU?

An evaluation round tests the server's model on every sampled client's test split, each on
its own (``core/training.evaluate``, batches of 512). Batching several clients' test sets
into one forward pass is the obvious speed-up for small test sets (a FEMNIST-shaped client
holds a handful of test images). This measures it, one thread as a worker runs:

* time: ``n`` clients of ``per`` test samples each evaluated alone, against their
  concatenation evaluated in batches of ``--batch`` (64: the fastest size measured here;
  512: ``evaluate``'s);
* exactness: how many samples' logits differ, bit for bit, between a client's own pass
  and the batched pass. A client's metrics are sums over its own samples, so any
  difference is a different result for that client.

Random inputs and the model's initial weights: the cost of a forward pass does not depend
on the values.

Usage::

    python benchmarks/batched_eval.py
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from commit_tree import head_commit

from pflarena.core.models import build_model
from pflarena.core.training import evaluate

ROOT = Path(__file__).resolve().parents[1]
MODELS = [("cnn", (1, 28, 28)), ("mlp", (1, 28, 28)), ("cnn", (3, 32, 32))]


def best_of(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def differing(model: torch.nn.Module, x: torch.Tensor, per: int, batch: int) -> int:
    """Samples whose logits differ between their client's own pass and the batched one."""
    with torch.no_grad():
        alone = torch.cat([model(x[i : i + per]) for i in range(0, len(x), per)])
        batched = torch.cat([model(x[i : i + batch]) for i in range(0, len(x), batch)])
    return int((alone != batched).any(dim=1).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=6000, help="test samples in all")
    parser.add_argument("--per", type=int, nargs="+", default=[3, 17, 100])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/batched_eval.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = datetime.now(timezone.utc)
    rows = []
    for name, shape in MODELS:
        model = build_model(name, shape, 10, seed=0).eval()
        x = torch.randn(args.samples, *shape, generator=torch.Generator().manual_seed(0))
        y = torch.randint(0, 10, (args.samples,), generator=torch.Generator().manual_seed(1))
        for per in args.per:
            n = args.samples // per
            xs, ys = x[: n * per], y[: n * per]

            def alone(xs=xs, ys=ys, per=per, n=n, model=model):
                with torch.no_grad():
                    for i in range(n):
                        evaluate(model, xs[i * per : (i + 1) * per], ys[i * per : (i + 1) * per])

            alone_s = best_of(args.repeats, alone)
            for batch in args.batch:

                def batched(xs=xs, ys=ys, batch=batch, model=model):
                    with torch.no_grad():
                        evaluate(model, xs, ys, batch_size=batch)

                batched_s = best_of(args.repeats, batched)
                rows.append(
                    (name, "x".join(map(str, shape)), per, n, alone_s, batch, batched_s,
                     differing(model, xs, per, batch), n * per)
                )  # fmt: skip
                print(rows[-1], flush=True)

    lines = [
        "# One forward pass over many clients' test sets, on the CPU",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`.",
        f"- Command: `python benchmarks/batched_eval.py {shlex.join(sys.argv[1:])}`.",
        f"- Machine: {os.cpu_count()} cores ({platform.machine()}), one torch thread (as a "
        f"worker runs), torch {torch.__version__}; best of {args.repeats}. Compare times only "
        "within a row.",
        "",
        "Alone: each client's test split evaluated on its own (`evaluate`); batched: all of them "
        "in one pass of the given batch size. Differing: samples whose logits are not bit for "
        "bit those of their client's own pass.",
        "",
        "| model | input | test samples a client | clients | alone s | batch | batched s "
        "| batched / alone | differing samples |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, shape, per, n, alone_s, batch, batched_s, diff, total in rows:
        lines.append(
            f"| {name} | {shape} | {per} | {n} | {alone_s:.2f} | {batch} | {batched_s:.2f} "
            f"| {batched_s / alone_s:.2f} | {diff} of {total} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
