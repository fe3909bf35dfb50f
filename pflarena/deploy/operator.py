"""The operator's side of a secure deployment: ``pflarena connect``.

The ``flwr`` CLI reads its SuperLink connections from ``$FLWR_HOME/config.toml`` and sends,
with every Control API request, the access token its credential store
(``$FLWR_HOME/credentials.yaml``) holds for the connection's address, as
``Authorization: Bearer <token>`` (``CliAccountAuthHttpInterceptor`` in
``flwr/cli/cli_account_auth_interceptor.py``; ``flwr login`` fills that store from a
SuperLink with an OIDC account plugin). A pflarena SuperLink
(:mod:`pflarena.deploy.superlink`) accepts the operator's token there, so
:func:`connect` writes the connection and puts the token into that store with Flower's own
credential-store class and key names; from then on plain ``flwr run``, ``flwr list``,
``flwr supernode register`` work for the operator, and are refused for anyone else.

The token stays on the operator's machine: the credential file is written with mode 0600,
and the SuperLink holds only the token's SHA-256.
"""

from __future__ import annotations

from pathlib import Path

import tomllib

from pflarena.deploy.errors import DeploymentError

__all__ = ["check_cli_internals", "connect", "store_operator_token"]

#: The account type Flower's CLI sends a stored bearer token for.
_AUTHN_TYPE = "oidc"
#: The CLI refreshes a token only on a 401 with ``WWW-Authenticate: Bearer``, which a
#: pflarena SuperLink never sends; the store needs a value all the same.
_NO_REFRESH = b"none"


def check_cli_internals() -> None:
    """Fail, naming what moved, unless the installed ``flwr`` CLI reads a bearer token for a
    connection from its credential store as flwr 1.41 does."""
    import flwr

    from pflarena.core.internals import missing_internals

    wanted = {
        "flwr.cli.constant": ("AUTHN_TYPE_STORE_KEY", "ACCESS_TOKEN_STORE_KEY", "REFRESH_TOKEN_STORE_KEY"),
        "flwr.cli.auth_plugin": ("get_cli_plugin_class",),
        "flwr.supercore.credential_store.file_credential_store": ("FileCredentialStore",),
        "flwr.cli.cli_account_auth_interceptor": ("CliAccountAuthHttpInterceptor",),
    }  # fmt: skip
    missing = missing_internals(wanted)
    if not missing:
        from flwr.cli.auth_plugin import get_cli_plugin_class

        try:
            get_cli_plugin_class(_AUTHN_TYPE)
        except ValueError:
            missing.append(f"the CLI's '{_AUTHN_TYPE}' account plugin")
    if missing:
        raise DeploymentError(
            f"flwr {flwr.__version__}'s CLI lacks what `pflarena connect` relies on (written "
            f"against flwr 1.41): {', '.join(missing)}"
        )


def store_operator_token(flwr_home: str | Path, address: str, token: bytes) -> Path:
    """Put ``token`` into the credential store of ``flwr_home`` for the SuperLink at
    ``address`` (the connection's ``address``, as the CLI looks it up)."""
    check_cli_internals()
    from flwr.cli.constant import (
        ACCESS_TOKEN_STORE_KEY,
        AUTHN_TYPE_STORE_KEY,
        REFRESH_TOKEN_STORE_KEY,
    )
    from flwr.supercore.credential_store.file_credential_store import FileCredentialStore

    value = token.strip()
    if len(value) < 16:
        raise DeploymentError("an operator token has at least 16 characters")
    path = Path(flwr_home) / "credentials.yaml"
    store = FileCredentialStore(path)
    store.set(AUTHN_TYPE_STORE_KEY % address, _AUTHN_TYPE.encode())
    store.set(ACCESS_TOKEN_STORE_KEY % address, value)
    store.set(REFRESH_TOKEN_STORE_KEY % address, _NO_REFRESH)
    path.chmod(0o600)
    return path


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def connect(
    flwr_home: str | Path,
    name: str,
    address: str,
    *,
    root_certificates: str | Path | None = None,
    operator_token: str | Path | None = None,
    default: bool = False,
) -> Path:
    """Write connection ``name`` into ``flwr_home/config.toml`` (other connections kept;
    one of the same name replaced) and, with ``operator_token`` (a file), store the token.

    Raises
    ------
    DeploymentError
        A bad name, a certificate or token file that cannot be read, or a ``config.toml``
        that is not TOML.
    """
    import tomli_w

    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise DeploymentError(f"connection name {name!r}: letters, digits, '-' and '_' only")
    home = Path(flwr_home)
    config_path = home / "config.toml"
    try:
        config = tomllib.loads(config_path.read_text()) if config_path.exists() else {}
    except tomllib.TOMLDecodeError as exc:
        raise DeploymentError(f"{config_path} is not TOML: {exc}") from None
    connection: dict[str, object] = {"address": address}
    if root_certificates is not None:
        ca = Path(root_certificates).resolve()
        if not ca.is_file():
            raise DeploymentError(f"root certificates {ca} do not exist")
        connection["root-certificates"] = str(ca)
    else:
        connection["insecure"] = True
    superlinks = config.setdefault("superlink", {})
    superlinks[name] = connection
    if default or "default" not in superlinks:
        superlinks["default"] = name
    if operator_token is not None:
        try:
            token = Path(operator_token).read_bytes()
        except OSError as exc:
            raise DeploymentError(
                f"cannot read the operator token {operator_token}: {exc}"
            ) from None
        store_operator_token(home, address, token)
    home.mkdir(parents=True, exist_ok=True)
    partial = config_path.with_suffix(".partial")
    partial.write_text(tomli_w.dumps(config))
    partial.replace(config_path)
    return config_path
