"""Where one small client's train message goes: Ditto on MNIST's CNN, in one process.

A 3,550-client federation of MNIST (IID) gives each client 15 training images: one SGD step
per model. Each message here is what a sampled Ditto client does in a worker: the server's
model decoded, the personal model read from the client's state on disk (written by an
earlier message), the Ditto solver (``pflarena.methods.ditto.solver.train``: one step on
the personal model, one on the global one), and the state saved, as the ClientApp's train
handler does. Timed per message, the median over ``--clients`` clients (the first three
left out), in a store like a simulation's (``durable=False``) and like a SuperNode's
``state-dir`` (fsynced).

With ``--before-commit`` the same messages run from that commit's tree too, before and
after alternating, each side in processes of its own.

Then, on this tree only, the parts of such a message timed one by one, and one
``train_epochs`` call at 15 and at 32 images (batch 32): their difference per image gives
the part of a step that does not grow with its batch (the weight gradients of a whole
model, the optimizer's update), which a client of 15 images pays once per model where the
same images in clients of 525 pay it 15/32 of a time.

Usage::

    python benchmarks/client_message.py --data-dir ../shared/data --before-commit <commit>
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PERSONAL = "ditto/personal-model"


def _setup(args: argparse.Namespace, work: Path):
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from pflarena.client.job import ClientJob, load_node_data
    from pflarena.client.state import ClientState, DiskVersions
    from pflarena.core import keys
    from pflarena.core.array_decoding import state_record
    from pflarena.core.training import warm_optimizers
    from pflarena.server.build import parse_config

    torch.set_num_threads(1)  # as a worker runs
    warm_optimizers()
    cfg = parse_config({
        "strategy": "ditto", "dataset": "mnist", "data-dir": args.data_dir, "model": "cnn",
        "partition": "iid", "num-clients": args.num_clients, "local-epochs": 1,
        "batch-size": 32, "lr": 0.05,
    })  # fmt: skip
    device = torch.device("cpu")
    nodes = [
        load_node_data(cfg, {"partition-id": i, "num-partitions": args.num_clients}, device)
        for i in range(args.clients)
    ]
    first = ClientJob(cfg, nodes[0], ClientState(DiskVersions(work / "x"), None, None),
                      RecordDict(), device)  # fmt: skip
    arrays = ArrayRecord(first.new_model().state_dict())
    config = ConfigRecord({
        keys.METHOD: "ditto", keys.SERVER_ROUND: 2, keys.LOCAL_EPOCHS: 1,
        keys.BATCH_SIZE: 32, keys.LR: 0.05, "ditto.lambda": 0.1, "ditto.personal-epochs": 1,
    })  # fmt: skip
    content = RecordDict({keys.ARRAYS: arrays, keys.CONFIG: config})
    for i in range(args.clients):  # each client's personal model, from an earlier message
        for durable in (False, True):
            state = ClientState(DiskVersions(work / f"{durable}-{i}", durable=False), None, 1)
            state[PERSONAL] = state_record(first.new_model().state_dict())
            state.save()
    DiskVersions._cache.clear()
    DiskVersions._cache_bytes = 0
    return cfg, nodes, content, device


def child(args: argparse.Namespace) -> None:
    """One side's messages (run in a process of its own, from its tree)."""
    from pflarena.client.job import ClientJob
    from pflarena.client.state import ClientState, DiskVersions
    from pflarena.methods.ditto import solver

    work = Path(tempfile.mkdtemp(prefix="pflarena-message-", dir=args.work))
    try:
        cfg, nodes, content, device = _setup(args, work)
        found = {}
        for durable in (False, True):
            times = []
            for i, node in enumerate(nodes):
                started = time.perf_counter()
                store = DiskVersions(work / f"{durable}-{i}", durable=durable)
                job = ClientJob(cfg, node, ClientState(store, 1, 2), content, device)
                solver.train(job)
                job.state.save()
                times.append(time.perf_counter() - started)
            found["durable" if durable else "simulated"] = statistics.median(times[3:])
        print(json.dumps(found))
    finally:
        shutil.rmtree(work)


