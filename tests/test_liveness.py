"""A SuperNode kept alive (``pflarena/deploy/liveness.py``): Flower's heartbeat thread alone ends
in silence on an unexpected answer; guarded, a 5xx is retried and anything else stops the
node, for its supervisor to start again. Then against a real SuperLink: its SQLite state
locked (Flower's node ends its loop on the 500 and lingers, pflarena's retries), and through
proxies that answer as a broken SuperLink would."""

from __future__ import annotations

import http.client
import http.server
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from flwr.supercore import heartbeat as flower_heartbeat
from flwr.supernode import fleet_http_connection

from pflarena.deploy.liveness import (
    ACTIVATION_WAIT_ENV,
    DEFAULT_ACTIVATION_WAIT_S,
    LOOP_ENDED,
    RETRY_ENV,
    ServerErrorStreak,
    activation_wait_limit,
    guard_node_heartbeat,
    keep_superexec_alive,
    limit_server_errors,
    retry_limit,
    retry_server_errors,
)
from pflarena.runtime.launch import simulation_env
from pflarena.runtime.processes import Supervised, free_port, stop_all, wait_healthy

HEARTBEAT_PATH = "/v1/fleet/send-node-heartbeat"


def _http_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", f"http://superlink{HEARTBEAT_PATH}")
    response = httpx.Response(code, request=request, text="{}")
    return httpx.HTTPStatusError(f"{code}", request=request, response=response)


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., type]]:
    """``guard_node_heartbeat`` on Flower's own class, undone after the test."""
    monkeypatch.setattr(fleet_http_connection, "HeartbeatSender", flower_heartbeat.HeartbeatSender)
    yield guard_node_heartbeat


