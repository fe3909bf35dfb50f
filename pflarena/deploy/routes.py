"""The SuperLink's HTTP routes, by the API they belong to.

flwr 1.41 serves its Fleet, Runtime and Control APIs on one port; what guards them
(:mod:`pflarena.deploy.superlink`'s Control API filter, :mod:`pflarena.deploy.limits`'s request
limits) needs to know which API a path is and whether a request carries the operator's
token, and to refuse a SuperLink whose app has a route of
no known API (a newer flwr), so that nothing is exposed without a decision.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any

__all__ = ["API_PREFIXES", "PUBLIC_APIS", "classify", "operator_token_problem", "route_paths"]

#: Path prefixes (or exact paths) of the SuperLink's APIs, by the API they belong to.
API_PREFIXES: dict[str, tuple[str, ...]] = {
    "health": ("/health",),
    "fleet": ("/v1/fleet/",),
    "runtime": ("/v1/runtime/",),
    "control": ("/v1/control/",),
    # FastAPI's pages describing the API: the operator's, like the Control API.
    "docs": ("/docs", "/docs/oauth2-redirect", "/openapi.json"),
}
#: The APIs that pass to Flower's own authentication (SuperNode keys, SuperExec secret).
PUBLIC_APIS = ("health", "fleet", "runtime")


def classify(path: str) -> str | None:
    """The API a request path belongs to (a key of :data:`API_PREFIXES`), or None."""
    for api, prefixes in API_PREFIXES.items():
        for prefix in prefixes:
            if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
                return api
    return None


def route_paths(app: Any) -> Iterable[str]:
    """Every route's path of a FastAPI app, those of included routers too."""
    from fastapi.routing import iter_route_contexts

    for context in iter_route_contexts(app.routes):
        yield context.path if isinstance(context.path, str) else repr(context.route)


def operator_token_problem(headers: Iterable[tuple[bytes, bytes]], token_sha256: bytes) -> str:
    """What is wrong with a request's claim to be the operator (its ASGI ``headers``:
    ``Authorization: Bearer <token>`` whose SHA-256, hex, is ``token_sha256``); "" if none."""
    values = [v for k, v in headers if k.lower() == b"authorization"]
    if not values:
        return "no operator token"
    if len(values) > 1:
        return "more than one Authorization header"
    scheme, _, token = values[0].decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return "an Authorization header that is not a bearer token"
    digest = hashlib.sha256(token.strip().encode("latin-1")).hexdigest().encode()
    if not hmac.compare_digest(digest, token_sha256):
        return "a wrong operator token"
    return ""
