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
seeds not tied. Every run still to do goes to one simulation process (started once), seed
after seed (every method and both presets for a seed, pFedSV and FedFomo first, then the
next seed), so a run cut short still gives complete seeds; a completed run is not run
again, and the per-run figures are kept in ``<report>.csv``. ``--report-only`` also picks
up the runs completed so far in ``--runs-dir``, so the report can be written while the
simulation process is still going.

Usage::

    python benchmarks/pfedsv_claim.py --seeds 0 1 2 3 4 5 6 7 8 9
    python benchmarks/pfedsv_claim.py --report-only
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

from pflarena.cli import sweep
from pflarena.runtime.launch import run_simulations
from pflarena.server.results import completed_summary, read_rounds

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ["pfedsv-digits-groups", "pfedsv-digits-dirichlet"]
METHODS = ["local", "fedavg", "fedavg-ft", "fedfomo", "pfedsv"]
#: the order the runs of one seed are done in: the comparison the claim is about first
RUN_ORDER = ["pfedsv", "fedfomo", "local", "fedavg", "fedavg-ft"]
FIELDS = (
    "preset", "method", "seed", "aggregate", "trained", "coalition", "own_weight", "below_own",
    "seconds",
)  # fmt: skip
CLIENT_FIELDS = (
    "preset", "seed", "client", *METHODS, "related_peers", "valued_peers", "positive_peers",
    "positive_related",
)  # fmt: skip


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
        "seconds": round(float(summary.get("wall_time_s", 0.0)), 1),
    }
    if run.strategy == "pfedsv":
        server = [r["train"]["server"] for r in rounds if r.get("train")]
        row["trained"] = server[-1]["mean-trained-test-accuracy"]
        row["coalition"] = float(np.mean([s["mean-coalition-size"] for s in server]))
        row["own_weight"] = float(np.mean([s["mean-own-weight"] for s in server]))
        row["below_own"] = float(np.mean([s["mean-aggregate-below-own"] for s in server]))
    return row


def all_runs(
    seeds: list[int], presets: list[str], runs_dir: Path
) -> list[tuple[str, sweep.PlannedRun]]:
    """Every (preset, run), seed after seed, in :data:`RUN_ORDER` within a seed."""
    out = []
    for seed in seeds:
        for preset in presets:
            runs = plan(preset, [seed], runs_dir)
            out += [(preset, r) for r in sorted(runs, key=lambda r: RUN_ORDER.index(r.method))]
    return out


def _last_per_client(run: sweep.PlannedRun) -> dict[int, float]:
    rounds = [r for r in read_rounds(run.directory / "rounds.jsonl") if r.get("evaluation")]
    return {
        int(c): float(v["personalized"])
        for c, v in rounds[-1]["evaluation"]["per_client"].items()
        if v.get("personalized") is not None
    }


def client_rows(preset: str, runs: dict[str, sweep.PlannedRun]) -> list[dict]:
    """Per client of one seed: each method's last-round accuracy and, for pFedSV, how its
    final relevance vector (the run's ``relevance.csv``, client × peer by client id; 0 for
    peers never valued) splits over the peers that hold the client's most frequent
    training label ("related") and those that do not."""
    from pflarena.core.federation import load_client
    from pflarena.server.build import parse_config

    pf = runs["pfedsv"]
    spec = parse_config(pf.run_config).federation_spec()
    labels, major = [], []
    for c in range(spec.num_clients):
        data, _ = load_client(spec, c)
        labels.append(set(np.unique(data.y_train).tolist()))
        major.append(int(np.bincount(data.y_train).argmax()))
    relevance = np.genfromtxt(pf.directory / "relevance.csv", delimiter=",", comments="#")
    acc = {m: _last_per_client(r) for m, r in runs.items()}
    rows = []
    for c in range(spec.num_clients):
        related = np.array([major[c] in labels[j] and j != c for j in range(len(labels))])
        phi = relevance[c]
        positive = np.nan_to_num(phi, nan=0.0) > 0
        rows.append(
            {
                "preset": preset,
                "seed": pf.seed,
                "client": c,
                **{m: acc[m].get(c, "") for m in METHODS},
                "related_peers": int(related.sum()),
                "positive_peers": int(positive.sum()),
                "positive_related": int((positive & related).sum()),
                "valued_peers": int((np.nan_to_num(phi, nan=0.0) != 0).sum()),
            }
        )
    return rows


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


