"""Data partitioned by other toolkits, converted to shard files (``pflarena shards import``).

The clients, their samples and their train/test split stay exactly as the toolkit made them;
the result is a shard directory (:mod:`pflarena.core.shard_format`) that runs in simulation
(``--shards-dir``) and in deployment (one file per SuperNode).

**PFLlib** (Zhang et al., https://github.com/TsingZ0/PFLlib) writes a dataset folder with
``config.json`` (``num_clients``, ``num_classes``, ...) and ``train/<i>.npz`` and
``test/<i>.npz`` per client ``i``; its ``save_file`` stores each as
``np.savez_compressed(f, data={"x": x, "y": y})``, a pickled dict. Files holding ``x`` and
``y`` as plain arrays are read too. Inputs stay as PFLlib stored them (images already
normalised to floats by its generators; shards keep them, with no normalisation of ours).
Older PFLlib generators wrote no ``num_classes`` (the MNIST partition in PFLlib's repository
has none): the class count is then the largest label plus one, and the manifest says so
(``"import": {"num_classes_source": "inferred"}``); an explicit ``num_classes`` must agree
with ``config.json``'s when both are given, and every label must lie below it.

**LEAF** (Caldas et al., https://github.com/TalwalkarLab/leaf) writes JSON files with
``users``, ``num_samples`` and ``user_data`` (``{user: {"x": [...], "y": [...]}}``) under
``train/`` and ``test/`` (its ``preprocess.sh`` split). Each user is a client, in the
order the train files (sorted by name) list them. FEMNIST samples are 784 floats (a 28x28
image), 62 classes; Shakespeare samples are 80-character strings whose next character is
the label, turned into indices of LEAF's 80-letter alphabet (its ``word_to_indices`` and
``letter_to_index``).
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from pflarena.core.datasets import DatasetError, DatasetInfo
from pflarena.core.federation import ClientData, Federation
from pflarena.core.partition import validation_indices
from pflarena.core.shard_format import write_shards

__all__ = [
    "IMPORT_FORMATS",
    "LEAF_LETTERS",
    "MAX_CLASSES",
    "ImportFormatError",
    "import_leaf",
    "import_pfllib",
    "read_pfllib_npz",
]

#: The most classes an import accepts: a model's output layer has one unit per class, so a
#: garbled ``num_classes`` would otherwise build a model that cannot fit in memory.
MAX_CLASSES = 100_000

#: The layouts ``pflarena shards import --format`` reads.
IMPORT_FORMATS: tuple[str, ...] = ("pfllib", "leaf-femnist", "leaf-shakespeare")

#: LEAF's Shakespeare alphabet (``models/utils/language_utils.py``: ``ALL_LETTERS``).
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


class ImportFormatError(DatasetError):
    """A folder that is not in the layout an import reads; the message names the file."""


# --------------------------------------------------------------------------- PFLlib
class _ArraysOnly(pickle.Unpickler):
    """Unpickles numpy arrays inside dicts and lists, and nothing else.

    PFLlib pickles each client's ``{"x", "y"}`` dict into its ``.npz`` files; numpy's own
    reader would unpickle them with ``allow_pickle=True``, which runs whatever code a file
    names. This unpickler resolves only the numpy names that rebuild arrays.
    """

    ALLOWED = {
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> Any:
        module = module.replace("numpy.core.", "numpy._core.")  # files from numpy 1.x
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def read_pfllib_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of one PFLlib client file (a pickled ``{"x", "y"}`` or plain arrays)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if {"x.npy", "y.npy"} <= names:
                with np.load(path, allow_pickle=False) as arrays:
                    return np.asarray(arrays["x"]), np.asarray(arrays["y"])
            if "data.npy" not in names:
                raise ImportFormatError(
                    f"{path} holds {sorted(names)}; expected PFLlib's 'data' ({{'x', 'y'}}) or "
                    "arrays 'x' and 'y'"
                )
            stream = io.BytesIO(archive.read("data.npy"))
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            _, _, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            _, _, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ImportFormatError(f"{path}: .npy format version {version} is not read here")
        if not dtype.hasobject:
            raise ImportFormatError(
                f"{path}: 'data' is a {dtype} array, not PFLlib's {{'x', 'y'}} dict"
            )
        data = _ArraysOnly(stream).load()
    except ImportFormatError:
        raise
    except (OSError, zipfile.BadZipFile, zlib.error, ValueError, EOFError) as error:
        raise ImportFormatError(f"cannot read {path}: {type(error).__name__}: {error}") from error
    except pickle.UnpicklingError as error:
        raise ImportFormatError(f"{path} is not a PFLlib client file: {error}") from error
    data = data.item() if isinstance(data, np.ndarray) and data.shape == () else data
    if not isinstance(data, dict) or not {"x", "y"} <= set(data):
        raise ImportFormatError(f"{path}: 'data' is not a dict with 'x' and 'y'")
    return np.asarray(data["x"]), np.asarray(data["y"])


def _inputs(x: np.ndarray, path: Path) -> np.ndarray:
    if x.dtype == np.uint8:
        return x
    if not np.issubdtype(x.dtype, np.floating):
        raise ImportFormatError(
            f"{path}: x has dtype {x.dtype}; this import reads numeric inputs (float arrays, or "
            "uint8 images), not token ids"
        )
    if not np.all(np.isfinite(x)):
        raise ImportFormatError(f"{path}: x holds NaN or infinite values")
    return x.astype(np.float32, copy=False)


def _label_array(y: np.ndarray, path: Path) -> np.ndarray:
    """``y`` as int64 labels, one per sample (their range is checked by :func:`_labels`)."""
    if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or y.size == 0):
        raise ImportFormatError(
            f"{path}: y must be one integer label per sample, got {y.dtype} {y.shape}"
        )
    if y.size and y.min() < 0:
        raise ImportFormatError(f"{path}: labels {y.min()}..{y.max()} include negative values")
    return y.astype(np.int64, copy=False)


def _labels(y: np.ndarray, num_classes: int, path: Path, where: str = "") -> np.ndarray:
    """``y`` as int64 labels, each in ``0..num_classes-1`` (``where`` says whose count)."""
    y = _label_array(y, path)
    if y.size and y.max() >= num_classes:
        raise ImportFormatError(
            f"{path}: labels {y.min()}..{y.max()} outside 0..{num_classes - 1}{where}"
        )
    return y


def _split_validation(client: ClientData, fraction: float, seed: int) -> ClientData:
    """Carve a seeded validation split out of a client's training split (the data layer's
    :func:`~pflarena.core.partition.validation_indices`); the test split is untouched."""
    if fraction == 0:
        return client
    kept, held = validation_indices(len(client.y_train), fraction, seed, client.client_id)
    return ClientData(
        client_id=client.client_id,
        x_train=client.x_train[kept],
        y_train=client.y_train[kept],
        x_test=client.x_test,
        y_test=client.y_test,
        x_val=client.x_train[held],
        y_val=client.y_train[held],
    )


def _refuse_empty(client: ClientData, where: str) -> None:
    """A client with no training or no test sample can neither train nor be evaluated."""
    for split, y in (("training", client.y_train), ("test", client.y_test)):
        if not len(y):
            raise ImportFormatError(f"{where} has no {split} samples")


def _check_shapes(clients: list[ClientData], where: Path) -> tuple[int, ...]:
    shapes = {tuple(c.x_train.shape[1:]) for c in clients} | {
        tuple(c.x_test.shape[1:]) for c in clients
    }
    if len(shapes) != 1:
        raise ImportFormatError(f"{where}: clients' samples differ in shape: {sorted(shapes)}")
    return shapes.pop()


def _class_count(value: Any, what: str) -> int:
    """``value`` as a class count in ``2..MAX_CLASSES``; ``what`` names where it came from."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ImportFormatError(f"{what}={value!r} is not a whole number")
    try:
        count = int(value)
    except ValueError:
        raise ImportFormatError(f"{what}={value!r} is not a whole number") from None
    if count != value and str(count) != value:
        raise ImportFormatError(f"{what}={value!r} is not a whole number")
    if not 2 <= count <= MAX_CLASSES:
        raise ImportFormatError(f"{what}={count} is outside 2..{MAX_CLASSES}")
    return count


