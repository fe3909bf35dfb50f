"""What requests from a caller that is not authenticated cost a SuperLink and a SuperNode:
``pflarena superlink`` (with its request limits, :mod:`pflarena.deploy.limits`) against
Flower's own ``flower-superlink`` with the same flags, side by side in one run.

Each SuperLink serves TLS with ``--isolation process``, ``--superexec-auth-secret-file`` and
``--enable-supernode-auth`` (pflarena's also ``--operator-token-hash``, and ``--listen-fd``
on a socket bound here), with its defaults otherwise. It is attacked from this process as a
stranger holding only the CA's certificate, one attack after another on the same process:

* four concurrent 256 MiB bodies to the Fleet API (``/v1/fleet/push-object``), declared
  (``Content-Length``), then four streamed (chunked), each sent as fast as the socket takes;
* 200 connections whose request headers drip (a byte a second), then 200 whose headers are
  complete and whose declared 60,000-byte body drips, each for 40 s.

It reports the SuperLink's resident memory (``VmRSS``) at start and after each attack, its
peak (``VmHWM``), and how long the operator's ``flwr list`` takes while each attack runs (its
connection written with :func:`pflarena.deploy.operator.connect`, with the operator's token
for pflarena's). Then the same bodies against a SuperNode's Runtime API (``pflarena
supernode`` against ``flower-supernode``, ``--isolation process`` with a SuperExec secret,
pointed at no SuperLink: their Runtime API serves while they retry). Last, the sizes that
set the caps: the requests a SuperNode sends before it holds a credential, built with
Flower's own request types, and the largest bodies a deployment sends (a ``start-run`` with
a FAB at Flower's size limit; an object of the largest built-in model's packed message).

Usage::

    python benchmarks/request_limits.py [--slow-seconds 40] [--out benchmarks/results/request_limits.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pflarena.deploy.certs import make_certificates, make_operator_token, make_secret
from pflarena.deploy.limits import RequestLimits
from pflarena.deploy.operator import connect
from pflarena.runtime.processes import flower_env

ROOT = Path(__file__).resolve().parents[1]
PFLARENA = [sys.executable, "-m", "pflarena.cli"]
MIB = 1 << 20
ATTACK_BYTES = 256 * MIB
CONCURRENT = 4
SLOW_CONNECTIONS = 200
FLEET_PATH = "/v1/fleet/push-object"
RUNTIME_PATH = "/v1/runtime/push-object"
CONNECTION = "bench"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- processes
@dataclass
class Server:
    """A started SuperLink or SuperNode."""

    name: str
    popen: subprocess.Popen
    port: int
    log: Path
    tls: bool
    cli_home: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def memory_mb(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MB, from /proc."""
        values = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
        return values["VmRSS"], values["VmHWM"]

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the process has used, from /proc."""
        text = Path(f"/proc/{self.pid}/stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def _wait_healthy(server: Server, context: ssl.SSLContext | None, timeout: float = 90) -> None:
    scheme = "https" if server.tls else "http"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.popen.poll() is not None:
            raise RuntimeError(f"{server.name} exited:\n{server.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(
                f"{scheme}://127.0.0.1:{server.port}/health", timeout=2, context=context
            ):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{server.name} did not answer on /health within {timeout:.0f} s")


def _spawn(name: str, cmd: list[str], work: Path, sock: socket.socket | None) -> subprocess.Popen:
    log = work / f"{name}.log"
    with log.open("w") as out:
        return subprocess.Popen(
            cmd,
            env=flower_env(work / f"home-{name}"),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            pass_fds=[sock.fileno()] if sock is not None else [],
            start_new_session=True,
        )


def _bound() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    return sock


def start_superlink(kind: str, work: Path, certs_dir: Path, certs) -> Server:
    """``pflarena`` (limits, operator token, ``--listen-fd``) or ``flower`` (the same flags)."""
    cert, key = certs.servers["superlink"]
    flags = [
        "--ssl-ca-certfile", str(certs.ca_cert), "--ssl-certfile", str(cert),
        "--ssl-keyfile", str(key), "--isolation", "process",
        "--superexec-auth-secret-file", str(make_secret(certs_dir / "superlink.secret")),
        "--enable-supernode-auth", "--disable-runtime-dependency-installation",
    ]  # fmt: skip
    token, digest = make_operator_token(certs_dir)
    sock = _bound()
    port = sock.getsockname()[1]
    if kind == "pflarena":
        cmd = [*PFLARENA, "superlink", "--operator-token-hash", str(digest),
               "--listen-fd", str(sock.fileno()), *flags]  # fmt: skip
        popen = _spawn(f"superlink-{kind}", cmd, work, sock)
    else:
        sock.close()  # Flower binds the port itself (freed just now, on loopback)
        cmd = ["flower-superlink", "--host", "127.0.0.1", "--port", str(port), *flags]
        popen = _spawn(f"superlink-{kind}", cmd, work, None)
    sock.close()
    server = Server(f"superlink-{kind}", popen, port, work / f"superlink-{kind}.log", True)
    _wait_healthy(server, ssl.create_default_context(cafile=str(certs.ca_cert)))
    server.cli_home = work / f"cli-{kind}"
    connect(
        server.cli_home,
        CONNECTION,
        f"127.0.0.1:{port}",
        root_certificates=certs.ca_cert,
        operator_token=token if kind == "pflarena" else None,
        default=True,
    )
    return server


def start_supernode(kind: str, work: Path, certs_dir: Path) -> Server:
    """A SuperNode whose Runtime API (plain HTTP on loopback, as local-deploy's) serves while
    it retries a SuperLink that is not there."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = probe.getsockname()[1]  # closed again: nothing listens there
    flags = [
        "--insecure", "--superlink", f"127.0.0.1:{nowhere}", "--isolation", "process",
        "--superexec-auth-secret-file", str(make_secret(certs_dir / f"supernode-{kind}.secret")),
    ]  # fmt: skip
    sock = _bound()
    port = sock.getsockname()[1]
    if kind == "pflarena":
        cmd = [*PFLARENA, "supernode", "--listen-fd", str(sock.fileno()), *flags]
        popen = _spawn(f"supernode-{kind}", cmd, work, sock)
    else:
        sock.close()
        cmd = ["flower-supernode", "--port", str(port), *flags]
        popen = _spawn(f"supernode-{kind}", cmd, work, None)
    sock.close()
    server = Server(f"supernode-{kind}", popen, port, work / f"supernode-{kind}.log", False)
    _wait_healthy(server, None)
    return server


# --------------------------------------------------------------------------- attacks
def _connect(server: Server, ca: Path) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=120)
    if not server.tls:
        return sock
    context = ssl.create_default_context(cafile=str(ca))
    return context.wrap_socket(sock, server_hostname="127.0.0.1")


