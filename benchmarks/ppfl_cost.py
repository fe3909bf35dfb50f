"""PPFL's round cost against FedAvg's, and PPFL1's output mixing (prob or logit), measured.

``cost`` (``results/ppfl_cost.md``): ``ppfl-synthetic`` (the preset's settings: PPFL1,
theta-first, K = 4, the authors' optimizer; FedAvg with the same local training), with
``--clients`` of its clients, ``--rounds`` rounds per run; FedAvg and PPFL1 run
alternately, ``--repeats`` times each, in this one script run, on the in-process engine
(one process, the clients one after another, so the clients' summed time is the round's
work, not the machine's parallelism). Per run, the median over rounds 2.. of the round's
train phase (wall) and of the clients' summed solver CPU time; the ratio PPFL1 / FedAvg of
those medians, per repeat.

``mixing`` (``results/ppfl_mix.md``): PPFL1 with ``mix=prob`` (the presets' default) and
``mix=logit`` (the authors' code mixes logits), everything else the preset's, on
``--clients`` clients for ``--mix-rounds`` rounds; the personalized accuracy (weighted and
mean over clients) at the last round and the memberships' mean entropy.

Usage::

    nice -n 10 python benchmarks/ppfl_cost.py cost --clients 30 --rounds 4 --repeats 2
    nice -n 10 python benchmarks/ppfl_cost.py mixing --clients 50 --mix-rounds 20
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from pflarena.core.presets import load_preset
from pflarena.runtime.launch import simulate
from pflarena.server.build import parse_config
from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
PRESET = "ppfl-synthetic"
DATA_DIR = ROOT.parent / "shared" / "data"  # mnist (ppfl-mnist)


def run_config(
    strategy: str, clients: int, rounds: int, out: Path, preset: str = PRESET, **extra
) -> dict:
    config = load_preset(preset).overrides(strategy)
    if preset == "ppfl-mnist":
        config["data-dir"] = str(DATA_DIR)
    return (
        config
        | {
            "strategy": strategy,
            "num-clients": clients,
            "num-rounds": rounds,
            "eval-every": rounds,
            "output-dir": str(out),
        }
        | extra
    )


def simulate_run(config: dict) -> list[dict]:
    out = Path(config["output-dir"])
    shutil.rmtree(out, ignore_errors=True)
    simulate(
        parse_config(config), engine="inprocess", verbosity=0, log_file=out.with_suffix(".log")
    )
    return read_rounds(out / "rounds.jsonl")


def round_cost(rounds: list[dict]) -> tuple[float, float]:
    rows = [r for r in rounds if r.get("round", 0) >= 2 and "train" in r]
    return (
        statistics.median(r["train_time_s"] for r in rows),
        statistics.median(r["train"]["client_cpu_s"] for r in rows),
    )


def settings(args) -> str:
    """The preset's PPFL1 settings that decide a round's cost, in words."""
    config = run_config("ppfl", args.clients, args.rounds, Path("."), args.preset)
    count = config.get("ppfl.num-canonical", 2)
    epochs, batch = config.get("local-epochs", 2), config.get("batch-size", 32)
    kept = "kept" if config.get("ppfl.persistent-momentum") else "fresh"
    return (
        f"K = {count} whole-model copies, {epochs} local epoch(s) of batch {batch}, SGD "
        f"momentum {config.get('momentum', 0.0)} ({kept} between rounds)"
    )


def cost(args) -> None:
    runs = Path(args.runs_dir)
    table = []
    for repeat in range(args.repeats):
        measured = {}
        for strategy in ("fedavg", "ppfl"):
            print(f"== cost: {strategy}, repeat {repeat + 1}", flush=True)
            out = runs / f"cost-{args.preset}-{strategy}-{repeat}"
            measured[strategy] = round_cost(
                simulate_run(run_config(strategy, args.clients, args.rounds, out, args.preset))
            )
        table.append(measured)
    lines = [
        "# PPFL: a round's cost against FedAvg's",
        "",
        f"`python benchmarks/ppfl_cost.py cost --preset {args.preset} --clients {args.clients} "
        f"--rounds {args.rounds} --repeats {args.repeats}` on a 2-core machine shared with "
        "other work: compare the ratios, each from runs made one after the other in this "
        "script run. "
        f"`{args.preset}` with {args.clients} clients (full participation, the preset's "
        f"settings: PPFL1 theta-first, {settings(args)}; FedAvg the same local training), "
        "in-process engine, evaluated only after the last round; medians over rounds "
        f"2-{args.rounds}.",
        "",
        "| repeat | FedAvg train phase (s) | PPFL1 train phase (s) | ratio | "
        "FedAvg clients' CPU (s) | PPFL1 clients' CPU (s) | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, m in enumerate(table, 1):
        (fw, fc), (pw, pc) = m["fedavg"], m["ppfl"]
        lines.append(
            f"| {i} | {fw:.2f} | {pw:.2f} | **{pw / fw:.2f}** | {fc:.2f} | {pc:.2f} | "
            f"**{pc / fc:.2f}** |"
        )
    lines += [
        "",
        "A PPFL1 round here is one exchange (its membership epoch folded into the next "
        "round's message, the last round's in an exchange of its own), each message carrying "
        "the K = 4 canonical models; the epoch runs on each copy's outputs computed once "
        "(docs/papers/ppfl.md §11). CPU: the clients' solver CPU time summed "
        "(`client_cpu_s`).",
        "",
    ]
    write(Path(args.out), lines)


def mixing(args) -> None:
    runs = Path(args.runs_dir)
    rows = []
    for mix in ("prob", "logit"):
        print(f"== mixing: {mix}", flush=True)
        out = runs / f"mix-{mix}"
        rounds = simulate_run(
            run_config("ppfl", args.clients, args.mix_rounds, out, **{"ppfl.mix": mix})
        )
        last = [r for r in rounds if "evaluation" in r][-1]
        personal = last["evaluation"]["personalized"]
        entropy = [r["train"]["server"].get("membership-entropy") for r in rounds if "train" in r]
        rows.append((mix, personal["weighted"], personal["mean"], entropy[-1]))
    lines = [
        "# PPFL1: mixing probabilities or logits",
        "",
        f"`python benchmarks/ppfl_cost.py mixing --clients {args.clients} "
        f"--mix-rounds {args.mix_rounds}`: `{PRESET}` with {args.clients} clients, every "
        "other setting the preset's (the authors' step sizes), in-process engine, one seed.",
        "",
        f"| mix | personalized accuracy, weighted (round {args.mix_rounds}) | mean over clients "
        "| memberships' mean entropy (last round) |",
        "|---|---|---|---|",
    ]
    for mix, weighted, mean, entropy in rows:
        shown = "n/a" if entropy is None else f"{entropy:.3f}"
        lines.append(f"| {mix} | {100 * weighted:.2f} % | {100 * mean:.2f} % | {shown} |")
    lines.append("")
    write(Path(args.mix_out), lines)


def write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("cost", "mixing"))
    parser.add_argument("--preset", default=PRESET, choices=(PRESET, "ppfl-mnist"))
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--mix-rounds", type=int, default=20)
    parser.add_argument("--runs-dir", default="runs/ppfl-cost")
    parser.add_argument("--out", default=None, help="default results/ppfl_cost[_mnist].md")
    parser.add_argument("--mix-out", default=str(ROOT / "benchmarks/results/ppfl_mix.md"))
    args = parser.parse_args()
    if args.out is None:
        suffix = "_mnist" if args.preset == "ppfl-mnist" else ""
        args.out = str(ROOT / f"benchmarks/results/ppfl_cost{suffix}.md")
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    cost(args) if args.part == "cost" else mixing(args)


if __name__ == "__main__":
    main()
