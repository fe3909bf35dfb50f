"""pFedSV's per-round cost on a client: local training against the Shapley utilities.

On a preset's federation (by default ``pfedsv-mnist-dirichlet``, the paper's MNIST CNN),
the first ``1 + k`` clients train E local epochs from θ⁰ (round 1 of a run). Client 0 then
plays its game over its own model and k peers' models exactly as its solver does
(:class:`pflarena.methods.pfedsv.solver._Game`, R = 3|S| orderings, exact enumeration
where that is cheaper, :func:`pflarena.methods.pfedsv.shapley.shapley_values`), once on its whole
validation split (the default, the paper's) and once per ``--subsample`` size
(``pfedsv.validation-subsample``). Each repeat times, one after another in this process,
client 0's E local epochs, each game, and the two extra validation passes the solver
logs (the aggregate against the own model), so every ratio is taken side by side; the
table gives the medians over the repeats. Torch runs on one thread, as a simulated client
does.

The subsample's effect on accuracy: for every one of the ``1 + k`` clients as the owner,
the aggregate θ_i^{t*} of Eq. 6-7 (round-start distances: from θ⁰ in round 1) is built
from the whole split's Shapley values and from each subsample's (a fresh draw per repeat),
and scored on that client's test split.

Usage::

    python benchmarks/pfedsv_cost.py
    python benchmarks/pfedsv_cost.py --preset pfedsv-digits --subsample 16 8
"""

from __future__ import annotations

import argparse
import copy
import csv
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from pflarena.core.datasets.tensors import to_tensors
from pflarena.core.federation import load_client
from pflarena.core.models import build_model
from pflarena.core.presets import load_preset
from pflarena.core.training import train_epochs
from pflarena.methods.pfedsv import solver as solver
from pflarena.methods.pfedsv.shapley import shapley_values
from pflarena.methods.pfedsv.solver import (
    _Game,
    aggregation_weights,
    eq6_distances,
    own_accuracy,
    validation_subsample,
)
from pflarena.server.build import parse_config

ROOT = Path(__file__).resolve().parents[1]


def _timed(work):
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def _flat(state: dict[str, torch.Tensor], names: list[str]) -> np.ndarray:
    return np.concatenate([state[k].detach().double().numpy().ravel() for k in names])


