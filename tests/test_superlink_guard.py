"""The SuperLink's Control API for its operator only (``pflarena superlink``), and the operator's
``flwr`` CLI holding the token (``pflarena connect``).

The guard is tested on its own (an inner app that records what reaches it) and on Flower's own
SuperLink app, built by ``flwr.superlink.main.create_app`` as ``flower-superlink`` builds it;
the operator's credential is read back with the ``flwr`` CLI's own plugin loader. The
deployment tests (``test_deployment_secure.py``, ``test_containers.py``) try the same as a
stranger against running SuperLinks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import tomllib
from starlette.testclient import TestClient

from pflarena.deploy.certs import make_operator_token, read_token_hash, token_hash
from pflarena.deploy.errors import DeploymentError
from pflarena.deploy.superlink import API_PREFIXES, ApiGuard, classify, install_guard, route_paths

TOKEN = "operator-secret-token-0123456789"


class Recorder:
    """An inner ASGI app that answers 200 and remembers each request's path and headers."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[bytes, bytes]]] = []

    async def __call__(self, scope, receive, send) -> None:
        self.seen.append((scope["path"], dict(scope["headers"])))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"inner"})


@pytest.fixture
def guarded() -> tuple[TestClient, Recorder]:
    inner = Recorder()
    return TestClient(ApiGuard(inner, hashlib.sha256(TOKEN.encode()).hexdigest())), inner


@pytest.mark.parametrize("path", ["/health", "/v1/fleet/pull-messages", "/v1/runtime/acquire-task"])
def test_fleet_runtime_and_health_pass_to_flower_untouched(guarded, path: str) -> None:
    client, inner = guarded
    response = client.post(path, headers={"Authorization": "Bearer whatever"})
    assert response.status_code == 200 and response.text == "inner"
    assert inner.seen[-1][0] == path
    assert inner.seen[-1][1][b"authorization"] == b"Bearer whatever"  # Flower's to judge


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({}, "no operator token"),
        ({"Authorization": "Bearer wrong-token-wrong-token"}, "a wrong operator token"),
        ({"Authorization": f"Basic {TOKEN}"}, "not a bearer token"),
        ({"Authorization": "Bearer "}, "not a bearer token"),
    ],
)
@pytest.mark.parametrize(
    "path",
    ["/v1/control/start-run", "/v1/control/register-node", "/docs", "/openapi.json", "/v2/new"],
)
def test_the_control_api_and_everything_else_refuse_without_the_token(
    guarded, path: str, headers: dict[str, str], problem: str
) -> None:
    client, inner = guarded
    response = client.post(path, headers=headers)
    assert response.status_code == 403, response.text
    assert (
        problem in response.json()["detail"]
        and "answers only its operator" in response.json()["detail"]
    )
    assert inner.seen == [], "a refused request reached Flower"


def test_two_authorization_headers_are_refused(guarded) -> None:
    client, inner = guarded
    headers = [("authorization", f"Bearer {TOKEN}"), ("authorization", "Bearer other")]
    response = client.post("/v1/control/list-runs", headers=headers)
    assert response.status_code == 403 and "more than one" in response.json()["detail"]
    assert inner.seen == []


