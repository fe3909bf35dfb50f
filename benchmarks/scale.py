"""Memory and time of a simulation as the number of clients grows, and where the memory goes.

A method (``--strategy``: Ditto by default, a personal model per client kept in the client's
state; FedAvg is stateless) with the FedAvg CNN on MNIST, IID over N clients, 10% of them per
round, on each of ``--engines`` (pflarena's default in-process engine, and Flower's Ray
backend, the engine of Flower's own simulation). Each run is a real `pflarena run` simulation; its
whole process tree is sampled every 0.5 s (PSS and USS every 2 s). Reported per run: the
peaks of the summed resident memory (RSS), proportional set size (PSS) and unique set size
(USS), the mean wall time of a training round (rounds 2..; round 1 includes the workers'
fork), the size of the clients' state on disk, and how many client evaluations were made.
Every client is evaluated before round 1 and after the last (the run's default
final-evaluation=all); evaluations in between (every ``--eval-every`` rounds, by default
none) test a ``--fraction-evaluate`` share of the clients.

Where the memory goes: each process of the tree gets a role from its command line and its
parent: ``cli`` (the ``pflarena run`` process), ``simulation`` (the process that runs the
ServerApp, ``pflarena.runtime.simulation``), ``worker`` (a process forked from the simulation
process, whose command line it inherits: the in-process engine's client workers), ``ray``
(Ray's GCS, raylet and worker processes, which run the ClientApps with ``--engine ray``), and
``superlink`` / ``other``. Per role: the number of processes seen, the peak RSS of the
largest, and the peaks of the role's summed RSS and summed PSS over the samples.

Summed RSS counts pages shared between processes (shared libraries, and the pages forked
workers share copy-on-write with the simulation process) once per process, so it overstates
the machine's use. PSS (``/proc/<pid>/smaps_rollup``) splits each shared page among the
processes that map it, so summed PSS counts it once; USS (the Private_* lines) is the memory
a process alone holds.

Usage::

    python benchmarks/scale.py --clients 1000 3550 --rounds 3 [--fraction-evaluate 0.1]
    python benchmarks/scale.py --strategy fedavg --engines inprocess ray --clients 1000
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 2**20
#: PSS and USS are read at every PSS_EVERY th sample (every 2 s)
PSS_EVERY = 4
ROLES = ("cli", "simulation", "worker", "ray", "superlink", "other")


def _tree(root: int) -> tuple[list[int], dict[int, int]]:
    """The pids of ``root``'s tree (``root`` first) and each one's parent."""
    children: dict[int, list[int]] = {}
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
        parents[int(entry.name)] = ppid
    found, todo = [root], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found, parents


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return ""


def _rss(pid: int) -> int | None:
    """RSS of ``pid`` in bytes (``statm``: cheap), or None for a process that ended."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None


