"""Do personalized models keep the global model's performance? FedPG against its baselines.

FedPG's claim (docs/papers/fedpg.md §6): its personalized models (P-models) score on *every*
client's test data about as well as the global model (G-model), while other personalized
methods lose an unpredictable amount. Each run here cross-evaluates every client's P-model
on every client's test split (``cross-eval-clients`` = all, ``server/crosseval.py``) and
reports, mean ± std over the clients:

* L-acc: the P-model on its own client's test split;
* S-acc: on its own and a fixed, seeded half of the other clients' (c = 50 %);
* G-acc: on every client's;
* GM: the global model's accuracy, mean over clients (methods with one);

and G-acc − GM, the generalization a P-model gives up. Labels besides the methods:
``fedpg-g0.3`` and ``fedpg-g1.0`` (γ floor), ``fedpg-pseudo`` (pseudo-gradients of the
local epochs instead of the full gradient), ``s-fedpg`` (Armijo line search), and the
Table 2 ablations ``fedpg-m2`` (no fairness column), ``fedpg-m3`` (P-model = G-model),
``fedpg-m4`` (no absent-client gradients).

For the paper's own settings (preset ``fedpg-cifar10``) the paper's Table 1 CIFAR-10
figures stand beside ours. ``--rounds`` takes one number for every run or ``label=R`` pairs,
since a round's cost differs by method (FedPG computes one gradient per client and round,
FedAvg trains 5 epochs) and the reproduction gives each method about the same wall time.

Runs are resumable: a run whose ``summary.json`` says ``completed`` is not run again, and one
that died after a checkpoint continues from it. The report goes to ``results/fedpg.md`` for
the digits preset and ``results/<preset>.md`` (dashes as underscores) for the others; the
completed runs' result files are archived beside it (``<report>_runs/``), so ``--report-only``
rewrites it on a machine that no longer holds the runs, and a report with no run to show is
left as it is.

Usage::

    python benchmarks/fedpg.py                      # preset fedpg-digits, the methods
    python benchmarks/fedpg.py --labels fedpg fedpg-g1.0 fedpg-m3
    python benchmarks/fedpg.py --preset fedpg-cifar10 --data-dir ../shared/data \
        --labels fedavg ditto fedmgda fedpg --rounds fedavg=100 fedpg=200 --set fedpg:lr=0.1
    python benchmarks/fedpg.py --report-only
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from pflarena.core.presets import load_preset
from pflarena.reporting.plots import compare_plot
from pflarena.runtime.launch import simulate_resuming
from pflarena.server.results import archive_run, completed_summary, read_rounds

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("local", "fedavg", "ditto", "fedmgda", "fedpg")
#: run label -> (strategy, overrides)
VARIANTS = {
    "fedpg-g0.3": ("fedpg", {"fedpg.gamma": "0.3"}),
    "fedpg-g1.0": ("fedpg", {"fedpg.gamma": "1.0"}),
    "fedpg-pseudo": ("fedpg", {"fedpg.grad-mode": "pseudo"}),
    "s-fedpg": ("fedpg", {"fedpg.line-search": True}),
    "fedpg-m2": ("fedpg", {"fedpg.fairness": False}),
    "fedpg-m3": ("fedpg", {"fedpg.personalize": False}),
    "fedpg-m4": ("fedpg", {"fedpg.absent-clients": False}),
    # the paper's P-models for the baselines without personalization: each client's
    # latest local-training result before aggregation (docs/papers/fedpg.md §5.4)
    "fedavg-local-result": ("fedavg", {"fedavg.personal-model": "local-result"}),
    "fedmgda-local-result": ("fedmgda", {"fedmgda.personal-model": "local-result"}),
}
LABELS = (*METHODS, *VARIANTS)
#: The paper's Table 1 (Dir(0.1), 10 % of 100 clients online, 2000 rounds), CIFAR-10
#: columns: L-acc, S-acc, G-acc of the P-models and GM, in %. Its FedAvg, FedProx and
#: FedMGDA+ P-models are each client's local-training result before aggregation, the
#: ``-local-result`` runs'; the plain ``fedavg`` and ``fedmgda`` runs' are the global model
#: (the evaluation protocol's), so only their GM compares.
PAPER = {
    "fedpg-cifar10": {
        "local": (78.8, 17.5, 15.0, None),
        "fedavg": (88.0, 46.1, 43.1, 57.1),
        "fedavg-local-result": (88.0, 46.1, 43.1, 57.1),
        "ditto": (86.0, 25.5, 21.7, 52.6),
        "fedmgda": (85.9, 32.1, 28.2, 56.9),
        "fedmgda-local-result": (85.9, 32.1, 28.2, 56.9),
        "fedpg": (76.7, 74.2, 73.9, 73.9),
        "s-fedpg": (76.3, 76.0, 73.8, 73.7),
        "fedpg-g0.3": (78.4, 76.2, 73.5, 73.9),
        "fedpg-g1.0": (78.9, 75.9, 73.3, 73.9),
    }
}


def run_config(label: str, args: argparse.Namespace, out: Path) -> dict:
    strategy, overrides = VARIANTS.get(label, (label, {}))
    preset = load_preset(args.preset)
    config = preset.overrides(strategy) | overrides | {"strategy": strategy}
    config |= {"seed": args.seed, "output-dir": str(out), "num-rounds": rounds_for(label, args)}
    if args.data_dir:
        config["data-dir"] = args.data_dir
    for item in args.set:
        target, _, assignment = item.partition(":")
        key, _, value = assignment.partition("=")
        if target == label:
            config[key] = value
    return config


def rounds_for(label: str, args: argparse.Namespace) -> int:
    """The label's rounds from ``--rounds`` (``R`` or ``label=R``), else the preset's."""
    chosen = 0
    for item in args.rounds:
        name, _, value = item.rpartition("=")
        if name in ("", label):
            chosen = int(value)
    return chosen or int(load_preset(args.preset).overrides()["num-rounds"])


def _pct(stats: dict | None) -> str:
    if not stats or stats.get("mean") is None:
        return "—"
    text = f"{100 * stats['mean']:.2f}"
    return text + (f" ± {100 * stats['std']:.2f}" if stats.get("std") is not None else "")


def _setting(run_dir: Path) -> tuple[str, int, int, str]:
    """``(preset, seed, rounds, label)`` from ``<preset>-r<rounds>-s<seed>--<label>``."""
    head, label = run_dir.name.split("--", 1)
    preset, rest = head.rsplit("-r", 1)
    rounds, seed = rest.split("-s")
    return preset, int(seed), int(rounds), label


def _paper(preset: str, label: str) -> str:
    figures = PAPER.get(preset, {}).get(label)
    if figures is None:
        return "—"
    return " / ".join("—" if f is None else f"{f:.1f}" for f in figures)


#: FedPG's own per-run files, kept with its archived run (the QP weights' picture, over a
#: megabyte at 100 clients, is left out; its table is kept).
FEDPG_FILES = ("gammas.csv", "gammas.png", "qp-weights.csv")


def fedpg_note(run_dir: Path, label: str, link: str) -> str | None:
    """γ_i and the QP's weights over the run, from its ``gammas.csv`` and ``qp-weights.csv``."""
    if not (run_dir / "gammas.csv").exists():
        return None
    with (run_dir / "gammas.csv").open() as f:
        gammas = np.array([float(row["gamma"]) for row in csv.DictReader(f)])
    text = (
        f"- `{label}`: γ_i mean {gammas.mean():.3f}, median {np.median(gammas):.3f}, largest "
        f"{gammas.max():.3f} over {gammas.size} client-rounds ([by round and client]({link}))"
    )
    if (run_dir / "qp-weights.csv").exists():
        totals: dict[tuple[str, str], float] = {}
        with (run_dir / "qp-weights.csv").open() as f:
            for row in csv.DictReader(f):
                key = (row["round"], row["column"])
                totals[key] = totals.get(key, 0.0) + float(row["weight"])
        rounds = len({r for r, _ in totals})
        shares = {
            column: sum(w for (_, c), w in totals.items() if c == column) / rounds
            for column in ("online", "fair", "stale")
        }
        text += "; the QP's weight per round, on average: " + ", ".join(
            f"{column} columns {share:.2f}" for column, share in shares.items()
        )
    return text + "."


