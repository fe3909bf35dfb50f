"""Bounded requests for the SuperLink's and the SuperNodes' HTTP servers, before and after
their callers are authenticated.

In flwr 1.41 every protobuf request's body is read whole (``ProtobufTranslationMiddleware``
awaits ``request.body()``) before any of Flower's authentication runs, and uvicorn, which
serves Flower's apps, bounds neither a body's size nor the time its headers or its body take:
four 256 MiB bodies to the Fleet API take a SuperLink's resident memory up by gigabytes, kept
after its ``400``, and slow connections are held open for as long as their sender likes
(``benchmarks/results/request_limits.md``). Here:

* :class:`RequestLimits`: the settings (two body caps and two time limits).
* :class:`RequestLimitsMiddleware`: an ASGI middleware around Flower's app. It reads each
  request's body itself before Flower does, and refuses with ``413`` a body larger than its
  caller may send: a declared ``Content-Length`` without reading any of it, a streamed
  (chunked) body as soon as its bytes pass the cap. A body must arrive within
  :attr:`RequestLimits.request_timeout_s` (``408``). Every refusal closes the connection.
* :class:`FlowerCallers`: whether a caller is authenticated, from its request's headers
  alone, by the credential Flower checks later on that route: the operator's token (Control
  API, with ``--operator-token-hash``), a registered SuperNode's signature over a fresh
  timestamp (Fleet API, with ``--enable-supernode-auth``), a task token or the SuperExec
  secret's signature (Runtime API). Only callers it authenticates get the large cap; in a
  deployment that authenticates nobody on an API (no node authentication, no operator
  token, no SuperExec secret), that API's callers get it, since anyone may use the API
  anyway. A path Flower reads no body for gets the small cap whoever asks.
* :func:`protocol_class`: uvicorn's HTTP protocol (httptools, or h11 without it) that also
  closes a connection whose request headers do not arrive within
  :attr:`RequestLimits.header_timeout_s` (``408``), from the moment the connection is made
  (after the TLS handshake) or the next request's first byte; and that bounds what it holds
  of a request's incomplete headers (:data:`MAX_HEADER_BYTES`: h11 bounds them itself and
  answers ``400``; uvicorn's httptools protocol does not, and here answers ``431``).

Authentication is decided lazily: a body up to the small cap is read without asking (most
requests; Flower authenticates them afterwards as before); the caller is checked once, when a
declared length or the bytes read pass it. Until a caller is known to be authenticated its
whole body must arrive within the request timeout; an authenticated caller's body may take
longer, but never stall for longer than that.

The defaults, and why (``benchmarks/results/request_limits.md`` measures them):

* the authenticated cap, :func:`default_max_body_bytes` (15 MiB): the largest body a
  deployment sends is a ``start-run`` carrying its app (a FAB, which Flower's CLI keeps under
  ``FAB_MAX_SIZE``, 10 MiB) or an object pushed to the SuperLink or a SuperNode. A packed
  ``ArrayRecord`` (:mod:`pflarena.core.packing`) travels as one Flower ``Array`` whose bytes
  Flower cuts into ``ArrayChunk`` objects of ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE`` (5 MiB), so
  the largest built-in model (``resnet18``, 45 MB) is pushed as 5 MiB chunks, one request
  each; with 50 % headroom over the larger of the two bounds. The cap follows Flower's chunk
  size if that is raised through its environment variable.
* the unauthenticated cap, 64 KiB: the largest request a legitimate caller sends before it
  holds a credential (a SuperNode's ``register-node`` and ``activate-node``, its public key)
  is 227 bytes, and uvicorn buffers up to 64 KiB of every connection's body anyway
  (``HIGH_WATER_LIMIT``) before the app reads it.
* the request timeout, 30 s: Flower's own HTTP clients give up after 30 s without progress
  (``flwr/supercore/protobuf/client.py``), so a caller waiting longer has given up itself.
* the header timeout, 10 s: a client's request line and headers leave in one write.
"""

from __future__ import annotations

import asyncio
import binascii
import json
import math
from base64 import b64decode
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

from pflarena.deploy.routes import classify, operator_token_problem, route_paths

