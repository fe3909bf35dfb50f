"""A federation over several hosts: what each machine needs, made on the operator's
(``pflarena bundle``).

The operator keeps one **federation directory** (0700): the credentials (``certs/``, as
``pflarena certs`` makes them: the CA, the SuperLink's certificate, the operator's token, the
SuperExec secrets, the app signing key; per SuperNode host ``certs/nodes/<name>/``: its key
pair, its SuperExec secret, the CA and certificate of its own Runtime API), ``federation.json``
(the addresses the SuperLink is reached by, and the hosts made so far) and ``bundles/``.

A **bundle** is what one other machine needs and nothing more, as a directory and as one
``<name>.tar`` to copy there (both the operator's alone: directories 0700, files 0600):

``superlink``
    The SuperLink's certificate and key, the CA's certificate, the operator token's SHA-256 (not
    the token), the SuperExec secret it shares with its ServerApp executor, the app signing
    public key; ``docker-compose.yml`` (the SuperLink, its port published, and the ServerApp
    executor), ``run-superlink.sh`` (the same two processes without Docker) and a systemd unit.
``<node name>``
    One SuperNode host: its node key pair, the CA's certificate, the SuperLink's address, its
    SuperExec secret and Runtime API certificate (the executor beside it verifies its node with
    them), the app signing public key, its node config (``data-path``, ``state-dir``) and, with
    ``--shard``, its data; ``docker-compose.yml`` (the SuperNode and its ClientApp executor; no
    port published: a node only dials out), ``run-node.sh`` (without Docker: a Raspberry Pi, a
    Jetson) and a systemd unit.
``operator``
    The operator's laptop: the connection (the SuperLink's address, the CA's certificate, the
    operator's token, ``connect.sh``) and the app signing key, to approve apps.

What the bundles do not hold stays on the operator's machine: the CA's key, other hosts'
secrets and keys, every other host's data. The SuperLink's certificate must name every address
the nodes and the operator dial: the names are given when the SuperLink's bundle is made, and
each node's and the operator's bundle is checked against the certificate
(:func:`check_dialled`) when it is made, so that a name it lacks is a line here and not a TLS
failure on a remote machine.
"""

from __future__ import annotations

import datetime as dt
import io
import ipaddress
import json
import os
import re
import shlex
import shutil
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pflarena.deploy.certs import (
    OPERATOR_TOKEN,
    OPERATOR_TOKEN_HASH,
    SIGNING_KEY,
    Trust,
    adopt_public_key,
    make_certificates,
    make_node_key,
    make_operator_token,
    make_secret,
    make_signing_key,
    secret_path,
)
from pflarena.deploy.compose import healthcheck
from pflarena.deploy.errors import DeploymentError
from pflarena.deploy.private import check_owned, private_dir

__all__ = [
    "Bundle",
    "DEFAULT_PORT",
    "certificate_names",
    "check_dialled",
    "node_bundle",
    "operator_bundle",
    "parse_address",
    "superlink_bundle",
]

#: The port the SuperLink is reached by unless the operator says otherwise (its one HTTP port:
#: Fleet, Control and Runtime API, flwr 1.41).
DEFAULT_PORT = 9091
#: The SuperLink's port inside its container, and a SuperNode's Runtime API port on its host.
CONTAINER_PORT = 9091
RUNTIME_PORT = 9094
FEDERATION_FILE = "federation.json"
#: Bundle names that are not SuperNode hosts.
RESERVED = ("superlink", "operator")
_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")
#: The compose variables every bundle's file reads (``start.sh`` sets the first two).
USER = "${PFLARENA_UID:?set by start.sh: the host user that owns this bundle}"
GROUP = "${PFLARENA_GID:?set by start.sh}"
TAG = "${PFLARENA_TAG:-latest}"
IMAGE = "${PFLARENA_IMAGE:-pflarena}"


# --------------------------------------------------------------------------- addresses
def parse_address(text: str) -> tuple[str, int | None]:
    """``HOST``, ``HOST:PORT``, ``IPv6``, ``[IPv6]:PORT`` -> (host, port or None); a line
    naming the problem otherwise."""
    text = text.strip()
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise DeploymentError(f"address {text!r}: expected [IPv6]:PORT")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    if not host or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise DeploymentError(f"address {text!r}: expected HOST or HOST:PORT (a port 1-65535)")
    if _ip(host) is None and not re.fullmatch(r"[A-Za-z0-9.-]+", host):
        raise DeploymentError(f"address {text!r}: {host!r} is neither a host name nor an IP")
    return host.lower(), int(port) if port else None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _dial(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def certificate_names(cert: Path) -> list[str]:
    """The DNS names and IPs a server certificate's subject alternative names hold."""
    from cryptography import x509

    try:
        loaded = x509.load_pem_x509_certificate(Path(cert).read_bytes())
        san = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound) as exc:
        raise DeploymentError(f"cannot read the names of certificate {cert}: {exc}") from None
    names = [str(n).lower() for n in san.get_values_for_type(x509.DNSName)]
    return names + [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]


