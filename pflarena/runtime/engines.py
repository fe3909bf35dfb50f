"""Which engine runs a run's clients, and how many at once: decided before anything starts.

Light on purpose (no torch, Flower or Ray imports): the command line decides and prints the
engine on its first line of output before the simulation's start-up.

* ``inprocess`` (the default): the ServerApp and the ClientApps in one simulation process,
  the clients of a round in worker processes (:mod:`pflarena.runtime.inprocess`). On the
  CPU, one worker per ``cpus-per-client`` cores of this machine, at most one per client,
  forked after the imports; ``workers=1`` runs them one after another in the process. On a
  GPU, :data:`DEFAULT_CLIENTS_PER_GPU` workers per visible GPU (``--clients-per-gpu``),
  started with ``spawn`` (CUDA cannot cross a fork), each pinned to one GPU.
* ``ray``: Flower's Ray simulation engine (a Ray cluster, ``--ray-address``; GPUs per client,
  ``--gpus-per-client``). Chosen by itself when either is given and no engine is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_CLIENTS_PER_GPU",
    "DEFAULT_ENGINE",
    "ENGINES",
    "START_METHODS",
    "WORKER_START_ENV",
    "EnginePlan",
    "available_cores",
    "plan_engine",
    "visible_gpus",
]

#: How a run's clients are executed: in worker processes of the run's process, or on Ray.
ENGINES: tuple[str, ...] = ("inprocess", "ray")
DEFAULT_ENGINE = "inprocess"
#: How in-process workers start: ``fork`` (they inherit the imports and the data: quick, the
#: CPU's) or ``spawn`` (a fresh interpreter each, which may use CUDA: the GPU's).
START_METHODS: tuple[str, ...] = ("fork", "spawn")
#: Environment: force a start method (``spawn`` on the CPU: the GPU's code path, tested
#: without a GPU).
WORKER_START_ENV = "PFLARENA_WORKER_START"
#: In-process clients training at once on each GPU when ``--workers`` is not given. The
#: papers' models (a 2-layer CNN on MNIST, CIFAR-10) leave a GPU mostly idle with one client:
#: Python's per-batch work dominates. 2 is a provisional choice until the GPU checks
#: (``benchmarks/gpu/run.sh``: 1, 2 and 4 workers on one GPU) have measured it.
DEFAULT_CLIENTS_PER_GPU = 2


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def visible_gpus() -> tuple[str, ...]:
    """The NVIDIA GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them to a
    child process (its entries where it is set, else ``0 .. n-1`` for the ``/dev/nvidiaN``
    device files), found without initialising CUDA: a process that will fork workers must
    not hold a CUDA context, and this is decided before torch is imported."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids: list[str] = []
        for entry in (part.strip() for part in listed.split(",")):
            if not entry or entry.startswith("-"):
                break  # CUDA ignores everything from the first invalid entry on
            ids.append(entry)
        return tuple(ids)
    if not Path("/dev/nvidiactl").exists():
        return ()
    count = sum(1 for path in Path("/dev").glob("nvidia*") if path.name[6:].isdigit())
    return tuple(str(i) for i in range(max(1, count)))