def default_out(preset: str) -> Path:
    name = "fedpg" if preset == "fedpg-digits" else preset.replace("-", "_")
    return ROOT / "benchmarks" / "results" / f"{name}.md"


def write_report(runs_dir: Path, out: Path, preset: str) -> None:
    """Archive the preset's completed runs in ``runs_dir`` beside ``out`` (``<out stem>_runs/``;
    a run there replaces its archived copy) and write one table and one accuracy plot per
    seed over the archive. With nothing archived, ``out`` is left untouched."""
    archive = out.parent / f"{out.stem}_runs"
    for summary_path in sorted(runs_dir.glob("*--*/summary.json")):
        run_dir = summary_path.parent
        if _setting(run_dir)[0] == preset and completed_summary(run_dir) is not None:
            archive_run(run_dir, archive, extra=FEDPG_FILES)
    lines = [
        "# Personalized models and global performance (FedPG)",
        "",
        "Command: `python benchmarks/fedpg.py [--preset P --rounds R|label=R ... --labels ...]` "
        "(completed runs are skipped; `--report-only` rewrites this file). One seed, on a 2-core "
        "CPU shared with other work, so wall times are only rough. Accuracy in %, mean ± std "
        "over the cross-evaluated clients' P-models; GM: the global model, mean over clients. "
        "The P-models of the preset's cross-evaluated clients are tested on every client's "
        "test split (the cross-evaluation's own traffic is not in the MB column).",
    ]
    settings: dict[tuple[str, int], list[Path]] = {}
    for summary_path in sorted(archive.glob("*--*/summary.json")):
        if completed_summary(summary_path.parent) is not None:
            preset, seed, _, _ = _setting(summary_path.parent)
            settings.setdefault((preset, seed), []).append(summary_path.parent)
    if not settings:
        print(f"no completed run in {runs_dir} or {archive}: {out} left as it is", flush=True)
        return
    for (preset, seed), run_dirs in sorted(settings.items()):
        paper = preset in PAPER
        order = {label: i for i, label in enumerate(LABELS)}
        run_dirs.sort(key=lambda d: (order.get(_setting(d)[3], len(order)), _setting(d)[2]))
        lines += [
            "",
            f"## `{preset}`, seed {seed}",
            "",
            f"{load_preset(preset).description}.",
            "",
            "| run | rounds | L-acc | S-acc | G-acc | GM | G-acc − GM "
            + ("| paper L / S / G / GM " if paper else "")
            + "| MB up / down per round | s per round |",
            "|---|---|---|---|---|---|---|" + ("---|" if paper else "") + "---|---|",
        ]
        for run_dir in run_dirs:
            _, _, num_rounds, label = _setting(run_dir)
            s = completed_summary(run_dir)
            cross = s.get("cross") or {}
            rounds = [r for r in read_rounds(run_dir / "rounds.jsonl") if r["round"] > 0]
            glob = (s.get("global") or {}).get("last") or {}
            gm = glob.get("mean")
            g = (cross.get("global") or {}).get("mean")
            gap = f"{100 * (g - gm):+.2f}" if g is not None and gm is not None else "—"
            up = s.get("bytes_up", 0) / max(len(rounds), 1) / 1e6
            down = s.get("bytes_down", 0) / max(len(rounds), 1) / 1e6
            lines.append(
                f"| {label} | {num_rounds} | {_pct(cross.get('local'))} "
                f"| {_pct(cross.get('synthetic'))} | {_pct(cross.get('global'))} "
                f"| {_pct({'mean': gm}) if gm is not None else '—'} | {gap} "
                + (f"| {_paper(preset, label)} " if paper else "")
                + f"| {up:.2f} / {down:.2f} | {s['wall_time_s'] / max(num_rounds, 1):.1f} |"
            )
        notes = [
            fedpg_note(d, _setting(d)[3], f"{archive.name}/{d.name}/gammas.png") for d in run_dirs
        ]
        lines += ["", *[n for n in notes if n]] if any(notes) else []
        plot = compare_plot(run_dirs, out.parent / f"{out.stem}_{preset}_s{seed}.png")
        lines += ["", f"![accuracy against rounds, {preset}, seed {seed}]({plot.name})"]
    for preset in sorted({preset for preset, _ in settings}):
        lines += ["", *NOTES[preset]] if preset in NOTES else []
    out.write_text("\n".join(lines) + "\n")