def _names_host(names: list[str], host: str) -> bool:
    """Whether a certificate with ``names`` is valid for ``host`` (as a TLS client checks:
    an IP against the IP entries, a name against the DNS entries, ``*.`` for one label)."""
    ip = _ip(host)
    if ip is not None:
        return any(_ip(n) == ip for n in names)
    for name in names:
        if name == host:
            return True
        if name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]:
            return True
    return False


def check_dialled(cert: Path, host: str, fed_dir: Path) -> None:
    """Refuse ``host`` as the SuperLink's address when its certificate does not name it:
    a node or CLI dialling it would fail TLS verification on its own machine."""
    names = certificate_names(cert)
    if not _names_host(names, host):
        raise DeploymentError(
            f"the SuperLink's certificate {cert} names {', '.join(names)}, not {host}: whoever "
            f"dials {host} would refuse the SuperLink (TLS: the certificate does not match the "
            f"address); make a certificate that names it with `pflarena bundle superlink --dir "
            f"{fed_dir} --address {host} --reissue` (the same CA: the bundles made so far stay "
            "valid), then restart the SuperLink from its new bundle, or dial a name it has"
        )


# --------------------------------------------------------------------------- the directory
@dataclass
class Federation:
    """The operator's federation directory and its ``federation.json``."""

    root: Path
    record: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | Path, *, create: bool = False) -> Federation:
        root = Path(path)
        if not create and not (root / FEDERATION_FILE).exists():
            raise DeploymentError(
                f"{root} is not a federation directory (no {FEDERATION_FILE}): make the "
                f"SuperLink's bundle first, `pflarena bundle superlink --dir {root} --address HOST`"
            )
        root = private_dir(root, "federation directory")
        record: dict[str, Any] = {}
        path_ = root / FEDERATION_FILE
        if path_.exists():
            check_owned(path_, "federation record")
            try:
                record = json.loads(path_.read_text())
            except ValueError as exc:
                raise DeploymentError(f"{path_} is not JSON: {exc}") from None
        return cls(root, record)

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    def node_dir(self, name: str) -> Path:
        return self.certs / "nodes" / name

    def save(self) -> None:
        partial = self.root / f"{FEDERATION_FILE}.{os.getpid()}"
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(self.record, handle, indent=1, sort_keys=True)
            handle.write("\n")
        partial.replace(self.root / FEDERATION_FILE)

    @property
    def superlink(self) -> dict[str, Any]:
        return self.record.setdefault("superlink", {})

    def superlink_cert(self) -> Path:
        cert = self.certs / "superlink.pem"
        if not cert.exists():
            raise DeploymentError(
                f"{self.root} has no SuperLink certificate: make the SuperLink's bundle first, "
                f"`pflarena bundle superlink --dir {self.root} --address HOST`"
            )
        return cert

    def dialled(self, address: str | None) -> tuple[str, int]:
        """The SuperLink address a bundle names (default: the first one recorded), checked
        against the SuperLink's certificate."""
        cert = self.superlink_cert()
        recorded = self.superlink.get("addresses") or []
        if address is None:
            if not recorded:
                raise DeploymentError(f"{self.root} records no SuperLink address: give --superlink")
            address = recorded[0]
        host, port = parse_address(address)
        check_dialled(cert, host, self.root)
        return host, port or self.superlink.get("port", DEFAULT_PORT)


# --------------------------------------------------------------------------- writing bundles
@dataclass
class Bundle:
    """A bundle written: its directory, its archive and what it holds."""

    name: str
    directory: Path
    archive: Path
    files: list[str]
    notes: list[str] = field(default_factory=list)


