"""A deployment's directories and credentials are the operator's alone
(:mod:`pflarena.deploy.private`, :mod:`pflarena.deploy.certs`).

The checks that need another user (a directory or credential that user planted) run in
``tests/test_shared_host.py`` as a real second uid; here, what one user can show: modes,
records, refusals of what pflarena did not make, and of directories others could change.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from pflarena.deploy.certs import (
    RECORD,
    make_certificates,
    make_node_key,
    make_operator_token,
    make_secret,
    make_signing_key,
    secret_path,
)
from pflarena.deploy.errors import DeploymentError
from pflarena.deploy.private import check_ancestors, private_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _make_all(certs: Path, **trust) -> list[Path]:
    made = make_certificates(certs, {"superlink": ["localhost", "127.0.0.1"]}, **trust)
    token, digest = make_operator_token(certs, **trust)
    secret = make_secret(secret_path(certs, "superlink"), **trust)
    signing = make_signing_key(certs / "app-signing.key", **trust)
    node = make_node_key(certs / "keys" / "supernode-0", **trust)
    return [made.ca_cert, made.ca_key, *made.servers["superlink"], token, digest, secret,
            *signing, *node]  # fmt: skip


def test_every_credential_is_0600_in_0700_directories(tmp_path: Path) -> None:
    certs = tmp_path / "deploy" / "certs"
    files = _make_all(certs)
    assert {f: _mode(f) for f in files} == {f: 0o600 for f in files}
    for directory in {f.parent for f in files} | {tmp_path / "deploy"}:
        assert _mode(directory) == 0o700, directory
        assert _mode(directory / RECORD) == 0o600 if directory != tmp_path / "deploy" else True


def test_made_credentials_are_kept_when_made_again(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    files = _make_all(certs)
    before = {f: f.read_bytes() for f in files}
    _make_all(certs)  # what exists is kept, nothing is made anew
    assert {f: f.read_bytes() for f in files} == before


@pytest.mark.parametrize(
    "name",
    ["operator.token", "secrets/superlink", "app-signing.key", "ca.crt", "keys/supernode-0"],
)
def test_a_credential_pflarena_did_not_make_is_refused_unless_named(tmp_path, name) -> None:
    """A credential copied or planted into the directory (here: replaced by one with no
    record) is refused with a line naming it and how to fix it; named with ``trust`` it is
    kept and recorded."""
    certs = tmp_path / "certs"
    _make_all(certs)
    planted = certs / name
    content = planted.read_bytes()
    record = planted.parent / RECORD
    entries = json.loads(record.read_text())
    del entries[planted.name]  # as if pflarena had never made it
    record.write_text(json.dumps(entries))
    with pytest.raises(DeploymentError, match=f"{planted}.*not made here by pflarena.*--trust"):
        _make_all(certs)
    assert planted.read_bytes() == content  # nothing already there is lost
    _make_all(certs, trust=[planted.parent])  # a directory names everything below it
    assert planted.read_bytes() == content
    _make_all(certs)  # recorded now


def test_a_changed_credential_is_refused(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    _make_all(certs)
    (certs / "operator.token").write_bytes(b"a-token-someone-else-chose-1234567")
    with pytest.raises(DeploymentError, match="operator.token changed since pflarena made it"):
        make_operator_token(certs)


def test_a_secret_others_can_read_is_refused(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    _make_all(certs)
    (certs / "secrets" / "superlink").chmod(0o644)
    with pytest.raises(DeploymentError, match="readable by others.*no longer be secret"):
        make_secret(secret_path(certs, "superlink"))
    (certs / "ca.crt").chmod(0o666)
    with pytest.raises(DeploymentError, match="ca.crt is writable by others"):
        make_certificates(certs, {})


def test_a_symbolic_link_in_place_of_a_credential_is_refused(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    _make_all(certs)
    elsewhere = tmp_path / "elsewhere-token"
    elsewhere.write_bytes(b"x" * 40)
    (certs / "operator.token").unlink()
    (certs / "operator.token").symlink_to(elsewhere)
    with pytest.raises(DeploymentError, match="symbolic link"):
        make_operator_token(certs)


def test_private_dir_makes_tightens_and_refuses(tmp_path: Path) -> None:
    said = []
    made = private_dir(tmp_path / "a" / "b", say=said.append)
    assert _mode(made) == _mode(made.parent) == 0o700 and not said
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    assert private_dir(loose, say=said.append) == loose.resolve()
    assert _mode(loose) == 0o700 and "made it 0700" in said[0]
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(DeploymentError, match="writable by others"):
        private_dir(shared)
    with pytest.raises(DeploymentError, match=f"{shared}, above .* writable by others.*sticky"):
        private_dir(shared / "deploy")
    shared.chmod(0o1777)  # like /tmp: others cannot rename what is ours
    assert _mode(private_dir(shared / "deploy")) == 0o700
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o775)
    with pytest.raises(DeploymentError, match="writable by its group.*chmod go-w"):
        check_ancestors(group / "deploy")
    (tmp_path / "file").write_text("")
    with pytest.raises(DeploymentError, match="not a directory"):
        private_dir(tmp_path / "file")


def test_private_dir_refuses_a_link_to_elsewhere_only_if_another_user_owns_it(
    tmp_path: Path,
) -> None:
    target = private_dir(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert private_dir(link) == target  # our own link: its target is checked instead
    if os.geteuid() != 0:
        pytest.skip("a link owned by another user needs root to make (tests/test_shared_host.py)")
    os.lchown(link, 65534, 65534)
    with pytest.raises(DeploymentError, match="symbolic link owned by .*65534"):
        private_dir(link)


def test_commands_run_in_process_leave_the_umask_as_it_was(tmp_path: Path) -> None:
    """``pflarena certs``, ``compose`` and ``local-deploy`` called in-process (as tests and
    notebooks do) make their files private without changing the caller's umask: files the
    caller writes afterwards (shards a container reads as another uid) keep their modes."""
    from pflarena.cli import main

    before = os.umask(0o022)
    try:
        assert main(["certs", "--out", str(tmp_path / "certs"), "--secure"]) == 0
        assert main(["compose", "--num-supernodes", "1", "--out-dir", str(tmp_path / "c")]) == 0
        refused = main(["local-deploy", "--num-supernodes", "1", "--auth", "--dir", str(tmp_path)])
        assert refused == 2  # --auth without --tls
        assert os.umask(0o022) == 0o022
        assert _mode(tmp_path / "certs" / "ca.key") == 0o600  # private all the same
    finally:
        os.umask(before)
