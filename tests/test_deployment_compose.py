"""The docker compose files, checked structurally (no Docker engine is needed).

The committed top-level files must be exactly what ``pflarena compose`` generates for them;
each file is parsed as YAML and, where ``docker compose`` (v2) or Debian's
``docker-compose`` is installed, also by ``config`` (otherwise that test is skipped and says
why). Fast: no process is started but openssl for the certificate test.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pflarena.server import compose
from pflarena.server.cli import main
from pflarena.server.compose import SUPERLINK_PORT, compose_files, load

ROOT = Path(__file__).resolve().parents[1]


def _files(n: int = 4, gpus: list[str] | None = None) -> dict[str, Any]:
    return {name: load(text) for name, text in compose_files(n, gpus).items()}


def _option(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge for what these files use: an override's ``command`` replaces the
    base's, its ``volumes`` add to them, ``!reset`` removes a key."""
    merged = {name: dict(service) for name, service in base["services"].items()}
    for name, service in override["services"].items():
        target = merged.setdefault(name, {})
        for key, value in service.items():
            if isinstance(value, compose.Reset):
                target.pop(key, None)
            elif key == "volumes":
                target[key] = [*target.get(key, []), *value]
            else:
                target[key] = value
    return {"services": merged}


def _node_config(command: list[str]) -> dict[str, str]:
    return dict(re.findall(r'([\w-]+)="([^"]*)"', _option(command, "--node-config")))


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """container path -> (host source, mode)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        found[target] = (source, mode[0] if mode else "rw")
    return found


@pytest.mark.parametrize("variant", ["plain", "tls"])
def test_every_supernode_has_its_gpu_shard_and_executor(variant: str) -> None:
    """Per SuperNode: a distinct GPU, its own shard mounted read-only where its
    ``data-path`` says, its own state volume, and executors that reach the right service
    and port. Catches a generator that shares a GPU, a shard or a state volume, or points
    an executor at the wrong node or port."""
    n, gpus = 4, ["3", "1", "0", "2"]
    files = _files(n, gpus)
    spec = files["docker-compose.yml"]
    if variant == "tls":
        spec = _merge(spec, files["docker-compose.tls.yml"])
    services = spec["services"]
    superlink = services["superlink"]["command"]
    assert _option(superlink, "--port") == str(SUPERLINK_PORT)
    assert _option(superlink, "--isolation") == "process"
    assert _option(services["serverapp"]["command"], "--runtime-api-address") == (
        f"superlink:{SUPERLINK_PORT}"
    )
    seen_gpus, seen_shards, seen_state = [], set(), set()
    for i in range(n):
        node = services[f"supernode-{i}"]["command"]
        executor = services[f"clientapp-{i}"]
        assert _option(node, "--superlink") == f"superlink:{SUPERLINK_PORT}"
        assert _option(node, "--isolation") == "process"
        assert _option(executor["command"], "--runtime-api-address") == (
            f"supernode-{i}:{_option(node, '--port')}"
        )
        config = _node_config(node)
        mounts = _mounts(executor)
        source, mode = mounts[config["data-path"]]
        assert (source, mode) == (f"./shards/client_{i:04d}.npz", "ro"), mounts
        seen_shards.add(source)
        seen_state.add(mounts[config["state-dir"]][0])
        (device,) = executor["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"]
        seen_gpus.extend(device["device_ids"])
    assert seen_gpus == gpus
    assert len(seen_shards) == len(seen_state) == n


def test_insecure_only_in_the_plain_variant() -> None:
    """``--insecure`` on every Flower process of the plain file and nowhere once the TLS
    override applies, where the SuperLink requires registered SuperNodes and each SuperNode
    signs with its own key; the edge node never runs insecure."""
    files = _files(3)
    plain = files["docker-compose.yml"]["services"]
    assert all("--insecure" in s["command"] for s in plain.values()), plain
    secure = _merge(files["docker-compose.yml"], files["docker-compose.tls.yml"])["services"]
    assert set(secure) == set(plain)
    for name, service in secure.items():
        assert "--insecure" not in service["command"], name
        assert "--root-certificates" in service["command"] or name == "superlink", name
    assert "--enable-supernode-auth" in secure["superlink"]["command"]
    keys = {
        _option(secure[f"supernode-{i}"]["command"], "--auth-supernode-private-key")
        for i in range(3)
    }
    assert len(keys) == 3
    edge = files["docker-compose.edge.yml"]["services"]["supernode"]["command"]
    assert "--insecure" not in edge and "--root-certificates" in edge


def test_cpu_override_drops_the_gpus() -> None:
    files = _files(2)
    cpu = _merge(files["docker-compose.yml"], files["docker-compose.cpu.yml"])["services"]
    for i in range(2):
        assert "deploy" not in cpu[f"clientapp-{i}"]
        assert cpu[f"clientapp-{i}"]["image"].endswith(":cpu")
        assert "whl/cpu" in cpu[f"clientapp-{i}"]["build"]["args"]["TORCH_INDEX_URL"]


def test_committed_files_are_the_generated_ones() -> None:
    """The top-level compose files are ``pflarena compose --num-supernodes 2 --gpus 0,1``'s
    output: catches an edit of the generator without regenerating them (or the reverse)."""
    expected = compose_files(
        2, ["0", "1"], command_line="pflarena compose --num-supernodes 2 --gpus 0,1"
    )
    for name, text in expected.items():
        assert (ROOT / name).read_text() == text, (
            f"{name}: run `pflarena compose --num-supernodes 2 --gpus 0,1 --force`"
        )


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--num-supernodes", "3", "--gpus", "0,1"], "2 GPU(s) for 3"),
        (["--num-supernodes", "2", "--gpus", "0,0"], "distinct"),
        (["--num-supernodes", "0"], "at least 1"),
    ],
)
def test_bad_compose_arguments_are_refused(
    tmp_path: Path, capsys, args: list[str], problem: str
) -> None:
    assert main(["compose", *args, "--out-dir", str(tmp_path)]) != 0
    assert problem in capsys.readouterr().err
    assert not list(tmp_path.iterdir()), "nothing may be written"


def test_compose_never_replaces_a_differing_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "docker-compose.yml").write_text("# mine\n")
    assert main(["compose", "--num-supernodes", "2", "--out-dir", str(tmp_path)]) != 0
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "docker-compose.yml").read_text() == "# mine\n"
    assert not (tmp_path / "docker-compose.tls.yml").exists()
    assert main(["compose", "--num-supernodes", "2", "--out-dir", str(tmp_path), "--force"]) == 0
    assert "superlink" in load((tmp_path / "docker-compose.yml").read_text())["services"]


def _compose_command() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return cmd
    return None


@pytest.mark.parametrize(
    "files",
    [
        ["docker-compose.yml"],
        ["docker-compose.yml", "docker-compose.tls.yml"],
        ["docker-compose.yml", "docker-compose.cpu.yml"],
        ["docker-compose.edge.yml"],
    ],
)
def test_docker_compose_config_accepts_the_files(files: list[str]) -> None:
    cmd = _compose_command()
    if cmd is None:
        pytest.skip(
            "neither `docker compose` (v2 plugin) nor `docker-compose` is installed here; "
            "the files are checked as YAML by the other tests"
        )
    env = {
        "SUPERLINK_ADDRESS": "superlink.example:9091",
        "SHARD_FILE": "./s.npz",
        "NODE_KEY": "./k",
    }
    args = [a for name in files for a in ("-f", str(ROOT / name))]
    result = subprocess.run(
        [*cmd, *args, "config", "--quiet"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr


def test_images_install_the_wheel_with_runtime_installation_off() -> None:
    """The Dockerfile builds the wheel and installs it (no clone, no editable install) on
    Flower's images of the installed flwr release, CPU torch for the edge image, and turns
    runtime dependency installation off."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    version = compose.flower_version()
    assert f"ARG FLWR_VERSION={version}" in text
    for image in (
        "flwr/superexec:${FLWR_VERSION} AS app",
        "flwr/supernode:${FLWR_VERSION} AS edge",
    ):
        assert f"FROM {image}" in text
    assert (
        text.count("pip install --no-cache-dir -c /tmp/constraints.txt /tmp/dist/pflarena-*.whl")
        == 2
    )
    assert "-e ." not in text and "git clone" not in text
    assert text.count("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1") == 2
    edge = text[text.index("AS edge") :]
    assert "download.pytorch.org/whl/cpu" in edge
    constraints = (ROOT / "docker" / "constraints.txt").read_text()
    assert f"flwr=={version}" in constraints.splitlines()


