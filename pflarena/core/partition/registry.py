"""The partition registry: each partitioner module declares its partitions with a :class:`PartitionSpec`.

A partitioner takes the pooled label array and returns one array of sample indices per
client. Its declaration names the keyword arguments it reads, drawn from
:data:`PARTITION_ARGUMENTS` (the federation spec's partition fields plus the data set's
class count), so :func:`partition_indices` hands each partitioner exactly what it uses.
The ``"natural"`` partition has no function: natively federated data sets come one
share per client.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pflarena.core.datasets import DatasetError

__all__ = [
    "PARTITION_ARGUMENTS",
    "PartitionSpec",
    "check_clients",
    "check_partition_name",
    "partition_indices",
    "partition_names",
    "partition_spec",
    "register_partition",
]

#: Keyword arguments a partitioner may read: the federation spec's ``num_clients``,
#: ``seed``, ``alpha``, ``classes_per_client``, ``class_assignment``, ``shards_per_client``,
#: ``quantity_sigma``, and the data set's ``num_classes``.
#: ``label_groups``, and the data set's ``num_classes``.
PARTITION_ARGUMENTS: tuple[str, ...] = (
    "num_clients",
    "seed",
    "alpha",
    "classes_per_client",
    "class_assignment",
    "shards_per_client",
    "label_groups",
    "num_classes",
    "quantity_sigma",
)


@dataclass(frozen=True)
class PartitionSpec:
    """The declaration of one partition.

    Parameters
    ----------
    name : str
        Partition name, as written in a run config.
    function : callable or None
        ``function(labels, **arguments) -> list of index arrays``, called with the
        keyword arguments named in ``reads``; ``None`` for the ``"natural"`` partition.
    reads : tuple of str
        The :data:`PARTITION_ARGUMENTS` the function takes.
    natural : bool
        Whether this partition is for natively federated data sets (it then has no
        function) rather than pooled ones.
    """

    name: str
    function: Callable[..., list[np.ndarray]] | None
    reads: tuple[str, ...] = ()
    natural: bool = False

    def __post_init__(self) -> None:
        unknown = [name for name in self.reads if name not in PARTITION_ARGUMENTS]
        if unknown:
            raise ValueError(
                f"partition {self.name!r} reads {unknown}; partitions may read "
                f"{PARTITION_ARGUMENTS}"
            )
        if (self.function is None) != self.natural:
            raise ValueError(
                f"partition {self.name!r}: a natural partition has no function, a pooled "
                "one has one"
            )
        if self.function is not None:
            parameters = inspect.signature(self.function).parameters
            missing = [name for name in self.reads if name not in parameters]
            if missing:
                raise ValueError(f"partition {self.name!r}: the function takes no {missing}")


_REGISTRY: dict[str, PartitionSpec] = {}


def register_partition(spec: PartitionSpec) -> PartitionSpec:
    """Add a partition to the registry (once per name; registration order is list order).

    Parameters
    ----------
    spec : PartitionSpec
        The declaration.

    Returns
    -------
    PartitionSpec
        ``spec``.

    Raises
    ------
    ValueError
        A partition of that name is already registered.
    """
    if spec.name in _REGISTRY:
        raise ValueError(f"partition {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def partition_names(natural: bool | None = None) -> tuple[str, ...]:
    """Registered partition names, in registration order.

    Parameters
    ----------
    natural : bool, optional
        Only the partitions for natively federated (``True``) or pooled (``False``)
        data sets.

    Returns
    -------
    tuple of str
        The names.
    """
    return tuple(
        name for name, spec in _REGISTRY.items() if natural is None or spec.natural == natural
    )


def check_partition_name(partition: str) -> None:
    """Raise :class:`DatasetError` unless ``partition`` is a registered partition.

    Parameters
    ----------
    partition : str
        Partition name to check.
    """
    if partition not in _REGISTRY:
        from pflarena.core.suggest import did_you_mean

        raise DatasetError(
            f"unknown partition {partition!r}{did_you_mean(partition, _REGISTRY)}; allowed: "
            f"{', '.join(_REGISTRY)}"
        )


def partition_spec(partition: str) -> PartitionSpec:
    """Return the declaration of a registered partition.

    Parameters
    ----------
    partition : str
        Partition name.

    Returns
    -------
    PartitionSpec
        Its declaration.

    Raises
    ------
    DatasetError
        Unknown name (the message lists the registered ones).
    """
    check_partition_name(partition)
    return _REGISTRY[partition]


def check_clients(labels: np.ndarray, num_clients: int) -> None:
    """Raise :class:`DatasetError` unless ``1 <= num_clients <= len(labels)``.

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``.
    num_clients : int
        Number of clients.
    """
    if num_clients < 1:
        raise DatasetError(f"num_clients must be at least 1, got {num_clients}")
    if num_clients > len(labels):
        raise DatasetError(
            f"cannot split {len(labels)} samples over {num_clients} clients; use fewer clients"
        )


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    partition: str,
    *,
    seed: int = 0,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    class_assignment: str = "first-deterministic",
    shards_per_client: int = 2,
    label_groups: int = 4,
    num_classes: int | None = None,
    quantity_sigma: float = 0.0,
) -> list[np.ndarray]:
    """Divide a pooled data set's labels over clients with the named partitioner.

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``.
    num_clients : int
        Number of clients.
    partition : str
        A registered partition for pooled data sets (any but ``"natural"``).
    seed : int
        Partitioner seed.
    alpha : float
        Dirichlet concentration (``dirichlet``, ``pfllib-dirichlet``).
    classes_per_client : int
        For ``pathological``.
    class_assignment : str
        For ``pathological``: how classes are assigned to clients.
    shards_per_client : int
        For ``shards``.
    label_groups : int
        For ``label-groups``: the number of class groups.
    num_classes : int, optional
        Number of classes (``pfllib-dirichlet``, ``inner-dirichlet``); default
        ``labels.max() + 1``.
    quantity_sigma : float
        For ``inner-dirichlet``: log-normal σ of the client sizes (0: equal sizes).

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client.
    """
    spec = partition_spec(partition)
    if spec.function is None:
        raise DatasetError(
            f"partition {partition!r} only applies to natively federated datasets; "
            f"for a pooled dataset use one of: {', '.join(partition_names(natural=False))}"
        )
    arguments = {
        "num_clients": num_clients,
        "seed": seed,
        "alpha": alpha,
        "classes_per_client": classes_per_client,
        "class_assignment": class_assignment,
        "shards_per_client": shards_per_client,
        "label_groups": label_groups,
        "num_classes": num_classes,
        "quantity_sigma": quantity_sigma,
    }
    return spec.function(np.asarray(labels), **{name: arguments[name] for name in spec.reads})
