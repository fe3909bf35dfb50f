"""Which engine runs a run's clients, and how many at once: decided before anything starts.

Light on purpose (no torch, Flower or Ray imports): the command line decides and prints the
engine on its first line of output before the simulation's start-up.

* ``inprocess`` (the default): the ServerApp and the ClientApps in one simulation process,
  the clients of a round in worker processes forked after the imports
  (:mod:`pflarena.runtime.inprocess`); one worker per ``cpus-per-client`` cores of this
  machine, at most one per client; ``workers=1`` runs them one after another in the process.
* ``ray``: Flower's Ray simulation engine (a Ray cluster, ``--ray-address``; GPUs per client,
  ``--gpus-per-client``). Chosen by itself when either is given and no engine is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_ENGINE", "ENGINES", "EnginePlan", "available_cores", "plan_engine"]

#: How a run's clients are executed: in worker processes of the run's process, or on Ray.
ENGINES: tuple[str, ...] = ("inprocess", "ray")
DEFAULT_ENGINE = "inprocess"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible, without initialising CUDA (a forked worker could
    not use a context its parent created)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return Path("/dev/nvidiactl").exists()


@dataclass(frozen=True)
class EnginePlan:
    """The engine of a run and, in-process, its number of worker processes."""

    engine: str
    workers: int = 1
    why: str = ""

    def describe(self) -> str:
        """One line: which engine runs, with how many clients at once and why."""
        if self.engine == "ray":
            return (
                f"engine: ray (Flower's Ray simulation engine{', ' + self.why if self.why else ''})"
            )
        if self.workers == 1:
            how = "clients one after another in the run's process"
        else:
            how = f"clients in {self.workers} worker processes side by side"
        return f"engine: inprocess ({how}{', ' + self.why if self.why else ''})"


def plan_engine(
    engine: str | None = None,
    *,
    workers: int | None = None,
    cpus_per_client: float = 1.0,
    gpus_per_client: float = 0.0,
    ray_address: str | None = None,
    device: str = "auto",
    num_clients: int | None = None,
) -> EnginePlan:
    """The engine a run uses: ``engine`` if given, else ``inprocess``, unless a Ray cluster
    (``ray_address``) or GPUs per client were asked for (``ray``). In-process, ``workers``
    if given, else one per ``cpus_per_client`` of this machine's cores (at most one per
    client); clients that compute on a GPU run one after another (``device`` ``cuda``, or
    ``auto`` where a GPU is visible)."""
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if engine is None:
        if ray_address:
            return EnginePlan("ray", why="--ray-address given")
        if gpus_per_client > 0:
            return EnginePlan("ray", why="--gpus-per-client given")
        engine = DEFAULT_ENGINE
    if engine == "ray":
        return EnginePlan("ray")
    on_gpu = device == "cuda" or (device == "auto" and has_gpu())
    if workers is not None and workers > 1 and on_gpu:
        # A forked worker cannot use CUDA once the process it was forked from has touched
        # it, and torch touches it from more places than pflarena controls (an H200 run
        # with --workers 4 failed every client with "Cannot re-initialize CUDA in forked
        # subprocess" even with no client called before the fork).
        raise ValueError(
            f"--workers {workers} with clients on the GPU (device {device!r}): in-process "
            "clients on a GPU run one after another in the run's process; for several at "
            "once use --engine ray --gpus-per-client FRACTION (Ray starts its workers "
            "afresh), or --device cpu"
        )
    if workers is not None:
        return EnginePlan("inprocess", workers, "--workers")
    if on_gpu:
        return EnginePlan(
            "inprocess", 1, "clients compute on the GPU; --engine ray --gpus-per-client shares it"
        )
    cores = available_cores()
    count = max(1, int(cores // max(cpus_per_client, 1e-9)))
    if num_clients is not None:
        count = min(count, max(1, num_clients))
    why = f"{cores} core{'s' if cores != 1 else ''}"
    if cpus_per_client != 1.0:
        why += f", {cpus_per_client:g} per client"
    return EnginePlan("inprocess", count, why)