def import_pfllib(
    folder: str | Path,
    out: str | Path,
    *,
    name: str | None = None,
    num_classes: int | None = None,
    validation_fraction: float = 0.0,
    seed: int = 0,
) -> list[Path]:
    """Convert a PFLlib dataset folder into a shard directory.

    Parameters
    ----------
    folder
        The folder holding ``config.json``, ``train/`` and ``test/``.
    out
        The shard directory to write.
    name
        The data's name (default ``pfllib-<folder name, lower case>``).
    num_classes
        The number of classes. Default: ``config.json``'s ``num_classes``, or, where the
        file has none (older PFLlib generators), the largest label plus one. Given, it
        must equal ``config.json``'s when the file has one; a value above the largest
        label plus one declares classes that no client holds.
    validation_fraction, seed
        Carve a seeded validation split out of each client's training split (0: none,
        PFLlib's own layout).

    Returns
    -------
    list of pathlib.Path
        The shard files, in client order. The manifest's ``import`` entry records where
        the class count came from (``num_classes_source``: ``config``, ``given`` or
        ``inferred``), the largest label and how many distinct labels the clients hold.

    Raises
    ------
    ImportFormatError
        A folder not in PFLlib's layout, a label outside ``0..num_classes-1`` (the message
        names the file and both numbers), or a ``num_classes`` that disagrees with
        ``config.json``'s.
    """
    root = Path(folder)
    config_path = root / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ImportFormatError(
            f"no config.json in {root}: not a PFLlib dataset folder (expected config.json, "
            "train/<i>.npz, test/<i>.npz)"
        ) from None
    except (OSError, ValueError) as error:
        raise ImportFormatError(f"cannot read {config_path}: {error}") from error
    if not isinstance(config, dict):
        raise ImportFormatError(f"{config_path} is not a JSON object")
    try:
        num_clients = int(config["num_clients"])
    except (ValueError, KeyError, TypeError) as error:
        raise ImportFormatError(f"{config_path} lacks num_clients: {error!r}") from error
    if num_clients < 1:
        raise ImportFormatError(f"{config_path}: num_clients={num_clients} names no client")
    declared = None
    if config.get("num_classes") is not None:
        declared = _class_count(config["num_classes"], f"{config_path}: num_classes")
    given = None if num_classes is None else _class_count(num_classes, "num_classes")
    if given is not None and declared is not None and given != declared:
        raise ImportFormatError(
            f"num_classes={given} was given but {config_path} says num_classes={declared}"
        )

    raw: list[dict[str, tuple[np.ndarray, np.ndarray, Path]]] = []
    for client_id in range(num_clients):
        arrays = {}
        for split in ("train", "test"):
            path = root / split / f"{client_id}.npz"
            if not path.is_file():
                raise ImportFormatError(
                    f"{path} not found: config.json says {num_clients} clients, each with "
                    f"train/<i>.npz and test/<i>.npz"
                )
            x, y = read_pfllib_npz(path)
            if len(x) != len(y):
                raise ImportFormatError(f"{path}: {len(x)} samples but {len(y)} labels")
            arrays[split] = (_inputs(x, path), _label_array(y, path), path)
        raw.append(arrays)
    labels = [y for arrays in raw for _, y, _ in arrays.values() if y.size]
    largest = max((int(y.max()) for y in labels), default=-1)
    present = int(np.unique(np.concatenate(labels)).size) if labels else 0
    if given is not None:
        count, source, reason = given, "given", f"num_classes={given} was given"
    elif declared is not None:
        count, source, reason = declared, "config", f"{config_path} says num_classes={declared}"
    else:
        count, source, reason = largest + 1, "inferred", "inferred from the labels"
        if count < 2:
            raise ImportFormatError(
                f"{config_path} has no num_classes and every label is {largest}: give the "
                "number of classes (--num-classes)"
            )
        _class_count(count, f"{root}: the largest label plus one, num_classes")
    where = f" ({reason}; the labels need num_classes >= {largest + 1})"
    clients = []
    for client_id, arrays in enumerate(raw):
        for _, y, path in arrays.values():
            _labels(y, count, path, where)
        client = ClientData(
            client_id=client_id,
            x_train=arrays["train"][0],
            y_train=arrays["train"][1],
            x_test=arrays["test"][0],
            y_test=arrays["test"][1],
        )
        _refuse_empty(
            client, f"{root}: client {client_id} (train/{client_id}.npz, test/{client_id}.npz)"
        )
        clients.append(_split_validation(client, validation_fraction, seed))
    info = DatasetInfo(
        name=name or f"pfllib-{root.resolve().name.lower()}",
        num_classes=count,
        input_shape=_check_shapes(clients, root),
    )
    record = {"num_classes_source": source, "largest_label": largest, "labels_present": present}
    return write_shards(
        Federation(info=info, clients=clients), out, source="pfllib", details=record
    )


