"""The pflarena ServerApp: validate the config, build model and strategy, run, write results."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
import traceback
import uuid
from datetime import datetime, timezone
from logging import INFO
from pathlib import Path

import flwr
import numpy as np
import torch
from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

import pflarena
from pflarena.core.array_decoding import state_record
from pflarena.core.config import ConfigError, RunConfig
from pflarena.core.federation import load_server_data
from pflarena.core.models import build_model
from pflarena.core.partition import label_permutations, permutation_group_of
from pflarena.core.phases import mark
from pflarena.core.versions import run_key
from pflarena.server.build import (
    build_strategy,
    check_disk_space,
    check_resources,
    declaration_of,
    parse_config,
)
from pflarena.server.checkpoint import load_checkpoint
from pflarena.server.loop import run_rounds, summary_record
from pflarena.server.polling import PromptGrid, prompt_grid
from pflarena.server.progress_events import (
    PLOTS_ENV,
    RunEnded,
    RunStarted,
    StartupPhase,
    emit,
)
from pflarena.server.results import (
    COMPLETED,
    FAILED,
    INTERRUPTED,
    ResultsWriter,
    check_output_dir,
    completed_summary,
    failure_text,
    interruption_signal,
    plot_run,
    read_rounds,
)
from pflarena.server.runlock import lock_run_dir, release

__all__ = ["app", "resolve_output_dir", "initial_arrays", "label_permutation_record"]

app = ServerApp()


def _gpu_name() -> str | None:
    """The first NVIDIA GPU's model as its driver reports it, or None, read without CUDA:
    ``torch.cuda`` here would create a context in the process that forks the in-process
    engine's workers, and a forked worker cannot use CUDA then."""
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        with contextlib.suppress(OSError):
            for line in info.read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "Model":
                    return value.strip()
    return None


def resolve_output_dir(cfg: RunConfig) -> Path:
    """``output-dir`` if set, else ``$PFLARENA_RUNS_DIR`` (default ``./runs``)/<time>-<strategy>-<dataset>."""
    if cfg.output_dir:
        return Path(cfg.output_dir).expanduser().resolve()
    root = Path(os.environ.get("PFLARENA_RUNS_DIR", "runs"))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return (root / f"{stamp}-{cfg.strategy}-{cfg.data_name()}-s{cfg.seed}").resolve()


def initial_arrays(cfg: RunConfig) -> ArrayRecord:
    """The initial model, seeded by the run seed (clients build the same one)."""
    info = cfg.data_info()
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes, seed=cfg.seed)
    return state_record(model.state_dict())


def label_permutation_record(cfg: RunConfig) -> dict:
    """``label-permutation-groups``' groups and permutations, for ``config.json``."""
    groups = cfg.label_permutation_groups
    group_of = permutation_group_of(cfg.num_clients, groups)
    permutations = label_permutations(cfg.data_info().num_classes, groups, cfg.seed)
    return {
        "groups": [np.flatnonzero(group_of == g).tolist() for g in range(groups)],
        "permutations": permutations.tolist(),
    }


#: Seconds the ServerApp waits for another process to release its run directory's lock.
LOCK_WAIT_S = 30.0


