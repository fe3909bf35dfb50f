"""``pflarena bundle``: what each host of a federation gets, and the address check against a
real TLS handshake (OpenSSL's hostname check, through Python's ``ssl``)."""

from __future__ import annotations

import hashlib
import socket
import ssl
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest
import yaml

from pflarena.cli import main
from pflarena.deploy.bundles import certificate_names, node_bundle, parse_address, superlink_bundle
from pflarena.deploy.errors import DeploymentError

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "openssl", "ssh-keygen"], capture_output=True).returncode != 0,
    reason="needs openssl and ssh-keygen",
)


@pytest.fixture()
def fed(tmp_path: Path) -> Path:
    """A federation directory with the SuperLink's bundle and two nodes' (one shard each)."""
    root = tmp_path / "fed"
    for i in range(2):
        (tmp_path / f"client_{i:04d}.npz").write_bytes(f"shard {i}".encode())
    assert main(["bundle", "superlink", "--dir", str(root), "--address", "192.0.2.7:9300",
                 "--address", "fl.example.org"]) == 0  # fmt: skip
    for i, name in enumerate(["node-a", "node-b"]):
        shard = tmp_path / f"client_{i:04d}.npz"
        assert main(["bundle", "supernode", name, "--dir", str(root), "--shard", str(shard)]) == 0
    assert main(["bundle", "operator", "--dir", str(root)]) == 0
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_each_bundle_holds_its_own_credentials_only(fed: Path) -> None:
    bundles = fed / "bundles"
    everything = {n: _files(bundles / n) for n in ("superlink", "node-a", "node-b", "operator")}
    secrets = {
        "ca.key": (fed / "certs" / "ca.key").read_bytes(),
        "operator.token": (fed / "certs" / "operator.token").read_bytes(),
        "signing key": (fed / "certs" / "app-signing.key").read_bytes(),
        "node-a key": (fed / "certs" / "nodes" / "node-a" / "node.key").read_bytes(),
        "node-b key": (fed / "certs" / "nodes" / "node-b" / "node.key").read_bytes(),
        "node-a secret": (fed / "certs" / "nodes" / "node-a" / "superexec.secret").read_bytes(),
        "superlink secret": (fed / "certs" / "secrets" / "superlink").read_bytes(),
        "node-a shard": b"shard 0",
        "node-b shard": b"shard 1",
    }
    holders = {
        what: sorted(n for n, files in everything.items() if value in files.values())
        for what, value in secrets.items()
    }
    assert holders == {
        "ca.key": [],
        "operator.token": ["operator"],
        "signing key": ["operator"],
        "node-a key": ["node-a"],
        "node-b key": ["node-b"],
        "node-a secret": ["node-a"],
        "superlink secret": ["superlink"],
        "node-a shard": ["node-a"],
        "node-b shard": ["node-b"],
    }
    token = (fed / "certs" / "operator.token").read_bytes().strip()
    link = everything["superlink"]["credentials/operator.token.sha256"].decode().strip()
    assert link == hashlib.sha256(token).hexdigest()
    # Private on disk and in the archive, the archive equal to the directory.
    for name in everything:
        for path in [bundles / name, *(bundles / name).rglob("*")]:
            assert path.stat().st_mode & 0o077 == 0, path
        assert (bundles / f"{name}.tar").stat().st_mode & 0o777 == 0o600
        with tarfile.open(bundles / f"{name}.tar") as tar:
            members = {m.name: m for m in tar.getmembers()}
            for rel, data in everything[name].items():
                member = members[f"{name}/{rel}"]
                assert tar.extractfile(member).read() == data
                assert member.mode & 0o077 == 0 and member.uid == 0
            assert len([m for m in members.values() if m.isfile()]) == len(everything[name])