__all__ = [
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_UNAUTHENTICATED_BYTES",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "MAX_HEADER_BYTES",
    "FlowerCallers",
    "RequestLimits",
    "RequestLimitsMiddleware",
    "default_max_body_bytes",
    "protocol_class",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
#: Whether a request's caller is authenticated, from its scope (headers, path) alone.
CallerCheck = Callable[[Scope], bool]

KIB = 1 << 10
MIB = 1 << 20
#: Headroom of the authenticated cap over the largest body a deployment sends.
BODY_MARGIN = 1.5
#: What a caller may send before it is authenticated (bytes).
DEFAULT_MAX_UNAUTHENTICATED_BYTES = 64 * KIB
#: How long a body may take (unauthenticated: whole; authenticated: without progress).
DEFAULT_REQUEST_TIMEOUT_S = 30.0
#: How long a request's line and headers may take to arrive.
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: The most bytes of request line and headers: h11's default, which uvicorn's h11 protocol
#: applies; the httptools protocol here applies it too (uvicorn's own does not bound them).
MAX_HEADER_BYTES = 16 * KIB
#: The longest time limit accepted (seconds).
MAX_TIMEOUT_S = 3600.0


def default_max_body_bytes() -> int:
    """The authenticated cap: :data:`BODY_MARGIN` over the larger of Flower's FAB limit and
    its array chunk size, in whole MiB (15 MiB with flwr 1.41's defaults)."""
    from flwr.common.constant import FAB_MAX_SIZE, FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE

    largest = max(FAB_MAX_SIZE, FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE)
    return math.ceil(BODY_MARGIN * largest / MIB) * MIB


@dataclass(frozen=True)
class RequestLimits:
    """What a request may cost a server before and after its caller is authenticated.

    Parameters
    ----------
    max_body_bytes : int
        The largest body an authenticated caller may send (:func:`default_max_body_bytes`).
    max_unauthenticated_bytes : int
        The largest body a caller that is not authenticated may send.
    request_timeout_s : float
        An unauthenticated caller's whole body must arrive within it; an authenticated
        caller's body must never go this long without a byte.
    header_timeout_s : float
        A request's line and headers must arrive within it.
    """

    max_body_bytes: int = field(default_factory=default_max_body_bytes)
    max_unauthenticated_bytes: int = DEFAULT_MAX_UNAUTHENTICATED_BYTES
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"the request body cap must be positive, not {self.max_body_bytes}")
        if not 1 <= self.max_unauthenticated_bytes <= self.max_body_bytes:
            raise ValueError(
                f"the unauthenticated body cap ({self.max_unauthenticated_bytes} bytes) must be "
                f"positive and at most the request body cap ({self.max_body_bytes} bytes)"
            )
        for name in ("request_timeout_s", "header_timeout_s"):
            value = getattr(self, name)
            if not 0 < value <= MAX_TIMEOUT_S:
                raise ValueError(f"{name} {value:g}: choose more than 0 and at most "
                                 f"{MAX_TIMEOUT_S:g} seconds")  # fmt: skip


def _log(level: int, text: str, *args: Any) -> None:
    from flwr.common.logger import log

    log(level, text, *args)


def _client(scope: Scope) -> str:
    host, port = scope.get("client") or ("?", 0)
    return f"{host}:{port}"


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The request's ``Content-Length``, or None without one.

    Raises
    ------
    ValueError
        It is not a non-negative integer, or two differ.
    """
    values = {v.strip() for k, v in headers if k.lower() == b"content-length"}
    if not values:
        return None
    if len(values) > 1 or not next(iter(values)).isdigit():
        raise ValueError(
            f"an invalid Content-Length ({b', '.join(sorted(values)).decode('latin-1')})"
        )
    return int(next(iter(values)))


class _Caller:
    """One request's caller, authenticated or not once asked (and asked at most once)."""

    def __init__(self, check: CallerCheck, scope: Scope) -> None:
        self.check = check
        self.scope = scope
        self.authenticated: bool | None = None

    async def ask(self) -> bool:
        if self.authenticated is None:
            from anyio import to_thread

            # The check may look the caller up in Flower's state (SQLite): not on the loop.
            self.authenticated = await to_thread.run_sync(self.check, self.scope)
        return self.authenticated