def state_key_of(previous: dict, run_config: dict) -> str:
    """The name of a resumed run's client state: the one its ``config.json`` keeps, or for a
    run begun before the key was kept there, the hash of its run config its clients used
    (with the run's first ``output-dir`` and ``num-rounds``, so it survives a move and an
    extension too)."""
    if previous.get("state_key"):
        return str(previous["state_key"])
    original = previous.get("run_config", {})
    return run_key(
        dict(run_config) | {k: original[k] for k in ("output-dir", "num-rounds") if k in original}
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    grid = prompt_grid(grid)  # a deployment's replies checked every 0.1 s, not every 3 s
    cfg = parse_config(context.run_config)  # raises ConfigError naming the bad keys
    output_dir = resolve_output_dir(cfg)
    # this machine's memory and disk, which need not be the command's machine's: its pools
    # (a deployment's clients keep their state on their own nodes)
    here = cfg.model_copy(update={"output_dir": str(output_dir)})
    check_disk_space([here], [check_resources(here, clients_here=False)])
    if cfg.resume and not cfg.output_dir:
        raise ConfigError("resume=true needs the output-dir of the run to continue")
    if not cfg.resume:
        check_output_dir(output_dir)  # before the lock file: results are never overwritten
    # One process at a time in a run directory. A deployment's previous ServerApp can take a
    # few seconds to notice that its SuperLink was restarted: a resume waits for it.
    lock = lock_run_dir(output_dir, wait_s=LOCK_WAIT_S)
    try:
        _run(grid, context, cfg, output_dir)
    finally:
        release(lock)


def _run(grid: Grid, context: Context, cfg: RunConfig, output_dir: Path) -> None:
    checkpoint = None
    previous: dict = {}
    if cfg.resume:
        if not (output_dir / "config.json").exists():
            raise ConfigError(f"{output_dir} holds no run to resume (no config.json)")
        previous = json.loads((output_dir / "config.json").read_text())
        try:
            checkpoint = load_checkpoint(output_dir, cfg.strategy)
            if checkpoint is not None and checkpoint.server_round > cfg.num_rounds:
                raise ConfigError(
                    f"checkpoint {checkpoint.path} is after round {checkpoint.server_round}, "
                    f"past the run's num-rounds={cfg.num_rounds}"
                )
            if (
                checkpoint is not None
                and checkpoint.server_round == cfg.num_rounds
                and completed_summary(output_dir) is not None
            ):
                log(INFO, "pflarena: the run in %s is complete; nothing to resume", output_dir)
                return
            # no checkpoint yet (it died in round 1): start again from round 0
            writer = ResultsWriter(
                output_dir,
                resume_after=checkpoint.server_round if checkpoint else -1,
                checkpoint=checkpoint,
            )
        except Exception as exc:
            # this attempt's own error, not the summary of the attempt before
            _write_failed_summary(output_dir, cfg, exc)
            raise
        state_key = state_key_of(previous, context.run_config)
    else:
        writer = ResultsWriter(output_dir)  # refuses a directory that already holds results
        state_key = uuid.uuid4().hex[:16]
    emit(
        RunStarted(
            strategy=cfg.strategy,
            data=cfg.data_name(),
            clients=cfg.num_clients,
            rounds=cfg.num_rounds,
            output_dir=str(output_dir),
        )
    )
    config_record = {
        "run_config": cfg.to_run_config(),
        "method": declaration_of(cfg).name,
        "method_params": cfg.params(declaration_of(cfg)).model_dump(by_alias=True),
        "model": cfg.model_name(),
        "run_id": grid.run.run_id,
        "versions": {
            "pflarena": pflarena.__version__,
            "flwr": flwr.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        # where the ServerApp ran (in simulation and in-process, the clients' machine too)
        "host": {
            "cpus": os.cpu_count(),
            "gpu": _gpu_name(),
        },
        "started_at": datetime.now(timezone.utc).isoformat(),
        # the name of the clients' state (client/state.py): kept here, so that the run
        # finds it again when its directory is moved or copied
        "state_key": state_key,
    }
    server_data = load_server_data(cfg.federation_spec())  # None unless server-fraction > 0
    if server_data is not None:
        config_record["server_data"] = {
            "num_samples": server_data.num_samples,
            "class_histogram": server_data.class_histogram,
        }
    if cfg.label_permutation_groups and not cfg.shards_dir:
        config_record["label_permutations"] = label_permutation_record(cfg)
    if cfg.resume:  # config.json stays the original run's; each resume is noted in it
        resume_note = {
            "run_id": grid.run.run_id,
            "after_round": checkpoint.server_round if checkpoint else 0,
            "started_at": config_record["started_at"],
        }
        if writer.repaired:
            resume_note["repaired"] = writer.repaired
        recorded = previous.get("run_config", {}).get("num-rounds")
        if recorded is not None and recorded != cfg.num_rounds:  # an extended run
            resume_note["num_rounds"] = {"from": recorded, "to": cfg.num_rounds}
            previous["run_config"]["num-rounds"] = cfg.num_rounds
        previous.setdefault("resumes", []).append(resume_note)
        previous.setdefault("state_key", state_key)
        writer.write_config(previous)
    else:
        writer.write_config(config_record)
    start = time.monotonic()
    rounds: list[dict] = []
    trackers = None
    if cfg.tracker:
        from pflarena.server.trackers import open_trackers

        trackers = open_trackers(cfg, output_dir, previous if cfg.resume else config_record)
        names = ", ".join(t.name for t in trackers.trackers) or "(none)"
        emit(StartupPhase(f"trackers {names} opened in {time.monotonic() - start:.1f}s"))
    startup_s = None
    try:
        strategy = build_strategy(
            cfg,
            server_data,
            state_dir=output_dir / "server-state",
            # a deployment's nodes may hold files of their own: only a manifest says
            data_from_spec=not isinstance(grid, PromptGrid),
        )
        strategy.summary()
        before_rounds = time.monotonic() - start
        outcome = run_rounds(
            grid,
            cfg,
            strategy,
            initial_arrays(cfg),
            writer,
            resume=checkpoint,
            state_key=state_key,
            on_round=trackers.log_round if trackers else None,
        )
        rounds = outcome.rounds
        startup_s = before_rounds + outcome.startup_s
        mark("rounds done")
    except BaseException as exc:
        rounds = read_rounds(output_dir / "rounds.jsonl")
        failed = ended_summary(cfg, rounds, exc, wall_time_s=time.monotonic() - start)
        writer.write_summary(failed)
        writer.close()
        interrupted = failed["status"] == INTERRUPTED
        emit(
            RunEnded(
                str(output_dir),
                failed=True,
                interrupted=(failed.get("signal") or "KeyboardInterrupt") if interrupted else None,
            )
        )
        if trackers:
            trackers.finish(failed, output_dir)
        raise
    summary = summary_record(
        cfg, rounds, status=COMPLETED, wall_time_s=time.monotonic() - start, startup_s=startup_s
    )
    if method_results := strategy.run_summary():
        summary["method"] = method_results
    writer.write_summary(summary)
    writer.close()
    mark("results written")
    if cfg.tracker or not os.environ.get(PLOTS_ENV):  # else the caller draws them
        plot_run(output_dir)
        mark("plots drawn")
    strategy.write_artifacts(output_dir)
    if trackers:
        trackers.finish(summary, output_dir)
    emit(RunEnded(str(output_dir), failures=failure_text(summary.get("client_failures"))))


def ended_summary(
    cfg: RunConfig, rounds: list[dict], exc: BaseException, wall_time_s: float = 0.0
) -> dict:
    """The ``summary.json`` of a run that ``exc`` ended before its last round: status
    ``interrupted`` with the signal's name for a ``KeyboardInterrupt`` (Ctrl-C, SIGTERM:
    ``pflarena run --resume`` continues it), else ``failed`` with the error; the failures
    of a round that stopped the run (``TooManyFailures``) are counted with the others."""
    if isinstance(exc, KeyboardInterrupt):
        return summary_record(
            cfg,
            rounds,
            status=INTERRUPTED,
            wall_time_s=wall_time_s,
            signal=interruption_signal(exc),
        )
    return summary_record(
        cfg,
        rounds,
        status=FAILED,
        wall_time_s=wall_time_s,
        error="".join(traceback.format_exception_only(exc)).strip(),
        stopped=getattr(exc, "round_record", None),
    )


def _write_failed_summary(output_dir: Path, cfg: RunConfig, exc: BaseException) -> None:
    """A ``summary.json`` saying the run failed with ``exc``, or was interrupted (the rounds
    recorded so far)."""
    from pflarena.server.results import _write_json_atomic

    rounds = (
        read_rounds(output_dir / "rounds.jsonl") if (output_dir / "rounds.jsonl").exists() else []
    )
    _write_json_atomic(output_dir / "summary.json", ended_summary(cfg, rounds, exc))
