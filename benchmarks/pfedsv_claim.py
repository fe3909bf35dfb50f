"""pFedSV against local, FedAvg, FedAvg+FT and FedFomo where local training is weak.

Two presets (``pflarena presets NAME``), both on the embedded digits set with 30 %
validation, full participation, 20 rounds, E = 10, batch 16, lr 0.1 and ``pfedsv.max-k=10``:

* ``pfedsv-digits-groups``: the label-groups split, 2 groups of 5 classes, 30 clients
  (15 per group): each client has a few dozen images, so local training is weak and its
  14 group peers are the relevant ones (the regime of the paper's Table 2).
* ``pfedsv-digits-dirichlet``: Dirichlet(0.1) over 20 clients (the paper's Table 2 split).

Every method is scored on its personalized model after the last round (pFedSV: the
aggregate θ_i^{t*}; its trained θ_i^t is logged beside it). For each pair pFedSV-vs-X the
report gives wins–ties–losses over the seeds and the two-sided sign test's p-value over the
seeds not tied. The seeds run one after another (every method and both presets for a seed,
pFedSV and FedFomo first, then the next seed), so a run cut short still gives complete seeds; a completed run is not
run again, and the per-run figures are kept in ``<report>.csv``.

Usage::

    python benchmarks/pfedsv_claim.py --seeds 0 1 2 3 4 5 6 7 8 9
    python benchmarks/pfedsv_claim.py --report-only
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

from pflarena.server import sweep
from pflarena.server.cli import run_simulations
from pflarena.server.results import completed_summary, read_rounds

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ["pfedsv-digits-groups", "pfedsv-digits-dirichlet"]
METHODS = ["local", "fedavg", "fedavg-ft", "fedfomo", "pfedsv"]
#: the order the runs of one seed are done in: the comparison the claim is about first
RUN_ORDER = ["pfedsv", "fedfomo", "local", "fedavg", "fedavg-ft"]
FIELDS = ("preset", "method", "seed", "aggregate", "trained", "coalition", "own_weight", "seconds")


def plan(preset: str, seeds: list[int], runs_dir: Path) -> list[sweep.PlannedRun]:
    built = sweep.build_sweep(preset=preset, strategies=METHODS, seeds=seeds, out=runs_dir / preset)
    return sweep.plan_runs(built)


def run_row(preset: str, run: sweep.PlannedRun) -> dict | None:
    summary = completed_summary(run.directory)
    if summary is None:
        return None
    rounds = read_rounds(run.directory / "rounds.jsonl")
    row = dict.fromkeys(FIELDS, "") | {
        "preset": preset,
        "method": run.method,
        "seed": run.seed,
        "aggregate": summary["personalized"]["last"]["mean"],
    }
    if run.strategy == "pfedsv":
        server = [r["train"]["server"] for r in rounds if r.get("train")]
        row["trained"] = server[-1]["mean-trained-test-accuracy"]
        row["coalition"] = float(np.mean([s["mean-coalition-size"] for s in server]))
        row["own_weight"] = float(np.mean([s["mean-own-weight"] for s in server]))
    return row


def _ms(values: list[float]) -> str:
    return f"{100 * np.mean(values):.2f} ± {100 * np.std(values):.2f}"


def _record(ours: dict[int, float], theirs: dict[int, float]) -> str:
    diffs = [ours[s] - theirs[s] for s in sorted(set(ours) & set(theirs))]
    wins = sum(d > 1e-9 for d in diffs)
    losses = sum(d < -1e-9 for d in diffs)
    text = f"{wins}–{len(diffs) - wins - losses}–{losses}"
    if wins + losses:
        text += f" (p {binomtest(wins, wins + losses).pvalue:.3f})"
    return text


def write_report(rows: list[dict], out: Path, command: str) -> None:
    lines = [
        "# pFedSV against the baselines where local training is weak",
        "",
        f"Command: `{command}` (niced, on a 2-core CPU shared with other jobs; "
        "`--report-only` rewrites this file from the per-run figures in "
        f"`{out.stem}.csv`). Accuracy in %: the unweighted mean over clients of each "
        "client's personalized model on its own test split after the last round (pFedSV: "
        "the aggregate θ_i^{t*}), mean ± std over the seeds that completed every method. "
        "W–T–L (p): the seeds on which pFedSV scores above, level with and below the "
        "baseline, and the two-sided sign test's p-value over the seeds not level.",
    ]
    for preset in PRESETS:
        by = {
            m: {
                int(r["seed"]): float(r["aggregate"])
                for r in rows
                if (r["preset"], r["method"]) == (preset, m)
            }
            for m in METHODS
        }
        seeds = sorted(set.intersection(*(set(v) for v in by.values())))
        if not seeds:
            continue
        trained = {
            int(r["seed"]): float(r["trained"])
            for r in rows
            if (r["preset"], r["method"]) == (preset, "pfedsv") and int(r["seed"]) in seeds
        }
        extra = [
            r
            for r in rows
            if (r["preset"], r["method"]) == (preset, "pfedsv") and int(r["seed"]) in seeds
        ]
        lines += [
            "",
            f"## `{preset}` ({len(seeds)} seeds: {', '.join(map(str, seeds))})",
            "",
            "| method | accuracy | pFedSV W–T–L (p) |",
            "|---|---|---|",
        ]
        ours = {s: by["pfedsv"][s] for s in seeds}
        for method in METHODS:
            mine = {s: by[method][s] for s in seeds}
            record = "" if method == "pfedsv" else _record(ours, mine)
            lines.append(f"| {method} | {_ms(list(mine.values()))} | {record} |")
        lines.append(
            f"| pfedsv θ_i^t (trained, not aggregated) | {_ms(list(trained.values()))} | "
            f"vs fedfomo {_record(trained, {s: by['fedfomo'][s] for s in seeds})} |"
        )
        lines += [
            "",
            f"pFedSV's mean coalition (own model included) "
            f"{np.mean([float(r['coalition']) for r in extra]):.2f}, own weight "
            f"{np.mean([float(r['own_weight']) for r in extra]):.2f} (means over rounds and seeds).",
        ]
    out.write_text("\n".join(lines) + "\n")


def _key(row: dict) -> tuple:
    return (row["preset"], row["method"], int(row["seed"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--presets", nargs="+", default=PRESETS, choices=PRESETS)
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "pfedsv_claim"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pfedsv_claim.md"))
    parser.add_argument("--engine", default="inprocess", choices=["ray", "inprocess"])
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    table = out.with_suffix(".csv")
    kept = list(csv.DictReader(table.open())) if table.exists() else []
    command = "python benchmarks/pfedsv_claim.py --seeds " + " ".join(map(str, args.seeds))

    def save() -> None:
        with table.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(sorted(kept, key=_key))
        write_report(kept, out, command)

    if not args.report_only:
        for seed in args.seeds:
            for preset in args.presets:
                runs = plan(preset, [seed], Path(args.runs_dir))
                for run in sorted(runs, key=lambda r: RUN_ORDER.index(r.method)):
                    todo = sweep.configs_to_run([run])
                    started = time.perf_counter()
                    if todo:
                        code, tail = run_simulations(todo, verbosity=0, engine=args.engine)
                        if code != 0:
                            print("\n".join(tail))
                    row = run_row(preset, run)
                    if row is None:
                        continue
                    if todo:
                        row["seconds"] = round(time.perf_counter() - started, 1)
                    kept = [r for r in kept if _key(r) != _key(row)] + [row]
                    print(preset, run.method, seed, row["aggregate"], row["seconds"], flush=True)
                save()
    if not kept:
        raise SystemExit(f"no per-run figures in {table}: run the benchmark first")
    save()
    print(out.read_text())


if __name__ == "__main__":
    main()