# --------------------------------------------------------------------------- LEAF
#: What each LEAF data set's samples are: name, classes, sample shape, vocabulary size.
LEAF_DATASETS: dict[str, DatasetInfo] = {
    "femnist": DatasetInfo(name="leaf-femnist", num_classes=62, input_shape=(1, 28, 28)),
    "shakespeare": DatasetInfo(
        name="leaf-shakespeare",
        num_classes=len(LEAF_LETTERS),
        input_shape=(80,),
        vocabulary_size=len(LEAF_LETTERS),
    ),
}


def _leaf_users(files: list[Path]) -> dict[str, tuple[list[Any], list[Any]]]:
    """Every user's samples over ``files``, in the order the files list the users."""
    users: dict[str, tuple[list[Any], list[Any]]] = {}
    for path in files:
        try:
            content = json.loads(path.read_text())
            names, data = content["users"], content["user_data"]
        except (OSError, ValueError) as error:
            raise ImportFormatError(f"cannot read LEAF file {path}: {error}") from error
        except (KeyError, TypeError):
            raise ImportFormatError(
                f"LEAF file {path} lacks 'users' or 'user_data' (expected users, num_samples, "
                "user_data)"
            ) from None
        for user in names:
            samples = data.get(user) if isinstance(data, dict) else None
            if not isinstance(samples, dict) or not {"x", "y"} <= set(samples):
                raise ImportFormatError(f"LEAF file {path}: user {user!r} has no x and y")
            if len(samples["x"]) != len(samples["y"]):
                raise ImportFormatError(
                    f"LEAF file {path}: user {user!r} has {len(samples['x'])} x but "
                    f"{len(samples['y'])} y"
                )
            xs, ys = users.setdefault(str(user), ([], []))
            xs.extend(samples["x"])
            ys.extend(samples["y"])
    return users


