"""Checks of what clients send back: every reply is read through here before it is used.

A reply may come from a pflarena ClientApp, from a stock Flower ClientApp written the way
Flower's quickstart writes one, or from something broken or hostile. Each function returns
what it read, or a string saying why the reply cannot be used; the strategy logs that,
counts the client as failed for the exchange, and goes on.

Stock Flower clients: their train replies (``arrays`` and ``metrics`` with
``num-examples``) are usable by the FedAvg family. Their evaluate replies are read through
Flower's conventional metric names (an accuracy under ``accuracy``, ``eval_acc``, ``acc``
or ``eval_accuracy``, a loss under ``loss`` or ``eval_loss``, and ``num-examples``), with the
node id standing in for the missing client id.

What a reply may hold is what the server reads: every ArrayRecord of a usable reply has
been checked by :func:`array_problem` or :func:`vector_problem` (the strategy's check names
each record it reads), and its only MetricRecord is ``metrics``; anything else rejects the
reply (:func:`unread_records_problem`). Array values are bounded (:data:`NORM_RATIO`,
:data:`MAX_NORM`) and counts are checked against what the server knows of each client
(:class:`ClientSizes`, :data:`MAX_EXAMPLES`); ``docs/threat-model.md`` says what is left.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from pflarena.core import keys
from pflarena.core.array_decoding import decode

__all__ = [
    "ACCURACY_NAMES",
    "ClientEvaluation",
    "ClientSizes",
    "LOSS_NAMES",
    "MAX_EXAMPLES",
    "MAX_NORM",
    "NORM_RATIO",
    "array_problem",
    "examples_problem",
    "metric_problem",
    "read_client_id",
    "read_evaluation",
    "records_read",
    "unread_records_problem",
    "vector_problem",
]

ACCURACY_NAMES = ("accuracy", "eval_acc", "acc", "eval_accuracy")
LOSS_NAMES = ("loss", "eval_loss")

#: An array of an update may have a norm of at most ``NORM_RATIO`` times that of the array
#: the server sent under its name (at least ``NORM_RATIO · √size``: an update's reference
#: may be zeros) ...
NORM_RATIO = 1e4
#: ... and never above ``MAX_NORM``, so that no weighted sum of accepted float32 arrays can
#: overflow (float32 holds up to 3.4e38) and no round can compound a hostile scale past it.
MAX_NORM = 1e15
#: Where the server does not know a client's data (a deployment without a shard manifest),
#: a count it reports may be at most this many examples.
MAX_EXAMPLES = 10**9


@dataclass(frozen=True)
class ClientSizes:
    """What the server knows of each client's data: samples per split, by client id.

    From the shard manifest (``shards-dir``) or, where the clients build their data from
    the run config, from the same federation spec (:func:`~pflarena.core.federation.client_sizes`).
    """

    num_train: tuple[int, ...]
    num_val: tuple[int, ...]
    num_test: tuple[int, ...]

    def knows(self, client_id: int | None) -> bool:
        return client_id is not None and 0 <= client_id < len(self.num_train)


#: The ArrayRecords a reply check has examined (``None`` outside :func:`records_read`).
_records_read: ContextVar[set[str] | None] = ContextVar("records_read", default=None)


@contextmanager
def records_read() -> Iterator[set[str]]:
    """The names of the ArrayRecords that :func:`array_problem` and :func:`vector_problem`
    examine within the ``with`` block (a strategy's reply check); a reply holding any other
    ArrayRecord is refused by :func:`unread_records_problem`."""
    names: set[str] = set()
    token = _records_read.set(names)
    try:
        yield names
    finally:
        _records_read.reset(token)


def _mark_read(key: str) -> None:
    names = _records_read.get()
    if names is not None:
        names.add(key)


def unread_records_problem(content: RecordDict, read: set[str]) -> str | None:
    """Why a reply holds more than the server reads: an ArrayRecord its check did not
    examine (``read``), or a MetricRecord besides ``metrics``."""
    unread = [key for key in content.array_records if key not in read]
    if unread:
        expected = ", ".join(repr(key) for key in sorted(read)) or "none"
        return f"unexpected ArrayRecord(s) {unread} (the server reads {expected})"
    extra = [key for key in content.metric_records if key != keys.METRICS]
    if extra:
        return f"unexpected MetricRecord(s) {extra} (the server reads {keys.METRICS!r})"
    return None


@dataclass(frozen=True)
class ClientEvaluation:
    """One client's evaluation reply, as counts."""

    client_id: int
    personalized_correct: int
    personalized_count: int
    personalized_loss_sum: float
    global_correct: int | None = None
    global_count: int | None = None
    global_loss_sum: float | None = None

    @property
    def personalized_accuracy(self) -> float:
        return self.personalized_correct / max(self.personalized_count, 1)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def metric_problem(content: RecordDict) -> str | None:
    """Why the reply's metrics are unusable: missing, or a NaN or infinite value."""
    if keys.METRICS not in content.metric_records:
        return f"no MetricRecord {keys.METRICS!r} in reply"
    for name, value in content.metric_records[keys.METRICS].items():
        values = value if isinstance(value, list) else [value]
        if any(_is_number(v) and not math.isfinite(v) for v in values):
            return f"metric {name!r} is NaN or infinite"
    examples = content.metric_records[keys.METRICS].get(keys.NUM_EXAMPLES)
    if examples is not None and (not _is_number(examples) or examples < 0):
        return f"metric {keys.NUM_EXAMPLES!r} must be a number >= 0, got {examples!r}"
    return None


def examples_problem(
    content: RecordDict, client_id: int | None, sizes: ClientSizes | None
) -> str | None:
    """Why a train reply's ``num-examples`` cannot be true, or ``None``.

    A count of training examples is a whole number; for a client the server knows
    (``sizes``), at most its training split (a method may train on part of it); for any
    other, at most :data:`MAX_EXAMPLES`. ``metric_problem`` has checked it is a number >= 0.
    """
    examples = content.metric_records[keys.METRICS].get(keys.NUM_EXAMPLES)
    if examples is None:
        return None
    if examples != int(examples):
        return f"metric {keys.NUM_EXAMPLES!r} must be a whole number, got {examples!r}"
    if sizes is not None and sizes.knows(client_id):
        assert client_id is not None
        if examples > sizes.num_train[client_id]:
            return (
                f"metric {keys.NUM_EXAMPLES!r}={examples:g} exceeds client {client_id}'s "
                f"{sizes.num_train[client_id]} training samples"
            )
    elif examples > MAX_EXAMPLES:
        return f"metric {keys.NUM_EXAMPLES!r}={examples:g} exceeds {MAX_EXAMPLES:g}"
    return None


def read_client_id(content: RecordDict, num_clients: int | None) -> int | None | str:
    """The client id a reply claims: an int in range, ``None`` if it claims none, or a problem."""
    metrics = content.metric_records.get(keys.METRICS)
    if metrics is None or keys.CLIENT_ID not in metrics:
        return None
    value = metrics[keys.CLIENT_ID]
    if not isinstance(value, int) or isinstance(value, bool):
        return f"client id {value!r} is not an integer"
    if value < 0 or (num_clients is not None and value >= num_clients):
        return f"client id {value} out of range for {num_clients} clients"
    return value


def delta_reply_problem(
    content: RecordDict,
    trainable: ArrayRecord | None,
    buffers: ArrayRecord | None,
    delta_keys: tuple[str, ...],
    buffers_key: str,
) -> str | None:
    """Why a reply of updates is unusable, or ``None``: each of ``delta_keys`` over the
    model's trainable arrays (``trainable``), and ``buffers_key`` under the model's other
    names, shapes and dtypes when it has any (absent when it has none), everything finite."""
    for key in delta_keys:
        problem = array_problem(content, trainable, key)
        if problem is not None:
            return problem
    if buffers is not None and len(buffers):
        problem = array_problem(content, buffers, buffers_key)
        if problem is not None:
            return f"buffers: {problem}"
    elif buffers_key in content.array_records:
        return f"ArrayRecord {buffers_key!r} sent, but the model has no buffers"
    return None


def array_problem(content: RecordDict, reference: ArrayRecord | None, key: str) -> str | None:
    """Why an update's ArrayRecord ``key`` is unusable, or ``None``.

    It must exist, have the names, shapes and dtypes of ``reference`` (when given), in the
    same order, hold no NaN or infinity, and be bounded: each array's norm at most
    :data:`NORM_RATIO` times that of ``reference``'s array of its name (at least
    ``NORM_RATIO · √size``), and never above :data:`MAX_NORM`. One pass over each array
    (its norm) checks both values; ``reference`` is read only for an array past the
    ``√size`` bound.
    """
    _mark_read(key)
    if key not in content.array_records:
        return f"no ArrayRecord {key!r} in reply"
    record = content.array_records[key]
    if reference is not None:
        names, expected_names = list(record.keys()), list(reference.keys())
        if names != expected_names:
            extra = [name for name in names if name not in expected_names]
            missing = [name for name in expected_names if name not in names]
            if extra or missing:
                return (
                    f"ArrayRecord {key!r}: unexpected arrays {extra[:3]}, missing arrays "
                    f"{missing[:3]}"
                )
            return f"ArrayRecord {key!r}: arrays in another order than the server's"
        for name, array in record.items():
            expected = reference[name]
            if tuple(array.shape) != tuple(expected.shape):
                return (
                    f"array {name!r} has shape {tuple(array.shape)}, "
                    f"expected {tuple(expected.shape)}"
                )
            if array.dtype != expected.dtype:
                return f"array {name!r} has dtype {array.dtype}, expected {expected.dtype}"
    for name, array in record.items():
        try:
            values = decode(array)
        except Exception as exc:  # noqa: BLE001 - undecodable bytes are the client's fault
            return f"array {name!r} cannot be decoded: {exc}"
        if values.dtype.kind not in "biuf":
            return f"array {name!r} has dtype {values.dtype}, not a number"
        problem = _bound_problem(name, values, reference)
        if problem is not None:
            return problem
    return None


def _squared_norm(values: np.ndarray) -> float:
    if values.dtype.kind == "f":
        flat = values.reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            return float(np.dot(flat, flat))  # NaN or inf if any value is, or if it overflows
    return float(np.sum(np.square(values, dtype=np.float64)))  # integers: small buffers


def _bound_problem(name: str, values: np.ndarray, reference: ArrayRecord | None) -> str | None:
    squared = _squared_norm(values)
    if not math.isfinite(squared):
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            return f"array {name!r} contains NaN or infinity"
        return f"array {name!r} has a norm beyond {MAX_NORM:g}"
    norm = math.sqrt(squared)
    floor = NORM_RATIO * math.sqrt(values.size)
    if norm <= min(floor, MAX_NORM):
        return None
    sent = 0.0
    if reference is not None and name in reference:
        sent = math.sqrt(_squared_norm(decode(reference[name])))
    bound = min(max(floor, NORM_RATIO * sent), MAX_NORM)
    if norm > bound:
        return (
            f"array {name!r} has norm {norm:.3g}, beyond its bound {bound:.3g} "
            f"({NORM_RATIO:g} x the norm of what the server sent, at least "
            f"{NORM_RATIO:g} x sqrt(size), at most {MAX_NORM:g})"
        )
    return None


def vector_problem(
    content: RecordDict, key: str, shapes: Mapping[str, Sequence[int | None]]
) -> str | None:
    """Why a reply's ArrayRecord ``key`` of small numeric vectors is unusable, or ``None``.

    For a record whose values are the method's own (weights, histograms, memberships; the
    method checks their range): exactly the arrays of ``shapes``, in that order, each of
    its shape (``None``: a length the method does not fix), numeric, finite, and of norm at most :data:`MAX_NORM`.
    """
    _mark_read(key)
    if key not in content.array_records:
        return f"no ArrayRecord {key!r} in reply"
    record = content.array_records[key]
    if list(record.keys()) != list(shapes):
        return f"ArrayRecord {key!r} holds {list(record.keys())}, expected {list(shapes)}"
    for name, shape in shapes.items():
        try:
            values = decode(record[name])
        except Exception as exc:  # noqa: BLE001 - undecodable bytes are the client's fault
            return f"{key!r} array {name!r} cannot be decoded: {exc}"
        if len(values.shape) != len(shape) or any(
            size is not None and size != actual
            for size, actual in zip(shape, values.shape, strict=True)
        ):
            return f"{key!r} array {name!r} has shape {values.shape}, expected {tuple(shape)}"
        if values.dtype.kind not in "iuf":
            return f"{key!r} array {name!r} has dtype {values.dtype}, not a number"
        squared = _squared_norm(values)
        if not math.isfinite(squared) or squared > MAX_NORM**2:
            if values.dtype.kind == "f" and not np.isfinite(values).all():
                return f"{key!r} array {name!r} contains NaN or infinity"
            return f"{key!r} array {name!r} has a norm beyond {MAX_NORM:g}"
    return None


def _count(metrics: Any, name: str) -> int | str:
    value = metrics.get(name)
    if not _is_number(value) or value < 0 or not math.isfinite(value) or value != int(value):
        return f"{name!r} must be a whole count >= 0, got {value!r}"
    return int(value)


def count_problem(
    name: str, count: int, client_id: int | None, sizes: ClientSizes | None
) -> str | None:
    """Why an evaluation's count of test samples cannot be true: not the client's test
    split where the server knows it, above :data:`MAX_EXAMPLES` where it does not."""
    if sizes is not None and sizes.knows(client_id):
        assert client_id is not None
        if count != sizes.num_test[client_id]:
            return (
                f"{name}={count} is not client {client_id}'s {sizes.num_test[client_id]} "
                "test samples"
            )
    elif count > MAX_EXAMPLES:
        return f"{name}={count} exceeds {MAX_EXAMPLES:g}"
    return None


def read_evaluation(
    content: RecordDict,
    node_id: int,
    num_clients: int | None,
    sizes: ClientSizes | None = None,
) -> ClientEvaluation | str:
    """A client's evaluation from its reply, or why it cannot be read.

    Counts must be whole numbers with no more correct than evaluated, and the number
    evaluated must be the client's test split (``sizes``, where the server knows it).
    """
    problem = metric_problem(content)
    if problem is not None:
        return problem
    metrics = content.metric_records[keys.METRICS]
    client_id = read_client_id(content, num_clients)
    if isinstance(client_id, str):
        return client_id
    if keys.PERSONALIZED_COUNT in metrics:  # a pflarena client
        if client_id is None:
            return f"pflarena evaluation without {keys.CLIENT_ID!r}"
        fields: dict[str, Any] = {"client_id": client_id}
        for prefix, required in (("personalized", True), ("global", False)):
            names = (f"{prefix}-correct", f"{prefix}-count", f"{prefix}-loss-sum")
            if not required and not any(name in metrics for name in names):
                continue
            correct, count = _count(metrics, names[0]), _count(metrics, names[1])
            for value in (correct, count):
                if isinstance(value, str):
                    return value
            if correct > count:
                return f"{names[0]}={correct} exceeds {names[1]}={count}"
            problem = count_problem(names[1], count, client_id, sizes)
            if problem is not None:
                return problem
            loss = metrics.get(names[2])
            if not _is_number(loss):
                return f"{names[2]!r} must be a number, got {loss!r}"
            fields |= {
                f"{prefix}_correct": correct,
                f"{prefix}_count": count,
                f"{prefix}_loss_sum": float(loss),
            }
        return ClientEvaluation(**fields)
    # a stock Flower client: conventional names, the node id for the client id
    accuracy_name = next((name for name in ACCURACY_NAMES if name in metrics), None)
    if accuracy_name is None or keys.NUM_EXAMPLES not in metrics:
        return (
            f"evaluation reply has neither pflarena's counts nor an accuracy "
            f"({'/'.join(ACCURACY_NAMES)}) with {keys.NUM_EXAMPLES!r}; it has "
            f"{sorted(metrics.keys())}"
        )
    accuracy, count = metrics[accuracy_name], _count(metrics, keys.NUM_EXAMPLES)
    if isinstance(count, str):
        return count
    problem = count_problem(keys.NUM_EXAMPLES, count, client_id, sizes)
    if problem is not None:
        return problem
    if not _is_number(accuracy) or not 0.0 <= accuracy <= 1.0:
        return f"{accuracy_name!r} must be in [0, 1], got {accuracy!r}"
    loss_name = next((name for name in LOSS_NAMES if name in metrics), None)
    loss = float(metrics[loss_name]) if loss_name and _is_number(metrics[loss_name]) else math.nan
    return ClientEvaluation(
        client_id=client_id if client_id is not None else node_id,
        personalized_correct=round(accuracy * count),
        personalized_count=count,
        personalized_loss_sum=loss * count,
    )
