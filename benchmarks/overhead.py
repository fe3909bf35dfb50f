"""Overhead of a Flower simulation round against a plain in-process PyTorch loop.

Both sides do the same work per round: every one of the clients trains the FedAvg CNN on its
own MNIST shard for the same epochs, batch size and learning rate, from the same global
model, and the server averages the results (example-weighted). The Flower side is a real
`pflarena run` simulation (SuperLink, Ray actors, one ClientApp call per client and round);
the plain side is one Python process looping over the clients.

Rounds 2.. are timed on both sides (round 1 includes Ray's actor start and data loading).
The Flower simulation uses one CPU per client actor; the plain loop gets every core for torch.

Usage::

    python benchmarks/overhead.py --data-dir ../shared/data --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pflarena.core.datasets import to_tensors
from pflarena.core.federation import build_federation
from pflarena.core.models import build_model
from pflarena.core.training import train_epochs
from pflarena.runtime.launch import simulate
from pflarena.server.build import parse_config
from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]


def plain_loop(cfg, rounds: int, threads: int) -> list[float]:
    """FedAvg over all clients in one process; returns each round's wall time."""
    torch.set_num_threads(threads)
    federation = build_federation(cfg.federation_spec())
    info = federation.info
    data = [(*to_tensors(c.x_train, c.y_train, info), len(c.y_train)) for c in federation.clients]
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes, seed=cfg.seed)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    times = []
    for server_round in range(1, rounds + 1):
        start = time.perf_counter()
        states, weights = [], []
        for client_id, (x, y, n) in enumerate(data):
            model.load_state_dict(global_state)
            generator = torch.Generator().manual_seed(
                cfg.seed * 1_000_003 + client_id * 7919 + server_round
            )
            train_epochs(
                model,
                x,
                y,
                epochs=cfg.local_epochs,
                batch_size=cfg.batch_size,
                lr=cfg.lr,
                generator=generator,
            )
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            weights.append(n)
        total = float(sum(weights))
        global_state = {
            k: sum(s[k].float() * (w / total) for s, w in zip(states, weights, strict=True)).to(
                global_state[k].dtype
            )
            for k in global_state
        }
        times.append(time.perf_counter() - start)
    return times


def flower_rounds(cfg, rounds: int, workdir: Path) -> tuple[list[dict], float]:
    cfg = cfg.model_copy(
        update={"num_rounds": rounds, "eval_every": 10_000, "output_dir": str(workdir / "flower")}
    )
    start = time.perf_counter()
    simulate(cfg, verbosity=0)
    wall = time.perf_counter() - start
    return [r for r in read_rounds(workdir / "flower" / "rounds.jsonl") if r["round"] >= 1], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--num-clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "overhead.md"))
    args = parser.parse_args()

    cfg = parse_config(
        {
            "strategy": "fedavg",
            "dataset": "mnist",
            "data-dir": args.data_dir,
            "model": "cnn",
            "partition": "iid",
            "num-clients": args.num_clients,
            "fraction-train": 1.0,
            "local-epochs": args.local_epochs,
            "batch-size": args.batch_size,
            "lr": 0.05,
        }
    )
    cores = os.cpu_count() or 1
    build_federation(cfg.federation_spec())  # decode and cache before timing anything

    plain_all = plain_loop(cfg, args.rounds, threads=cores)
    plain_one = plain_loop(cfg, args.rounds, threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        rounds, wall = flower_rounds(cfg, args.rounds, Path(tmp))

    timed = rounds[1:]  # round 1 includes actor start-up and data loading
    flower = statistics.mean(r["train_time_s"] for r in timed)
    client = statistics.mean(r["train"]["client_time_s"] for r in timed)
    plain = statistics.mean(plain_all[1:])
    plain1 = statistics.mean(plain_one[1:])
    actors = cores  # one CPU per client actor
    compute_share = client / actors
    result = {
        "flower_round_s": flower,
        "plain_round_s": plain,
        "plain_round_1thread_s": plain1,
        "ratio": flower / plain,
        "client_compute_s_summed": client,
        "client_compute_s_per_actor": compute_share,
        "flower_first_round_s": rounds[0]["train_time_s"],
        "flower_process_wall_s": wall,
        "bytes_per_round": timed[0]["bytes_up"] + timed[0]["bytes_down"],
    }
    lines = [
        "# Overhead: Flower simulation round vs. a plain PyTorch loop",
        "",
        f"Command: `python benchmarks/overhead.py --num-clients {args.num_clients} --rounds {args.rounds} "
        f"--local-epochs {args.local_epochs} --batch-size {args.batch_size}` "
        f"(real MNIST from `--data-dir`, FedAvg CNN, IID, full participation).",
        f"Machine: {platform.processor() or platform.machine()}, {cores} cores, torch {torch.__version__}, "
        f"device CPU. One run; rounds 2..{args.rounds} averaged.",
        "",
        "| measure | seconds |",
        "|---|---|",
        f"| Flower simulation round (train phase, {args.num_clients} clients, {actors} actors x 1 thread) | {flower:.2f} |",
        f"| plain loop round, torch with {cores} threads | {plain:.2f} |",
        f"| plain loop round, torch with 1 thread | {plain1:.2f} |",
        f"| **ratio Flower / plain ({cores} threads)** | **{flower / plain:.2f}x** |",
        f"| ratio Flower / plain (1 thread) | {flower / plain1:.2f}x |",
        f"| client solver time, summed over clients | {client:.2f} |",
        f"| client solver time per actor (summed / {actors}) | {compute_share:.2f} |",
        f"| Flower round minus per-actor compute (messaging, (de)serialisation, scheduling) | {flower - compute_share:.2f} |",
        f"| first Flower round (Ray actors start, data loaded) | {rounds[0]['train_time_s']:.2f} |",
        f"| whole `pflarena run` process, {args.rounds} rounds + 2 evaluations | {wall:.1f} |",
        "",
        f"Model traffic per round: {result['bytes_per_round'] / 1e6:.1f} MB (up + down).",
        "",
        "```json",
        json.dumps(result, indent=2),
        "```",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
