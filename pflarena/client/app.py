"""The pflarena ClientApp.

Every train or evaluate message goes through the same steps: parse the run config, load
this node's data (its shard, or its simulated partition), restore the method's state from
``context.state``, dispatch to the method's local solver, and reply.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from pflarena.client.job import ClientJob, load_node_data, pick_device
from pflarena.client.solvers import Solver, load_solver
from pflarena.core import keys
from pflarena.core.config import RunConfig, parse_run_config

__all__ = ["app"]

app = ClientApp()


@lru_cache(maxsize=8)
def _parse(items: tuple) -> RunConfig:
    return parse_run_config(dict(items))


def _limit_threads() -> None:
    # A simulation runs several ClientApps side by side, one CPU each; torch's default of
    # one thread per core would oversubscribe the machine.
    threads = os.environ.get("PFLARENA_TORCH_THREADS")
    if threads:
        torch.set_num_threads(int(threads))


def _job(msg: Message, context: Context) -> tuple[ClientJob, Solver]:
    _limit_threads()
    cfg = _parse(tuple(sorted(context.run_config.items())))
    config = msg.content.config_records.get(keys.CONFIG, ConfigRecord())
    method = str(config.get(keys.METHOD, cfg.strategy))
    default_solver = "pflarena.client.solvers." + method.replace("-", "_")
    solver = load_solver(str(config.get(keys.SOLVER, default_solver)))
    device = pick_device(cfg.device)
    job = ClientJob(
        cfg=cfg,
        data=load_node_data(cfg, dict(context.node_config), device),
        state=context.state,
        content=msg.content,
        device=device,
    )
    return job, solver


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run the method's local solver and reply with its update and metrics."""
    job, solver = _job(msg, context)
    start = time.perf_counter()
    records, metrics = solver.train(job)
    metrics[keys.TRAIN_TIME] = time.perf_counter() - start
    return Message(
        content=RecordDict({**records, keys.METRICS: MetricRecord(metrics)}), reply_to=msg
    )


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate this client's personalized model (and the global one, if any)."""
    job, solver = _job(msg, context)
    metrics = solver.evaluate(job)
    return Message(content=RecordDict({keys.METRICS: MetricRecord(metrics)}), reply_to=msg)
