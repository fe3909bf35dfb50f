"""The declared methods on the server: validate a run config against them, build a strategy."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pflarena.core.config import ConfigError, RunConfig, parse_run_config
from pflarena.core.footprint import (
    SHOWN_TERMS,
    DiskEstimate,
    Federation,
    Footprint,
    disk_free,
    disk_problem,
    disk_used,
    footprint_problem,
    human_bytes,
    stored_versions,
)
from pflarena.core.methods import MethodDeclaration
from pflarena.core.models import build_model
from pflarena.core.training import trainable_names
from pflarena.server.checkpoint import CHECKPOINT_NAME
from pflarena.strategies import declarations, strategy_classes
from pflarena.strategies.base import ClientSizes, PflStrategy, StrategySetup, sample_size

__all__ = [
    "build_strategy",
    "check_disk_space",
    "check_footprint",
    "check_resources",
    "disk_estimate",
    "declaration_of",
    "federation_of",
    "known_client_sizes",
    "parse_config",
]


def parse_config(run_config: Mapping[str, Any]) -> RunConfig:
    """:func:`~pflarena.core.config.parse_run_config` against every declared method."""
    return parse_run_config(run_config, declarations())


def declaration_of(cfg: RunConfig) -> MethodDeclaration:
    return declarations()[cfg.strategy]


def _trainable_names(cfg: RunConfig) -> tuple[str, ...]:
    info = cfg.data_info()
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes)
    return tuple(trainable_names(model))


def federation_of(cfg: RunConfig) -> Federation:
    """The numbers ``cfg``'s server memory depends on (:mod:`pflarena.core.footprint`):
    the clients, how many a round samples (as the strategy will), the rounds and the size
    of the model the run builds."""
    import torch

    info = cfg.data_info()
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes)
    state = model.state_dict()
    strategy = strategy_classes()[cfg.strategy]
    fraction = cfg.fraction_train or strategy.declaration.default_fraction_train
    n = cfg.num_clients
    return Federation(
        num_clients=n,
        sampled=sample_size(n, fraction, cfg.min_train_clients),
        num_rounds=cfg.num_rounds,
        model_bytes=sum(t.numel() * t.element_size() for t in state.values()),
        model_params=sum(t.numel() for t in state.values()),
        entries={
            name: (t.numel() * t.element_size(), t.dtype == torch.float32)
            for name, t in state.items()
        },
        trainable=tuple(trainable_names(model)),
        shapes={name: tuple(t.shape) for name, t in state.items()},
        num_classes=info.num_classes,
        state_precision=cfg.state_precision,
        checkpoint_every=cfg.checkpoint_every,
    )


def check_footprint(
    cfg: RunConfig, limit: int | None = None, federation: Federation | None = None
) -> None:
    """Raise :class:`ConfigError` (one line, with the numbers) when ``cfg``'s method would
    hold more in the server's memory than this machine gives the run
    (:func:`~pflarena.core.footprint.footprint_problem`; ``limit``: the machine's memory
    in bytes, default :func:`~pflarena.core.footprint.memory_limit`)."""
    cls = strategy_classes()[cfg.strategy]
    federation = federation_of(cfg) if federation is None else federation
    terms = cls.server_footprint(cfg.params(cls.declaration), federation)
    problem = footprint_problem(cfg.strategy, federation, terms, limit)
    if problem:
        raise ConfigError(problem)


#: What a stored entry takes on disk beyond its arrays' bytes: the npz file's headers (about
#: 260 bytes an array) and its last file-system block, partly empty (4 KB blocks): a FedPer
#: head of 20 KB on MNIST's CNN is a file of 24 KB on disk (benchmarks/results/disk_estimate.md).
ENTRY_OVERHEAD = 4096
#: What a checkpoint term's arrays take beyond their bytes (each array's npz header, and
#: for the method's own state a name per entry).
CHECKPOINT_OVERHEAD = 4096


def disk_estimate(
    cfg: RunConfig, federation: Federation | None = None, clients_here: bool = True
) -> DiskEstimate:
    """The most ``cfg``'s state is expected to take at once in its output directory: the
    clients' (``clients_here``: a simulation's clients keep theirs in
    ``<output-dir>/client-state``; a deployment's nodes, on their own disks), the
    server's per-client pools, and its checkpoint, twice while a new one replaces the last
    (written beside it, then renamed over it: :mod:`pflarena.server.checkpoint`).

    A client holds the version the server last accepted and the one its last train message
    wrote, and one more where checkpoints are further apart than a round (the version the
    last checkpoint accepted: :mod:`pflarena.client.state`); a pool holds a client's newest
    version up to the last checkpoint and those written since
    (:class:`~pflarena.core.versions.ClientPool`). How many versions that is, summed over
    the clients, follows from how often each is expected to train
    (:func:`~pflarena.core.footprint.stored_versions`). Entries a version carries over
    unchanged are hard links and cost nothing; the estimate counts every version whole, each
    entry with :data:`ENTRY_OVERHEAD`. It is an expectation over the rounds' samples: the
    samples drawn may hold a little more (Ditto's peak at 1,000 clients: 0.5 % more)."""
    cls = strategy_classes()[cfg.strategy]
    params = cfg.params(cls.declaration)
    federation = federation_of(cfg) if federation is None else federation
    every = federation.checkpoint_every
    terms = []
    per_client = cls.client_footprint(params, federation) if clients_here else []
    if per_client:
        most = 2 if every <= 1 else 3
        versions = stored_versions(federation, most, cls.initial_versions(params))
        one = math.fsum(t.nbytes + t.entries * ENTRY_OVERHEAD for t in per_client)
        terms.append(
            Footprint(
                f"client state, {versions:,.0f} versions of {human_bytes(one)} "
                f"({', '.join(map(str, per_client))})",
                versions * one,
            )
        )
    models, what = cls.pool_models
    if models:
        versions = stored_versions(federation, 1 + min(every, federation.num_rounds))
        terms.append(
            Footprint(
                f"the server's pools, {versions:,.0f} versions of {what}",
                versions * models * (federation.model_bytes + ENTRY_OVERHEAD),
            )
        )
    checkpoint = cls.checkpoint_footprint(params, federation)
    arrays = math.fsum(t.nbytes for t in checkpoint)
    records = cls.checkpoint_records(params, federation)
    terms.append(
        Footprint(
            f"the checkpoint, twice while it is replaced "
            f"({'; '.join(map(str, checkpoint))}; {human_bytes(records)} of records)",
            2 * (arrays + records + CHECKPOINT_OVERHEAD * len(checkpoint)),
        )
    )
    output = Path(cfg.output_dir or ".")
    directory, _ = disk_free(output)
    # a resumed run's state is there already, counted in the terms
    counted = [output / "client-state"] if per_client else []
    counted += [output / "server-state"] if models else []
    held = disk_used(*counted, output / CHECKPOINT_NAME)
    return DiskEstimate(tuple(terms), directory, held)


def check_resources(cfg: RunConfig, clients_here: bool = True) -> DiskEstimate:
    """:func:`check_footprint` (the server's memory) and ``cfg``'s :func:`disk_estimate`,
    which the caller checks against the free space (with any other run's that shares the
    disk: :func:`check_disk_space`)."""
    federation = federation_of(cfg)
    check_footprint(cfg, federation=federation)
    return disk_estimate(cfg, federation, clients_here)


def check_disk_space(cfgs: Sequence[RunConfig], estimates: Sequence[DiskEstimate]) -> None:
    """Raise :class:`ConfigError` (one line, with the numbers) when the runs' state would
    not fit the free space of their output directories' file systems: runs whose
    directories share a file system are summed (a sweep's runs keep their state when they
    end)."""
    by_device: dict[int, list[tuple[RunConfig, DiskEstimate]]] = {}
    for cfg, estimate in zip(cfgs, estimates, strict=True):
        if estimate.terms:
            device = os.stat(estimate.directory).st_dev
            by_device.setdefault(device, []).append((cfg, estimate))
    for runs in by_device.values():
        cfg, estimate = runs[0]
        _, free = disk_free(estimate.directory)
        if len(runs) == 1:
            problem = disk_problem(cfg.strategy, cfg.num_clients, estimate, free)
        else:
            total = math.fsum(e.needed for _, e in runs)
            largest = sorted(runs, key=lambda r: -r[1].needed)[:SHOWN_TERMS]
            named = "; ".join(f"{c.strategy} {human_bytes(e.needed)}" for c, e in largest)
            problem = None if total <= free else (
                f"these {len(runs)} runs would keep up to about {human_bytes(total)} of state in "
                f"{estimate.directory} ({named}), more than the {human_bytes(free)} free "
                "there; run fewer at once, use state-precision = \"float16\", or an output "
                "directory with more space"
            )  # fmt: skip
        if problem:
            raise ConfigError(problem)


def known_client_sizes(cfg: RunConfig, data_from_spec: bool = True) -> ClientSizes | None:
    """What the server knows of each client's data: the shard manifest's counts with
    ``shards-dir``; otherwise, where the clients build their data from the run config
    (``data_from_spec``: a simulation, not a deployment whose nodes hold files of their
    own), the counts of that federation; ``None`` where it cannot know."""
    from pflarena.core.federation import DatasetError, client_sizes
    from pflarena.core.shard_format import read_shard_set

    if cfg.shards_dir:
        shard_set = read_shard_set(cfg.shards_dir)
        return ClientSizes(shard_set.num_train, shard_set.num_val, shard_set.num_test)
    if not data_from_spec:
        return None
    try:
        train, val, test = client_sizes(cfg.federation_spec())
    except (DatasetError, OSError):  # the data is not on the server's machine
        return None
    return ClientSizes(tuple(train), tuple(val), tuple(test))


def build_strategy(
    cfg: RunConfig,
    server_data: Any = None,
    state_dir: Path | None = None,
    data_from_spec: bool = True,
) -> PflStrategy:
    """The strategy ``cfg`` names, built with its method's parameters.

    ``state_dir`` is where its per-client pools go (the ServerApp passes
    ``<output-dir>/server-state``); None keeps them in memory. The strategy checks the
    counts clients report against :func:`known_client_sizes` (``data_from_spec``: whether
    the clients build their data from the run config, as in a simulation).
    """
    cls = strategy_classes()[cfg.strategy]
    setup = StrategySetup(
        cfg=cfg,
        params=cfg.params(cls.declaration),
        trainable=_trainable_names(cfg),
        server_data=server_data,
        state_dir=state_dir,
    )
    strategy = cls.from_setup(setup)
    strategy.client_sizes = known_client_sizes(cfg, data_from_spec)
    return strategy
