"""Packed arrays (pflarena/core/packing.py): what crosses a deployment's wire is what was sent.

The round trip is checked through Flower's own object transport (each object deflated to
bytes and inflated from them, as the SuperLink and SuperNodes pass them), byte for byte
against the arrays that went in; a packed record that is damaged, forged or past the format's
bounds is refused by name; the deployment Grid (over an in-memory SuperLink,
``fake_superlink.py``) and the ClientApp are checked on their own (packing on the way out,
unpacking on the way in, a broken packed reply costing only its sender).
``test_packing_fuzz.py`` throws random and adversarial packed records at both.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from fake_superlink import FakeSuperLink, serverapp_identity
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    Metadata,
    MetricRecord,
    RecordDict,
)
from flwr.app.message import make_message
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

from pflarena.core.packing import (
    PACKED_KEY,
    PackingError,
    is_packed,
    pack_arrays,
    pack_content,
    packable,
    unpack_content,
)
from pflarena.server.polling import PromptGrid


def _arrays() -> ArrayRecord:
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    record = ArrayRecord(
        torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4)).state_dict()
    )  # float32 weights and an int64 counter, from torch tensors
    record["half"] = Array(rng.standard_normal((3, 2)).astype(np.float16))
    record["scalar"] = Array(np.array(2.5))
    record["empty"] = Array(np.zeros((0, 7), np.float32))
    record["flags"] = Array(np.array([True, False, True]))
    record["fortran"] = Array(np.asfortranarray(rng.standard_normal((4, 3))))
    return record


def _same(a: ArrayRecord, b: ArrayRecord) -> None:
    assert list(a.keys()) == list(b.keys())
    for key in a:
        x, y = a[key], b[key]
        assert (x.dtype, tuple(x.shape), x.stype, x.data) == (
            y.dtype,
            tuple(y.shape),
            y.stype,
            y.data,
        ), key


def _over_the_wire(content: RecordDict) -> RecordDict:
    """``content`` sent through Flower's object transport: each object deflated to bytes,
    then the tree inflated from those bytes alone."""
    objects = get_all_nested_objects(content)
    wire = {object_id: obj.deflate() for object_id, obj in objects.items()}
    return inflate_object_from_contents(content.object_id, wire, keep_object_contents=True)


def test_a_packed_message_arrives_byte_for_byte_in_fewer_objects() -> None:
    content = RecordDict(
        {
            "arrays": _arrays(),
            "single": ArrayRecord({"w": Array(np.arange(6, dtype=np.float32))}),
            "config": ConfigRecord({"lr": 0.1, "method": "fedavg"}),
            "metrics": MetricRecord({"loss": 0.5}),
        }
    )
    packed = pack_content(content)
    assert is_packed(packed) and not is_packed(content)
    assert list(packed["arrays"].keys()) == [PACKED_KEY]
    assert packed["single"] is content["single"]  # one array: nothing to gain, sent as it is
    assert packed["config"] is content["config"]
    _same(content["arrays"], _arrays())  # the original is left as it was
    received = unpack_content(_over_the_wire(packed))
    assert list(received.keys()) == list(content.keys())
    _same(received["arrays"], content["arrays"])
    _same(received["single"], content["single"])
    assert dict(received["config"]) == dict(content["config"])
    # The numbers decode as they were sent (Flower's own decoding of the restored arrays).
    for key in content["arrays"]:
        np.testing.assert_array_equal(
            received["arrays"][key].numpy(), content["arrays"][key].numpy()
        )
    # An Array and an ArrayChunk for each of the 12 arrays (identical ones sent once: 27
    # objects in all) become one pair; the one-array record and the others stay: 9 objects.
    assert len(get_all_nested_objects(packed)) == 9
    assert len(get_all_nested_objects(content)) > 2 * 9


def test_a_shared_record_packs_to_one_object_and_a_large_one_is_chunked() -> None:
    model = _arrays()
    first, second = (
        pack_content(RecordDict({"arrays": model})),
        pack_content(RecordDict({"arrays": model})),
    )
    assert first["arrays"].object_id == second["arrays"].object_id  # Flower sends it once
    big = ArrayRecord(
        {
            f"w{i}": Array(np.full(FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE // 8, i, np.float32))
            for i in range(5)
        }
    )  # 2.5 chunks' worth
    packed = pack_arrays(big)
    assert len(packed[PACKED_KEY].slice_array()) == 3
    _same(unpack_content(_over_the_wire(RecordDict({"a": packed})))["a"], big)


def _blob(record: ArrayRecord) -> bytes:
    return record[PACKED_KEY].data


def _with_blob(blob: bytes) -> RecordDict:
    array = Array(dtype="bytes", shape=(len(blob),), stype="pflarena.packed/1", data=blob)
    return RecordDict({"arrays": ArrayRecord({PACKED_KEY: array})})


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda b: b[:-1], "runs past the end"),
        (lambda b: b + b"\0", "bytes follow its last array"),
        (lambda b: b[:20], "truncated"),
        (lambda b: b"PFLPACK2" + b[8:], "no header"),  # another version's format
        (lambda b: b[:12] + b"{" + b[13:], "not JSON"),
        (lambda b: b[:12] + b'{"a":1}'.ljust(len(b) - 12), "not JSON|not a list"),
    ],
)
def test_a_damaged_packed_record_is_refused_by_name(damage, says) -> None:
    blob = _blob(pack_arrays(_arrays()))
    with pytest.raises(PackingError, match=says):
        unpack_content(_with_blob(damage(blob)))


def _npy(array: np.ndarray) -> bytes:
    return Array(array).data


def _forged(table: object, *datas: bytes) -> RecordDict:
    """A packed record whose table is ``table`` (JSON, or bytes as they are) and whose
    arrays' bytes are ``datas``."""
    head = table if isinstance(table, bytes) else json.dumps(table).encode()
    return _with_blob(b"PFLPACK1" + len(head).to_bytes(4, "big") + head + b"".join(datas))