def _test_accuracy(model: torch.nn.Module, state: dict, x: torch.Tensor, y: torch.Tensor) -> float:
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def measure(args: argparse.Namespace) -> tuple[list[dict], list[dict], dict]:
    loaded = load_preset(args.preset)
    config = {**loaded.config, "strategy": "pfedsv"}
    if config.get("dataset") != "digits":
        config["data-dir"] = args.data_dir
    cfg = parse_config(config)
    spec = cfg.federation_spec()
    k = min(args.peers, cfg.num_clients - 1)
    clients = list(range(k + 1))
    data = {}
    for c in clients:
        d, info = load_client(spec, c)
        data[c] = (
            to_tensors(d.x_train, d.y_train, info),
            to_tensors(d.x_val, d.y_val, info),
            to_tensors(d.x_test, d.y_test, info),
        )
    base = build_model(cfg.model_name(), tuple(info.input_shape), info.num_classes, seed=cfg.seed)
    theta0 = {k_: v.detach().clone() for k_, v in base.state_dict().items()}
    measured = [n for n, p in base.named_parameters() if p.requires_grad]

    epochs = args.epochs or cfg.local_epochs

    def train(c: int) -> dict:
        (x, y), _, _ = data[c]
        model = copy.deepcopy(base)
        train_epochs(
            model, x, y, epochs=epochs, batch_size=cfg.batch_size, lr=cfg.lr,
            generator=torch.Generator().manual_seed(c),
        )  # fmt: skip
        return {k_: v.detach().clone() for k_, v in model.state_dict().items()}

    trained = {c: train(c) for c in clients}  # the players' models: θ_j^1 after `epochs`
    print("players trained", flush=True)

    def game(owner: int, size: int, draw: int, chunk: int = solver.EVAL_CHUNK) -> tuple:
        _, (xv, yv), _ = data[owner]
        xs, ys = validation_subsample(xv, yv, size, torch.Generator().manual_seed(draw))
        players = [owner, *[c for c in clients if c != owner]]
        default, solver.EVAL_CHUNK = solver.EVAL_CHUNK, chunk
        try:
            started = time.perf_counter()
            g = _Game(copy.deepcopy(base), players, trained, xs, ys, 0.0)
            utilities: dict = {}
            values = shapley_values(
                g.utility, players, 3 * len(players), rng=np.random.default_rng(draw),
                cache=utilities,
            )  # fmt: skip
            seconds = time.perf_counter() - started  # the utilities alone
        finally:
            solver.EVAL_CHUNK = default
        g.utilities = utilities
        distances = eq6_distances(
            [_flat(trained[p], measured) for p in players], _flat(theta0, measured)
        )
        weights = aggregation_weights([values[p] for p in players], distances)
        aggregate = trained[owner] if weights is None else g.average(players, weights)
        return seconds, g, values, aggregate

    sizes = [0, *args.subsample]
    timing: list[dict] = []
    for repeat in range(args.repeats):
        seconds, _ = _timed(lambda: train(0))
        # a round trains E epochs; each epoch costs the same (the same number of batches)
        seconds *= cfg.local_epochs / epochs
        timing.append({"repeat": repeat, "what": "training", "size": "", "seconds": seconds})
        # the previous code's 1,024-image chunks, for the speed-up; the values must not move
        seconds, g, before, _ = game(0, 0, repeat, chunk=1024)
        timing.append(
            {"repeat": repeat, "what": "utilities-1024", "size": 0, "seconds": seconds,
             "evaluations": g.evaluations, "validation": len(g.y_val)}
        )  # fmt: skip
        for size in sizes:
            seconds, g, values, aggregate = game(0, size, repeat)
            if size == 0 and values != before:
                raise AssertionError(f"chunking changed the Shapley values: {before} {values}")
            timing.append(
                {"repeat": repeat, "what": "utilities", "size": size, "seconds": seconds,
                 "evaluations": g.evaluations, "validation": len(g.y_val)}
            )  # fmt: skip
            seconds, _ = _timed(
                lambda g=g, a=aggregate: (g.accuracy(a), own_accuracy(g, g.utilities, 0))
            )
            timing.append({"repeat": repeat, "what": "logging", "size": size, "seconds": seconds})
        print("repeat", repeat, "done", flush=True)
    accuracy: list[dict] = []
    for owner in clients:
        _, _, (x_test, y_test) = data[owner]
        model = copy.deepcopy(base)
        own = _test_accuracy(model, trained[owner], x_test, y_test)
        full_values, full_acc = None, None
        for size in sizes:
            for draw in range(1 if size == 0 else args.repeats):
                _, _, values, aggregate = game(owner, size, draw)
                acc = _test_accuracy(model, aggregate, x_test, y_test)
                if size == 0:
                    full_values, full_acc = values, acc
                accuracy.append(
                    {"owner": owner, "size": size, "draw": draw, "own": own, "aggregate": acc,
                     "delta": acc - full_acc,
                     "sv_error": max(abs(values[p] - full_values[p]) for p in values)}
                )  # fmt: skip
        print("owner", owner, "done", flush=True)
    meta = {
        "preset": args.preset,
        "epochs": cfg.local_epochs,
        "timed_epochs": epochs,
        "coalition": k + 1,
        "train_images": len(data[0][0][1]),
        "validation": {c: len(data[c][1][1]) for c in clients},
    }
    return timing, accuracy, meta