class RequestLimitsMiddleware:
    """ASGI middleware: every request body read here first, within :class:`RequestLimits`.

    Parameters
    ----------
    app : ASGI application
        The app it protects (Flower's); it gets each body as it came, message by message.
    limits : RequestLimits
        The caps and time limits.
    authenticated : callable
        ``authenticated(scope) -> bool``: whether the caller is authenticated, from its
        request's headers (run in a worker thread, at most once per request, and only for a
        body larger than ``limits.max_unauthenticated_bytes``).
    """

    def __init__(self, app: Any, limits: RequestLimits, authenticated: CallerCheck) -> None:
        self.app = app
        self.limits = limits
        self.authenticated = authenticated

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            declared = declared_length(scope.get("headers", []))
        except ValueError as exc:
            await _refuse(scope, send, 400, f"the request carried {exc}")
            return
        caller = _Caller(self.authenticated, scope)
        if declared is not None and not await self._may_send(scope, send, caller, declared):
            return
        body = await self._read(scope, receive, send, caller)
        if body is None:
            return

        async def replay() -> Message:
            return body.popleft() if body else await receive()

        await self.app(scope, replay, send)

    async def _may_send(
        self, scope: Scope, send: Send, caller: _Caller, size: int, streamed: bool = False
    ) -> bool:
        """Whether ``caller`` may send ``size`` bytes (declared, or ``streamed`` so far); if
        not, refused (413)."""
        limits = self.limits
        if size <= limits.max_unauthenticated_bytes:
            return True
        if size <= limits.max_body_bytes and (caller.authenticated or await caller.ask()):
            return True
        if size > limits.max_body_bytes:
            cap, whom = limits.max_body_bytes, ""
        else:
            cap, whom = limits.max_unauthenticated_bytes, " from a caller it has not authenticated"
        what = f"over {cap} bytes so far" if streamed else f"{size} bytes declared"
        await _refuse(scope, send, 413, f"the request's body ({what}) exceeds this server's "
                      f"limit of {cap} bytes{whom}")  # fmt: skip
        return False

    async def _read(
        self, scope: Scope, receive: Receive, send: Send, caller: _Caller
    ) -> deque[Message] | None:
        """The body's messages, or None when refused (408, 413) or the client left."""
        limits = self.limits
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.request_timeout_s
        messages: deque[Message] = deque()
        size = 0
        while True:
            timeout = limits.request_timeout_s if caller.authenticated else deadline - loop.time()
            try:
                message = await asyncio.wait_for(receive(), max(timeout, 0.0))
            except asyncio.TimeoutError:
                seconds = f"{limits.request_timeout_s:g} s"
                if caller.authenticated:  # it may take longer in all, but not stall
                    detail = f"the request's body stalled for {seconds}"
                else:
                    detail = f"the request's body did not arrive within {seconds}"
                await _refuse(scope, send, 408, detail)
                return None
            if message["type"] == "http.disconnect":
                return None
            size += len(message.get("body", b""))
            if not await self._may_send(scope, send, caller, size, streamed=True):
                return None
            messages.append(message)
            if not message.get("more_body", False):
                return messages


async def _refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
    """Answer ``status`` with ``{"detail": ...}`` and close the connection."""
    _log(WARNING, "pflarena: refused %s %s from %s (%d): %s", scope.get("method", "?"),
         scope.get("path", ""), _client(scope), status, detail)  # fmt: skip
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------- Flower's callers


#: The Runtime API's route whose caller proves the SuperExec secret instead of a task token.
ACQUIRE_TASK_PATH = "/v1/runtime/acquire-task"
#: The Runtime API's route whose caller presents its task token as a bearer token.
RESPONSES_PATH = "/v1/runtime/responses"


def _flower_body_routes() -> set[tuple[str, str]]:
    """(method, path) of every route whose body Flower reads."""
    from flwr.supercore.protobuf.translation import PROTOBUF_REQUEST_TYPES

    return {*PROTOBUF_REQUEST_TYPES, ("POST", RESPONSES_PATH)}


def _acquire_task_method() -> str:
    """The method name Flower's SuperExec signature covers for ``acquire-task``."""
    import importlib
    from typing import get_args

    # (the package's ``router`` attribute is an APIRouter; the module is its namesake)
    router = importlib.import_module("flwr.supercore.routers.runtime.router")
    return str(get_args(router.AcquireTaskAuthDependency)[1].dependency.method)


