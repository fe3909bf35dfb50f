"""Every method on a FEMNIST-shaped federation: 3,550 clients, 10 % a round, 2 rounds.

LEAF's FEMNIST has 3,550 writers whose sample counts have mean 226.8 and standard deviation
88.9 (LEAF's paper, Table 1); its images cannot be fetched here, so the federation is built
from MNIST (70,000 images, offline) with the same number of clients and the same spread of
sizes: ``inner-dirichlet`` with log-normal client sizes of sigma 0.38 (a log-normal's
coefficient of variation is sqrt(exp(sigma^2) - 1): 0.392 = 88.9 / 226.8) and labels drawn
per client from Dirichlet(1.0) (each writer writes every character, unevenly). About 20
images a client: the shape of the federation, not its volume.

Each method is first checked (``pflarena run --check``: a method whose server would not fit
this machine says so, :mod:`pflarena.core.footprint`), then run as a real ``pflarena run``
simulation, its process tree sampled as ``benchmarks/scale.py`` samples it: peak memory
(summed RSS and PSS), each training round's wall time, the clients' state on disk, the
server's state (its pools and checkpoint) and the accuracy. Round 0 and the last evaluation
test a 10 % sample (``initial-evaluation=sample``, ``final-evaluation=sample``), so that
the run's time is its rounds'. The table is rewritten after each method.

Usage::

    python benchmarks/every_method_scale.py [--methods ditto fedavg] [--timeout 900]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commit_tree import head_commit
from scale import MB, disk_bytes, method_flags, run_sampled

from pflarena.server.results import read_rounds
from pflarena.strategies import declarations

ROOT = Path(__file__).resolve().parents[1]
#: LEAF FEMNIST's writers, and the log-normal sigma of their sizes (module docstring)
CLIENTS, SIGMA, ALPHA = 3550, 0.38, 1.0


def command(method: str, args: argparse.Namespace, out: Path) -> list[str]:
    cmd = [
        sys.executable, "-m", "pflarena.cli", "run", "--strategy", method,
        "--dataset", "mnist", "--data-dir", args.data_dir, "--model", "cnn",
        "--partition", "inner-dirichlet", "--alpha", str(ALPHA),
        "--quantity-sigma", str(SIGMA), "--num-clients", str(args.clients),
        "--fraction-train", str(args.fraction), "--num-rounds", str(args.rounds),
        "--eval-every", str(args.rounds), "--fraction-evaluate", str(args.fraction),
        "--initial-evaluation", "sample", "--final-evaluation", "sample",
        "--output-dir", str(out), "--quiet",
    ]  # fmt: skip
    return cmd + method_flags(method) + shlex.split(args.flags)


def measure(method: str, args: argparse.Namespace, workdir: Path) -> dict:
    label = f"{method} `{args.flags}`" if args.flags else method
    out = workdir / method
    cmd = command(method, args, out)
    checked = subprocess.run([*cmd, "--check"], capture_output=True, text=True, cwd=ROOT)
    if checked.returncode != 0:
        lines = (checked.stderr or checked.stdout).strip().splitlines()
        return {"method": label, "outcome": "refused at --check", "why": " ".join(lines[-1:])}
    start = time.monotonic()
    returncode, output, sampler = run_sampled(cmd, timeout=args.timeout, cwd=ROOT)
    if returncode is None:
        outcome = f"stopped after {args.timeout:.0f} s"
    else:
        outcome = {0: "completed", 3: "completed, clients failed"}.get(
            returncode, f"failed (exit {returncode})"
        )
    rounds = read_rounds(out / "rounds.jsonl") if (out / "rounds.jsonl").exists() else []
    trained = [r for r in rounds if r["round"] >= 1]
    last_eval = next((r["evaluation"] for r in reversed(rounds) if r.get("evaluation")), None)
    why = ""
    if not outcome.startswith("completed"):
        why = " ".join(output.strip().splitlines()[-1:])
    return {
        "method": label,
        "outcome": outcome,
        "why": why,
        "wall_s": time.monotonic() - start,
        "round0_s": rounds[0]["elapsed_s"] if rounds else None,
        "round_s": [r["train_time_s"] for r in trained],
        "failures": sum(r.get("train", {}).get("failures", 0) for r in trained),
        "peak_rss_mb": sampler.peak_rss / MB,
        "peak_pss_mb": sampler.peak_pss / MB,
        "client_state_mb": disk_bytes(out / "client-state") / MB,
        "server_state_mb": (disk_bytes(out / "server-state") + disk_bytes(out / "checkpoint.npz"))
        / MB,
        "accuracy": last_eval["personalized"]["mean"] if last_eval else None,
    }


def _cell(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def write(
    results: list[dict], runs: list[dict], args: argparse.Namespace, replaced: list[dict]
) -> None:
    per_round = int(args.clients * args.fraction)
    said = "; ".join(f"`{r['command']}` at commit `{r['commit']}`, {r['date']}" for r in runs)
    lines = [
        "# Every method at FEMNIST's size",
        "",
        f"Commands: {said}; {os.cpu_count()} CPU cores ({platform.machine()}), "
        f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GB, the "
        "default engine. The host is shared with other work: times are indicative.",
        "",
        f"{args.clients:,} clients with LEAF FEMNIST's spread of sizes, built from MNIST "
        f"(`inner-dirichlet`, alpha {ALPHA}, log-normal sizes of sigma {SIGMA}; the script's "
        f"docstring says why), the FedAvg CNN, {per_round} clients a round, {args.rounds} "
        "rounds, 1 local epoch where the method honours it; round 0 and the last evaluation "
        f"test {per_round} clients. **Peak RSS / PSS**: summed over the run's processes "
        "(RSS counts a page shared by several processes in each). **Rounds**: each training "
        "round's wall time (round 1 includes starting the engine's workers). **Client / "
        "server state**: on disk at the end (the clients' stores; the server's pools and "
        "checkpoint).",
        "",
        "| method | outcome | peak RSS (MB) | peak PSS (MB) | round 0 (s) | rounds (s) "
        "| wall (s) | client failures | client state (MB) | server state (MB) "
        "| personalized acc |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r["outcome"] == "refused at --check":
            lines.append(f"| {r['method']} | refused at `--check` | | | | | | | | | |")
            continue
        rounds = ", ".join(f"{t:.1f}" for t in r["round_s"])
        acc = None if r["accuracy"] is None else 100 * r["accuracy"]
        lines.append(
            f"| {r['method']} | {r['outcome']} | {r['peak_rss_mb']:.0f} | {r['peak_pss_mb']:.0f} "
            f"| {_cell(r['round0_s'], '.1f')} | {rounds} | {r['wall_s']:.0f} | {r['failures']} "
            f"| {r['client_state_mb']:.1f} | {r['server_state_mb']:.1f} | {_cell(acc, '.2f')} |"
        )
    said = [r for r in results if r.get("why")]
    if said:
        lines += ["", "What the refused, failed or stopped runs said:", ""]
        lines += [f"- **{r['method']}**: {r['why']}" for r in said]
    if replaced:
        lines += [
            "",
            "Rows replaced by a later run of the same method (the table above has the later "
            "one; the commit says which code each measured):",
            "",
            "| method | commit | outcome | peak PSS (MB) | rounds (s) | personalized acc |",
            "|---|---|---|---|---|---|",
        ]
        for r in replaced:
            rounds = ", ".join(f"{t:.1f}" for t in r.get("round_s") or [])
            acc = None if r.get("accuracy") is None else 100 * r["accuracy"]
            pss = r.get("peak_pss_mb")
            lines.append(
                f"| {r['method']} | `{r.get('commit', '')}` | {r['outcome']} "
                f"| {_cell(pss, '.0f')} | {rounds} | {_cell(acc, '.2f')} |"
            )
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(
        json.dumps({"runs": runs, "results": results, "replaced": replaced}, indent=1) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--methods", nargs="+", default=sorted(declarations()))
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per method")
    parser.add_argument(
        "--flags", default="", help="more `pflarena run` flags for these methods' runs"
    )
    parser.add_argument(
        "--add",
        action="store_true",
        help="keep the rows already in --out (its .json beside it) and add these runs' rows; "
        "a method measured again replaces its row (the earlier one is listed below the table)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale_methods.md"))
    args = parser.parse_args()
    run = {
        "command": f"python benchmarks/every_method_scale.py {shlex.join(sys.argv[1:])}",
        "commit": head_commit(),
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    }
    runs, results, replaced = [run], [], []
    kept = Path(args.out).with_suffix(".json")
    if args.add and kept.is_file():
        before = json.loads(kept.read_text())
        runs, results = [*before["runs"], run], before["results"]
        replaced = before.get("replaced", [])
    with tempfile.TemporaryDirectory(prefix="pflarena-methods-") as tmp:
        for method in args.methods:
            print(f"== {method} (load average {os.getloadavg()[0]:.2f})", flush=True)
            result = measure(method, args, Path(tmp)) | {"commit": run["commit"]}
            print(json.dumps(result), flush=True)
            replaced += [r for r in results if r["method"] == result["method"]]
            results = [r for r in results if r["method"] != result["method"]] + [result]
            write(results, runs, args, replaced)
            for leftover in Path(tmp).iterdir():  # the next run's disk, not this one's
                shutil.rmtree(leftover, ignore_errors=True)


if __name__ == "__main__":
    main()
