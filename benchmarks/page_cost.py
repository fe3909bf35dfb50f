"""What PAGE's client agents cost per round, against the clients' local SGD.

Two parts, both in one run of this script (ratios are only comparable within one run):

1. **Where a client's agent time goes** (one process, the parts interleaved, medians of
   ``--reps``): on client 0 of ``page-synthetic`` (210 training samples, logistic
   regression, 30 features and classes), the state s_i(t) and the reward's evaluation, the
   DDPG update and action, packing the agent into an ArrayRecord, writing it to a versioned
   store (fsync included), and rebuilding it from the stored file; the stored form as it is
   now (packed, one array per dtype) and as it was (67 arrays); against one and three
   epochs of the client's SGD (α ∈ {1..5}; the untrained actors play the middle, 3).
2. **Runs**: ``page-synthetic`` (100 clients, full participation) for ``--rounds`` rounds on
   the Ray engine (two ClientApp processes on this machine: a client's next message lands
   on either, so about half its agents are in that process's memory), the same with the
   agents never kept in memory (``PFLARENA_AGENT_CACHE_SIZE=0``: every message rebuilds its
   agent from the stored state, what the code did before), and on the in-process engine
   (one process: every agent in memory after its first round). Per round after the second
   (round 1 is the random warm-up, round 2 the first update): the clients' summed agent
   time (``page-agent-time-s``: the state, loading, update, action, reward, packing and the
   fsync'd write) over their summed local SGD time, and the server's RL work (evaluating
   the N uploads on D_CS, its agent, its reward) over the same SGD time.

Usage::

    nice -n 10 python benchmarks/page_cost.py               # both parts, 8 rounds
    python benchmarks/page_cost.py --rounds 4 --reps 20
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from pflarena.algorithms.ddpg import DDPGAgent, DDPGConfig
from pflarena.core.federation import load_client
from pflarena.core.models import build_model
from pflarena.core.presets import load_preset
from pflarena.core.seeds import AGENT_SEED_BITS, derive_seed
from pflarena.core.training import evaluate, train_epochs
from pflarena.core.versions import DiskVersions
from pflarena.runtime.launch import simulate
from pflarena.server.build import parse_config
from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
PRESET = "page-synthetic"
#: run label -> (engine, extra environment)
RUNS = {
    "ray": ("ray", {}),
    "ray, no agent in memory": ("ray", {"PFLARENA_AGENT_CACHE_SIZE": "0"}),
    "in-process": ("inprocess", {}),
    # the agents' update and actions with autograd and torch's optimizers (before)
    "in-process, torch engine": ("inprocess", {"PFLARENA_DDPG_ENGINE": "torch"}),
}


def preset_config(rounds: int, out: Path, clients: int = 100) -> dict:
    config = load_preset(PRESET).overrides("page")
    return config | {
        "strategy": "page",
        "num-clients": clients,
        "num-rounds": rounds,
        "eval-every": rounds,
        "output-dir": str(out),
    }


def client_agent(steps: int) -> DDPGAgent:
    """A client agent of the preset's settings after ``steps`` rounds (buffer, Adam state)."""
    page = {
        k.split(".", 1)[1]: v
        for k, v in load_preset(PRESET).overrides("page").items()
        if k.startswith("page.")
    }
    config = DDPGConfig(
        state_dim=1,
        action_dim=2,
        low=(1.0, math.log(1e-3)),
        high=(5.0, math.log(0.1)),
        critic_lr=float(page.get("critic-lr", 0.01)),
        actor_lr=float(page.get("actor-lr", 0.001)),
        tau=float(page.get("tau", 0.01)),
    )
    agent = DDPGAgent(config, seed=derive_seed(0, 0, "page-client", bits=AGENT_SEED_BITS))
    rng = np.random.default_rng(0)
    for _ in range(steps):
        state = rng.uniform(size=1)
        agent.complete(state)
        agent.update(rng)
        agent.set_pending(state, agent.act(state, rng), float(rng.uniform(1, 3)))
    return agent


