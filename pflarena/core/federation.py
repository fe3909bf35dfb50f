"""Federations: the one entry point from a run config to per-client data, and shard files.

:func:`build_federation` turns a :class:`FederationSpec` (plain values, so it can come
from a Flower run config) into a :class:`Federation`: the data set's
:class:`~pflarena.core.datasets.DatasetInfo` and one :class:`ClientData` (train and test
arrays) per client. Pooled data sets are partitioned by :mod:`pflarena.core.partition`;
natively federated ones (``synthetic``, ``synthetic-mixture``, ``har``) come one share per
client. Each client's share is then split into train and test with a seeded
``train_test_split`` whose seed is derived from ``spec.seed`` and the client id.

:func:`write_shards` writes one ``.npz`` per client (plus ``manifest.json``) for
deployments where each SuperNode holds only its own shard; :func:`load_shard` reads one
back and raises :class:`ShardError` for anything missing or damaged.
"""

from __future__ import annotations

import functools
import json
import zipfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pflarena.core.datasets import (
    DATASETS,
    MIXTURE_LABEL_MODES,
    NATURAL_DATASETS,
    DatasetError,
    DatasetInfo,
    atomic_write,
    check_dataset_name,
    generate_synthetic_mixture,
    load_natural,
    load_pooled,
)
from pflarena.core.partition import (
    PARTITIONS,
    check_partition_name,
    partition_indices,
    train_test_indices,
)

__all__ = [
    "MANIFEST_NAME",
    "SHARD_ARRAYS",
    "SHARD_FORMAT",
    "SHARD_FORMAT_VERSION",
    "ClientData",
    "DatasetError",
    "DatasetInfo",
    "Federation",
    "FederationSpec",
    "ShardError",
    "build_federation",
    "load_client",
    "load_shard",
    "shard_file_name",
    "synthetic_mixture_truth",
    "validate_spec",
    "write_shards",
]

SHARD_FORMAT = "pflarena-shard"
SHARD_FORMAT_VERSION = 1
SHARD_ARRAYS: tuple[str, ...] = ("x_train", "y_train", "x_test", "y_test")
MANIFEST_NAME = "manifest.json"
_METADATA_KEY = "metadata"
_METADATA_FIELDS: tuple[str, ...] = (
    "format",
    "version",
    "dataset",
    "num_classes",
    "input_shape",
    "mean",
    "std",
    "client_id",
)


class ShardError(ValueError):
    """A shard file is missing, unreadable, corrupt, truncated or incomplete.

    The message names the path and what is wrong.
    """


@dataclass(frozen=True)
class FederationSpec:
    """Everything that determines a federation; plain values only.

    Parameters
    ----------
    dataset : str
        One of :data:`~pflarena.core.datasets.DATASETS`.
    num_clients : int
        Number of clients.
    partition : str
        ``"iid"``, ``"dirichlet"``, ``"pathological"``, ``"shards"``,
        ``"pfllib-dirichlet"`` for pooled data sets; ``"natural"`` for natively federated
        ones (``synthetic``, ``synthetic-mixture``, ``har``).
    alpha : float
        Dirichlet concentration (``dirichlet``, ``pfllib-dirichlet``).
    classes_per_client : int
        Classes per client (``pathological``).
    shards_per_client : int
        Shards per client (``shards``).
    test_fraction : float
        Share of each client's samples held out for its test split, in ``[0, 1)``.
    seed : int
        Seed of the partition, the generators and the train/test splits.
    data_dir : str
        Folder of torchvision files / offline copies / UCI HAR; ``""`` = not given.
    synthetic_alpha, synthetic_beta : float
        FedProx Synthetic(α, β) heterogeneity.
    mixture_label_mode : str
        ``synthetic-mixture`` labels: ``"fixed"`` or ``"faithful"`` (reproduces the
        reference generator's ``current_index`` bug).
    """

    dataset: str
    num_clients: int
    partition: str = "dirichlet"
    alpha: float = 0.5
    classes_per_client: int = 2
    shards_per_client: int = 2
    test_fraction: float = 0.25
    seed: int = 0
    data_dir: str = ""
    synthetic_alpha: float = 0.5
    synthetic_beta: float = 0.5
    mixture_label_mode: str = "fixed"


@dataclass
class ClientData:
    """One client's data.

    Parameters
    ----------
    client_id : int
        Index of the client in its federation.
    x_train, y_train : numpy.ndarray
        Training samples and ``int64`` labels.
    x_test, y_test : numpy.ndarray
        Test samples and ``int64`` labels.
    """

    client_id: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