def _write_bundle(fed: Federation, name: str, files: dict[str, tuple[bytes, int]]) -> Bundle:
    """Write ``files`` (relative path -> (content, mode)) as ``bundles/<name>/`` and
    ``bundles/<name>.tar``, replacing an earlier bundle of that name whole."""
    out = private_dir(fed.root / "bundles", "bundles directory")
    final, archive = out / name, out / f"{name}.tar"
    partial = out / f".{name}.{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(mode=0o700)
    buffer, now = io.BytesIO(), int(time.time())
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in sorted({str(Path(name, rel).parent) for rel in files}):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, now
            tar.addfile(info)
        for rel, (data, mode) in sorted(files.items()):
            path = partial / rel
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(path, mode)
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size, info.mode, info.mtime = len(data), mode, now
            tar.addfile(info, io.BytesIO(data))
    if final.exists():
        check_owned(final, "bundle directory")
        shutil.rmtree(final)
    partial.rename(final)
    archive.unlink(missing_ok=True)
    fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(buffer.getvalue())
    return Bundle(name, final, archive, sorted(files))


def _read(path: Path) -> bytes:
    return Path(path).read_bytes()


def _script(text: str) -> tuple[bytes, int]:
    return text.encode(), 0o700


def _text(text: str) -> tuple[bytes, int]:
    return text.encode(), 0o600


def _yaml(data: Any, header: str) -> tuple[bytes, int]:
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)
    return _text("".join(f"# {line}\n" for line in header.splitlines()) + body)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: ``start.sh`` of a Docker host's bundle: its compose project, run as the user that owns the
#: bundle (whose files are 0600), its state beside it.
START_SH = """#!/bin/sh
# Start (or restart after a reboot) this host's containers from this bundle: docker compose
# as the user that owns the bundle, its state in ./state (kept across restarts). After
# unpacking a new bundle over this one (a new key, certificate or address):
# ./start.sh --force-recreate
set -eu
cd "$(dirname "$0")"
umask 077
{checks}PFLARENA_UID=$(stat -c %u .) PFLARENA_GID=$(stat -c %g .)
export PFLARENA_UID PFLARENA_GID
mkdir -p {dirs}
# Run by root (as docker often is): what it made belongs to the bundle's owner too.
[ "$(id -u)" != 0 ] || chown "$PFLARENA_UID:$PFLARENA_GID" {dirs}
if docker compose version >/dev/null 2>&1; then
    exec docker compose -p "${{PFLARENA_PROJECT:-{project}}}" up -d "$@"
fi
exec docker-compose -p "${{PFLARENA_PROJECT:-{project}}}" up -d "$@"
"""

#: Two processes that live and end together (``run-node.sh``, ``run-superlink.sh``).
PAIR_SH = """#!/bin/bash
# {what} without Docker (pflarena installed: `pip install pflarena`): {first_what} and
# {second_what}; when either ends, the other is stopped and the script exits with its status
# (systemd's Restart= brings both back).
set -uo pipefail
cd "$(dirname "$0")"
umask 077
{checks}mkdir -p {dirs}
here=$(pwd)
{first} &
first=$!
{second} --parent-pid "$first" &
second=$!
trap 'kill -TERM "$first" "$second" 2>/dev/null' TERM INT
wait -n "$first" "$second"
status=$?
while [ "$status" -gt 128 ] && kill -0 "$first" 2>/dev/null && kill -0 "$second" 2>/dev/null; do
    wait -n "$first" "$second"
    status=$?
done
kill -TERM "$first" "$second" 2>/dev/null
wait
exit "$status"
"""

UNIT = """[Unit]
Description={description}
Wants=network-online.target
After=network-online.target

[Service]
# Install: copy the bundle to {path} (owned by {user}), then
#   cp {unit} /etc/systemd/system/ && systemctl enable --now {unit}
User={user}
WorkingDirectory={path}
ExecStart={path}/{script}
Restart=always
RestartSec=5
UMask=0077
NoNewPrivileges=true

[Install]
WantedBy=multi-user.target
"""


