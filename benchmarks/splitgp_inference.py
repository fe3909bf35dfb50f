"""SplitGP's inference rule on a finished run: personalized accuracy against the share of
test samples offloaded to the server, for several λ and entropy thresholds.

SplitGP (``pflarena/methods/splitgp/strategy.py``) evaluates each client with its client-side
model ``λ (φ_k, κ_k) + (1 − λ) (φ̄, κ̄)`` and sends a test sample to the server side θ̄ when
the client-side output's entropy exceeds the threshold. Both knobs act at inference only,
so this script re-evaluates a run's final state (its checkpoint: φ̄, θ̄ and κ̄; each client's
accepted (φ_k, κ_k) in ``client-state``) at other values without training again. Every
evaluation goes through the SplitGP solver's own ``evaluate`` with the message the
strategy would send, only λ and the threshold changed. A threshold of 0 offloads every
sample (θ̄ on the client's features); ``inf`` none (the client-side model alone).

Usage::

    python benchmarks/splitgp_inference.py runs/baselines2/pfedgt-cifar10-a0.1/splitgp \\
        --lambdas 0.2 1.0 --thresholds 0 0.1 0.5 1.0 inf
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from pflarena.client.job import ClientJob, load_node_data, pick_device
from pflarena.client.state import ClientState, run_key
from pflarena.core import keys
from pflarena.core.config import parse_run_config
from pflarena.core.versions import DiskVersions
from pflarena.methods.splitgp import keys as splitgp_keys
from pflarena.methods.splitgp import solver as solver
from pflarena.server.build import build_strategy
from pflarena.server.checkpoint import load_checkpoint
from pflarena.strategies.aggregation import as_record


def client_counts(run_dir: Path, lambdas: list[float], thresholds: list[float]) -> dict:
    """For each client, each (λ, threshold): the solver's evaluation metrics."""
    recorded = json.loads((run_dir / "config.json").read_text())
    run_config = recorded["run_config"]
    # the clients' state lies under the key the run drew (older runs: the config's digest)
    state_key = recorded.get("state_key") or run_key(run_config)
    cfg = parse_run_config(run_config)
    if cfg.strategy != "splitgp":
        raise SystemExit(f"{run_dir} is a {cfg.strategy!r} run, not splitgp")
    checkpoint = load_checkpoint(run_dir, "splitgp")
    if checkpoint is None:
        raise SystemExit(f"{run_dir} has no checkpoint.npz")
    strategy = build_strategy(cfg)
    strategy.restore_state(checkpoint.strategy_arrays, checkpoint.strategy_meta)
    accepted = {int(k): int(v) for k, v in checkpoint.strategy_meta["accepted"].items()}
    device = pick_device("cpu")
    base = strategy.evaluate_config(checkpoint.server_round)
    counts: dict[int, dict] = {}
    for client in range(cfg.num_clients):
        data = load_node_data(
            cfg, {"partition-id": client, "num-partitions": cfg.num_clients}, device
        )
        store = DiskVersions(run_dir / "client-state" / state_key / f"client-{client}")
        counts[client] = {}
        for lam in lambdas:
            for threshold in thresholds:
                config = base | strategy.method_config(
                    **{
                        **strategy.params.model_dump(by_alias=True),
                        "lambda": lam,
                        "entropy-threshold": threshold,
                    }
                )
                job = ClientJob(
                    cfg=cfg,
                    data=data,
                    state=ClientState(store, accepted.get(client), None, prune=False),
                    content=RecordDict(
                        {
                            keys.ARRAYS: checkpoint.arrays,
                            splitgp_keys.AUX: as_record(strategy.aux),
                            keys.CONFIG: ConfigRecord(config),
                        }
                    ),
                    device=device,
                )
                # the solver's own evaluation, global model included: the global accuracy
                # is recomputed per setting, a small price for no second copy of the rule
                counts[client][(lam, threshold)] = solver.evaluate(job)
    return counts


def table(counts: dict, lambdas: list[float], thresholds: list[float]) -> list[str]:
    lines = [
        "| λ | threshold (nats) | personalized mean | pooled | offloaded | client side alone "
        "(mean) |",
        "|---|---|---|---|---|---|",
    ]
    for lam in lambdas:
        for threshold in thresholds:
            rows = [c[(lam, threshold)] for c in counts.values()]
            n = np.array([r[keys.PERSONALIZED_COUNT] for r in rows], float)
            right = np.array([r[keys.PERSONALIZED_CORRECT] for r in rows], float)
            sent = np.array([r[splitgp_keys.OFFLOADED] for r in rows], float)
            alone = np.array([r[splitgp_keys.CLIENT_SIDE_CORRECT] for r in rows], float)
            lines.append(
                f"| {lam:g} | {threshold:g} | {100 * np.mean(right / n):.2f} | "
                f"{100 * right.sum() / n.sum():.2f} | {100 * sent.sum() / n.sum():.1f} % | "
                f"{100 * np.mean(alone / n):.2f} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a finished splitgp run's output directory")
    parser.add_argument("--lambdas", type=float, nargs="+", default=[0.2, 1.0])
    parser.add_argument(
        "--thresholds", type=float, nargs="+", default=[0.0, 0.1, 0.5, 1.0, math.inf]
    )
    parser.add_argument("--out", type=Path, default=None, help="write the table here too")
    args = parser.parse_args()
    for value in args.lambdas:
        if not 0.0 <= value <= 1.0:
            parser.error(f"λ must be in [0, 1], got {value}")
    if any(t < 0 for t in args.thresholds):
        parser.error("thresholds must be >= 0")
    counts = client_counts(args.run_dir, args.lambdas, args.thresholds)
    run = json.loads((args.run_dir / "config.json").read_text())["run_config"]
    command = (
        f"python benchmarks/splitgp_inference.py {args.run_dir} --lambdas "
        + " ".join(f"{v:g}" for v in args.lambdas)
        + " --thresholds "
        + " ".join(f"{v:g}" for v in args.thresholds)
    )
    lines = [
        "# SplitGP: personalized accuracy against offloading, re-evaluated",
        "",
        f"Command: `{command}`.",
        "",
        f"SplitGP's inference rule re-evaluated on `{args.run_dir.name}`'s final state "
        f"({run['dataset']}, {run['num-clients']} clients, trained with λ = "
        f"{run.get('splitgp.lambda')}): accuracy in %, unweighted mean over the clients and "
        "pooled over their test samples; offloaded: share of all test samples sent to θ̄.",
        "",
        *table(counts, args.lambdas, args.thresholds),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
