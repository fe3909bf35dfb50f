"""Server checkpoints: what a run needs to continue after a crash, in one atomic file.

``<output-dir>/checkpoint.npz`` holds the round number, the server's arrays (the global
model), the strategy's own state (its arrays and a JSON part: the sampler's RNG state, the
client ids of the nodes, the update each client last had accepted, and whatever the method
keeps, e.g. pFedGT's c), the loop's own (the state version each client must hold) and the
SHA-256 of ``rounds.jsonl`` as it was then. It is replaced atomically after every
``checkpoint-every`` rounds, after that round's ``rounds.jsonl`` line, so it never runs
ahead of the results. A SHA-256 of its own contents (header and arrays) is stored beside
them: a damaged or edited checkpoint is refused on load, naming the file and what is wrong,
and so is one that does not match the run's ``rounds.jsonl`` (:func:`check_rounds`).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from pflarena.strategies.base import PflStrategy

__all__ = [
    "CHECKPOINT_NAME",
    "Checkpoint",
    "CheckpointError",
    "check_rounds",
    "load_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_NAME = "checkpoint.npz"
_FORMAT = "pflarena-checkpoint/1"
_CHECKSUM = "checksum"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (damaged, edited, or not this run's)."""


@dataclass
class Checkpoint:
    server_round: int
    arrays: ArrayRecord
    strategy_arrays: dict[str, np.ndarray]
    strategy_meta: dict[str, Any]
    #: the run loop's own state (:class:`pflarena.server.loop.ClientSync`)
    loop_meta: dict[str, Any] = field(default_factory=dict)
    #: SHA-256 of ``rounds.jsonl`` when the checkpoint was written ("" in older ones)
    rounds_sha256: str = ""
    path: Path | None = None


def _digest(contents: dict[str, np.ndarray]) -> str:
    """SHA-256 over every member: its name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(contents):
        array = np.ascontiguousarray(contents[name])
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def sync_filesystem(path: Path) -> None:
    """Flush the file system holding ``path`` to disk (Linux's ``syncfs``; ``os.sync``,
    every file system, where that is not available)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass
    os.sync()


def save_checkpoint(
    output_dir: Path,
    server_round: int,
    arrays: ArrayRecord,
    strategy: PflStrategy,
    *,
    loop_meta: dict[str, Any] | None = None,
    rounds_sha256: str = "",
) -> Path:
    """Write the checkpoint after ``server_round`` (atomically: a temporary file, then rename).

    The output directory's file system is synced first: a simulated client's state versions
    are written there without an fsync each (:class:`~pflarena.core.versions.DiskVersions`),
    and every version this checkpoint can refer to is durable before it exists.
    """
    sync_filesystem(output_dir)
    strategy_arrays, meta = strategy.checkpoint_state()
    contents: dict[str, np.ndarray] = {f"global/{k}": v.numpy() for k, v in arrays.items()}
    contents |= {f"strategy/{k}": v for k, v in strategy_arrays.items()}
    header = {
        "format": _FORMAT,
        "round": server_round,
        "method": strategy.method,
        "meta": meta,
        "loop": loop_meta or {},
        "rounds_sha256": rounds_sha256,
    }
    contents["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    contents[_CHECKSUM] = np.frombuffer(_digest(contents).encode(), dtype=np.uint8)
    path = output_dir / CHECKPOINT_NAME
    tmp = path.with_name(f".{CHECKPOINT_NAME}.tmp")
    with open(tmp, "wb") as handle:
        np.savez(handle, **contents)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(output_dir: Path, method: str) -> Checkpoint | None:
    """The run's checkpoint, or None when it has none; a damaged one (truncated, its
    checksum not matching its contents, a header that is not a checkpoint's) raises
    :class:`CheckpointError` naming the file."""
    path = output_dir / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            contents = {name: data[name] for name in data.files}
        header = json.loads(bytes(contents["header"]).decode())
        server_round = header["round"]
        if not isinstance(server_round, int) or isinstance(server_round, bool):
            raise ValueError(f"its round is {server_round!r}, not a round number")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc}); it may have been "
            "cut short or edited. Restore it from a copy, or start the run again in a new "
            "output directory"
        ) from exc
    stored = contents.pop(_CHECKSUM, None)
    if stored is not None and bytes(stored).decode(errors="replace") != _digest(contents):
        raise CheckpointError(
            f"checkpoint {path} does not match its checksum: its contents were changed after "
            "it was written (edited or damaged). Restore it from a copy, or start the run "
            "again in a new output directory"
        )
    if header.get("format") != _FORMAT or header.get("method") != method:
        raise CheckpointError(
            f"checkpoint {path} is for {header.get('method')!r} ({header.get('format')}), "
            f"not this run's {method!r}"
        )
    arrays = ArrayRecord(
        {k[len("global/") :]: Array(v) for k, v in contents.items() if k.startswith("global/")}
    )
    strategy_arrays = {
        k[len("strategy/") :]: v for k, v in contents.items() if k.startswith("strategy/")
    }
    return Checkpoint(
        server_round,
        arrays,
        strategy_arrays,
        header["meta"],
        loop_meta=header.get("loop", {}),
        rounds_sha256=header.get("rounds_sha256", ""),
        path=path,
    )


def check_rounds(checkpoint: Checkpoint, lines: list[str], rounds_path: Path) -> None:
    """Refuse a checkpoint that does not belong to ``rounds_path``'s lines up to its round.

    ``lines`` are the file's raw lines (newline included) of rounds up to the checkpoint's:
    they must be rounds 0, 1, ..., its round, and hash to what the checkpoint recorded.
    """
    rounds = [json.loads(line)["round"] for line in lines]
    if rounds != list(range(checkpoint.server_round + 1)):
        have = f"rounds {rounds[0]} to {rounds[-1]}" if rounds else "no rounds"
        raise CheckpointError(
            f"checkpoint {checkpoint.path} is after round {checkpoint.server_round}, but "
            f"{rounds_path} records {have} ({len(rounds)} lines): they do not belong to one "
            "run. Restore the run's own files, or start the run again in a new output directory"
        )
    digest = hashlib.sha256("".join(lines).encode()).hexdigest()
    if checkpoint.rounds_sha256 and digest != checkpoint.rounds_sha256:
        raise CheckpointError(
            f"{rounds_path} up to round {checkpoint.server_round} is not what it was when "
            f"checkpoint {checkpoint.path} was written (its SHA-256 differs): it was edited or "
            "replaced. Restore the run's own files, or start the run again in a new output "
            "directory"
        )
