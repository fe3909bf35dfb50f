"""Bounded requests before authentication, and serving on an inherited socket
(``pflarena/deploy/limits.py``, ``pflarena/deploy/serving.py``).

The middleware is driven with hand-made ASGI messages (so the tests see exactly what it reads
and when), then on Flower's own SuperLink and SuperNode apps with Flower's own credentials (a
registered node's signature, a claimed task's token, the SuperExec secret's signature, the
operator's token). The header time limit runs on real uvicorn servers on 127.0.0.1 (plain and
TLS, httptools and h11) served on a socket bound here, through the ``uvicorn`` that
``serving`` gives Flower's entry points. The slow test starts a secure ``pflarena superlink``
on a socket the test bound and sends it a 256 MB declared body.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from pflarena.deploy.certs import make_certificates, make_operator_token, make_secret
from pflarena.deploy.limits import (
    FlowerCallers,
    RequestLimits,
    RequestLimitsMiddleware,
    default_max_body_bytes,
)
from pflarena.deploy.serving import (
    Serving,
    add_flags,
    check_serving_internals,
    limited_uvicorn,
    listen_socket,
    serving_from_flags,
)

KIB = 1024
SMALL = RequestLimits(max_body_bytes=64 * KIB, max_unauthenticated_bytes=4 * KIB,
                      request_timeout_s=0.3, header_timeout_s=0.5)  # fmt: skip


# ----------------------------------------------------------------- the middleware alone


class Inner:
    """An inner app that reads the whole body and answers 200; remembers what it read."""

    def __init__(self) -> None:
        self.bodies: list[list[bytes]] = []

    async def __call__(self, scope, receive, send) -> None:
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        self.bodies.append(parts)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"inner"})


class Checks:
    """A caller check that answers ``verdict`` and counts how often it was asked."""

    def __init__(self, verdict: bool) -> None:
        self.verdict = verdict
        self.calls = 0

    def __call__(self, scope) -> bool:
        self.calls += 1
        return self.verdict


def request(
    app: Any,
    chunks: list[bytes] | Iterator[bytes],
    *,
    length: int | None = None,
    pause_s: float = 0.0,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> tuple[int, dict[bytes, bytes], bytes, int]:
    """One POST through ``app``: the body in ``chunks`` (``pause_s`` before each), declared
    as ``length`` when given. Returns (status, headers, body, messages the app received)."""
    chunks = iter(chunks)
    pending = [next(chunks, None)]
    received = 0
    sent: list[dict] = []
    scope_headers = list(headers or [])
    if length is not None:
        scope_headers.append((b"content-length", str(length).encode()))

    async def receive() -> dict:
        nonlocal received
        received += 1
        if pause_s:
            await asyncio.sleep(pause_s)
        chunk = pending.pop()
        if chunk is None:
            return {"type": "http.disconnect"}
        pending.append(next(chunks, None))
        return {"type": "http.request", "body": chunk, "more_body": pending[0] is not None}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/fleet/push-object",
             "headers": scope_headers, "client": ("127.0.0.1", 5)}  # fmt: skip
    asyncio.run(app(scope, receive, send))
    if not sent:
        return 0, {}, b"", received
    return (
        sent[0]["status"],
        dict(sent[0]["headers"]),
        b"".join(m.get("body", b"") for m in sent[1:]),
        received,
    )


def endless(chunk: bytes) -> Iterator[bytes]:
    while True:
        yield chunk


def test_a_declared_oversize_body_is_refused_without_reading_it() -> None:
    inner, check = Inner(), Checks(False)
    status, headers, body, received = request(
        RequestLimitsMiddleware(inner, SMALL, check), endless(b"x" * KIB), length=256 * 2**20
    )
    assert status == 413 and received == 0 and inner.bodies == []
    assert headers[b"connection"] == b"close"
    assert b"exceeds this server's limit of 65536 bytes" in body
    assert check.calls == 0  # over the large cap: nobody may send it, no need to ask


def test_a_declared_body_over_the_small_cap_needs_an_authenticated_caller() -> None:
    stranger, member = Checks(False), Checks(True)
    data = [b"a" * KIB] * 8
    status, _, body, received = request(
        RequestLimitsMiddleware(Inner(), SMALL, stranger), data, length=8 * KIB
    )
    assert status == 413 and received == 0 and stranger.calls == 1
    assert b"limit of 4096 bytes from a caller it has not authenticated" in body
    inner = Inner()
    status, _, _, _ = request(RequestLimitsMiddleware(inner, SMALL, member), data, length=8 * KIB)
    assert status == 200 and inner.bodies == [data] and member.calls == 1


def test_a_small_body_passes_whole_without_asking_who_sent_it() -> None:
    inner, check = Inner(), Checks(False)
    data = [b"one", b"two", b"three"]
    status, _, body, _ = request(RequestLimitsMiddleware(inner, SMALL, check), data)
    assert (status, body) == (200, b"inner")
    assert inner.bodies == [data]  # as it came, message by message
    assert check.calls == 0


@pytest.mark.parametrize(("verdict", "cap"), [(False, 4 * KIB), (True, 64 * KIB)])
def test_a_streamed_body_is_stopped_at_its_callers_cap(verdict: bool, cap: int) -> None:
    inner, check = Inner(), Checks(verdict)
    status, headers, _, received = request(
        RequestLimitsMiddleware(inner, SMALL, check), endless(b"x" * KIB)
    )
    assert status == 413 and headers[b"connection"] == b"close" and inner.bodies == []
    assert received == cap // KIB + 1  # stopped at the first chunk past the cap
    assert check.calls == 1


def test_a_slow_body_is_timed_out() -> None:
    inner = Inner()
    started = time.monotonic()
    status, _, body, _ = request(
        RequestLimitsMiddleware(inner, SMALL, Checks(False)), [b"x"], pause_s=5.0
    )
    assert status == 408 and b"did not arrive within 0.3 s" in body and inner.bodies == []
    assert time.monotonic() - started < 2.0


def test_an_unauthenticated_body_must_arrive_whole_in_time_an_authenticated_one_not_stall() -> None:
    """Ten 1 KiB chunks 0.1 s apart: 1 s in all, over the 0.3 s limit but never stalling."""
    chunks = [b"x" * KIB] * 10
    small_cap = RequestLimits(64 * KIB, 512, request_timeout_s=0.3)
    member = Inner()
    status, _, _, _ = request(
        RequestLimitsMiddleware(member, small_cap, Checks(True)), chunks, pause_s=0.1
    )
    assert status == 200 and member.bodies == [chunks]
    everyone_small = RequestLimits(64 * KIB, 64 * KIB, request_timeout_s=0.3)
    status, _, body, _ = request(
        RequestLimitsMiddleware(Inner(), everyone_small, Checks(True)), chunks, pause_s=0.1
    )
    assert status == 408 and b"did not arrive within" in body


def test_a_client_that_leaves_gets_no_answer_and_reaches_nothing() -> None:
    inner = Inner()
    chunks = iter([b"x" * KIB])  # then a disconnect, though more was announced
    status, _, _, received = request(RequestLimitsMiddleware(inner, SMALL, Checks(True)), chunks)
    assert inner.bodies == [[b"x" * KIB]]  # one message, the whole body
    inner = Inner()
    status, _, _, received = request(
        RequestLimitsMiddleware(inner, SMALL, Checks(True)), iter([]), length=10
    )
    assert (status, inner.bodies, received) == (0, [], 1)


@pytest.mark.parametrize("value", [b"-1", b"12abc", b""])
def test_an_invalid_content_length_is_refused(value: bytes) -> None:
    status, _, body, received = request(
        RequestLimitsMiddleware(Inner(), SMALL, Checks(True)),
        [b"x"],
        headers=[(b"content-length", value)],
    )
    assert status == 400 and b"Content-Length" in body and received == 0


def test_other_scopes_pass_through() -> None:
    seen = []

    async def app(scope, receive, send) -> None:
        seen.append(scope["type"])

    asyncio.run(RequestLimitsMiddleware(app, SMALL, Checks(True))({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"max_body_bytes": 0}, "must be positive"),
        ({"max_unauthenticated_bytes": 2 * default_max_body_bytes()}, "at most the request body"),
        ({"request_timeout_s": 0}, "request_timeout_s 0"),
        ({"header_timeout_s": 1e9}, "header_timeout_s"),
    ],
)
def test_limits_that_cannot_work_are_refused(kwargs: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        RequestLimits(**kwargs)


def test_the_default_cap_fits_the_largest_message_a_deployment_sends() -> None:
    """A FAB at Flower's limit in ``start-run``, and a full array chunk in ``push-object``."""
    from flwr.common.constant import FAB_MAX_SIZE, FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    from flwr.proto.control_pb2 import StartRunRequest
    from flwr.proto.fab_pb2 import Fab
    from flwr.proto.message_pb2 import PushObjectRequest

    start_run = StartRunRequest(fab=Fab(hash_str="f" * 64, content=b"x" * FAB_MAX_SIZE))
    push = PushObjectRequest(
        object_id="0" * 64, object_content=b"x" * (FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE + 64)
    )
    largest = max(start_run.ByteSize(), push.ByteSize())
    assert largest < default_max_body_bytes() <= 2 * largest


