"""The HTTP servers of this process's SuperLink or SuperNode: bounded requests, and a
listening socket the launcher bound.

``pflarena superlink`` and ``pflarena supernode`` run Flower's entry points
(``flower_superlink``, ``flower_supernode``), which build their uvicorn servers themselves: the
SuperLink calls ``uvicorn.run(app=..., host=..., port=..., ssl_...)``
(``flwr/superlink/cli/flower_superlink.py: _run_superlink_http_api``), the SuperNode runs
``uvicorn.Server(uvicorn.Config(app=..., host=..., port=..., ssl_...))`` in a thread
(``flwr/supernode/cli/flower_supernode.py: _start_supernode_http_api``). Both look ``uvicorn``
up in their module when they run, so :func:`install_superlink` and :func:`install_supernode`
give that module a ``uvicorn`` of its own (:func:`limited_uvicorn`) whose ``Config`` wraps
Flower's app in :class:`~pflarena.deploy.limits.RequestLimitsMiddleware` and serves it with
the header time limit (:func:`~pflarena.deploy.limits.protocol_class`), whose ``Server``
serves on the inherited socket when there is one, and whose ``run`` is uvicorn's own with
those two. uvicorn itself, and every other user of it in the process, is left as it is.

``--listen-fd N`` serves on an already bound and listening TCP socket inherited as file
descriptor ``N`` (the launcher binds port 0, reads the port back and passes the socket with
``subprocess.Popen(pass_fds=...)``), so that no other process can take the port between its
choice and its use. uvicorn's own ``fd=`` option cannot be used: it wraps the descriptor as a
Unix socket (``socket.fromfd(fd, AF_UNIX, ...)``); the socket is handed to
``Server.serve(sockets=...)`` instead. Flower is still told the address it serves (its logs;
the SuperLink's subprocess-isolation SuperExec and the SuperNode's ClientApps connect to it):
:func:`serving_from_flags` adds ``--port`` (and ``--host``) from the socket, and refuses a
``--port`` that differs from it.

:func:`check_serving_internals` fails, naming what moved, when flwr or uvicorn no longer
build their servers as this module expects.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import socket
import stat
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from logging import INFO
from typing import Any

from pflarena.deploy.limits import (
    KIB,
    MAX_HEADER_BYTES,
    MIB,
    CallerCheck,
    FlowerCallers,
    RequestLimits,
    RequestLimitsMiddleware,
    protocol_class,
)

__all__ = [
    "Serving",
    "add_flags",
    "check_serving_internals",
    "install_superlink",
    "install_supernode",
    "limited_uvicorn",
    "listen_socket",
    "serving_from_flags",
]

#: Flower's modules whose servers are limited, the function that builds each, and the
#: ``uvicorn`` calls it makes there.
SUPERLINK_CLI = "flwr.superlink.cli.flower_superlink"
SUPERNODE_CLI = "flwr.supernode.cli.flower_supernode"
_ENTRY_POINTS: dict[str, tuple[str, tuple[str, ...]]] = {
    SUPERLINK_CLI: ("_run_superlink_http_api", ("uvicorn.run(",)),
    SUPERNODE_CLI: ("_start_supernode_http_api", ("uvicorn.Server(", "uvicorn.Config(")),
}


@dataclass
class Serving:
    """How this process's Flower server serves.

    Parameters
    ----------
    limits : RequestLimits
        Request body caps and time limits.
    listen : socket.socket, optional
        A bound, listening TCP socket to serve on instead of binding ``--host``/``--port``.
    """

    limits: RequestLimits = field(default_factory=RequestLimits)
    listen: socket.socket | None = None


def _log(level: int, text: str, *args: Any) -> None:
    from flwr.common.logger import log

    log(level, text, *args)


def listen_socket(fd: int) -> socket.socket:
    """The listening TCP socket of file descriptor ``fd`` (this process now owns it).

    Raises
    ------
    ValueError
        ``fd`` is not open, not a socket, not TCP, or not listening.
    """
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        raise ValueError(f"--listen-fd {fd} is not an open file descriptor of this "
                         "process (pass it with pass_fds)") from None  # fmt: skip
    if not stat.S_ISSOCK(mode):
        raise ValueError(f"--listen-fd {fd} is not a socket")
    sock = socket.socket(fileno=fd)
    problem = None
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        problem = "is not a TCP socket"
    elif not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        problem = "is not listening (bind it and call listen() before passing it)"
    if problem is not None:
        sock.detach()  # the descriptor stays the launcher's to close
        raise ValueError(f"--listen-fd {fd} {problem}")
    return sock


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The serving flags, on a command's own parser (values checked by
    :func:`serving_from_flags`, for one-line errors)."""
    parser.add_argument("--max-request-mb", metavar="MB")
    parser.add_argument("--max-unauthenticated-kb", metavar="KB")
    parser.add_argument("--request-timeout", metavar="SECONDS")
    parser.add_argument("--header-timeout", metavar="SECONDS")
    parser.add_argument("--listen-fd", metavar="N")


