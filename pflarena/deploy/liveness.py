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
  there, and busy or briefly broken; but not forever: a SuperLink that has answered nothing
  but 500s for :data:`RETRY_ENV` seconds (default :data:`DEFAULT_RETRY_S`; a success resets
  the count) is not busy, and the node gives up, ending its loop (or its heartbeat), so
  that it exits for its supervisor as below, instead of heartbeating, listed online and
  sampled, while it serves nothing. A SuperLink that cannot be reached at all (transport
  errors, 502-504) is still waited for without limit, as Flower does: an edge node's link
  may be down for hours;
* when the heartbeat thread would end otherwise, logs why and stops the node the way Flower
  does on a refused credential (``SIGINT``, its graceful shutdown; a 401 is left to Flower,
  which is stopping the node already), then exits with status 1;
* when Flower's loop ends, logs it and exits with status 1 at once, whatever threads remain;

so that its supervisor (compose's ``restart:``, systemd's ``Restart=on-failure``) starts it
again and it activates anew.

**A node that comes back too soon is refused.** A SuperNode with a registered key (node
authentication) that stops without leaving (killed, a power loss) stays online on the
SuperLink until its heartbeats are missed: Flower's SuperNode heartbeats every ~24 s with an
interval of 30 s, and the SuperLink holds it online for ``HEARTBEAT_PATIENCE`` (2) intervals
after the last one. Started again within that minute, the node asks to be activated, the
SuperLink refuses (HTTP 412, ``[code: 2004] Failed to activate SuperNode``: it activates only
a node it holds registered or offline) and Flower's node exits at once with code 305, so a
supervisor that restarts it at once (or a bundle's ``start.sh``) fails. The SuperLink answers
an unregistered key with the same code and message (its reason, "No SuperNode found with the
given public key", stays in its own log), so the node cannot tell the two apart:
``pflarena supernode`` tries the activation again with Flower's back-off for
:data:`ACTIVATION_WAIT_ENV` seconds (default :data:`DEFAULT_ACTIVATION_WAIT_S`: the patience
and a margin), saying both causes, and then gives up as Flower does (code 305). An
unregistered key is therefore refused after that wait rather than at once.

The ServerApp's executor (Flower's ``flower-superexec``, polling the SuperLink for tasks) gives
a 500 up the same way and exits (seen with a SuperLink whose database was locked for 12 s: no
later run started), and a ServerApp it started watches its PID (``--parent-pid``) and stops
once it is gone.
:func:`keep_superexec_alive` (``python -m pflarena.deploy.liveness <flower-superexec flags>``)
retries its 500s within the same limit.

This leans on Flower internals (the connection's ``make_simple_http_retry_invoker`` and the
invoker's ``should_giveup`` and ``on_success``, the heartbeat class and its ``_run`` and
``_heartbeat``, ``HeartbeatFailure``):
:func:`keep_node_alive` fails, naming what moved, when the installed flwr differs.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from logging import ERROR, WARNING
from typing import Any

__all__ = [
    "ACTIVATION_WAIT_ENV",
    "DEFAULT_ACTIVATION_WAIT_S",
    "DEFAULT_RETRY_S",
    "LOOP_ENDED",
    "RETRY_ENV",
    "keep_node_alive",
    "keep_superexec_alive",
    "stopped_reason",
]

_RETRY_MODULE = "flwr.supercore.retry.http_retry"
_CONNECTION_MODULE = "flwr.supernode.fleet_http_connection"
_HEARTBEAT_MODULE = "flwr.supercore.heartbeat"
_SUPEREXEC_MODULE = "flwr.supercore.superexec.run_superexec"
#: What flwr 1.41 retries (502, 503, 504), and what this module adds (500).
FLOWER_RETRIED = frozenset({502, 503, 504})
SERVER_ERROR = 500
#: Environment variable: seconds of nothing but 500s after which the node gives up (the same
#: variable bounds the ServerApp's retries, :mod:`pflarena.server.polling`).
RETRY_ENV = "PFLARENA_SUPERLINK_RETRY_S"
DEFAULT_RETRY_S = 300.0
#: The status Flower handles itself (it stops the node on a refused credential).
_UNAUTHORIZED = 401
#: The SuperLink's answer to an activation it refuses: HTTP 412 with Flower's API error code
#: ``FLEET_NODE_ACTIVATION_FAILED`` (flwr 1.41: 2004).
_PRECONDITION_FAILED = 412
#: Environment variable: seconds a node whose activation is refused tries it again.
ACTIVATION_WAIT_ENV = "PFLARENA_ACTIVATION_WAIT_S"
#: Flower 1.41 holds a node online for 2 heartbeat intervals of 30 s after its last heartbeat
#: (``HEARTBEAT_PATIENCE`` x ``HEARTBEAT_DEFAULT_INTERVAL``, checked by
#: :func:`activation_wait_limit`), and a node heartbeats every ~24 s: a node that died is
#: activatable again at most 60 s later. 15 s more for the back-off's step (up to 20 s).
DEFAULT_ACTIVATION_WAIT_S = 75.0
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


class ServerErrorStreak:
    """How long the SuperLink has answered nothing but server errors to one kind of request
    (the node's loop, or its heartbeat), or refused to activate the node: from the first of
    them since the last success (from any thread), against ``limit_s``."""

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_s
        self._clock = clock
        self._since: float | None = None
        self._lock = threading.Lock()

    def failed(self) -> float:
        """Note a server error; the seconds the streak has lasted."""
        with self._lock:
            now = self._clock()
            if self._since is None:
                self._since = now
            return now - self._since

    def succeeded(self) -> None:
        with self._lock:
            self._since = None

    def exhausted(self) -> bool:
        """Note a server error; whether the streak has reached the limit."""
        return self.failed() >= self.limit_s


def _seconds(name: str, default: float, least: float) -> float:
    """Seconds from the environment variable ``name`` (``default`` where it is unset), at
    least ``least``; a ``ValueError`` naming the variable otherwise."""
    value = os.environ.get(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if not seconds >= least:
        raise ValueError(f"{name}={value!r} must be at least {least:g} s")
    return seconds


def retry_limit() -> float:
    """The node's limit on a streak of 500s, from :data:`RETRY_ENV` (seconds)."""
    return _seconds(RETRY_ENV, DEFAULT_RETRY_S, 1.0)


def activation_wait_limit() -> float:
    """Seconds a node whose activation is refused tries it again, from
    :data:`ACTIVATION_WAIT_ENV` (0: not at all, as Flower).

    Raises
    ------
    ValueError
        The variable is not a number of seconds, at least 0.
    RuntimeError
        The installed flwr holds a node online longer than the default covers.
    """
    from flwr.common import constant
    from flwr.supercore import error

    held = (
        getattr(constant, "HEARTBEAT_PATIENCE", None),
        getattr(constant, "HEARTBEAT_DEFAULT_INTERVAL", None),
    )
    missing = [
        name
        for name, ok in [
            ("flwr.common.constant's HEARTBEAT_PATIENCE x HEARTBEAT_DEFAULT_INTERVAL of at "
             "most 60 s", None not in held and held[0] * held[1] <= DEFAULT_ACTIVATION_WAIT_S - 15),
            ("flwr.supercore.error.ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED",
             hasattr(getattr(error, "ApiErrorCode", None), "FLEET_NODE_ACTIVATION_FAILED")),
            ("flwr.supercore.error.FlowerError.from_json",
             hasattr(getattr(error, "FlowerError", None), "from_json")),
        ]
        if not ok
    ]  # fmt: skip
    if missing:
        raise _flwr_differs(missing, "wait out a node still held online")
    return _seconds(ACTIVATION_WAIT_ENV, DEFAULT_ACTIVATION_WAIT_S, 0.0)


def _activation_refused(exc: Exception) -> bool:
    """Whether ``exc`` is the SuperLink's refusal to activate this node (code 2004)."""
    import httpx
    from flwr.supercore.error import ApiErrorCode, FlowerError

    if not (
        isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == _PRECONDITION_FAILED
    ):
        return False
    error = FlowerError.from_json(exc.response.text)
    return error is not None and error.code == ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED


def limit_server_errors(
    invoker: Any, streak: ServerErrorStreak, activation: ServerErrorStreak | None = None
) -> Any:
    """``invoker`` (Flower's HTTP ``RetryInvoker``) retrying a 500 as Flower retries 502-504,
    until ``streak`` reaches its limit; then it gives the request up (its error ends the
    node's loop). With ``activation``, a refused activation (a node with this key still
    held online, or an unregistered key: the module docstring) is retried too, until
    ``activation`` reaches its limit. Returns ``invoker``."""
    import httpx
    from flwr.common.logger import log

    flower_giveup = invoker.should_giveup
    flower_success = invoker.on_success

    def should_giveup(exc: Exception) -> bool:
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == SERVER_ERROR:
            if not streak.exhausted():
                return False
            log(ERROR, "pflarena supernode: the SuperLink has answered nothing but 500 for "
                "%.0f s (%s=%g); giving up, so that this node exits for its supervisor",
                streak.failed(), RETRY_ENV, streak.limit_s)  # fmt: skip
            return True
        if activation is not None and activation.limit_s > 0 and _activation_refused(exc):
            waited = activation.failed()
            if waited < activation.limit_s:
                if waited == 0:
                    log(WARNING, "pflarena supernode: the SuperLink refused to activate this "
                        "node (code 2004): a node with its key is still held online (one "
                        "that stopped without leaving less than a minute ago, until its "
                        "heartbeats are missed), or its key is not registered; trying again "
                        "for up to %.0f s (%s)", activation.limit_s,
                        ACTIVATION_WAIT_ENV)  # fmt: skip
                return False
            log(ERROR, "pflarena supernode: the SuperLink still refused to activate this node "
                "after %.0f s (%s=%g): is its key registered (flwr supernode register), and "
                "is no other node running with it?", waited, ACTIVATION_WAIT_ENV,
                activation.limit_s)  # fmt: skip
            return True
        return bool(flower_giveup(exc)) if flower_giveup is not None else False

    def on_success(state: Any) -> None:
        streak.succeeded()
        if activation is not None:
            activation.succeeded()
        if flower_success is not None:
            flower_success(state)

    invoker.should_giveup = should_giveup
    invoker.on_success = on_success
    return invoker


def retry_server_errors(
    streak: ServerErrorStreak,
    where: str = _CONNECTION_MODULE,
    activation: ServerErrorStreak | None = None,
) -> None:
    """Make this process's SuperNode connection (or the Flower module ``where``: each makes
    its retry invoker with ``make_simple_http_retry_invoker``) retry a request answered with
    500, as it retries 502-504 (with Flower's back-off), until ``streak`` reaches its limit;
    and a refused activation until ``activation`` (if given) reaches its limit."""
    module = importlib.import_module(where)
    retry = importlib.import_module(_RETRY_MODULE)
    make = getattr(module, "make_simple_http_retry_invoker", None)
    codes = getattr(retry, "_RETRYABLE_STATUS_CODES", None)
    if getattr(make, "_pflarena_limited", False):
        return
    if not callable(make) or not isinstance(codes, frozenset) or not codes >= FLOWER_RETRIED:
        raise _flwr_differs(
            [f"{where}.make_simple_http_retry_invoker",
             f"{_RETRY_MODULE}._RETRYABLE_STATUS_CODES"], "retry a 500",
        )  # fmt: skip

    def make_limited() -> Any:
        return limit_server_errors(make(), streak, activation)

    make_limited._pflarena_limited = True  # type: ignore[attr-defined]
    module.make_simple_http_retry_invoker = make_limited


def guard_node_heartbeat(
    stop: Callable[[str], None] = _interrupt_this_process,
    streak: ServerErrorStreak | None = None,
) -> type:
    """Make this process's SuperNode retry a heartbeat answered with any 5xx (until
    ``streak``, if given, reaches its limit), and call ``stop(reason)`` (default: interrupt
    this process) when its heartbeat thread would end otherwise. Returns the class the
    SuperNode's connection now uses (once guarded, the same class again)."""
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
                if code < 500 or (streak is not None and streak.exhausted()):
                    raise  # ends the thread, and the node with it (``_run``)
                log(WARNING, "pflarena supernode: the SuperLink answered a heartbeat with %s; "
                    "trying again", code)  # fmt: skip
                raise failure from exc
            if streak is not None:
                streak.succeeded()

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


def keep_superexec_alive() -> None:
    """Make this process's SuperExec (Flower's ``flower-superexec``, the ServerApp's
    executor) retry a task poll answered with 500 as it retries 502-504, until the SuperLink
    has answered nothing but 500 for :data:`RETRY_ENV` seconds. Flower's gives a 500 up and
    exits (the module docstring): no run starts until its supervisor starts it again, and
    the ServerApp it had started stops.

    Raises
    ------
    RuntimeError, ValueError
        As :func:`keep_node_alive`.
    """
    retry_server_errors(ServerErrorStreak(retry_limit()), where=_SUPEREXEC_MODULE)


def run_superexec(argv: list[str]) -> None:
    """``python -m pflarena.deploy.liveness <flower-superexec flags>``: Flower's SuperExec,
    kept alive (:func:`keep_superexec_alive`)."""
    try:
        keep_superexec_alive()
    except (RuntimeError, ValueError) as exc:
        raise SystemExit(f"pflarena superexec: {exc}") from None
    from flwr.supercore.cli.flower_superexec import flower_superexec

    sys.argv = ["flower-superexec", *argv]
    flower_superexec()


def keep_node_alive() -> None:
    """Both of the above for this process's SuperNode, and its refused activation tried
    again for :data:`ACTIVATION_WAIT_ENV` seconds (the module docstring).

    Raises
    ------
    RuntimeError
        The installed flwr differs from flwr 1.41 where they lean on it.
    ValueError
        :data:`RETRY_ENV` is not a number of seconds, at least 1, or
        :data:`ACTIVATION_WAIT_ENV` not one of at least 0.
    """
    limit = retry_limit()
    activation = ServerErrorStreak(activation_wait_limit())
    # Apart: a SuperLink that takes the heartbeats and answers every ask for messages with
    # 500 would otherwise keep the node listed online, and sampled, while it serves nothing.
    retry_server_errors(ServerErrorStreak(limit), activation=activation)
    guard_node_heartbeat(streak=ServerErrorStreak(limit))


if __name__ == "__main__":
    run_superexec(sys.argv[1:])