@dataclass
class Federation:
    """All clients' data.

    Parameters
    ----------
    info : DatasetInfo
        Description of the data set.
    clients : list of ClientData
        ``len(clients) == num_clients`` and ``clients[i].client_id == i``.
    """

    info: DatasetInfo
    clients: list[ClientData]


# --------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise DatasetError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_number(name: str, value: Any, *, allow_zero: bool = False) -> None:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not (value >= 0 if allow_zero else value > 0):
        bound = "a number >= 0" if allow_zero else "a positive number"
        raise DatasetError(f"{name} must be {bound}, got {value!r}")


def validate_spec(spec: FederationSpec) -> None:
    """Check a spec's names and ranges; raise :class:`DatasetError` naming the problem.

    Parameters
    ----------
    spec : FederationSpec
        The spec to check.
    """
    check_dataset_name(spec.dataset)
    check_partition_name(spec.partition)
    _check_int("num_clients", spec.num_clients, 1)
    _check_int("classes_per_client", spec.classes_per_client, 1)
    _check_int("shards_per_client", spec.shards_per_client, 1)
    _check_int("seed", spec.seed, 0)
    _check_number("alpha", spec.alpha)
    _check_number("synthetic_alpha", spec.synthetic_alpha, allow_zero=True)  # Synthetic(0, 0)
    _check_number("synthetic_beta", spec.synthetic_beta, allow_zero=True)
    if isinstance(spec.test_fraction, bool) or not 0.0 <= spec.test_fraction < 1.0:
        raise DatasetError(f"test_fraction must be in [0, 1), got {spec.test_fraction!r}")
    if spec.mixture_label_mode not in MIXTURE_LABEL_MODES:
        raise DatasetError(
            f"unknown mixture_label_mode {spec.mixture_label_mode!r}; allowed: "
            f"{', '.join(MIXTURE_LABEL_MODES)}"
        )
    natural = spec.dataset in NATURAL_DATASETS
    if natural and spec.partition != "natural":
        raise DatasetError(
            f"dataset {spec.dataset!r} is natively federated: partition must be 'natural', "
            f"got {spec.partition!r}"
        )
    if not natural and spec.partition == "natural":
        pooled_partitions = [name for name in PARTITIONS if name != "natural"]
        raise DatasetError(
            f"partition 'natural' only applies to {', '.join(NATURAL_DATASETS)}; for "
            f"{spec.dataset!r} use one of: {', '.join(pooled_partitions)}"
        )


def _client_shares(spec: FederationSpec) -> tuple[DatasetInfo, list[tuple[np.ndarray, ...]]]:
    """Each client's samples and labels before the train/test split."""
    if spec.dataset in NATURAL_DATASETS:
        natural = load_natural(
            spec.dataset,
            spec.num_clients,
            seed=spec.seed,
            data_dir=spec.data_dir,
            synthetic_alpha=spec.synthetic_alpha,
            synthetic_beta=spec.synthetic_beta,
            mixture_label_mode=spec.mixture_label_mode,
        )
        return natural.info, [(x, y, np.arange(len(y))) for x, y in natural.clients]
    pooled = load_pooled(spec.dataset, spec.data_dir)
    parts = partition_indices(
        pooled.y,
        spec.num_clients,
        spec.partition,
        seed=spec.seed,
        alpha=spec.alpha,
        classes_per_client=spec.classes_per_client,
        shards_per_client=spec.shards_per_client,
        num_classes=pooled.info.num_classes,
    )
    return pooled.info, [(pooled.x, pooled.y, indices) for indices in parts]


@functools.lru_cache(maxsize=4)
def build_federation(spec: FederationSpec) -> Federation:
    """Build every client's train and test data for a spec.

    Deterministic for a given spec, and memoised for the last four specs in this process
    (the returned arrays are shared between callers: do not modify them in place;
    ``build_federation.cache_clear()`` empties the cache).

    Parameters
    ----------
    spec : FederationSpec
        What to build.

    Returns
    -------
    Federation
        ``spec.num_clients`` clients, each split ``1 - test_fraction`` / ``test_fraction``.

    Raises
    ------
    DatasetError
        Unknown names, missing files, impossible partitions, clients too small to split.
    """
    validate_spec(spec)
    info, shares = _client_shares(spec)
    clients = []
    for client_id, (x, y, indices) in enumerate(shares):
        train, test = train_test_indices(len(indices), spec.test_fraction, spec.seed, client_id)
        train_rows, test_rows = indices[train], indices[test]
        clients.append(
            ClientData(
                client_id=client_id,
                x_train=x[train_rows],
                y_train=np.asarray(y[train_rows], dtype=np.int64),
                x_test=x[test_rows],
                y_test=np.asarray(y[test_rows], dtype=np.int64),
            )
        )
    return Federation(info=info, clients=clients)