def _pss_uss(pid: int) -> tuple[int, int] | None:
    """PSS and USS of ``pid`` in bytes (``smaps_rollup``, about 20 ms for a process of 1 GB:
    the kernel walks its page tables), or None where unreadable."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    fields: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            fields[parts[0][:-1]] = int(parts[1]) * 1024
    if "Pss" not in fields:
        return None
    return fields["Pss"], fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)


def _role(cmdline: str, parent_cmdline: str, parent_role: str | None) -> str:
    if "pflarena.cli" in cmdline:
        return "cli"
    if "pflarena.runtime.simulation" in cmdline:
        # a forked worker inherits its parent's command line
        forked = cmdline == parent_cmdline and parent_role in ("simulation", "worker")
        return "worker" if forked else "simulation"
    if "superlink" in cmdline:
        return "superlink"
    if "ray" in cmdline.split(" ", 1)[0] or "ray::" in cmdline or "/ray/" in cmdline:
        return "ray"  # Ray's GCS, raylet, dashboard and worker processes (--engine ray)
    return "other"


class Sampler:
    """The peaks of a process tree's memory, in total, per process and per role."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.roles: dict[int, str] = {}
        self.cmdlines: dict[int, str] = {}
        self.peak_rss = self.peak_pss = self.peak_uss = 0
        self.proc_peak_rss: dict[int, int] = {}
        self.role_peak_rss = dict.fromkeys(ROLES, 0)
        self.role_peak_pss = dict.fromkeys(ROLES, 0)
        self.samples = 0

    def sample(self) -> None:
        """One sample: RSS every time, PSS and USS every :data:`PSS_EVERY` th (they cost a
        walk of each process's page tables)."""
        pids, parents = _tree(self.root)
        with_pss = self.samples % PSS_EVERY == 0
        total = [0, 0, 0]
        role_rss = dict.fromkeys(ROLES, 0)
        role_pss = dict.fromkeys(ROLES, 0)
        for pid in pids:  # parents before their children
            if pid not in self.roles:
                cmdline = _cmdline(pid)
                if not cmdline:
                    continue  # ended, or a zombie
                parent = parents.get(pid, 0)
                self.cmdlines[pid] = cmdline
                self.roles[pid] = _role(
                    cmdline, self.cmdlines.get(parent, ""), self.roles.get(parent)
                )
            rss = _rss(pid)
            if rss is None:
                continue
            role = self.roles[pid]
            total[0] += rss
            role_rss[role] += rss
            self.proc_peak_rss[pid] = max(self.proc_peak_rss.get(pid, 0), rss)
            if with_pss:
                pss, uss = _pss_uss(pid) or (rss, rss)
                total[1] += pss
                total[2] += uss
                role_pss[role] += pss
        self.peak_rss = max(self.peak_rss, total[0])
        self.peak_pss = max(self.peak_pss, total[1])
        self.peak_uss = max(self.peak_uss, total[2])
        for role in ROLES:
            self.role_peak_rss[role] = max(self.role_peak_rss[role], role_rss[role])
            self.role_peak_pss[role] = max(self.role_peak_pss[role], role_pss[role])
        self.samples += 1

    def by_role(self) -> dict[str, dict]:
        out = {}
        for role in ROLES:
            peaks = [p for pid, p in self.proc_peak_rss.items() if self.roles[pid] == role]
            if peaks:
                out[role] = {
                    "processes": len(peaks),
                    "largest_rss_mb": max(peaks) / MB,
                    "sum_rss_mb": self.role_peak_rss[role] / MB,
                    "sum_pss_mb": self.role_peak_pss[role] / MB,
                }
        return out


