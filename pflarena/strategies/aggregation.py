"""The strategies' server math on Flower ArrayRecords: decoding, averaging, flattening.

Every method that averages models, flattens them into vectors or decodes them does it here,
so that one rule holds for all of them:

* Decoding goes through :func:`pflarena.core.array_decoding.decode` (``Array.numpy()``'s values,
  read without parsing the header each time).
* :func:`weighted_mean` is ``Σ_i (w_i / Σ w) x_i`` entry by entry. Floating-point entries
  are accumulated in float64 and returned in their own dtype, unless ``like_fedavg``:
  then in their own dtype in Flower's order (``aggregate_arrayrecords``'s arithmetic, which
  FedAvg, PPFL and FedEM keep bit for bit).
* **Integer and boolean entries** (BatchNorm's ``num_batches_tracked``, the only ones
  pflarena's models carry) get the same weighted mean, rounded to the nearest integer (half
  to even), **in the entry's own dtype and shape**: a model's buffers load back into it
  unchanged and a client's reply keeps the dtype the server sent. (Flower's averaging made
  them float64, which the reply check then refused in the next round.) With BatchNorm's
  momentum set, as in every pflarena model, the counter never changes a prediction.
* :func:`weighted_combination` is ``Σ_i p_i x_i`` with weights the server chose (PAGE's and
  Dap-FL's agents), not normalised by it; its integer entries are the most-weighted model's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord

from pflarena.core.array_decoding import decode, encode

__all__ = [
    "as_numpy",
    "as_record",
    "flatten",
    "float_names",
    "mean_of",
    "stack_flat",
    "sum_of",
    "unflatten",
    "weight_entropy",
    "weighted_average",
    "weighted_combination",
    "weighted_mean",
]

Arrays = ArrayRecord | Mapping[str, np.ndarray]


def as_numpy(record: ArrayRecord, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The record's arrays by name (``names``, or all of them in the record's order), each
    decoded by :func:`pflarena.core.array_decoding.decode` into memory of its own."""
    if names is None:
        return {name: decode(array) for name, array in record.items()}
    return {name: decode(record[name]) for name in names}


