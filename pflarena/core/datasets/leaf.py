"""The LEAF benchmark's on-disk format, shared by ``shakespeare`` and ``femnist``.

LEAF (Caldas et al., 2018, https://github.com/TalwalkarLab/leaf) stores a data set as JSON
files under ``<leaf>/data/<name>/data/``. Each file is one object with

* ``users``: a list of user names,
* ``num_samples``: the number of samples of each user, in the same order,
* ``user_data``: for each user name, ``{"x": [...], "y": [...]}`` (one entry per sample),
* optionally ``hierarchies`` (Shakespeare: the play of each role), which is not used.

LEAF's ``preprocess.sh`` writes the whole data set to ``all_data/`` and, after its
optional sampling and user filter, a per-user train/test split to ``train/`` and
``test/``. The loaders here read either: the split output when both ``train/`` and
``test/`` hold JSON files (a user's samples are its training samples then its test
samples), else ``all_data/``. Decoded arrays are cached once per set of files under
:func:`~pflarena.core.datasets.io.cache_dir`.

Users become clients the LEAF way (:func:`choose_clients`): users with ``min_samples`` or
fewer samples are dropped (LEAF's ``remove_users.py -k``, which keeps users with *more*
than k), as are users with fewer than 2 samples, which LEAF's ``split_data.py`` drops
because they cannot be split; then ``num_clients`` of the eligible users are chosen, all
of them when there are exactly as many, else a seeded uniform sample. Each client's
train/test split is the federation's seeded per-client split
(:func:`~pflarena.core.partition.train_test_indices`), which draws LEAF's
``split_data.py --by_sample`` split: a uniformly random subset of ``int(frac · n)``
training samples, the ``ceil((1 - frac) · n)`` others for testing, with
``test_fraction = 1 - frac`` (LEAF's papers use ``frac = 0.8``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pflarena.core.datasets.base import DatasetError, DatasetInfo, NaturalDataset, counted
from pflarena.core.datasets.io import atomic_savez, cache_dir

__all__ = [
    "LEAF_KEYS",
    "LEAF_URL",
    "LeafUsers",
    "check_leaf_files",
    "choose_clients",
    "leaf_data_root",
    "leaf_json_files",
    "leaf_layout",
    "load_leaf_users",
    "read_leaf_json",
]

LEAF_URL = "https://github.com/TalwalkarLab/leaf"
#: The keys every LEAF JSON file has.
LEAF_KEYS: tuple[str, ...] = ("users", "num_samples", "user_data")
#: Spawn-key tag of the stream that chooses users (apart from every split's stream).
_USER_CHOICE_STREAM = 11

#: ``decode(xs, ys, where) -> (x, y, problems)``: one user's samples as arrays, ``where``
#: naming the file and user for errors; ``problems`` counts repaired values.
Decoder = Callable[[list[Any], list[Any], str], tuple[np.ndarray, np.ndarray, int]]


def leaf_data_root(data_dir: str | Path, name: str) -> Path:
    """``<data_dir>/<name>/data``, where LEAF's ``preprocess.sh`` writes its JSON folders.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        LEAF's ``data/`` folder (or any folder holding ``<name>/data/``).
    name : str
        LEAF's name of the data set (``"shakespeare"``, ``"femnist"``).

    Returns
    -------
    pathlib.Path
        The folder holding ``all_data/`` or ``train/`` and ``test/``.
    """
    return Path(data_dir) / name / "data"


def leaf_layout(name: str) -> str:
    """The layout a LEAF loader expects under ``data_dir``, in one line, for messages."""
    return (
        f"{name}/data/train/*.json and {name}/data/test/*.json (LEAF's split output) or "
        f"{name}/data/all_data/*.json, each a JSON object with {', '.join(LEAF_KEYS)}"
    )


def _json_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("*.json") if path.is_file())


def leaf_json_files(data_dir: str | Path, name: str) -> tuple[str, list[Path]]:
    """The JSON files a LEAF data set is read from, and which layout they are.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        LEAF's ``data/`` folder.
    name : str
        LEAF's name of the data set.

    Returns
    -------
    layout : {"split", "all_data"}
        ``"split"``: ``train/`` and ``test/`` (train files first); ``"all_data"``: the
        whole data set.
    files : list of pathlib.Path
        The files, sorted by name within each folder.

    Raises
    ------
    DatasetError
        Neither layout is there, or only one of ``train/`` and ``test/``; the message
        names the folder and the layout expected.
    """
    root = leaf_data_root(data_dir, name)
    train, test = _json_files(root / "train"), _json_files(root / "test")
    if train and test:
        return "split", train + test
    if train or test:
        present, absent = ("train", "test") if train else ("test", "train")
        raise DatasetError(
            f"{root / present} holds LEAF JSON files but {root / absent} holds none; "
            f"expected {leaf_layout(name)}"
        )
    everything = _json_files(root / "all_data")
    if everything:
        return "all_data", everything
    raise DatasetError(
        f"no LEAF {name} JSON files under {root}; expected {leaf_layout(name)}. Nothing is "
        f"downloaded: run LEAF's data/{name}/preprocess.sh ({LEAF_URL}) and pass its "
        "data/ folder as data-dir"
    )


def check_leaf_files(name: str, data_dir: Path) -> None:
    """Raise :class:`DatasetError` unless a LEAF data set's JSON files are there.

    Parameters
    ----------
    name : str
        LEAF's name of the data set.
    data_dir : pathlib.Path
        LEAF's ``data/`` folder.
    """
    leaf_json_files(data_dir, name)


def read_leaf_json(path: Path, decode: Decoder) -> list[tuple[str, np.ndarray, np.ndarray, int]]:
    """Read one LEAF JSON file and decode every user's samples.

    Parameters
    ----------
    path : pathlib.Path
        The file.
    decode : callable
        Turns one user's ``x`` and ``y`` lists into arrays (see :data:`Decoder`).

    Returns
    -------
    list of (str, numpy.ndarray, numpy.ndarray, int)
        ``(user, x, y, repaired)`` in the file's user order.

    Raises
    ------
    DatasetError
        The file is not JSON, lacks a key, or its lists disagree (``users`` and
        ``num_samples`` lengths, a user without data, ``x`` and ``y`` lengths, a count
        that differs from ``num_samples``); the message names the path and the layout.
    """
    expected = f"a JSON object with {', '.join(LEAF_KEYS)}"
    try:
        with open(path, encoding="utf-8") as stream:
            content = json.load(stream)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DatasetError(
            f"cannot read LEAF file {path} ({error}); expected {expected}"
        ) from error
    if not isinstance(content, dict) or any(key not in content for key in LEAF_KEYS):
        found = sorted(content) if isinstance(content, dict) else type(content).__name__
        raise DatasetError(f"LEAF file {path}: expected {expected}, found {found}")
    users, counts, data = content["users"], content["num_samples"], content["user_data"]
    if not (isinstance(users, list) and isinstance(counts, list) and isinstance(data, dict)):
        raise DatasetError(
            f"LEAF file {path}: 'users' and 'num_samples' must be lists and 'user_data' an object"
        )
    if len(users) != len(counts):
        raise DatasetError(
            f"LEAF file {path}: {counted(len(users), 'user')} but "
            f"{counted(len(counts), 'entry', 'entries')} in 'num_samples'"
        )
    decoded = []
    for user, count in zip(users, counts, strict=True):
        samples = data.get(user)
        if not isinstance(samples, dict) or "x" not in samples or "y" not in samples:
            raise DatasetError(
                f"LEAF file {path}: user {user!r} has no 'x' and 'y' under 'user_data'"
            )
        xs, ys = samples["x"], samples["y"]
        if not isinstance(xs, list) or not isinstance(ys, list) or len(xs) != len(ys):
            raise DatasetError(
                f"LEAF file {path}: user {user!r} needs lists 'x' and 'y' of equal length"
            )
        if len(ys) != count:
            raise DatasetError(
                f"LEAF file {path}: user {user!r} has {counted(len(ys), 'sample')}, "
                f"'num_samples' says {count}"
            )
        x, y, repaired = decode(xs, ys, f"LEAF file {path}, user {user!r}")
        decoded.append((str(user), x, y, repaired))
    return decoded


@dataclass(frozen=True)
class LeafUsers:
    """Every user of a LEAF data set, decoded.

    Parameters
    ----------
    names : tuple of str
        User names, sorted.
    counts : numpy.ndarray
        Samples per user, ``int64``.
    x, y : numpy.ndarray
        All samples and ``int64`` labels, user after user in ``names`` order.
    repaired : int
        Values the decoder repaired (Shakespeare: characters outside the vocabulary).
    layout : str
        ``"split"`` or ``"all_data"`` (see :func:`leaf_json_files`).
    """

    names: tuple[str, ...]
    counts: np.ndarray
    x: np.ndarray
    y: np.ndarray
    repaired: int
    layout: str

    def user(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Samples and labels of user ``index`` (views)."""
        start = int(self.counts[:index].sum())
        stop = start + int(self.counts[index])
        return self.x[start:stop], self.y[start:stop]


