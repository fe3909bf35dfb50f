"""Does any reading of pFedSV beat FedFomo on ``digits`` pathological? A grid over the
learning rate and the paper's open choices, each pFedSV run scored both ways
docs/papers/pfedsv.md §9.8 allows.

Preset ``pfedsv-digits`` (``pflarena presets pfedsv-digits``): the embedded digits set,
classes {i, i+1} (mod 10) per client, 10 clients, full participation, 20 rounds, E = 5,
batch 32, 20 % validation. Four sweeps, each in one simulation process
(:mod:`pflarena.cli.sweep`; a completed run is not run again):

* ``lr``: ``local``, ``fedfomo`` and ``pfedsv`` at lr 0.01 (the paper's MNIST rate), 0.02
  and 0.05 (the preset's).
* ``readings``: ``pfedsv`` at the preset's lr over every combination of the open choices the
  defaults settle (docs/papers/pfedsv.md §11): v(∅) (``zero``, the paper;
  ``chance``), the top-k rule (``explore``; ``literal``) and the relevance average α (0.5;
  0.9). Eq. 6's distance reference is measured in ``pfedsv_distance_ref.md``; the peers
  offered (``pool``) differ only under partial participation (with every client in every
  round, ``latest`` and ``current-round`` gave identical runs for all 8 combinations, 3
  seeds each).
* ``dirichlet``: ``local``, ``fedfomo`` and ``pfedsv`` on a Dirichlet(0.1) split of the
  same data (the paper's Table 2 split), where local training is not at the ceiling.
* ``guard``: ``pfedsv`` with ``guard=validation`` (not in the paper: the client keeps its
  own trained model when the aggregate validates below it).

Each pFedSV run is scored on the aggregate θ_i^{t*} (the default: the run's personalized
accuracy) and on the client's trained θ_i^t after the last round (its
``trained-test-accuracy``), and compared seed by seed with FedFomo at the same lr. The
per-run figures are kept in ``<report>.csv`` beside the report, so ``--report-only``
rewrites the report without the runs.

Usage::

    python benchmarks/pfedsv_readings.py
    python benchmarks/pfedsv_readings.py --seeds 0 1 2
    python benchmarks/pfedsv_readings.py --sweeps dirichlet
    python benchmarks/pfedsv_readings.py --report-only
"""

from __future__ import annotations

import argparse
import csv
import itertools
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

from pflarena.cli import sweep
from pflarena.core.presets import load_preset
from pflarena.runtime.launch import run_simulations
from pflarena.server.results import completed_summary, read_rounds

ROOT = Path(__file__).resolve().parents[1]
PRESET = "pfedsv-digits"
LRS = [0.01, 0.02, 0.05]
#: the preset's lr, at which the readings are swept and FedFomo is the reference
PRESET_LR = 0.05
READINGS = {
    "pfedsv.empty-value": ["zero", "chance"],
    "pfedsv.top-k-rule": ["explore", "literal"],
    "pfedsv.alpha": [0.5, 0.9],
}
#: the Dirichlet concentration of the ``dirichlet`` sweep (the paper's Table 2)
DIRICHLET_ALPHA = 0.1
FIELDS = (
    "sweep",
    "setting",
    "method",
    "seed",
    "aggregate",
    "trained",
    "below_own",
    "coalition",
    "own_weight",
    "test_images",
)


#: sweep name -> (strategies, settings for every run, grid)
SWEEPS: dict[str, tuple[list[str], dict, dict]] = {
    "lr": (["local", "fedfomo", "pfedsv"], {}, {"lr": LRS}),
    "readings": (["pfedsv"], {}, READINGS),
    "dirichlet": (
        ["local", "fedfomo", "pfedsv"],
        {"partition": "dirichlet", "alpha": DIRICHLET_ALPHA},
        {},
    ),
    # not in the paper: the client keeps its own trained model when the aggregate validates
    # below it
    "guard": (["pfedsv"], {"pfedsv.guard": "validation"}, {}),
}


def plan(name: str, seeds: list[int], runs_dir: Path) -> list[sweep.PlannedRun]:
    strategies, settings, grid = SWEEPS[name]
    built = sweep.build_sweep(
        preset=PRESET,
        strategies=strategies,
        seeds=seeds,
        settings=settings,
        grid=grid,
        out=runs_dir / name,
    )
    return sweep.plan_runs(built)