def _record(arrays: dict) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def parts(reps: int) -> dict[str, float]:
    """Median milliseconds of each part of a client's message (see the module docstring)."""
    cfg = parse_config(preset_config(1, Path(tempfile.gettempdir())))
    data, info = load_client(cfg.federation_spec(), 0)
    x = torch.as_tensor(data.x_train, dtype=torch.float32)
    y = torch.as_tensor(data.y_train, dtype=torch.long)
    template = build_model(cfg.model_name(), tuple(info.input_shape), info.num_classes, seed=0)
    agent = client_agent(100)
    torch_agent = client_agent(100)
    torch_agent.engine = "torch"
    rng = np.random.default_rng(1)
    folder = Path(tempfile.mkdtemp(prefix="page-cost-"))
    stores = {
        "packed": DiskVersions(folder / "packed", durable=False),
        "packed, fsync'd": DiskVersions(folder / "packed-fsync"),
        "67 arrays, fsync'd": DiskVersions(folder / "old"),
    }
    version = {"n": 0}

    clock = {"wall": time.perf_counter, "cpu": time.thread_time}

    def sgd(epochs: int) -> dict[str, float]:  # the training only, not the model's copy
        model = copy.deepcopy(template)
        started = {k: f() for k, f in clock.items()}
        generator = torch.Generator().manual_seed(0)
        train_epochs(model, x, y, epochs=epochs, batch_size=32, lr=0.05, generator=generator)
        return {k: f() - started[k] for k, f in clock.items()}

    def write(form: str) -> int:
        arrays = agent.to_packed() if form.startswith("packed") else agent.to_arrays()
        version["n"] += 1
        stores[form].write(version["n"], None, {"page/agent": _record(arrays)})
        return version["n"]

    def rebuild(form: str) -> dict[str, float]:
        n = write(form)
        DiskVersions._cache.clear()  # a miss: the file is read
        started = {k: f() for k, f in clock.items()}
        record = stores[form].read(n, "page/agent")
        DDPGAgent.from_arrays({k: record[k].numpy() for k in record.keys()}, agent.config)
        return {k: f() - started[k] for k, f in clock.items()}

    tasks = {
        "SGD, 1 epoch": lambda: sgd(1),
        "SGD, 3 epochs": lambda: sgd(3),
        "state s_i (evaluate W(t) on the training split)": lambda: evaluate(template, x, y),
        "reward (evaluate ŵ_i(t) on the training split)": lambda: evaluate(template, x, y),
        "DDPG update + action": lambda: (agent.update(rng), agent.act([0.5], rng)),
        "DDPG update + action (torch engine, before)": lambda: (
            torch_agent.update(rng),
            torch_agent.act([0.5], rng),
        ),
        "pack into an ArrayRecord (packed)": lambda: _record(agent.to_packed()),
        "pack into an ArrayRecord (67 arrays)": lambda: _record(agent.to_arrays()),
        "write to the store (packed, no fsync: a simulated client)": lambda: write("packed"),
        "write to the store (packed, fsync'd)": lambda: write("packed, fsync'd"),
        "write to the store (67 arrays, fsync'd)": lambda: write("67 arrays, fsync'd"),
        "read and rebuild (packed)": lambda: rebuild("packed"),
        "read and rebuild (67 arrays)": lambda: rebuild("67 arrays, fsync'd"),
    }
    timed = {(name, k): [] for name in tasks for k in clock}
    try:
        for _ in range(reps):
            for name, task in tasks.items():
                started = {k: f() for k, f in clock.items()}
                result = task()
                for k, f in clock.items():
                    spent = result[k] if isinstance(result, dict) else f() - started[k]
                    timed[name, k].append(spent)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {key: 1000 * statistics.median(values) for key, values in timed.items()}