def parts(args: argparse.Namespace) -> dict[str, float]:
    """This tree's message cut into its parts, each timed (median ms), and a step's cost."""
    import torch

    from pflarena.client.common import prox_hook
    from pflarena.client.job import ClientJob
    from pflarena.client.state import ClientState, DiskVersions
    from pflarena.core.array_decoding import state_record
    from pflarena.core.training import train_epochs

    work = Path(tempfile.mkdtemp(prefix="pflarena-message-", dir=args.work))
    try:
        cfg, nodes, content, device = _setup(args, work)
        kwargs = {"epochs": 1, "batch_size": 32, "lr": 0.05}
        times: dict[str, list[float]] = {}

        def timed(name, started):
            times.setdefault(name, []).append(time.perf_counter() - started)
            return time.perf_counter()

        for i, node in enumerate(nodes):
            t = time.perf_counter()
            state = ClientState(DiskVersions(work / f"False-{i}", durable=False), 1, 2)
            job = ClientJob(cfg, node, state, content, device)
            t = timed("state opened (versions listed, old ones pruned)", t)
            received = job.global_model()
            t = timed("server's model decoded into a model", t)
            personal = job.state_model_or_initial(PERSONAL)
            t = timed("personal model read from disk into a model", t)
            hook = prox_hook(received, 0.1)
            t = timed("proximal anchor copied", t)
            generator = torch.Generator().manual_seed(i)
            x, y = node.x_train, node.y_train
            train_epochs(personal, x, y, generator=generator, grad_hook=hook, **kwargs)
            t = timed("personal model trained (one step)", t)
            job.state[PERSONAL] = state_record(personal.state_dict())
            t = timed("personal model encoded", t)
            train_epochs(received, x, y, generator=generator, **kwargs)
            t = timed("global model trained (one step)", t)
            state_record(received.state_dict())
            t = timed("reply's model encoded", t)
            state.save()
            t = timed("state saved (zip, CRC-32, written past the page cache)", t)
        model = job.new_model()
        x, y = nodes[0].x_train, nodes[0].y_train
        for n in (15, 32):
            images = torch.cat([x] * 3)[:n], torch.cat([y] * 3)[:n]
            for _ in range(args.clients):
                t = time.perf_counter()
                train_epochs(model, *images, generator=torch.Generator().manual_seed(0), **kwargs)
                timed(f"train_epochs, {n} images", t)
        return {name: 1000 * statistics.median(v[3:]) for name, v in times.items()}
    finally:
        shutil.rmtree(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--num-clients", type=int, default=3550)
    parser.add_argument("--clients", type=int, default=40, help="messages timed per setting")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before-commit", default="")
    parser.add_argument("--work", default=str(ROOT / "build"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parts", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/client_message.md"))
    args = parser.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.child:
        return child(args)
    if args.parts:
        return print(json.dumps(parts(args)))
    # Here, not at the top: a side's process runs this file with its own tree first on the
    # path and without this folder (commit_tree.tree_env).
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from commit_tree import head_commit, sides, tree_env

    scratch = Path(tempfile.mkdtemp(prefix="pflarena-message-trees-"))
    trees = sides(args.before_commit, scratch)
    started = datetime.now(timezone.utc)
    loads = [os.getloadavg()[0]]
    passed = ["--data-dir", args.data_dir, "--num-clients", str(args.num_clients),
              "--clients", str(args.clients), "--work", args.work]  # fmt: skip

    def run_here(tree: Path, flag: str) -> dict:
        cmd = [sys.executable, str(Path(__file__).resolve()), flag, *passed]
        done = subprocess.run(cmd, env=tree_env(tree), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{flag} from {tree}:\n{done.stderr[-3000:]}")
        loads.append(os.getloadavg()[0])
        return json.loads(done.stdout.strip().splitlines()[-1])

    found: dict[str, list[dict]] = {side: [] for side in trees}
    for _ in range(args.repeats):
        for side, tree in trees.items():
            found[side].append(run_here(tree, "--child"))
            print(side, found[side][-1], flush=True)
    pieces = run_here(ROOT, "--parts")
    shutil.rmtree(scratch)

    lines = [
        "# One small client's train message, in one process",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`"
        + (f", before: `{args.before_commit}`" if args.before_commit else "")
        + ".",
        f"- Command: `python benchmarks/client_message.py {shlex.join(sys.argv[1:])}`.",
        f"- Machine: {os.cpu_count()} cores, one torch thread (as a worker runs), shared with "
        f"other work: load average (1 min) {min(loads):.1f} to {max(loads):.1f}. Compare "
        "sides only within a table.",
        "",
        f"Ditto, MNIST's CNN (6.6 MB), a client of a {args.num_clients}-client IID federation "
        f"(15 training images), its personal model on disk. Median ms per message over "
        f"{args.clients} clients (the first three left out); one line per process.",
        "",
        "| side | state written like a simulation's (no fsync), ms | like a SuperNode's "
        "(fsynced), ms |",
        "|---|---|---|",
    ]
    for side, runs in found.items():
        for r in runs:
            lines.append(f"| {side} | {1000 * r['simulated']:.1f} | {1000 * r['durable']:.1f} |")
    lines += ["", "The message's parts on this tree (a simulation's store), median ms:", "",
              "| part | ms |", "|---|---|"]  # fmt: skip
    lines += [f"| {name} | {ms:.1f} |" for name, ms in pieces.items()]
    t15, t32 = pieces["train_epochs, 15 images"], pieces["train_epochs, 32 images"]
    per_image = (t32 - t15) / (32 - 15)
    fixed = t15 - 15 * per_image
    lines += [
        "",
        f"One step costs about {fixed:.1f} ms plus {per_image:.2f} ms an image here: a client "
        f"of 15 images pays the {fixed:.1f} ms once per model trained, where the same images "
        f"in clients of 525 (17 steps of up to 32) pay 17/35 of it.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
