"""``pflarena superlink``: Flower's SuperLink whose Control API answers only its operator.

In flwr 1.41 one HTTP port of ``flower-superlink`` serves three APIs (``flwr/superlink/main.py:
create_app``):

* the **Fleet API** (``/v1/fleet/*``), which SuperNodes use; with ``--enable-supernode-auth``
  only nodes whose keys the operator registered get in;
* the **Runtime API** (``/v1/runtime/*``), which the ServerApp executor and the ServerApps use;
  with ``--isolation process`` and ``--superexec-auth-secret-file`` a task is handed only to
  a process that signs its request with the shared secret (Flower's SuperExec HMAC), and
  every other call needs the token of a task it was handed;
* the **Control API** (``/v1/control/*``), which the ``flwr`` CLI uses to submit and stop
  runs, list them and register SuperNode keys. The open-source SuperLink authenticates no
  one here (its account plugin is a no-op): whoever reaches the port can submit a run, whose
  ClientApp every SuperNode then executes.

``pflarena superlink --operator-token-hash FILE <flower-superlink flags>`` runs
``flower-superlink`` unchanged except for one ASGI middleware in front of Flower's app
(:class:`ApiGuard`): a request to the Control API, or to anything that is not one of the
other APIs (the OpenAPI pages), passes only with ``Authorization: Bearer <token>`` whose
SHA-256 is in FILE (``operator.token.sha256``, made by ``pflarena certs``); the header is
removed before Flower sees it. Everything else gets ``403`` and a line naming what it lacked,
and the refusal is logged with the caller's address. The Fleet and Runtime APIs and
``/health`` pass to Flower's own checks, which the command requires to be on: it refuses to
start without TLS, ``--isolation process`` and ``--superexec-auth-secret-file``.

Why a route filter in the SuperLink's process and not a reverse proxy in front of it (nginx,
Caddy, Envoy): the operator's tool, the ``flwr`` CLI, cannot present a TLS client certificate
(its HTTP client takes root certificates only), so the credential must be a header; and a
SuperLink behind a proxy still listens on a port that serves all three APIs, which every
process on its host reaches directly (``local-deploy`` on loopback, the host of a compose
network), while ``flower-superlink`` can neither require a client certificate from the proxy
nor listen on a Unix socket. The filter sits where every request passes: the one port.

The operator's ``flwr`` CLI sends the token as Flower's CLI sends an account's access token:
from the credential store of its ``FLWR_HOME``, where ``pflarena connect`` puts it
(:mod:`pflarena.deploy.operator`).

Every variant, with or without ``--operator-token-hash``, also serves within request limits
(:mod:`pflarena.deploy.limits`: a body over 64 KiB only from a caller its headers
authenticate, none over 15 MiB, a body within 30 s, headers within 10 s; the flags
``--max-request-mb``, ``--max-unauthenticated-kb``, ``--request-timeout``,
``--header-timeout``), and ``--listen-fd N`` serves on a listening socket the launcher bound
(:mod:`pflarena.deploy.serving`).

This leans on Flower internals (the app factory ``create_app`` that ``flower-superlink``
imports when it starts, and the API prefixes): :func:`check_superlink_internals` fails,
naming what moved, on a flwr release that changed them, and :func:`classify` refuses to start
a SuperLink whose app has a route outside the APIs above, so that a new API is never exposed
without a decision.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from pflarena.deploy.certs import read_token_hash
from pflarena.deploy.routes import (
    API_PREFIXES,
    PUBLIC_APIS,
    classify,
    operator_token_problem,
    route_paths,
)

__all__ = [
    "API_PREFIXES",
    "ApiGuard",
    "check_superlink_internals",
    "classify",
    "main",
    "route_paths",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _log(level: int, text: str, *args: Any) -> None:
    from flwr.common.logger import log

    log(level, text, *args)


class ApiGuard:
    """ASGI middleware: the Control API (and the API's pages) for the operator only.

    Parameters
    ----------
    app : ASGI application
        Flower's SuperLink app.
    token_sha256 : str
        SHA-256 (hex) of the operator's token.
    """

    def __init__(self, app: Any, token_sha256: str) -> None:
        self.app = app
        self.token_sha256 = token_sha256.encode()

    def _operator(self, scope: Scope) -> tuple[bool, str]:
        """Whether the request carries the operator's token; what was wrong if not."""
        problem = operator_token_problem(scope.get("headers", []), self.token_sha256)
        return not problem, problem

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # Flower serves no websockets
            return
        api = classify(scope.get("path", ""))
        if api in PUBLIC_APIS:
            await self.app(scope, receive, send)
            return
        allowed, problem = self._operator(scope)
        if allowed:
            # Flower's own (no-op) account check never sees the operator's token.
            scope = dict(scope)
            scope["headers"] = [
                (k, v) for k, v in scope["headers"] if k.lower() != b"authorization"
            ]
            await self.app(scope, receive, send)
            return
        client = scope.get("client") or ("?", 0)
        from logging import WARNING

        _log(WARNING, "pflarena superlink: refused %s %s from %s:%s (%s)",
             scope.get("method", "?"), scope.get("path", ""), client[0], client[1], problem)  # fmt: skip
        what = "Control API" if api == "control" else "API's pages"
        body = json.dumps(
            {
                "detail": f"this SuperLink's {what} answers only its operator, and the request "
                f"carried {problem}: connect with the operator's token (`pflarena connect "
                "NAME --operator-token operator.token`, docs/deployment.md)"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def check_superlink_internals() -> None:
    """Fail, naming what moved, unless flwr's SuperLink builds its app as this module expects.

    Raises
    ------
    RuntimeError
        ``flwr.superlink.main.create_app`` is gone, or ``flower-superlink`` no longer imports
        it from that module when it starts (the guard would not be installed).
    """
    import flwr

    problems = []
    main_module = importlib.import_module("flwr.superlink.main")
    if not callable(getattr(main_module, "create_app", None)):
        problems.append("flwr.superlink.main.create_app")
    cli = importlib.import_module("flwr.superlink.cli.flower_superlink")
    runner = getattr(cli, "_run_superlink_http_api", None)
    if runner is None:
        problems.append("flwr.superlink.cli.flower_superlink._run_superlink_http_api")
    else:
        source = inspect.getsource(runner)
        if "from flwr.superlink.main import" not in source or "create_app(" not in source:
            problems.append("_run_superlink_http_api's import of create_app")
    if problems:
        raise RuntimeError(
            f"flwr {flwr.__version__} lacks what `pflarena superlink` relies on (written against "
            f"flwr 1.41): {', '.join(problems)}; its Control API cannot be guarded"
        )


def install_guard(token_sha256: str) -> None:
    """Make this process's ``flower-superlink`` wrap its app in :class:`ApiGuard`."""
    check_superlink_internals()
    main_module = importlib.import_module("flwr.superlink.main")
    create_app = main_module.create_app

    def guarded_create_app(*args: Any, **kwargs: Any) -> Any:
        app = create_app(*args, **kwargs)
        unknown = sorted({p for p in route_paths(app) if classify(p) is None})
        if unknown:
            raise RuntimeError(
                "the SuperLink serves routes pflarena superlink does not classify (a newer "
                f"flwr?): {', '.join(unknown)}; refusing to expose them"
            )
        app.add_middleware(ApiGuard, token_sha256=token_sha256)
        from logging import INFO

        _log(INFO, "pflarena superlink: the Control API answers only the operator's token")
        return app

    main_module.create_app = guarded_create_app


def _own_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    from pflarena.deploy.serving import add_flags

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--operator-token-hash", metavar="FILE")
    add_flags(parser)
    return parser.parse_known_args(list(argv))


def _flower_flags(rest: Sequence[str]) -> argparse.Namespace:
    """The flower-superlink flags the guard depends on."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--isolation", default="subprocess")
    parser.add_argument("--superexec-auth-secret-file")
    parser.add_argument("--ssl-certfile")
    parser.add_argument("--enable-supernode-auth", action="store_true")
    return parser.parse_known_args(list(rest))[0]


def main(argv: Sequence[str] | None = None) -> None:
    """``pflarena superlink [--operator-token-hash FILE] [--max-request-mb MB]
    [--max-unauthenticated-kb KB] [--request-timeout S] [--header-timeout S] [--listen-fd N]
    <flower-superlink flags>``.

    Without ``--operator-token-hash`` it is ``flower-superlink`` serving within the request
    limits (:mod:`pflarena.deploy.limits`), which apply in every variant: a request body
    over ``--max-request-mb`` (default 15) or, from a caller not authenticated by its
    headers, over ``--max-unauthenticated-kb`` (default 64) is refused with 413; a body
    that does not arrive within ``--request-timeout`` seconds (default 30) with 408, as are
    request headers that take longer than ``--header-timeout`` (default 10).
    ``--listen-fd N`` serves on the listening TCP socket inherited as descriptor ``N``
    instead of binding ``--host``/``--port`` (:mod:`pflarena.deploy.serving`).
    """
    from pflarena.deploy.private import private_umask
    from pflarena.deploy.serving import install_superlink, serving_from_flags

    own, rest = _own_args(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in rest):
        print(main.__doc__)
        print(__doc__.split("\n\n")[2])
    else:
        token_sha256 = None
        if own.operator_token_hash is not None:
            flags = _flower_flags(rest)
            missing = []
            if flags.insecure or not flags.ssl_certfile:
                missing.append(
                    "TLS (--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile, no --insecure)"
                )
            if flags.isolation != "process" or not flags.superexec_auth_secret_file:
                missing.append("--isolation process with --superexec-auth-secret-file FILE")
            if missing:
                raise SystemExit(
                    "pflarena superlink: --operator-token-hash guards the Control API of a "
                    f"SuperLink whose other APIs are authenticated; it needs {' and '.join(missing)}"
                )
            try:
                token_sha256 = read_token_hash(own.operator_token_hash)
                install_guard(token_sha256)
            except (RuntimeError, OSError) as exc:
                raise SystemExit(f"pflarena superlink: {exc}") from None
            if not flags.enable_supernode_auth:
                from logging import WARNING

                _log(WARNING, "pflarena superlink: without --enable-supernode-auth any process "
                     "that reaches this port can join as a SuperNode and receive messages")  # fmt: skip
        try:
            serving, rest = serving_from_flags(own, rest)
            install_superlink(serving, token_sha256)
        except (RuntimeError, ValueError) as exc:
            raise SystemExit(f"pflarena superlink: {exc}") from None
    from flwr.superlink.cli import flower_superlink

    sys.argv = ["pflarena superlink", *rest]
    private_umask()  # its state, database and logs: the operator's alone (containers too)
    flower_superlink()


if __name__ == "__main__":
    main()
