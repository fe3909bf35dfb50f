"""What a method's server holds in memory, and what a run's state takes on disk, at a
federation's size, checked before a run.

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

The same goes for disk: each method states what one client keeps between messages
(:meth:`pflarena.strategies.base.PflStrategy.client_footprint`) and its server's pools per
client; :func:`stored_versions` says how many versions the clients are expected to hold at
once, :class:`DiskEstimate` is the sum (``pflarena.server.build.disk_estimate``), and
:func:`disk_problem` refuses a run whose estimate exceeds the output directory's free space
(:func:`disk_free`), less what a resumed run already holds there (:func:`disk_used`).

This module is torch-free and knows no method.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pflarena.core.model_split import ModelSplit, split_names
from pflarena.core.text import count

__all__ = [
    "FLOAT32",
    "FLOAT64",
    "MEMORY_SHARE",
    "SHOWN_TERMS",
    "DiskEstimate",
    "Federation",
    "Footprint",
    "disk_free",
    "disk_problem",
    "disk_used",
    "footprint_problem",
    "human_bytes",
    "memory_limit",
    "stored_versions",
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
    """The numbers a method's server memory and its clients' state depend on.

    ``model_bytes`` is the model's state as the run's records hold it (every entry, at its
    own dtype); ``model_params`` the number of values in it. ``entries`` is each state
    entry's bytes and whether it is float32 (what ``state-precision = float16`` halves), in
    state order; ``trainable`` the model's trainable parameters, in state order (a
    split-model method's part is taken from both: :mod:`pflarena.core.model_split`);
    ``shapes`` each entry's shape; ``num_classes`` the data's classes.
    """

    num_clients: int
    sampled: int
    num_rounds: int
    model_bytes: int
    model_params: int
    entries: Mapping[str, tuple[int, bool]] = field(default_factory=dict, compare=False)
    trainable: tuple[str, ...] = ()
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict, compare=False)
    num_classes: int = 0
    state_precision: str = "float32"
    checkpoint_every: int = 1

    def entry_bytes(self, names: Iterable[str] | None = None) -> int:
        """The bytes of the model's entries ``names`` (default: all of them) at their own
        dtype: what a record of them holds (a control variate, a gradient)."""
        chosen = self.entries.values() if names is None else (self.entries[n] for n in names)
        return sum(n for n, _ in chosen)

    def split(self, head_layers: int) -> ModelSplit:
        """The model's body/head split with a head of the last ``head_layers`` weighted
        layers (:func:`~pflarena.core.model_split.split_names`)."""
        return split_names(tuple(self.entries), self.trainable, head_layers)

    def state_bytes(self, names: Iterable[str] | None = None) -> int:
        """What a client's state holds of the model's entries ``names`` (default: all of
        them) at the run's ``state-precision``: float32 entries at half their bytes in
        float16, every other entry at its own."""
        chosen = self.entries if names is None else {n: self.entries[n] for n in names}
        half = self.state_precision == "float16"
        return sum(n // 2 if half and is_float32 else n for n, is_float32 in chosen.values())


@dataclass(frozen=True)
class Footprint:
    """One thing a method's server holds at once: what it is, and its size in bytes."""

    what: str
    nbytes: float
    #: The stored entries (files) it is, where it is something a store keeps on disk.
    entries: int = 1

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


def stored_versions(federation: Federation, most: int, initial: int = 0) -> float:
    """The versions a federation's per-client stores are expected to hold at once, summed
    over the clients, where a client writes ``initial`` versions before the first round and
    one each time it trains, and keeps at most ``most``: with ``sampled`` of
    ``num_clients`` drawn uniformly in each of ``num_rounds`` rounds, a client trains k
    times with the binomial probability B(k; R, m/N), so N · Σ_k B(k; R, m/N) · min(k +
    initial, most)."""
    n, m, rounds = federation.num_clients, federation.sampled, max(federation.num_rounds, 0)
    if n <= 0:
        return 0.0
    p = min(m, n) / n
    # only the first few k hold fewer than ``most`` (the rest hold ``most``): the sum needs
    # no binomial coefficient of a long run's rounds, which no float holds
    fewer = [
        math.comb(rounds, k) * p**k * (1.0 - p) ** (rounds - k)
        for k in range(min(max(most - initial, 0), rounds + 1))
    ]
    below = math.fsum(b * (k + initial) for k, b in enumerate(fewer))
    return n * (below + most * max(0.0, 1.0 - math.fsum(fewer)))


@dataclass(frozen=True)
class DiskEstimate:
    """The most a run's state is expected to take on disk at once: ``terms`` (named, in
    bytes), and where (``directory``: the output directory, or the nearest folder above it
    that exists)."""

    terms: tuple[Footprint, ...]
    directory: Path
    #: What the run's state already takes there (a resumed run's): counted in the terms,
    #: so not needed again from the free space.
    held: int = 0

    @property
    def total(self) -> float:
        return math.fsum(t.nbytes for t in self.terms)

    @property
    def needed(self) -> float:
        """The free space the run still needs."""
        return max(0.0, self.total - self.held)

    def __str__(self) -> str:
        if not self.terms:
            return "no per-client state"
        return f"{human_bytes(self.total)} ({'; '.join(map(str, self.terms))})"


def disk_used(*paths: Path) -> int:
    """The bytes ``paths`` take on disk (a file, or the files under a folder; none where a
    path does not exist), a file with several hard links once (a client's versions share
    the entries they carry over)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in paths:
        if os.path.isfile(path):
            found = [str(path)]
        else:
            found = [os.path.join(root, name) for root, _, names in os.walk(path) for name in names]
        for name in found:
            try:
                info = os.lstat(name)
            except OSError:  # removed meanwhile
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


def disk_free(directory: Path) -> tuple[Path, int]:
    """The free bytes (for an unprivileged user) of the file system ``directory`` would be
    on: that of the nearest folder above it that exists, and that folder."""
    path = Path(directory).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path, shutil.disk_usage(path).free


def disk_problem(method: str, num_clients: int, estimate: DiskEstimate, free: int) -> str | None:
    """Why ``method``'s run cannot keep its state (``estimate``, the most it is expected to
    hold at once) in ``free`` bytes, in one line with the numbers; None when it can."""
    if estimate.needed <= free:
        return None
    return (
        f"{method} cannot keep its state for {count(num_clients, 'client')} in "
        f"{estimate.directory}: it would take up to about {estimate}"
        + (f", {human_bytes(estimate.held)} of it there already" if estimate.held else "")
        + ", more than the "
        f'{human_bytes(free)} free there; use state-precision = "float16" (half the '
        "models' bytes), fewer clients or rounds, or an output-dir with more space"
    )
