"""``har``: UCI Human Activity Recognition, natively federated with one client per subject."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pflarena.core.datasets.base import DatasetError, DatasetInfo, NaturalDataset
from pflarena.core.datasets.registry import DatasetSpec, register_dataset

__all__ = ["HAR_INFO", "HAR_SIGNALS", "check_har_files", "har_paths", "load_har"]

HAR_INFO = DatasetInfo("har", 6, (9, 1, 128))

HAR_SIGNALS: tuple[str, ...] = (
    "body_acc_x",
    "body_acc_y",
    "body_acc_z",
    "body_gyro_x",
    "body_gyro_y",
    "body_gyro_z",
    "total_acc_x",
    "total_acc_y",
    "total_acc_z",
)

_HAR_ROOT = "UCI HAR Dataset"
_HAR_URL = "https://archive.ics.uci.edu/dataset/240/human+activity+recognition+using+smartphones"


def har_paths(data_dir: str | Path, split: str) -> list[Path]:
    """Files of one UCI HAR split: the 9 inertial signals, then labels and subjects.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        Folder that contains ``UCI HAR Dataset/``.
    split : {"train", "test"}
        Which split.

    Returns
    -------
    list of pathlib.Path
        11 paths.
    """
    base = Path(data_dir) / _HAR_ROOT / split
    signals = [base / "Inertial Signals" / f"{signal}_{split}.txt" for signal in HAR_SIGNALS]
    return [*signals, base / f"y_{split}.txt", base / f"subject_{split}.txt"]


def check_har_files(data_dir: Path) -> None:
    """Raise :class:`DatasetError` naming the missing files unless the UCI HAR tree is complete.

    Parameters
    ----------
    data_dir : pathlib.Path
        Folder that should contain ``UCI HAR Dataset/``.
    """
    expected = har_paths(data_dir, "train") + har_paths(data_dir, "test")
    missing = [str(path) for path in expected if not path.is_file()]
    if missing:
        raise DatasetError(
            f"UCI HAR files not found under {data_dir / _HAR_ROOT}; missing: "
            f"{'; '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
            f"({len(missing)} of {len(expected)}). Download 'UCI HAR Dataset.zip' from "
            f"{_HAR_URL} and unzip it into {data_dir}."
        )


def _read_har_split(data_dir: str | Path, split: str) -> tuple[np.ndarray, ...]:
    """Read one split: ``x`` ``(N, 9, 1, 128)`` float32, labels 0..5, subjects."""
    paths = har_paths(data_dir, split)
    signals = [np.loadtxt(path, dtype=np.float32, ndmin=2) for path in paths[:9]]
    labels = np.loadtxt(paths[9], dtype=np.int64, ndmin=1)
    subjects = np.loadtxt(paths[10], dtype=np.int64, ndmin=1)
    lengths = {len(signal) for signal in signals} | {len(labels), len(subjects)}
    widths = {signal.shape[1] for signal in signals}
    if len(lengths) != 1 or widths != {128}:
        raise DatasetError(
            f"UCI HAR {split} files under {Path(data_dir) / _HAR_ROOT} disagree: expected "
            "the same number of rows everywhere and 128 values per signal row"
        )
    if labels.min() < 1 or labels.max() > 6:
        raise DatasetError(f"{paths[9]}: labels must be 1..6")
    x = np.stack(signals, axis=1)[:, :, None, :]
    return np.ascontiguousarray(x), labels - 1, subjects


def load_har(data_dir: str | Path) -> NaturalDataset:
    """Load UCI HAR as one client per subject (30 subjects in the real data).

    Train and test are concatenated (train first) and grouped by subject; clients are in
    increasing subject order, so for the real data ``client_id == subject - 1``. Samples
    are the 9 raw inertial signals (body_acc xyz, body_gyro xyz, total_acc xyz) of 128
    steps, shaped ``(9, 1, 128)`` as in PFLlib.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        Folder that contains ``UCI HAR Dataset/``.

    Returns
    -------
    NaturalDataset
        One ``(x, y)`` per subject.

    Raises
    ------
    DatasetError
        Files are missing or inconsistent.
    """
    if not str(data_dir):
        raise DatasetError(
            f"dataset 'har' needs data_dir: a folder that contains '{_HAR_ROOT}/' "
            f"(download and unzip it from {_HAR_URL})"
        )
    check_har_files(Path(data_dir))
    try:
        splits = [_read_har_split(data_dir, split) for split in ("train", "test")]
    except ValueError as error:
        if isinstance(error, DatasetError):
            raise
        raise DatasetError(f"cannot parse UCI HAR files under {data_dir}: {error}") from error
    x = np.concatenate([split[0] for split in splits])
    y = np.concatenate([split[1] for split in splits])
    subjects = np.concatenate([split[2] for split in splits])
    clients = [(x[subjects == subject], y[subjects == subject]) for subject in np.unique(subjects)]
    return NaturalDataset(clients=clients, info=HAR_INFO)


def _load_federated(data_dir: str | Path, num_clients: int) -> NaturalDataset:
    """:func:`load_har`, checking that there is one client per subject (``0``: any number)."""
    dataset = load_har(data_dir)
    if num_clients and len(dataset.clients) != num_clients:
        raise DatasetError(
            f"dataset 'har' has one client per subject: {len(dataset.clients)} subjects "
            f"found, but num_clients={num_clients} (the real UCI HAR has 30)"
        )
    return dataset


register_dataset(
    DatasetSpec(
        name="har",
        info=HAR_INFO,
        kind="natural",
        loader=_load_federated,
        reads=("data_dir", "num_clients"),
        default_model="harcnn",
        check=check_har_files,
        source=_HAR_URL,
        layout=f"'{_HAR_ROOT}/' (train/ and test/, each with 'Inertial Signals/', y_*.txt, "
        "subject_*.txt)",
    )
)
