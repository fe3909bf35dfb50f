"""pFedSV against its baselines on a preset's setting, with its variants and its costs.

Presets (``pflarena presets NAME``):

* ``pfedsv-digits``: the embedded digits set, pathological (classes {i, i+1} mod 10 per
  client), 10 clients, full participation; runs in minutes.
* ``pfedsv-mnist-pathological`` / ``pfedsv-mnist-dirichlet``: the paper's MNIST columns
  (Tables 1-2, M-10): MNIST from ``../shared/data``, 10 clients, 100 % participation, the
  FedAvg CNN, lr 0.01, pathological (2 labels per client, each held by exactly 2 clients) or
  Dirichlet(0.1).

Every method gets 20 % of each client's training split held out for validation (pFedSV and
FedFomo value peers on it; the others do not use it). Besides the methods, the ``labels``
``pfedsv-dc`` (the D+C variant), ``pfedsv-dp1`` (the private variant, σ = 1, C = 1) and
``pfedsv-guard`` (``guard=validation``, not in the paper), ``pfedsv-median``
(``distance-ref=current-self-median``, docs/papers/pfedsv.md §9.1's other reading of Eq. 6) and
``pfedsv-nodist`` (``distance-ref=none``, weights ∝ max(SV, 0)) run pFedSV with those
settings. The report gives, per run, the personalized accuracy and the
bytes each exchange moves per round; for pFedSV, the Shapley overhead per client and round
(distinct utility evaluations, seconds) next to its local training time; for the private
variant, the (ε, δ) it reports.

Runs are resumable: a run whose ``summary.json`` says ``completed`` is not run again. The
completed runs' result files are archived beside the report (``<report>_runs/``), so
``--report-only`` rewrites it on a machine that no longer holds the runs.

Usage::

    python benchmarks/pfedsv.py --preset pfedsv-digits
    python benchmarks/pfedsv.py --preset pfedsv-mnist-pathological --rounds 5 --local-epochs 1
    python benchmarks/pfedsv.py --preset pfedsv-mnist-dirichlet --labels pfedsv fedfomo
    python benchmarks/pfedsv.py --report-only
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pflarena.core.presets import load_preset
from pflarena.reporting.plots import compare_plot
from pflarena.runtime.launch import simulate
from pflarena.server.build import parse_config
from pflarena.server.results import archive_run, completed_summary, read_rounds

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("local", "fedavg", "fedavg-ft", "fedfomo", "pfedsv")
#: run label -> (strategy, overrides)
VARIANTS = {
    "pfedsv-dc": ("pfedsv", {"pfedsv.variant": "D+C"}),
    "pfedsv-dp1": ("pfedsv", {"pfedsv.dp-noise": 1.0, "pfedsv.dp-clip": 1.0}),
    # not in the paper: keep the own trained model when the aggregate validates below it
    "pfedsv-guard": ("pfedsv", {"pfedsv.guard": "validation"}),
    # Eq. 6's distances from the own trained model, its own the peers' median
    # (docs/papers/pfedsv.md §9.1)
    "pfedsv-median": ("pfedsv", {"pfedsv.distance-ref": "current-self-median"}),
    # Eq. 6 without the distances: weights ∝ max(SV, 0) (docs/papers/pfedsv.md §9.1's third option)
    "pfedsv-nodist": ("pfedsv", {"pfedsv.distance-ref": "none"}),
}
LABELS = (*METHODS, *VARIANTS)
#: pFedSV's own per-run file, kept with its archived run (the relevance matrix)
PFEDSV_FILES = ("relevance.csv",)

#: pFedSV paper, MNIST with 10 clients (Table 1: pathological; Table 2: Dirichlet 0.1),
#: mean test accuracy in %; None where the PDF lost the cell (docs/papers/pfedsv.md §6).
PAPER = {
    "pfedsv-mnist-pathological": {
        "local": 96.11,
        "fedavg": None,
        "fedavg-ft": 94.38,
        "fedfomo": 96.90,
        "pfedsv": 98.01,
    },
    "pfedsv-mnist-dirichlet": {
        "local": 74.05,
        "fedavg": 43.57,
        "fedavg-ft": 65.72,
        "fedfomo": 72.54,
        "pfedsv": 78.17,
    },
}


def run_name(preset: str, rounds: int, epochs: int, seed: int, label: str) -> str:
    return f"{preset}-r{rounds}-e{epochs}-s{seed}--{label}"


def run_config(label: str, args: argparse.Namespace, seed: int, out: Path) -> dict:
    strategy, overrides = VARIANTS.get(label, (label, {}))
    preset = load_preset(args.preset)
    config = (
        preset.overrides(strategy)
        | overrides
        | {
            "strategy": strategy,
            "eval-every": args.eval_every,
            "seed": seed,
            "output-dir": str(out),
        }
    )
    if args.rounds:
        config["num-rounds"] = args.rounds
    if args.local_epochs:
        config["local-epochs"] = args.local_epochs
    if config.get("dataset") != "digits":
        config["data-dir"] = args.data_dir
    return config


def costs(run_dir: Path) -> dict[str, float]:
    """Means over the rounds: MB per exchange, and pFedSV's per-client Shapley overhead."""
    rounds = [r for r in read_rounds(run_dir / "rounds.jsonl") if r.get("train")]
    out: dict[str, float] = {}
    for name in dict.fromkeys(e["name"] for r in rounds for e in r["exchanges"]):
        exchanges = [e for r in rounds for e in r["exchanges"] if e["name"] == name]
        out[f"{name} down MB"] = float(np.mean([e["bytes_down"] for e in exchanges])) / 1e6
        out[f"{name} up MB"] = float(np.mean([e["bytes_up"] for e in exchanges])) / 1e6
    server = [r["train"]["server"] for r in rounds]
    if server and "mean-utility-evaluations" in server[0]:
        clients = np.array([r["train"]["clients"] for r in rounds], dtype=float)
        shapley = np.array([s["mean-shapley-time-s"] for s in server])
        per_client = np.array([r["train"]["client_time_s"] for r in rounds]) / clients
        out["coalition size"] = float(np.mean([s["mean-coalition-size"] for s in server]))
        out["utility evaluations"] = float(np.mean([s["mean-utility-evaluations"] for s in server]))
        out["shapley s"] = float(shapley.mean())
        out["training s"] = float((per_client - shapley).mean())
    if server and "mean-kept-own" in server[0]:
        out["kept own"] = float(np.mean([s["mean-kept-own"] for s in server]))
    if server and "mean-aggregate-below-own" in server[0]:
        out["below own"] = float(np.mean([s["mean-aggregate-below-own"] for s in server]))
        out["trained test"] = float(server[-1]["mean-trained-test-accuracy"])
    if server and "dp-epsilon" in server[-1]:
        out["epsilon"] = float(server[-1]["dp-epsilon"])
    return out


