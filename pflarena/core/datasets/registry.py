"""The data set registry: each data set module declares itself once with a :class:`DatasetSpec`.

A declaration names the data set, describes it (:class:`~pflarena.core.datasets.base.DatasetInfo`),
says whether it is *pooled* (one pool of samples that a partitioner divides) or *natural*
(natively federated, one share per client), whether it ships with the package, which
partition it uses by default, and which loader builds it. The loader receives, by
keyword, exactly the arguments its declaration ``reads`` (:data:`POOLED_LOADER_ARGUMENTS`
or :data:`LOADER_ARGUMENTS`):

* a pooled loader returns ``(x, y)``, the samples and ``int64`` labels of the pool;
* a natural loader returns a :class:`~pflarena.core.datasets.base.NaturalDataset`.

:func:`load_pooled` and :func:`load_natural` are the only callers of loaders; every list
of names (``DATASETS``, ``NATURAL_DATASETS`` ...) is derived from the registry.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pflarena.core.datasets.base import DatasetError, DatasetInfo, NaturalDataset, PooledDataset

__all__ = [
    "DATASET_KINDS",
    "LOADER_ARGUMENTS",
    "POOLED_LOADER_ARGUMENTS",
    "DatasetKind",
    "DatasetSpec",
    "check_dataset_name",
    "check_files",
    "dataset_info",
    "dataset_names",
    "dataset_spec",
    "load_natural",
    "load_natural_client",
    "load_pooled",
    "natural_client_counts",
    "register_dataset",
]

DatasetKind = Literal["pooled", "natural"]
DATASET_KINDS: tuple[str, ...] = ("pooled", "natural")

#: The keyword arguments a pooled loader may read: the pool depends on nothing else.
POOLED_LOADER_ARGUMENTS: tuple[str, ...] = ("data_dir",)
#: The keyword arguments a natural loader may read: federation-spec fields that shape the data.
LOADER_ARGUMENTS: tuple[str, ...] = (
    "num_clients",
    "seed",
    "data_dir",
    "synthetic_alpha",
    "synthetic_beta",
    "synthetic_model",
    "synthetic_samples",
    "mixture_label_mode",
    "min_client_samples",
)

#: Partition a data set uses unless it declares another, by kind.
_DEFAULT_PARTITIONS: dict[str, str] = {"pooled": "dirichlet", "natural": "natural"}


@dataclass(frozen=True)
class DatasetSpec:
    """The declaration of one data set.

    Parameters
    ----------
    name : str
        Data set name, as written in a run config (``"fashion-mnist"``).
    info : DatasetInfo
        Static description; ``info.name == name``.
    kind : {"pooled", "natural"}
        ``"pooled"``: one pool of samples, divided over the clients by a partitioner.
        ``"natural"``: natively federated, one share per client (partition ``"natural"``).
    loader : callable
        Builds the data from the keyword arguments named in ``reads``; returns ``(x, y)``
        for a pooled data set, a :class:`NaturalDataset` for a natural one.
    reads : tuple of str
        The arguments the loader takes, each a parameter of ``loader``: some of
        :data:`POOLED_LOADER_ARGUMENTS` for a pooled data set, of
        :data:`LOADER_ARGUMENTS` for a natural one.
    embedded : bool
        Whether the data ships with the installed packages (no ``data_dir`` needed).
    default_partition : str
        The partition to use when none is chosen; ``""`` (the default) means
        ``"dirichlet"`` for pooled and ``"natural"`` for natural data sets.
    default_model : str
        The model a run gets when its config leaves ``model`` empty (a name of
        :data:`~pflarena.core.models.MODEL_NAMES`).
    check : callable, optional
        ``check(data_dir)`` raises :class:`DatasetError` naming the missing or misplaced
        path and the expected layout, without reading the data; ``None`` for data sets
        that need no files.
    source : str
        Where to get the files (for messages and ``pflarena data``).
    layout : str
        The layout the loader expects under ``data_dir``, in one line.
    client_loader : callable, optional
        A natural data set whose clients can be built one at a time:
        ``client_loader(client_id=..., **reads)`` returns that client's ``(x, y)``, the
        same arrays as ``loader``'s share of that client. A client then builds its own share
        alone (:func:`pflarena.core.federation.load_client`), whatever the federation's size.
    client_counts : callable, optional
        With ``client_loader``: ``client_counts(**reads)`` returns every client's number of
        samples without drawing them (the server's counts of a large federation).
    """

    name: str
    info: DatasetInfo
    kind: DatasetKind
    loader: Callable[..., Any]
    reads: tuple[str, ...] = ()
    embedded: bool = False
    default_partition: str = ""
    default_model: str = "mlp"
    check: Callable[[Path], None] | None = None
    source: str = ""
    layout: str = ""
    client_loader: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None
    client_counts: Callable[..., np.ndarray] | None = None

    def __post_init__(self) -> None:
        if self.kind not in DATASET_KINDS:
            raise ValueError(f"dataset {self.name!r}: kind must be one of {DATASET_KINDS}")
        if self.info.name != self.name:
            raise ValueError(f"dataset {self.name!r}: info names {self.info.name!r}")
        allowed = POOLED_LOADER_ARGUMENTS if self.kind == "pooled" else LOADER_ARGUMENTS
        unknown = [name for name in self.reads if name not in allowed]
        if unknown:
            raise ValueError(
                f"dataset {self.name!r} reads {unknown}; {self.kind} loaders may read {allowed}"
            )
        for what, function in (
            ("loader", self.loader),
            ("client_loader", self.client_loader),
            ("client_counts", self.client_counts),
        ):
            if function is None:
                continue
            parameters = inspect.signature(function).parameters
            missing = [name for name in self.reads if name not in parameters]
            if missing:
                raise ValueError(f"dataset {self.name!r}: the {what} takes no {missing}")
        if self.client_loader is not None and self.kind != "natural":
            raise ValueError(f"dataset {self.name!r}: only a natural data set has a client_loader")
        if self.client_counts is not None and self.client_loader is None:
            raise ValueError(f"dataset {self.name!r}: client_counts needs a client_loader")
        if not self.default_partition:
            object.__setattr__(self, "default_partition", _DEFAULT_PARTITIONS[self.kind])
        if not self.embedded and self.check is None:
            raise ValueError(f"dataset {self.name!r} reads files: it needs a check")


_REGISTRY: dict[str, DatasetSpec] = {}


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    """Add a data set to the registry (once per name; registration order is list order).

    Parameters
    ----------
    spec : DatasetSpec
        The declaration.

    Returns
    -------
    DatasetSpec
        ``spec``, so a module can keep it.

    Raises
    ------
    ValueError
        A data set of that name is already registered.
    """
    if spec.name in _REGISTRY:
        raise ValueError(f"dataset {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def dataset_names(kind: str | None = None, *, embedded: bool | None = None) -> tuple[str, ...]:
    """Registered data set names, in registration order.

    Parameters
    ----------
    kind : {"pooled", "natural"}, optional
        Only data sets of this kind.
    embedded : bool, optional
        Only data sets that do (``True``) or do not (``False``) ship with the packages.

    Returns
    -------
    tuple of str
        The names.
    """
    return tuple(
        name
        for name, spec in _REGISTRY.items()
        if (kind is None or spec.kind == kind) and (embedded is None or spec.embedded == embedded)
    )


def check_dataset_name(name: str) -> None:
    """Raise :class:`DatasetError` unless ``name`` is a registered data set.

    Parameters
    ----------
    name : str
        Data set name to check.
    """
    if name not in _REGISTRY:
        from pflarena.core.suggest import did_you_mean

        raise DatasetError(
            f"unknown dataset {name!r}{did_you_mean(name, _REGISTRY)}; allowed: "
            f"{', '.join(_REGISTRY)}"
        )


def dataset_spec(name: str) -> DatasetSpec:
    """Return the declaration of a registered data set.

    Parameters
    ----------
    name : str
        Data set name.

    Returns
    -------
    DatasetSpec
        Its declaration.

    Raises
    ------
    DatasetError
        Unknown name (the message lists the registered ones).
    """
    check_dataset_name(name)
    return _REGISTRY[name]


def dataset_info(name: str) -> DatasetInfo:
    """Return the :class:`DatasetInfo` of a data set without loading it.

    Parameters
    ----------
    name : str
        Data set name, one of :data:`~pflarena.core.datasets.DATASETS`.

    Returns
    -------
    DatasetInfo
        Static description of the data set.
    """
    return dataset_spec(name).info


def check_files(name: str, data_dir: str | Path) -> None:
    """Check, without reading them, that a data set's files are where its loader looks.

    Embedded data sets need nothing. For the others ``data_dir`` must be given and hold
    the files in the data set's layout.

    Parameters
    ----------
    name : str
        Data set name.
    data_dir : str or pathlib.Path
        The run's ``data-dir``; ``""`` means not given.

    Raises
    ------
    DatasetError
        Unknown name, no ``data_dir``, or files missing; the message names the path
        looked at, the layout expected and where to get the files.
    """
    spec = dataset_spec(name)
    if spec.check is None:
        return
    if not str(data_dir):
        raise DatasetError(
            f"dataset {name!r} needs data-dir: a folder holding {spec.layout}. "
            f"Nothing is downloaded; get the files from {spec.source}"
        )
    spec.check(Path(data_dir))


def _call_loader(spec: DatasetSpec, arguments: dict[str, Any]) -> Any:
    return spec.loader(**{name: arguments[name] for name in spec.reads})


def load_natural_client(
    name: str, client_id: int, arguments: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray] | None:
    """Client ``client_id``'s share of a natural data set built alone, or ``None`` where
    the data set builds its clients only together (no ``client_loader``). ``arguments``:
    :func:`load_natural`'s keyword arguments (the declaration's ``reads`` are taken)."""
    spec = dataset_spec(name)
    if spec.client_loader is None:
        return None
    num_clients = int(arguments["num_clients"])
    if not 0 <= client_id < num_clients:
        raise DatasetError(f"client_id {client_id} out of range for {num_clients} clients")
    x, y = spec.client_loader(client_id=client_id, **{key: arguments[key] for key in spec.reads})
    return x, np.asarray(y, dtype=np.int64)


def natural_client_counts(name: str, arguments: dict[str, Any]) -> np.ndarray | None:
    """Every client's number of samples of a natural data set, without building them, or
    ``None`` where the data set cannot tell (no ``client_counts``)."""
    spec = dataset_spec(name)
    if spec.client_counts is None:
        return None
    return np.asarray(spec.client_counts(**{key: arguments[key] for key in spec.reads}))


def load_pooled(name: str, data_dir: str | Path = "") -> PooledDataset:
    """Load a pooled data set (train and test concatenated, train first).

    Parameters
    ----------
    name : str
        One of :data:`~pflarena.core.datasets.POOLED_DATASETS`.
    data_dir : str or pathlib.Path
        Folder with the torchvision files or the offline copies; ``""`` means not given
        (only embedded data sets work without it).

    Returns
    -------
    PooledDataset
        All samples of the data set.

    Raises
    ------
    DatasetError
        Unknown or natively federated name, or the files are not found.
    """
    spec = dataset_spec(name)
    if spec.kind != "pooled":
        raise DatasetError(
            f"dataset {name!r} is natively federated and has no pooled form; "
            f"pooled datasets: {', '.join(dataset_names('pooled'))}"
        )
    x, y = _call_loader(spec, {"data_dir": data_dir})
    return PooledDataset(x=x, y=np.asarray(y, dtype=np.int64), info=spec.info)


def load_natural(
    name: str,
    num_clients: int,
    seed: int = 0,
    data_dir: str | Path = "",
    synthetic_alpha: float = 0.5,
    synthetic_beta: float = 0.5,
    mixture_label_mode: str = "fixed",
    min_client_samples: int = 0,
    synthetic_model: str = "per-client",
    synthetic_samples: int = 0,
) -> NaturalDataset:
    """Load or generate a natively federated data set.

    Parameters
    ----------
    name : str
        One of :data:`~pflarena.core.datasets.NATURAL_DATASETS`.
    num_clients : int
        Number of clients; for ``har`` it must equal the number of subjects (30).
    seed : int
        Generator seed (synthetic data sets).
    data_dir : str or pathlib.Path
        Folder for data sets read from files (``har``).
    synthetic_alpha, synthetic_beta : float
        Synthetic(α, β) parameters.
    mixture_label_mode : {"fixed", "faithful"}
        See :func:`~pflarena.core.datasets.mixture_labels`.
    min_client_samples : int
        LEAF data sets: users with this many samples or fewer are dropped (LEAF's ``-k``).
    synthetic_model : {"per-client", "shared"}
        ``synthetic``: a labelling model per client (FedProx) or one shared by all.
    synthetic_samples : int
        ``synthetic``: samples per client (0: lognormal sizes).

    Returns
    -------
    NaturalDataset
        One ``(x, y)`` per client.
    """
    spec = dataset_spec(name)
    if spec.kind != "natural":
        raise DatasetError(
            f"dataset {name!r} is pooled; natively federated datasets: "
            f"{', '.join(dataset_names('natural'))}"
        )
    arguments = {
        "num_clients": num_clients,
        "seed": seed,
        "data_dir": data_dir,
        "synthetic_alpha": synthetic_alpha,
        "synthetic_beta": synthetic_beta,
        "synthetic_model": synthetic_model,
        "synthetic_samples": synthetic_samples,
        "mixture_label_mode": mixture_label_mode,
        "min_client_samples": min_client_samples,
    }
    return _call_loader(spec, arguments)
