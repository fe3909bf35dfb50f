"""Per-round cost of pFedGT against FedAvg in the same Flower simulation setting.

pFedGT adds vector arithmetic on the clients and sends one more model-sized vector each
way (θ and c down, Δw and Δc up), so a round should cost little more than FedAvg's. Both
strategies run the same clients, participation, model, epochs and batches; rounds 2.. are
timed (round 1 starts Ray's actors); the c⁰ round of pFedGT is reported on its own.

Usage::

    python benchmarks/pfedgt_cost.py --data-dir ../shared/data --rounds 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch

from pflarena.core.federation import build_federation
from pflarena.runtime.launch import simulate
from pflarena.server.build import parse_config
from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]


def measure(strategy: str, base: dict, rounds: int, workdir: Path) -> dict:
    cfg = parse_config(
        {
            **base,
            "strategy": strategy,
            "num-rounds": rounds,
            "eval-every": 10_000,
            "output-dir": str(workdir / strategy),
        }
    )
    simulate(cfg, verbosity=0)
    records = read_rounds(workdir / strategy / "rounds.jsonl")
    timed = [r for r in records if r["round"] >= 2]
    return {
        "round_s": statistics.mean(r["train_time_s"] for r in timed),
        "client_s": statistics.mean(r["train"]["client_time_s"] for r in timed),
        "clients": statistics.mean(r["train"]["clients"] for r in timed),
        "bytes_up": statistics.mean(r["bytes_up"] for r in timed),
        "bytes_down": statistics.mean(r["bytes_down"] for r in timed),
        # pFedGT's c⁰ exchange (`init`, in round 1)
        "init_bytes": sum(
            e["bytes_down"] + e["bytes_up"]
            for r in records
            for e in r.get("exchanges", [])
            if e["name"] == "init"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--dataset", default="cifar10")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pfedgt_cost.md"))
    args = parser.parse_args()
    base = {
        "dataset": args.dataset,
        "data-dir": args.data_dir,
        "model": "cnn",
        "partition": "pfllib-dirichlet",
        "alpha": 0.1,
        "seed": 1,
        "num-clients": 20,
        "fraction-train": 0.25,
        "local-epochs": 1,
        "batch-size": 128,
        "lr": 0.05,
    }
    build_federation(parse_config(base).federation_spec())  # decode and cache first
    with tempfile.TemporaryDirectory() as tmp:
        results = {s: measure(s, base, args.rounds, Path(tmp)) for s in ("fedavg", "pfedgt")}
    fedavg, pfedgt = results["fedavg"], results["pfedgt"]
    mb = 1e6
    lines = [
        "# pFedGT per-round cost against FedAvg",
        "",
        f"Command: `python benchmarks/pfedgt_cost.py --dataset {args.dataset} --rounds {args.rounds}`: "
        f"{args.dataset} (offline copy), FedAvg CNN, PFLlib Dirichlet(0.1) over 20 clients, 25% "
        "participation (5 clients a round), 1 local epoch, batch 128, Flower simulation with "
        f"one CPU per client actor on {os.cpu_count()} cores, torch {torch.__version__} on CPU. "
        f"One run each; rounds 2..{args.rounds} averaged, evaluation excluded.",
        "",
        "| | FedAvg | pFedGT | pFedGT / FedAvg |",
        "|---|---|---|---|",
        f"| round wall time (s) | {fedavg['round_s']:.2f} | {pfedgt['round_s']:.2f} | "
        f"**{pfedgt['round_s'] / fedavg['round_s']:.2f}x** |",
        f"| client solver time per round, summed (s) | {fedavg['client_s']:.2f} | "
        f"{pfedgt['client_s']:.2f} | {pfedgt['client_s'] / fedavg['client_s']:.2f}x |",
        f"| bytes down per round (MB) | {fedavg['bytes_down'] / mb:.2f} | {pfedgt['bytes_down'] / mb:.2f} | "
        f"{pfedgt['bytes_down'] / fedavg['bytes_down']:.2f}x |",
        f"| bytes up per round (MB) | {fedavg['bytes_up'] / mb:.2f} | {pfedgt['bytes_up'] / mb:.2f} | "
        f"{pfedgt['bytes_up'] / fedavg['bytes_up']:.2f}x |",
        f"| bytes per client per round, up + down (MB) | "
        f"{(fedavg['bytes_up'] + fedavg['bytes_down']) / fedavg['clients'] / mb:.2f} | "
        f"{(pfedgt['bytes_up'] + pfedgt['bytes_down']) / pfedgt['clients'] / mb:.2f} | |",
        f"| one-off c⁰ round, all clients, up + down (MB) | — | {pfedgt['init_bytes'] / mb:.2f} | |",
        "",
        "Target: a pFedGT round costs at most 1.2x a FedAvg round. Traffic is 4d floats per client "
        "and round for pFedGT (θ and c down, Δw and Δc up) against FedAvg's 2d.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
