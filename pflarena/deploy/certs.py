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
missing. But only what pflarena made there is kept: each credential directory records the
SHA-256 of every file made in it (:data:`RECORD`), and an existing credential that is not
recorded (planted, or copied in), has changed since, belongs to another user, is writable by
others, or (a secret) readable by others is refused with a line saying why and how to fix it,
unless the operator names it (``trust``: ``pflarena certs --trust PATH``, ``pflarena
local-deploy --trust PATH``; a directory names everything below it). Directories are made
0700 and every file 0600 (:mod:`pflarena.deploy.private`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from pflarena.deploy.errors import DeploymentError
from pflarena.deploy.private import check_owned, private_dir

__all__ = [
    "CertificateSet",
    "OPERATOR_TOKEN",
    "OPERATOR_TOKEN_HASH",
    "RECORD",
    "SIGNING_KEY",
    "adopt_public_key",
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
#: In each credential directory: the SHA-256 of every credential pflarena made there.
RECORD = ".pflarena-credentials.json"
#: What ``trust`` holds: credentials (or directories of them) the operator named.
Trust = Collection[str | Path]


# --------------------------------------------------------------------------- what was made here
def _credential_dir(path: Path) -> Path:
    """The directory of credential ``path``, made 0700 (or checked: the user's alone)."""
    return private_dir(path.parent, "credentials directory")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_record(directory: Path) -> dict[str, str]:
    record = directory / RECORD
    if not record.exists():
        return {}
    check_owned(record, "credentials record", private=True)
    try:
        data = json.loads(record.read_text())
    except ValueError:
        data = None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise DeploymentError(f"{record} is not a credentials record: remove it and the "
                              "credentials beside it to have new ones made")  # fmt: skip
    return data


def _record(*paths: Path) -> None:
    """Record that pflarena made (or the operator named) ``paths``: their SHA-256 in their
    directory's :data:`RECORD`, written whole (0600)."""
    for directory in {p.parent for p in paths}:
        record = _read_record(directory)
        record.update({p.name: _digest(p) for p in paths if p.parent == directory})
        partial = directory / f"{RECORD}.{os.getpid()}"
        partial.unlink(missing_ok=True)
        _write_private(partial, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        partial.replace(directory / RECORD)


def _named(path: Path, trust: Trust) -> bool:
    resolved = path.resolve()
    for item in trust:
        named = Path(item).resolve()
        if resolved == named or named in resolved.parents:
            return True
    return False


def _kept(path: Path, *, secret: bool, trust: Trust = ()) -> bool:
    """Whether credential ``path`` exists and may be used as it is: this user's, writable by
    no one else, readable by no one else if ``secret``, and made here by pflarena (recorded,
    unchanged) or named by the operator in ``trust`` (recorded now).

    Raises
    ------
    DeploymentError
        It exists and may not be used: the line says why and how to fix it.
    """
    if not path.exists() and not path.is_symlink():
        return False
    what = "secret" if secret else "credential"
    check_owned(path, what, private=secret)
    if _named(path, trust):
        _record(path)
        return True
    recorded = _read_record(path.parent).get(path.name)
    if recorded is None:
        raise DeploymentError(
            f"{what} {path} was not made here by pflarena (no record of it in "
            f"{path.parent / RECORD}): remove it to have a new one made, or name it with "
            f"--trust {path} if it is yours"
        )
    if recorded != _digest(path):
        raise DeploymentError(
            f"{what} {path} changed since pflarena made it: remove it to have a new one "
            f"made, or name it with --trust {path} if the change is yours"
        )
    return True


def _key_pair(path: str | Path, trust: Trust = ()) -> tuple[Path, Path, bool]:
    """``path`` and ``path.pub``, and whether both exist (and may be kept); one without the
    other is an error."""
    private = Path(path)
    public = private.with_name(private.name + ".pub")
    if private.exists() != public.exists():
        raise DeploymentError(f"{private} and {public}: one exists without the other")
    kept = _kept(private, secret=True, trust=trust)
    return private, public, _kept(public, secret=False, trust=trust) and kept


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file readable by its owner only (0600 from the start), in a
    directory that is the user's alone."""
    _credential_dir(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _made(*paths: Path) -> None:
    """Files a tool (openssl, ssh-keygen) wrote: made 0600 and recorded."""
    for path in paths:
        os.chmod(path, 0o600)
    _record(*paths)


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
    trust: Trust = (),
) -> CertificateSet:
    """A CA and one server certificate per entry of ``servers``, signed by it, with openssl.

    ``servers`` maps a file stem (``superlink``, ``supernode-1``) to the names the server is
    reached by (its subject alternative names; IPs or DNS names). Files already there are
    kept, never overwritten, if pflarena made them (or ``trust`` names them: the module
    docstring): an existing CA signs new server certificates, so adding a host later does not
    invalidate the others. Every file is written with mode 0600 in a 0700 directory.
    """
    out = private_dir(out_dir, "credentials directory")
    ca_cert, ca_key = out / "ca.crt", out / "ca.key"
    if ca_cert.exists() != ca_key.exists():
        raise DeploymentError(f"{out} holds one of ca.crt and ca.key but not both")
    ca_kept = _kept(ca_key, secret=True, trust=trust)
    if not (_kept(ca_cert, secret=False, trust=trust) and ca_kept):
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384", "-nodes",
            "-keyout", ca_key.name, "-out", ca_cert.name, "-days", str(days),
            "-subj", "/CN=pflarena deployment CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=out,
        )  # fmt: skip
        _made(ca_key, ca_cert)
    made: dict[str, tuple[Path, Path]] = {}
    for stem, names in servers.items():
        if not names:
            raise DeploymentError(f"server {stem!r} needs at least one host name or IP")
        cert, key = out / f"{stem}.pem", out / f"{stem}.key"
        key_kept = _kept(key, secret=True, trust=trust)
        if not (_kept(cert, secret=False, trust=trust) and key_kept):
            for stale in (cert, key):
                stale.unlink(missing_ok=True)  # one without the other: made again
            csr, ext = out / f"{stem}.csr", out / f"{stem}.ext"
            for scratch in (csr, ext):
                scratch.unlink(missing_ok=True)
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
            _openssl(
                "x509", "-req", "-in", csr.name, "-CA", ca_cert.name, "-CAkey", ca_key.name,
                "-CAcreateserial", "-out", cert.name, "-days", str(days), "-extfile", ext.name,
                cwd=out,
            )  # fmt: skip
            csr.unlink()
            ext.unlink()
            _made(key, cert)
        made[stem] = (cert, key)
    return CertificateSet(out, ca_cert, ca_key, made)


def make_node_key(path: str | Path, comment: str = "", *, trust: Trust = ()) -> tuple[Path, Path]:
    """A SuperNode's EC P-384 key pair in OpenSSH format (``path``, ``path.pub``), made with
    ``ssh-keygen`` as Flower's documentation does; an existing pair that pflarena made (or
    ``trust`` names) is kept."""
    private, public, exists = _key_pair(path, trust)
    if exists:
        return private, public
    if shutil.which("ssh-keygen") is None:
        raise DeploymentError("SuperNode keys need the `ssh-keygen` command, not on PATH")
    _credential_dir(private)
    cmd = ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(private)]
    result = subprocess.run(
        [*cmd, "-C", comment or private.stem],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise DeploymentError(f"ssh-keygen failed: {result.stderr.strip()}")
    _made(private, public)
    return private, public


def adopt_public_key(path: str | Path, data: bytes) -> Path:
    """A SuperNode's public key the operator was given (a host that keeps its private key
    on its own machine): written 0600 at ``path`` and recorded, replacing one pflarena
    recorded there before (a planted or changed file is refused, as every credential is)."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        _kept(path, secret=False)
        path.unlink()
    _write_private(path, data)
    _record(path)
    return path


# --------------------------------------------------------------------------- secrets
def secret_path(certs_dir: str | Path, owner: str) -> Path:
    """The SuperExec secret of ``owner`` (``superlink``, ``supernode-3``) under ``certs_dir``."""
    return Path(certs_dir) / SECRETS_DIR / owner


def make_secret(path: str | Path, *, trust: Trust = ()) -> Path:
    """A SuperExec shared secret: 32 random bytes, hex-encoded, without a newline (Flower
    reads the file's exact bytes). An existing one pflarena made (or ``trust`` names) is
    kept."""
    path = Path(path)
    if not _kept(path, secret=True, trust=trust):
        _write_private(path, secrets.token_hex(32).encode())
        _record(path)
    elif not path.read_bytes():
        raise DeploymentError(f"{path} is empty: remove it to make a new secret")
    return path


def token_hash(token: bytes) -> str:
    """The SHA-256 (hex) the SuperLink compares a presented operator token with."""
    return hashlib.sha256(token.strip()).hexdigest()


def make_operator_token(certs_dir: str | Path, *, trust: Trust = ()) -> tuple[Path, Path]:
    """``operator.token`` (the operator's, 0600) and ``operator.token.sha256`` (the
    SuperLink's); an existing token pflarena made (or ``trust`` names) is kept and its hash
    written again if it is missing or does not match."""
    out = Path(certs_dir)
    token, digest = out / OPERATOR_TOKEN, out / OPERATOR_TOKEN_HASH
    if not _kept(token, secret=True, trust=trust):
        _write_private(token, secrets.token_urlsafe(32).encode())
        _record(token)
    value = token.read_bytes().strip()
    if len(value) < 16:
        raise DeploymentError(f"{token} holds {len(value)} bytes: a token needs at least 16")
    if digest.exists() or digest.is_symlink():
        check_owned(digest, "operator token hash")
    if not digest.exists() or digest.read_text().strip() != token_hash(value):
        digest.unlink(missing_ok=True)
        _write_private(digest, (token_hash(value) + "\n").encode())
        _record(digest)
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


def make_signing_key(path: str | Path, *, trust: Trust = ()) -> tuple[Path, Path]:
    """An Ed25519 key pair for approving apps: ``path`` (PKCS#8 PEM) and ``path.pub``
    (SubjectPublicKeyInfo PEM, for the nodes), both 0600; an existing pair that pflarena made
    (or ``trust`` names) is kept."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, public, exists = _key_pair(path, trust)
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
    public.unlink(missing_ok=True)
    _write_private(
        public,
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    _record(private, public)
    return private, public
