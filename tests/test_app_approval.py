"""Apps the operator signed, and only those: ``pflarena approve`` and the checks of a SuperNode
(``pflarena supernode --app-signing-public-key``) and of a ServerApp executor
(``pflarena-serverapp``).

The digest is checked against a hand computation over a small zip, the signature with the
``cryptography`` package directly, and the SuperNode check through Flower's own message loop
(``_pull_and_store_message`` with an in-memory node state): an unapproved app gets Flower's
``INVALID_FAB`` reply and never reaches the node's state, an approved one does."""

from __future__ import annotations

import base64
import hashlib
import inspect
import io
import json
import zipfile
from pathlib import Path

import pytest

from pflarena.deploy.approval import (
    APPROVAL_FILE,
    approve,
    build_fab,
    fab_digest,
    key_id,
    load_public_keys,
    verify_fab,
)
from pflarena.deploy.certs import make_signing_key
from pflarena.deploy.errors import DeploymentError
from pflarena.runtime.appdir import flwr_run_dir


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The app laid out for ``flwr run`` and approved: (app dir, private key, public key)."""
    root = tmp_path_factory.mktemp("approval")
    private, public = make_signing_key(root / "keys" / "app-signing.key")
    app = flwr_run_dir(root / "app")
    approve(app, private)
    return app, private, public


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def _rezip(fab: bytes, change: dict[str, bytes | None]) -> bytes:
    """``fab`` with members replaced, added (bytes) or removed (None)."""
    with zipfile.ZipFile(io.BytesIO(fab)) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    for name, content in change.items():
        if content is None:
            members.pop(name)
        else:
            members[name] = content
    return _zip(members)


def test_the_digest_is_the_sorted_member_hashes_but_the_approval_and_manifest() -> None:
    members = {
        "b.py": b"print(2)\n",
        "a/x.toml": b"k = 1\n",
        APPROVAL_FILE: b"{}",
        ".info/CONTENT": b"z",
    }
    by_hand = hashlib.sha256(
        b"a/x.toml\0" + hashlib.sha256(b"k = 1\n").hexdigest().encode() + b"\n"
        + b"b.py\0" + hashlib.sha256(b"print(2)\n").hexdigest().encode() + b"\n"
    ).hexdigest()  # fmt: skip
    assert fab_digest(members) == by_hand
    assert fab_digest({**members, APPROVAL_FILE: b"other"}) == by_hand
    assert fab_digest({**members, "c.py": b""}) != by_hand


def test_an_approved_app_verifies_and_its_signature_is_ed25519_over_the_digest(signed) -> None:
    app, _, public = signed
    fab = build_fab(app)
    assert build_fab(app) == fab, "Flower's FAB build is not deterministic: digests would drift"
    keys = load_public_keys([public])
    ok, reason = verify_fab(fab, keys)
    assert ok, reason
    approval = json.loads((app / APPROVAL_FILE).read_text())
    (key,) = keys.values()
    assert approval["key"] == key_id(key)
    with zipfile.ZipFile(io.BytesIO(fab)) as archive:
        assert json.loads(archive.read(APPROVAL_FILE)) == approval  # it travels in the FAB
    # Checked with cryptography directly, not through verify_fab.
    key.verify(
        base64.b64decode(approval["signature"]),
        b"pflarena app approval v1\n" + approval["digest"].encode(),
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"pflarena/client/app.py": b"import os; os.system('id')\n"},
            "differ from what was approved",
        ),
        ({"pflarena/evil.py": b"import os\n"}, "differ from what was approved"),
        ({"pflarena/core/keys.py": None}, "differ from what was approved"),
        ({APPROVAL_FILE: None}, "carries no operator approval"),
        ({APPROVAL_FILE: b"not json"}, "cannot be read"),
    ],
    ids=["changed", "added", "removed", "no-approval", "garbled-approval"],
)
def test_any_change_to_an_approved_app_is_refused(signed, change, expected) -> None:
    app, _, public = signed
    ok, reason = verify_fab(_rezip(build_fab(app), change), load_public_keys([public]))
    assert not ok and expected in reason, reason


def test_an_approval_whose_digest_was_edited_to_match_fails_its_signature(signed) -> None:
    app, _, public = signed
    fab = _rezip(build_fab(app), {"pflarena/evil.py": b"import os\n"})
    with zipfile.ZipFile(io.BytesIO(fab)) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    approval = json.loads(members[APPROVAL_FILE])
    approval["digest"] = fab_digest(members)
    forged = _rezip(fab, {APPROVAL_FILE: json.dumps(approval).encode()})
    ok, reason = verify_fab(forged, load_public_keys([public]))
    assert not ok and "signature does not verify" in reason, reason


def test_another_key_and_other_input_are_refused(signed, tmp_path: Path) -> None:
    app, _, _ = signed
    _, other = make_signing_key(tmp_path / "other.key")
    ok, reason = verify_fab(build_fab(app), load_public_keys([other]))
    assert not ok and "not among the trusted keys" in reason, reason
    ok, reason = verify_fab(b"not a zip", load_public_keys([other]))
    assert not ok and "cannot be read" in reason, reason
    (tmp_path / "rsa.pem").write_text(
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"
    )
    with pytest.raises(DeploymentError, match="cannot read the app signing public key"):
        load_public_keys([tmp_path / "rsa.pem"])
    with pytest.raises(DeploymentError, match="not a Flower App directory"):
        approve(tmp_path, tmp_path / "other.key")


def test_a_fab_that_would_unpack_too_large_is_refused(signed, monkeypatch) -> None:
    import pflarena.deploy.approval as approval

    app, _, public = signed
    monkeypatch.setattr(approval, "MAX_UNPACKED_BYTES", 1000)
    ok, reason = verify_fab(build_fab(app), load_public_keys([public]))
    assert not ok and "unpacks to more than 1000 bytes" in reason, reason


# --------------------------------------------------------------------------- the SuperNode
def _pull_once(fab: bytes, public: Path, monkeypatch) -> tuple[object, list]:
    """Flower's ``_pull_and_store_message`` with ``pflarena supernode``'s check installed,
    handed one train message of run 7 whose FAB is ``fab``: (node state, replies)."""
    from flwr.app import ConfigRecord, RecordDict
    from flwr.supercore.fab import Fab
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supernode import start_client_internal as loop
    from flwr.supernode.nodestate import NodeStateFactory

    from pflarena.deploy.supernode import require_approved_apps

    monkeypatch.setattr(loop, "_pull_and_store_message", loop._pull_and_store_message)
    monkeypatch.setattr(loop, "_verify_fab", loop._verify_fab)
    require_approved_apps([str(public)])
    objects = ObjectStoreFactory()
    state = NodeStateFactory(objects).state()
    store = objects.store()
    state.set_node_id(11)
    import time

    from flwr.app.message import make_message
    from flwr.app.metadata import Metadata

    metadata = Metadata(7, "", 0, 11, "", "1", time.time(), 600.0, "train")
    message = make_message(metadata, RecordDict({"config": ConfigRecord({"x": 1})}))
    message.metadata.__dict__["_message_id"] = message.object_id
    run = Run.create_empty(7)
    run.fab_hash = hashlib.sha256(fab).hexdigest()
    fetched = []

    def get_fab(fab_hash: str, run_id: int) -> Fab:
        fetched.append((fab_hash, run_id))
        return Fab(fab_hash, fab, {})

    delivered = [(message, None)]

    def receive():
        if not delivered:
            return None
        msg, _ = delivered.pop()
        from flwr.supernode.start_client_internal import get_object_tree

        return msg, get_object_tree(msg)

    def pull_object(run_id: int, object_id: str) -> bytes:
        raise ConnectionError("this test serves no objects")

    loop._pull_and_store_message(
        state=state,
        object_store=store,
        node_config={},
        receive=receive,
        get_run=lambda run_id: run,
        get_fab=get_fab,
        pull_object=pull_object,
        confirm_message_received=lambda run_id, message_id: None,
        trusted_entities=None,
    )
    assert fetched == [(run.fab_hash, 7)]
    return state, list(state.get_messages_legacy(is_reply=True))


def test_a_supernode_replies_invalid_fab_to_an_unapproved_app(signed, monkeypatch) -> None:
    from flwr.common.constant import ErrorCode

    app, _, public = signed
    fab = _rezip(build_fab(app), {"pflarena/evil.py": b"import os\n"})
    state, replies = _pull_once(fab, public, monkeypatch)
    assert state.get_run(7) is None, "the node stored a run whose app is not approved"
    (reply,) = replies
    assert reply.has_error() and reply.error.code == ErrorCode.INVALID_FAB, reply


def test_a_supernode_takes_an_approved_app(signed, monkeypatch) -> None:
    app, _, public = signed
    state, replies = _pull_once(build_fab(app), public, monkeypatch)
    # The FAB passed: Flower stored the run and went on to fetch the message's objects
    # (which this test does not serve, so the message itself is dropped, not answered).
    assert state.get_run(7) is not None
    assert replies == []


def test_approvals_and_the_waits_install_together(signed, monkeypatch) -> None:
    """``pflarena supernode --active-poll ... --app-signing-public-key ...`` wraps Flower's
    loop twice; the approval check still finds Flower's function beneath the waits'."""
    from flwr.supernode import start_client_internal as loop

    from pflarena.deploy.supernode import patch_waits, require_approved_apps

    _, _, public = signed
    for name in ("time", "pull_objects", "_pull_and_store_message", "_verify_fab"):
        monkeypatch.setattr(loop, name, getattr(loop, name))
    original = loop._pull_and_store_message
    patch_waits(3.0, 0.1)
    require_approved_apps([str(public)])
    assert loop._pull_and_store_message is not original
    assert inspect.unwrap(loop._pull_and_store_message) is original


def test_a_supernode_refuses_to_combine_approvals_with_trusted_entities(signed) -> None:
    from pflarena.deploy.supernode import main

    _, _, public = signed
    with pytest.raises(SystemExit, match="replaces Flower's --trusted-entities"):
        main(["--app-signing-public-key", str(public), "--trusted-entities", "x.yaml"])


# --------------------------------------------------------------------------- the ServerApp
def test_pflarena_serverapp_refuses_an_unapproved_app_before_installing_it(
    signed, tmp_path: Path, monkeypatch
) -> None:
    """The ServerApp process's ``install_from_fab`` verifies first; Flower's own install runs
    only for the approved FAB."""
    import importlib

    from pflarena.deploy import serverapp

    # The package re-exports a function of the module's name: take the module itself.
    runtime = importlib.import_module("flwr.superlink.runtime.run_serverapp")

    app, _, public = signed
    installed = []
    monkeypatch.setattr(runtime, "install_from_fab", lambda fab, **kw: installed.append(fab))
    monkeypatch.setenv(serverapp.KEYS_ENV, str(public))
    calls = []

    def fake_flwr_serverapp() -> None:  # stands in for Flower's entry point: install a FAB
        for fab in (build_fab(app), _rezip(build_fab(app), {"pflarena/x.py": b""})):
            try:
                runtime.install_from_fab(fab, skip_prompt=True)
                calls.append("installed")
            except serverapp.AppNotApproved as exc:
                calls.append(str(exc))

    import flwr.superlink.cli as superlink_cli

    monkeypatch.setattr(superlink_cli, "flwr_serverapp", fake_flwr_serverapp)
    serverapp.main([])
    assert calls[0] == "installed" and installed == [build_fab(app)]
    assert "not approved: its files differ" in calls[1], calls


def test_pflarena_executor_starts_approved_serverapps_only(signed, monkeypatch) -> None:
    from flwr.supercore.constant import TASK_TYPE_TO_COMMAND, TaskType

    from pflarena.deploy.serverapp import COMMAND, KEYS_ENV, require_approved_serverapps

    _, _, public = signed
    monkeypatch.setitem(TASK_TYPE_TO_COMMAND, TaskType.SERVER_APP, "flwr-serverapp")
    monkeypatch.delenv(KEYS_ENV, raising=False)
    require_approved_serverapps([str(public)])
    assert TASK_TYPE_TO_COMMAND[TaskType.SERVER_APP] == COMMAND
    import os

    assert os.environ[KEYS_ENV] == str(public.resolve())
    monkeypatch.delenv(KEYS_ENV)
