"""Server checkpoints: what a run needs to continue after a crash, in one atomic file.

``<output-dir>/checkpoint.npz`` holds the round number, the server's arrays (the global
model), the strategy's own state (its arrays and a JSON part: the sampler's RNG state, the
client ids of the nodes, the update each client last had accepted, and whatever the method
keeps, e.g. pFedGT's c). It is replaced atomically after every ``checkpoint-every`` rounds,
after that round's ``rounds.jsonl`` line, so it never runs ahead of the results.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from pflarena.strategies.base import PflStrategy

__all__ = ["CHECKPOINT_NAME", "Checkpoint", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_NAME = "checkpoint.npz"
_FORMAT = "pflarena-checkpoint/1"


@dataclass
class Checkpoint:
    server_round: int
    arrays: ArrayRecord
    strategy_arrays: dict[str, np.ndarray]
    strategy_meta: dict[str, Any]


def save_checkpoint(
    output_dir: Path, server_round: int, arrays: ArrayRecord, strategy: PflStrategy
) -> Path:
    """Write the checkpoint after ``server_round`` (atomically: a temporary file, then rename)."""
    strategy_arrays, meta = strategy.checkpoint_state()
    contents: dict[str, np.ndarray] = {f"global/{k}": v.numpy() for k, v in arrays.items()}
    contents |= {f"strategy/{k}": v for k, v in strategy_arrays.items()}
    header = {"format": _FORMAT, "round": server_round, "method": strategy.method, "meta": meta}
    contents["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    path = output_dir / CHECKPOINT_NAME
    tmp = path.with_name(f".{CHECKPOINT_NAME}.tmp")
    with open(tmp, "wb") as handle:
        np.savez(handle, **contents)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(output_dir: Path, method: str) -> Checkpoint | None:
    """The run's checkpoint, or None when it has none; a damaged one raises naming the file."""
    path = output_dir / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data["header"]).decode())
            arrays = ArrayRecord(
                {k[len("global/") :]: Array(data[k]) for k in data.files if k.startswith("global/")}
            )
            strategy_arrays = {
                k[len("strategy/") :]: data[k] for k in data.files if k.startswith("strategy/")
            }
    except (OSError, ValueError, KeyError) as exc:
        raise RuntimeError(f"checkpoint {path} is unreadable: {exc}") from exc
    if header.get("format") != _FORMAT or header.get("method") != method:
        raise RuntimeError(
            f"checkpoint {path} is for {header.get('method')!r} ({header.get('format')}), "
            f"not this run's {method!r}"
        )
    return Checkpoint(int(header["round"]), arrays, strategy_arrays, header["meta"])
