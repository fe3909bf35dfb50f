"""Federations: the one entry point from a run config to per-client data.

:func:`build_federation` turns a :class:`FederationSpec` (the data keys of a run, checked
by the model) into a :class:`Federation`: the data set's
:class:`~pflarena.core.datasets.DatasetInfo` and one :class:`ClientData` per client.
Samples are given out in this order:

1. **Server share** (``server_fraction``, default none): a seeded, label-stratified
   share set aside for the server (:func:`load_server_data`), from the pool of a pooled
   data set before it is partitioned, or from each client's share of a natively
   federated one. No client ever sees these samples.
2. **Client shares**: pooled data sets are partitioned by :mod:`pflarena.core.partition`;
   natively federated ones (``synthetic``, ``synthetic-mixture``, ``har``, ``shakespeare``,
   ``femnist``) come one share per client, which ``max_client_samples`` may cap (a seeded
   choice of that many of the samples the client keeps).
3. **Train/test**: each client's share is split with a seeded ``train_test_split``
   whose seed is derived from ``spec.seed`` and the client id.
4. **Validation** (``validation_fraction``, default none): a seeded share of each
   client's training split, with a seed of its own.

Every set-aside part has ``ceil(fraction · n)`` samples of the ``n`` it is taken from.
With both new fractions at 0 the arrays are those of the train/test split alone.

A federation's clients are written to and read from shard files by
:mod:`pflarena.core.shard_format`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pflarena.core.datasets import (
    DATASETS,
    DatasetError,
    DatasetInfo,
    check_dataset_name,
    dataset_info,
    dataset_names,
    dataset_spec,
    generate_synthetic_mixture,
    load_natural,
    load_natural_client,
    load_pooled,
    natural_client_counts,
)
from pflarena.core.partition import (
    cap_indices,
    check_partition_name,
    check_permutation_groups,
    label_permutations,
    partition_indices,
    partition_names,
    partition_spec,
    permute_labels,
    server_indices,
    train_test_indices,
    validation_indices,
)
from pflarena.core.phases import mark

__all__ = [
    "ClientData",
    "DatasetError",
    "DatasetInfo",
    "Federation",
    "FederationSpec",
    "ServerData",
    "client_sizes",
    "build_federation",
    "clear_caches",
    "load_client",
    "load_server_data",
    "synthetic_mixture_truth",
]

#: The most clients a federation may have (each is a simulated node or a SuperNode).
MAX_CLIENTS = 100_000
#: The largest seed: the seeds of numpy's and scikit-learn's generators are 32-bit.
MAX_SEED = 2**32 - 1


def check_path_text(value: str) -> str:
    """A path-valued key's text: the operating system refuses NUL bytes in paths, so they
    are a config error here rather than an exception wherever the path is first used."""
    if "\x00" in value:
        raise ValueError("a path cannot contain a NUL byte")
    return value


class FederationSpec(BaseModel):
    """Everything that determines a federation: the data keys of a run.

    A frozen (hence hashable) pydantic model that owns each field's type, range and
    description. Field names use underscores; the hyphenated aliases (``num-clients``)
    are the run-config keys, and both are accepted. Names are checked against the data
    set and partition registries, and a natively federated data set must use the
    ``"natural"`` partition (and only it). Invalid values raise
    :class:`pydantic.ValidationError` (a :class:`ValueError`) naming the field.
    """

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        frozen=True,
        allow_inf_nan=False,
        alias_generator=lambda s: s.replace("_", "-"),
    )

    dataset: str = Field("digits", description="dataset name")
    num_clients: int = Field(
        10,
        ge=1,
        le=MAX_CLIENTS,
        description=f"number of clients (SuperNodes), at most {MAX_CLIENTS:,}",
    )
    partition: str = Field("dirichlet", description="how pooled data is split over clients")
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration")
    classes_per_client: int = Field(2, ge=1, description="classes per client (pathological)")
    class_assignment: Literal["first-deterministic", "deterministic", "random"] = Field(
        "first-deterministic",
        description="pathological: client i gets class i mod C and random others; "
        "'deterministic': classes i..i+k−1 mod C (each class held by equally many clients); "
        "'random': k random classes",
    )
    shards_per_client: int = Field(2, ge=1, description="shards per client (shards)")
    quantity_sigma: float = Field(
        0.0,
        ge=0,
        description="inner-dirichlet: log-normal sigma of the client sizes (0: equal sizes)",
    )
    label_groups: int = Field(
        4, ge=1, description="class groups, one per group of clients (label-groups)"
    )
    label_permutation_groups: int = Field(
        0,
        ge=0,
        description="groups of consecutive clients whose labels are permuted differently "
        "(group 0 keeps its labels; 0: off)",
    )
    test_fraction: float = Field(0.25, gt=0, lt=1, description="share of each client's test split")
    validation_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of each client's training split held out for validation (0: none)",
    )
    server_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of the pooled data held by the server, removed before "
        "partitioning (0: none)",
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="seed for data, models and client sampling (0 .. 2^32-1)"
    )
    data_dir: str = Field("", description="directory with real datasets (torchvision layout)")
    synthetic_alpha: float = Field(0.5, ge=0, description="Synthetic(α, β): model heterogeneity")
    synthetic_beta: float = Field(0.5, ge=0, description="Synthetic(α, β): data heterogeneity")
    synthetic_model: Literal["per-client", "shared"] = Field(
        "per-client",
        description="synthetic: a labelling model per client (FedProx) or one shared by all "
        "(FedDyn's iid_sol, PAGE's reading)",
    )
    synthetic_samples: int = Field(
        0, ge=0, description="synthetic: samples per client (0: lognormal sizes, mean 300)"
    )
    mixture_label_mode: Literal["fixed", "faithful"] = Field(
        "fixed", description="synthetic-mixture labels ('faithful': the reference generator's)"
    )
    min_client_samples: int = Field(
        0,
        ge=0,
        description="LEAF datasets (shakespeare, femnist): drop users with this many samples "
        "or fewer before choosing the clients (LEAF's -k)",
    )
    max_client_samples: int = Field(
        0,
        ge=0,
        description="natively federated datasets: each client keeps at most this many "
        "samples, a seeded choice (0: all)",
    )

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        check_dataset_name(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _dataset_default_partition(cls, values: Any) -> Any:
        """No partition given: the dataset's own default (``natural`` for natural ones)."""
        if isinstance(values, dict) and "partition" not in values:
            dataset = values.get("dataset", "digits")
            if isinstance(dataset, str) and dataset in DATASETS:
                return {**values, "partition": dataset_spec(dataset).default_partition}
        return values

    @field_validator("data_dir")
    @classmethod
    def _data_dir_is_a_path(cls, value: str) -> str:
        return check_path_text(value)

    @field_validator("partition")
    @classmethod
    def _known_partition(cls, value: str) -> str:
        check_partition_name(value)
        return value

    @model_validator(mode="after")
    def _partition_fits_dataset(self) -> FederationSpec:
        natural_dataset = dataset_spec(self.dataset).kind == "natural"
        natural_partition = partition_spec(self.partition).natural
        if natural_dataset and not natural_partition:
            raise ValueError(
                f"dataset {self.dataset!r} is natively federated: partition must be "
                f"'natural', got {self.partition!r}"
            )
        if natural_partition and not natural_dataset:
            raise ValueError(
                f"partition {self.partition!r} only applies to "
                f"{', '.join(dataset_names('natural'))}; for {self.dataset!r} use one of: "
                f"{', '.join(partition_names(natural=False))}"
            )
        if self.max_client_samples and not natural_dataset:
            raise ValueError(
                f"max-client-samples applies to natively federated datasets "
                f"({', '.join(dataset_names('natural'))}), not to {self.dataset!r}"
            )
        try:
            check_permutation_groups(
                self.label_permutation_groups,
                self.num_clients,
                dataset_spec(self.dataset).info.num_classes,
            )
        except DatasetError as error:
            raise ValueError(str(error)) from None
        if self.min_client_samples and "min_client_samples" not in dataset_spec(self.dataset).reads:
            readers = [n for n in DATASETS if "min_client_samples" in dataset_spec(n).reads]
            raise ValueError(
                f"min-client-samples applies to {', '.join(readers)}, not to {self.dataset!r}"
            )
        return self


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
    x_val, y_val : numpy.ndarray, optional
        Validation samples and ``int64`` labels, held out of the training split. ``None``
        (the default) means no validation split: they become empty arrays with the
        trailing shape and dtype of ``x_train`` and ``int64`` labels.
    """

    client_id: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    x_val: np.ndarray = None  # type: ignore[assignment]  # set in __post_init__
    y_val: np.ndarray = None  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        if self.x_val is None:
            self.x_val = self.x_train[:0]
        if self.y_val is None:
            self.y_val = np.zeros(0, dtype=np.int64)


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


@dataclass(frozen=True)
class ServerData:
    """The share of a data set held by the server, disjoint from every client's data.

    Parameters
    ----------
    x : numpy.ndarray
        Samples ``(n, *info.input_shape)``.
    y : numpy.ndarray
        ``int64`` labels ``(n,)``.
    info : DatasetInfo
        Description of the data set.
    """

    x: np.ndarray
    y: np.ndarray
    info: DatasetInfo

    @property
    def num_samples(self) -> int:
        """Number of samples the server holds."""
        return len(self.y)

    @property
    def class_histogram(self) -> list[int]:
        """Samples per class, ``info.num_classes`` counts."""
        return np.bincount(self.y, minlength=self.info.num_classes).tolist()


# --------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rows:
    """Where every sample of a federation comes from: rows of one pool, by role.

    For a natively federated data set the pool is the clients' shares concatenated in
    client order.
    """

    info: DatasetInfo
    x: np.ndarray
    y: np.ndarray
    train: list[np.ndarray]
    val: list[np.ndarray]
    test: list[np.ndarray]
    server: np.ndarray


def _natural_arguments(spec: FederationSpec) -> dict[str, Any]:
    """:func:`~pflarena.core.datasets.load_natural`'s keyword arguments for ``spec``."""
    return {
        "num_clients": spec.num_clients,
        "seed": spec.seed,
        "data_dir": spec.data_dir,
        "synthetic_alpha": spec.synthetic_alpha,
        "synthetic_beta": spec.synthetic_beta,
        "synthetic_model": spec.synthetic_model,
        "synthetic_samples": spec.synthetic_samples,
        "mixture_label_mode": spec.mixture_label_mode,
        "min_client_samples": spec.min_client_samples,
    }


