"""The pflarena ClientApp.

Every train or evaluate message goes through the same steps: parse the run config, load
this node's data (its shard, or its simulated partition), open the method's state at the
version the server last accepted (:mod:`pflarena.client.state`), dispatch to the method's
local solver, save what it changed as a new version, and reply. A message whose arrays came
packed (a deployment: :mod:`pflarena.core.packing`) is unpacked first and its reply packed.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from pflarena.client.job import ClientJob, load_node_data, pick_device
from pflarena.client.solvers import Solver, SolverError, load_solver
from pflarena.client.state import ClientState, DiskVersions, MemoryVersions, run_key
from pflarena.core import keys
from pflarena.core.array_decoding import state_record
from pflarena.core.config import RunConfig, parse_run_config
from pflarena.core.packing import is_packed, pack_content, unpack_content

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


def open_state(
    cfg: RunConfig, context: Context, msg: Message, client_id: int, *, train: bool
) -> ClientState:
    """This client's state for ``msg``, at the version the server last accepted.

    On disk under the node's ``state-dir``, or (a simulated node) under the run's output
    directory; else in ``context.state``. A message without the loop's sync record (Flower's
    own ``Strategy.start``) keeps every write.
    """
    node_config = dict(context.node_config)
    root = node_config.get("state-dir")
    durable = True
    if not root and cfg.output_dir and "data-path" not in node_config:
        # a simulated client: the server syncs this file system before each checkpoint
        root = str(Path(cfg.output_dir) / "client-state")
        durable = False
    sync = msg.content.config_records.get(keys.SYNC)
    key = str(sync[keys.STATE_KEY]) if sync is not None and keys.STATE_KEY in sync else ""
    if not key.isalnum():  # not given (or not a plain name): the run config's hash
        key = run_key(context.run_config)
    store = (
        DiskVersions(
            Path(str(root)) / key / f"client-{client_id}",
            durable=durable,
            direct=cfg.state_io == "direct",
        )
        if root
        else MemoryVersions(context.state)
    )
    if sync is None:  # no sync: the newest version is current, a train message adds one
        newest = max(store.versions(), default=0)
        return ClientState(store, None, newest + 1 if train else None)
    accepted = int(sync[keys.ACCEPTED]) if keys.ACCEPTED in sync else None
    update_id = int(sync[keys.UPDATE_ID]) if train and keys.UPDATE_ID in sync else None
    holds = int(sync[keys.HOLDS]) if keys.HOLDS in sync else None
    checkpointed = int(sync[keys.CHECKPOINTED]) if keys.CHECKPOINTED in sync else None
    return ClientState(store, accepted, update_id, holds=holds, checkpointed=checkpointed)


def _state_metrics(state: ClientState) -> dict[str, int]:
    """What a reply says about this client's state: ``state-missing`` when the version the
    server says it holds is gone or unreadable (the server then does not use the reply)."""
    code = state.problem_code
    return {keys.STATE_MISSING: code} if code else {}


def _job(msg: Message, context: Context, *, train: bool) -> tuple[ClientJob, Solver, float]:
    _limit_threads()
    cfg = _parse(tuple(sorted(context.run_config.items())))
    config = msg.content.config_records.get(keys.CONFIG, ConfigRecord())
    method = str(config.get(keys.METHOD, cfg.strategy))
    default_solver = "pflarena.client.solvers." + method.replace("-", "_")
    solver = load_solver(str(config.get(keys.SOLVER, default_solver)))
    device = pick_device(cfg.device)
    begin = time.perf_counter()
    data = load_node_data(cfg, dict(context.node_config), device)
    data_s = time.perf_counter() - begin
    job = ClientJob(
        cfg=cfg,
        data=data,
        state=open_state(cfg, context, msg, data.client_id, train=train),
        content=msg.content,
        device=device,
    )
    # Stochastic layers (dropout) draw from torch's global RNG; seeding it per message makes
    # a client's result independent of which process ran it and what that process ran before.
    kind = "train" if train else "evaluate"
    seed_torch(job.seed(f"torch/{kind}/{job.phase}"), device)
    return job, solver, data_s


def seed_torch(seed: int, device: torch.device) -> None:
    """``torch.manual_seed(seed)`` for what a client on ``device`` draws from: the CPU's
    generator, and on an accelerator all of torch's. ``torch.manual_seed`` also queues the
    seed for accelerators that are not there, one of which (MTIA) formats the call's stack
    each time: 0.3 to 1 ms a message, for nothing on the CPU."""
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


Handler = Callable[[Message, Context], Message]


def _packed_like_the_message(handler: Handler) -> Handler:
    """``handler`` on the message's arrays unpacked, its reply's packed, when the message's
    came packed (the ServerApp packs on a deployment; a simulation does not)."""

    @functools.wraps(handler)
    def wrapper(msg: Message, context: Context) -> Message:
        if not is_packed(msg.content):
            return handler(msg, context)
        msg.content = unpack_content(msg.content)
        reply = handler(msg, context)
        if reply.has_content():
            reply.content = pack_content(reply.content)
        return reply

    return wrapper


@app.train()
@_packed_like_the_message
def train(msg: Message, context: Context) -> Message:
    """Run the method's local solver and reply with its update and metrics."""
    job, solver, data_s = _job(msg, context, train=True)
    start, start_cpu = time.perf_counter(), time.process_time()
    records, metrics = _train_and_save(job, solver)
    metrics[keys.TRAIN_TIME] = time.perf_counter() - start
    metrics[keys.TRAIN_CPU] = time.process_time() - start_cpu
    metrics[keys.STATE_VERSION] = job.state.version
    metrics[keys.DATA_TIME] = data_s
    metrics |= _state_metrics(job.state)
    return Message(
        content=RecordDict({**records, keys.METRICS: MetricRecord(metrics)}), reply_to=msg
    )