def _number(flag: str, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{flag} {value!r} is not a number") from None
    if not number > 0 or number == float("inf"):
        raise ValueError(f"{flag} {value}: give a positive number")
    return number


def _limits(own: argparse.Namespace) -> RequestLimits:
    defaults = RequestLimits()
    body_mb = _number("--max-request-mb", own.max_request_mb)
    plain_kb = _number("--max-unauthenticated-kb", own.max_unauthenticated_kb)
    request_s = _number("--request-timeout", own.request_timeout)
    header_s = _number("--header-timeout", own.header_timeout)
    body = defaults.max_body_bytes if body_mb is None else round(body_mb * MIB)
    plain = defaults.max_unauthenticated_bytes if plain_kb is None else round(plain_kb * KIB)
    if plain > body:
        raise ValueError(f"--max-unauthenticated-kb ({plain / KIB:g} KiB) exceeds "
                         f"--max-request-mb ({body / MIB:g} MiB)")  # fmt: skip
    try:
        return RequestLimits(
            max_body_bytes=body,
            max_unauthenticated_bytes=plain,
            request_timeout_s=defaults.request_timeout_s if request_s is None else request_s,
            header_timeout_s=defaults.header_timeout_s if header_s is None else header_s,
        )
    except ValueError as exc:
        raise ValueError(f"{exc} (--max-request-mb, --max-unauthenticated-kb, "
                         "--request-timeout, --header-timeout)") from None  # fmt: skip


def _address_flags(rest: Sequence[str]) -> argparse.Namespace:
    """Flower's ``--host`` and ``--port`` among its flags (the last of each, as Flower's)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--host")
    parser.add_argument("--port")
    return parser.parse_known_args(list(rest))[0]


def serving_from_flags(own: argparse.Namespace, rest: Sequence[str]) -> tuple[Serving, list[str]]:
    """The :class:`Serving` the flags of :func:`add_flags` ask for, and Flower's flags
    ``rest`` with the socket's port (and host, unless given) when ``--listen-fd`` is.

    Raises
    ------
    ValueError
        A flag's value is invalid, the descriptor is not a listening TCP socket, or
        ``--port`` names another port than the socket's.
    """
    limits = _limits(own)
    rest = list(rest)
    if own.listen_fd is None:
        return Serving(limits), rest
    try:
        fd = int(own.listen_fd)
    except ValueError:
        raise ValueError(f"--listen-fd {own.listen_fd!r} is not a file descriptor number") from None
    if fd < 0:
        raise ValueError(f"--listen-fd {fd} is not a file descriptor number")
    sock = listen_socket(fd)
    host, port = sock.getsockname()[:2]
    given = _address_flags(rest)
    if given.port is not None and given.port.strip() != str(port):
        sock.detach()
        raise ValueError(f"--listen-fd {fd} is bound to port {port}, but --port is "
                         f"{given.port}: give the socket's port, or no --port")  # fmt: skip
    if given.port is None:
        rest += ["--port", str(port)]
    if given.host is None:
        rest += ["--host", host]
    return Serving(limits, sock), rest


def _run_with(config_class: type, server_class: type) -> Callable[..., None]:
    """uvicorn's ``run`` (its code, as it is), building ``config_class`` and ``server_class``."""
    real = importlib.import_module("uvicorn.main").run  # (uvicorn.main is its CLI function)
    namespace = {**real.__globals__, "Config": config_class, "Server": server_class}
    run = types.FunctionType(real.__code__, namespace, real.__name__, real.__defaults__)
    run.__kwdefaults__ = dict(real.__kwdefaults__ or {})
    run.__doc__ = real.__doc__
    return run


def limited_uvicorn(serving: Serving, callers: Callable[[Any], CallerCheck]) -> types.ModuleType:
    """A ``uvicorn`` for one of Flower's entry modules: uvicorn's own, but whose ``Config``
    wraps the app and serves it with the header time limit, whose ``Server`` serves on
    ``serving.listen`` when set, and whose ``run`` builds those two.

    Parameters
    ----------
    serving : Serving
        The limits and the socket.
    callers : callable
        ``callers(app)``: the caller check of Flower's app (:class:`FlowerCallers`).
    """
    import uvicorn

    class Config(uvicorn.Config):
        """uvicorn's ``Config`` of a Flower app served within :attr:`Serving.limits`."""

        def __init__(self, app: Any, **kwargs: Any) -> None:
            for option in ("fd", "uds"):
                if kwargs.get(option) is not None:
                    raise RuntimeError(f"Flower's server asked uvicorn for {option}=; "
                                       "pflarena's request limits expect host and port")  # fmt: skip
            if isinstance(app, str):
                raise RuntimeError("Flower's server named its app as a string; pflarena's "
                                   "request limits need the app itself")  # fmt: skip
            http = kwargs.pop("http", "auto")
            if not isinstance(http, str):
                raise RuntimeError(f"Flower's server chose uvicorn's protocol {http!r}; "
                                   "pflarena's request limits need 'auto'")  # fmt: skip
            kwargs.setdefault("h11_max_incomplete_event_size", MAX_HEADER_BYTES)
            limited = RequestLimitsMiddleware(app, serving.limits, callers(app))
            super().__init__(limited, http=protocol_class(serving.limits, http), **kwargs)

    class Server(uvicorn.Server):
        """uvicorn's ``Server``, on :attr:`Serving.listen` when there is one."""

        async def serve(self, sockets: list[socket.socket] | None = None) -> None:
            if sockets is None and serving.listen is not None:
                sockets = [serving.listen]
                host, port = serving.listen.getsockname()[:2]
                _log(INFO, "pflarena: serving on the inherited socket (fd %d, %s:%d)",
                     serving.listen.fileno(), host, port)  # fmt: skip
            await super().serve(sockets=sockets)

    limited = types.ModuleType("uvicorn", "uvicorn, serving within pflarena's request limits")
    limited.__dict__.update({k: v for k, v in vars(uvicorn).items() if not k.startswith("__")})
    limited.__version__ = uvicorn.__version__  # type: ignore[attr-defined]
    limited.Config = Config  # type: ignore[attr-defined]
    limited.Server = Server  # type: ignore[attr-defined]
    limited.run = _run_with(Config, Server)  # type: ignore[attr-defined]
    return limited


def check_serving_internals() -> None:
    """Fail, naming what moved, unless flwr's entry points build their uvicorn servers, and
    uvicorn serves, as this module expects.

    Raises
    ------
    RuntimeError
        An entry point's builder or its ``uvicorn`` calls are gone; uvicorn's ``run`` no
        longer builds ``Config`` and ``Server`` by name, its ``Server.serve`` takes no
        sockets, or its protocols lack the parser callbacks the header limit overrides;
        or a Flower credential check the caller check reuses has moved.
    """
    import flwr
    import uvicorn

    problems = []
    for module_name, (builder, calls) in _ENTRY_POINTS.items():
        module = importlib.import_module(module_name)
        function = getattr(module, builder, None)
        if not isinstance(getattr(module, "uvicorn", None), types.ModuleType):
            problems.append(f"{module_name}.uvicorn")
        if function is None:
            problems.append(f"{module_name}.{builder}")
            continue
        source = inspect.getsource(function)
        problems += [f"{builder}'s {call}...)" for call in calls if call not in source]
    run = getattr(importlib.import_module("uvicorn.main"), "run", None)
    if run is None or not {"Config", "Server"} <= set(run.__code__.co_names):
        problems.append("uvicorn.main.run building Config and Server")
    if "sockets" not in inspect.signature(uvicorn.Server.serve).parameters:
        problems.append("uvicorn.Server.serve(sockets=...)")
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    names = ("on_message_begin", "on_url", "on_header", "on_headers_complete")
    problems += [f"HttpToolsProtocol.{n}" for n in names if not hasattr(HttpToolsProtocol, n)]
    if not hasattr(H11Protocol, "data_received"):
        problems.append("H11Protocol.data_received")
    for module_name, name in (
        ("flwr.superlink.routers.fleet.node_auth", "authenticate_node"),
        ("flwr.supercore.dependencies.task", "authenticate_task"),
        ("flwr.supercore.routers.runtime.router", "AcquireTaskAuthDependency"),
        ("flwr.supercore.protobuf.translation", "PROTOBUF_REQUEST_TYPES"),
    ):
        try:
            if not hasattr(importlib.import_module(module_name), name):
                problems.append(f"{module_name}.{name}")
        except ImportError:
            problems.append(module_name)
    if problems:
        raise RuntimeError(
            f"flwr {flwr.__version__} with uvicorn {uvicorn.__version__} lacks what pflarena's "
            "request limits rely on (written against flwr 1.41, uvicorn 0.49): "
            f"{', '.join(problems)}"
        )


def _install(module_name: str, serving: Serving, callers: Callable[[Any], CallerCheck]) -> None:
    check_serving_internals()
    module = importlib.import_module(module_name)
    module.uvicorn = limited_uvicorn(serving, callers)  # type: ignore[attr-defined]


def install_superlink(serving: Serving, operator_token_sha256: str | None = None) -> None:
    """Make this process's ``flower-superlink`` serve within ``serving``
    (``operator_token_sha256``: the Control API's operator, :class:`FlowerCallers`)."""
    _install(SUPERLINK_CLI, serving, lambda app: FlowerCallers(app, operator_token_sha256))


def install_supernode(serving: Serving) -> None:
    """Make this process's ``flower-supernode`` serve its Runtime API within ``serving``."""
    _install(SUPERNODE_CLI, serving, FlowerCallers)