def _status(data: bytes) -> str:
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    return line.split(" ")[1] if line.startswith("HTTP/") else "closed"


def big_body(server: Server, ca: Path, path: str, chunked: bool) -> dict:
    """One 256 MiB body as fast as the socket takes it: (status, MiB sent, seconds)."""
    started = time.monotonic()
    sent = 0
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % ATTACK_BYTES
    head = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/protobuf\r\n" + framing + b"\r\n\r\n")  # fmt: skip
    block = b"\0" * MIB
    data = b""
    with contextlib.closing(_connect(server, ca)) as sock:
        try:
            sock.sendall(head)
            while sent < ATTACK_BYTES:
                sock.sendall(b"%x\r\n%s\r\n" % (MIB, block) if chunked else block)
                sent += MIB
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # refused: the server closed the connection
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                data += chunk
                if b"\r\n\r\n" in data:
                    break
    return {"status": _status(data), "mib": sent / MIB, "s": time.monotonic() - started}


def flwr_list(server: Server, times: int = 3) -> tuple[float, int]:
    """Median seconds of ``times`` runs of the operator's ``flwr list`` one after another
    (most of each is the CLI's own start), and the worst exit code."""
    assert server.cli_home is not None
    took, codes = [], []
    for _ in range(times):
        started = time.monotonic()
        result = subprocess.run(
            ["flwr", "list", CONNECTION],
            env=flower_env(server.cli_home),
            cwd=server.cli_home,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        took.append(time.monotonic() - started)
        codes.append(result.returncode)
    return statistics.median(took), max(codes, key=abs)


def _during(server: Server, attack, after_s: float) -> tuple[object, tuple[float, int] | None]:
    """Run ``attack()``; ``flwr list`` ``after_s`` into it (SuperLinks only)."""
    timing: list[tuple[float, int]] = []

    def list_later() -> None:
        time.sleep(after_s)
        timing.append(flwr_list(server))

    lister = threading.Thread(target=list_later) if server.cli_home is not None else None
    if lister is not None:
        lister.start()
    result = attack()
    if lister is not None:
        lister.join()
    return result, (timing[0] if timing else None)


def flood(server: Server, ca: Path, path: str, chunked: bool) -> list[dict]:
    results: list[dict] = [{}] * CONCURRENT

    def one(index: int) -> None:
        results[index] = big_body(server, ca, path, chunked)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CONCURRENT)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


