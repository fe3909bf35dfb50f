"""The in-process engine: the real ServerApp and ClientApp in one process, without Ray.

``pflarena run --engine inprocess`` runs a run with the same components as a Flower
simulation (the ServerApp and ClientApp that ``pyproject.toml`` names, the run config fused
by Flower from ``[tool.flwr.app.config]`` and the overrides, one ``Context`` per node with
``partition-id`` and ``num-partitions`` in its node config and its own ``state``), but the
Grid hands each message to the ClientApp in the same process, one node after another. It
is for machines without Ray (a GPU box whose Python has no Ray wheel, an edge device), for
debugging with a plain debugger, and for runs whose clients are too heavy to run several at
once anyway. It is sequential: a round takes the sum of its clients' times, where the Ray
engine overlaps as many clients as it has actors.

Every message and every reply crosses the Grid as Flower's wire format (``message_to_proto``
and back), as it does between a SuperLink and a SuperNode, so a ClientApp can never change
the server's copy of a record in place, and the run's ``rounds.jsonl`` is the one the Ray
engine gives (``tests/test_startup.py``).

A slow client costs only itself: each ClientApp call gets its message's time to live (the
run loop sets it to ``round-timeout``) from the moment it starts, in a thread of its own.
A call still running then is abandoned: the message gets no reply (the server records no
reply within the round timeout), the next client runs, and the node gets no further
message until that call has ended (a SuperNode works one message at a time). Python cannot
stop a thread, so an abandoned call runs on in the background until it returns.
"""

from __future__ import annotations

import gc
import threading
import uuid
from collections.abc import Callable, Iterable
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

__all__ = ["InProcessGrid", "run_inprocess"]


def _over_the_wire(message: Message) -> Message:
    """``message`` serialised and parsed back: a copy sharing nothing with the original."""
    return message_from_proto(message_to_proto(message))


class InProcessGrid(Grid):
    """A Flower Grid whose nodes are ClientApp calls in this process.

    Each node has its own ``Context`` (node config, persistent state, run config), so client
    state persists across rounds exactly as on a SuperNode. A handler's exception becomes an
    error reply, as in Flower. ``offline`` node ids get messages but send no reply (a node
    that died); ``reply_filter`` may replace a reply before the server sees it; with
    ``keep_sent`` every message sent is kept in ``sent`` (for tests).
    """

    def __init__(
        self,
        client_app: ClientApp,
        run_config: dict,
        num_nodes: int,
        *,
        node_configs: list[dict] | None = None,
        node_id_base: int = 1_000_003,
        run_id: int = 1,
        keep_sent: bool = False,
        wire: bool = True,
    ) -> None:
        self.client_app = client_app
        self.node_ids = [node_id_base * (i + 7) % 2**61 for i in range(num_nodes)]
        configs = node_configs or [
            {"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)
        ]
        self.contexts = {
            node_id: Context(
                run_id=run_id,
                node_id=node_id,
                node_config=dict(cfg),
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for node_id, cfg in zip(self.node_ids, configs, strict=True)
        }
        self.offline: set[int] = set()
        self.keep_sent = keep_sent
        self.wire = wire
        self.sent: list[Message] = []
        #: nodes whose last call ran past its message's time to live and still runs
        self.busy: dict[int, threading.Thread] = {}
        self.reply_filter: Callable[[Message], Message] | None = None
        self._replies: dict[str, Message] = {}  # pushed, not yet pulled
        self._run = Run.create_empty(run_id=run_id)
        # Messages read the run and node identity of the process that creates them.
        TaskIdentity.run_id = run_id
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
        """Deliver each message to its node's ClientApp now; the replies wait for
        :meth:`pull_messages`. Returns the messages' ids."""
        ids = []
        for msg in messages:
            reply = self._deliver(msg)
            ids.append(msg.metadata.message_id)
            if reply is not None:
                self._replies[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to those of ``message_ids`` that have one (once each, as Flower's)."""
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    def _deliver(self, msg: Message) -> Message | None:
        """Run ``msg`` through its node's ClientApp; its reply (None from an offline node)."""
        msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
        msg.metadata.__dict__["_src_node_id"] = 0
        msg.metadata.__dict__["_run_id"] = self._run.run_id
        if self.keep_sent:
            self.sent.append(msg)
        node_id = msg.metadata.dst_node_id
        if node_id in self.offline:
            return None  # no reply, as for a node that died
        if node_id in self.busy:
            if self.busy[node_id].is_alive():
                return None  # still on a message it ran too long on
            del self.busy[node_id]
        received = _over_the_wire(msg) if self.wire else msg
        reply = self._call(received, msg, node_id)
        if reply is None:
            return None
        reply.metadata.__dict__["_src_node_id"] = node_id
        if self.wire:
            reply = _over_the_wire(reply)
        if self.reply_filter is not None:
            reply = self.reply_filter(reply)
        return reply

    def _call(self, received: Message, msg: Message, node_id: int) -> Message | None:
        """The ClientApp's reply to ``received`` (an error reply if it raised), or None
        when it is still running once the message's time to live has passed."""
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["reply"] = self.client_app(received, self.contexts[node_id])
            except Exception as exc:  # noqa: BLE001 - mirrors Flower's error replies
                reason = f"{type(exc).__name__}: {exc}"
                outcome["reply"] = Message(Error(code=0, reason=reason), reply_to=msg)
            except BaseException as exc:  # an interrupt: raised again in the caller
                outcome["raise"] = exc

        thread = threading.Thread(target=call, name=f"pflarena-node-{node_id}", daemon=True)
        thread.start()
        thread.join(timeout=msg.metadata.ttl)
        if thread.is_alive():
            self.busy[node_id] = thread
            log(
                WARNING,
                "pflarena: node %d's ClientApp ran past the round timeout (%.0fs); "
                "no reply, the next client runs",
                node_id,
                msg.metadata.ttl,
            )
            return None
        if "raise" in outcome:
            raise outcome["raise"]
        return outcome["reply"]


def run_inprocess(app: Any, run_config: dict[str, Any], num_supernodes: int, scratch: Path) -> None:
    """One run of ``app`` (a :class:`~pflarena.runtime.simulation.FlowerApp`) in this process.

    ``run_config`` holds the overrides, fused with the app's defaults by Flower's own
    parser as for a simulation. Raises the ServerApp's exception if it raised (the app
    writes its own results files, a failed run's included).
    """
    import sys

    from flwr.common.config import get_fused_config_from_dir
    from flwr.supercore.object_ref import load_app

    from pflarena.runtime.flowerapp import flower_overrides, load_client_app

    if str(app.root) not in sys.path:
        sys.path.insert(0, str(app.root))
    overrides = flower_overrides(run_config, scratch)
    fused = get_fused_config_from_dir(app.root, overrides)
    server_app = load_app(app.server_app_attr, ValueError, str(app.root))
    grid = InProcessGrid(load_client_app(app), fused, num_supernodes)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=fused)
    # Everything imported so far (torch, Flower, half a million objects) lives as long as
    # the process: out of the collector's sight, a full collection no longer walks it
    # (about 0.2 s each, which fell inside some rounds and doubled them).
    gc.freeze()
    server_app(grid, context)
