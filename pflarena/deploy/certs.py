"""What a secure deployment's processes prove themselves with, made here (``pflarena certs``).

A TLS deployment has four kinds of credential, each held only where it is needed
(``docs/threat-model.md`` says who holds which):

* **TLS**: a CA and server certificates signed by it (:func:`make_certificates`, with
  ``openssl``). The SuperLink serves its HTTP port with its certificate; SuperNodes, the
  executors and the ``flwr`` CLI verify it with the CA's certificate. The CA's key signs
  certificates only: keep it off the servers.
* **SuperNode keys**: an EC P-384 key pair per SuperNode (:func:`make_node_key`, with
  ``ssh-keygen``, as Flower's documentation does). The operator registers the public key
  (``flwr supernode register``); the SuperNode signs its Fleet API requests with the
  private one.
* **The operator's token** (:func:`make_operator_token`): 32 random bytes the operator's
  ``flwr`` CLI presents to the Control API (``pflarena connect`` stores it in the CLI's
  credential store). The SuperLink holds only its SHA-256 (``operator.token.sha256``), so
  its files do not let anyone act as the operator.
* **SuperExec secrets** (:func:`make_secret`): Flower's shared secret between a SuperLink or
  SuperNode and the executor that takes its tasks (``--superexec-auth-secret-file``): one for
  the SuperLink and its ServerApp executor, one per SuperNode and its ClientApp executor.
* **The app signing key** (:func:`make_signing_key`): an Ed25519 key pair. The operator
  signs each version of the app with the private key (``pflarena approve``,
  :mod:`pflarena.deploy.approval`); every SuperNode holds the public key and runs only apps
  signed with it. Keep the private key with the operator, never on a server or node.

Files already there are kept, never overwritten: running ``pflarena certs`` again adds what is
missing. Private files are written with mode 0600.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pflarena.deploy.errors import DeploymentError

__all__ = [
    "CertificateSet",
    "OPERATOR_TOKEN",
    "OPERATOR_TOKEN_HASH",
    "SIGNING_KEY",
    "make_certificates",
    "make_node_key",
    "make_operator_token",
    "make_secret",
    "make_signing_key",
    "read_token_hash",
    "secret_path",
    "token_hash",
]

#: The operator's token and the SHA-256 the SuperLink holds, under a certificates directory.
OPERATOR_TOKEN = "operator.token"
OPERATOR_TOKEN_HASH = "operator.token.sha256"
#: The app signing key pair under a certificates directory (``.pub``: the nodes' copy).
SIGNING_KEY = "app-signing.key"
#: Where the SuperExec secrets go under a certificates directory: ``secrets/<owner>``.
SECRETS_DIR = "secrets"


def _key_pair(path: str | Path) -> tuple[Path, Path, bool]:
    """``path`` and ``path.pub``, and whether both exist; one without the other is an error."""
    private = Path(path)
    public = private.with_name(private.name + ".pub")
    if private.exists() != public.exists():
        raise DeploymentError(f"{private} and {public}: one exists without the other")
    return private, public, private.exists()


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file readable by its owner only (0600 from the start)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


# --------------------------------------------------------------------------- TLS
@dataclass(frozen=True)
class CertificateSet:
    """Files made by :func:`make_certificates` (all PEM)."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    #: host name -> (certificate, private key); ``superlink`` is the SuperLink's.
    servers: dict[str, tuple[Path, Path]]


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise DeploymentError("TLS needs the `openssl` command, which is not on PATH")
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise DeploymentError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def _san(names: Sequence[str]) -> str:
    entries = []
    for name in dict.fromkeys(names):
        is_ip = name.replace(".", "").isdigit() or ":" in name
        entries.append(f"{'IP' if is_ip else 'DNS'}:{name}")
    return ",".join(entries)