# ----------------------------------------------------------------- Flower's callers


def _superlink_app(*, node_auth: bool = True, secret: bytes | None = None) -> Any:
    from flwr.superlink.main import create_app

    app = create_app()
    app.state.enable_supernode_auth = node_auth
    app.state.superexec_auth_secret = secret
    return app


def _node_headers(private_key, public_key, *, age_s: float = 0.0) -> dict[str, str]:
    """Flower's SuperNode's Fleet headers (``NodeAuthHttpInterceptor``), signed ``age_s`` ago."""
    import datetime

    from flwr.common.constant import TIMESTAMP_HEADER
    from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER
    from flwr.supercore.date import now
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes, sign_message

    timestamp = (now() - datetime.timedelta(seconds=age_s)).isoformat()
    return {
        FLEET_HTTP_PUBLIC_KEY_HEADER: b64encode(public_key_to_bytes(public_key)).decode(),
        TIMESTAMP_HEADER: timestamp,
        FLEET_HTTP_SIGNATURE_HEADER: b64encode(
            sign_message(private_key, timestamp.encode())
        ).decode(),
    }


def _scope(path: str, headers: dict[str, str], method: str = "POST") -> dict:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }


@pytest.fixture(scope="module")
def registered() -> tuple[Any, Any, Any, int]:
    """A SuperLink app with node authentication and one registered node: (app, private key,
    public key, node id)."""
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes

    app = _superlink_app()
    private_key, public_key = generate_key_pairs()
    state = app.state.linkstate_factory.state()
    node_id = state.create_node("operator", "operator", public_key_to_bytes(public_key), 0)
    return app, private_key, public_key, node_id