class FlowerCallers:
    """Whether a request's caller is authenticated, from its headers, by the credential
    Flower checks later on its route (the module docstring lists them).

    Parameters
    ----------
    app : FastAPI
        Flower's SuperLink or SuperNode app (``create_app``); its ``state`` holds what the
        checks read (the SuperExec secret, whether nodes are authenticated, the states).
    operator_token_sha256 : str, optional
        The SHA-256 of the operator's token (``pflarena superlink --operator-token-hash``);
        without it the Control API authenticates no one, and its callers get the large cap.
    """

    def __init__(self, app: Any, operator_token_sha256: str | None = None) -> None:
        self.state = app.state
        served = set(route_paths(app))
        self.body_routes = {(m, p) for m, p in _flower_body_routes() if p in served}
        self.operator_token_sha256 = operator_token_sha256
        self.acquire_task_method = _acquire_task_method()

    def __call__(self, scope: Scope) -> bool:
        path = scope.get("path", "")
        if (scope.get("method"), path) not in self.body_routes:
            return False
        api = classify(path)
        if api == "control":
            return self._operator(scope)
        if api == "fleet":
            return self._node(scope)
        if api == "runtime":
            if path == ACQUIRE_TASK_PATH:
                return self._superexec(scope)
            if path == RESPONSES_PATH:
                return self._bearer_task(scope)
            return self._task(scope)
        return False

    def _operator(self, scope: Scope) -> bool:
        if self.operator_token_sha256 is None:
            return True
        token_sha256 = self.operator_token_sha256
        digest = token_sha256.encode() if isinstance(token_sha256, str) else token_sha256
        return not operator_token_problem(scope.get("headers", []), digest)

    def _node(self, scope: Scope) -> bool:
        """A registered SuperNode's signature over a fresh timestamp (Flower's own check,
        less the node id the body names, which Flower checks once it has read it)."""
        if not getattr(self.state, "enable_supernode_auth", False):
            return True
        from fastapi import HTTPException
        from flwr.proto.fleet_pb2 import ActivateNodeRequest
        from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER
        from flwr.superlink.routers.fleet.node_auth import authenticate_node
        from starlette.requests import Request

        request = Request({**scope, "state": {}})
        try:
            public_key = b64decode(request.headers[FLEET_HTTP_PUBLIC_KEY_HEADER], validate=True)
        except (KeyError, ValueError, binascii.Error):
            return False
        # Flower's check compares the key with the one a request to activate names.
        request.state.protobuf_request = ActivateNodeRequest(public_key=public_key)
        try:
            authenticate_node(request)
        except HTTPException:
            return False
        linkstate = self.state.linkstate_factory.state()
        return linkstate.get_node_id_by_public_key(public_key) is not None

    def _runtime_state(self) -> Any:
        factory = getattr(self.state, "runtime_state_factory", None)
        return None if factory is None else factory.state()

    def _task(self, scope: Scope) -> bool:
        """A task token Flower handed out (Flower's own check)."""
        from flwr.supercore.constant import TASK_TOKEN_HEADER
        from flwr.supercore.dependencies.task import authenticate_task
        from flwr.supercore.error import FlowerError
        from starlette.requests import Request

        state = self._runtime_state()
        if state is None:
            return False
        request = Request({**scope, "state": {}})
        try:
            authenticate_task(request, request.headers.get(TASK_TOKEN_HEADER), state)
        except FlowerError:
            return False
        return True

    def _bearer_task(self, scope: Scope) -> bool:
        values = [v for k, v in scope.get("headers", []) if k.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, token = values[0].decode("latin-1").partition(" ")
        state = self._runtime_state()
        if scheme.lower() != "bearer" or not token.strip() or state is None:
            return False
        return state.get_task_by_token(token.strip()) is not None

    def _superexec(self, scope: Scope) -> bool:
        """The SuperExec secret's signature over a fresh timestamp, a nonce and the body's
        declared SHA-256 (Flower checks the hash against the body and spends the nonce)."""
        secret = getattr(self.state, "superexec_auth_secret", None)
        if secret is None:
            return True
        from flwr.supercore.auth import (
            compute_superexec_signature,
            derive_auth_secret,
            verify_superexec_signature,
        )
        from flwr.supercore.constant import (
            MAX_TIMESTAMP_DIFF_SECONDS,
            MIN_TIMESTAMP_DIFF_SECONDS,
            SUPEREXEC_AUTH_BODY_SHA256_HEADER,
            SUPEREXEC_AUTH_NONCE_HEADER,
            SUPEREXEC_AUTH_SIGNATURE_HEADER,
            SUPEREXEC_AUTH_TIMESTAMP_HEADER,
        )
        from flwr.supercore.date import now

        names = (
            SUPEREXEC_AUTH_TIMESTAMP_HEADER,
            SUPEREXEC_AUTH_NONCE_HEADER,
            SUPEREXEC_AUTH_BODY_SHA256_HEADER,
            SUPEREXEC_AUTH_SIGNATURE_HEADER,
        )
        headers = scope.get("headers", [])
        found = [
            [v.decode("latin-1") for k, v in headers if k.lower() == n.encode()] for n in names
        ]
        if any(len(values) != 1 or not values[0] for values in found):
            return False
        timestamp_raw, nonce, body_sha256, signature = (values[0] for values in found)
        try:
            timestamp = int(timestamp_raw)
        except ValueError:
            return False
        age = now().timestamp() - timestamp
        if not MIN_TIMESTAMP_DIFF_SECONDS < age < MAX_TIMESTAMP_DIFF_SECONDS:
            return False
        expected = compute_superexec_signature(
            auth_secret=derive_auth_secret(secret),
            method=self.acquire_task_method,
            timestamp=timestamp,
            nonce=nonce,
            body_sha256=body_sha256,
        )
        try:
            return verify_superexec_signature(expected, signature)
        except TypeError:  # a signature that is not ASCII
            return False


# ---------------------------------------------------------------- uvicorn's protocols


def _closing_response(status: int, reason: str, detail: str) -> bytes:
    body = detail.encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class _HeaderLimits:
    """Mixin for uvicorn's HTTP protocols: the connection is closed (408) unless the request
    it waits for has its line and headers within ``header_timeout_s``, from the moment the
    connection is made or the request's first byte arrives."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    max_header_bytes: int = MAX_HEADER_BYTES
    _header_timer: asyncio.TimerHandle | None = None
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: tuple[str, int] | None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        """Start the clock, unless it runs."""
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _close_with(self, status: int, reason: str, detail: str) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        host, port = self.client or ("?", 0)
        _log(WARNING, "pflarena: closed the connection from %s:%s (%d): %s", host, port, status,
             detail)  # fmt: skip
        self.transport.write(_closing_response(status, reason, detail))
        self.transport.close()

    def _too_slow(self) -> None:
        self._header_timer = None
        self._close_with(408, "Request Timeout", "the request's headers did not arrive within "
                         f"{self.header_timeout_s:g} s")  # fmt: skip


def _httptools_class() -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HttpToolsWithHeaderLimits(_HeaderLimits, HttpToolsProtocol):
        """uvicorn's httptools protocol with the header time limit, and a cap on what it
        buffers of a request's incomplete headers (h11's, which uvicorn's h11 protocol has
        and its httptools protocol lacks)."""

        _incomplete_bytes = 0

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._header_timer is None or self.transport.is_closing():
                return
            # Headers still awaited: what httptools holds of them grew by at most this much.
            self._incomplete_bytes += len(data)
            if self._incomplete_bytes > self.max_header_bytes:
                self._close_with(431, "Request Header Fields Too Large", "the request's "
                                 f"headers exceed {self.max_header_bytes} bytes")  # fmt: skip

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            self._incomplete_bytes = 0
            super().on_headers_complete()

    return HttpToolsWithHeaderLimits


def _h11_class() -> type[asyncio.Protocol]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class H11WithHeaderLimits(_HeaderLimits, H11Protocol):
        """uvicorn's h11 protocol with the header time limit (h11 caps their size)."""

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                self._disarm()  # closed, or the request's headers are in
            else:
                self._arm()  # a request has begun: its headers are awaited

    return H11WithHeaderLimits


def protocol_class(limits: RequestLimits, http: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class ``http`` names (``auto``: httptools when installed,
    else h11, as uvicorn chooses), with ``limits``' header time limit.

    Raises
    ------
    ValueError
        ``http`` is not ``auto``, ``httptools`` or ``h11``.
    """
    if http == "auto":
        try:
            import httptools  # noqa: F401
        except ImportError:
            http = "h11"
        else:
            http = "httptools"
    if http == "httptools":
        base = _httptools_class()
    elif http == "h11":
        base = _h11_class()
    else:
        raise ValueError(f"uvicorn's http={http!r}: the header time limit is written for "
                         "'httptools' and 'h11'")  # fmt: skip
    return type(
        base.__name__,
        (base,),
        {"header_timeout_s": limits.header_timeout_s, "max_header_bytes": MAX_HEADER_BYTES},
    )