def test_certs_make_a_ca_and_certificates_that_verify(tmp_path: Path) -> None:
    """``pflarena certs``: the SuperLink's and each SuperNode's certificate verify against
    the CA with openssl and name their hosts; keys are private; a second call keeps them."""
    if shutil.which("openssl") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("openssl or ssh-keygen is not installed")
    out = tmp_path / "certs"
    args = [
        "certs",
        "--out",
        str(out),
        "--superlink-host",
        "superlink",
        "--supernodes",
        "2",
        "--node-keys",
        "2",
    ]
    assert main(args) == 0
    for stem, host in [
        ("superlink", "superlink"),
        ("supernode-0", "supernode-0"),
        ("supernode-1", "supernode-1"),
    ]:
        verify = subprocess.run(
            ["openssl", "verify", "-CAfile", str(out / "ca.crt"), str(out / f"{stem}.pem")],
            capture_output=True, text=True,
        )  # fmt: skip
        assert verify.returncode == 0, verify.stderr
        text = subprocess.run(
            ["openssl", "x509", "-in", str(out / f"{stem}.pem"), "-noout", "-ext", "subjectAltName"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert f"DNS:{host}" in text and "IP Address:127.0.0.1" in text, text
        assert (out / f"{stem}.key").stat().st_mode & 0o077 == 0
    public = (out / "keys" / "supernode-0.pub").read_text()
    assert public.startswith("ecdsa-sha2-nistp384 ")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert main(args) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
