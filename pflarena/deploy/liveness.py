"""A SuperNode that keeps serving through a SuperLink's passing errors, and exits, for its
supervisor to start it again, when it can no longer serve: never alive and unseen.

Measured with flwr 1.41 against a real SuperLink whose SQLite state was locked for 45 s (as a
SuperLink under load locks it: "database is locked", ``tests/test_liveness.py``):

* **A 500 ends the node's loop.** The SuperNode retries a request that fails by transport (no
  route, a timeout: a dropped Wi-Fi link) or with 502, 503 or 504, with a back-off (1 s
  doubling to 20 s), forever; any other answer ends its loop. The SuperLink answers a
  request that finds its database locked with 500.
* **A node whose loop ended does not exit.** Flower logs the error and returns, but with
  ``--isolation process`` the Runtime API's server thread keeps the process alive: it serves
  nothing, sends no heartbeat, and no supervisor restarts it, since it never exits.
* **The heartbeat thread ends alone.** The heartbeat (every 17-22 s, from a thread of its own,
  ``HeartbeatSender``) is retried on the same failures; any other answer (a 500, another
  4xx, a SuperLink that no longer knows the node) ends that thread and nothing else. The
  SuperLink holds a node online only while its heartbeats arrive (2 × 30 s), so it marks it
  offline and sends it nothing more while the node goes on asking for messages.

``pflarena supernode`` therefore (:func:`keep_node_alive`, and its ``main``):

* retries a request or heartbeat answered with 500 as Flower retries 502-504: the SuperLink is
  there, and busy or briefly broken;
* when the heartbeat thread would end otherwise, logs why and stops the node the way Flower
  does on a refused credential (``SIGINT``, its graceful shutdown; a 401 is left to Flower,
  which is stopping the node already), then exits with status 1;
* when Flower's loop ends, logs it and exits with status 1 at once, whatever threads remain;

so that its supervisor (compose's ``restart:``, systemd's ``Restart=on-failure``) starts it
again and it activates anew.

This leans on Flower internals (the retry invoker's ``_RETRYABLE_STATUS_CODES``, the
heartbeat class and its ``_run`` and ``_heartbeat``, ``HeartbeatFailure``):
:func:`keep_node_alive` fails, naming what moved, when the installed flwr differs.
"""

from __future__ import annotations

import importlib
import os
import signal
from collections.abc import Callable
from logging import ERROR, WARNING

__all__ = ["LOOP_ENDED", "keep_node_alive", "stopped_reason"]

_RETRY_MODULE = "flwr.supercore.retry.http_retry"
_CONNECTION_MODULE = "flwr.supernode.fleet_http_connection"
_HEARTBEAT_MODULE = "flwr.supercore.heartbeat"
#: What flwr 1.41 retries (502, 503, 504), and what this module adds (500).
FLOWER_RETRIED = frozenset({502, 503, 504})
SERVER_ERROR = 500
#: The status Flower handles itself (it stops the node on a refused credential).
_UNAUTHORIZED = 401
#: Why ``pflarena supernode`` exits when Flower's loop returns (it only returns on an error).
LOOP_ENDED = "Flower's SuperNode loop ended (its error is logged above)"

_stopped: list[str] = []


def stopped_reason() -> str | None:
    """Why the heartbeat guard stopped this process's SuperNode, or None if it did not."""
    return _stopped[0] if _stopped else None


def _interrupt_this_process(reason: str) -> None:
    """Flower's own way to stop a SuperNode from a thread (its graceful shutdown, which
    exits with status 0: ``pflarena supernode`` turns it into 1 by :func:`stopped_reason`)."""
    _stopped.append(reason)
    os.kill(os.getpid(), signal.SIGINT)


def _flwr_differs(missing: list[str], what: str) -> RuntimeError:
    import flwr

    return RuntimeError(
        f"flwr {flwr.__version__} lacks {', '.join(missing)} (as in flwr 1.41); pflarena "
        f"supernode cannot {what}"
    )


def retry_server_errors() -> None:
    """Make this process's Flower HTTP clients retry a request answered with 500, as they
    retry 502-504 (with their back-off, without limit)."""
    module = importlib.import_module(_RETRY_MODULE)
    codes = getattr(module, "_RETRYABLE_STATUS_CODES", None)
    if not isinstance(codes, frozenset) or not codes >= FLOWER_RETRIED:
        raise _flwr_differs([f"{_RETRY_MODULE}._RETRYABLE_STATUS_CODES"], "retry a 500")
    module._RETRYABLE_STATUS_CODES = codes | {SERVER_ERROR}


def guard_node_heartbeat(stop: Callable[[str], None] = _interrupt_this_process) -> type:
    """Make this process's SuperNode retry a heartbeat answered with any 5xx, and call
    ``stop(reason)`` (default: interrupt this process) when its heartbeat thread would end
    otherwise. Returns the class the SuperNode's connection now uses (once guarded, the same
    class again)."""
    import httpx
    from flwr.common.logger import log

    connection = importlib.import_module(_CONNECTION_MODULE)
    heartbeat = importlib.import_module(_HEARTBEAT_MODULE)
    base = getattr(heartbeat, "HeartbeatSender", None)
    failure = getattr(heartbeat, "HeartbeatFailure", None)
    current = getattr(connection, "HeartbeatSender", None)
    if isinstance(current, type) and getattr(current, "_pflarena_guarded", False):
        return current
    missing = [
        name
        for name, ok in [
            (f"{_HEARTBEAT_MODULE}.HeartbeatSender._run and ._heartbeat",
             base is not None and all(hasattr(base, m) for m in ("_run", "_heartbeat"))),
            (f"{_HEARTBEAT_MODULE}.HeartbeatFailure", isinstance(failure, type)),
            (f"{_CONNECTION_MODULE}.HeartbeatSender (the same class)", current is base),
        ]
        if not ok
    ]  # fmt: skip
    if missing:
        raise _flwr_differs(missing, "guard the node's heartbeat")

    class GuardedHeartbeatSender(base):  # type: ignore[misc, valid-type]
        """Flower's heartbeat thread: 5xx answers retried, and its end never silent."""

        _pflarena_guarded = True

        def _heartbeat(self) -> None:
            try:
                super()._heartbeat()
            except httpx.HTTPStatusError as exc:
                code = exc.response.status_code
                if code < 500:
                    raise
                log(WARNING, "pflarena supernode: the SuperLink answered a heartbeat with %s; "
                    "trying again", code)  # fmt: skip
                raise failure from exc

        def _run(self) -> None:
            try:
                super()._run()
            except Exception as exc:  # noqa: BLE001 - whatever ends the thread ends the node
                refused = (
                    isinstance(exc, httpx.HTTPStatusError)
                    and exc.response.status_code == _UNAUTHORIZED
                )
                if not self.is_running or refused:  # in this thread: stopped by its node
                    return  # the node is stopping already (Flower stops it on a 401)
                reason = f"{type(exc).__name__}: {exc}"
                log(ERROR, "pflarena supernode: the heartbeat to the SuperLink stopped (%s); "
                    "stopping this node, so that its supervisor starts it again: without "
                    "heartbeats the SuperLink holds it offline", reason)  # fmt: skip
                stop(reason)

    connection.HeartbeatSender = GuardedHeartbeatSender
    return GuardedHeartbeatSender


def keep_node_alive() -> None:
    """Both of the above for this process's SuperNode (the module docstring).

    Raises
    ------
    RuntimeError
        The installed flwr differs from flwr 1.41 where they lean on it.
    """
    retry_server_errors()
    guard_node_heartbeat()
