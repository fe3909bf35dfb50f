"""Apps a SuperNode runs only if the operator signed them: ``pflarena approve``.

Whoever submits a run to a SuperLink ships code that every SuperNode executes. The SuperLink
of a secure deployment lets only its operator submit (:mod:`pflarena.deploy.superlink`);
this module is the second lock, on the nodes themselves, so that a leaked operator token or a
compromised SuperLink still cannot run code on a client device.

The operator signs each version of the app with an Ed25519 key (:func:`approve`, ``pflarena
approve APP_DIR --signing-key KEY``), which writes :data:`APPROVAL_FILE` into the app
directory; ``flwr run`` then carries it inside the FAB like any other file. A SuperNode
started with the public key (``pflarena supernode --app-signing-public-key KEY.pub``) checks
every run's FAB before it stores the run or creates a task for it (:func:`verify_fab`): an
app whose files differ from what was signed, that carries no approval, or whose approval was
made with another key gets Flower's ``INVALID_FAB`` error reply and is never installed or
imported; the node goes on serving approved runs.

Why not Flower's own check: ``flower-supernode --trusted-entities`` verifies signatures that
the Flower Hub attaches to a FAB, and refuses every FAB without the Hub's ``valid_license``
mark; flwr 1.41's SuperLink sets that mark only for apps fetched from the Hub
(``_format_verification`` in ``flwr/superlink/servicer/control/control_handlers.py``), never
for an app built from a directory by ``flwr run``, so a self-hosted federation cannot use it.

What is signed: the SHA-256 digest of the FAB's files (:func:`fab_digest`): every member of the
zip except the approval itself and Flower's ``.info/CONTENT`` manifest (which only restates the
members' hashes), as ``name NUL sha256(content)`` lines sorted by name. A FAB is what Flower's
``build_fab_from_disk`` makes of the directory, byte for byte the same for the same files
(fixed timestamps, sorted members), so the digest names exactly the code a node would install.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import time
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pflarena.deploy.errors import DeploymentError

__all__ = [
    "APPROVAL_FILE",
    "Approval",
    "approve",
    "fab_digest",
    "key_id",
    "load_public_keys",
    "verify_fab",
]

#: The approval inside an app directory and its FAB.
APPROVAL_FILE = "pflarena-approval.json"
#: Flower's manifest of a FAB's members (restates their hashes; not signed).
_MANIFEST = ".info/CONTENT"
#: Bound on what a node unpacks to check a FAB: Flower refuses FABs over 10 MiB compressed.
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
#: What a signature covers: this context and the digest, so that a signature made for
#: something else with the same key cannot pass as an app's approval.
_CONTEXT = b"pflarena app approval v1\n"


@dataclass(frozen=True)
class Approval:
    """An app's approval: the digest signed, by which key (:func:`key_id`), and when."""

    digest: str
    key: str
    signature: str
    signed_at: str

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: bytes | str) -> Approval:
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) != {"digest", "key", "signature", "signed_at"}:
            raise ValueError("not a pflarena approval (digest, key, signature, signed_at)")
        if not all(isinstance(v, str) for v in data.values()):
            raise ValueError("an approval's fields are strings")
        return cls(**data)


def fab_digest(members: Mapping[str, bytes]) -> str:
    """The digest an approval signs: every member but the approval and Flower's manifest,
    ``name NUL sha256(content)`` per line, sorted by name (SHA-256, hex)."""
    lines = b"".join(
        name.encode() + b"\0" + hashlib.sha256(content).hexdigest().encode() + b"\n"
        for name, content in sorted(members.items())
        if name not in (APPROVAL_FILE, _MANIFEST)
    )
    return hashlib.sha256(lines).hexdigest()


def key_id(public_key: object) -> str:
    """A public key's short name: the first 16 hex digits of SHA-256 over its raw bytes."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return hashlib.sha256(raw).hexdigest()[:16]


def _unpack(fab: bytes) -> dict[str, bytes]:
    """A FAB's members by name; refuses what is not a zip or would unpack too large."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(fab))
        infos = archive.infolist()
        if sum(info.file_size for info in infos) > MAX_UNPACKED_BYTES:
            raise ValueError(f"unpacks to more than {MAX_UNPACKED_BYTES} bytes")
        names = [info.filename for info in infos]
        if len(set(names)) != len(names):
            raise ValueError("a member name appears twice")
        return {info.filename: archive.read(info) for info in infos if not info.is_dir()}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, RuntimeError) as exc:
        raise ValueError(f"the FAB cannot be read: {exc}") from None


