"""An in-memory SuperLink for the deployment Grid's tests (``pflarena/server/polling.py``).

Flower's own ``HttpGrid`` talks to it, through its protobuf-over-HTTP client and its retry
invoker, over httpx's ``MockTransport``: only the SuperLink's side is replaced. It keeps what
a SuperLink keeps (messages, replies, objects by their SHA-256 id, checked and validated on
push as the SuperLink's object store does), and it hands a reply over once, as flwr 1.41's
Runtime API does: a pull deletes the message and its reply from the state before the answer
leaves, and the reply's objects stay until the ServerApp confirms it received them.

The nodes are a function: ``answer(node_id, message)`` gives a node's reply to a message (a
``Message`` built with ``reply_to``, deflated into objects as a node pushes it), ``None`` (no
reply yet) or :data:`UNAVAILABLE` (the SuperLink's "node unavailable" error). A node answers
when a pull first asks for the message's reply.

Faults are functions of the request path, consulted before each request: they may raise
(``httpx.ConnectError``: the SuperLink down), answer with a status (500 "database is locked",
503), or (:meth:`FakeSuperLink.lose_next_pull_answer`) let the SuperLink serve a pull and lose
its answer on the way back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from flwr.app import Error, Message, Metadata
from flwr.app.message import make_message, remove_content_from_message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.serde import message_to_proto
from flwr.proto.message_pb2 import (
    ConfirmMessageReceivedRequest,
    ConfirmMessageReceivedResponse,
    ObjectTree,
    PullObjectRequest,
    PullObjectResponse,
    PushObjectRequest,
    PushObjectResponse,
)
from flwr.proto.node_pb2 import NodeInfo
from flwr.proto.runtime_pb2 import (
    GetNodesRequest,
    GetNodesResponse,
    PullAppMessagesRequest,
    PullAppMessagesResponse,
    PushAppMessagesRequest,
    PushAppMessagesResponse,
)
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    get_object_id,
    get_object_tree,
    iterate_object_tree,
)
from flwr.supercore.inflatable.inflatable_utils import (
    inflate_object_from_contents,
    validate_object_content,
)
from flwr.supercore.run import Run
from flwr.superlink.grid.http_grid import HttpGrid

__all__ = ["UNAVAILABLE", "FakeSuperLink", "serverapp_identity", "status"]

RUN_ID = 7
#: ``answer``'s value for a node the SuperLink holds unavailable.
UNAVAILABLE = "unavailable"


def serverapp_identity(monkeypatch: Any) -> None:
    """This process as a ServerApp of run :data:`RUN_ID` (what Flower's ``Message`` reads
    for a new message's metadata), undone by ``monkeypatch`` after the test."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", RUN_ID), ("_node_id", SUPERLINK_NODE_ID), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def status(code: int, request: httpx.Request) -> httpx.Response:
    """The SuperLink's answer with HTTP ``code`` (its generic JSON body)."""
    return httpx.Response(code, json={"detail": "Internal Server Error"}, request=request)


class FakeSuperLink:
    """The SuperLink's side of the Runtime API, in memory (the module docstring)."""

    def __init__(
        self, answer: Callable[[int, Message], Any], nodes: tuple[int, ...] = (1, 2, 3)
    ) -> None:
        self.answer = answer
        self.nodes = nodes
        self.trees: dict[str, ObjectTree] = {}  # instruction id -> its object tree
        self.objects: dict[str, bytes] = {}
        self.replies: dict[str, tuple[Any, ObjectTree]] = {}  # instruction id -> reply
        self.answered: set[str] = set()  # instructions a node has answered (or refused)
        self.confirmed: list[str] = []
        self.object_pulls: dict[str, int] = {}
        self.paths: list[str] = []  # every request, in order
        #: the instructions, as a node inflates them (once each, as a node first sees them)
        self.pushed: list[Message] = []
        self.faults: list[Callable[[httpx.Request], httpx.Response | None]] = []

    # ------------------------------------------------------------------ the Grid
    def grid(self) -> HttpGrid:
        """Flower's ``HttpGrid`` for a run on this SuperLink (its transport replaced)."""
        grid = HttpGrid("superlink.test:9091", insecure=True, token="test-token")
        grid.set_run(Run.create_empty(RUN_ID))
        grid._runtime_client._client = httpx.Client(transport=httpx.MockTransport(self))
        return grid

    # ------------------------------------------------------------------ faults
    def down(self, requests: int) -> None:
        """The next ``requests`` requests find no SuperLink (a restart)."""
        left = [requests]

        def fault(request: httpx.Request) -> None:
            if left[0] > 0:
                left[0] -= 1
                raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

        self.faults.append(fault)

    def answer_with(self, code: int, requests: int, path: str = "") -> None:
        """The next ``requests`` requests (to ``path``, if given) answered with ``code``."""
        left = [requests]

        def fault(request: httpx.Request) -> httpx.Response | None:
            if left[0] > 0 and path in request.url.path:
                left[0] -= 1
                return status(code, request)
            return None

        self.faults.append(fault)

    def lose_next_pull_answer(self) -> None:
        """The next pull that hands a reply over is served, and its answer lost (the
        SuperLink stopped, or the connection dropped, before it arrived)."""
        self.lose_pull = True

    lose_pull = False

    # ------------------------------------------------------------------ the transport
    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.paths.append(path)
        for fault in self.faults:
            if (response := fault(request)) is not None:
                return response
        handlers = {
            "/v1/runtime/push-messages": (PushAppMessagesRequest, self._push_messages),
            "/v1/runtime/push-object": (PushObjectRequest, self._push_object),
            "/v1/runtime/pull-messages": (PullAppMessagesRequest, self._pull_messages),
            "/v1/runtime/pull-object": (PullObjectRequest, self._pull_object),
            "/v1/runtime/confirm-message-received": (ConfirmMessageReceivedRequest, self._confirm),
            "/v1/runtime/get-nodes": (GetNodesRequest, self._get_nodes),
        }
        if path not in handlers:
            return status(404, request)
        kind, handler = handlers[path]
        answer = handler(kind.FromString(request.content))
        if path.endswith("pull-messages") and self.lose_pull and answer.messages_list:
            self.lose_pull = False
            raise httpx.ReadError("Connection reset by peer", request=request)
        return httpx.Response(200, content=answer.SerializeToString(), request=request)

    def _push_messages(self, req: PushAppMessagesRequest) -> PushAppMessagesResponse:
        ids, missing = [], []
        for tree in req.message_object_trees:
            self.trees[tree.object_id] = tree
            ids.append(tree.object_id)
            missing += [
                t.object_id for t in iterate_object_tree(tree) if t.object_id not in self.objects
            ]
        return PushAppMessagesResponse(
            message_ids=ids, objects_to_push=list(dict.fromkeys(missing)), session_id="s"
        )

    def refuse_objects(self, pushes: int) -> None:
        """The next ``pushes`` objects pushed are not kept (``stored: false``: what the
        SuperLink answers when its SQLite state is locked while it stores one)."""
        self.refusals = pushes

    refusals = 0

    def _push_object(self, req: PushObjectRequest) -> PushObjectResponse:
        if self.refusals > 0:
            self.refusals -= 1
            return PushObjectResponse(stored=False)
        # As the SuperLink's object store: an object is kept only under its content's
        # SHA-256 and with a valid header.
        try:
            if get_object_id(req.object_content) != req.object_id:
                raise ValueError("Object ID does not match content hash")
            validate_object_content(content=req.object_content)
        except Exception:  # noqa: BLE001 - Flower's UnexpectedObjectContentError and others
            return PushObjectResponse(stored=False)
        self.objects[req.object_id] = req.object_content
        return PushObjectResponse(stored=True)

    def _pull_messages(self, req: PullAppMessagesRequest) -> PullAppMessagesResponse:
        protos, trees = [], []
        for mid in req.message_ids:
            if mid in self.trees and mid not in self.answered:
                self._let_node_answer(mid)
            if mid in self.replies:  # handed over once: deleted before the answer leaves
                proto, tree = self.replies.pop(mid)
                self.trees.pop(mid, None)
                protos.append(proto)
                trees.append(tree)
        return PullAppMessagesResponse(messages_list=protos, message_object_trees=trees)

    def _let_node_answer(self, mid: str) -> None:
        contents = {
            t.object_id: self.objects[t.object_id] for t in iterate_object_tree(self.trees[mid])
        }
        message = inflate_object_from_contents(mid, contents, keep_object_contents=True)
        message.metadata.__dict__["_message_id"] = mid
        if mid not in {m.metadata.message_id for m in self.pushed}:
            self.pushed.append(message)
        reply = self.answer(message.metadata.dst_node_id, message)
        if reply is None:
            return
        self.answered.add(mid)
        if reply == UNAVAILABLE:
            metadata = Metadata(
                run_id=RUN_ID, message_id="", src_node_id=SUPERLINK_NODE_ID,
                dst_node_id=SUPERLINK_NODE_ID, reply_to_message_id=mid, group_id="",
                created_at=message.metadata.created_at, ttl=10.0, message_type="train",
            )  # fmt: skip
            reply = make_message(
                metadata, error=Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable")
            )
        self.store_reply(mid, reply)

    def store_reply(self, mid: str, reply: Message) -> None:
        """``reply`` (to message ``mid``) as a node pushes it: its objects, then its record."""
        reply.metadata.__dict__["_message_id"] = reply.object_id
        for object_id, obj in get_all_nested_objects(reply).items():
            self.objects[object_id] = obj.deflate()
        proto = message_to_proto(remove_content_from_message(reply))
        self.replies[mid] = (proto, get_object_tree(reply))

    def delay_objects(self, pulls: int) -> None:
        """Every reply object is still on its way (preregistered, not yet pushed) for the
        first ``pulls`` pulls of it, as a node's large reply over a slow link is."""
        self.object_delay = pulls

    object_delay = 0

    def _pull_object(self, req: PullObjectRequest) -> PullObjectResponse:
        content = self.objects.get(req.object_id)
        if content is None:
            return PullObjectResponse(object_found=False, object_available=False)
        self.object_pulls[req.object_id] = self.object_pulls.get(req.object_id, 0) + 1
        if self.object_pulls[req.object_id] <= self.object_delay:
            return PullObjectResponse(object_found=True, object_available=False)
        return PullObjectResponse(object_found=True, object_available=True, object_content=content)

    def _confirm(self, req: ConfirmMessageReceivedRequest) -> ConfirmMessageReceivedResponse:
        self.confirmed.append(req.message_object_id)
        return ConfirmMessageReceivedResponse()

    def _get_nodes(self, req: GetNodesRequest) -> GetNodesResponse:
        return GetNodesResponse(nodes=[NodeInfo(node_id=n) for n in self.nodes])
