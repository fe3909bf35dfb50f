"""The pflarena ServerApp: validate the config, build model and strategy, run, write results."""

from __future__ import annotations

import json
import os
import platform
import time
import traceback
from datetime import datetime, timezone
from logging import ERROR, INFO
from pathlib import Path

import flwr
import numpy as np
import torch
from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

import pflarena
from pflarena.core.config import ConfigError, RunConfig
from pflarena.core.federation import load_server_data
from pflarena.core.models import build_model
from pflarena.core.partition import label_permutations, permutation_group_of
from pflarena.server.checkpoint import load_checkpoint
from pflarena.server.loop import run_rounds, summary_record
from pflarena.server.polling import PromptGrid, prompt_grid
from pflarena.server.registry import build_strategy, declaration_of, parse_config
from pflarena.server.results import ResultsWriter, plot_run, read_rounds

__all__ = ["app", "resolve_output_dir", "initial_arrays", "label_permutation_record"]

app = ServerApp()


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
    return ArrayRecord(model.state_dict())


def label_permutation_record(cfg: RunConfig) -> dict:
    """``label-permutation-groups``' groups and permutations, for ``config.json``."""
    groups = cfg.label_permutation_groups
    group_of = permutation_group_of(cfg.num_clients, groups)
    permutations = label_permutations(cfg.data_info().num_classes, groups, cfg.seed)
    return {
        "groups": [np.flatnonzero(group_of == g).tolist() for g in range(groups)],
        "permutations": permutations.tolist(),
    }


@app.main()
def main(grid: Grid, context: Context) -> None:
    grid = prompt_grid(grid)  # a deployment's replies checked every 0.1 s, not every 3 s
    cfg = parse_config(context.run_config)  # raises ConfigError naming the bad keys
    output_dir = resolve_output_dir(cfg)
    checkpoint = None
    if cfg.resume:
        if not cfg.output_dir:
            raise ConfigError("resume=true needs the output-dir of the run to continue")
        checkpoint = load_checkpoint(output_dir, cfg.strategy)
        # no checkpoint yet (it died in round 1): start again from round 0
        writer = ResultsWriter(
            output_dir, resume_after=checkpoint.server_round if checkpoint else -1
        )
    else:
        writer = ResultsWriter(output_dir)  # refuses a directory that already holds results
    log(
        INFO,
        "pflarena: %s on %s, %d clients, %d rounds -> %s",
        cfg.strategy,
        cfg.data_name(),
        cfg.num_clients,
        cfg.num_rounds,
        output_dir,
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
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "started_at": datetime.now(timezone.utc).isoformat(),
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
        previous = json.loads((output_dir / "config.json").read_text())
        previous.setdefault("resumes", []).append(
            {
                "run_id": grid.run.run_id,
                "after_round": checkpoint.server_round if checkpoint else 0,
                "started_at": config_record["started_at"],
            }
        )
        writer.write_config(previous)
    else:
        writer.write_config(config_record)
    start = time.monotonic()
    rounds: list[dict] = []
    try:
        strategy = build_strategy(
            cfg,
            server_data,
            state_dir=output_dir / "server-state",
            # a deployment's nodes may hold files of their own: only a manifest says
            data_from_spec=not isinstance(grid, PromptGrid),
        )
        strategy.summary()
        outcome = run_rounds(grid, cfg, strategy, initial_arrays(cfg), writer, resume=checkpoint)
        rounds = outcome.rounds
    except BaseException as exc:
        rounds = read_rounds(output_dir / "rounds.jsonl")
        writer.write_summary(
            summary_record(
                cfg,
                rounds,
                status="failed",
                wall_time_s=time.monotonic() - start,
                error="".join(traceback.format_exception_only(exc)).strip(),
            )
        )
        writer.close()
        log(ERROR, "pflarena: run failed; partial results in %s", output_dir)
        raise
    summary = summary_record(cfg, rounds, status="completed", wall_time_s=time.monotonic() - start)
    if method_results := strategy.run_summary():
        summary["method"] = method_results
    writer.write_summary(summary)
    writer.close()
    plot_run(output_dir)
    strategy.write_artifacts(output_dir)
    log(INFO, "pflarena: results in %s", output_dir)