def _mean_std(values: list[float], digits: int) -> str:
    """``mean ± std`` in % of fractions (no ``±`` for one value)."""
    text = f"{100 * float(np.mean(values)):.{digits}f}"
    return text + (f" ± {100 * float(np.std(values)):.{digits}f}" if len(values) > 1 else "")


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}"


def write_report(runs_dir: Path, out: Path) -> None:
    """Archive the completed runs in ``runs_dir`` beside ``out`` (``<out stem>_runs/``; a run
    there replaces its archived copy) and write the report over the archive. With nothing
    archived, ``out`` is left untouched."""
    archive = out.parent / f"{out.stem}_runs"
    for summary_path in sorted(runs_dir.glob("*-r*-e*-s*--*/summary.json")):
        if completed_summary(summary_path.parent) is not None:
            archive_run(summary_path.parent, archive, extra=PFEDSV_FILES)
    # (preset, rounds, epochs) -> label -> seed -> run directory
    settings: dict[tuple[str, int, int], dict[str, dict[int, Path]]] = {}
    for summary_path in sorted(archive.glob("*-r*-e*-s*--*/summary.json")):
        if completed_summary(summary_path.parent) is None:
            continue
        head, label = summary_path.parent.name.split("--")
        preset, rounds, epochs, seed = head.rsplit("-", 3)
        setting = settings.setdefault((preset, int(rounds[1:]), int(epochs[1:])), {})
        setting.setdefault(label, {})[int(seed[1:])] = summary_path.parent
    if not settings:
        print(f"no completed run in {runs_dir} or {archive}: {out} left as it is", flush=True)
        return
    lines = [
        "# pFedSV against its baselines",
        "",
        "Command: `python benchmarks/pfedsv.py --preset P [--rounds R --local-epochs E]` once "
        "per setting below, `--seeds S ...` for more seeds (completed runs are skipped; "
        "`--report-only` rewrites this file). On a 2-core CPU. Accuracy in %: the unweighted "
        "mean over clients of each client's personalized model on its own test split (FedAvg: "
        "the global model), after the last round (mean ± std over the seeds run) and at the "
        "best round (seed 0). MB: per round, all clients together; costs and wall time: seed "
        "0. Wall times come from runs made at different times on a shared machine: compare "
        "them only roughly. The paper's MNIST figures are for 20 rounds with E = 5, 5 seeds; the "
        "MNIST runs here are scaled down to the rounds and epochs in their titles (on this "
        "CPU a 5-round, E = 1 pFedSV run takes 9 to 13 minutes).",
    ]
    for (preset, rounds, epochs), runs in sorted(settings.items()):
        paper = PAPER.get(preset, {})
        lines += [
            "",
            f"## `{preset}`, {rounds} rounds, E = {epochs}",
            "",
            f"{load_preset(preset).description}.",
            "",
            "| run | seeds | last round | best (round) | paper | MB down / up per round "
            "| wall (s) |",
            "|---|---|---|---|---|---|---|",
        ]
        for label in LABELS:
            if label not in runs:
                continue
            seeds = runs[label]
            first = seeds[min(seeds)]
            s = completed_summary(first)
            pers = s["personalized"]
            lasts = [completed_summary(d)["personalized"]["last"]["mean"] for d in seeds.values()]
            last = _pct(float(np.mean(lasts)))
            if len(lasts) > 1:
                last += f" ± {100 * float(np.std(lasts)):.2f}"
            c = costs(first)
            down = sum(v for k, v in c.items() if k.endswith("down MB"))
            up = sum(v for k, v in c.items() if k.endswith("up MB"))
            reference = paper.get(label)
            lines.append(
                f"| {label} | {len(seeds)} | {last} | {_pct(pers['best']['mean'])} "
                f"({pers['best']['round']}) | {reference if reference else '—'} | "
                f"{down:.2f} / {up:.2f} | {s['wall_time_s']:.0f} |"
            )
        for label in (lab for lab in LABELS if lab.startswith("pfedsv")):
            if label not in runs:
                continue
            c = costs(runs[label][min(runs[label])])
            text = (
                f"- `{label}` per client and round: coalition size {c['coalition size']:.1f}, "
                f"{c['utility evaluations']:.1f} distinct utility evaluations, "
                f"{c['shapley s']:.2f} s valuing and aggregating against {c['training s']:.2f} s "
                f"of local training; per exchange and round: "
                + ", ".join(f"{k} {v:.2f}" for k, v in c.items() if k.endswith("MB") and v > 0)
            )
            every = [costs(d) for d in runs[label].values()]
            if "below own" in c:
                text += (
                    f"; the aggregate θ_i^{{t*}} validated below the own trained model θ_i^t "
                    f"in {_mean_std([e['below own'] for e in every], 0)} % of client-rounds, "
                    f"and after the last round θ_i^t scores "
                    f"{_mean_std([e['trained test'] for e in every], 2)} on the test splits "
                    f"({len(every)} seeds)"
                )
            if c.get("kept own"):
                kept = _mean_std([e["kept own"] for e in every], 0)
                text += f"; the guard kept the own model in {kept} % of client-rounds"
            if "epsilon" in c:
                text += f"; (ε, δ) = ({c['epsilon']:.2f}, 1e-5) after {rounds} uploads"
            lines.append(text + ".")
        plot = out.parent / f"{out.stem}_{preset}_r{rounds}_e{epochs}.png"
        compare_plot([runs[label][min(runs[label])] for label in LABELS if label in runs], plot)
        lines += ["", f"![{preset}]({plot.name})"]
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="pfedsv-digits")
    parser.add_argument("--labels", nargs="+", default=list(LABELS), choices=LABELS)
    parser.add_argument("--rounds", type=int, default=0, help="0: the preset's")
    parser.add_argument("--local-epochs", type=int, default=0, help="0: the preset's")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--cpus-per-client", type=float, default=1.0)
    parser.add_argument("--gpus-per-client", type=float, default=0.0)
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "pfedsv"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pfedsv.md"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    runs_dir = Path(args.runs_dir)
    if not args.report_only:
        preset = load_preset(args.preset)
        rounds = args.rounds or int(preset.overrides()["num-rounds"])
        epochs = args.local_epochs or int(preset.overrides()["local-epochs"])
        for seed, label in ((seed, label) for seed in args.seeds for label in args.labels):
            out = runs_dir / run_name(args.preset, rounds, epochs, seed, label)
            if completed_summary(out) is not None:
                continue
            print(
                f"== {label} on {args.preset} ({rounds} rounds, E={epochs}, seed {seed})",
                flush=True,
            )
            simulate(
                parse_config(run_config(label, args, seed, out)),
                cpus_per_client=args.cpus_per_client,
                gpus_per_client=args.gpus_per_client,
                verbosity=0,
            )
            write_report(runs_dir, Path(args.out))
    write_report(runs_dir, Path(args.out))


if __name__ == "__main__":
    main()