W2 = _npy(np.zeros(2, np.float32))  # a float32 array of shape (2,), as Flower writes it


@pytest.mark.parametrize(
    ("table", "datas", "says"),
    [
        ([["w", "float32", [2], "numpy.ndarray", -1]], [], "malformed table entry"),
        ([["w", "float32", [2], "numpy.ndarray", len(W2)]] * 2, [W2, W2], "appears twice"),
        ([["w", "float32", "2", "numpy.ndarray", len(W2)]], [W2], "malformed table entry"),
        ({}, [], "not a list"),
        # JSON's true is Python's True, an int to isinstance: refused as a dimension
        ([["w", "float32", [True, 2], "numpy.ndarray", len(W2)]], [W2], "malformed table entry"),
        ([["w", "float32", [2], "numpy.ndarray", True]], [W2], "malformed table entry"),
        ([["w", "float32", [2.0], "numpy.ndarray", len(W2)]], [W2], "malformed table entry"),
        ([["w", "object", [2], "numpy.ndarray", len(W2)]], [W2], "dtype 'object'"),
        ([["w", "<U3", [2], "numpy.ndarray", len(W2)]], [W2], "dtype '<U3'"),
        ([["w", "float32", [2], "torch.Tensor", len(W2)]], [W2], "stype 'torch.Tensor'"),
        ([["w", "float32", [1] * 40, "numpy.ndarray", len(W2)]], [W2], "40 dimensions"),
        ([["k" * 2000, "float32", [2], "numpy.ndarray", len(W2)]], [W2], "2000 characters"),
        # the shape against the bytes: the .npy header says (2,), the entry (3,) or (1, 2)
        ([["w", "float32", [3], "numpy.ndarray", len(W2)]], [W2], r"hold float32 \(2,\)"),
        ([["w", "float32", [1, 2], "numpy.ndarray", len(W2)]], [W2], "its bytes hold"),
        ([["w", "float64", [2], "numpy.ndarray", len(W2)]], [W2], "its entry says float64"),
        # an .npy header that says (2,) over 4 bytes instead of 8
        ([["w", "float32", [2], "numpy.ndarray", len(W2) - 4]], [W2[:-4]], "takes 8 bytes"),
        ([["w", "float32", [2], "numpy.ndarray", 8]], [b"\0" * 8], "not an .npy array"),
        (b"[" * 100_000, [], "nests deeper than 3"),
        (b'[["w","float32",[[[[2]]]],"numpy.ndarray",0]]', [], "nests deeper than 3"),
        (b"[" + b"9" * 5000 + b"]", [], "not JSON"),  # past Python's int digits limit
        (b"\xff\xfe", [], "not JSON"),
    ],
)
def test_a_forged_table_is_refused_by_name(table, datas, says: str) -> None:
    with pytest.raises(PackingError, match=says):
        unpack_content(_forged(table, *datas))


def test_the_bounds_on_the_table_and_its_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    from pflarena.core import packing

    entries = [[f"w{i}", "float32", [2], "numpy.ndarray", len(W2)] for i in range(3)]
    unpack_content(_forged(entries, W2, W2, W2))  # within the bounds
    monkeypatch.setattr(packing, "MAX_ARRAYS", 2)
    with pytest.raises(PackingError, match=r"3 arrays \(at most 2\)"):
        unpack_content(_forged(entries, W2, W2, W2))
    monkeypatch.setattr(packing, "MAX_TABLE_BYTES", 100)
    with pytest.raises(PackingError, match="a table of .* bytes"):
        unpack_content(_forged(entries, W2, W2, W2))
    # A table's length field past the bytes there are
    with pytest.raises(PackingError, match="truncated"):
        unpack_content(_with_blob(b"PFLPACK1" + (50).to_bytes(4, "big") + b"[]"))


def test_brackets_inside_keys_do_not_count_as_nesting() -> None:
    keys = ["a[[[[b", "c]]]}{", 'd\\"[[[[', '"']
    record = ArrayRecord({k: Array(np.arange(3, dtype=np.int16) + i) for i, k in enumerate(keys)})
    _same(unpack_content(pack_content(RecordDict({"a": record})))["a"], record)