def disk_bytes(path: Path) -> int:
    """The bytes of ``path``: a file's size, or the files under a folder, a file hard-linked
    several times counted once (the client state's versions link the entries they carry
    forward); 0 where there is nothing."""
    if path.is_file():
        return path.stat().st_size
    seen, total = set(), 0
    for file in path.rglob("*"):
        if file.is_file():
            stat = file.stat()
            if stat.st_ino not in seen:  # hard links count once
                seen.add(stat.st_ino)
                total += stat.st_size
    return total


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_sampled(
    cmd: list[str], *, timeout: float | None = None, cwd: Path | None = None
) -> tuple[int | None, str, Sampler]:
    """Run ``cmd``, its process tree sampled every 0.5 s: its exit status (None where it ran
    past ``timeout`` seconds and was stopped), its output (stdout and stderr) and the
    sampler."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = Sampler(proc.pid)

    def sample() -> None:
        while proc.poll() is None:
            sampler.sample()
            time.sleep(0.5)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        output, _ = proc.communicate(timeout=timeout)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.terminate()  # pflarena run stops its simulation and writes what it has
        output, _ = proc.communicate()
        returncode = None
    thread.join()
    return returncode, output, sampler


def method_flags(method: str) -> list[str]:
    """The flags a run of ``method`` needs beside the common ones: one local epoch where its
    solver honours ``local-epochs`` (FedRep's own epochs replace it), a validation split
    where it needs one, a server share where it needs server-held data."""
    from pflarena.strategies import declarations

    declaration = declarations()[method]
    flags = []
    if "local-epochs" in declaration.honours:
        flags += ["--local-epochs", "1"]
    if declaration.needs_validation:
        flags += ["--validation-fraction", "0.2"]
    if declaration.needs_server_data:
        flags += ["--server-fraction", "0.1"]
    return flags


def _partition(dataset: str) -> str:
    """IID over the clients for a pooled data set; a natural one comes as its clients."""
    from pflarena.core.datasets import dataset_spec

    return "natural" if dataset_spec(dataset).kind == "natural" else "iid"


def _evaluate_fraction(num_clients: int, args: argparse.Namespace) -> float:
    """The run's fraction-evaluate: ``--fraction-evaluate``, or with ``--per-round`` and
    none given, the same share as the training sample's."""
    if args.fraction_evaluate is not None:
        return args.fraction_evaluate
    return _fraction(num_clients, args) if args.per_round else 1.0


def _fraction(num_clients: int, args: argparse.Namespace) -> float:
    """The run's fraction-train: ``--per-round`` clients of ``num_clients``, else ``--fraction``."""
    return args.per_round / num_clients if args.per_round else args.fraction


def measure(num_clients: int, engine: str, args: argparse.Namespace, workdir: Path) -> dict:
    out = workdir / f"{args.strategy}-{engine}-{num_clients}"
    fraction = _fraction(num_clients, args)
    cmd = [
        sys.executable, "-m", "pflarena.cli", "run", "--engine", engine,
        "--strategy", args.strategy, "--dataset", args.dataset, "--data-dir", args.data_dir,
        "--model", args.model, "--partition", _partition(args.dataset),
        "--num-clients", str(num_clients),
        "--fraction-train", str(fraction), "--num-rounds", str(args.rounds),
        "--eval-every", str(args.eval_every), "--local-epochs", "1", "--batch-size", "32",
        "--lr", "0.05", "--fraction-evaluate", str(_evaluate_fraction(num_clients, args)),
        "--initial-evaluation", args.initial_evaluation,
        "--final-evaluation", args.final_evaluation,
        "--output-dir", str(out), "--quiet",
    ]  # fmt: skip
    load_start = _load()
    start = time.monotonic()
    returncode, output, sampler = run_sampled(cmd)
    wall = time.monotonic() - start
    if returncode != 0:
        raise RuntimeError(
            f"run with {num_clients} clients failed (exit {returncode}):\n{output[-3000:]}"
        )
    rounds = read_rounds(out / "rounds.jsonl")
    timed = [r["train_time_s"] for r in rounds if r["round"] >= 2]
    evaluations = [r["evaluation"] for r in rounds if r.get("evaluation")]
    return {
        "clients": num_clients,
        "engine": engine,
        "per_round": int(num_clients * fraction),
        "fraction_evaluate": _evaluate_fraction(num_clients, args),
        "evaluated": sum(len(e["per_client"]) for e in evaluations),
        "peak_rss_mb": sampler.peak_rss / MB,
        "peak_pss_mb": sampler.peak_pss / MB,
        "peak_uss_mb": sampler.peak_uss / MB,
        "roles": sampler.by_role(),
        "samples": sampler.samples,
        "round_s": statistics.mean(timed) if timed else float("nan"),
        "wall_s": wall,
        "state_mb": disk_bytes(out / "client-state") / MB,
        "accuracy": rounds[-1]["evaluation"]["personalized"]["mean"],
        "load_start": load_start,
        "load_end": _load(),
    }


def _command() -> str:
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(ROOT)
    return shlex.join([str(python), "benchmarks/scale.py", *sys.argv[1:]])


def _commit() -> str:
    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", *argv], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--", "benchmarks/scale.py"):
        commit += " (benchmarks/scale.py modified)"
    return commit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    parser.add_argument(
        "--strategy",
        default="ditto",
        help="the method run (ditto: a personal model per client; fedavg: stateless)",
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=("inprocess", "ray"),
        default=["inprocess"],
        help="the simulation engines measured side by side at each size (ray: Flower's Ray "
        "backend, as Flower's own simulation runs ClientApps)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument(
        "--per-round",
        type=int,
        default=0,
        help="clients sampled a round at every N (fraction-train per-round/N) instead of "
        "--fraction: memory against the federation's size at the same work",
    )
    parser.add_argument(
        "--initial-evaluation",
        choices=("all", "sample"),
        default="all",
        help="the run's --initial-evaluation (sample: round 0 tests a fraction-evaluate sample)",
    )
    parser.add_argument(
        "--final-evaluation",
        choices=("all", "sample"),
        default="all",
        help="the run's --final-evaluation (sample: the last round tests a fraction-evaluate "
        "sample too)",
    )
    parser.add_argument(
        "--fraction-evaluate",
        type=float,
        default=None,
        help="the run's --fraction-evaluate: the share of the clients a sampled evaluation "
        "tests (default: the training sample's share with --per-round, else 1)",
    )
    parser.add_argument(
        "--dataset",
        default="mnist",
        help="the data set (mnist, IID over the clients; synthetic-on-demand: each client "
        "drawn alone, for virtual federations of up to 100,000 clients)",
    )
    parser.add_argument("--model", default="cnn", help="the model (cnn; logreg for synthetic)")
    parser.add_argument(
        "--eval-every",
        type=int,
        default=100000,
        help="the run's --eval-every (default: no evaluation between round 0 and the last)",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.md"))
    args = parser.parse_args()
    command, commit = _command(), _commit()
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    with tempfile.TemporaryDirectory(prefix="pflarena-scale-") as tmp:
        results = []
        for n in args.clients:
            for engine in args.engines:
                print(f"== {n} clients, {engine} (load average {_load()})", flush=True)
                results.append(measure(n, engine, args, Path(tmp)))
                print(json.dumps(results[-1]), flush=True)
    base = results[0]
    lines = [
        "# Scale: memory and round time against the number of simulated clients",
        "",
        f"Command (from the repository's root): `{command}`; commit `{commit}`, {date}; "
        f"{os.cpu_count()} CPU cores ({platform.machine()}), Python {platform.python_version()}, "
        f"engines: {', '.join(args.engines)} (inprocess: pflarena's default, forked workers, no "
        "Ray; ray: Flower's Ray backend, which Flower's own simulation uses). The host is shared "
        "with other work, so times are "
        "noisy: the load average (1, 5, 15 min) at each run's start and end is in the table.",
        "",
        f"{args.strategy}, "
        + (
            "FedAvg CNN, MNIST (70,000 images) IID over N clients, "
            if (args.dataset, args.model) == ("mnist", "cnn")
            else f"{args.model} on {args.dataset} ({_partition(args.dataset)} partition), "
        )
        + (f"{args.per_round} clients" if args.per_round else f"{args.fraction:.0%}")
        + f" per round, 1 local epoch, {args.rounds} rounds; "
        + ("every client" if args.initial_evaluation == "all" else "a sample")
        + " evaluated before round 1, "
        + ("every client" if args.final_evaluation == "all" else "a sample")
        + " after the last"
        + (
            f", evaluations every {args.eval_every} rounds in between"
            if args.eval_every < args.rounds
            else ""
        )
        + "; fraction-evaluate "
        + (
            f"{args.fraction_evaluate:g}"
            if args.fraction_evaluate is not None
            else "the training sample's share"
        )
        + ". Peak RSS / PSS / USS: the peak over "
        "samples (RSS every 0.5 s, PSS and USS every 2 s) of the sum over the run's whole "
        "process tree (RSS counts pages shared "
        "between processes once per process, PSS splits them among the processes, USS is "
        "memory private to each process). Round: mean wall time of rounds 2 and later.",
        "",
        "| clients | engine | per round | fraction-evaluate | clients evaluated | peak RSS (MB) "
        "| vs first | peak PSS (MB) | peak USS (MB) | round (s) | client state on disk (MB) "
        "| wall (s) | personalized acc | load start | load end |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['clients']} | {r['engine']} | {r['per_round']} | {r['fraction_evaluate']:g} "
            f"| {r['evaluated']} | {r['peak_rss_mb']:.0f} "
            f"| {r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x | {r['peak_pss_mb']:.0f} "
            f"| {r['peak_uss_mb']:.0f} | {r['round_s']:.1f} "
            f"| {r['state_mb']:.1f} | {r['wall_s']:.0f} | {100 * r['accuracy']:.2f} "
            f"| {r['load_start']} | {r['load_end']} |"
        )
    lines += [
        "",
        "Per process role (`cli`: the `pflarena run` process; `simulation`: the process "
        "running the ServerApp; `worker`: client worker processes forked from it). Largest: "
        "the peak RSS of the role's largest process; summed: the peak over the samples of the "
        "role's summed RSS / PSS.",
        "",
        "| clients | engine | role | processes | largest peak RSS (MB) | summed peak RSS (MB) "
        "| summed peak PSS (MB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for role, row in r["roles"].items():
            lines.append(
                f"| {r['clients']} | {r['engine']} | {role} | {row['processes']} "
                f"| {row['largest_rss_mb']:.0f} "
                f"| {row['sum_rss_mb']:.0f} | {row['sum_pss_mb']:.0f} |"
            )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