def has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible (:func:`visible_gpus`), without initialising CUDA."""
    return bool(visible_gpus())


@dataclass(frozen=True)
class EnginePlan:
    """The engine of a run and, in-process, its worker processes: how many, how they start,
    and the GPUs they are shared out over (worker ``i`` on ``gpus[i % len(gpus)]``)."""

    engine: str
    workers: int = 1
    why: str = ""
    start_method: str = "fork"
    gpus: tuple[str, ...] = ()

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
            if self.gpus:
                how += f" on {_gpu_names(self.gpus)}"
            if self.start_method != "fork":
                how += f", started with {self.start_method}"
        return f"engine: inprocess ({how}{', ' + self.why if self.why else ''})"


def _gpu_names(gpus: tuple[str, ...]) -> str:
    return f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {','.join(gpus)}"


def plan_engine(
    engine: str | None = None,
    *,
    workers: int | None = None,
    cpus_per_client: float = 1.0,
    gpus_per_client: float = 0.0,
    ray_address: str | None = None,
    device: str = "auto",
    num_clients: int | None = None,
    clients_per_gpu: int | None = None,
) -> EnginePlan:
    """The engine a run uses: ``engine`` if given, else ``inprocess``, unless a Ray cluster
    (``ray_address``) or GPUs per client were asked for (``ray``).

    In-process, clients on the CPU run in ``workers`` forked workers if given, else one per
    ``cpus_per_client`` of this machine's cores. Clients on a GPU (``device`` ``cuda``, or
    ``auto`` where one is visible) run in ``workers`` spawned workers if given, else
    ``clients_per_gpu`` (:data:`DEFAULT_CLIENTS_PER_GPU`) per visible GPU, shared out over the
    GPUs, at most one per core. Never more workers than clients. :data:`WORKER_START_ENV`
    forces the start method."""
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if clients_per_gpu is not None and clients_per_gpu < 1:
        raise ValueError(f"--clients-per-gpu must be at least 1, got {clients_per_gpu}")
    if gpus_per_client < 0:
        raise ValueError(f"--gpus-per-client must be at least 0, got {gpus_per_client:g}")
    why = ""
    if engine is None:
        if ray_address:
            return EnginePlan("ray", why="--ray-address given")
        engine = DEFAULT_ENGINE
        if gpus_per_client > 0:
            engine, why = "ray", "--gpus-per-client given"
    if engine == "ray":
        if device == "cuda" and gpus_per_client <= 0:
            raise ValueError(
                "--device cuda on the Ray engine needs --gpus-per-client FRACTION (0.25: four "
                "clients share a GPU): Ray hides the GPUs from a client that reserves none"
            )
        if gpus_per_client > 0 and not ray_address and not has_gpu():
            # Ray would wait for ever for a GPU to place the first client on.
            raise ValueError(
                f"--gpus-per-client {gpus_per_client:g}: no GPU is visible to this process "
                "(no /dev/nvidiactl, or CUDA_VISIBLE_DEVICES hides them), so Ray could place "
                "no client; leave it 0, or give --ray-address of a cluster that has GPUs"
            )
        return EnginePlan("ray", why=why)
    gpus = visible_gpus() if device in ("cuda", "auto") else ()
    if device == "cuda" and not gpus:
        raise ValueError(
            "--device cuda: no GPU is visible to this process (no /dev/nvidiactl, or "
            "CUDA_VISIBLE_DEVICES hides them); use --device cpu, or auto to take a GPU "
            "where there is one"
        )
    forced = os.environ.get(WORKER_START_ENV) or None
    if forced is not None and forced not in START_METHODS:
        raise ValueError(f"{WORKER_START_ENV}={forced!r}: choose one of {', '.join(START_METHODS)}")
    if gpus:
        if forced == "fork":
            raise ValueError(
                f"{WORKER_START_ENV}=fork with clients on the GPU: a forked worker cannot use "
                "CUDA; leave it unset (spawn) or use --device cpu"
            )
        return _gpu_plan(gpus, workers, clients_per_gpu, num_clients)
    start = forced or "fork"
    if workers is not None:
        return EnginePlan("inprocess", workers, "--workers", start)
    cores = available_cores()
    count = max(1, int(cores // max(cpus_per_client, 1e-9)))
    if num_clients is not None:
        count = min(count, max(1, num_clients))
    why = f"{cores} core{'s' if cores != 1 else ''}"
    if cpus_per_client != 1.0:
        why += f", {cpus_per_client:g} per client"
    return EnginePlan("inprocess", count, why, start)


def _gpu_plan(
    gpus: tuple[str, ...], workers: int | None, clients_per_gpu: int | None, num_clients: int | None
) -> EnginePlan:
    """In-process clients on ``gpus``: spawned workers, each on one GPU."""
    if workers is not None:
        count, why = workers, "--workers"
    else:
        per_gpu = clients_per_gpu or DEFAULT_CLIENTS_PER_GPU
        cores = available_cores()
        count = min(per_gpu * len(gpus), cores)
        why = f"{per_gpu} per GPU"
        if count < per_gpu * len(gpus):
            why += f", at most one per core ({cores})"
    if num_clients is not None:
        count = min(count, max(1, num_clients))
    gpus = gpus[:count]  # a worker per GPU at most where there are fewer workers
    if count == 1:
        return EnginePlan("inprocess", 1, f"clients on {_gpu_names(gpus)}", "spawn", gpus)
    return EnginePlan("inprocess", count, why, "spawn", gpus)
