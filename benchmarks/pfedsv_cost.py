"""pFedSV's per-round cost on a client: local training against the Shapley utilities.

For each preset, the first ``1 + k`` clients of the split train E local epochs from θ⁰ (as
in round 1; each timed); client 0 then values its own model and k peers' models exactly as
its solver does (:class:`pflarena.client.solvers.pfedsv._Game`, R = 3|S| orderings,
:func:`pflarena.core.shapley.shapley_values`), on its whole validation split (the default,
the paper's) and on a random subsample of it (``pfedsv.validation-subsample``). Every time
is the median of ``--repeats`` runs measured side by side in this one process, so the
ratios hold on a loaded machine even where the seconds do not.

Usage::

    python benchmarks/pfedsv_cost.py
    python benchmarks/pfedsv_cost.py --presets pfedsv-digits --subsample 16 8
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from pflarena.client.solvers.pfedsv import _Game, validation_subsample
from pflarena.core.datasets.tensors import to_tensors
from pflarena.core.federation import load_client
from pflarena.core.models import build_model
from pflarena.core.shapley import shapley_values
from pflarena.core.training import train_epochs
from pflarena.server.presets import load_preset
from pflarena.server.registry import parse_config

ROOT = Path(__file__).resolve().parents[1]


def _median_time(work, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def measure(preset: str, peers: list[int], subsamples: list[int], repeats: int) -> list[dict]:
    loaded = load_preset(preset)
    cfg = parse_config({**loaded.config, "strategy": "pfedsv"})
    spec = cfg.federation_spec()
    base = build_model(cfg.model_name(), *_shape(spec), seed=cfg.seed)
    theta0 = copy.deepcopy(base.state_dict())
    peers = sorted({min(k, cfg.num_clients - 1) for k in peers})
    clients = 1 + max(peers)
    trained, train_times = {}, []
    x_val = y_val = None
    for client in range(clients):
        data, info = load_client(spec, client)
        x, y = to_tensors(data.x_train, data.y_train, info)
        if client == 0:
            x_val, y_val = to_tensors(data.x_val, data.y_val, info)

        def train(x=x, y=y, client=client):
            model = copy.deepcopy(base)
            model.load_state_dict(theta0)
            train_epochs(
                model, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                generator=torch.Generator().manual_seed(client),
            )  # fmt: skip
            return model

        seconds, model = _median_time(train, repeats)
        train_times.append(seconds)
        trained[client] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    training = statistics.median(train_times)
    rows = []
    for k in peers:
        players = list(range(k + 1))
        for size in [0, *subsamples]:

            def game(size=size, players=players):
                xs, ys = validation_subsample(
                    x_val, y_val, size, torch.Generator().manual_seed(size)
                )
                g = _Game(copy.deepcopy(base), players, trained, xs, ys, 0.0)
                values = shapley_values(
                    g.utility, players, 3 * len(players), rng=np.random.default_rng(0)
                )
                return g.evaluations, values

            seconds, (evaluations, values) = _median_time(game, repeats)
            rows.append(
                {
                    "preset": preset,
                    "coalition": k + 1,
                    "validation": len(y_val) if size == 0 else min(size, len(y_val)),
                    "evaluations": evaluations,
                    "utility_s": seconds,
                    "training_s": training,
                    "ratio": seconds / training,
                    "own_value": values[0],
                }
            )
    return rows


def _shape(spec) -> tuple[tuple[int, ...], int]:
    _, info = load_client(spec, 0)
    return tuple(info.input_shape), info.num_classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["pfedsv-digits", "pfedsv-digits-groups"])
    parser.add_argument("--peers", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--subsample", type=int, nargs="+", default=[16, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pfedsv_cost.md"))
    args = parser.parse_args()
    rows = [r for p in args.presets for r in measure(p, args.peers, args.subsample, args.repeats)]
    lines = [
        "# pFedSV: Shapley utilities against local training, per client and round",
        "",
        f"Command: `python benchmarks/pfedsv_cost.py --presets {' '.join(args.presets)} "
        f"--peers {' '.join(map(str, args.peers))} --subsample "
        f"{' '.join(map(str, args.subsample))} --repeats {args.repeats}` (niced, on a 2-core "
        "CPU shared with other jobs: compare the ratios, measured side by side, not the "
        "seconds). Training: E local epochs of one client from θ⁰, the median over the clients "
        "and repeats. Utilities: client 0's whole game (R = 3|S| orderings, exact enumeration "
        "where it is cheaper) on its validation split or a subsample of it.",
        "",
        "| preset | coalition | validation images | utility evaluations | utilities (s) "
        "| training (s) | utilities / training | own SV |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['coalition']} | {r['validation']} | {r['evaluations']} | "
            f"{r['utility_s']:.3f} | {r['training_s']:.3f} | {r['ratio']:.2f} | "
            f"{r['own_value']:.3f} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