def test_the_operator_passes_and_flower_never_sees_the_token(guarded) -> None:
    client, inner = guarded
    response = client.post("/v1/control/list-runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    path, headers = inner.seen[-1]
    assert path == "/v1/control/list-runs" and b"authorization" not in headers


def test_every_route_of_flowers_superlink_belongs_to_a_known_api() -> None:
    """A new API in a newer flwr fails here (and the guard refuses to start), instead of
    being exposed unclassified."""
    from flwr.superlink.main import create_app

    paths = sorted(set(route_paths(create_app())))
    assert len(paths) > 40, paths  # included routers are walked, not skipped
    assert [p for p in paths if classify(p) is None] == []
    apis = {classify(p) for p in paths}
    assert apis == set(API_PREFIXES), apis
    assert classify("/v1/fleet/../control/start-run") == "fleet"  # Starlette routes it nowhere
    assert classify("/health/x") is None and classify("/v1/controlx") is None


def test_flowers_app_is_guarded_once_installed(monkeypatch) -> None:
    import flwr.superlink.main as superlink_main

    monkeypatch.setattr(superlink_main, "create_app", superlink_main.create_app)
    install_guard(hashlib.sha256(TOKEN.encode()).hexdigest())
    client = TestClient(superlink_main.create_app())
    refused = client.post("/v1/control/list-runs", content=b"")
    assert refused.status_code == 403, refused.text
    assert client.get("/openapi.json").status_code == 403
    assert (
        client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    )
    # The Fleet API is Flower's: its node authentication answers, not the guard.
    fleet = client.post("/v1/fleet/pull-messages", content=b"")
    assert fleet.status_code != 403 or "operator" not in fleet.text


def test_a_route_the_guard_does_not_know_stops_the_superlink(monkeypatch) -> None:
    import flwr.superlink.main as superlink_main

    original = superlink_main.create_app

    def with_new_api(*args, **kwargs):
        app = original(*args, **kwargs)
        app.add_api_route("/v2/new-api", lambda: {}, methods=["POST"])
        return app

    monkeypatch.setattr(superlink_main, "create_app", with_new_api)
    install_guard(hashlib.sha256(TOKEN.encode()).hexdigest())
    with pytest.raises(RuntimeError, match="/v2/new-api"):
        superlink_main.create_app()


@pytest.mark.parametrize(
    ("flags", "needs"),
    [
        (["--insecure", "--isolation", "process", "--superexec-auth-secret-file", "s"], "TLS"),
        (["--ssl-certfile", "c", "--superexec-auth-secret-file", "s"], "--isolation process"),
        (["--ssl-certfile", "c", "--isolation", "process"], "--superexec-auth-secret-file"),
    ],
)
def test_the_guard_needs_the_other_apis_authenticated(tmp_path: Path, flags, needs) -> None:
    from pflarena.deploy.superlink import main

    _, digest = make_operator_token(tmp_path)
    with pytest.raises(SystemExit, match=needs):
        main(["--operator-token-hash", str(digest), *flags])


def test_operator_token_files(tmp_path: Path) -> None:
    token, digest = make_operator_token(tmp_path)
    assert token.stat().st_mode & 0o777 == 0o600
    assert read_token_hash(digest) == token_hash(token.read_bytes())
    assert read_token_hash(digest) == hashlib.sha256(token.read_bytes().strip()).hexdigest()
    assert make_operator_token(tmp_path) == (token, digest)  # kept, not remade
    (tmp_path / "bad").write_text("not a hash")
    with pytest.raises(DeploymentError, match="64 hex digits"):
        read_token_hash(tmp_path / "bad")


def test_connect_writes_the_connection_and_the_clis_credential(tmp_path: Path, monkeypatch) -> None:
    """The token is read back with the ``flwr`` CLI's own code: the plugin it loads for the
    connection's address writes it into the request metadata it sends."""
    from pflarena.deploy.operator import connect

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "other"\n[superlink.other]\naddress = "h:1"\ninsecure = true\n'
    )
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    token, _ = make_operator_token(tmp_path / "certs")
    connect(home, "secure", "127.0.0.1:9091", root_certificates=ca, operator_token=token)
    config = tomllib.loads((home / "config.toml").read_text())
    assert config["superlink"]["default"] == "other"
    assert config["superlink"]["other"]["address"] == "h:1"
    assert config["superlink"]["secure"] == {
        "address": "127.0.0.1:9091",
        "root-certificates": str(ca),
    }
    assert (home / "credentials.yaml").stat().st_mode & 0o777 == 0o600

    from flwr.cli.utils import load_cli_auth_plugin_from_connection
    from flwr.supercore.credential_store import file_credential_store

    monkeypatch.setattr(file_credential_store, "CREDENTIAL_FILE_PATH", home / "credentials.yaml")
    plugin = load_cli_auth_plugin_from_connection("127.0.0.1:9091")
    plugin.load_tokens()
    metadata = dict(plugin.write_tokens_to_metadata([]))
    assert token.read_bytes().strip().decode() in metadata.values()
    with pytest.raises(DeploymentError, match="letters, digits"):
        connect(home, "bad name", "h:1")
    assert os.environ.get("FLWR_HOME") != str(home)