def test_only_numpy_arrays_of_plain_dtypes_are_packed() -> None:
    big_endian = ArrayRecord({"a": Array(np.arange(3, dtype=">f4")), "b": Array(np.ones(2))})
    other = ArrayRecord(
        {"a": Array("float32", (2,), "custom.stype", b"12345678"), "b": Array(np.ones(2))}
    )
    plain = ArrayRecord({"a": Array(np.ones(2, np.float32)), "b": Array(np.ones(2))})
    assert not packable(big_endian) and not packable(other) and packable(plain)
    content = RecordDict({"be": big_endian, "other": other, "plain": plain})
    packed = pack_content(content)
    assert packed["be"] is big_endian and packed["other"] is other  # Flower's tree
    assert list(packed["plain"].keys()) == [PACKED_KEY]
    with pytest.raises(PackingError, match="'a' is numpy.ndarray >f4"):
        pack_arrays(big_endian)


# ------------------------------------------------------------------ the deployment's Grid
def _metadata(node: int, reply_to: str = "") -> Metadata:
    """A message to ``node`` or, with ``reply_to``, a reply from it."""
    src, dst = (node, 0) if reply_to else (0, node)
    return Metadata(7, "", src, dst, reply_to, "1", time.time(), 600.0, "train")


@pytest.fixture
def serverapp(monkeypatch: pytest.MonkeyPatch) -> None:
    serverapp_identity(monkeypatch)


def _train(node: int) -> Message:
    return Message(RecordDict({"arrays": _arrays()}), dst_node_id=node, message_type="train")


def test_the_deployment_grid_packs_on_the_way_out_and_unpacks_replies(serverapp) -> None:
    def answer(node: int, message: Message) -> Message:
        assert is_packed(message.content)  # what travelled was packed
        model = unpack_content(message.content)["arrays"]
        model["bias-of-" + str(node)] = Array(np.full(2, node, np.float32))
        reply = RecordDict({"arrays": model, "metrics": MetricRecord({"n": node})})
        return Message(pack_content(reply), reply_to=message)

    link = FakeSuperLink(answer)
    grid = PromptGrid(link.grid(), poll=0.01, pack=True)
    messages = [_train(node) for node in (1, 2)]
    replies = list(grid.send_and_receive(messages, timeout=5))
    assert [r.metadata.src_node_id for r in replies] == [1, 2]
    for message in messages:  # the ServerApp's own messages keep their unpacked content
        _same(message.content["arrays"], _arrays())
    for reply in replies:
        node = reply.metadata.src_node_id
        assert not is_packed(reply.content)
        assert list(reply.content["arrays"].keys())[-1] == f"bias-of-{node}"
        _same(
            ArrayRecord({k: v for k, v in reply.content["arrays"].items() if "bias-of" not in k}),
            _arrays(),
        )


def test_an_unreadable_packed_reply_costs_only_its_sender(serverapp) -> None:
    def answer(node: int, message: Message) -> Message:
        reply = pack_content(RecordDict({"arrays": unpack_content(message.content)["arrays"]}))
        if node == 2:  # a broken or hostile client: its packed bytes cut short
            reply = _with_blob(_blob(reply["arrays"])[:-3])
        return Message(reply, reply_to=message)

    grid = PromptGrid(FakeSuperLink(answer).grid(), poll=0.01, pack=True)
    messages = [_train(node) for node in (1, 2, 3)]
    replies = {r.metadata.src_node_id: r for r in grid.send_and_receive(messages, timeout=5)}
    assert replies[2].has_error() and "unreadable reply: PackingError" in replies[2].error.reason
    assert replies[2].metadata.reply_to_message_id == messages[1].metadata.message_id
    for node in (1, 3):
        _same(replies[node].content["arrays"], _arrays())


def test_the_grid_without_packing_sends_flowers_objects(serverapp) -> None:
    link = FakeSuperLink(lambda node, message: Message(message.content, reply_to=message))
    grid = PromptGrid(link.grid(), poll=0.01)
    (reply,) = grid.send_and_receive([_train(1)], timeout=5)
    assert not is_packed(link.pushed[0].content)
    _same(reply.content["arrays"], _arrays())


# ------------------------------------------------------------------ the ClientApp
def test_the_clientapp_answers_packed_with_packed_and_plain_with_plain() -> None:
    from pflarena.client.app import _packed_like_the_message

    seen: list[RecordDict] = []

    def handler(msg: Message, context) -> Message:
        seen.append(msg.content)
        return make_message(_metadata(0, "x"), RecordDict({"arrays": msg.content["arrays"]}))

    wrapped = _packed_like_the_message(handler)
    reply = wrapped(
        make_message(_metadata(1), pack_content(RecordDict({"arrays": _arrays()}))), None
    )
    assert not is_packed(seen[-1]) and is_packed(reply.content)
    _same(unpack_content(reply.content)["arrays"], _arrays())
    reply = wrapped(make_message(_metadata(1), RecordDict({"arrays": _arrays()})), None)
    assert not is_packed(seen[-1]) and not is_packed(reply.content)