#: What the archived runs showed besides the table, by preset (read from their rounds.jsonl).
NOTES: dict[str, list[str]] = {
    "fedpg-cifar10": [
        "Observations (seed 0):",
        "",
        "- Rounds: as many as fit in about an hour per method on the 2-core CPU (FedPG 150",
        "  rounds in 77 min with the test suite beside it; FedAvg 70 in 27, FedMGDA+ 70 in 33,",
        "  Ditto 50 in 25; the `-local-result` runs 70 in 51 (the suite beside it) and 30).",
        "  The paper ran 2000: every figure here is an early point of its curves, and all",
        "  accuracies are far below Table 1's.",
        "- The paper's claim holds for FedPG: its P-models score 55.08 on every client's data",
        "  against its global model's 55.76 (G-acc − GM = −0.69; Table 1: 73.9 against 73.9),",
        "  while their L-acc (65.63) is 10 points above GM, with small drifts (γ_i median",
        "  0.024). Ditto's P-models lose 31.24 points (11.48 against 42.72), Table 1's gap",
        "  (21.7 against 52.6, −30.9) almost exactly; their L-acc, 83.73, is near the",
        "  paper's 86.0.",
        "- The plain `fedavg` and `fedmgda` runs' P-models are their global models (the",
        "  evaluation protocol's reading), so their G-acc equals GM and only their GM compares",
        "  with Table 1. The `-local-result` runs (`personal-model=local-result`) take the",
        "  paper's: each client's latest local-training result before aggregation. Their",
        "  training is the plain runs' (the same GM, 49.53 and 47.75); their P-models fit",
        "  their owners (L-acc 88.69 and 88.83; Table 1: 88.0 and 85.9) and lose 26.78 and",
        "  26.25 points on every client's data (G-acc 22.75 and 21.50 against GM; Table 1:",
        "  −14.0 and −28.7). With Ditto's −31.24, every baseline's P-models give up global",
        "  accuracy and FedPG's (−0.69) do not: Table 1's order.",
        "- The global models at equal rounds (protocol evaluation, mean over all 100",
        "  clients): round 50, FedPG 38.47, FedAvg 44.72, FedMGDA+ 47.14, Ditto 42.72;",
        "  round 70/75, FedPG 47.13 (75), FedAvg 49.53, FedMGDA+ 47.75. FedPG takes one",
        "  full-gradient step of the global model a round where the others train 5 local",
        "  epochs, and needs more rounds for the same global accuracy (55.76 at 150).",
        "- The stale gradients carry most of FedPG's QP weight (0.72 a round on average,",
        "  against 0.20 for the 10 online clients' and 0.08 for the fair column): with 10 %",
        "  online, the window holds up to 90 absent clients' gradients.",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="fedpg-digits")
    parser.add_argument("--labels", nargs="+", default=list(METHODS), choices=LABELS)
    parser.add_argument(
        "--rounds",
        nargs="+",
        default=[],
        help="R for every run, or label=R (default: the preset's)",
    )
    parser.add_argument("--data-dir", default="", help="where the real datasets are")
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="LABEL:KEY=VALUE",
        help="a run-config value for one run",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpus-per-client", type=float, default=1.0)
    parser.add_argument(
        "--engine", choices=("ray", "inprocess"), default="ray", help="see `pflarena run --help`"
    )
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "fedpg"))
    parser.add_argument(
        "--out",
        default=None,
        help="the report (default: results/fedpg.md for fedpg-digits, else results/<preset>.md)",
    )
    parser.add_argument(
        "--retries", type=int, default=2, help="resume a failed run this many times"
    )
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    runs_dir = Path(args.runs_dir)
    out = Path(args.out) if args.out else default_out(args.preset)
    if not args.report_only:
        for label in args.labels:
            rounds = rounds_for(label, args)
            run_dir = runs_dir / f"{args.preset}-r{rounds}-s{args.seed}--{label}"
            if completed_summary(run_dir) is not None:
                continue
            print(f"== {label} on {args.preset} ({rounds} rounds)", flush=True)
            simulate_resuming(
                run_config(label, args, run_dir),
                retries=args.retries,
                cpus_per_client=args.cpus_per_client,
                verbosity=0,
                engine=args.engine,
            )
            write_report(runs_dir, out, args.preset)
    write_report(runs_dir, out, args.preset)


if __name__ == "__main__":
    main()