def _load_private_key(path: Path):  # noqa: ANN202 - cryptography's Ed25519PrivateKey
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise DeploymentError(f"cannot read the app signing key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise DeploymentError(f"{path} is not an Ed25519 private key (pflarena certs makes one)")
    return key


def load_public_keys(paths: Iterable[str | Path]) -> dict[str, object]:
    """The Ed25519 public keys in ``paths`` (PEM), by :func:`key_id`.

    Raises
    ------
    DeploymentError
        A file cannot be read or holds another kind of key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    keys: dict[str, object] = {}
    for path in paths:
        try:
            key = serialization.load_pem_public_key(Path(path).read_bytes())
        except (OSError, ValueError, TypeError) as exc:
            raise DeploymentError(f"cannot read the app signing public key {path}: {exc}") from None
        if not isinstance(key, Ed25519PublicKey):
            raise DeploymentError(f"{path} is not an Ed25519 public key (app-signing.key.pub)")
        keys[key_id(key)] = key
    if not keys:
        raise DeploymentError("no app signing public key given")
    return keys


def build_fab(app_dir: Path) -> bytes:
    """The FAB ``flwr run`` would upload for ``app_dir`` (Flower's own build)."""
    from flwr.cli.build import build_fab_from_disk

    try:
        return build_fab_from_disk(app_dir)
    except (ValueError, OSError) as exc:
        raise DeploymentError(f"{app_dir} is not a Flower App directory: {exc}") from None


def approve(app_dir: str | Path, signing_key: str | Path) -> Approval:
    """Sign the app in ``app_dir`` with the operator's Ed25519 key and write
    :data:`APPROVAL_FILE` there (replacing an earlier approval).

    Raises
    ------
    DeploymentError
        ``app_dir`` is not an app, the key cannot be read, or the approval would not travel
        in the FAB (an app's ``.gitignore`` or ``fab-exclude`` leaves it out).
    """
    app = Path(app_dir).resolve()
    key = _load_private_key(Path(signing_key))
    digest = fab_digest(_unpack(build_fab(app)))
    approval = Approval(
        digest=digest,
        key=key_id(key.public_key()),
        signature=base64.b64encode(key.sign(_CONTEXT + digest.encode())).decode(),
        signed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    target = app / APPROVAL_FILE
    partial = target.with_suffix(".partial")
    partial.write_text(approval.to_json())
    partial.replace(target)
    # What the nodes will receive: the FAB built again, now with the approval in it.
    ok, reason = verify_fab(build_fab(app), {approval.key: key.public_key()})
    if not ok:
        raise DeploymentError(f"the approval written to {target} does not verify: {reason}")
    return approval


def verify_fab(fab: bytes, public_keys: Mapping[str, object]) -> tuple[bool, str]:
    """Whether ``fab`` carries an approval, made with one of ``public_keys`` (by
    :func:`key_id`), of exactly its files; the reason in words either way."""
    from cryptography.exceptions import InvalidSignature

    try:
        members = _unpack(fab)
    except ValueError as exc:
        return False, str(exc)
    if APPROVAL_FILE not in members:
        return False, f"the app carries no operator approval ({APPROVAL_FILE})"
    try:
        approval = Approval.from_json(members[APPROVAL_FILE])
        signature = base64.b64decode(approval.signature, validate=True)
    except (ValueError, UnicodeDecodeError) as exc:
        return False, f"its {APPROVAL_FILE} cannot be read: {exc}"
    key = public_keys.get(approval.key)
    if key is None:
        return False, f"approved with key {approval.key}, which is not among the trusted keys"
    digest = fab_digest(members)
    if digest != approval.digest:
        return False, f"its files differ from what was approved (digest {digest[:16]})"
    try:
        key.verify(signature, _CONTEXT + digest.encode())  # type: ignore[attr-defined]
    except InvalidSignature:
        return False, f"its approval's signature does not verify with key {approval.key}"
    return True, f"approved with key {approval.key} at {approval.signed_at}"