def _cache_key(files: list[Path], version: str) -> str:
    digest = hashlib.sha256(version.encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def load_leaf_users(
    data_dir: str | Path,
    name: str,
    decode: Decoder,
    *,
    sample_shape: tuple[int, ...],
    sample_dtype: type,
    decoder_version: str,
    cache: str | Path | None = None,
) -> LeafUsers:
    """Read (or take from the cache) every user of a LEAF data set.

    A user listed in several files (the ``train/`` and ``test/`` halves of LEAF's split)
    gets its samples from each, in file order: training samples first.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        LEAF's ``data/`` folder.
    name : str
        LEAF's name of the data set.
    decode : callable
        One user's decoder (see :data:`Decoder`).
    sample_shape : tuple of int
        Shape of one decoded sample (for an empty data set).
    sample_dtype : type
        dtype of the decoded samples.
    decoder_version : str
        Part of the cache key: change it when the decoding changes.
    cache : str or pathlib.Path, optional
        Cache folder; default :func:`~pflarena.core.datasets.io.cache_dir`.

    Returns
    -------
    LeafUsers
        Every user with at least one sample, sorted by name.

    Raises
    ------
    DatasetError
        Files missing or malformed (the message names the path and the layout).
    """
    layout, files = leaf_json_files(data_dir, name)
    cache_path = Path(cache) if cache is not None else cache_dir()
    cached = cache_path / f"leaf-{name}-{_cache_key(files, decoder_version)}.npz"
    if cached.is_file():
        try:
            with np.load(cached, allow_pickle=False) as archive:
                return LeafUsers(
                    names=tuple(str(user) for user in archive["names"]),
                    counts=np.asarray(archive["counts"]),
                    x=np.asarray(archive["x"]),
                    y=np.asarray(archive["y"]),
                    repaired=int(archive["repaired"]),
                    layout=layout,
                )
        except (KeyError, ValueError, OSError, EOFError):
            pass  # a damaged cache entry is rebuilt below
    pieces: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    repaired = 0
    for path in files:
        for user, x, y, fixes in read_leaf_json(path, decode):
            pieces.setdefault(user, []).append((x, y))
            repaired += fixes
    names = tuple(sorted(user for user, parts in pieces.items() if sum(len(p[1]) for p in parts)))
    xs = [x for user in names for x, _ in pieces[user]]
    ys = [y for user in names for _, y in pieces[user]]
    users = LeafUsers(
        names=names,
        counts=np.array([sum(len(y) for _, y in pieces[user]) for user in names], dtype=np.int64),
        x=np.concatenate(xs) if xs else np.zeros((0, *sample_shape), dtype=sample_dtype),
        y=np.concatenate(ys).astype(np.int64) if ys else np.zeros(0, dtype=np.int64),
        repaired=repaired,
        layout=layout,
    )
    cache_path.mkdir(parents=True, exist_ok=True)
    atomic_savez(
        cached,
        names=np.array(names, dtype=str),
        counts=users.counts,
        x=users.x,
        y=users.y,
        repaired=np.array(repaired),
    )
    return users


def choose_clients(
    users: LeafUsers,
    info: DatasetInfo,
    num_clients: int,
    min_samples: int,
    seed: int,
) -> NaturalDataset:
    """LEAF's user filter, then ``num_clients`` of the eligible users as clients.

    Parameters
    ----------
    users : LeafUsers
        Every user.
    info : DatasetInfo
        The data set's description.
    num_clients : int
        Clients wanted; ``0`` for every eligible user.
    min_samples : int
        Users with this many samples or fewer are dropped (LEAF's ``-k``); users with
        fewer than 2 are always dropped (no train/test split is possible).
    seed : int
        Seed of the uniform choice among eligible users (used only when there are more
        eligible users than clients).

    Returns
    -------
    NaturalDataset
        One ``(x, y)`` per chosen user, in user-name order.

    Raises
    ------
    DatasetError
        Fewer eligible users than ``num_clients`` (the message gives both counts).
    """
    eligible = np.flatnonzero((users.counts > min_samples) & (users.counts >= 2))
    if num_clients > len(eligible):
        raise DatasetError(
            f"dataset {info.name!r} has {counted(len(eligible), 'user')} with more than "
            f"{counted(max(min_samples, 1), 'sample')} (of {counted(len(users.names), 'user')}), "
            f"fewer than num_clients={num_clients}; use at most "
            f"{counted(len(eligible), 'client')} or a smaller "
            "min-client-samples"
        )
    chosen = eligible
    if 0 < num_clients < len(eligible):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_USER_CHOICE_STREAM,)))
        chosen = np.sort(rng.choice(eligible, size=num_clients, replace=False))
    return NaturalDataset(clients=[users.user(int(index)) for index in chosen], info=info)