def test_a_registered_nodes_signature_authenticates_it_a_strangers_does_not(registered) -> None:
    from flwr.supercore.constant import FLEET_HTTP_SIGNATURE_HEADER
    from flwr.supercore.primitives.asymmetric import generate_key_pairs

    app, private_key, public_key, _ = registered
    callers = FlowerCallers(app)
    path = "/v1/fleet/push-object"
    assert callers(_scope(path, _node_headers(private_key, public_key)))
    other_private, other_public = generate_key_pairs()
    # Signed by another key, claiming the registered one: the signature does not verify.
    forged = _node_headers(private_key, public_key)
    forged[FLEET_HTTP_SIGNATURE_HEADER] = _node_headers(other_private, other_public)[
        FLEET_HTTP_SIGNATURE_HEADER
    ]
    assert not callers(_scope(path, forged))
    assert not callers(_scope(path, _node_headers(other_private, other_public)))  # unregistered
    assert not callers(_scope(path, _node_headers(private_key, public_key, age_s=3600)))  # stale
    assert not callers(_scope(path, {}))
    # A path Flower reads no body for gets the small cap, signed or not.
    assert not callers(_scope("/v1/fleet/nothing-here", _node_headers(private_key, public_key)))
    assert not callers(_scope("/health", {}, method="GET"))
    # Without node authentication anyone may join: the Fleet API's callers all get the cap.
    assert FlowerCallers(_superlink_app(node_auth=False))(_scope(path, {}))


def test_a_registered_node_sends_a_large_body_to_flower_a_stranger_is_refused(registered) -> None:
    """Through the middleware to Flower's app: the node's body reaches Flower (which answers
    for itself), the stranger's is refused by its declared length."""
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.primitives.asymmetric import generate_key_pairs

    app, private_key, public_key, node_id = registered
    client = TestClient(RequestLimitsMiddleware(app, SMALL, FlowerCallers(app)))
    body = PushObjectRequest(
        node=Node(node_id=node_id), run_id=1, object_id="0" * 64, object_content=b"x" * 16 * KIB
    ).SerializeToString()
    headers = {"content-type": "application/protobuf"}
    node = client.post("/v1/fleet/push-object", content=body,
                       headers={**headers, **_node_headers(private_key, public_key)})  # fmt: skip
    assert node.status_code != 413 and "this server's limit" not in node.text, node.text
    stranger = client.post("/v1/fleet/push-object", content=body,
                           headers={**headers, **_node_headers(*generate_key_pairs())})  # fmt: skip
    assert stranger.status_code == 413 and "has not authenticated" in stranger.text