def make_certificates(
    out_dir: str | Path,
    servers: dict[str, Sequence[str]],
    *,
    days: int = 365,
) -> CertificateSet:
    """A CA and one server certificate per entry of ``servers``, signed by it, with openssl.

    ``servers`` maps a file stem (``superlink``, ``supernode-1``) to the names the server is
    reached by (its subject alternative names; IPs or DNS names). Files already there are
    kept, never overwritten: an existing CA signs new server certificates, so adding a
    host later does not invalidate the others. Private keys are written with mode 0600.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = out / "ca.crt", out / "ca.key"
    if ca_cert.exists() != ca_key.exists():
        raise DeploymentError(f"{out} holds one of ca.crt and ca.key but not both")
    if not ca_cert.exists():
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384", "-nodes",
            "-keyout", ca_key.name, "-out", ca_cert.name, "-days", str(days),
            "-subj", "/CN=pflarena deployment CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=out,
        )  # fmt: skip
        ca_key.chmod(0o600)
    made: dict[str, tuple[Path, Path]] = {}
    for stem, names in servers.items():
        if not names:
            raise DeploymentError(f"server {stem!r} needs at least one host name or IP")
        cert, key = out / f"{stem}.pem", out / f"{stem}.key"
        if not (cert.exists() and key.exists()):
            csr, ext = out / f"{stem}.csr", out / f"{stem}.ext"
            ext.write_text(
                f"subjectAltName={_san(names)}\nbasicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyAgreement\n"
                "extendedKeyUsage=serverAuth\n"
            )
            _openssl(
                "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384", "-nodes",
                "-keyout", key.name, "-out", csr.name, "-subj", f"/CN={names[0]}",
                cwd=out,
            )  # fmt: skip
            key.chmod(0o600)
            _openssl(
                "x509", "-req", "-in", csr.name, "-CA", ca_cert.name, "-CAkey", ca_key.name,
                "-CAcreateserial", "-out", cert.name, "-days", str(days), "-extfile", ext.name,
                cwd=out,
            )  # fmt: skip
            csr.unlink()
            ext.unlink()
        made[stem] = (cert, key)
    return CertificateSet(out, ca_cert, ca_key, made)


def make_node_key(path: str | Path, comment: str = "") -> tuple[Path, Path]:
    """A SuperNode's EC P-384 key pair in OpenSSH format (``path``, ``path.pub``), made with
    ``ssh-keygen`` as Flower's documentation does; an existing pair is kept."""
    private, public, exists = _key_pair(path)
    if exists:
        return private, public
    if shutil.which("ssh-keygen") is None:
        raise DeploymentError("SuperNode keys need the `ssh-keygen` command, not on PATH")
    private.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(private)]
    result = subprocess.run(
        [*cmd, "-C", comment or private.stem],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise DeploymentError(f"ssh-keygen failed: {result.stderr.strip()}")
    return private, public


# --------------------------------------------------------------------------- secrets
def secret_path(certs_dir: str | Path, owner: str) -> Path:
    """The SuperExec secret of ``owner`` (``superlink``, ``supernode-3``) under ``certs_dir``."""
    return Path(certs_dir) / SECRETS_DIR / owner


def make_secret(path: str | Path) -> Path:
    """A SuperExec shared secret: 32 random bytes, hex-encoded, without a newline (Flower
    reads the file's exact bytes). An existing one is kept."""
    path = Path(path)
    if not path.exists():
        _write_private(path, secrets.token_hex(32).encode())
    elif not path.read_bytes():
        raise DeploymentError(f"{path} is empty: remove it to make a new secret")
    return path


def token_hash(token: bytes) -> str:
    """The SHA-256 (hex) the SuperLink compares a presented operator token with."""
    return hashlib.sha256(token.strip()).hexdigest()


def make_operator_token(certs_dir: str | Path) -> tuple[Path, Path]:
    """``operator.token`` (the operator's, 0600) and ``operator.token.sha256`` (the
    SuperLink's); an existing token is kept and its hash written again if missing."""
    out = Path(certs_dir)
    token, digest = out / OPERATOR_TOKEN, out / OPERATOR_TOKEN_HASH
    if not token.exists():
        _write_private(token, secrets.token_urlsafe(32).encode())
    value = token.read_bytes().strip()
    if len(value) < 16:
        raise DeploymentError(f"{token} holds {len(value)} bytes: a token needs at least 16")
    if not digest.exists() or digest.read_text().strip() != token_hash(value):
        digest.write_text(token_hash(value) + "\n")
    return token, digest


def read_token_hash(path: str | Path) -> str:
    """The operator token's SHA-256 from ``path`` (64 hex digits), checked."""
    try:
        text = Path(path).read_text().strip().lower()
    except OSError as exc:
        raise DeploymentError(f"cannot read the operator token hash {path}: {exc}") from None
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise DeploymentError(
            f"{path} is not an operator token hash (64 hex digits, as `pflarena certs "
            "--operator-token` writes to operator.token.sha256)"
        )
    return text


def make_signing_key(path: str | Path) -> tuple[Path, Path]:
    """An Ed25519 key pair for approving apps: ``path`` (PKCS#8 PEM, 0600) and
    ``path.pub`` (SubjectPublicKeyInfo PEM, for the nodes); an existing pair is kept."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, public, exists = _key_pair(path)
    if exists:
        return private, public
    key = Ed25519PrivateKey.generate()
    _write_private(
        private,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public