async def _slow(server: Server, ca: Path, body: bool, seconds: float) -> list[float | None]:
    """SLOW_CONNECTIONS connections dripping a byte a second (headers, or a declared body):
    when the server closed each (seconds from its start), None if it was still open."""
    context = ssl.create_default_context(cafile=str(ca)) if server.tls else None
    if body:
        head = (b"POST " + FLEET_PATH.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/protobuf\r\nContent-Length: 60000\r\n\r\n")  # fmt: skip
    else:
        head = b"POST " + FLEET_PATH.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Drip: "
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds

    async def one() -> float | None:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=context,
            server_hostname="127.0.0.1" if context else None,
        )  # fmt: skip
        started = loop.time()
        closed_at: list[float] = []

        async def watch() -> None:
            with contextlib.suppress(OSError, ssl.SSLError):
                await reader.read()  # the server's answer (408) and close, or nothing
            closed_at.append(loop.time() - started)

        watcher = asyncio.create_task(watch())
        try:
            writer.write(head)
            while loop.time() < stop_at and not closed_at:
                await asyncio.sleep(1.0)
                writer.write(b"a")
                with contextlib.suppress(OSError, ssl.SSLError):
                    await writer.drain()
        finally:
            watcher.cancel()
            writer.close()
        return closed_at[0] if closed_at else None

    return await asyncio.gather(*(one() for _ in range(SLOW_CONNECTIONS)))


def slow(server: Server, ca: Path, body: bool, seconds: float) -> list[float | None]:
    return asyncio.run(_slow(server, ca, body, seconds))


# --------------------------------------------------------------------------- sizes
def legitimate_sizes() -> list[tuple[str, int]]:
    """Bodies (bytes) a SuperNode sends before it holds a credential, and the largest a
    deployment sends at all, built with Flower's own types."""
    from flwr.app import ArrayRecord, Message, RecordDict
    from flwr.common.constant import FAB_MAX_SIZE, HEARTBEAT_DEFAULT_INTERVAL
    from flwr.proto.control_pb2 import StartRunRequest
    from flwr.proto.fab_pb2 import Fab
    from flwr.proto.fleet_pb2 import (
        ActivateNodeRequest,
        PullMessagesRequest,
        RegisterNodeFleetRequest,
    )
    from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes
    from flwr.supercore.task_identity import TaskIdentity

    from pflarena.core.models import build_model
    from pflarena.core.packing import pack_content

    _, public_key = generate_key_pairs()
    key = public_key_to_bytes(public_key)
    node = Node(node_id=2**63 - 1)
    sizes = [
        ("register-node (its public key, without node authentication)",
         RegisterNodeFleetRequest(public_key=key).ByteSize()),
        ("activate-node (its registered key)",
         ActivateNodeRequest(public_key=key, heartbeat_interval=HEARTBEAT_DEFAULT_INTERVAL).ByteSize()),
        ("send-node-heartbeat",
         SendNodeHeartbeatRequest(node=node, heartbeat_interval=HEARTBEAT_DEFAULT_INTERVAL).ByteSize()),
        ("pull-messages", PullMessagesRequest(node=node).ByteSize()),
    ]  # fmt: skip
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    model = build_model("resnet18", (3, 64, 64), 200)  # the largest built-in model
    record = ArrayRecord(model.state_dict())
    message = Message(pack_content(RecordDict({"arrays": record})), dst_node_id=1,
                      message_type="train")  # fmt: skip
    objects = get_all_nested_objects(message)
    largest_id, largest = max(objects.items(), key=lambda item: len(item[1].deflate()))
    push = PushObjectRequest(node=node, run_id=2**63 - 1, object_id=largest_id,
                             object_content=largest.deflate(), session_id="x" * 64)  # fmt: skip
    start_run = StartRunRequest(fab=Fab(hash_str="f" * 64, content=b"\0" * FAB_MAX_SIZE))
    params = sum(t.numel() for t in model.state_dict().values())
    sizes += [
        (f"push-object, the largest object of resnet18's packed message ({params:,} values, "
         f"{len(objects)} objects; the largest: {type(largest).__name__})", push.ByteSize()),
        ("start-run with a FAB at Flower's size limit (FAB_MAX_SIZE)", start_run.ByteSize()),
    ]  # fmt: skip
    return sizes