# --------------------------------------------------------------------------- the SuperLink
def superlink_bundle(
    fed_dir: str | Path,
    addresses: list[str],
    *,
    reissue: bool = False,
    days: int = 365,
    trust: Trust = (),
) -> Bundle:
    """The SuperLink host's bundle; makes the federation's credentials that are missing.

    ``addresses`` are the names and IPs (``HOST[:PORT]``) the nodes and the operator dial;
    the SuperLink's certificate names all of them (with those recorded before). A
    certificate made earlier that lacks one is replaced only with ``reissue`` (signed by the
    same CA: bundles made before stay valid; the SuperLink needs the new bundle)."""
    fed = Federation.open(fed_dir, create=True)
    link = fed.superlink
    parsed = [parse_address(a) for a in addresses]
    ports = {p for _, p in parsed if p is not None} or ({link["port"]} if "port" in link else set())
    if len(ports) > 1:
        raise DeploymentError(
            f"the SuperLink has one port; the addresses name {', '.join(map(str, sorted(ports)))}"
        )
    port = ports.pop() if ports else DEFAULT_PORT
    known = list(link.get("addresses", []))
    hosts = list(dict.fromkeys([*known, *(h for h, _ in parsed)]))
    if not hosts:
        raise DeploymentError(
            "give the names or IPs the nodes and the operator dial: --address HOST[:PORT]"
        )
    cert, key = fed.certs / "superlink.pem", fed.certs / "superlink.key"
    # "superlink": the ServerApp executor's name for it on its compose network; localhost
    # and 127.0.0.1: the healthcheck and run-superlink.sh's executor.
    names = [*hosts, "superlink", "localhost", "127.0.0.1"]
    if cert.exists():
        lacking = [h for h in hosts if not _names_host(certificate_names(cert), h)]
        if lacking and not reissue:
            raise DeploymentError(
                f"the SuperLink's certificate {cert} does not name {', '.join(lacking)}: add "
                "--reissue to replace it with one that names every address (the same CA)"
            )
        if lacking:
            cert.unlink()
            key.unlink()
    made = make_certificates(fed.certs, {"superlink": names}, days=days, trust=trust)
    token, token_hash = make_operator_token(fed.certs, trust=trust)
    secret = make_secret(secret_path(fed.certs, "superlink"), trust=trust)
    _, public = make_signing_key(fed.certs / SIGNING_KEY, trust=trust)
    link.update(addresses=hosts, port=port, made=_now())
    fed.save()

    creds = {
        "credentials/ca.crt": (_read(made.ca_cert), 0o600),
        "credentials/superlink.pem": (_read(cert), 0o600),
        "credentials/superlink.key": (_read(key), 0o600),
        f"credentials/{OPERATOR_TOKEN_HASH}": (_read(token_hash), 0o600),
        "credentials/superexec.secret": (_read(secret), 0o600),
        "credentials/app-signing.key.pub": (_read(public), 0o600),
    }
    compose = {
        "services": {
            "superlink": {
                "image": f"{IMAGE}-superlink:{TAG}",
                "user": f"{USER}:{GROUP}",
                "command": [
                    "--operator-token-hash",
                    f"/certs/{OPERATOR_TOKEN_HASH}",
                    "--ssl-ca-certfile",
                    "/certs/ca.crt",
                    "--ssl-certfile",
                    "/certs/superlink.pem",
                    "--ssl-keyfile",
                    "/certs/superlink.key",
                    "--enable-supernode-auth",
                    "--superexec-auth-secret-file",
                    "/certs/superexec.secret",
                    "--isolation",
                    "process",
                    "--host",
                    "0.0.0.0",
                    "--port",
                    str(CONTAINER_PORT),
                    "--database",
                    "/state/superlink.db",
                    "--disable-runtime-dependency-installation",
                ],  # fmt: skip
                # The one port the nodes and the operator need (Fleet; Control for the
                # operator's token only); PFLARENA_BIND: one interface's address.
                "ports": [
                    f"${{PFLARENA_BIND:-0.0.0.0}}:${{PFLARENA_PORT:-{port}}}:{CONTAINER_PORT}"
                ],
                "environment": {"HOME": "/tmp"},
                "volumes": [
                    "./state:/state",
                    *(f"./{rel}:/certs/{Path(rel).name}:ro" for rel in creds),
                ],
                "healthcheck": healthcheck(CONTAINER_PORT, True, "/certs/ca.crt"),
                "restart": "unless-stopped",
            },
            "serverapp": {
                "image": f"{IMAGE}-app:{TAG}",
                "user": f"{USER}:{GROUP}",
                "entrypoint": ["pflarena", "executor", "--stock"],
                "command": [
                    "--root-certificates",
                    "/certs/ca.crt",
                    "--runtime-api-address",
                    f"superlink:{CONTAINER_PORT}",
                    "--superexec-auth-secret-file",
                    "/certs/superexec.secret",
                    "--app-signing-public-key",
                    "/certs/app-signing.key.pub",
                ],  # fmt: skip
                "environment": {"HOME": "/tmp"},
                "volumes": [
                    "./runs:/runs",
                    *(
                        f"./{rel}:/certs/{Path(rel).name}:ro"
                        for rel in creds
                        if Path(rel).name in ("ca.crt", "superexec.secret", "app-signing.key.pub")
                    ),
                ],
                "depends_on": {"superlink": {"condition": "service_healthy"}},
                "restart": "unless-stopped",
            },
        }
    }
    superlink_cmd = (
        f'pflarena superlink --operator-token-hash "$here/credentials/{OPERATOR_TOKEN_HASH}" \\\n'
        '    --ssl-ca-certfile "$here/credentials/ca.crt" \\\n'
        '    --ssl-certfile "$here/credentials/superlink.pem" \\\n'
        '    --ssl-keyfile "$here/credentials/superlink.key" --enable-supernode-auth \\\n'
        '    --superexec-auth-secret-file "$here/credentials/superexec.secret" \\\n'
        f"    --isolation process --host 0.0.0.0 --port {port} \\\n"
        '    --database "$here/state/superlink.db" --disable-runtime-dependency-installation'
    )
    executor_cmd = (
        'pflarena executor --stock --root-certificates "$here/credentials/ca.crt" \\\n'
        f"    --runtime-api-address 127.0.0.1:{port} \\\n"
        '    --superexec-auth-secret-file "$here/credentials/superexec.secret" \\\n'
        '    --app-signing-public-key "$here/credentials/app-signing.key.pub"'
    )
    dialled = ", ".join(_dial(h, port) for h in hosts)
    files = {
        **creds,
        "docker-compose.yml": _yaml(
            compose,
            f"The SuperLink host of federation {fed.root.name}: `./start.sh` (docker compose "
            f"as the bundle's owner).\nNodes and the operator dial {dialled}; open TCP {port} "
            "to them, nothing else.\nMade by `pflarena bundle superlink`; do not edit.",
        ),
        "start.sh": _script(
            START_SH.format(checks="", dirs="state runs", project="pflarena-superlink")
        ),
        "run-superlink.sh": _script(
            PAIR_SH.format(
                what="The SuperLink",
                first_what="`pflarena superlink`",
                second_what="its ServerApp executor (Flower's, approved apps only)",
                checks="",
                dirs="state runs",
                first=superlink_cmd,
                second=executor_cmd,
            )
        ),
        "pflarena-superlink.service": _text(
            UNIT.format(
                description="pflarena SuperLink and its ServerApp executor",
                path="/opt/pflarena/superlink",
                user="pflarena",
                unit="pflarena-superlink.service",
                script="run-superlink.sh",
            )
        ),
        "README.md": _text(
            SUPERLINK_README.format(
                federation=fed.root.name, port=port, dialled=dialled, names=", ".join(names)
            )
        ),
    }
    bundle = _write_bundle(fed, "superlink", files)
    bundle.notes.append(
        f"the SuperLink's certificate names {', '.join(names)}; the operator's token stays "
        f"in {token} (its bundle: `pflarena bundle operator`)"
    )
    return bundle