def run(label: str, rounds: int, runs_dir: Path, clients: int) -> Path:
    engine, env = RUNS[label]
    out = runs_dir / label.replace(", ", "-").replace(" ", "-")
    shutil.rmtree(out, ignore_errors=True)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        simulate(
            parse_config(preset_config(rounds, out, clients)),
            engine=engine,
            verbosity=0,
            log_file=runs_dir / f"{out.name}.log",
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def round_costs(out: Path) -> dict[str, float]:
    rows = [
        r["train"]["server"]
        for r in read_rounds(out / "rounds.jsonl")
        if r.get("round", 0) > 2 and "train" in r
    ]
    agent = sum(r["client-agent-time-s"] for r in rows)
    agent_cpu = sum(r["client-agent-cpu-time-s"] for r in rows)
    sgd_cpu = sum(r["client-sgd-cpu-time-s"] for r in rows)
    sgd = sum(r["client-sgd-time-s"] for r in rows)
    server = sum(
        r["server-state-time-s"] + r["server-agent-time-s"] + r["server-reward-time-s"]
        for r in rows
    )
    return {
        "rounds": len(rows),
        "agent_s": agent / len(rows),
        "sgd_s": sgd / len(rows),
        "ratio": agent / sgd,
        "cpu_ratio": agent_cpu / sgd_cpu,
        "agent_cpu_s": agent_cpu / len(rows),
        "sgd_cpu_s": sgd_cpu / len(rows),
        "server_s": server / len(rows),
        "server_ratio": server / sgd,
        "in_memory": sum(r.get("client-agents-in-memory", 0) for r in rows) / len(rows),
        "epochs": statistics.mean(r["mean-epochs"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument(
        "--clients", type=int, default=100, help="the preset's clients (fewer: shorter runs)"
    )
    parser.add_argument("--runs-dir", default="runs/page-cost")
    parser.add_argument(
        "--runs", nargs="*", default=list(RUNS), choices=list(RUNS), help="part 2's runs"
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/page_cost.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    ms = parts(args.reps)
    runs_dir = Path(args.runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    costs = {}
    for label in args.runs:
        print(f"== {label}", flush=True)
        costs[label] = round_costs(run(label, args.rounds, runs_dir, args.clients))
    write_report(Path(args.out), ms, costs, args)


def write_report(path: Path, ms: dict[str, float], costs: dict, args) -> None:
    lines = [
        "# PAGE: the RL's cost per round against the clients' local SGD",
        "",
        "`python benchmarks/page_cost.py "
        f"--rounds {args.rounds} --reps {args.reps} --clients {args.clients} --runs "
        + " ".join(f"'{label}'" for label in args.runs)
        + "` (under `nice`), on the shared 2-core "
        "machine while other work ran: absolute times are loaded ones; compare the ratios, "
        "which each come from one run (part 2) or from interleaved repetitions (part 1).",
        "",
        f"## 1. One client message, part by part (client 0 of `{PRESET}`, median ms of {args.reps})",
        "",
        "| part | wall ms | CPU ms (the thread's) |",
        "|---|---|---|",
    ]
    names = list(dict.fromkeys(name for name, _ in ms))
    lines += [f"| {n} | {ms[n, 'wall']:.2f} | {ms[n, 'cpu']:.2f} |" for n in names]

    def total(parts: list[str], clock: str) -> float:
        return sum(ms[p, clock] for p in parts)

    common = [
        "state s_i (evaluate W(t) on the training split)",
        "reward (evaluate ŵ_i(t) on the training split)",
        "DDPG update + action",
    ]
    kept = [*common, "pack into an ArrayRecord (packed)",
            "write to the store (packed, no fsync: a simulated client)"]  # fmt: skip
    kept_torch = [p.replace("DDPG update + action", "DDPG update + action (torch engine, "
                            "before)") for p in kept]  # fmt: skip
    rebuilt = [*kept, "read and rebuild (packed)"]
    old = [*common, "pack into an ArrayRecord (67 arrays)",
           "write to the store (67 arrays, fsync'd)", "read and rebuild (67 arrays)"]  # fmt: skip
    lines += ["", "A message's agent work summed from these parts, against 3 epochs of SGD:", ""]
    lines += ["| agent | wall ms | / SGD | CPU ms | / SGD |", "|---|---|---|---|---|"]
    for label, parts in (
        ("kept in memory, written without fsync (a simulated client now)", kept),
        ("the same, torch engine (before)", kept_torch),
        ("rebuilt from the packed state (a miss)", rebuilt),
        ("rebuilt from 67 arrays and written fsync'd (before)", old),
    ):
        wall, cpu = total(parts, "wall"), total(parts, "cpu")
        lines.append(
            f"| {label} | {wall:.2f} | {wall / ms['SGD, 3 epochs', 'wall']:.2f}x | {cpu:.2f} | "
            f"{cpu / ms['SGD, 3 epochs', 'cpu']:.2f}x |"
        )
    lines += [
        "",
        f"## 2. Runs: `{PRESET}` with {args.clients} clients, {args.rounds} rounds; "
        f"per round of rounds 3-{args.rounds}",
        "",
        "| run | client agent, wall s | client SGD, wall s | agent / SGD, wall | "
        "client agent, CPU s | client SGD, CPU s | agent / SGD, CPU | "
        f"agents in memory (of {args.clients}) | server RL, wall s | server RL / client SGD | "
        "mean α |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, c in costs.items():
        lines.append(
            f"| {label} | {c['agent_s']:.2f} | {c['sgd_s']:.2f} | {c['ratio']:.2f} | "
            f"{c['agent_cpu_s']:.2f} | {c['sgd_cpu_s']:.2f} | **{c['cpu_ratio']:.2f}** | "
            f"{c['in_memory']:.0f} | {c['server_s']:.2f} | {c['server_ratio']:.2f} | "
            f"{c['epochs']:.2f} |"
        )
    lines += [
        "",
        "Per round (summed over the clients), mean of the rounds. The client agent time is "
        "everything a client's agent costs it (`page-agent-time-s` / `page-agent-cpu-s`: the "
        "state s_i(t), loading the agent, its update and action, the reward's evaluation, "
        "packing it and writing it to the client's state); the SGD is the client's α_i "
        "epochs at η_i. CPU: the client thread's CPU time, which the machine's other work "
        "does not inflate (wall times here are several times the CPU times: the machine's "
        "load average was far above its 2 cores). The server's RL is its evaluation of the "
        "N uploads on its 7,500 samples (the state), its agent's step and the reward's "
        "evaluation.",
        "",
    ]
    path.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
