"""An in-process Flower Grid for fast tests: no SuperLink, no Ray, the real ClientApp.

Each "node" has its own ``Context`` (node config, persistent state, run config), so client
state persists across rounds exactly as on a SuperNode. Messages go through the real
``ClientApp`` handlers; a handler exception becomes an error reply, as in Flower.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity


class LocalGrid(Grid):
    def __init__(
        self,
        client_app: ClientApp,
        run_config: dict,
        num_nodes: int,
        *,
        node_configs: list[dict] | None = None,
        node_id_base: int = 1_000_003,
    ) -> None:
        self.client_app = client_app
        self.node_ids = [node_id_base * (i + 7) % 2**61 for i in range(num_nodes)]
        configs = node_configs or [
            {"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)
        ]
        self.contexts = {
            node_id: Context(
                run_id=1,
                node_id=node_id,
                node_config=dict(cfg),
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for node_id, cfg in zip(self.node_ids, configs, strict=True)
        }
        self.offline: set[int] = set()
        self.sent: list[Message] = []
        #: optional hook to tamper with a reply (tests of the server's reply checks)
        self.reply_filter: Callable[[Message], Message] | None = None
        self._run = Run.create_empty(run_id=1)
        # Messages read the run and node identity of the process that creates them.
        TaskIdentity.run_id = 1
        TaskIdentity.node_id = 0
        TaskIdentity.task_id = 0

    # -- Grid API -----------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(
            content=content,
            message_type=message_type,
            dst_node_id=dst_node_id,
            group_id=group_id,
            ttl=ttl,
        )

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.node_ids if n not in self.offline]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("LocalGrid answers through send_and_receive only")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("LocalGrid answers through send_and_receive only")

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            msg.metadata.__dict__["_src_node_id"] = 0
            msg.metadata.__dict__["_run_id"] = 1
            self.sent.append(msg)
            node_id = msg.metadata.dst_node_id
            if node_id in self.offline:
                continue  # no reply, as for a node that died
            try:
                reply = self.client_app(msg, self.contexts[node_id])
            except Exception as exc:  # noqa: BLE001 - mirrors Flower's error replies
                reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = node_id
            if self.reply_filter is not None:
                reply = self.reply_filter(reply)
            replies.append(reply)
        return replies