SUPERLINK_README = """# The SuperLink host of federation {federation}

Nodes and the operator dial {dialled}. The certificate names: {names}.

With Docker (the images `pflarena-superlink` and `pflarena-app`: `make images`, or
`docker load` of what the operator saved):

    tar -xf superlink.tar && cd superlink && ./start.sh

Without Docker (`pip install pflarena`): `./run-superlink.sh`, or as a service:
`pflarena-superlink.service` (edit its paths and user first).

Firewall: open TCP {port} (inbound) to the SuperNode hosts and the operator; nothing
else. Results are written under ./runs, the SuperLink's database under ./state.
"""


# --------------------------------------------------------------------------- a SuperNode host
#: A node host's scripts refuse to start without its private key (a host that keeps its own
#: puts it there; Docker would otherwise mount a directory made in its place).
NODE_KEY_CHECK = """if [ ! -f credentials/node.key ]; then
    echo "credentials/node.key is missing: put this host's private key there, 0600 (its public half is credentials/node.key.pub)" >&2
    exit 2
fi
"""


def _node_public_key(path: Path) -> bytes:
    """A node's OpenSSH public key, checked: an EC key, as Flower's SuperNodes sign with."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    how = "make one on the node's host: ssh-keygen -t ecdsa -b 384 -N '' -f node.key"
    try:
        data = path.read_bytes().strip()
        key = load_ssh_public_key(data)
    except OSError as exc:
        raise DeploymentError(f"--public-key {path}: {exc.strerror}") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise DeploymentError(
            f"--public-key {path} is not an OpenSSH public key ({exc}); {how}"
        ) from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise DeploymentError(
            f"--public-key {path} is not an EC key: Flower's SuperNodes sign with EC keys; {how}"
        )
    return data + b"\n"


def node_bundle(
    fed_dir: str | Path,
    name: str,
    *,
    shard: str | Path | None = None,
    data_path: str | None = None,
    superlink: str | None = None,
    new_key: bool = False,
    public_key: str | Path | None = None,
    days: int = 365,
    trust: Trust = (),
) -> Bundle:
    """SuperNode host ``name``'s bundle; makes its key pair, SuperExec secret and Runtime API
    certificate when missing (``new_key``: a new key pair, the old one retired beside it).
    ``public_key``: the host keeps its own private key and gave the operator this public
    half (an OpenSSH EC key); the bundle then carries no private key, and the host puts its
    own at ``credentials/node.key``. A host that gave one before keeps it (without
    ``new_key``).

    Its data: ``shard`` (a file here, copied into the bundle) or ``data_path`` (a path on the
    node's host). ``superlink`` (``HOST[:PORT]``, default the first address recorded) must
    be named by the SuperLink's certificate."""
    if not _NAME.match(name) or name in RESERVED:
        raise DeploymentError(
            f"host name {name!r}: use 1-40 lower-case letters, digits and dashes, not "
            f"{' or '.join(RESERVED)}"
        )
    if (shard is None) == (data_path is None):
        raise DeploymentError(
            "give the node's data: --shard FILE (copied into the bundle) or --data-path PATH "
            "(a file already on the node's host)"
        )
    if shard is not None and not Path(shard).is_file():
        raise DeploymentError(f"--shard {shard}: no such file")
    if data_path is not None and not data_path.startswith("/"):
        raise DeploymentError(f"--data-path {data_path}: give an absolute path on the node's host")
    given = _node_public_key(Path(public_key)) if public_key is not None else None
    fed = Federation.open(fed_dir)
    host, port = fed.dialled(superlink)
    ca = fed.certs / "ca.crt"
    node_dir = fed.node_dir(name)
    private_dir(node_dir, "credentials directory")
    node = fed.record.setdefault("nodes", {}).setdefault(name, {})
    key, public = node_dir / "node.key", node_dir / "node.key.pub"
    own_key = given is not None or (node.get("own_key", False) and not new_key)
    retired = None
    replaced = given is not None and public.exists() and public.read_bytes() != given
    if public.exists() and (new_key or replaced or (given is not None and key.exists())):
        retired = node_dir / f"node.key.retired-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}"
        public.rename(retired.with_name(retired.name + ".pub"))
        if key.exists():
            key.rename(retired)
    if given is not None:
        private = None
        if not public.exists():
            adopt_public_key(public, given)
    elif own_key:
        private = None  # the host's own key, given before
    else:
        private, public = make_node_key(key, comment=f"pflarena-{name}", trust=trust)
    secret = make_secret(node_dir / "superexec.secret", trust=trust)
    # Its own CA: the executor beside the node trusts this node's Runtime API and nothing else.
    runtime = make_certificates(
        node_dir / "runtime", {"runtime": ["supernode", "localhost", "127.0.0.1"]}, days=days,
        trust=trust,
    )  # fmt: skip
    runtime_cert, runtime_key = runtime.servers["runtime"]
    signing = fed.certs / f"{SIGNING_KEY}.pub"
    node.update(superlink=_dial(host, port), made=_now(), data=str(data_path or Path(shard).name))
    node["own_key"] = own_key
    fed.save()

    creds = {
        "credentials/ca.crt": (_read(ca), 0o600),
        **({"credentials/node.key": (_read(private), 0o600)} if private is not None else {}),
        "credentials/node.key.pub": (_read(public), 0o600),
        "credentials/superexec.secret": (_read(secret), 0o600),
        "credentials/runtime-ca.crt": (_read(runtime.ca_cert), 0o600),
        "credentials/runtime.pem": (_read(runtime_cert), 0o600),
        "credentials/runtime.key": (_read(runtime_key), 0o600),
        "credentials/app-signing.key.pub": (_read(signing), 0o600),
    }
    data_files = {}
    if shard is not None:
        data_files[f"data/{Path(shard).name}"] = (_read(Path(shard)), 0o600)
        host_data = f"./data/{Path(shard).name}"
    else:
        host_data = str(data_path)
    dialled = _dial(host, port)
    compose = {
        "services": {
            "supernode": {
                "image": f"{IMAGE}-supernode:{TAG}",
                "user": f"{USER}:{GROUP}",
                "command": [
                    "--active-poll",
                    "0.1",
                    "--superlink",
                    dialled,
                    "--root-certificates",
                    "/certs/ca.crt",
                    "--auth-supernode-private-key",
                    "/certs/node.key",
                    "--app-signing-public-key",
                    "/certs/app-signing.key.pub",
                    "--ssl-certfile",
                    "/certs/runtime.pem",
                    "--ssl-keyfile",
                    "/certs/runtime.key",
                    "--ssl-ca-certfile",
                    "/certs/runtime-ca.crt",
                    "--superexec-auth-secret-file",
                    "/certs/superexec.secret",
                    "--isolation",
                    "process",
                    "--host",
                    "0.0.0.0",
                    "--port",
                    str(RUNTIME_PORT),
                    "--node-config",
                    'data-path="/data/shard.npz" state-dir="/state"',
                ],  # fmt: skip
                "environment": {"HOME": "/tmp"},
                "volumes": [
                    # node.key even where the host brings its own (--public-key)
                    f"./{rel}:/certs/{Path(rel).name}:ro"
                    for rel in dict.fromkeys([*creds, "credentials/node.key"])
                    if rel != "credentials/node.key.pub"
                ],
                "healthcheck": healthcheck(RUNTIME_PORT, True, "/certs/runtime-ca.crt"),
                "restart": "unless-stopped",
            },
            "clientapp": {
                "image": f"{IMAGE}-app:{TAG}",
                "user": f"{USER}:{GROUP}",
                "entrypoint": ["pflarena", "executor"],
                "command": [
                    "--root-certificates",
                    "/certs/runtime-ca.crt",
                    "--runtime-api-address",
                    f"supernode:{RUNTIME_PORT}",
                    "--superexec-auth-secret-file",
                    "/certs/superexec.secret",
                ],  # fmt: skip
                "environment": {"HOME": "/tmp"},
                "volumes": [
                    f"{host_data}:/data/shard.npz:ro",
                    "./state:/state",
                    "./credentials/runtime-ca.crt:/certs/runtime-ca.crt:ro",
                    "./credentials/superexec.secret:/certs/superexec.secret:ro",
                ],
                "depends_on": {"supernode": {"condition": "service_healthy"}},
                "restart": "unless-stopped",
            },
        }
    }
    data = f'"$here/data/{Path(shard).name}"' if shard else shlex.quote(str(data_path))
    node_cmd = (
        f"data={data}\n"
        f'port="${{PFLARENA_RUNTIME_PORT:-{RUNTIME_PORT}}}"\n'
        f"pflarena supernode --active-poll 0.1 --superlink {dialled} \\\n"
        '    --root-certificates "$here/credentials/ca.crt" \\\n'
        '    --auth-supernode-private-key "$here/credentials/node.key" \\\n'
        '    --app-signing-public-key "$here/credentials/app-signing.key.pub" \\\n'
        '    --ssl-certfile "$here/credentials/runtime.pem" \\\n'
        '    --ssl-keyfile "$here/credentials/runtime.key" \\\n'
        '    --ssl-ca-certfile "$here/credentials/runtime-ca.crt" \\\n'
        '    --superexec-auth-secret-file "$here/credentials/superexec.secret" \\\n'
        '    --isolation process --host 127.0.0.1 --port "$port" \\\n'
        '    --node-config "data-path=\\"$data\\" state-dir=\\"$here/state\\""'
    )
    executor_cmd = (
        'pflarena executor --root-certificates "$here/credentials/runtime-ca.crt" \\\n'
        '    --runtime-api-address "127.0.0.1:$port" \\\n'
        '    --superexec-auth-secret-file "$here/credentials/superexec.secret"'
    )
    files = {
        **creds,
        **data_files,
        "docker-compose.yml": _yaml(
            compose,
            f"SuperNode host {name} of federation {fed.root.name}: `./start.sh` (docker "
            f"compose as the bundle's owner).\nIt dials the SuperLink at {dialled} and "
            "publishes no port.\nMade by `pflarena bundle supernode`; do not edit.",
        ),
        "start.sh": _script(
            START_SH.format(checks=NODE_KEY_CHECK, dirs="state", project=f"pflarena-{name}")
        ),
        "run-node.sh": _script(
            PAIR_SH.format(
                what=f"SuperNode host {name}",
                first_what="`pflarena supernode` (its Runtime API on 127.0.0.1, over TLS)",
                second_what="its warm ClientApp executor",
                checks=NODE_KEY_CHECK,
                dirs="state",
                first=node_cmd,
                second=executor_cmd,
            )
        ),
        f"pflarena-{name}.service": _text(
            UNIT.format(
                description=f"pflarena SuperNode {name}",
                path=f"/opt/pflarena/{name}",
                user="pflarena",
                unit=f"pflarena-{name}.service",
                script="run-node.sh",
            )
        ),
        "README.md": _text(
            NODE_README.format(
                name=name,
                federation=fed.root.name,
                dialled=dialled,
                port=port,
                data=host_data if shard else f"{data_path} (this host's file)",
            )  # fmt: skip
        ),
    }
    bundle = _write_bundle(fed, name, files)
    bundle.notes.append(f"register its key: flwr supernode register {public} <connection>")
    if retired is not None:
        bundle.notes.append(
            f"its old key is retired to {retired}: once the node runs from this bundle, "
            "unregister the old node (`flwr supernode list <connection>` shows its id; "
            "`flwr supernode unregister NODE_ID <connection>`)"
        )
    return bundle


NODE_README = """# SuperNode host {name} of federation {federation}

It dials the SuperLink at {dialled} (outbound TCP {port}); it publishes no port and needs
nothing else from the network. Its data: {data}; its client state: ./state (keep it: a node
that restarts on it continues its client's personal model).

With Docker (the images `pflarena-supernode` and `pflarena-app`: `make images`, or
`docker load` of what the operator saved):

    tar -xf {name}.tar && cd {name} && ./start.sh

Without Docker (a Raspberry Pi, a Jetson; `pip install pflarena`): `./run-node.sh`, or as a
service: `pflarena-{name}.service` (edit its paths and user first).

The operator registers this node's key (credentials/node.key.pub) before it can join:
`flwr supernode register node.key.pub <connection>`. A host that keeps its own key (the
bundle made with `--public-key`) puts its private key at credentials/node.key (0600) first.
"""


# --------------------------------------------------------------------------- the operator
def operator_bundle(
    fed_dir: str | Path, *, superlink: str | None = None, connection: str = "federation"
) -> Bundle:
    """The operator's laptop: the connection (address, CA, operator token) and the app
    signing key."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", connection):
        raise DeploymentError(f"connection name {connection!r}: letters, digits, - and _ only")
    fed = Federation.open(fed_dir)
    host, port = fed.dialled(superlink)
    token = fed.certs / OPERATOR_TOKEN
    signing = fed.certs / SIGNING_KEY
    for needed in (token, signing):
        if not needed.exists():
            raise DeploymentError(f"{needed} is missing: `pflarena bundle superlink` makes it")
    dialled = _dial(host, port)
    files = {
        "credentials/ca.crt": (_read(fed.certs / "ca.crt"), 0o600),
        f"credentials/{OPERATOR_TOKEN}": (_read(token), 0o600),
        f"credentials/{SIGNING_KEY}": (_read(signing), 0o600),
        f"credentials/{SIGNING_KEY}.pub": (_read(signing.with_name(SIGNING_KEY + ".pub")), 0o600),
        "connect.sh": _script(
            "#!/bin/sh\n# The flwr CLI's connection to the SuperLink, with the operator's "
            'token (FLWR_HOME, default ~/.flwr).\nset -eu\nhere=$(cd "$(dirname "$0")" && '
            f'pwd)\nexec pflarena connect "${{1:-{connection}}}" --address {dialled} '
            '--root-certificates "$here/credentials/ca.crt" --operator-token '
            f'"$here/credentials/{OPERATOR_TOKEN}" --default\n'
        ),
        "README.md": _text(
            OPERATOR_README.format(federation=fed.root.name, dialled=dialled, conn=connection)
        ),
    }
    return _write_bundle(fed, "operator", files)


OPERATOR_README = """# The operator of federation {federation}

    ./connect.sh                                  # connection "{conn}" to {dialled}
    flwr supernode register NODE.key.pub {conn}   # each node's public key, before it joins
    flwr supernode list {conn}
    pflarena approve APP_DIR --signing-key credentials/app-signing.key
    flwr run APP_DIR {conn} --stream

The operator's token and the app signing key are this machine's alone: keep them 0600.
"""