def run_rows(name: str, runs: list[sweep.PlannedRun]) -> list[dict]:
    """One row per completed run: its setting, method, seed and accuracies (fractions)."""
    rows = []
    for run in runs:
        summary = completed_summary(run.directory)
        if summary is None:
            continue
        rounds = read_rounds(run.directory / "rounds.jsonl")
        last = rounds[-1]["evaluation"]["per_client"]
        row = dict.fromkeys(FIELDS, "") | {
            "sweep": name,
            "setting": run.setting_name,
            "method": run.method,
            "seed": run.seed,
            "aggregate": summary["personalized"]["last"]["mean"],
            "test_images": sum(c["test_samples"] for c in last.values()) / len(last),
        }
        if run.strategy == "pfedsv":
            server = [r["train"]["server"] for r in rounds if r.get("train")]
            row["trained"] = server[-1]["mean-trained-test-accuracy"]
            row["below_own"] = float(np.mean([s["mean-aggregate-below-own"] for s in server]))
            row["coalition"] = float(np.mean([s["mean-coalition-size"] for s in server]))
            row["own_weight"] = float(np.mean([s["mean-own-weight"] for s in server]))
        rows.append(row)
    return rows


def _ms(values: dict[int, float]) -> str:
    """Mean ± std, in %, of one figure over the seeds."""
    series = list(values.values())
    return f"{100 * np.mean(series):.2f} ± {100 * np.std(series):.2f}"


def _record(ours: dict[int, float], theirs: dict[int, float]) -> str:
    """Wins, ties and losses over the seeds both have (accuracies compared to 1e-9), and the
    two-sided sign test's p-value over the seeds that are not tied."""
    diffs = [ours[s] - theirs[s] for s in sorted(set(ours) & set(theirs))]
    wins = sum(d > 1e-9 for d in diffs)
    losses = sum(d < -1e-9 for d in diffs)
    text = f"{wins}–{len(diffs) - wins - losses}–{losses}"
    if wins + losses:
        text += f" (p {binomtest(wins, wins + losses).pvalue:.2f})"
    return text


def _granularity(rows: list[dict]) -> str:
    """How far one misclassified test image moves a run's mean over clients, on the
    pathological split (the Dirichlet split's clients hold different numbers)."""
    images = [
        float(r["test_images"]) for r in rows if r.get("test_images") and r["sweep"] != "dirichlet"
    ]
    if not images:
        return ""
    clients = int(load_preset(PRESET).config["num-clients"])
    step = 100 / (clients * float(np.mean(images)))
    return (
        f" On the pathological split one test image of one client moves a run's mean by "
        f"about {step:.2f} points "
        f"({clients} clients, {np.mean(images):.1f} test images each on average)."
    )


