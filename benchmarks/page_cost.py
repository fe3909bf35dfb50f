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

from pflarena.core.ddpg import DDPGAgent, DDPGConfig, derive_seed
from pflarena.core.federation import load_client
from pflarena.core.models import build_model
from pflarena.core.training import evaluate, train_epochs
from pflarena.core.versions import DiskVersions
from pflarena.server.cli import simulate
from pflarena.server.presets import load_preset
from pflarena.server.registry import parse_config
from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
PRESET = "page-synthetic"
#: run label -> (engine, extra environment)
RUNS = {
    "ray": ("ray", {}),
    "ray, no agent in memory": ("ray", {"PFLARENA_AGENT_CACHE_SIZE": "0"}),
    "in-process": ("inprocess", {}),
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
    agent = DDPGAgent(config, seed=derive_seed(0, 0, "page-client"))
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
    rng = np.random.default_rng(1)
    folder = Path(tempfile.mkdtemp(prefix="page-cost-"))
    stores = {"packed": DiskVersions(folder / "packed"), "67 arrays": DiskVersions(folder / "old")}
    version = {"n": 0}

    def sgd(epochs: int) -> float:  # the training only, not the model's copy
        model = copy.deepcopy(template)
        started = time.perf_counter()
        generator = torch.Generator().manual_seed(0)
        train_epochs(model, x, y, epochs=epochs, batch_size=32, lr=0.05, generator=generator)
        return time.perf_counter() - started

    def write(form: str):
        arrays = agent.to_packed() if form == "packed" else agent.to_arrays()
        version["n"] += 1
        stores[form].write(version["n"], None, {"page/agent": _record(arrays)})
        return version["n"]

    def rebuild(form: str):
        n = write(form)
        DiskVersions._cache.clear()  # a miss: the file is read
        started = time.perf_counter()
        record = stores[form].read(n, "page/agent")
        DDPGAgent.from_arrays({k: record[k].numpy() for k in record.keys()}, agent.config)
        return time.perf_counter() - started

    tasks = {
        "SGD, 1 epoch": lambda: sgd(1),
        "SGD, 3 epochs": lambda: sgd(3),
        "state s_i (evaluate W(t) on the training split)": lambda: evaluate(template, x, y),
        "reward (evaluate ŵ_i(t) on the training split)": lambda: evaluate(template, x, y),
        "DDPG update + action": lambda: (agent.update(rng), agent.act([0.5], rng)),
        "pack into an ArrayRecord (packed)": lambda: _record(agent.to_packed()),
        "pack into an ArrayRecord (67 arrays)": lambda: _record(agent.to_arrays()),
        "write to the store, fsync'd (packed)": lambda: write("packed"),
        "write to the store, fsync'd (67 arrays)": lambda: write("67 arrays"),
    }
    timed = {name: [] for name in tasks}
    timed |= {"read and rebuild (packed)": [], "read and rebuild (67 arrays)": []}
    try:
        for _ in range(reps):
            for name, task in tasks.items():
                started = time.perf_counter()
                result = task()
                elapsed = time.perf_counter() - started
                timed[name].append(result if isinstance(result, float) else elapsed)
            timed["read and rebuild (packed)"].append(rebuild("packed"))
            timed["read and rebuild (67 arrays)"].append(rebuild("67 arrays"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {name: 1000 * statistics.median(values) for name, values in timed.items()}


def run(label: str, rounds: int, runs_dir: Path, clients: int) -> Path:
    engine, env = RUNS[label]
    out = runs_dir / label.replace(", ", "-").replace(" ", "-")
    shutil.rmtree(out, ignore_errors=True)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        simulate(
            parse_config(preset_config(rounds, out)),
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
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/page_cost.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    ms = parts(args.reps)
    runs_dir = Path(args.runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    costs = {}
    for label in RUNS:
        print(f"== {label}", flush=True)
        costs[label] = round_costs(run(label, args.rounds, runs_dir, args.clients))
    write_report(Path(args.out), ms, costs, args)


def write_report(path: Path, ms: dict[str, float], costs: dict, args) -> None:
    lines = [
        "# PAGE: the RL's cost per round against the clients' local SGD",
        "",
        "`python benchmarks/page_cost.py "
        f"--rounds {args.rounds} --reps {args.reps} --clients {args.clients}` (under `nice -n 10`), on the shared 2-core "
        "machine while other work ran: absolute times are loaded ones; compare the ratios, "
        "which each come from one run (part 2) or from interleaved repetitions (part 1).",
        "",
        f"## 1. One client message, part by part (client 0 of `{PRESET}`, median ms of {args.reps})",
        "",
        "| part | ms |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value:.2f} |" for name, value in ms.items()]
    kept = (
        ms["state s_i (evaluate W(t) on the training split)"]
        + ms["reward (evaluate ŵ_i(t) on the training split)"]
        + ms["DDPG update + action"]
        + ms["pack into an ArrayRecord (packed)"]
        + ms["write to the store, fsync'd (packed)"]
    )
    rebuilt = kept + ms["read and rebuild (packed)"]
    old = (
        kept
        - ms["pack into an ArrayRecord (packed)"]
        - ms["write to the store, fsync'd (packed)"]
        + ms["pack into an ArrayRecord (67 arrays)"]
        + ms["write to the store, fsync'd (67 arrays)"]
        + ms["read and rebuild (67 arrays)"]
    )
    sgd3 = ms["SGD, 3 epochs"]
    lines += [
        "",
        "A message's agent work, summed from these parts, against 3 epochs of SGD "
        f"({sgd3:.2f} ms): agent in memory {kept:.2f} ms ({kept / sgd3:.2f}x); rebuilt from the "
        f"packed state {rebuilt:.2f} ms ({rebuilt / sgd3:.2f}x); rebuilt from 67 arrays, as "
        f"before {old:.2f} ms ({old / sgd3:.2f}x).",
        "",
        f"## 2. Runs: `{PRESET}` with {args.clients} clients, {args.rounds} rounds; "
        f"per round of rounds 3-{args.rounds}",
        "",
        "| run | client agent time per round (s) | client SGD per round (s) | agent / SGD | "
        f"agents in memory per round (of {args.clients}) | server RL per round (s) | server RL / SGD | "
        "mean α |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, c in costs.items():
        lines.append(
            f"| {label} | {c['agent_s']:.2f} | {c['sgd_s']:.2f} | **{c['ratio']:.2f}** | "
            f"{c['in_memory']:.0f} | {c['server_s']:.2f} | {c['server_ratio']:.2f} | "
            f"{c['epochs']:.2f} |"
        )
    lines += [
        "",
        "The client agent time is everything a client's agent costs it (`page-agent-time-s`: "
        "the state s_i(t), loading the agent, its update and action, the reward's "
        "evaluation, packing it and the fsync'd write to the client's state); the SGD is the "
        "client's α_i epochs at η_i. The server's RL is its evaluation of the N uploads on "
        "its 7,500 samples (the state), its agent's step and the reward's evaluation.",
        "",
    ]
    path.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