def test_a_claimed_tasks_token_authenticates_its_caller() -> None:
    from flwr.supercore.constant import TASK_TOKEN_HEADER, TaskType

    app = _superlink_app()
    state = app.state.linkstate_factory.state()
    run_id = state.create_run(None, None, None, {}, "default", None, None, TaskType.SERVER_APP)
    token = state.claim_task(state.get_tasks(run_ids=[run_id])[0].task_id)
    callers = FlowerCallers(app)
    assert callers(_scope("/v1/runtime/push-object", {TASK_TOKEN_HEADER: token}))
    assert callers(_scope("/v1/runtime/responses", {"Authorization": f"Bearer {token}"}))
    assert not callers(_scope("/v1/runtime/push-object", {TASK_TOKEN_HEADER: "0" * 64}))
    assert not callers(_scope("/v1/runtime/push-object", {}))
    assert not callers(_scope("/v1/runtime/responses", {"Authorization": "Bearer nope"}))


def test_the_superexec_secrets_signature_authenticates_a_task_acquirer() -> None:
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.auth import create_superexec_auth_metadata, derive_auth_secret

    secret = b"0123456789abcdef" * 4
    path = "/v1/runtime/acquire-task"
    method = "/flwr.proto.Runtime/AcquireTask"

    def signed(key: bytes) -> dict[str, str]:
        return create_superexec_auth_metadata(
            auth_secret=derive_auth_secret(key), method=method, request=AcquireTaskRequest()
        )

    callers = FlowerCallers(_superlink_app(secret=secret))
    assert callers(_scope(path, signed(secret)))
    assert not callers(_scope(path, signed(b"another secret, not the SuperLink's")))
    assert not callers(_scope(path, {}))
    assert FlowerCallers(_superlink_app(secret=None))(_scope(path, {}))  # no secret: anyone


def test_the_operators_token_authenticates_the_control_api() -> None:
    import hashlib

    token = "operator-secret-token-0123456789"
    app = _superlink_app()
    callers = FlowerCallers(app, hashlib.sha256(token.encode()).hexdigest())
    path = "/v1/control/start-run"
    assert callers(_scope(path, {"Authorization": f"Bearer {token}"}))
    assert not callers(_scope(path, {"Authorization": "Bearer someone-elses-token-000000"}))
    assert not callers(_scope(path, {}))
    assert FlowerCallers(app)(_scope(path, {}))  # no operator token: the API is anyone's


def test_the_supernodes_runtime_api_authenticates_its_tasks_only() -> None:
    from flwr.supercore.constant import TASK_TOKEN_HEADER, TaskType
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supernode.main import create_app
    from flwr.supernode.nodestate import NodeStateFactory

    factory = NodeStateFactory(objectstore_factory=ObjectStoreFactory())
    app = create_app(state_factory=factory, superexec_auth_secret=b"s" * 32)
    state = factory.state()
    state.store_run(Run.create_empty(run_id=7))
    token = state.claim_task(state.create_task(TaskType.CLIENT_APP, 7))
    callers = FlowerCallers(app)
    assert callers(_scope("/v1/runtime/push-object", {TASK_TOKEN_HEADER: token}))
    assert not callers(_scope("/v1/runtime/push-object", {TASK_TOKEN_HEADER: "x" * 64}))
    assert not callers(_scope("/v1/runtime/acquire-task", {}))
    # The SuperNode serves no Control or Fleet API: their paths get the small cap.
    assert not callers(_scope("/v1/control/start-run", {}))
    assert not callers(_scope("/v1/fleet/push-object", {}))


# ----------------------------------------------------------------- flags and the socket


def _flags(*argv: str) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_flags(parser)
    return parser.parse_known_args(list(argv))


@contextlib.contextmanager
def listening(kind: int = socket.SOCK_STREAM, listen: bool = True) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, kind)
    sock.bind(("127.0.0.1", 0))
    if listen:
        sock.listen()
    try:
        yield sock
    finally:
        sock.close()