def _train_and_save(job: ClientJob, solver: Solver) -> tuple[dict[str, ArrayRecord], dict]:
    """The solver's update, its state saved before the reply (which the server may accept
    at once); what a failed solver or save left half written is removed."""
    try:
        records, metrics = solver.train(job)
        job.state.save()
    finally:
        job.state.discard()
    return records, metrics


@app.evaluate()
@_packed_like_the_message
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate this client's personalized model (and the global one, if any); or, in a
    cross-evaluation, export it or test other clients' models (:func:`cross_evaluate`)."""
    job, solver, data_s = _job(msg, context, train=False)
    if job.phase in (keys.PHASE_CROSS_EXPORT, keys.PHASE_CROSS_SCORE):
        records, metrics = cross_evaluate(job, solver)
    else:
        records, metrics = {}, solver.evaluate(job)
    metrics[keys.DATA_TIME] = data_s
    metrics |= _state_metrics(job.state)
    return Message(
        content=RecordDict({**records, keys.METRICS: MetricRecord(metrics)}), reply_to=msg
    )


def cross_evaluate(job: ClientJob, solver: Solver) -> tuple[dict[str, ArrayRecord], dict]:
    """The two exchanges of a cross-evaluation (``server/crosseval.py``).

    ``cross-export``: reply with this client's personalized model (the solver's
    ``personalized_model``). ``cross-score``: test each model the message carries
    (``cross/<owner>``) on this client's test split and reply with the counts per owner.
    Neither changes the client's state.
    """
    if job.phase == keys.PHASE_CROSS_EXPORT:
        if solver.personalized_model is None:
            raise SolverError(
                f"method {job.method!r} has no personalized_model(job) in its solver: its "
                "personalized models cannot be cross-evaluated (set cross-eval-clients=0)"
            )
        model = solver.personalized_model(job)
        return {keys.ARRAYS: state_record(model.state_dict())}, {keys.CLIENT_ID: job.client_id}
    owners, results = [], []
    for name, record in job.content.array_records.items():
        if name.startswith(keys.CROSS_PREFIX):
            owners.append(int(name[len(keys.CROSS_PREFIX) :]))
            results.append(job.test(job.model_from(record)))
    return {}, {
        keys.CLIENT_ID: job.client_id,
        keys.CROSS_OWNERS: owners,
        keys.CROSS_CORRECT: [r.correct for r in results],
        keys.CROSS_COUNT: [r.count for r in results],
        keys.CROSS_LOSS_SUM: [float(r.loss_sum) for r in results],
    }
