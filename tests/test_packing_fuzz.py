"""Random and adversarial packed records (``pflarena/core/packing.py``), by property:

* any bytes, any JSON table, any damage to a real packed record: :func:`unpack_content`
  returns the arrays or raises :class:`PackingError`, nothing else;
* any record of plain NumPy arrays comes back byte for byte through Flower's object transport;
* thrown at the deployment's Grid (over the in-memory SuperLink, ``fake_superlink.py``) as one
  client's reply, packed or as Flower objects its classes cannot read: the exchange goes on,
  that client gets an error reply with the reason and the others their replies.
"""

from __future__ import annotations

import json
import string

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from fake_superlink import FakeSuperLink, serverapp_identity
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.supercore.inflatable.inflatable_object import add_header_to_object_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pflarena.core.packing import (
    PACKABLE_DTYPES,
    PACKED_KEY,
    PACKED_STYPE,
    PackingError,
    pack_arrays,
    pack_content,
    unpack_content,
)
from pflarena.server.polling import PromptGrid

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _with_blob(blob: bytes) -> RecordDict:
    array = Array(dtype="bytes", shape=(len(blob),), stype=PACKED_STYPE, data=blob)
    return RecordDict({"arrays": ArrayRecord({PACKED_KEY: array})})


def _frame(head: bytes, data: bytes = b"") -> bytes:
    return b"PFLPACK1" + len(head).to_bytes(4, "big") + head + data


def _unpacks_or_refuses(blob: bytes) -> RecordDict | None:
    try:
        return unpack_content(_with_blob(blob))
    except PackingError:
        return None


# --------------------------------------------------------------------------- strategies
dtypes = st.sampled_from(sorted(PACKABLE_DTYPES))
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
arrays = st.builds(
    lambda dtype, shape, data: data.draw(hnp.arrays(np.dtype(dtype), shape)),
    dtypes,
    shapes,
    st.data(),
)
keys = st.text(alphabet=string.printable + '[]{}"\\é', min_size=0, max_size=12)


@st.composite
def records(draw: st.DrawFn) -> ArrayRecord:
    names = draw(st.lists(keys, min_size=2, max_size=5, unique=True))
    return ArrayRecord({name: Array(draw(arrays)) for name in names})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=30,
)
entries = st.lists(
    st.one_of(
        json_values,
        st.tuples(
            keys,
            st.sampled_from([*sorted(PACKABLE_DTYPES), "object", "<U3", ">f4", "V8", ""]),
            st.lists(st.one_of(st.integers(-2, 6), st.booleans(), st.floats()), max_size=5),
            st.sampled_from(["numpy.ndarray", "torch.Tensor", ""]),
            st.one_of(st.integers(-1, 300), st.booleans()),
        ).map(list),
    ),
    max_size=6,
)


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A real packed record's bytes, damaged: cut, grown, bytes overwritten or moved."""
    blob = bytearray(pack_arrays(draw(records()))[PACKED_KEY].data)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(blob) - 1)))
        kind = draw(st.sampled_from(["cut", "grow", "set", "swap"]))
        if kind == "cut":
            del blob[at : at + draw(st.integers(1, 40))]
        elif kind == "grow":
            blob[at:at] = draw(st.binary(min_size=1, max_size=40))
        elif kind == "set" and blob:
            blob[at] = draw(st.integers(0, 255))
        elif blob:
            other = draw(st.integers(0, len(blob) - 1))
            blob[at], blob[other] = blob[other], blob[at]
    return bytes(blob)


hostile_blobs = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=300).map(lambda b: b"PFLPACK1" + b),
    st.tuples(entries, st.binary(max_size=300)).map(
        lambda e: _frame(json.dumps(e[0]).encode(), e[1])
    ),
    st.tuples(st.integers(1, 5000), st.sampled_from([b"[", b"{", b'{"a":'])).map(
        lambda n: _frame(n[1] * n[0])
    ),
    damaged(),
)


# --------------------------------------------------------------------------- the parser
@FUZZ
@given(hostile_blobs)
def test_any_bytes_unpack_or_are_refused_by_name(blob: bytes) -> None:
    _unpacks_or_refuses(blob)  # any other exception fails the test


@FUZZ
@given(records())
def test_any_plain_record_comes_back_byte_for_byte(record: ArrayRecord) -> None:
    from test_packing import _over_the_wire, _same

    received = unpack_content(_over_the_wire(pack_content(RecordDict({"a": record}))))
    _same(received["a"], record)


# --------------------------------------------------------------------------- at the Grid
def forged_array_record(body: bytes) -> ArrayRecord:
    """An ``ArrayRecord`` whose one ``Array`` object has ``body`` as its deflated body (under
    Flower's own header, so that its object id is its content's hash and a SuperLink keeps
    it), the way a hostile node can write any object."""

    class Forged(Array):
        def deflate(self) -> bytes:
            return add_header_to_object_body(object_body=body, obj=self)

    Forged.__qualname__ = "Array"  # the type Flower's header names
    record = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    record["w"].__class__ = Forged  # the record keeps its own Array objects
    return record


array_bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {
            "dtype": st.sampled_from(["float32", "object", "", "<U3"]),
            "shape": st.one_of(json_values, st.lists(st.integers(-3, 5), max_size=3)),
            "stype": st.sampled_from(["numpy.ndarray", "x"]),
            "arraychunk_ids": st.one_of(json_values, st.lists(st.integers(-3, 3), max_size=3)),
        }
    ).map(lambda d: json.dumps(d).encode()),
)


def _exchange(hostile: bytes | ArrayRecord) -> list[Message]:
    """One exchange with nodes 1-3, node 2 replying with ``hostile`` (a packed record's
    bytes, or a record of forged objects); the replies."""

    def answer(node: int, message: Message) -> Message:
        if node == 2:
            if isinstance(hostile, bytes):
                content = _with_blob(hostile)
            else:
                content = RecordDict({"arrays": hostile})
            return Message(content, reply_to=message)
        return Message(RecordDict({"metrics": MetricRecord({"node": node})}), reply_to=message)

    grid = PromptGrid(FakeSuperLink(answer).grid(), poll=0.001, pack=True)
    messages = [
        Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(2))})}), n, "train")
        for n in (1, 2, 3)
    ]
    return list(grid.send_and_receive(messages, timeout=10))


@pytest.fixture(scope="module")
def identity() -> object:
    with pytest.MonkeyPatch.context() as patch:
        serverapp_identity(patch)
        yield


def _check_others(replies: list[Message]) -> Message:
    assert [r.metadata.src_node_id for r in replies] == [1, 2, 3]
    for reply in (replies[0], replies[2]):
        assert not reply.has_error()
        assert reply.content["metrics"]["node"] == reply.metadata.src_node_id
    return replies[1]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_blobs)
def test_a_hostile_packed_reply_costs_only_its_sender(identity, blob: bytes) -> None:
    reply = _check_others(_exchange(blob))
    if _unpacks_or_refuses(blob) is None:
        assert reply.has_error() and reply.error.reason.startswith("unreadable reply: PackingError")
    else:
        assert not reply.has_error()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(array_bodies)
def test_an_array_object_flower_cannot_read_costs_only_its_sender(identity, body: bytes) -> None:
    reply = _check_others(_exchange(forged_array_record(body)))
    if reply.has_error():
        assert reply.error.reason.startswith("unreadable reply: ")