def write_report(rows: list[dict], out: Path) -> None:
    def column(sweep_name: str, setting: str, method: str, key: str) -> dict[int, float]:
        return {
            int(r["seed"]): float(r[key])
            for r in rows
            if (r["sweep"], r["setting"], r["method"]) == (sweep_name, setting, method)
        }

    def pfedsv_cells(sweep_name: str, setting: str, method: str, fomo: dict[int, float]) -> str:
        agg, trained = (column(sweep_name, setting, method, k) for k in ("aggregate", "trained"))
        below, coalition, own = (
            np.mean(list(column(sweep_name, setting, method, k).values()))
            for k in ("below_own", "coalition", "own_weight")
        )
        return (
            f"{_ms(agg)} | {_record(agg, fomo)} | {_ms(trained)} | {_record(trained, fomo)} "
            f"| {100 * below:.0f} % | {coalition:.2f} | {own:.2f} |"
        )

    pfedsv_head = (
        "pfedsv θ_i^{t*} | W–T–L (p) | pfedsv θ_i^t | W–T–L (p) | below own | coalition "
        "| own weight |"
    )
    seeds = sorted({int(r["seed"]) for r in rows})
    lines = [
        "# pFedSV's readings against FedFomo on `digits` pathological",
        "",
        f"Command: `python benchmarks/pfedsv_readings.py --seeds {' '.join(map(str, seeds))}` "
        "(`--report-only` rewrites this file from the per-run figures in "
        f"`{out.stem}.csv`). Preset `{PRESET}`: the embedded digits set, classes {{i, i+1}} "
        "(mod 10) per client, 10 clients, full participation, 20 rounds, E = 5, batch 32, "
        "20 % validation; on a 2-core CPU. Accuracy in %, after the last round, the unweighted "
        "mean over clients of each client's model on its own test split; mean ± std over the "
        f"{len(seeds)} seeds (each run's figure is in the CSV). pFedSV is scored on the "
        "aggregate θ_i^{t*} (the default) and on the trained θ_i^t (docs/papers/pfedsv.md §9.8's other "
        "reading). W–T–L (p): the seeds on which that reading scores above, level with and "
        "below FedFomo at the same lr and seed, and the two-sided sign test's p-value over the "
        "seeds not level. Means over the rounds: below own, the client-rounds in which the "
        "aggregate validated below the client's own trained model; coalition, the players "
        "valued (the own model included); own weight, the own model's weight in the aggregate."
        + _granularity(rows),
        "",
        "## The learning rate (`lr` sweep)",
        "",
        f"| lr | local | fedfomo | {pfedsv_head}",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def methods_row(first_cell: str, sweep_name: str, setting: str) -> list[str]:
        """local, FedFomo and pFedSV at one setting, if all three ran."""
        local = column(sweep_name, setting, "local", "aggregate")
        fomo = column(sweep_name, setting, "fedfomo", "aggregate")
        if not (local and fomo and column(sweep_name, setting, "pfedsv", "aggregate")):
            return []
        return [
            f"| {first_cell} | {_ms(local)} | {_ms(fomo)} | "
            + pfedsv_cells(sweep_name, setting, "pfedsv", fomo)
        ]

    for lr in LRS:
        lines += methods_row(str(lr), "lr", f"lr={lr}")
    fomo = column("lr", f"lr={PRESET_LR}", "fedfomo", "aggregate")
    # a readings run's method label carries its choices: pfedsv,alpha=0.5,empty-value=zero,...
    methods = {
        r["method"]: dict(part.split("=", 1) for part in r["method"].split(",")[1:])
        for r in rows
        if r["sweep"] == "readings"
    }
    # the rows in the grid's order, the defaults (each list's first value) first
    wanted = [
        {key.split(".", 1)[1]: str(value) for key, value in zip(READINGS, combo, strict=True)}
        for combo in itertools.product(*READINGS.values())
    ]
    order = [method for want in wanted for method, values in methods.items() if values == want]
    if order and fomo:
        lines += [
            "",
            f"## The open choices (`readings` sweep, lr {PRESET_LR})",
            "",
            f"FedFomo at lr {PRESET_LR}: {_ms(fomo)}. The first row is the default.",
            "",
            f"| v(∅) | top-k rule | α | {pfedsv_head}",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for method in order:
            values = methods[method]
            lines.append(
                f"| {values['empty-value']} | {values['top-k-rule']} | {values['alpha']} | "
                + pfedsv_cells("readings", "all", method, fomo)
            )
    if fomo and column("guard", "all", "pfedsv", "aggregate"):
        lines += [
            "",
            "## With the validation guard (`guard` sweep; not in the paper)",
            "",
            f"The default settings with `pfedsv.guard=validation`, at lr {PRESET_LR}: the client keeps "
            "its own trained model when the aggregate validates below it.",
            "",
            f"| guard | {pfedsv_head}",
            "|---|---|---|---|---|---|---|---|",
            "| validation | " + pfedsv_cells("guard", "all", "pfedsv", fomo),
        ]
    dirichlet = methods_row(f"Dirichlet({DIRICHLET_ALPHA})", "dirichlet", "all")
    if dirichlet:
        lines += [
            "",
            "## A split where local training is not at the ceiling (`dirichlet` sweep)",
            "",
            f"The same preset with `partition=dirichlet alpha={DIRICHLET_ALPHA}` (the paper's "
            "Table 2 split) instead of the pathological one, at the preset's lr.",
            "",
            f"| split | local | fedfomo | {pfedsv_head}",
            "|---|---|---|---|---|---|---|---|---|---|",
            *dirichlet,
        ]
    out.write_text("\n".join(lines) + "\n")


def _key(row: dict) -> tuple:
    return (row["sweep"], row["setting"], row["method"], int(row["seed"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--sweeps", nargs="+", default=list(SWEEPS), choices=list(SWEEPS))
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "pfedsv_readings"))
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "pfedsv_readings.md")
    )
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    table = out.with_suffix(".csv")
    kept = list(csv.DictReader(table.open())) if table.exists() else []
    if not args.report_only:
        fresh: list[dict] = []
        for name in args.sweeps:
            runs = plan(name, args.seeds, Path(args.runs_dir))
            todo = sweep.configs_to_run(runs)
            if todo:
                code, tail = run_simulations(todo, verbosity=0)
                if code != 0:
                    print("\n".join(tail))
            fresh += run_rows(name, plan(name, args.seeds, Path(args.runs_dir)))
        # a run measured now replaces its kept figures; the others stay
        done = {_key(r) for r in fresh}
        kept = sorted([r for r in kept if _key(r) not in done] + fresh, key=_key)
        with table.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(kept)
    if not kept:
        raise SystemExit(f"no per-run figures in {table}: run the sweeps first")
    write_report(kept, out)
    print(out.read_text())


if __name__ == "__main__":
    main()