def failed_seeds(runs: list[tuple[str, sweep.PlannedRun]]) -> dict[str, dict[int, str]]:
    """Per preset, the seeds whose runs failed, with the error (e.g. a split that cannot
    be drawn)."""
    import json

    failed: dict[str, dict[int, str]] = {}
    for preset, run in runs:
        path = run.directory / "summary.json"
        if path.exists():
            summary = json.loads(path.read_text())
            if summary.get("status") == "failed":
                failed.setdefault(preset, {})[run.seed] = str(summary.get("error", ""))
    return failed


def write_report(
    rows: list[dict],
    clients: list[dict],
    out: Path,
    command: str,
    failed: dict[str, dict[int, str]] | None = None,
) -> None:
    lines = [
        "# pFedSV against the baselines where local training is weak",
        "",
        f"Command: `{command}` (niced, on a 2-core CPU shared with other jobs; "
        "`--report-only` rewrites this file from the per-run figures in "
        f"`{out.stem}.csv`). Accuracy in %: the unweighted mean over clients of each "
        "client's personalized model on its own test split after the last round (pFedSV: "
        "the aggregate θ_i^{t*}), mean ± std over the seeds that completed every method. "
        "W–T–L (p): the seeds on which pFedSV scores above, level with and below the "
        "baseline, and the two-sided sign test's p-value over the seeds not level. "
        "Commands with disjoint `--seeds` (and `--presets`) may run side by side, each in "
        "one simulation process; a resumed run's wall time counts its last stretch only.",
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
        lines += ["", f"## `{preset}` ({len(seeds)} seeds: {', '.join(map(str, seeds))})", ""]
        for seed, error in sorted((failed or {}).get(preset, {}).items()):
            reason = error.split("first problem: ")[-1].split(" (")[0]
            lines += [f"Seed {seed} cannot be run: {reason}.", ""]
        lines += [
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
    lines += evidence(rows, clients)
    out.write_text("\n".join(lines) + "\n")


def evidence(rows: list[dict], clients: list[dict]) -> list[str]:
    """Where pFedSV's aggregate wins or loses: per-run means of its round metrics, and
    per-client differences against FedFomo, split by how well local training does."""
    lines = [
        "",
        "## Why: coalitions, weights and per-client differences",
        "",
        "Per preset, over the seeds above (pFedSV's round metrics averaged over the rounds, "
        "then over the seeds): coalition, the players valued (own model included); own "
        "weight, the own model's weight in θ_i^{t*}; below own, the client-rounds whose "
        "aggregate validated below the client's own trained θ_i^t; θ_i^t − θ_i^{t*}, the "
        "trained model's test accuracy minus the aggregate's after the last round.",
        "",
        "| preset | coalition | own weight | below own | θ_i^t − θ_i^{t*} (points) |",
        "|---|---|---|---|---|",
    ]
    for preset in PRESETS:
        mine = [r for r in rows if (r["preset"], r["method"]) == (preset, "pfedsv")]
        mine = [r for r in mine if str(r.get("below_own", "")) not in ("", "nan")]
        if not mine:
            continue
        gap = [float(r["trained"]) - float(r["aggregate"]) for r in mine]
        lines.append(
            f"| `{preset}` ({len(mine)} seeds) | "
            f"{np.mean([float(r['coalition']) for r in mine]):.2f} | "
            f"{np.mean([float(r['own_weight']) for r in mine]):.2f} | "
            f"{100 * np.mean([float(r['below_own']) for r in mine]):.0f} % | "
            f"{100 * np.mean(gap):+.2f} ± {100 * np.std(gap):.2f} |"
        )
    if not clients:
        return lines
    lines += [
        "",
        "Per client, after the last round (the seeds whose runs are kept in the runs "
        "directory): the clients (of all those seeds together) ranked by their local-training "
        "accuracy and split into three equal parts (ties in rank order); for each "
        "third, the mean accuracy of local, FedFomo and pFedSV's θ_i^{t*}, and the share of "
        "clients on which pFedSV is above / level with / below FedFomo. Relevance: of the "
        "peers a client valued (non-zero final φ), the share valued positively, and of those "
        "the share that hold the client's most frequent training label (on the groups split: "
        "the peers of its group).",
        "",
        "| preset | seeds | clients by local accuracy | local | fedfomo | pfedsv | pfedsv − fedfomo "
        "| above / level / below |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for preset in PRESETS:
        mine = [c for c in clients if c["preset"] == preset and c["pfedsv"] not in ("", None)]
        if not mine:
            continue
        seeds = sorted({int(c["seed"]) for c in mine})
        order = np.argsort([float(c["local"]) for c in mine], kind="stable")
        parts = np.array_split(order, 3)
        for name, idx in zip(("lowest third", "middle third", "highest third"), parts, strict=True):
            part = [mine[i] for i in idx]
            if not part:
                continue
            d = np.array([float(c["pfedsv"]) - float(c["fedfomo"]) for c in part])
            lines.append(
                f"| `{preset}` | {len(seeds)} | {name} ({len(part)}) | "
                + " | ".join(
                    f"{100 * np.mean([float(c[m]) for c in part]):.2f}"
                    for m in ("local", "fedfomo", "pfedsv")
                )
                + f" | {100 * d.mean():+.2f} | {np.mean(d > 1e-9):.0%} / "
                f"{np.mean(np.abs(d) <= 1e-9):.0%} / {np.mean(d < -1e-9):.0%} |"
            )
    lines += [
        "",
        "| preset | valued peers | positive | positive holding the client's main label |",
        "|---|---|---|---|",
    ]
    for preset in PRESETS:
        mine = [c for c in clients if c["preset"] == preset]
        if not mine:
            continue
        valued = sum(int(c["valued_peers"]) for c in mine)
        positive = sum(int(c["positive_peers"]) for c in mine)
        related = sum(int(c["positive_related"]) for c in mine)
        lines.append(
            f"| `{preset}` | {valued / len(mine):.1f} per client | "
            f"{positive / max(valued, 1):.0%} | {related / max(positive, 1):.0%} |"
        )
    return lines


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
    client_table = out.with_name(f"{out.stem}_clients.csv")
    clients = list(csv.DictReader(client_table.open())) if client_table.exists() else []
    command = "python benchmarks/pfedsv_claim.py --seeds " + " ".join(map(str, args.seeds))

    def save() -> None:
        with table.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(sorted(kept, key=_key))
        with client_table.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CLIENT_FIELDS)
            writer.writeheader()
            writer.writerows(
                sorted(clients, key=lambda c: (c["preset"], int(c["seed"]), int(c["client"])))
            )
        write_report(kept, clients, out, command, failed_seeds(runs))

    runs = all_runs(args.seeds, args.presets, Path(args.runs_dir))
    if not args.report_only:
        todo = sweep.configs_to_run([r for _, r in runs])
        if todo:
            print(f"{len(todo)} runs in one simulation process", flush=True)
            code, tail = run_simulations(todo, verbosity=0, engine=args.engine)
            if code != 0:
                print("\n".join(tail))
    for preset, run in runs:
        row = run_row(preset, run)
        if row is not None:
            kept = [r for r in kept if _key(r) != _key(row)] + [row]
    by_seed: dict[tuple, dict] = {}
    for preset, run in runs:
        by_seed.setdefault((preset, run.seed), {})[run.method] = run
    for (preset, seed), methods in by_seed.items():
        if len(methods) == len(METHODS) and all(
            completed_summary(r.directory) is not None for r in methods.values()
        ):
            clients = [
                c for c in clients if (c["preset"], int(c["seed"])) != (preset, seed)
            ] + client_rows(preset, methods)
    if not kept:
        raise SystemExit(f"no per-run figures in {table}: run the benchmark first")
    save()
    print(out.read_text())


if __name__ == "__main__":
    main()