def as_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord of ``arrays``, in their order, each C-contiguous."""
    # np.require keeps 0-d arrays (BatchNorm's num_batches_tracked) 0-d; ascontiguousarray
    # would make them 1-d and the model's buffers would no longer load into it unchanged.
    record = ArrayRecord()
    for name, value in arrays.items():
        record[name] = encode(np.require(value, requirements="C"))  # Array(value)'s, faster
    return record


def _value(arrays: Arrays, name: str) -> np.ndarray:
    """Entry ``name`` to read (a read-only view of a record's bytes where it can be)."""
    value = arrays[name]
    return decode(value, copy=False) if isinstance(value, Array) else np.asarray(value)


def _factors(count: int, weights: Sequence[float] | np.ndarray | None) -> list[float]:
    if count == 0:
        raise ValueError("no arrays to average")
    if weights is None:
        weights = [1.0] * count
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (count,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be {count} non-negative values with a positive sum")
    total = sum(float(x) for x in w)  # Python's sum, as Flower's aggregate_arrayrecords
    return [float(x) / total for x in w]


def weighted_mean(
    records: Sequence[Arrays],
    weights: Sequence[float] | np.ndarray | None = None,
    names: Iterable[str] | None = None,
    *,
    dtype: np.dtype | type | None = None,
    like_fedavg: bool = False,
) -> dict[str, np.ndarray]:
    """``Σ_i (w_i / Σ w) x_i`` of each named entry (all of the first record's by default).

    ``records`` are ArrayRecords or name → numpy maps; ``weights`` non-negative with a
    positive sum (``None``: equal). Floating-point entries are accumulated in float64, in
    record order, and returned in their dtype, or in ``dtype`` if given (pFedMe keeps the
    float64 mean for its β step). With ``like_fedavg`` they are accumulated in their own
    dtype as Flower's ``aggregate_arrayrecords`` does (``x_0 f_0 + x_1 f_1 + ...``), so
    that FedAvg and the methods that must reduce to it (PPFL with K = 1) agree bit for
    bit. Integer and boolean entries: the weighted mean rounded half to even, in their own
    dtype and shape (see the module's docstring).
    """
    factors = _factors(len(records), weights)
    out: dict[str, np.ndarray] = {}
    # One record's entry is read at a time: the sum never holds the K values of an entry.
    for name in records[0].keys() if names is None else names:
        first = _value(records[0], name)
        kind = first.dtype
        if kind.kind == "f" and like_fedavg:
            total = first * factors[0]
            for record, factor in zip(records[1:], factors[1:], strict=True):
                total += _value(record, name) * factor
            out[name] = np.asarray(total)
            continue
        total = np.zeros(first.shape, dtype=np.float64)
        for record, factor in zip(records, factors, strict=True):
            total += factor * _value(record, name).astype(np.float64)
        if kind.kind == "f":
            out[name] = total.astype(kind if dtype is None else dtype)
        elif kind.kind in "biu":
            out[name] = np.rint(total).astype(kind)
        else:
            raise ValueError(f"array {name!r} has dtype {kind}, not a number to average")
    return out


def weighted_average(
    records: Sequence[ArrayRecord], weights: Sequence[float] | np.ndarray
) -> ArrayRecord:
    """FedAvg's aggregate: :func:`weighted_mean` with ``like_fedavg`` as an ArrayRecord."""
    return as_record(weighted_mean(records, weights, like_fedavg=True))


def sum_of(
    records: Sequence[Arrays],
    name: str,
    *,
    minus: np.ndarray | None = None,
    dtype: type | None = np.float64,
) -> np.ndarray:
    """``Σ_i (x_i − minus)`` of array ``name`` over ``records`` (``minus``: none if not
    given), in ``dtype`` (``None``: the entries' own): the SCAFFOLD, FedDyn and pFedGT
    server steps, which the caller keeps in their dtype.

    A running sum in record order, one record's entry at a time: the same values as
    ``np.sum`` of the stacked entries along axis 0 (which adds row after row), without the K
    copies of the entry that stacking them holds."""
    if not records:
        raise ValueError("no arrays to sum")
    total: np.ndarray | None = None
    for record in records:
        value = _value(record, name)
        value = value.astype(dtype or value.dtype)  # a copy of its own: summed into
        if minus is not None:
            value -= minus
        if total is None:
            total = value
        else:
            total += value
    assert total is not None
    return total


def mean_of(records: Sequence[Arrays], name: str) -> np.ndarray:
    """The plain mean of array ``name`` over ``records`` in float64: :func:`sum_of` over
    their count, ``np.mean``'s values."""
    return sum_of(records, name) / len(records)


def float_names(record: ArrayRecord) -> list[str]:
    """The names of ``record``'s floating-point arrays (the model's values, not its integer
    buffers), in its order."""
    return [name for name, array in record.items() if np.dtype(array.dtype).kind == "f"]


def flatten(record: Arrays, names: Sequence[str], dtype: type = np.float64) -> np.ndarray:
    """The named arrays of ``record`` as one vector of ``dtype``, in ``names`` order."""
    if not names:
        return np.zeros(0, dtype=dtype)
    return np.concatenate([_value(record, n).astype(dtype, copy=False).ravel() for n in names])


def stack_flat(records: Sequence[Arrays], names: Sequence[str], dtype: type) -> np.ndarray:
    """``np.stack([flatten(r, names, dtype) for r in records])``, filled row by row: the
    matrix is the only copy of the records' values (the list that ``np.stack`` reads would
    be a second one)."""
    size = sum(_value(records[0], n).size for n in names) if records else 0
    out = np.empty((len(records), size), dtype=dtype)
    for row, record in zip(out, records, strict=True):
        offset = 0
        for name in names:
            value = _value(record, name).ravel()
            if offset + value.size > size:
                raise ValueError(f"array {name!r} makes a record longer than the first")
            row[offset : offset + value.size] = value
            offset += value.size
        if offset != size:
            raise ValueError(f"a record's arrays {list(names)} have {offset} values, not {size}")
    return out


def unflatten(vector: np.ndarray, like: Arrays, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Undo :func:`flatten`: arrays shaped and typed like ``like``'s."""
    out, offset = {}, 0
    for name in names:
        ref = _value(like, name)
        out[name] = vector[offset : offset + ref.size].reshape(ref.shape).astype(ref.dtype)
        offset += ref.size
    return out


def weighted_combination(records: Sequence[ArrayRecord], weights: np.ndarray) -> ArrayRecord:
    """``Σ_i p_i w_i`` with weights chosen by the server (PAGE's Eq. 5, W(t+1) = Σ_i p_i ŵ_i(t);
    Dap-FL's) for every floating-point array, in float64, then the array's dtype; other arrays
    (integer buffers) come from the most-weighted model."""
    if len(records) != len(weights) or not records:
        raise ValueError(f"{len(records)} models and {len(weights)} weights")
    heaviest = records[int(np.argmax(weights))]
    out = {}
    for name in records[0].keys():
        first = records[0][name].numpy()
        if np.issubdtype(first.dtype, np.floating):
            total = np.zeros(first.shape, dtype=np.float64)
            for w, record in zip(weights, records, strict=True):
                total += float(w) * record[name].numpy().astype(np.float64)
            out[name] = Array(np.ascontiguousarray(total.astype(first.dtype)))
        else:
            out[name] = Array(np.ascontiguousarray(heaviest[name].numpy()))
    return ArrayRecord(out)


def weight_entropy(weights: np.ndarray) -> float:
    """Shannon entropy −Σ p log p (nats) of aggregation weights (0 log 0 = 0): how spread
    PAGE's and Dap-FL's weights are."""
    p = np.asarray(weights, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())