def load_client(spec: FederationSpec, client_id: int) -> tuple[ClientData, DatasetInfo]:
    """One client's data from the (memoised) federation of a spec.

    Parameters
    ----------
    spec : FederationSpec
        The federation.
    client_id : int
        ``0 .. spec.num_clients - 1``.

    Returns
    -------
    client : ClientData
        The client's arrays.
    info : DatasetInfo
        Description of the data set.
    """
    federation = build_federation(spec)
    if not 0 <= client_id < len(federation.clients):
        raise DatasetError(
            f"client_id {client_id} out of range for {len(federation.clients)} clients"
        )
    return federation.clients[client_id], federation.info


def synthetic_mixture_truth(spec: FederationSpec) -> tuple[np.ndarray, np.ndarray]:
    """Ground truth of a ``synthetic-mixture`` federation, for recovery tests.

    Parameters
    ----------
    spec : FederationSpec
        A spec with ``dataset="synthetic-mixture"``.

    Returns
    -------
    components : numpy.ndarray
        θ*, ``(K, d)``.
    memberships : numpy.ndarray
        α, ``(num_clients, K)``; row i is client i's mixture weights.
    """
    if spec.dataset != "synthetic-mixture":
        raise DatasetError(
            f"synthetic_mixture_truth needs dataset 'synthetic-mixture', got {spec.dataset!r}"
        )
    _check_int("num_clients", spec.num_clients, 1)
    mixture = generate_synthetic_mixture(spec.num_clients, spec.seed, truth_only=True)
    return mixture.components, mixture.mixture_weights


# --------------------------------------------------------------------------------------
# Shard files
# --------------------------------------------------------------------------------------


def shard_file_name(client_id: int) -> str:
    """File name of a client's shard, e.g. ``client_0007.npz``.

    Parameters
    ----------
    client_id : int
        Client id.

    Returns
    -------
    str
        The file name.
    """
    return f"client_{client_id:04d}.npz"


def _shard_metadata(info: DatasetInfo, client_id: int) -> dict[str, Any]:
    return {
        "format": SHARD_FORMAT,
        "version": SHARD_FORMAT_VERSION,
        "dataset": info.name,
        "num_classes": info.num_classes,
        "input_shape": list(info.input_shape),
        "mean": None if info.mean is None else list(info.mean),
        "std": None if info.std is None else list(info.std),
        "client_id": client_id,
    }


def write_shards(
    federation: Federation, out_dir: str | Path, spec: FederationSpec | None = None
) -> list[Path]:
    """Write one shard file per client and a ``manifest.json``.

    Each ``client_NNNN.npz`` holds ``x_train``, ``y_train``, ``x_test``, ``y_test`` and a
    ``metadata`` array with one JSON string (data set name, classes, input shape,
    normalisation, client id, format version). Files are written to a temporary name and
    renamed, so a crash never leaves a half-written shard.

    Parameters
    ----------
    federation : Federation
        What to write.
    out_dir : str or pathlib.Path
        Output folder (created if needed).
    spec : FederationSpec, optional
        Recorded in the manifest when given.

    Returns
    -------
    list of pathlib.Path
        The shard files, in client order (the manifest is ``out_dir / "manifest.json"``).
    """
    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    paths = []
    for client in federation.clients:
        path = out_path / shard_file_name(client.client_id)
        metadata = json.dumps(_shard_metadata(federation.info, client.client_id))
        arrays = {name: np.asarray(getattr(client, name)) for name in SHARD_ARRAYS}
        arrays[_METADATA_KEY] = np.array([metadata])
        atomic_write(path, lambda stream, arrays=arrays: np.savez(stream, **arrays))
        paths.append(path)
    manifest = {
        "format": SHARD_FORMAT,
        "version": SHARD_FORMAT_VERSION,
        "dataset": federation.info.name,
        "num_clients": len(federation.clients),
        "info": asdict(federation.info),
        "spec": None if spec is None else asdict(spec),
        "shards": [
            {
                "client_id": client.client_id,
                "file": path.name,
                "num_train": len(client.y_train),
                "num_test": len(client.y_test),
            }
            for client, path in zip(federation.clients, paths, strict=True)
        ],
    }
    text = json.dumps(manifest, indent=2).encode()
    atomic_write(out_path / MANIFEST_NAME, lambda stream: stream.write(text))
    return paths


