"""What a method's server holds in memory at a federation's size, checked before a run.

A method whose server keeps something per client (FedAMP's stacked models, FedFomo's
affinity matrix, FedPG's stale gradients, PAGE's agent of width N) can ask for more memory
than the machine has once the federation has thousands of clients, and a run that starts
anyway dies hours later, out of memory. Each strategy states what its server holds as a
function of the federation (:meth:`pflarena.strategies.base.PflStrategy.server_footprint`:
a list of :class:`Footprint` terms, each named and sized from the run's numbers), and
:func:`footprint_problem` refuses a run whose terms add up to more than
:data:`MEMORY_SHARE` of the memory this process may use (:func:`memory_limit`), naming the
largest terms. ``pflarena run --check`` and ``pflarena sweep`` check it with the model the
run builds; the ServerApp checks it again at start-up on its own machine (a deployment's
server need not be the machine the command ran on).

The terms are the server's own state and the round's traffic it holds at once (the sampled
clients' replies); the engine's processes, the clients' training and the data are not in
them (measured apart: ``benchmarks/results/scale.md``), which is why a run is refused
before its terms reach the whole memory.

This module is torch-free and knows no method.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pflarena.core.text import count

__all__ = [
    "FLOAT32",
    "FLOAT64",
    "MEMORY_SHARE",
    "Federation",
    "Footprint",
    "footprint_problem",
    "human_bytes",
    "memory_limit",
]

FLOAT32 = 4
FLOAT64 = 8

#: The share of :func:`memory_limit` a run's server terms may take: the rest is the
#: engine's, the clients' and the data's, which the terms leave out (several GB for a
#: federation of thousands whose server state is a few MB: ``benchmarks/results/scale.md``).
MEMORY_SHARE = 0.6

#: Where a cgroup v2 (a container, a systemd slice) states this process's memory limit.
_CGROUP_LIMIT = Path("/sys/fs/cgroup/memory.max")

#: Terms the refusal names, largest first.
SHOWN_TERMS = 3


@dataclass(frozen=True)
class Federation:
    """The numbers a method's server memory depends on.

    ``model_bytes`` is the model's state as the run's records hold it (every entry, at its
    own dtype); ``model_params`` the number of values in it.
    """

    num_clients: int
    sampled: int
    num_rounds: int
    model_bytes: int
    model_params: int


@dataclass(frozen=True)
class Footprint:
    """One thing a method's server holds at once: what it is, and its size in bytes."""

    what: str
    nbytes: float

    def __str__(self) -> str:
        return f"{self.what}: {human_bytes(self.nbytes)}"


def human_bytes(nbytes: float) -> str:
    """``nbytes`` in B, KB, MB, GB or TB (powers of 1,024), three significant figures."""
    value = float(nbytes)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TB" if value < 1000 else f"{value:,.0f} TB"


def memory_limit() -> int:
    """The memory this process may use: the machine's physical memory, or its cgroup's
    limit where that is lower (a container with ``mem_limit``)."""
    limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        text = _CGROUP_LIMIT.read_text().strip()
    except OSError:
        return limit
    return min(limit, int(text)) if text.isdigit() else limit


def footprint_problem(
    method: str, federation: Federation, terms: Sequence[Footprint], limit: int | None = None
) -> str | None:
    """Why ``method``'s server cannot hold ``terms`` within :data:`MEMORY_SHARE` of
    ``limit`` (default :func:`memory_limit`), in one line naming the largest terms and the
    numbers; None when it can."""
    limit = memory_limit() if limit is None else limit
    total = math.fsum(t.nbytes for t in terms)
    allowed = MEMORY_SHARE * limit
    if total <= allowed:
        return None
    largest = sorted(terms, key=lambda t: -t.nbytes)[:SHOWN_TERMS]
    return (
        f"{method} cannot run {count(federation.num_clients, 'client')} here: its server "
        f"would hold {human_bytes(total)} ({'; '.join(map(str, largest))}; the model is "
        f"{human_bytes(federation.model_bytes)}), more than {MEMORY_SHARE:.0%} of the "
        f"{human_bytes(limit)} this machine gives the run; use fewer clients, a smaller "
        "model, or a machine with more memory"
    )