# --------------------------------------------------------------------------- report
def _mb(value: float) -> str:
    return f"{value:.0f}"


def _closed(times: list[float | None]) -> str:
    closed = sorted(t for t in times if t is not None)
    if not closed:
        return f"0 of {len(times)}"
    median = closed[len(closed) // 2]
    return f"{len(closed)} of {len(times)} (median after {median:.1f} s)"


def _bodies(results: list[dict]) -> str:
    statuses = sorted({r["status"] for r in results})
    sent = max(r["mib"] for r in results)
    took = max(r["s"] for r in results)
    return f"{'/'.join(statuses)}; up to {sent:.0f} MiB written each, {took:.1f} s"


def attack_superlink(server: Server, ca: Path, slow_s: float) -> list[tuple[str, ...]]:
    """Rows (stage, RSS MB, over start, peak, CPU s, flwr list s, what the attackers saw)."""
    time.sleep(2.0)
    start_rss, _ = server.memory_mb()
    base_s, base_rc = flwr_list(server)
    rows = [("at start (idle)", _mb(start_rss), "+0", _mb(server.memory_mb()[1]), "",
             f"{base_s:.2f} (exit {base_rc})", "")]  # fmt: skip

    def row(stage: str, cpu: float, listed: tuple[float, int] | None, seen: str) -> tuple[str, ...]:
        rss, hwm = server.memory_mb()
        timed = "" if listed is None else f"{listed[0]:.2f} (exit {listed[1]})"
        return (stage, _mb(rss), f"+{rss - start_rss:.0f}", _mb(hwm),
                f"{server.cpu_s() - cpu:.1f}", timed, seen)  # fmt: skip

    for chunked in (False, True):
        what = "streamed (chunked)" if chunked else "declared"
        cpu = server.cpu_s()
        results, listed = _during(server, lambda c=chunked: flood(server, ca, FLEET_PATH, c), 1.0)
        time.sleep(1.0)
        rows.append(row(f"after {CONCURRENT} x {ATTACK_BYTES // MIB} MiB bodies, {what}", cpu,
                        listed, _bodies(results)))  # fmt: skip
    for body in (False, True):
        what = "declared 60,000-byte bodies" if body else "headers"
        cpu = server.cpu_s()
        times, listed = _during(server, lambda b=body: slow(server, ca, b, slow_s), 5.0)
        rows.append(row(f"after {SLOW_CONNECTIONS} connections dripping {what} for {slow_s:.0f} s",
                        cpu, listed, f"closed by the server: {_closed(times)}"))  # fmt: skip
    return rows


def attack_supernode(server: Server) -> list[tuple[str, ...]]:
    time.sleep(2.0)
    start_rss, _ = server.memory_mb()
    rows = [("at start (idle)", _mb(start_rss), "+0", _mb(server.memory_mb()[1]), "", "")]
    for chunked in (False, True):
        cpu = server.cpu_s()
        results = flood(server, Path(), RUNTIME_PATH, chunked)
        time.sleep(1.0)
        rss, hwm = server.memory_mb()
        what = "streamed (chunked)" if chunked else "declared"
        rows.append((f"after {CONCURRENT} x {ATTACK_BYTES // MIB} MiB bodies, {what}", _mb(rss),
                     f"+{rss - start_rss:.0f}", _mb(hwm), f"{server.cpu_s() - cpu:.1f}",
                     _bodies(results)))  # fmt: skip
    return rows


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slow-seconds", type=float, default=40.0)
    parser.add_argument("--attack-mib", type=int, default=256, help="each body's size")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/request_limits.md")
    args = parser.parse_args(argv)
    global ATTACK_BYTES
    ATTACK_BYTES = args.attack_mib * MIB
    loads = [os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="pflarena-request-limits-"))
    certs_dir = work / "certs"
    certs = make_certificates(certs_dir, {"superlink": ["localhost", "127.0.0.1"]})
    superlinks: dict[str, list[tuple[str, ...]]] = {}
    supernodes: dict[str, list[tuple[str, ...]]] = {}
    for kind in ("flower", "pflarena"):
        print(f"SuperLink: {kind}", flush=True)
        server = start_superlink(kind, work, certs_dir, certs)
        try:
            superlinks[kind] = attack_superlink(server, certs.ca_cert, args.slow_seconds)
        finally:
            server.stop()
        loads.append(os.getloadavg())
    for kind in ("flower", "pflarena"):
        print(f"SuperNode: {kind}", flush=True)
        server = start_supernode(kind, work, certs_dir)
        try:
            supernodes[kind] = attack_supernode(server)
        finally:
            server.stop()
    sizes = legitimate_sizes()
    limits = RequestLimits()

    out = [
        "# Request limits: what a caller that is not authenticated costs a SuperLink and a SuperNode",
        "",
        "Command: `python benchmarks/request_limits.py"
        + (f" --slow-seconds {args.slow_seconds:g}" if args.slow_seconds != 40 else "")
        + "`",
        "",
        f"Run {datetime.now().strftime('%Y-%m-%d %H:%M')}; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, **shared with other jobs** (load average "
        + ", ".join(f"{load[0]:.1f}" for load in loads)
        + " at the start of each SuperLink's "
        "part and at the end); Python " + platform.python_version() + ".",
        "",
        "Each SuperLink: TLS, `--isolation process`, `--superexec-auth-secret-file`, "
        "`--enable-supernode-auth` (pflarena's also `--operator-token-hash` and `--listen-fd`); "
        f"pflarena's defaults: bodies up to {limits.max_body_bytes // MIB} MiB from an "
        f"authenticated caller, {limits.max_unauthenticated_bytes // 1024} KiB otherwise, a "
        f"body within {limits.request_timeout_s:g} s, headers within "
        f"{limits.header_timeout_s:g} s. The attacker holds the CA's certificate only; every "
        "attack runs against the same process, one after another. RSS and its peak (VmHWM) in "
        "MB from /proc, CPU s the SuperLink's over the stage; `flwr list` is the operator's: the "
        "median of three, one after another, from 1 s into the bodies or 5 s into the slow "
        "connections (most of its time is the CLI's own start, which the machine's other "
        "jobs slow).",
        "",
        "Over TLS a refused connection is not cut at once: uvicorn closes it, and the TLS "
        "layer (uvloop's, like asyncio's) then reads, decrypts and discards what the client "
        "still sends until the client closes or its SSL shutdown timeout (30 s) passes, so "
        "the attackers could write their bodies whole: that costs the server CPU, not memory. "
        "Over plain HTTP (the SuperNode's Runtime API) a refused connection is reset at once.",
        "",
    ]
    header = ("stage", "RSS MB", "over start", "peak MB", "CPU s", "`flwr list` s",
              "what the attackers saw")  # fmt: skip
    for kind, title in (("flower", "`flower-superlink` (Flower 1.41, before)"),
                        ("pflarena", "`pflarena superlink` (after)")):  # fmt: skip
        out += [f"## {title}", "", *_table(header, superlinks[kind]), ""]
    out += [
        "## A SuperNode's Runtime API",
        "",
        "`--isolation process` with a SuperExec secret, its Runtime API on plain HTTP on "
        f"loopback (as `pflarena local-deploy` runs it), {CONCURRENT} concurrent "
        f"{ATTACK_BYTES // MIB} MiB bodies to `{RUNTIME_PATH}` without a task token.",
        "",
    ]
    header = ("stage", "RSS MB", "over start", "peak MB", "CPU s", "what the attackers saw")
    for kind, title in (("flower", "`flower-supernode` (before)"),
                        ("pflarena", "`pflarena supernode` (after)")):  # fmt: skip
        out += [f"### {title}", "", *_table(header, supernodes[kind]), ""]
    out += [
        "## The sizes that set the caps",
        "",
        "Request bodies in bytes, built with Flower's own request types (a P-384 node key as "
        "Flower's SuperNode makes; a node id and run id of the largest value).",
        "",
        *_table(("request", "body bytes"), [(what, f"{size:,}") for what, size in sizes]),
        "",
        f"The unauthenticated cap ({limits.max_unauthenticated_bytes:,} bytes) is "
        f"{limits.max_unauthenticated_bytes // max(s for _, s in sizes[:4])}x the largest "
        "request sent before a credential; the authenticated cap "
        f"({limits.max_body_bytes:,} bytes) is {limits.max_body_bytes / max(s for _, s in sizes[4:]):.2f}x "
        "the largest body a deployment sends.",
        "",
    ]
    args.out.write_text("\n".join(out))
    print("\n".join(out))


if __name__ == "__main__":
    main()