def _read_shard_arrays(path: Path) -> dict[str, np.ndarray]:
    """Read every array of a shard file, raising :class:`ShardError` on any damage."""
    if not path.exists():
        raise ShardError(f"shard file not found: {path}")
    if not path.is_file():
        raise ShardError(f"shard path is not a file: {path}")
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ShardError(f"shard file {path} is a single .npy array, not an .npz archive")
        with archive:
            missing = [name for name in (*SHARD_ARRAYS, _METADATA_KEY) if name not in archive]
            if missing:
                raise ShardError(f"shard file {path} lacks array(s): {', '.join(missing)}")
            return {name: np.asarray(archive[name]) for name in (*SHARD_ARRAYS, _METADATA_KEY)}
    except ShardError:
        raise
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, KeyError) as error:
        raise ShardError(
            f"shard file {path} is unreadable, corrupt or truncated: "
            f"{type(error).__name__}: {error}"
        ) from error


def _parse_metadata(path: Path, raw: np.ndarray) -> dict[str, Any]:
    """Decode and check the JSON metadata of a shard."""
    try:
        metadata = json.loads(str(raw.reshape(-1)[0]))
    except (IndexError, ValueError) as error:
        raise ShardError(f"shard file {path} has unreadable metadata: {error}") from error
    if not isinstance(metadata, dict):
        raise ShardError(f"shard file {path} has metadata that is not a JSON object")
    missing = [field for field in _METADATA_FIELDS if field not in metadata]
    if missing:
        raise ShardError(f"shard file {path} metadata lacks: {', '.join(missing)}")
    if metadata["format"] != SHARD_FORMAT or metadata["version"] != SHARD_FORMAT_VERSION:
        raise ShardError(
            f"shard file {path} has format {metadata['format']!r} version "
            f"{metadata['version']!r}; this version reads {SHARD_FORMAT!r} version "
            f"{SHARD_FORMAT_VERSION}"
        )
    if metadata["dataset"] not in DATASETS:
        raise ShardError(f"shard file {path} names an unknown dataset {metadata['dataset']!r}")
    return metadata


def _check_shard_shapes(path: Path, arrays: dict[str, np.ndarray], info: DatasetInfo) -> None:
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if y.ndim != 1 or len(x) != len(y):
            raise ShardError(
                f"shard file {path}: x_{split} has {len(x)} rows but y_{split} has shape {y.shape}"
            )
        if tuple(x.shape[1:]) != info.input_shape:
            raise ShardError(
                f"shard file {path}: x_{split} samples have shape {tuple(x.shape[1:])}, "
                f"metadata says {info.input_shape}"
            )


def load_shard(path: str | Path) -> tuple[ClientData, DatasetInfo]:
    """Read one client's shard file written by :func:`write_shards`.

    Parameters
    ----------
    path : str or pathlib.Path
        Path of a ``client_NNNN.npz`` file.

    Returns
    -------
    client : ClientData
        The client's arrays.
    info : DatasetInfo
        Description of the data set.

    Raises
    ------
    ShardError
        The file is missing, not a shard, corrupt or truncated, or lacks arrays or
        metadata; the message names the path.
    """
    shard_path = Path(path)
    arrays = _read_shard_arrays(shard_path)
    metadata = _parse_metadata(shard_path, arrays[_METADATA_KEY])
    try:
        info = DatasetInfo(
            name=str(metadata["dataset"]),
            num_classes=int(metadata["num_classes"]),
            input_shape=tuple(int(size) for size in metadata["input_shape"]),
            mean=None if metadata["mean"] is None else tuple(map(float, metadata["mean"])),
            std=None if metadata["std"] is None else tuple(map(float, metadata["std"])),
        )
        client_id = int(metadata["client_id"])
    except (TypeError, ValueError) as error:
        raise ShardError(f"shard file {shard_path} has malformed metadata: {error}") from error
    _check_shard_shapes(shard_path, arrays, info)
    client = ClientData(
        client_id=client_id,
        x_train=arrays["x_train"],
        y_train=arrays["y_train"].astype(np.int64, copy=False),
        x_test=arrays["x_test"],
        y_test=arrays["y_test"].astype(np.int64, copy=False),
    )
    return client, info
