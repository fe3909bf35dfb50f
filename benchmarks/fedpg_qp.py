"""FedPG's server-side cost: the min-norm QP (5) and the stale-gradient store.

1. The QP. For each K, random gradient sets of ``--dim`` parameters are drawn in three
   regimes, their Gram matrix is computed once, and the same Gram matrix is solved by the
   hand-written solver (``solver="fast"``) and by cvxpy (``solver="cvxpy"``, Clarabel with
   tight tolerances; problem construction included, as it is paid every round). Reported:
   the median solve time of each, their ratio, the largest relative objective gap
   ``(f_fast − f_cvxpy)/f_cvxpy`` (negative: the fast solver is lower), and the fast
   solver's largest relative KKT residual ``(λᵀPλ − min_k (Pλ)_k)/λᵀPλ``.

   * ``shared``: ``g_k = z_k + 0.5 c`` with a common component ``c`` (agreeing clients;
     the min-norm point has a partial support).
   * ``iid``: ``g_k = z_k`` (nearly orthogonal clients; every weight positive).
   * ``low-rank``: ``g_k`` in a random 20-dimensional subspace plus a shared component
     (K ≫ rank: a singular Gram matrix, as when many clients hold similar data).

2. The stale-gradient window (docs/papers/fedpg.md §2.5, §10): FedPG keeps each recently absent
   client's last gradient, ``4 · (trainable parameters)`` bytes in float32, for every model of the
   model zoo built for every data set it accepts (``pflarena.core.models.build_model``).

Usage::

    python benchmarks/fedpg_qp.py --ks 2 10 100 1000 --dim 5000 --repeats 5
    python benchmarks/fedpg_qp.py --memory-only   # the table only, the QP timings kept
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import cvxpy as cp
import numpy as np

from pflarena.algorithms.mgda import gram_matrix, min_norm_weights_from_gram

ROOT = Path(__file__).resolve().parents[1]
REGIMES = ("shared", "iid", "low-rank")


def gradients(regime: str, k: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    if regime == "shared":
        return rng.normal(size=(k, dim)) + 0.5 * rng.normal(size=dim)
    if regime == "iid":
        return rng.normal(size=(k, dim))
    if regime == "low-rank":
        basis = rng.normal(size=(20, dim))
        return rng.normal(size=(k, 20)) @ basis / np.sqrt(20) + 0.5 * rng.normal(size=dim)
    raise ValueError(f"unknown regime {regime!r}")


def timed(gram: np.ndarray, solver: str) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    weights = min_norm_weights_from_gram(gram, solver=solver)
    return time.perf_counter() - start, weights


def measure_qp(k: int, regime: str, args: argparse.Namespace) -> dict:
    rng = np.random.default_rng([args.seed, k, REGIMES.index(regime)])
    fast_s, cvx_s, gram_s, gaps, kkt = [], [], [], [], []
    for repeat in range(args.repeats):
        g = gradients(regime, k, args.dim, rng).astype(np.float32)
        start = time.perf_counter()
        gram = gram_matrix(g)
        gram_s.append(time.perf_counter() - start)
        seconds, fast = timed(gram, "fast")
        fast_s.append(seconds)
        pf = gram @ fast
        f_fast = float(fast @ pf)
        kkt.append((f_fast - pf.min()) / f_fast)
        if repeat < args.cvxpy_repeats:
            seconds, ref = timed(gram, "cvxpy")
            cvx_s.append(seconds)
            f_cvx = float(ref @ gram @ ref)
            gaps.append((f_fast - f_cvx) / f_cvx)
    fast_med, cvx_med = statistics.median(fast_s), statistics.median(cvx_s)
    return {
        "k": k,
        "regime": regime,
        "fast": fast_med,
        "cvxpy": cvx_med,
        "ratio": cvx_med / fast_med,
        "gap": max(gaps, key=abs),
        "kkt": max(kkt),
        "gram": statistics.median(gram_s),
        "sets": len(fast_s),
        "cvx_sets": len(cvx_s),
    }


def model_memory() -> tuple[list[str], list[str], dict[tuple[str, str], int]]:
    import torch

    from pflarena.core.datasets.registry import dataset_info, dataset_names
    from pflarena.core.models import MODEL_NAMES, TOKEN_MODELS, build_model

    torch.set_num_threads(1)
    datasets = list(dataset_names())
    params: dict[tuple[str, str], int] = {}
    for model in MODEL_NAMES:
        for dataset in datasets:
            info = dataset_info(dataset)
            if (model in TOKEN_MODELS) != bool(info.tokens):  # token ids need a token model
                continue
            try:
                net = build_model(model, tuple(info.input_shape), info.num_classes, seed=0)
            except (ValueError, RuntimeError):  # vector data, or images too small
                continue
            params[model, dataset] = sum(p.numel() for p in net.parameters() if p.requires_grad)
    return list(MODEL_NAMES), datasets, params


def report(args: argparse.Namespace, rows: list[dict], memory) -> str:
    return qp_section(args, rows) + memory_section(memory)


def qp_section(args: argparse.Namespace, rows: list[dict]) -> str:
    import clarabel
    import scipy

    lines = [
        "# FedPG: the min-norm QP and the stale-gradient store",
        "",
        f"Command: `python benchmarks/fedpg_qp.py --ks {' '.join(map(str, args.ks))} "
        f"--dim {args.dim} --repeats {args.repeats} --cvxpy-repeats {args.cvxpy_repeats}` "
        f"on {os.cpu_count()} CPU cores ({platform.machine()}), Python "
        f"{platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}, "
        f"cvxpy {cp.__version__} with Clarabel {clarabel.__version__}.",
        "",
        "## The QP (5): hand-written solver against cvxpy",
        "",
        f"Each row: {args.repeats} random float32 gradient sets of {args.dim} parameters "
        f"(cvxpy solves the first {args.cvxpy_repeats}), one K×K Gram matrix each, solved "
        "by both from the same Gram matrix. Times are medians in seconds; the Gram matrix "
        "(float64 accumulation) is timed apart. Gap: the largest relative objective "
        "difference (fast − cvxpy)/cvxpy, negative where the fast solver is lower. KKT: the "
        "fast solver's largest (λᵀPλ − min_k (Pλ)_k)/λᵀPλ, an upper bound on its relative "
        "suboptimality.",
        "",
        "| K | regime | fast (s) | cvxpy (s) | cvxpy / fast | gap | KKT | Gram (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['k']} | {r['regime']} | {r['fast']:.2e} | {r['cvxpy']:.2e} | "
            f"{r['ratio']:.1f}x | {r['gap']:.1e} | {r['kkt']:.1e} | {r['gram']:.2e} |"
        )
    return "\n".join(lines) + "\n\n"


MEMORY_HEADING = "## Stale-gradient store"


def memory_section(memory) -> str:
    models, datasets, params = memory
    lines = [
        MEMORY_HEADING,
        "",
        "Megabytes per client whose last gradient is kept (4 bytes per trainable parameter, "
        "float32), for each model built for each data set; the parameter count is in "
        "parentheses; — where the model does not accept the data set's input. With "
        "τ = M/|S^t| the window holds about 63% of the clients seen (docs/papers/fedpg.md §10); all of them "
        "in the worst case, so multiply by the number of clients: 100 clients of 1 MB "
        "each are 100 MB.",
        "",
        "| model | " + " | ".join(datasets) + " |",
        "|---|" + "---|" * len(datasets),
    ]
    for model in models:
        cells = [
            f"{4 * params[model, d] / 1e6:.3g} ({params[model, d]:,})"
            if (model, d) in params
            else "—"
            for d in datasets
        ]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 10, 100, 1000])
    parser.add_argument("--dim", type=int, default=5000, help="parameters per gradient")
    parser.add_argument("--repeats", type=int, default=5, help="gradient sets per K and regime")
    parser.add_argument(
        "--cvxpy-repeats", type=int, default=3, help="of those, how many cvxpy also solves"
    )
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/fedpg_qp.md")
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="time nothing: rewrite only the stale-gradient table of --out (for a new model)",
    )
    args = parser.parse_args(argv)
    if args.memory_only:
        old = args.out.read_text() if args.out.exists() else ""
        if MEMORY_HEADING not in old:
            parser.error(f"{args.out} holds no QP section to keep; run without --memory-only")
        args.out.write_text(old[: old.index(MEMORY_HEADING)] + memory_section(model_memory()))
        print(args.out.read_text())
        return
    args.cvxpy_repeats = max(1, min(args.cvxpy_repeats, args.repeats))

    warm = gram_matrix(np.eye(3) + 0.1)  # imports and first-call costs, outside the timings
    min_norm_weights_from_gram(warm, solver="cvxpy")
    min_norm_weights_from_gram(gram_matrix(np.random.default_rng(0).normal(size=(300, 5))))

    rows = []
    for k in args.ks:
        for regime in args.regimes:
            row = measure_qp(k, regime, args)
            rows.append(row)
            print(
                f"K={k:5d} {regime:8s} fast {row['fast']:.2e}s cvxpy {row['cvxpy']:.2e}s "
                f"x{row['ratio']:.1f} gap {row['gap']:.1e} kkt {row['kkt']:.1e}",
                flush=True,
            )
    text = report(args, rows, model_memory())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
