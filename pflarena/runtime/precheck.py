"""What the data can give a run, checked before any simulation starts.

:func:`check_data` builds the run's federation the way its clients will (the same seeded
partition and splits, :func:`pflarena.core.federation.client_sizes`) and raises a
:class:`~pflarena.core.config.ConfigError` with one line naming the numbers when the data
cannot satisfy the settings: more clients than samples, a partition that cannot give every
client its minimum, label groups that the classes cannot fill, shard files that do not
match the run (the run config's validation checks the shard directory's manifest), shard
files that cannot be read (:func:`check_shards`: truncated, corrupt, or not the manifest's).
Without it such a run would fail inside every client, once per client, or go on without the
clients whose file is damaged.

Files that are not there are :func:`~pflarena.core.datasets.check_files`'s to report (the
path looked at, the layout expected and where to get them).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from pflarena.core.config import ConfigError, RunConfig
from pflarena.core.footprint import DiskEstimate
from pflarena.core.text import count

__all__ = ["Checked", "check_data", "check_data_apart", "check_shards"]

#: Damaged shard files the one line names before it counts the rest.
SHOWN_SHARDS = 3


def check_shards(directory: str) -> None:
    """Raise :class:`ConfigError`, in one line naming each client and its file's problem (the
    first :data:`SHOWN_SHARDS`, then a count), when a shard file of ``directory`` cannot be
    read (:func:`pflarena.core.shard_format.shard_set_problems`): a truncated, corrupt or
    mismatched file would otherwise fail its client in every round, and the run would go on
    over the others."""
    from pflarena.core.shard_format import ShardError, read_shard_set, shard_set_problems

    try:
        problems = shard_set_problems(directory)
    except ShardError as error:
        raise ConfigError(f"shards-dir {directory}: {' '.join(str(error).split())}") from None
    if not problems:
        return
    total = read_shard_set(directory).num_clients
    named = "; ".join(f"client {client}: {problem}" for client, problem in problems[:SHOWN_SHARDS])
    more = len(problems) - SHOWN_SHARDS
    raise ConfigError(
        f"shards-dir {directory}: {len(problems)} of {total} shard files cannot be used "
        f"(their clients would fail every round): {named}"
        + (f"; and {more} more" if more > 0 else "")
    )


def check_data(cfg: RunConfig, *, files_required: bool = True) -> str | None:
    """Raise :class:`ConfigError` (one line, with the numbers) when ``cfg``'s data cannot
    give every client what the run needs; return None otherwise.

    Files that are not there raise :func:`~pflarena.core.datasets.check_files`'s
    ``DatasetError`` (naming the path and the layout); with ``files_required=False``
    (``--check``) they are not an error: what is returned says why the numbers were not
    checked."""
    from pflarena.core.datasets import DatasetError, check_files

    if cfg.shards_dir:
        # the manifest is checked against the run by the config's validation; here each
        # shard file, as far as that is cheap (its archive, metadata and array headers)
        check_shards(cfg.shards_dir)
        return None
    try:
        check_files(cfg.dataset, cfg.data_dir)
    except DatasetError as error:
        if files_required:
            raise
        return f"the data's numbers were not checked: {error}"
    from pflarena.core.federation import client_sizes

    try:
        train, _val, test = client_sizes(cfg.federation_spec())
    except (DatasetError, ValueError) as error:
        text = " ".join(str(error).split())
        raise ConfigError(
            f"the data cannot satisfy this run ({cfg.dataset}, {count(cfg.num_clients, 'client')}, "
            f"partition {cfg.partition}): {text}"
        ) from None
    empty = [i for i, n in enumerate(train) if n == 0]
    if empty:
        raise ConfigError(
            f"the data cannot satisfy this run ({cfg.dataset}, {count(cfg.num_clients, 'client')}, "
            f"partition {cfg.partition}): {len(empty)} client(s) would get no training "
            f"samples (client {empty[0]} first); use fewer clients or a larger alpha"
        )
    if cfg.test_fraction > 0 and (no_test := [i for i, n in enumerate(test) if n == 0]):
        raise ConfigError(
            f"the data cannot satisfy this run ({cfg.dataset}, {count(cfg.num_clients, 'client')}): "
            f"{len(no_test)} client(s) would get no test samples (client {no_test[0]} "
            "first); use fewer clients or a larger test-fraction"
        )
    return None


@dataclass(frozen=True)
class Checked:
    """What :func:`check_data_apart` found for a run that passed: why its data's numbers
    were not checked (``--check`` without the files), or None; and what its state is
    expected to take on disk (:func:`pflarena.server.build.disk_estimate`)."""

    unchecked: str | None
    disk: DiskEstimate


def _check_each(
    cfgs: Sequence[RunConfig], files_required: bool, clients_here: bool
) -> list[Checked]:
    from pflarena.server.build import check_disk_space, check_resources

    checked = [
        Checked(check_data(cfg, files_required=files_required), check_resources(cfg, clients_here))
        for cfg in cfgs
    ]
    check_disk_space(cfgs, [c.disk for c in checked])
    return checked


def check_data_apart(
    cfgs: Sequence[RunConfig], *, files_required: bool = True, clients_here: bool = True
) -> list[Checked]:
    """:func:`check_data` of each config, whether its method's server fits this machine's
    memory (:func:`pflarena.server.build.check_footprint`) and whether its state fits the
    output directory's disk (:func:`pflarena.server.build.check_disk_space`;
    ``clients_here``: the clients keep their state there, as a simulation's do), in one
    child process forked for the purpose.

    Reading a data set may import torch (torchvision's readers: MNIST, CIFAR) and keep it
    with the data, about 1 GB for MNIST, which the command's process, waiting on the run to
    its end, would hold all along: 1.1 GB of a Ditto run's 9.6 GB at 3,550 clients
    (``benchmarks/results/scale.md``). The child's exit gives it back. Where this process has
    imported torch already, or cannot fork, the checks run here. Raises what
    :func:`check_data` raises.
    """
    if "torch" in sys.modules or not hasattr(os, "fork"):
        return _check_each(cfgs, files_required, clients_here)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from pflarena.runtime.processes import die_with_parent

    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(1, mp_context=context, initializer=die_with_parent) as child:
        return child.submit(_check_each, list(cfgs), files_required, clients_here).result()