def _natural_kept(
    spec: FederationSpec, client_id: int, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Of a natural client's samples (labels ``y``): the positions it keeps (after the
    server's share and ``max_client_samples``' cap) and the server's."""
    kept, held = server_indices(y, spec.server_fraction, spec.seed, client_id)
    kept = kept[cap_indices(len(kept), spec.max_client_samples, spec.seed, client_id)]
    return kept, held


def _client_parts(
    spec: FederationSpec, client_id: int, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A client's ``rows`` (its share) split into train, validation and test rows."""
    return _split(rows, spec.test_fraction, spec.validation_fraction, spec.seed, client_id)


def _split(
    rows: np.ndarray, test_fraction: float, validation_fraction: float, seed: int, client_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    train_split, test_split = train_test_indices(len(rows), test_fraction, seed, client_id)
    kept, held = validation_indices(len(train_split), validation_fraction, seed, client_id)
    return rows[train_split[kept]], rows[train_split[held]], rows[test_split]


def _shares(
    spec: FederationSpec,
) -> tuple[DatasetInfo, np.ndarray, np.ndarray, list[np.ndarray], np.ndarray]:
    """The pool, each client's rows of it before the train/test split, the server's rows."""
    if dataset_spec(spec.dataset).kind == "natural":
        natural = load_natural(spec.dataset, **_natural_arguments(spec))
        x = np.concatenate([client_x for client_x, _ in natural.clients])
        y = np.concatenate([client_y for _, client_y in natural.clients])
        shares, server = [], []
        start = 0
        for client_id, (_, client_y) in enumerate(natural.clients):
            kept, held = _natural_kept(spec, client_id, client_y)
            shares.append(start + kept)
            server.append(start + held)
            start += len(client_y)
        mark("data set loaded")
        return natural.info, x, y, shares, np.concatenate(server)
    pooled = load_pooled(spec.dataset, spec.data_dir)
    mark("data set loaded")
    kept, held = server_indices(pooled.y, spec.server_fraction, spec.seed)
    parts = partition_indices(
        pooled.y[kept],
        spec.num_clients,
        spec.partition,
        seed=spec.seed,
        alpha=spec.alpha,
        classes_per_client=spec.classes_per_client,
        class_assignment=spec.class_assignment,
        shards_per_client=spec.shards_per_client,
        label_groups=spec.label_groups,
        num_classes=pooled.info.num_classes,
        quantity_sigma=spec.quantity_sigma,
    )
    return pooled.info, pooled.x, pooled.y, [kept[part] for part in parts], held


@functools.lru_cache(maxsize=4)
def _federation_rows(spec: FederationSpec) -> _Rows:
    """Every role's rows of the pool for a spec; :func:`build_federation`,
    :func:`client_sizes` and :func:`load_server_data` take these rows. Memoised like
    :func:`build_federation`: a simulation's server counts the clients, then its first
    clients build theirs, in one process (the partition of 3,550 clients took 9 s)."""
    info, x, y, shares, server = _shares(spec)
    train, val, test = [], [], []
    for client_id, rows in enumerate(shares):
        client_train, client_val, client_test = _client_parts(spec, client_id, rows)
        train.append(client_train)
        val.append(client_val)
        test.append(client_test)
    mark("federation built (partition and splits)")
    return _Rows(info=info, x=x, y=y, train=train, val=val, test=test, server=server)


def _labels(y: np.ndarray) -> np.ndarray:
    return np.asarray(y, dtype=np.int64)


def _label_permuter(spec: FederationSpec, info: DatasetInfo):  # noqa: ANN202
    """``(client_id, labels) -> labels`` after ``label_permutation_groups``' permutation."""
    if not spec.label_permutation_groups:
        return lambda client_id, y: y
    permutations = label_permutations(info.num_classes, spec.label_permutation_groups, spec.seed)
    return lambda client_id, y: permute_labels(y, client_id, spec.num_clients, permutations)


@functools.lru_cache(maxsize=4)
def build_federation(spec: FederationSpec) -> Federation:
    """Build every client's train, validation and test data for a spec.

    Deterministic for a given spec, and memoised for the last four specs in this process
    (the returned arrays are shared between callers: do not modify them in place;
    :func:`clear_caches` empties the cache).

    Parameters
    ----------
    spec : FederationSpec
        What to build.

    Returns
    -------
    Federation
        ``spec.num_clients`` clients. Of a client's ``n`` samples (after the server's
        share), ``ceil(test_fraction · n)`` are for testing; of the remaining training
        split ``ceil(validation_fraction · n_train)`` are for validation.

    Raises
    ------
    DatasetError
        Missing files, impossible partitions, clients too small to split.
    """
    rows = _federation_rows(spec)
    permuted = _label_permuter(spec, rows.info)
    clients = [
        _client_data(client_id, rows.x, rows.y, parts, permuted)
        for client_id, parts in enumerate(zip(rows.train, rows.val, rows.test, strict=True))
    ]
    return Federation(info=rows.info, clients=clients)


def _client_data(
    client_id: int,
    x: np.ndarray,
    y: np.ndarray,
    parts: tuple[np.ndarray, np.ndarray, np.ndarray],
    permuted: Any,
) -> ClientData:
    """A client's arrays: its ``(train, val, test)`` rows of ``x`` and ``y``, the labels
    permuted (:func:`_label_permuter`)."""

    def labels(part: np.ndarray) -> np.ndarray:
        return permuted(client_id, _labels(y[part]))

    train, val, test = parts
    return ClientData(
        client_id=client_id,
        x_train=x[train],
        y_train=labels(train),
        x_test=x[test],
        y_test=labels(test),
        x_val=x[val],
        y_val=labels(val),
    )


def clear_caches() -> None:
    """Forget the federations this process built (:func:`build_federation`'s,
    :func:`load_server_data`'s and the rows both take): the next build reads the files."""
    build_federation.cache_clear()
    load_server_data.cache_clear()
    _federation_rows.cache_clear()


@functools.lru_cache(maxsize=4)
def load_server_data(spec: FederationSpec) -> ServerData | None:
    """The server's share of a spec's data, or ``None`` when ``server_fraction == 0``.

    Pooled data sets: ``ceil(server_fraction · N)`` samples of the pool of ``N``, drawn
    stratified by label (unstratified when a class is too small) before the pool is
    partitioned. Natively federated data sets: ``ceil(server_fraction · n_i)`` of each
    client's ``n_i`` samples, drawn the same way before its train/test split, pooled in
    client order. Memoised like :func:`build_federation` (:func:`clear_caches`).

    Parameters
    ----------
    spec : FederationSpec
        The federation.

    Returns
    -------
    ServerData or None
        The server's samples, disjoint from every client's.

    Raises
    ------
    DatasetError
        As :func:`build_federation`.
    """
    if spec.server_fraction == 0.0:
        return None
    rows = _federation_rows(spec)
    return ServerData(x=rows.x[rows.server], y=_labels(rows.y[rows.server]), info=rows.info)


def client_sizes(spec: FederationSpec) -> tuple[list[int], list[int], list[int]]:
    """Every client's numbers of train, validation and test samples for a spec (what
    :func:`build_federation` gives them), without keeping the data.

    A data set whose clients are built one at a time (a ``client_loader``) is counted one
    client at a time, and without drawing a sample where it tells its clients' sizes and
    the server takes no share (whose draw, stratified by label, needs the labels).

    Raises
    ------
    DatasetError
        As :func:`build_federation`.
    """
    arguments = _natural_arguments(spec)
    if dataset_spec(spec.dataset).client_loader is not None:
        counts = (
            None if spec.server_fraction > 0 else natural_client_counts(spec.dataset, arguments)
        )
        sizes: tuple[list[int], list[int], list[int]] = ([], [], [])
        for client_id in range(spec.num_clients):
            if counts is not None:
                kept = _cap_count(int(counts[client_id]), spec.max_client_samples)
            else:
                drawn = load_natural_client(spec.dataset, client_id, arguments)
                assert drawn is not None
                kept = len(_natural_kept(spec, client_id, drawn[1])[0])
            for total, part in zip(
                sizes, _part_sizes(kept, spec.test_fraction, spec.validation_fraction), strict=True
            ):
                total.append(part)
        return sizes
    rows = _federation_rows(spec)
    return (
        [len(part) for part in rows.train],
        [len(part) for part in rows.val],
        [len(part) for part in rows.test],
    )


def _cap_count(count: int, max_samples: int) -> int:
    """How many of ``count`` samples :func:`~pflarena.core.partition.cap_indices` keeps."""
    return min(count, max_samples) if max_samples else count


@functools.lru_cache(maxsize=4096)
def _part_sizes(count: int, test_fraction: float, validation_fraction: float) -> tuple[int, ...]:
    """The train, validation and test sizes :func:`_client_parts` gives a share of
    ``count`` samples (they depend on the count alone, not on the seeds)."""
    parts = _split(np.arange(count), test_fraction, validation_fraction, 0, 0)
    return tuple(len(part) for part in parts)


def load_client(spec: FederationSpec, client_id: int) -> tuple[ClientData, DatasetInfo]:
    """One client's data: built alone where the data set builds its clients one at a time
    (a ``client_loader``: the same arrays as its federation's), otherwise from the
    (memoised) federation of a spec.

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
    drawn = load_natural_client(spec.dataset, client_id, _natural_arguments(spec))
    if drawn is not None:
        x, y = drawn
        kept, _held = _natural_kept(spec, client_id, y)
        info = dataset_info(spec.dataset)
        parts = _client_parts(spec, client_id, kept)
        return _client_data(client_id, x, y, parts, _label_permuter(spec, info)), info
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
    mixture = generate_synthetic_mixture(spec.num_clients, spec.seed, truth_only=True)
    return mixture.components, mixture.mixture_weights
