"""``shakespeare``: LEAF's next-character prediction, one client per speaking role.

Each sample is an 80-character window of a role's lines and its target the character that
follows (LEAF's ``shake_utils.py`` slides the window one character at a time over each
line, padded on the left with 80 spaces). Characters are ids into LEAF's 80-character
vocabulary (:data:`SHAKESPEARE_VOCABULARY`, ``models/utils/language_utils.py``), so a
model reads ``(80,)`` integer windows and predicts one of 80 classes: accuracy is counted
per predicted character, as in the LEAF and FedAvg papers. The LEAF format, the user
filter and the per-role train/test split are :mod:`pflarena.core.datasets.leaf`'s.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from pflarena.core.datasets.base import DatasetError, DatasetInfo, NaturalDataset
from pflarena.core.datasets.leaf import (
    LEAF_URL,
    check_leaf_files,
    choose_clients,
    leaf_layout,
    load_leaf_users,
)
from pflarena.core.datasets.registry import DatasetSpec, register_dataset

__all__ = [
    "SHAKESPEARE_INFO",
    "SHAKESPEARE_SEQUENCE_LENGTH",
    "SHAKESPEARE_VOCABULARY",
    "decode_characters",
    "encode_text",
    "load_shakespeare",
]

#: LEAF's character set, in LEAF's order: a character's id is its position.
SHAKESPEARE_VOCABULARY = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
#: Characters per input window.
SHAKESPEARE_SEQUENCE_LENGTH = 80
#: What a character outside the vocabulary becomes: LEAF's "unknown character symbol".
_UNKNOWN = SHAKESPEARE_VOCABULARY.index(" ")

SHAKESPEARE_INFO = DatasetInfo(
    "shakespeare",
    len(SHAKESPEARE_VOCABULARY),
    (SHAKESPEARE_SEQUENCE_LENGTH,),
    vocabulary_size=len(SHAKESPEARE_VOCABULARY),
)

_CODES = np.array([ord(character) for character in SHAKESPEARE_VOCABULARY], dtype=np.int64)


def encode_text(text: str) -> tuple[np.ndarray, int]:
    """Character ids of ``text`` in LEAF's vocabulary.

    Parameters
    ----------
    text : str
        Any text.

    Returns
    -------
    ids : numpy.ndarray
        ``uint8`` ids, one per character; a character outside the vocabulary becomes the
        space, LEAF's unknown-character symbol.
    unknown : int
        How many characters were outside the vocabulary.
    """
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
    table = np.full(max(int(codes.max(initial=0)), int(_CODES.max())) + 1, -1, dtype=np.int64)
    table[_CODES] = np.arange(len(_CODES))
    ids = table[codes]
    unknown = ids < 0
    ids[unknown] = _UNKNOWN
    return ids.astype(np.uint8), int(unknown.sum())


def decode_characters(ids: np.ndarray) -> str:
    """The text of character ids (the inverse of :func:`encode_text` within the vocabulary)."""
    return "".join(SHAKESPEARE_VOCABULARY[int(i)] for i in np.asarray(ids).reshape(-1))


def _decode_user(xs: list[Any], ys: list[Any], where: str) -> tuple[np.ndarray, np.ndarray, int]:
    """One role's windows ``(n, 80)`` and next characters ``(n,)`` as ids."""
    length = SHAKESPEARE_SEQUENCE_LENGTH
    for index, (window, target) in enumerate(zip(xs, ys, strict=True)):
        if not (isinstance(window, str) and len(window) == length):
            raise DatasetError(
                f"{where}: sample {index} 'x' must be a string of {length} characters, got "
                f"{type(window).__name__} of length {len(window) if hasattr(window, '__len__') else '?'}"
            )
        if not (isinstance(target, str) and len(target) == 1):
            raise DatasetError(f"{where}: sample {index} 'y' must be one character, got {target!r}")
    windows, unknown_windows = encode_text("".join(xs))
    targets, unknown_targets = encode_text("".join(ys))
    return windows.reshape(len(xs), length), targets, unknown_windows + unknown_targets


def load_shakespeare(
    data_dir: str | Path,
    num_clients: int,
    min_client_samples: int = 0,
    seed: int = 0,
    cache: str | Path | None = None,
) -> NaturalDataset:
    """Load LEAF Shakespeare as one client per speaking role.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        LEAF's ``data/`` folder: the files are under ``shakespeare/data/``.
    num_clients : int
        Roles to use as clients (all eligible roles, or a seeded sample of them); ``0`` for every eligible one.
    min_client_samples : int
        Roles with this many samples or fewer are dropped (LEAF's ``-k``; PAGE keeps
        roles with more than 8 000).
    seed : int
        Seed of the choice of roles.
    cache : str or pathlib.Path, optional
        Cache folder for the decoded arrays.

    Returns
    -------
    NaturalDataset
        One ``(x, y)`` per role: ``uint8`` windows ``(n, 80)`` and ``int64`` next
        characters ``(n,)``, ids into :data:`SHAKESPEARE_VOCABULARY`.

    Raises
    ------
    DatasetError
        Files missing or malformed, or fewer eligible roles than clients.
    """
    users = load_leaf_users(
        data_dir,
        "shakespeare",
        _decode_user,
        sample_shape=(SHAKESPEARE_SEQUENCE_LENGTH,),
        sample_dtype=np.uint8,
        decoder_version="shakespeare-1",
        cache=cache,
    )
    return choose_clients(users, SHAKESPEARE_INFO, num_clients, min_client_samples, seed)


register_dataset(
    DatasetSpec(
        name="shakespeare",
        info=SHAKESPEARE_INFO,
        kind="natural",
        loader=load_shakespeare,
        reads=("data_dir", "num_clients", "min_client_samples", "seed"),
        default_model="char-lstm",
        check=functools.partial(check_leaf_files, "shakespeare"),
        source=f"LEAF ({LEAF_URL}): data/shakespeare/preprocess.sh, e.g. "
        "'./preprocess.sh -s niid --sf 1.0 -k 0 -t sample -tf 0.8'",
        layout=leaf_layout("shakespeare"),
    )
)