def _leaf_arrays(
    kind: str, xs: list[Any], ys: list[Any], where: str
) -> tuple[np.ndarray, np.ndarray]:
    """One user's LEAF samples as arrays: FEMNIST images, Shakespeare letter indices."""
    if kind == "femnist":
        try:
            x = np.asarray(xs, dtype=np.float32).reshape(-1, 1, 28, 28)
            y = np.asarray(ys, dtype=np.int64)
        except (ValueError, TypeError) as error:
            raise ImportFormatError(
                f"{where}: FEMNIST x must be 784 numbers each: {error}"
            ) from error
        return x, _labels(y, LEAF_DATASETS[kind].num_classes, Path(where))
    length = LEAF_DATASETS[kind].input_shape[0]
    unknown = {c for text in [*xs, *ys] for c in str(text)} - set(LEAF_LETTERS)
    if unknown:
        raise ImportFormatError(f"{where}: characters outside LEAF's alphabet: {sorted(unknown)}")
    if any(len(text) != length for text in xs) or any(len(label) != 1 for label in ys):
        raise ImportFormatError(
            f"{where}: Shakespeare x must be {length}-character strings and y single characters"
        )
    index = {letter: i for i, letter in enumerate(LEAF_LETTERS)}
    x = np.array([[index[c] for c in text] for text in xs], dtype=np.uint8).reshape(-1, length)
    y = np.array([index[label] for label in ys], dtype=np.int64)
    return x, y


def import_leaf(
    folder: str | Path,
    out: str | Path,
    *,
    dataset: str,
    validation_fraction: float = 0.0,
    seed: int = 0,
) -> list[Path]:
    """Convert a LEAF data folder (its ``train/`` and ``test/`` JSON files) into shards.

    Parameters
    ----------
    folder
        The folder holding ``train/`` and ``test/`` (LEAF's ``data/<name>/data``).
    out
        The shard directory to write.
    dataset
        ``"femnist"`` or ``"shakespeare"``.
    validation_fraction, seed
        As :func:`import_pfllib`.
    """
    if dataset not in LEAF_DATASETS:
        raise ImportFormatError(
            f"unknown LEAF data set {dataset!r}; this import reads {', '.join(LEAF_DATASETS)}"
        )
    root = Path(folder)
    files = {split: sorted((root / split).glob("*.json")) for split in ("train", "test")}
    if not files["train"] or not files["test"]:
        raise ImportFormatError(
            f"{root} needs LEAF's train/*.json and test/*.json (the output of its "
            "preprocess.sh split)"
        )
    train, test = _leaf_users(files["train"]), _leaf_users(files["test"])
    if set(train) != set(test):
        raise ImportFormatError(
            f"{root}: train/ and test/ list different users ({len(set(train) ^ set(test))} "
            "appear in only one)"
        )
    clients = []
    for client_id, user in enumerate(train):
        x_train, y_train = _leaf_arrays(dataset, *train[user], f"{root}/train, user {user}")
        x_test, y_test = _leaf_arrays(dataset, *test[user], f"{root}/test, user {user}")
        client = ClientData(client_id, x_train, y_train, x_test, y_test)
        _refuse_empty(client, f"{root}: user {user}")
        clients.append(_split_validation(client, validation_fraction, seed))
    return write_shards(
        Federation(info=LEAF_DATASETS[dataset], clients=clients), out, source="leaf"
    )