def test_listen_fd_tells_flower_the_sockets_port_and_host() -> None:
    with listening() as sock:
        port = sock.getsockname()[1]
        serving, rest = serving_from_flags(*_flags("--listen-fd", str(sock.fileno()), "--insecure"))
        assert rest == ["--insecure", "--port", str(port), "--host", "127.0.0.1"]
        assert serving.listen is not None and serving.listen.getsockname()[1] == port
        serving.listen.detach()  # the test's socket closes it
        serving, rest = serving_from_flags(
            *_flags("--listen-fd", str(sock.fileno()), "--port", str(port), "--host", "0.0.0.0")
        )
        assert rest == ["--port", str(port), "--host", "0.0.0.0"]
        serving.listen.detach()


def test_limits_from_flags() -> None:
    serving, rest = serving_from_flags(
        *_flags(
            "--max-request-mb",
            "2",
            "--max-unauthenticated-kb",
            "8",
            "--request-timeout",
            "5",
            "--header-timeout",
            "1.5",
            "--port",
            "9091",
        )  # fmt: skip
    )
    assert serving.limits == RequestLimits(2 * 2**20, 8 * KIB, 5.0, 1.5)
    assert rest == ["--port", "9091"] and serving.listen is None
    assert serving_from_flags(*_flags())[0].limits == RequestLimits()


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--max-request-mb", "lots"], "--max-request-mb 'lots' is not a number"),
        (["--max-request-mb", "0"], "positive"),
        (["--request-timeout", "-1"], "positive"),
        (["--header-timeout", "7200"], "header_timeout_s 7200"),
        (["--max-request-mb", "1", "--max-unauthenticated-kb", "2048"], "exceeds --max-request-mb"),
        (["--listen-fd", "three"], "not a file descriptor number"),
        (["--listen-fd", "987"], "not an open file descriptor"),
    ],
)
def test_bad_flags_get_one_line_naming_the_problem(argv: list[str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        serving_from_flags(*_flags(*argv))
    assert "\n" not in str(caught.value)


def test_listen_fd_must_be_a_listening_tcp_socket_on_the_given_port(tmp_path: Path) -> None:
    with listening() as sock:
        fd, port = sock.fileno(), sock.getsockname()[1]
        with pytest.raises(ValueError, match=f"bound to port {port}, but --port is 1"):
            serving_from_flags(*_flags("--listen-fd", str(fd), "--port", "1"))
        assert sock.getsockname()[1] == port  # the descriptor is left open
    with listening(listen=False) as sock, pytest.raises(ValueError, match="is not listening"):
        listen_socket(sock.fileno())
    with (
        listening(socket.SOCK_DGRAM, listen=False) as sock,
        pytest.raises(ValueError, match="not a TCP"),
    ):
        listen_socket(sock.fileno())
    read, write = os.pipe()
    try:
        with pytest.raises(ValueError, match="is not a socket"):
            listen_socket(read)
    finally:
        os.close(read)
        os.close(write)


def test_the_commands_refuse_bad_serving_flags_in_one_line() -> None:
    from pflarena.deploy import superlink, supernode

    with pytest.raises(SystemExit, match="^pflarena superlink: --listen-fd 'x' is not a file"):
        superlink.main(["--insecure", "--listen-fd", "x"])
    with pytest.raises(SystemExit, match="^pflarena supernode: --max-request-mb '' is not"):
        supernode.main(["--insecure", "--max-request-mb", ""])


def test_a_moved_entry_point_stops_the_commands(monkeypatch) -> None:
    import importlib

    # (the package's ``flower_supernode`` attribute is the entry point, not its module)
    flower_supernode = importlib.import_module("flwr.supernode.cli.flower_supernode")
    check_serving_internals()
    monkeypatch.setattr(flower_supernode, "_start_supernode_http_api", lambda *a: None)
    with pytest.raises(RuntimeError, match=r"_start_supernode_http_api's uvicorn.Server\("):
        check_serving_internals()


# ----------------------------------------------------------------- real servers


async def ok_app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Any:
    return make_certificates(tmp_path_factory.mktemp("certs"), {"server": ["127.0.0.1"]})


@contextlib.contextmanager
def served(http: str, certificates: Any | None) -> Iterator[int]:
    """``ok_app`` on a socket bound here, through the ``uvicorn`` serving gives Flower's
    entry points (so on the inherited-socket path); yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    module = limited_uvicorn(Serving(SMALL, sock), lambda app: Checks(False))
    tls = {}
    if certificates is not None:
        cert, key = certificates.servers["server"]
        tls = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    config = module.Config(ok_app, host="127.0.0.1", port=1, http=http, lifespan="off",
                           log_config=None, log_level="error", **tls)  # fmt: skip
    server = module.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def connect(port: int, certificates: Any | None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if certificates is None:
        return sock
    context = ssl.create_default_context(cafile=str(certificates.ca_cert))
    return context.wrap_socket(sock, server_hostname="127.0.0.1")


def answer(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    started = time.monotonic()
    data = b""
    with contextlib.suppress(ConnectionResetError, ssl.SSLError):
        while chunk := sock.recv(4096):
            data += chunk
    return data, time.monotonic() - started


@pytest.mark.parametrize("http", ["httptools", "h11"])
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_slow_headers_are_cut_off(http: str, tls: bool, certificates) -> None:
    certs = certificates if tls else None
    with served(http, certs) as port:
        with connect(port, certs) as silent, connect(port, certs) as dripping:
            dripping.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            for sock in (silent, dripping):
                data, took = answer(sock)
                assert data.startswith(b"HTTP/1.1 408"), data
                assert b"did not arrive within 0.5 s" in data and took < 2.0
        with connect(port, certs) as keeps:
            keeps.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.8)  # longer than the header limit: waiting between requests is not it
            response = b""
            while not response.endswith(b"\r\n\r\nok"):
                response += keeps.recv(4096)
            assert response.startswith(b"HTTP/1.1 200")
            keeps.sendall(b"GET /health HTTP/1.1\r\nHost")  # the next request, dripping
            data, _ = answer(keeps)
            assert data.startswith(b"HTTP/1.1 408"), data


@pytest.mark.parametrize(("http", "status"), [("httptools", b"431"), ("h11", b"400")])
def test_oversize_headers_are_refused(http: str, status: bytes) -> None:
    with served(http, None) as port, connect(port, None) as sock:
        # Not ended: h11 bounds what it buffers of an incomplete request, httptools as much here.
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20 * KIB)
        data, took = answer(sock)
        assert data.startswith(b"HTTP/1.1 " + status) and took < 0.4, data


# ----------------------------------------------------------------- a real SuperLink


def _tls_request(port: int, ca: Path, head: bytes) -> tuple[bytes, float]:
    context = ssl.create_default_context(cafile=str(ca))
    started = time.monotonic()
    with context.wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1"
    ) as sock:
        sock.sendall(head)
        data, _ = answer(sock)
    return data, time.monotonic() - started


@pytest.mark.slow
def test_a_secure_superlink_on_an_inherited_socket_refuses_a_huge_body(tmp_path: Path) -> None:
    from pflarena.runtime.processes import flower_env

    certs_dir = tmp_path / "certs"
    certs = make_certificates(certs_dir, {"superlink": ["localhost", "127.0.0.1"]})
    _, digest = make_operator_token(certs_dir)
    secret = make_secret(certs_dir / "superlink.secret")
    cert, key = certs.servers["superlink"]
    with listening() as sock:
        port, fd = sock.getsockname()[1], sock.fileno()
        cmd = [sys.executable, "-m", "pflarena.cli", "superlink",
               "--operator-token-hash", str(digest), "--listen-fd", str(fd),
               "--ssl-ca-certfile", str(certs.ca_cert), "--ssl-certfile", str(cert),
               "--ssl-keyfile", str(key), "--isolation", "process",
               "--superexec-auth-secret-file", str(secret), "--enable-supernode-auth",
               "--disable-runtime-dependency-installation"]  # fmt: skip
        log = tmp_path / "superlink.log"
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, pass_fds=[fd], env=flower_env(tmp_path / "home"),
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        context = ssl.create_default_context(cafile=str(certs.ca_cert))
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/health", timeout=2,
                                            context=context) as health:  # fmt: skip
                    assert health.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.3)
        head = (b"POST /v1/fleet/push-object HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/protobuf\r\nContent-Length: 268435456\r\n\r\n")  # fmt: skip
        data, took = _tls_request(port, certs.ca_cert, head)
        assert data.startswith(b"HTTP/1.1 413"), data
        assert took < 5.0
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/health", timeout=5,
                                    context=context) as health:  # fmt: skip
            assert health.status == 200
        assert f"serving on the inherited socket (fd {fd}, 127.0.0.1:{port})" in log.read_text()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