def report(timing: list[dict], accuracy: list[dict], meta: dict, command: str) -> str:
    training = statistics.median(t["seconds"] for t in timing if t["what"] == "training")
    sizes = sorted({t["size"] for t in timing if t["what"] == "utilities"})
    lines = [
        "# pFedSV: Shapley utilities against local training, per client and round",
        "",
        f"Command: `{command}` (niced, torch on one thread as in a simulated client, on a "
        "2-core CPU shared with other jobs: compare the ratios, measured side by side in "
        "this one process, not the seconds). "
        f"Preset `{meta['preset']}`, round 1: client 0 ({meta['train_images']} training "
        f"images) trains E = {meta['epochs']} epochs"
        + (
            ""
            if meta["timed_epochs"] == meta["epochs"]
            else f" (timed: {meta['timed_epochs']} epoch(s) from θ⁰, scaled by "
            f"{meta['epochs']}/{meta['timed_epochs']}, since every epoch runs the same "
            "batches; the players' models below are these shorter-trained ones)"
        )
        + f"; its game has {meta['coalition']} "
        "players (its own model and the next clients' round-1 models; "
        f"R = 3|S| orderings, exact enumeration where cheaper). Medians over the repeats; "
        "logging: the extra validation passes of the solver (the aggregate; the own model's "
        "accuracy is v({own}) when the game evaluated it). The first row runs the "
        "utilities as the code did before, in 1,024-image chunks; the next gives the "
        "same Shapley values (checked in every repeat) in 256-image chunks.",
        "",
        "| validation images | utility evaluations | utilities (s) | logging (s) "
        "| training (s) | utilities / training | (utilities + logging) / training |",
        "|---|---|---|---|---|---|---|",
    ]
    before = [t for t in timing if t["what"] == "utilities-1024"]
    if before:
        u = statistics.median(t["seconds"] for t in before)
        lines.append(
            f"| {before[0]['validation']} (all), 1,024-image chunks (before) | "
            f"{before[0]['evaluations']} | {u:.2f} | | {training:.2f} | {u / training:.2f} | |"
        )
    for size in sizes:
        util = [t for t in timing if t["what"] == "utilities" and t["size"] == size]
        log = statistics.median(
            t["seconds"] for t in timing if t["what"] == "logging" and t["size"] == size
        )
        u = statistics.median(t["seconds"] for t in util)
        label = f"{util[0]['validation']}" + (" (all)" if size == 0 else " (subsample)")
        lines.append(
            f"| {label} | {util[0]['evaluations']} | {u:.2f} | {log:.2f} | {training:.2f} | "
            f"{u / training:.2f} | {(u + log) / training:.2f} |"
        )
    lines += [
        "",
        "The subsample's effect on accuracy (round 1, each of the clients as the owner; "
        "its validation images: "
        + ", ".join(f"{c}: {n}" for c, n in meta["validation"].items())
        + "): test accuracy in % of the aggregate θ_i^{t*} built from the whole split's "
        "Shapley values and from a subsample's (mean over the clients and draws), its mean "
        "and worst change against the whole split's, and the largest error of a Shapley "
        "value.",
        "",
        "| validation | own θ_i^t | aggregate θ_i^{t*} | change (mean) | change (worst) "
        "| largest SV error |",
        "|---|---|---|---|---|---|",
    ]
    for size in sizes:
        rows = [a for a in accuracy if a["size"] == size]
        lines.append(
            f"| {'all' if size == 0 else size} | {100 * np.mean([a['own'] for a in rows]):.2f} | "
            f"{100 * np.mean([a['aggregate'] for a in rows]):.2f} | "
            f"{100 * np.mean([a['delta'] for a in rows]):+.2f} | "
            f"{100 * min(a['delta'] for a in rows):+.2f} | "
            f"{max(a['sv_error'] for a in rows):.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="pfedsv-mnist-dirichlet")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--peers", type=int, default=5)
    parser.add_argument("--subsample", type=int, nargs="+", default=[256, 128])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--epochs", type=int, default=0,
        help="local epochs to train and time (0: the preset's E); the time is scaled to E",
    )  # fmt: skip
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pfedsv_cost.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    timing, accuracy, meta = measure(args)
    command = (
        f"python benchmarks/pfedsv_cost.py --preset {args.preset} --peers {args.peers} "
        f"--subsample {' '.join(map(str, args.subsample))} --repeats {args.repeats}"
        + (f" --epochs {args.epochs}" if args.epochs else "")
    )
    text = report(timing, accuracy, meta, command)
    out = Path(args.out)
    out.write_text(text)
    for name, rows in (("timing", timing), ("accuracy", accuracy)):
        with out.with_name(f"{out.stem}_{name}.csv").open("w", newline="") as handle:
            fields = sorted({k for r in rows for k in r})
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
    print(text)


if __name__ == "__main__":
    main()