def _answers(*answers: object) -> tuple[Callable[[], bool], list[int]]:
    """A heartbeat function giving ``answers`` in turn (an exception is raised), then True;
    and the list of its calls."""
    calls: list[int] = []

    def fn() -> bool:
        calls.append(len(calls))
        answer = answers[len(calls) - 1] if len(calls) <= len(answers) else True
        if isinstance(answer, BaseException):
            raise answer
        return bool(answer)

    return fn, calls


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_flower_alone_ends_its_heartbeat_thread_in_silence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why the guard exists: an answer Flower does not expect ends the thread, and nothing
    else happens (the node would run on, unseen by its SuperLink)."""
    ended: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: ended.append(args.exc_value))
    fn, calls = _answers(RuntimeError("The SuperLink does not recognize this SuperNode."))
    sender = flower_heartbeat.HeartbeatSender(fn)
    sender.start()
    assert _wait(lambda: not sender._thread.is_alive(), 5.0)
    assert calls == [0]
    assert [str(e) for e in ended] == ["The SuperLink does not recognize this SuperNode."]


def test_a_heartbeat_answered_with_500_is_tried_again(guarded: Callable[..., type]) -> None:
    stopped: list[str] = []
    cls = guarded(stop=stopped.append)
    assert fleet_http_connection.HeartbeatSender is cls
    fn, calls = _answers(_http_error(500), _http_error(500))
    sender = cls(fn)
    sender.start()
    try:
        # Flower's back-off: 1 s, then 2 s; the third try succeeds and the thread goes on.
        assert _wait(lambda: len(calls) >= 3, 10.0), calls
        assert sender.is_running and not stopped
    finally:
        sender.stop()
    assert not stopped


@pytest.mark.parametrize(
    "answer",
    [RuntimeError("The SuperLink does not recognize this SuperNode."), _http_error(400)],
    ids=["unknown-node", "400"],
)
def test_a_heartbeat_thread_that_would_end_stops_the_node(
    guarded: Callable[..., type], answer: Exception
) -> None:
    stopped: list[str] = []
    sender = guarded(stop=stopped.append)(_answers(answer)[0])
    sender.start()
    assert _wait(lambda: bool(stopped), 5.0)
    assert stopped == [f"{type(answer).__name__}: {answer}"]
    assert not sender._thread.is_alive()


def test_a_refused_credential_and_a_normal_stop_are_left_to_flower(
    guarded: Callable[..., type],
) -> None:
    stopped: list[str] = []
    cls = guarded(stop=stopped.append)
    refused = cls(_answers(_http_error(401))[0])  # Flower itself stops the node on a 401
    refused.start()
    assert _wait(lambda: not refused._thread.is_alive(), 5.0)
    fine = cls(_answers()[0])
    fine.start()
    fine.stop()
    assert not stopped


def test_guarding_twice_keeps_one_guard(guarded: Callable[..., type]) -> None:
    first = guarded(stop=print)
    assert guarded(stop=print) is first
    assert first.__mro__[1] is flower_heartbeat.HeartbeatSender


def test_a_flower_without_the_heartbeat_internals_is_named(
    guarded: Callable[..., type], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(flower_heartbeat.HeartbeatSender, "_heartbeat")
    with pytest.raises(RuntimeError, match=r"HeartbeatSender\._run and \._heartbeat"):
        guarded()
    monkeypatch.undo()
    monkeypatch.setattr(fleet_http_connection, "HeartbeatSender", object)
    with pytest.raises(RuntimeError, match="the same class"):
        guarded()


class Clock:
    """A clock that advances only by the waits given to it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def wait(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def connection(monkeypatch: pytest.MonkeyPatch):
    """Flower's SuperNode connection module, its retry invoker factory restored after."""
    monkeypatch.setattr(
        fleet_http_connection,
        "make_simple_http_retry_invoker",
        fleet_http_connection.make_simple_http_retry_invoker,
    )
    return fleet_http_connection


def _requests(*answers: object) -> tuple[Callable[[], str], list[int]]:
    """A request giving ``answers`` in turn (an exception is raised), then "answered"."""
    calls: list[int] = []

    def request() -> str:
        calls.append(1)
        answer = answers[len(calls) - 1] if len(calls) <= len(answers) else "answered"
        if isinstance(answer, BaseException):
            raise answer
        return str(answer)

    return request, calls


@pytest.mark.parametrize("patched", [False, True], ids=["flower", "pflarena"])
def test_a_request_answered_with_500_is_tried_again(connection, patched: bool) -> None:
    """Flower's retry invoker gives a request answered with 500 up at once (the SuperNode's
    loop then ends); with :func:`retry_server_errors` the node's connection tries again, as
    after a 503."""
    if patched:
        retry_server_errors(ServerErrorStreak(300.0))
    invoker = connection.make_simple_http_retry_invoker()
    invoker.wait_function = lambda seconds: None
    request, calls = _requests(_http_error(500), _http_error(503))
    if patched:
        assert invoker.invoke(request) == "answered"
        assert len(calls) == 3
    else:
        with pytest.raises(httpx.HTTPStatusError):
            invoker.invoke(request)
        assert len(calls) == 1


def test_the_serverapp_executor_retries_a_500_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's SuperExec (the ServerApp's executor) gives a task poll answered with 500 up
    and exits; kept alive, it tries again."""
    from flwr.supercore.superexec import run_superexec

    monkeypatch.setattr(
        run_superexec,
        "make_simple_http_retry_invoker",
        run_superexec.make_simple_http_retry_invoker,
    )
    flower = run_superexec.make_simple_http_retry_invoker()
    request, calls = _requests(_http_error(500))
    with pytest.raises(httpx.HTTPStatusError):
        flower.invoke(request)
    keep_superexec_alive()
    kept = run_superexec.make_simple_http_retry_invoker()
    kept.wait_function = lambda seconds: None
    request, calls = _requests(_http_error(500), _http_error(500))
    assert kept.invoke(request) == "answered" and len(calls) == 3


def test_a_superlink_answering_only_500_is_given_up_after_the_limit(
    connection, caplog: pytest.LogCaptureFixture
) -> None:
    """500s with no success between them for the limit: the request is given up (its error
    ends the node's loop, and ``pflarena supernode`` exits); a success starts the count
    again, so a SuperLink that is only busy now and then is waited for."""
    clock = Clock()
    retry_server_errors(ServerErrorStreak(60.0, clock=clock))
    invoker = connection.make_simple_http_retry_invoker()
    invoker.wait_function = clock.wait
    invoker.jitter = None  # Flower's back-off as it is: 1, 2, 4, 8, 16, 20, 20... s
    request, calls = _requests(*[_http_error(500)] * 1000)
    with pytest.raises(httpx.HTTPStatusError, match="500"):
        invoker.invoke(request)
    assert 60.0 <= clock.t <= 60.0 + 20.0  # Flower's back-off waits at most 20 s
    assert "answered nothing but 500 for" in caplog.text

    clock.t = 0.0
    busy = [_http_error(500)] * 5  # 31 s of 500s each time (1 + 2 + 4 + 8 + 16 s)
    request, calls = _requests(*busy, "ok", *busy, "ok", *busy)
    for _ in range(3):
        invoker.invoke(request)
    assert clock.t == 93.0 and len(calls) == 18


def test_a_heartbeat_answered_only_with_500_stops_the_node_after_the_limit(
    guarded: Callable[..., type],
) -> None:
    clock = Clock()
    stopped: list[str] = []
    cls = guarded(stop=stopped.append, streak=ServerErrorStreak(30.0, clock=clock))
    fn, calls = _answers(*[_http_error(500)] * 1000)

    def heartbeat() -> bool:
        clock.wait(5.0)  # each try 5 s after the last
        return fn()

    sender = cls(heartbeat)
    sender._retry_invoker.wait_function = lambda seconds: None
    sender.start()
    assert _wait(lambda: bool(stopped), 5.0), calls
    assert stopped == ["HTTPStatusError: 500"]
    assert len(calls) == 7  # the first 500 at 5 s, the one 30 s later at 35 s


def test_a_heartbeat_500_streak_ends_with_a_success(guarded: Callable[..., type]) -> None:
    clock = Clock()
    stopped: list[str] = []
    cls = guarded(stop=stopped.append, streak=ServerErrorStreak(30.0, clock=clock))
    fn, calls = _answers(*[_http_error(500)] * 5, True, *[_http_error(500)] * 5)

    def heartbeat() -> bool:
        clock.wait(5.0)
        return fn()

    sender = cls(heartbeat)
    sender._retry_invoker.wait_function = lambda seconds: None
    sender._stop_event.wait = lambda seconds=None: sender._stop_event.is_set()  # no pause
    sender.start()
    try:
        assert _wait(lambda: len(calls) >= 13, 5.0), calls
        assert not stopped
    finally:
        sender.stop()


def test_the_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RETRY_ENV, "45")
    assert retry_limit() == 45.0
    for value, says in [("later", "not a number"), ("0.5", "at least 1 s")]:
        monkeypatch.setenv(RETRY_ENV, value)
        with pytest.raises(ValueError, match=f"{RETRY_ENV}='{value}' .*{says}"):
            retry_limit()


def test_a_flower_without_the_retried_codes_is_named(connection, monkeypatch) -> None:
    from flwr.supercore.retry import http_retry

    monkeypatch.setattr(http_retry, "_RETRYABLE_STATUS_CODES", frozenset({503}))
    with pytest.raises(RuntimeError, match="_RETRYABLE_STATUS_CODES"):
        retry_server_errors(ServerErrorStreak(300.0))


def _flower_refusal(code: int) -> httpx.HTTPStatusError:
    """The SuperLink's answer to an activation request that raised Flower's API error
    ``code``, as its HTTP error translator writes it (status and JSON body from Flower's
    catalog)."""
    from flwr.supercore.error import FlowerError
    from flwr.supercore.error.catalog import API_ERROR_MAP

    spec = API_ERROR_MAP[code]
    request = httpx.Request("POST", "http://superlink/v1/fleet/activate-node")
    body = FlowerError(code, "internal reason").to_json(spec.public_message)
    response = httpx.Response(spec.http_status_code, request=request, json=body)
    return httpx.HTTPStatusError(str(spec.http_status_code), request=request, response=response)


def test_a_refused_activation_is_tried_again_until_the_node_is_let_go(
    connection, caplog: pytest.LogCaptureFixture
) -> None:
    """A keyed node started again less than a minute after it died (the SuperLink still
    holds its key's node online) is refused with 412, code 2004: Flower gives the activation
    up at once (the node exits with 305); kept alive, it tries again with Flower's back-off
    and activates once the SuperLink lets the old node go (here after 51 s of refusals),
    saying why it waits; a refusal that lasts past the limit is given up, naming the key."""
    from flwr.supercore.error import ApiErrorCode

    refusal = _flower_refusal(ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED)
    assert refusal.response.status_code == 412
    flower = connection.make_simple_http_retry_invoker()
    request, calls = _requests(refusal)
    with pytest.raises(httpx.HTTPStatusError):
        flower.invoke(request)
    assert len(calls) == 1

    clock = Clock()
    retry_server_errors(
        ServerErrorStreak(300.0, clock=clock),
        activation=ServerErrorStreak(DEFAULT_ACTIVATION_WAIT_S, clock=clock),
    )
    invoker = connection.make_simple_http_retry_invoker()
    invoker.wait_function = clock.wait
    invoker.jitter = None  # 1, 2, 4, 8, 16, 20, 20... s
    refusals = 6  # each followed by a wait: 1 + 2 + 4 + 8 + 16 + 20 = 51 s
    request, calls = _requests(*[refusal] * refusals)
    assert invoker.invoke(request) == "answered"
    assert len(calls) == refusals + 1 and clock.t == 51.0
    assert "still held online" in caplog.text and ACTIVATION_WAIT_ENV in caplog.text

    clock.t = 0.0  # the success reset the count: a new run of refusals gets the whole wait
    request, calls = _requests(*[refusal] * 1000)
    with pytest.raises(httpx.HTTPStatusError, match="412"):
        invoker.invoke(request)
    assert DEFAULT_ACTIVATION_WAIT_S <= clock.t <= DEFAULT_ACTIVATION_WAIT_S + 20.0
    assert "still refused to activate this node after" in caplog.text
    assert "flwr supernode register" in caplog.text


def test_other_refusals_are_left_to_flower() -> None:
    """Another 412 (a refused deactivation), and a refused activation with the wait set to
    0, are given up at once, as Flower does."""
    from flwr.supercore.error import ApiErrorCode
    from flwr.supercore.retry.http_retry import make_simple_http_retry_invoker

    clock = Clock()
    for wait_s, code in [
        (60.0, ApiErrorCode.FLEET_NODE_DEACTIVATION_FAILED),
        (0.0, ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED),
    ]:
        invoker = limit_server_errors(
            make_simple_http_retry_invoker(),
            ServerErrorStreak(300.0, clock=clock),
            ServerErrorStreak(wait_s, clock=clock),
        )
        invoker.wait_function = clock.wait
        request, calls = _requests(_flower_refusal(code))
        with pytest.raises(httpx.HTTPStatusError, match="412"):
            invoker.invoke(request)
        assert len(calls) == 1 and clock.t == 0.0


def test_the_activation_wait_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unset, the wait covers Flower's heartbeat patience (2 x 30 s) and a back-off step;
    the variable sets it (0: Flower's behaviour); a bad value is named."""
    from flwr.common import constant

    monkeypatch.delenv(ACTIVATION_WAIT_ENV, raising=False)
    held = constant.HEARTBEAT_PATIENCE * constant.HEARTBEAT_DEFAULT_INTERVAL
    assert activation_wait_limit() == DEFAULT_ACTIVATION_WAIT_S >= held + 15
    monkeypatch.setenv(ACTIVATION_WAIT_ENV, "0")
    assert activation_wait_limit() == 0.0
    for value, says in [("soon", "not a number"), ("-1", "at least 0 s")]:
        monkeypatch.setenv(ACTIVATION_WAIT_ENV, value)
        with pytest.raises(ValueError, match=f"{ACTIVATION_WAIT_ENV}='{value}' .*{says}"):
            activation_wait_limit()
    monkeypatch.setattr(constant, "HEARTBEAT_DEFAULT_INTERVAL", 60)
    with pytest.raises(RuntimeError, match="HEARTBEAT_PATIENCE"):
        activation_wait_limit()
    monkeypatch.undo()
    from flwr.supercore import error

    monkeypatch.setattr(error, "ApiErrorCode", type("ApiErrorCode", (), {}))  # without it
    with pytest.raises(RuntimeError, match="FLEET_NODE_ACTIVATION_FAILED"):
        activation_wait_limit()


# --------------------------------------------------------------- against a real SuperLink
class _Proxy:
    """An HTTP proxy to the SuperLink on 127.0.0.1:``upstream`` that answers the first
    ``broken`` requests to ``path`` with ``status`` itself, and forwards everything else;
    ``answers`` lists the status each request to ``path`` got."""

    def __init__(self, upstream: int, path: str, status: int, broken: int) -> None:
        self.answers: list[int] = []
        lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                watched = self.path == path
                with lock:
                    fake = watched and len(proxy.answers) < broken
                    if fake:
                        proxy.answers.append(status)
                if fake:
                    return self.reply(status, [], b"{}")
                conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                conn.request("POST", self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                conn.close()
                if watched:
                    with lock:
                        proxy.answers.append(answer.status)
                self.reply(answer.status, answer.getheaders(), data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


#: Longer than the SuperLink's wait for its SQLite lock (5 s), so that requests fail with 500.
LOCK_S = 12.0


@pytest.mark.slow
def test_supernodes_against_a_locked_and_a_broken_superlink(tmp_path: Path) -> None:
    """One SuperLink, its state in SQLite. Directly against it, ``flower-supernode`` and
    ``pflarena supernode``, while the database is locked for 12 s (as a SuperLink under load
    finds it): Flower's node ends its loop on the first 500 and lingers (alive, serving
    nothing); pflarena's retries and serves on. Through proxies, ``pflarena supernode``:

    * its first two heartbeats answered with 500: it tries again and stays;
    * its first heartbeat answered with 400: it stops, exit status 1, its log saying why;
    * its first ask for messages answered with 400 (Flower's loop ends on it): it exits with
      status 1 instead of lingering;
    * every ask for messages answered with 500 (its heartbeats answered): it retries them
      for ``PFLARENA_SUPERLINK_RETRY_S`` (5 s here), then exits with status 1."""
    env = simulation_env(tmp_path / "home")
    procs: dict[str, Supervised] = {}
    proxies: dict[str, _Proxy] = {}

    def spawn(name: str, cmd: list[str], **extra: str) -> Supervised:
        procs[name] = Supervised.spawn(
            name, cmd, tmp_path / f"{name}.log", env | extra, cwd=tmp_path
        )
        return procs[name]

    def log(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text(errors="replace")

    def why() -> str:
        tails = [f"--- {n} ---\n{log(n)[-3000:]}" for n in procs]
        return f"answers { ({n: p.answers for n, p in proxies.items()}) }\n" + "\n".join(tails)

    def exited(name: str) -> Callable[[], bool]:
        return lambda: procs[name].popen.poll() is not None

    database = tmp_path / "superlink.db"
    try:
        port = free_port()
        link = spawn("superlink", ["flower-superlink", "--insecure", "--host", "127.0.0.1",
                                   "--port", str(port), "--database", str(database),
                                   "--disable-runtime-dependency-installation"])  # fmt: skip
        assert link.popen is not None
        wait_healthy(port, link.popen)
        pflarena = [sys.executable, "-m", "pflarena.deploy.supernode"]
        nodes = {
            "flower": (["flower-supernode"], None),
            "pflarena": (pflarena, None),
            "heartbeat-500": (pflarena, (HEARTBEAT_PATH, 500, 2)),
            "heartbeat-400": (pflarena, (HEARTBEAT_PATH, 400, 1)),
            "pull-400": (pflarena, ("/v1/fleet/pull-messages", 400, 1)),
            "pull-500": (pflarena, ("/v1/fleet/pull-messages", 500, 10**9)),
        }
        for name, (cmd, broken) in nodes.items():
            target = port
            if broken is not None:
                proxies[name] = _Proxy(port, *broken)
                target = proxies[name].port
            # The node whose asks for messages all get 500 gives up after 5 s of them.
            extra = {RETRY_ENV: "5"} if name == "pull-500" else {}
            spawn(name, [*cmd, "--insecure", "--superlink", f"127.0.0.1:{target}",
                         "--isolation", "process", "--port", str(free_port())], **extra)  # fmt: skip

        assert _wait(exited("heartbeat-400"), 90.0), why()
        assert procs["heartbeat-400"].popen.returncode == 1, why()
        assert "the heartbeat to the SuperLink stopped (HTTPStatusError" in log("heartbeat-400")
        assert _wait(exited("pull-400"), 90.0), why()
        assert procs["pull-400"].popen.returncode == 1, why()
        assert f"pflarena supernode: {LOOP_ENDED}; exiting" in log("pull-400"), why()
        # Its heartbeats answered, its asks for messages all 500: listed online, serving
        # nothing, until it gives up and exits for its supervisor.
        assert _wait(exited("pull-500"), 90.0), why()
        assert procs["pull-500"].popen.returncode == 1, why()
        assert "answered nothing but 500 for" in log("pull-500"), why()
        assert f"pflarena supernode: {LOOP_ENDED}; exiting" in log("pull-500"), why()
        assert len(proxies["pull-500"].answers) >= 3, why()
        assert _wait(lambda: 200 in proxies["heartbeat-500"].answers, 30.0), why()
        assert proxies["heartbeat-500"].answers[:2] == [500, 500], why()
        assert "answered a heartbeat with 500; trying again" in log("heartbeat-500"), why()

        for name in ("flower", "pflarena"):  # both asking for messages
            assert _wait(lambda n=name: "SuperNode ID" in log(n), 60.0), why()
        with sqlite3.connect(database, timeout=30.0, isolation_level=None) as locker:
            locker.execute("BEGIN EXCLUSIVE")
            time.sleep(LOCK_S)
            locker.execute("COMMIT")
        assert _wait(lambda: "500 Internal Server Error" in log("flower"), 30.0), why()
        time.sleep(5.0)
        # Flower's node: its loop ended on the 500, and it lingers, serving nothing.
        assert not exited("flower")(), why()
        # pflarena's: it retried through the lock and serves on.
        assert not exited("pflarena")(), why()
        assert "Connection attempt failed, retrying" in log("pflarena"), why()
        assert LOOP_ENDED not in log("pflarena"), why()
        assert not exited("heartbeat-500")(), why()
    finally:  # the nodes (they deactivate through their proxies), then the SuperLink
        stop_all([p for name, p in procs.items() if name != "superlink"], grace=15.0)
        stop_all([p for name, p in procs.items() if name == "superlink"], grace=15.0)
        for proxy in proxies.values():
            proxy.close()
