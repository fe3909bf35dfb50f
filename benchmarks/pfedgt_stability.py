"""pFedGT on CIFAR-10: the message step λ and the stability of long runs.

The paper's λ = 0.7 with 5 of 20 clients a round moves c by 0.7/5 of each update where the
mean of the stored messages moves by 1/20 (Lemma 1 tracks it exactly with λ = |S|/m = 0.25),
so c drifts away from the average it stands for. This script runs pFedGT in
``pfedgt_cifar10.py``'s setting with several values of λ and tabulates accuracy per evaluation
round with the server's state metrics (‖θ‖ and c's tracking error, logged under
``train.server`` in ``rounds.jsonl``).

``--model cnn`` (the FedAvg CIFAR CNN, no BatchNorm) reads its λ = 0.7 runs from
``pfedgt_cifar10.py``'s runs directory and writes ``pfedgt_stability.md``. Any other model
(``cnn-bn``: the same CNN with BatchNorm after each convolution) runs every λ itself and
writes ``pfedgt_stability_<model>.md`` with a plot per α. A λ of ``tracking`` is the rule
λ = |S^t|/m (``pfedgt.lambda-rule=tracking``); every run sets λ's rule explicitly, so the
table does not depend on pFedGT's defaults.

Usage::

    python benchmarks/pfedgt_stability.py --alphas 1.0 0.1 --lambdas 0.25 --rounds 20
    python benchmarks/pfedgt_stability.py --model cnn-bn --alphas 0.1 1.0 \\
        --lambdas 0.7 tracking --rounds 20 --data-dir /work/shared/data
    python benchmarks/pfedgt_stability.py --model cnn-bn --lambdas 0.7 tracking --report-only
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pfedgt_cifar10 import ROOT, completed_summary, run_config, run_name

from pflarena.reporting.plots import compare_plot
from pflarena.runtime.launch import simulate
from pflarena.server.build import parse_config

PAPER_LAMBDA = "0.7"
TRACKING = "tracking"


def _lambda(text: str) -> str:
    if text == TRACKING:
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"λ must be a number or {TRACKING!r}, got {text!r}"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"λ must be > 0, got {text!r}")
    return str(value)


def lambda_overrides(lam: str) -> dict:
    """The run config that sets λ: a fixed value or the tracking rule λ = |S^t|/m."""
    if lam == TRACKING:
        return {"pfedgt.lambda-rule": "tracking"}
    return {"pfedgt.lambda-rule": "fixed", "pfedgt.lambda": float(lam)}


def run_dir(args: argparse.Namespace, alpha: float, lam: str, buffers: str = "personal") -> Path:
    if args.model == "cnn":
        if lam == PAPER_LAMBDA:
            return Path(args.main_runs_dir) / run_name(alpha, args.rounds, "pfedgt")
        return Path(args.runs_dir) / f"a{alpha}-r{args.rounds}-lambda{lam}"
    suffix = "" if buffers == "personal" else f"-buffers-{buffers}"
    return Path(args.runs_dir) / f"a{alpha}-r{args.rounds}-{args.model}-lambda{lam}{suffix}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--alphas", type=float, nargs="+", default=[1.0, 0.1])
    parser.add_argument("--lambdas", type=_lambda, nargs="+", default=["0.25"])
    parser.add_argument(
        "--start-buffers",
        nargs="+",
        choices=("personal", "theta"),
        default=["personal"],
        help="pfedgt.start-buffers values to run (BatchNorm models; default: personal)",
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--model", default="cnn")
    parser.add_argument(
        "--round-timeout",
        type=float,
        default=3600.0,
        help="seconds the server waits for a round's replies (default 3600: on a busy machine "
        "600 s dropped clients; a row with failures is not comparable)",
    )
    parser.add_argument(
        "--engine", choices=("ray", "inprocess"), default="ray", help="see `pflarena run --help`"
    )
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "pfedgt-diag"))
    parser.add_argument("--main-runs-dir", default=str(ROOT / "runs" / "pfedgt-cifar10"))
    parser.add_argument("--out", default=None, help="default: results/pfedgt_stability[_M].md")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if args.out is None:
        name = "pfedgt_stability" + ("" if args.model == "cnn" else f"_{args.model}")
        args.out = str(ROOT / "benchmarks" / "results" / f"{name}.md")

    if not args.report_only:
        for alpha in args.alphas:
            for lam in args.lambdas:
                for buffers in args.start_buffers:
                    out = run_dir(args, alpha, lam, buffers)
                    if completed_summary(out) is not None:
                        continue
                    print(
                        f"== pfedgt {args.model} α={alpha} λ={lam} buffers={buffers} "
                        f"({args.rounds} rounds)",
                        flush=True,
                    )
                    cfg = (
                        run_config("pfedgt", alpha, args, out)
                        | lambda_overrides(lam)
                        | {"pfedgt.start-buffers": buffers, "round-timeout": args.round_timeout}
                    )
                    simulate(parse_config(cfg), verbosity=0, engine=args.engine)
                    write_report(args)
    write_report(args)


def _row(path: Path, alpha: float, lam: str, label: str) -> str | None:
    if completed_summary(path) is None:
        return None
    summary = json.loads((path / "summary.json").read_text())
    rounds = [json.loads(line) for line in (path / "rounds.jsonl").read_text().splitlines()]
    evals = [r for r in rounds if r.get("evaluation") and r["round"] > 0]
    pers = " / ".join(f"{100 * r['evaluation']['personalized']['mean']:.1f}" for r in evals)
    glob = " / ".join(f"{100 * r['evaluation']['global']['mean']:.1f}" for r in evals)
    trained = [r for r in rounds if r.get("train") and r["train"].get("loss")]
    if not trained:
        return None
    worst = max(trained, key=lambda r: r["train"]["loss"])
    server = {r["round"]: r["train"].get("server") or {} for r in trained}
    norms = " / ".join(
        f"{server[r['round']]['theta-norm']:.1f}"
        for r in evals
        if "theta-norm" in server.get(r["round"], {})
    )
    errors = [s["message-tracking-error"] for s in server.values() if "message-tracking-error" in s]
    failures = sum(r["train"].get("failures", 0) for r in trained) + sum(
        r["evaluation"].get("failures", 0) for r in evals
    )
    error = f"{errors[-1]:.2f} (max {max(errors):.2f})" if errors else "—"
    shown = r"\|S\|/m" if lam == TRACKING else lam  # pipes escaped: a table cell
    return (
        f"| {alpha} | {shown} | {label} | {pers} | {glob} "
        f"| {worst['train']['loss']:.2f} (round {worst['round']}) | {norms or '—'} "
        f"| {error} | {failures} | {summary['status']} |"
    )


def write_report(args: argparse.Namespace) -> None:
    evals = "/".join(str(r) for r in range(args.eval_every, args.rounds + 1, args.eval_every))
    out = Path(args.out)
    if args.model == "cnn":
        command = (
            f"`python benchmarks/pfedgt_stability.py --rounds {args.rounds}` after "
            f"`python benchmarks/pfedgt_cifar10.py --rounds {args.rounds}` (whose pFedGT runs "
            "are the λ = 0.7 rows)."
        )
        model = "FedAvg CIFAR CNN"
    else:
        command = (
            f"`python benchmarks/pfedgt_stability.py --model {args.model} --alphas "
            f"{' '.join(map(str, args.alphas))} --lambdas {' '.join(args.lambdas)} "
            f"--start-buffers {' '.join(args.start_buffers)} --rounds {args.rounds} "
            f"--eval-every {args.eval_every} --lr {args.lr} --round-timeout "
            f"{args.round_timeout:g} --data-dir /work/shared/data`"
        )
        model = f"`{args.model}`"
    lines = [
        f"# pFedGT on CIFAR-10 ({args.model}): the message step λ and long-run stability",
        "",
        f"Command: {command}",
        "",
        f"Setting: `pfedgt_cifar10.py`'s ({model}, PFLlib Dirichlet split, 20 clients, "
        "5 a round, E=5, B=128, lr 0.05, γ=0.8, μ=0.05, ρ=0, η_s=1), 2 CPU cores. Accuracy "
        f"in %, mean over the 20 clients, at rounds {evals}. ‖θ‖ (trainable parameters) at the "
        "same rounds. Tracking error: ‖c − (1/m)Σc_i‖ / ‖(1/m)Σc_i‖ over the messages the "
        "clients store, after the last round and its largest value over the run (0 when "
        "λ = |S|/m = 0.25). Failed replies: train and evaluation replies the server did not "
        "get in time or rejected, over the run (a row with failures is not comparable).",
        "",
        f"| α | λ | run | personalized ({evals}) | θ as global model | highest train loss "
        "| ‖θ‖ | tracking error | failed replies | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    plotted: dict[float, list[Path]] = {}
    for alpha in args.alphas:
        if args.model == "cnn":
            variants = [
                (PAPER_LAMBDA, run_dir(args, alpha, PAPER_LAMBDA), "paper's λ"),
                (
                    PAPER_LAMBDA,
                    Path(args.runs_dir) / f"a{alpha}-r{args.rounds}-lambda0.7-metrics",
                    "paper's λ, rerun with state metrics",
                ),
                *((lam, run_dir(args, alpha, lam), "") for lam in args.lambdas),
            ]
        else:
            variants = [
                (
                    lam,
                    run_dir(args, alpha, lam, buffers),
                    f"{'paper' if lam == PAPER_LAMBDA else 'exact tracking'}, "
                    f"{'own' if buffers == 'personal' else 'θ'} BN statistics",
                )
                for lam in args.lambdas
                for buffers in args.start_buffers
            ]
        for lam, path, label in variants:
            row = _row(path, alpha, lam, label)
            if row:
                lines.append(row)
                plotted.setdefault(alpha, []).append(path)
    if args.model == "cnn":
        lines += [
            "",
            'Rows without ‖θ‖ ran before the server logged it. The "rerun with state metrics" '
            "row is the λ = 0.7 configuration run again (`pflarena run` with the same settings, "
            f"into `{Path(args.runs_dir).name}/a1.0-r{args.rounds}-lambda0.7-metrics`); it "
            "differs a little from the first run because runs are not bit-reproducible on CPU.",
        ]
    else:
        for alpha, paths in plotted.items():
            plot = out.parent / f"{out.stem}_a{alpha}_r{args.rounds}.png"
            compare_plot(paths, plot)
            lines += ["", f"![α={alpha}, {args.model}, {args.rounds} rounds]({plot.name})"]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
