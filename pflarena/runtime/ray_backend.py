"""Flower's ``RayBackend`` kept alive from one simulation run to the next, and giving up on a
client whose message outlived its time to live."""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import WARNING
from typing import Any

import ray
from flwr.app import Context, Message
from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
from flwr.supercore import log

__all__ = ["ReusableRayBackend"]


class ReusableRayBackend(RayBackend):
    """Flower's ``RayBackend`` whose Ray instance and actor pool serve several runs.

    ``build`` creates the pool once (a later run only brings its ClientApp loader), and
    ``terminate``, which Flower's ``run_api`` calls when a run ends, keeps the actors unless
    one was lost; :meth:`close` terminates them and shuts Ray down (Flower's ``terminate``).

    A slow client costs only itself: Flower's backend waits for an actor's result however
    long it takes, so a ClientApp that runs past the round timeout keeps its actor, and the
    messages of the next round queue behind it until honest clients time out too. Here a
    message is given until it expires (its ``created_at + ttl``; the run loop sets the TTL
    to ``round-timeout``, when the server stops waiting for it anyway): past that, the actor
    running it is killed and replaced by a new one, and the message gets no reply (the
    server records the client as not having replied within the round timeout). A message
    taken up after it expired is not run at all.

    An actor's first message is waited for as Flower does: it loads the ClientApp (torch,
    the data), which on a loaded machine can take longer than a short round timeout, and a
    new actor killed during its start-up would be replaced by another that starts up again.
    """

    _warm: set[str]

    def build(self, app_fn: Callable[[], Any]) -> None:
        if self.pool is None:
            super().build(app_fn)
        else:
            self.app_fn = app_fn

    def process_message(self, message: Message, context: Context) -> tuple[Any, Context]:
        """Run ``message`` on an actor until it expires; ``(None, context)`` when it does."""
        if self.pool is None or self.app_fn is None:
            return super().process_message(message, context)
        metadata = message.metadata
        remaining = metadata.created_at + metadata.ttl - time.time()
        node_id = metadata.dst_node_id
        if remaining <= 0:
            log(WARNING, "pflarena: node %d's message expired before it ran; not run", node_id)
            return None, context
        partition_id = context.node_config.get("partition-id", node_id)
        future = self.pool.submit(
            lambda a, a_fn, mssg, cid, state: a.run.remote(a_fn, mssg, cid, state),
            (self.app_fn, message, str(partition_id), context),
        )
        actor = self.pool._future_to_actor[future]._actor_id.hex()  # noqa: SLF001
        warm = self.__dict__.setdefault("_warm", set())
        ready, _ = ray.wait([future], timeout=remaining if actor in warm else None)
        warm.add(actor)
        if not ready:
            self._replace_actor(future)
            log(
                WARNING,
                "pflarena: node %d's ClientApp ran past the round timeout; its actor was "
                "replaced so that the clients after it are not kept waiting",
                node_id,
            )
            return None, context
        try:
            return self.pool.fetch_result_and_return_actor_to_pool(future)
        except Exception:
            self.pool.add_actor_back_to_pool(future)
            raise

    def _replace_actor(self, future: Any) -> None:
        """Kill the actor running ``future`` and put a new one in the pool in its place."""
        actor = self.pool._future_to_actor.pop(future)  # noqa: SLF001 - Flower's pool
        ray.kill(actor, no_restart=True)
        self.pool.pool.append(self.pool.create_actor_fn())

    def terminate(self) -> None:
        if self.pool is not None and len(self.pool.pool) < self.pool.num_actors:
            log(WARNING, "pflarena: an actor was lost; the next run gets a new pool")
            self.pool.terminate_all_actors()
            self.pool = None

    def close(self) -> None:
        """Terminate the actors and shut Ray down."""
        super().terminate()
        self.pool = None