def test_a_node_dials_out_only_and_its_executor_trusts_its_node_only(fed: Path) -> None:
    compose = yaml.safe_load((fed / "bundles" / "node-a" / "docker-compose.yml").read_text())
    assert not [s for s in compose["services"].values() if "ports" in s]
    command = compose["services"]["supernode"]["command"]
    assert command[command.index("--superlink") + 1] == "192.0.2.7:9300"
    a = _files(fed / "bundles" / "node-a")
    b = _files(fed / "bundles" / "node-b")
    assert a["credentials/runtime-ca.crt"] != b["credentials/runtime-ca.crt"]
    assert a["credentials/runtime-ca.crt"] != a["credentials/ca.crt"]
    link = yaml.safe_load((fed / "bundles" / "superlink" / "docker-compose.yml").read_text())
    assert link["services"]["superlink"]["ports"] == [
        "${PFLARENA_BIND:-0.0.0.0}:${PFLARENA_PORT:-9300}:9091"
    ]
    for script in ("node-a/run-node.sh", "node-a/start.sh", "superlink/run-superlink.sh"):
        done = subprocess.run(["bash", "-n", str(fed / "bundles" / script)], capture_output=True)
        assert done.returncode == 0, done.stderr


def _handshake_accepts(cert: Path, key: Path, ca: Path, name: str) -> bool:
    """Whether a TLS client that verifies with ``ca`` and checks ``name`` (OpenSSL, through
    Python's ssl) accepts a server that presents ``cert``: the reference for the check."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(ca))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname()) as sock:
                client.wrap_socket(sock, server_hostname=name).close()
            return True
        except ssl.SSLCertVerificationError:
            return False
        finally:
            thread.join(10)


@pytest.mark.parametrize(
    "name",
    ["192.0.2.7", "192.0.2.8", "fl.example.org", "FL.example.org", "x.fl.example.org",
     "example.org", "localhost", "127.0.0.1", "::1", "superlink"],
)  # fmt: skip
def test_the_address_check_agrees_with_a_tls_handshake(fed: Path, name: str) -> None:
    certs = fed / "certs"
    accepted = _handshake_accepts(
        certs / "superlink.pem", certs / "superlink.key", certs / "ca.crt", name
    )
    try:
        node_bundle(fed, "node-z", shard=fed / "federation.json", superlink=f"{name}:9300")
        made = True
    except DeploymentError as exc:
        made = False
        assert f"not {name.lower()}" in str(exc) and "--reissue" in str(exc)
    assert made == accepted, (name, certificate_names(certs / "superlink.pem"))


def test_a_new_address_needs_reissue_and_keeps_the_ca(fed: Path, capsys) -> None:
    certs = fed / "certs"
    ca, before = (certs / "ca.crt").read_bytes(), (certs / "superlink.pem").read_bytes()
    assert main(["bundle", "superlink", "--dir", str(fed), "--address", "10.9.8.7"]) != 0
    assert "does not name 10.9.8.7" in capsys.readouterr().err
    assert (certs / "superlink.pem").read_bytes() == before
    assert (
        main(["bundle", "superlink", "--dir", str(fed), "--address", "10.9.8.7", "--reissue"]) == 0
    )
    assert (certs / "ca.crt").read_bytes() == ca
    names = certificate_names(certs / "superlink.pem")
    assert {"10.9.8.7", "192.0.2.7", "fl.example.org"} <= set(names)
    assert _handshake_accepts(
        certs / "superlink.pem", certs / "superlink.key", certs / "ca.crt", "10.9.8.7"
    )
    # The node bundles made before trust the same CA.
    assert (fed / "bundles" / "node-a" / "credentials" / "ca.crt").read_bytes() == ca


def test_a_new_node_key_retires_the_old_one(fed: Path, tmp_path: Path) -> None:
    node = fed / "certs" / "nodes" / "node-a"
    old = (node / "node.key.pub").read_bytes()
    made = node_bundle(fed, "node-a", shard=tmp_path / "client_0000.npz", new_key=True)
    assert (node / "node.key.pub").read_bytes() != old
    assert [p.read_bytes() for p in node.glob("node.key.retired-*.pub")] == [old]
    assert (
        _files(made.directory)["credentials/node.key.pub"] == (node / "node.key.pub").read_bytes()
    )
    assert any("unregister the old node" in note for note in made.notes)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("fl.example.org", ("fl.example.org", None)), ("10.0.0.1:9092", ("10.0.0.1", 9092)),
     ("[2001:db8::1]:9091", ("2001:db8::1", 9091)), ("2001:db8::1", ("2001:db8::1", None))],
)  # fmt: skip
def test_addresses(text: str, parsed: tuple) -> None:
    assert parse_address(text) == parsed


@pytest.mark.parametrize("text", ["host:0", "host:99999", "host:x", "a b", "[::1]x", ""])
def test_bad_addresses_are_refused(text: str) -> None:
    with pytest.raises(DeploymentError, match="address"):
        parse_address(text)


def test_bad_requests_are_refused_before_anything_is_made(tmp_path: Path) -> None:
    with pytest.raises(DeploymentError, match="not a federation directory"):
        node_bundle(tmp_path / "none", "node-a", data_path="/srv/a.npz")
    assert not (tmp_path / "none").exists()
    with pytest.raises(DeploymentError, match="--address"):
        superlink_bundle(tmp_path / "empty", [])
    fed = tmp_path / "fed"
    superlink_bundle(fed, ["192.0.2.7"])
    for name in ("operator", "Node_A", "-a"):
        with pytest.raises(DeploymentError, match="host name"):
            node_bundle(fed, name, data_path="/srv/a.npz")
    with pytest.raises(DeploymentError, match="absolute path"):
        node_bundle(fed, "node-a", data_path="srv/a.npz")
    with pytest.raises(DeploymentError, match="--shard FILE"):
        node_bundle(fed, "node-a")
    assert not (fed / "bundles" / "node-a").exists()


def test_a_host_that_keeps_its_own_key(fed: Path, tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f",
                    str(own / "node.key")], check=True)  # fmt: skip
    given = (own / "node.key.pub").read_bytes()
    shard = tmp_path / "client_0000.npz"
    made = node_bundle(fed, "node-c", shard=shard, public_key=own / "node.key.pub")
    files = _files(made.directory)
    assert "credentials/node.key" not in files
    assert files["credentials/node.key.pub"].strip() == given.strip()
    assert not (fed / "certs" / "nodes" / "node-c" / "node.key").exists()
    # Its scripts refuse to start until the host puts its key there (Docker would mount a
    # directory made in its place).
    for script in ("start.sh", "run-node.sh"):
        done = subprocess.run(["bash", str(made.directory / script)], capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
        assert done.returncode == 2 and "credentials/node.key is missing" in done.stderr
    # Made again without the key: still the host's own; with a new one: the old retired.
    again = node_bundle(fed, "node-c", shard=shard)
    assert "credentials/node.key" not in _files(again.directory)
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f",
                    str(own / "next")], check=True)  # fmt: skip
    node_bundle(fed, "node-c", shard=shard, public_key=own / "next.pub")
    node_dir = fed / "certs" / "nodes" / "node-c"
    assert (node_dir / "node.key.pub").read_bytes().strip() == (
        own / "next.pub"
    ).read_bytes().strip()
    assert [p.read_bytes().strip() for p in node_dir.glob("node.key.retired-*.pub")] == [
        given.strip()
    ]
    # Flower's nodes sign with EC keys: another kind is refused before anything is written.
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(own / "ed")], check=True
    )
    with pytest.raises(DeploymentError, match="not an EC key"):
        node_bundle(fed, "node-d", shard=shard, public_key=own / "ed.pub")
    with pytest.raises(DeploymentError, match="not an OpenSSH public key"):
        node_bundle(fed, "node-d", shard=shard, public_key=shard)
    assert not (fed / "bundles" / "node-d").exists()
