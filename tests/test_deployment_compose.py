"""The docker compose files, checked structurally (no Docker engine is needed).

The committed top-level files must be exactly what ``pflarena compose`` generates for them;
each file is parsed as YAML and, where ``docker compose`` (v2) or Debian's
``docker-compose`` is installed, also by ``config`` (otherwise that test is skipped and says
why). Fast: no process is started but openssl for the certificate test.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pflarena.cli import main
from pflarena.deploy import compose
from pflarena.deploy.compose import SUPERLINK_PORT, compose_files, load

ROOT = Path(__file__).resolve().parents[1]


def _files(n: int = 4, gpus: list[str] | None = None, edge: int = 0) -> dict[str, Any]:
    return {name: load(text) for name, text in compose_files(n, gpus, edge_nodes=edge).items()}


def _option(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge for what the GPU override uses: its keys add to the base's services
    (``volumes`` append, anything else replaces)."""
    merged = {name: dict(service) for name, service in base["services"].items()}
    for name, service in override["services"].items():
        assert name in merged, f"the override names {name}, which the base lacks"
        for key, value in service.items():
            if key == "volumes":
                merged[name][key] = [*merged[name].get(key, []), *value]
            else:
                merged[name][key] = value
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


VARIANTS = {"plain": "docker-compose.yml", "tls": "docker-compose.tls.yml"}


@pytest.mark.parametrize("variant", ["plain", "tls"])
def test_every_supernode_has_its_gpu_shard_and_executor(variant: str) -> None:
    """Per SuperNode: a distinct GPU (the GPU override on either variant), its own shard
    mounted read-only where its ``data-path`` says (in its executor only), its own state
    volume, and executors that reach the right service and port. Catches a generator that
    shares a GPU, a shard or a state volume, mounts other shards, or points an executor at
    the wrong node or port."""
    n, gpus = 4, ["3", "1", "0", "2"]
    files = _files(n, gpus)
    spec = _merge(files[VARIANTS[variant]], files["docker-compose.gpu.yml"])
    services = spec["services"]
    superlink = services["superlink"]["command"]
    assert _option(superlink, "--port") == str(SUPERLINK_PORT)
    assert _option(superlink, "--isolation") == "process"
    assert _option(services["serverapp"]["command"], "--runtime-api-address") == (
        f"superlink:{SUPERLINK_PORT}"
    )
    seen_gpus, seen_shards, seen_state = [], set(), set()
    for i in range(n):
        node = services[f"supernode-{i}"]
        executor = services[f"clientapp-{i}"]
        assert _option(node["command"], "--superlink") == f"superlink:{SUPERLINK_PORT}"
        assert _option(node["command"], "--isolation") == "process"
        assert _option(executor["command"], "--runtime-api-address") == (
            f"supernode-{i}:{_option(node['command'], '--port')}"
        )
        config = _node_config(node["command"])
        mounts = _mounts(executor)
        source, mode = mounts[config["data-path"]]
        assert (source, mode) == (f"./shards/client_{i:04d}.npz", "ro"), mounts
        # No other shard in the executor, none at all in the SuperNode.
        shard_mounts = [s for s, _ in mounts.values() if "shards" in s]
        assert shard_mounts == [source], mounts
        assert not [s for s, _ in _mounts(node).values() if "shards" in s], node
        seen_shards.add(source)
        seen_state.add(mounts[config["state-dir"]][0])
        (device,) = executor["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"]
        seen_gpus.extend(device["device_ids"])
    assert seen_gpus == gpus
    assert len(seen_shards) == len(seen_state) == n


def test_the_base_files_reserve_no_gpu() -> None:
    """Without the GPU override nothing asks for a GPU, so the files start on any host."""
    for name in VARIANTS.values():
        for service, spec in _files(2)[name]["services"].items():
            assert "deploy" not in spec, (name, service)


def test_insecure_only_in_the_plain_variant() -> None:
    """``--insecure`` on every Flower process of the plain file and nowhere in the TLS one,
    where the SuperLink requires registered SuperNodes and each SuperNode (edge nodes too)
    signs with its own key; the remote edge node never runs insecure."""
    files = _files(3, edge=1)
    plain = files["docker-compose.yml"]["services"]
    assert all("--insecure" in s["command"] for s in plain.values()), plain
    secure = files["docker-compose.tls.yml"]["services"]
    assert set(secure) == set(plain)
    for name, service in secure.items():
        assert "--insecure" not in service["command"], name
        assert "--root-certificates" in service["command"] or name == "superlink", name
    assert "--enable-supernode-auth" in secure["superlink"]["command"]
    keys = {
        _option(secure[node]["command"], "--auth-supernode-private-key")
        for node in ("supernode-0", "supernode-1", "supernode-2", "edge-0")
    }
    assert len(keys) == 4
    edge = files["docker-compose.edge.yml"]["services"]["supernode"]["command"]
    assert "--insecure" not in edge and "--root-certificates" in edge


def _mounted_secrets(service: dict[str, Any]) -> set[str]:
    """The SuperExec secrets (``secrets/<owner>``) a service mounts."""
    return {
        v.split(":")[0].rsplit("/", 1)[-1] for v in service.get("volumes", []) if "/secrets/" in v
    }


def test_the_tls_variant_locks_every_api_and_runs_signed_apps_only() -> None:
    """The TLS file's SuperLink answers the Control API only with the operator's token (its
    hash mounted, never the token), authenticates executors with a secret (process isolation)
    and admits registered nodes only; each SuperExec secret is mounted into its owner and its
    executor only; every SuperNode, edge node and the ServerApp executor run approved apps
    only, and no service holds the CA's key, the operator's token or the signing key."""
    files = _files(3, edge=1)
    secure = files["docker-compose.tls.yml"]["services"]
    superlink = secure["superlink"]["command"]
    assert _option(superlink, "--operator-token-hash") == "/certs/operator.token.sha256"
    assert _option(superlink, "--isolation") == "process"
    assert _option(superlink, "--superexec-auth-secret-file") == "/secrets/superlink"
    assert "--enable-supernode-auth" in superlink
    owners = {name: _mounted_secrets(service) for name, service in secure.items()}
    assert owners["superlink"] == owners["serverapp"] == {"superlink"}
    for i in range(3):
        node = f"supernode-{i}"
        assert owners[node] == owners[f"clientapp-{i}"] == {node}, owners
        assert (
            _option(secure[node]["command"], "--superexec-auth-secret-file") == f"/secrets/{node}"
        )
        assert _option(secure[f"clientapp-{i}"]["command"], "--superexec-auth-secret-file") == (
            f"/secrets/{node}"
        )
    assert owners["edge-0"] == set()
    for name in ("supernode-0", "supernode-1", "supernode-2", "edge-0", "serverapp"):
        command = secure[name]["command"]
        assert _option(command, "--app-signing-public-key") == "/certs/app-signing.key.pub", name
    edge = files["docker-compose.edge.yml"]["services"]["supernode"]["command"]
    assert _option(edge, "--app-signing-public-key") == "/certs/app-signing.key.pub"
    mounted = [v for service in secure.values() for v in service.get("volumes", [])]
    for private in ("ca.key", "operator.token:", "app-signing.key:"):
        assert not [v for v in mounted if private in v], private


def test_the_plain_variant_says_what_it_does_not_protect() -> None:
    text = compose_files(2)["docker-compose.yml"]
    header = "".join(line for line in text.splitlines() if line.startswith("#"))
    assert "protects nothing" in header and "docker-compose.tls.yml" in header


def _published(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host address, container port) of each published port; no address: every interface."""
    found = []
    for entry in service.get("ports", []):
        parts = re.sub(r"\$\{[^}]*\}", "VAR", str(entry)).split(":")
        address = parts[0] if len(parts) == 3 else "0.0.0.0"
        found.append((address, parts[-1]))
    return found


def test_plain_http_is_published_on_loopback_only() -> None:
    """The plain SuperLink's port (Fleet, Control and Runtime API, no TLS) is published on
    127.0.0.1 alone; the TLS variant publishes it on every interface; nothing else is
    published in either."""
    for variant, address in (("plain", "127.0.0.1"), ("tls", "0.0.0.0")):
        services = _files(2, edge=1)[VARIANTS[variant]]["services"]
        assert _published(services["superlink"]) == [(address, str(SUPERLINK_PORT))], variant
        others = {name: _published(s) for name, s in services.items() if name != "superlink"}
        assert not any(others.values()), (variant, others)


@pytest.mark.parametrize("variant", ["plain", "tls"])
def test_services_wait_for_what_they_connect_to(variant: str) -> None:
    """Start order: the SuperLink and every SuperNode have a healthcheck probing the port
    they serve (over TLS in the TLS variant); whatever connects to a service waits until it
    is healthy. Catches a missing or mistargeted ``depends_on`` or probe."""
    services = _files(2, edge=1)[VARIANTS[variant]]["services"]
    scheme = "https" if variant == "tls" else "http"
    for name, service in services.items():
        command = service["command"]
        if "--port" in command:  # a server: its probe asks its own port
            probe = " ".join(service["healthcheck"]["test"])
            assert f"{scheme}://127.0.0.1:{_option(command, '--port')}/health" in probe, name
        target = next(
            (
                _option(command, flag)
                for flag in ("--superlink", "--runtime-api-address")
                if flag in command
            ),
            None,
        )
        if target is None:
            assert name == "superlink"
            continue
        host = target.split(":")[0]
        assert service["depends_on"] == {host: {"condition": "service_healthy"}}, name
        assert "healthcheck" in services[host], host


def test_no_setting_that_does_nothing() -> None:
    """``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION`` is read by the SuperLink only (which
    gets the flag): no service sets it."""
    for name, spec in _files(2, edge=1).items():
        for service, body in spec["services"].items():
            assert "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION" not in str(body), (name, service)


def test_the_clientapp_executor_is_named_in_one_place() -> None:
    """Every ``clientapp-i`` of both variants runs :func:`clientapp_executor`'s program."""
    files = _files(3)
    for variant, tls in (("plain", False), ("tls", True)):
        services = files[VARIANTS[variant]]["services"]
        for i in range(3):
            expected = compose.clientapp_executor(f"supernode-{i}:9094", tls, f"supernode-{i}")
            got = {k: services[f"clientapp-{i}"][k] for k in expected}
            assert got == expected, (variant, i)


def test_edge_nodes_are_limited_and_hold_the_next_shards() -> None:
    """``--edge-nodes``: SuperNodes that run their ClientApps in their own container
    (docker/edge-node sets the isolation: pflarena's warm executor unless
    ``PFLARENA_EDGE_EXECUTOR=flower``), limited to one CPU and 1 GiB, holding the shards after
    the SuperNodes'."""
    services = _files(2, edge=2)["docker-compose.yml"]["services"]
    for j in range(2):
        edge = services[f"edge-{j}"]
        assert edge["image"] == "pflarena-edge:${PFLARENA_TAG:-latest}"
        assert "platform" not in edge
        assert "--isolation" not in edge["command"], "docker/edge-node refuses it"
        assert edge["environment"] == {
            "PFLARENA_EDGE_EXECUTOR": "${PFLARENA_EDGE_EXECUTOR:-warm}",
            "PFLARENA_TRACE": "${PFLARENA_TRACE:-0}",
        }
        assert (edge["cpus"], edge["mem_limit"]) == (compose.EDGE_CPUS, compose.EDGE_MEMORY)
        path = _node_config(edge["command"])["data-path"]
        assert _mounts(edge)[path] == (f"./shards/client_{2 + j:04d}.npz", "ro")


def test_an_arm64_edge_node_runs_the_arm64_image_and_nothing_else_changes() -> None:
    """``--edge-platform linux/arm64``: the edge nodes (and the remote edge file) name the
    image ``pflarena images --platform linux/arm64`` tags (``<tag>-arm64``) and run as that
    platform; every other service is what it is without the option, and the TLS edge node
    keeps its key and the app signing key. An unknown platform is refused."""
    host = _files(2, edge=1)
    arm = {
        name: load(text)
        for name, text in compose_files(2, edge_nodes=1, edge_platform="linux/arm64").items()
    }
    for variant in VARIANTS.values():
        for name, service in arm[variant]["services"].items():
            if name == "edge-0":
                assert service["image"] == "pflarena-edge:${PFLARENA_TAG:-latest}-arm64"
                assert service["platform"] == "linux/arm64"
                rest = {k: v for k, v in service.items() if k not in ("image", "platform")}
                same = {k: v for k, v in host[variant]["services"][name].items() if k != "image"}
                assert rest == same, (variant, name)
            else:
                assert service == host[variant]["services"][name], (variant, name)
    secure = arm["docker-compose.tls.yml"]["services"]["edge-0"]["command"]
    assert _option(secure, "--auth-supernode-private-key") == "/keys/supernode-2"
    assert _option(secure, "--app-signing-public-key") == compose.SIGNING_PUBLIC_KEY
    remote = arm["docker-compose.edge.yml"]["services"]["supernode"]
    assert remote["image"].endswith("-arm64") and remote["platform"] == "linux/arm64"
    with pytest.raises(ValueError, match="linux/arm64"):
        compose_files(2, edge_nodes=1, edge_platform="linux/riscv64")


def test_committed_files_are_the_generated_ones() -> None:
    """The top-level compose files are ``pflarena compose --num-supernodes 2 --gpus 0,1``'s
    output: catches an edit of the generator without regenerating them (or the reverse)."""
    expected = compose_files(
        2, ["0", "1"], command_line="pflarena compose --num-supernodes 2 --gpus 0,1"
    )
    assert set(expected) == set(compose.COMPOSE_FILES)
    for name, text in expected.items():
        assert (ROOT / name).read_text() == text, (
            f"{name}: run `pflarena compose --num-supernodes 2 --gpus 0,1 --force`"
        )
    assert not (ROOT / "docker-compose.cpu.yml").exists(), "a file no longer generated"


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--num-supernodes", "3", "--gpus", "0,1"], "2 GPU(s) for 3"),
        (["--num-supernodes", "2", "--gpus", "0,0"], "distinct"),
        (["--num-supernodes", "1", "--gpus", ""], "non-empty"),
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


@functools.cache
def _compose_commands() -> list[list[str]]:
    """Every Compose installed here: the v2 plugin, the Python ``docker-compose`` (probed
    once: a probe takes ~1 s)."""
    found = []
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            found.append(cmd)
    return found


@pytest.mark.parametrize(
    "files",
    [
        ["docker-compose.yml"],
        ["docker-compose.tls.yml"],
        ["docker-compose.yml", "docker-compose.gpu.yml"],
        ["docker-compose.tls.yml", "docker-compose.gpu.yml"],
        ["docker-compose.edge.yml"],
    ],
)
def test_docker_compose_config_accepts_the_files(files: list[str], lacking) -> None:
    """Every Compose installed here (v2 and the Python 1.29) accepts each file and the GPU
    override on both variants."""
    commands = _compose_commands()
    if not commands:
        lacking(
            "neither `docker compose` (v2 plugin) nor `docker-compose` is installed here; "
            "the files are checked as YAML by the other tests"
        )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "SUPERLINK_ADDRESS": "superlink.example:9091",
        "SHARD_FILE": "./s.npz",
        "NODE_KEY": "./k",
    }
    args = [a for name in files for a in ("-f", str(ROOT / name))]
    for cmd in commands:
        result = subprocess.run(
            [*cmd, *args, "config", "--quiet"], capture_output=True, text=True, env=env, cwd=ROOT
        )
        assert result.returncode == 0, (cmd, result.stderr)


def test_images_share_one_base_and_install_without_network() -> None:
    """docker/Dockerfile: every stage starts from ``BASE_IMAGE`` (by default Flower's Ubuntu
    image with Python 3.11 of the installed flwr release, never the bare, Alpine tag) or
    from another stage; pip never reaches an index during the build, only the wheelhouse's
    server on the host's loopback at the port ``pflarena images`` serves it on; the app and
    edge images stand on one ``runtime`` stage whose dependencies are one ``pip install``
    below the project's wheel (a code change leaves that layer cached), and no stage copies
    the wheels themselves."""
    from pflarena.deploy import images

    text = (ROOT / "docker" / "Dockerfile").read_text()
    version = compose.flower_version()
    assert f"ARG BASE_IMAGE=flwr/superexec:{version}-py3.11-ubuntu24.04" in text
    stages = dict(
        (m.group(2), m.group(1)) for m in re.finditer(r"^FROM (\S+) AS (\S+)$", text, re.M)
    )
    assert set(stages) >= {"superlink", "supernode", "app", "edge", "edgedeps", "runtime"}
    for stage, parent in stages.items():
        assert parent == "${BASE_IMAGE}" or parent in stages, (stage, parent)
    # The edge's dependencies are one layer that app stands on too; app adds the rest.
    assert stages["edge"] == stages["runtime"] == "edgedeps" and stages["app"] == "runtime"
    order = [m.group(1) for m in re.finditer(r"^FROM \S+ AS (\S+)$", text, re.M)]
    # The classic builder builds every stage before its target: edge never builds runtime.
    assert order.index("edge") < order.index("runtime"), order
    installs = [ln for ln in text.splitlines() if "pip install" in ln and not ln.startswith("#")]
    # The wheelhouse's dependencies twice (the edge's, then the rest), the project's wheel
    # alone per stage that needs it (node: without dependencies; edge; runtime).
    assert all("--no-index" in line for line in installs), installs
    assert sum("--find-links" in line for line in installs) == 2, installs
    node = text[text.index("AS node") : text.index("AS superlink")]
    assert "--no-deps /tmp/dist/pflarena-" in node and "WHEELHOUSE" not in node
    assert f"ARG WHEELHOUSE_URL=http://127.0.0.1:{images.WHEELHOUSE_PORT}/" in text
    edgedeps = text[text.index("AS edgedeps") : text.index("AS edge\n")]
    assert '-r "${WHEELHOUSE_URL}edge-requirements.txt"' in edgedeps
    edge = text[text.index("AS edge\n") : text.index("AS runtime")]
    assert "--no-deps /tmp/dist/pflarena-" in edge and "--find-links" not in edge
    assert 'ENTRYPOINT ["edge-node"]' in edge and "COPY docker/edge-node " in edge
    runtime = text[text.index("AS runtime") :]
    assert '-r "${WHEELHOUSE_URL}requirements.txt"' in runtime
    assert runtime.index('--find-links "$WHEELHOUSE_URL"') < runtime.index("pflarena-dist")
    assert "COPY --from" not in text and "/wheels" not in text
    assert "-e ." not in text and "git clone" not in text
    constraints = (ROOT / "docker" / "constraints.txt").read_text()
    assert f"flwr=={version}" in constraints.splitlines()


def test_wheelhouse_server_serves_pip(tmp_path: Path) -> None:
    """pip itself (``--no-index --find-links URL``, as in docker/Dockerfile) finds and fetches
    a wheel from the wheelhouse's server on loopback; the server refuses a second one on the
    same port with a message naming it."""
    import sys
    import zipfile

    from pflarena.deploy import images

    house = tmp_path / "wheelhouse"
    house.mkdir()
    with zipfile.ZipFile(house / "pflarena_probe-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("pflarena_probe/__init__.py", "")
        wheel.writestr(
            "pflarena_probe-1.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: pflarena-probe\nVersion: 1.0\n",
        )
        wheel.writestr(
            "pflarena_probe-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    (house / "requirements.txt").write_text("pflarena-probe==1.0\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with images.serve_wheelhouse(house, port=port) as url:
        assert url == f"http://127.0.0.1:{port}/"
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-index", "--no-deps",
             "--find-links", url, "-r", f"{url}requirements.txt", "--dest", tmp_path / "got"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert fetched.returncode == 0, fetched.stdout + fetched.stderr
        with (
            pytest.raises(RuntimeError, match=f"127.0.0.1:{port}"),
            images.serve_wheelhouse(house, port=port),
        ):
            pass
    assert [p.name for p in (tmp_path / "got").iterdir()] == ["pflarena_probe-1.0-py3-none-any.whl"]


def _docker_ignored(patterns: list[str], path: str) -> bool:
    """Docker's .dockerignore rule: the last pattern that matches the path or one of its
    parent directories decides; ``!`` lets a path back in."""
    ignored = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.rstrip("/")
        for prefix in prefixes:
            candidates = [body]
            if body.startswith("**/"):
                candidates.append(body[3:])
            if any(fnmatch.fnmatchcase(prefix, c) or _deep_match(prefix, c) for c in candidates):
                ignored = not negate
                break
    return ignored


def _deep_match(path: str, pattern: str) -> bool:
    if not pattern.startswith("**/"):
        return False
    tail = pattern[3:]
    parts = path.split("/")
    return any(fnmatch.fnmatchcase("/".join(parts[i:]), tail) for i in range(len(parts)))


def test_dockerignore_keeps_secrets_and_data_out_of_the_context() -> None:
    """What docker/Dockerfile copies from the context is in it; the virtual environment,
    results, data, shards, certificates (the CA key, the node keys) and the wheelhouse
    (~3.4 GB, served to the build instead) are not, also inside the folders the Dockerfile
    copies."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in (
        "docker/Dockerfile",
        "build/pflarena-dist/pflarena-0.1.0-py3-none-any.whl",
    ):
        assert not _docker_ignored(patterns, path), path
    for path in (
        ".venv/bin/python",
        "runs/main/summary.json",
        "data/cifar10/x.bin",
        "certs/ca.key",
        "certs/keys/supernode-0",
        "shards/client_0000.npz",
        "pflarena/server/app.py",
        "build/wheelhouse/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl",
        "build/pflarena-dist/shards/client_0000.npz",
        "build/pflarena-dist/certs/ca.key",
        "docker/superlink.key",
    ):
        assert _docker_ignored(patterns, path), path


def test_certs_make_a_ca_and_certificates_that_verify(tmp_path: Path, lacking) -> None:
    """``pflarena certs``: the SuperLink's and each SuperNode's certificate verify against
    the CA with openssl and name their hosts; keys are private; a second call keeps them."""
    if shutil.which("openssl") is None or shutil.which("ssh-keygen") is None:
        lacking("openssl or ssh-keygen is not installed")
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
    assert main([*args, "--secure"]) == 0
    secrets = [out / "secrets" / o for o in ("superlink", "supernode-0", "supernode-1")]
    private = [out / "operator.token", out / "app-signing.key", *secrets]
    assert all(p.stat().st_mode & 0o077 == 0 for p in private), private
    assert len({p.read_bytes() for p in secrets}) == 3 and all(
        len(p.read_bytes()) == 64 for p in secrets
    )
    assert (out / "operator.token.sha256").read_text().strip() == hashlib.sha256(
        (out / "operator.token").read_bytes().strip()
    ).hexdigest()
    assert (out / "app-signing.key.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    files = sorted(p for p in out.rglob("*") if p.is_file())
    before = {p: p.read_bytes() for p in files}
    assert main([*args, "--secure"]) == 0
    assert {p: p.read_bytes() for p in sorted(q for q in out.rglob("*") if q.is_file())} == before


def test_image_requirements_pin_torch_and_keep_every_dependency() -> None:
    """The images' requirements are pyproject.toml's dependencies, torch and torchvision at
    the pinned builds (each once), nothing dropped."""
    import tomllib

    from pflarena.deploy import images

    reqs = images.requirements()
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=\[ ]", r, maxsplit=1)[0] for r in reqs]
    assert len(names) == len(set(names)), reqs
    assert {"torch==2.14.1", "torchvision==0.29.1"} <= set(reqs)
    for dep in declared:
        name = re.split(r"[<>=\[ ]", dep, maxsplit=1)[0]
        assert name in names, dep
        if name not in ("torch", "torchvision"):
            assert dep in reqs, dep


_EDGE_IMPORTS = """
import importlib, pathlib, sys
import torch
import pflarena.client.app, pflarena.methods
import pflarena.deploy.executor, pflarena.deploy.supernode
solvers = sorted(pathlib.Path(pflarena.methods.__path__[0]).glob("*/solver.py"))
assert len(solvers) > 20, solvers
for path in solvers:
    importlib.import_module(f"pflarena.methods.{path.parent.name}.solver")
from pflarena.core.models import MODEL_NAMES, TOKEN_MODELS, build_model
for name in MODEL_NAMES:
    shape = (20,) if name in TOKEN_MODELS else (3, 32, 32)
    build_model(name, shape, 10, seed=0)
print(sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[1].split(",")))
"""


def _closure(names: Sequence[str]) -> set[str]:
    """The installed distributions ``names`` require, transitively (no extras)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [n.lower() for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        for text in reqs:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name.lower().replace("_", "-"))
    return seen


def test_the_edge_requirements_are_all_the_clientapp_imports(tmp_path: Path) -> None:
    """The edge image holds :func:`images.edge_requirements` only: pyproject.toml's
    dependencies named in ``EDGE_PACKAGES`` (flwr without the simulation extra). With every
    other dependency's modules absent from site-packages (and Ray's), the ClientApp, every method's
    local solver, the warm executor, the SuperNode wrapper and every model still import and
    build: what the edge leaves out, no ClientApp needs."""
    import sys
    import sysconfig
    from importlib.metadata import packages_distributions

    import tomllib

    from pflarena.deploy import images

    edge = images.edge_requirements()
    names = {re.split(r"[<>=\[ ]", r, maxsplit=1)[0] for r in edge}
    assert names == set(images.EDGE_PACKAGES), edge
    assert all("[" not in r for r in edge), edge  # flwr[simulation] would bring Ray
    assert {"torch==2.14.1", "torchvision==0.29.1"} <= set(edge)
    assert {"torch==2.10.0", "torchvision==0.25.0"} <= set(
        images.edge_requirements(platform="linux/arm64")
    )
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    left_out = {re.split(r"[<>=\[ ]", d, maxsplit=1)[0].lower() for d in declared} - set(
        images.EDGE_PACKAGES
    )
    assert {"cvxpy", "scipy", "scikit-learn", "matplotlib", "opacus"} <= left_out
    # What the edge's packages bring themselves (pillow with torchvision) is in the image.
    left_out = (left_out | {"ray"}) - _closure(images.EDGE_PACKAGES)
    modules = {
        module
        for module, dists in packages_distributions().items()
        if all(d.lower() in left_out for d in dists)
    }
    assert {"cvxpy", "scipy", "sklearn", "matplotlib", "ray"} <= modules
    # site-packages as the edge image has it: everything but those modules (symlinks).
    view = tmp_path / "site-packages"
    view.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.split(".")[0] not in modules:
            (view / entry.name).symlink_to(entry)
    result = subprocess.run(
        [sys.executable, "-S", "-c", _EDGE_IMPORTS, ",".join(sorted(modules))],
        capture_output=True, text=True, timeout=300,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": f"{view}{os.pathsep}{ROOT}"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout


def test_arm64_images_are_the_edge_s_and_tagged_with_their_architecture(tmp_path: Path) -> None:
    """``--platform linux/arm64``: images tagged ``<tag>-arm64`` (one image store holds one
    image per name), a base of its own, the CPU-only torch; the ServerApp's ``app`` image is
    refused before anything is made, as is an unknown platform."""
    from pflarena.deploy import images

    assert images.image_name("edge", "dev", platform="linux/arm64") == "pflarena-edge:dev-arm64"
    assert images.image_name("edge", "dev") == "pflarena-edge:dev"
    assert images.local_base_name("linux/arm64") == images.local_base_name() + "-arm64"
    assert images.get_platform("aarch64") is images.PLATFORMS["linux/arm64"]
    assert images.PLATFORMS["linux/arm64"].targets == ("superlink", "supernode", "edge")
    root = _tree(tmp_path)
    with pytest.raises(ValueError, match="not app"):
        images.build_images(platform="linux/arm64", targets=["edge", "app"], root=root)
    with pytest.raises(ValueError, match="unknown platform"):
        images.build_images(platform="linux/s390x", root=root)
    assert not (tmp_path / "build").exists(), "nothing may be made"
    digests = {images.inputs_digest(root, base=images.local_base_name(p)) for p in images.PLATFORMS}
    assert len(digests) == 2


def _tree(root: Path) -> Path:
    for rel in ("docker/Dockerfile", ".dockerignore", "docker/constraints.txt", "pyproject.toml",
                "pflarena/__init__.py"):  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    return root


def test_image_digest_follows_every_input(tmp_path: Path) -> None:
    """The digest that tags the test suite's images changes with the source, the Dockerfile,
    the pins and the base image, and with nothing else (a stray file outside them)."""
    from pflarena.deploy.images import inputs_digest

    root = _tree(tmp_path)
    before = inputs_digest(root, base="b")
    assert inputs_digest(root, base="b") == before
    (root / "notes.txt").write_text("not an input")
    assert inputs_digest(root, base="b") == before
    assert inputs_digest(root, base="other") != before
    for rel in ("pflarena/__init__.py", "docker/Dockerfile", "docker/constraints.txt"):
        text = (root / rel).read_text()
        (root / rel).write_text(text + "#")
        assert inputs_digest(root, base="b") != before, rel
        (root / rel).write_text(text)
    (root / "pflarena" / "new.py").write_text("")
    assert inputs_digest(root, base="b") != before


def test_images_refuse_an_unknown_target_before_building(tmp_path: Path) -> None:
    from pflarena.deploy.images import build_images

    with pytest.raises(ValueError, match="unknown image target"):
        build_images(targets=["app", "gpu"], root=_tree(tmp_path))
    assert not (tmp_path / "build").exists(), "nothing may be made"


def test_a_node_builds_its_model_from_its_own_shard_without_the_servers_shard_directory(
    tmp_path: Path,
) -> None:
    """In the compose files ``shards-dir='/shards'`` is mounted in the ServerApp's container
    only; a ClientApp has its own shard file (``data-path``). Its model must follow that file
    and not read the manifest of a directory it does not have (that read failed every reply
    with "no manifest.json in /shards")."""
    import torch
    from deployment_harness import write_test_shards
    from flwr.app import RecordDict

    from pflarena.client.job import ClientJob, load_node_data
    from pflarena.core.config import RunConfig
    from pflarena.core.models import build_model
    from pflarena.core.shard_format import ShardError

    shards = write_test_shards(tmp_path, num_nodes=2)
    cfg = RunConfig(dataset="digits", num_clients=2, shards_dir=str(tmp_path / "not-here"))
    with pytest.raises(ShardError, match="shard directory .*not-here does not exist"):
        cfg.model_name()  # the server's view: its directory, absent on this node
    cpu = torch.device("cpu")
    data = load_node_data(cfg, {"data-path": str(shards[1])}, cpu)
    job = ClientJob(cfg=cfg, data=data, state=None, content=RecordDict(), device=cpu)
    model = job.new_model()
    server = RunConfig(dataset="digits", num_clients=2, shards_dir=str(shards[1].parent))
    info = server.data_info()
    expected = build_model(server.model_name(), info.input_shape, info.num_classes, seed=0)
    assert type(model) is type(expected)
    assert {k: v.shape for k, v in model.state_dict().items()} == {
        k: v.shape for k, v in expected.state_dict().items()
    }
    for key, value in model.state_dict().items():  # the same seeded initial weights
        assert torch.equal(value, expected.state_dict()[key]), key


EDGE_NODE = ROOT / "docker" / "edge-node"


@pytest.mark.parametrize(
    ("env", "args", "said"),
    [
        ({}, ["--isolation", "subprocess"], "--isolation is set by PFLARENA_EDGE_EXECUTOR"),
        ({}, ["--isolation=process"], "--isolation is set by PFLARENA_EDGE_EXECUTOR"),
        ({"PFLARENA_EDGE_EXECUTOR": "fast"}, [], "choose warm or flower"),
    ],
)
def test_the_edge_entrypoint_refuses_what_it_sets(
    env: dict[str, str], args: list[str], said: str
) -> None:
    """docker/edge-node sets the isolation itself and knows two executors."""
    result = subprocess.run(
        ["bash", str(EDGE_NODE), *args], capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ.get("PATH", ""), **env},
    )  # fmt: skip
    assert result.returncode == 2 and said in result.stderr, result


def test_the_edge_entrypoint_ends_with_its_supernode(tmp_path: Path) -> None:
    """docker/edge-node with the warm executor: when the SuperNode ends (here it cannot reach
    a SuperLink and may not retry), the executor beside it is stopped too and the script
    exits with the SuperNode's non-zero status, so that the container's restart policy
    brings the whole node back instead of leaving half of it running."""
    import sys

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
        "FLWR_HOME": str(tmp_path / "flwr"),
    }
    proc = subprocess.Popen(
        ["bash", str(EDGE_NODE), "--insecure", "--superlink", f"127.0.0.1:{port}",
         "--max-retries", "0", "--node-config", f'data-path="{tmp_path}/none.npz"'],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode not in (0, 2), out[-3000:]
    left = subprocess.run(
        ["pgrep", "-s", str(proc.pid)], capture_output=True, text=True
    ).stdout.split()
    assert left == [], f"processes left in the node's session: {left}\n{out[-3000:]}"


@pytest.mark.parametrize("base", ["docker-compose.yml", "docker-compose.tls.yml"])
def test_docker_compose_merges_one_gpu_per_clientapp(tmp_path: Path, lacking, base: str) -> None:
    """The files ``pflarena compose --num-supernodes 2 --gpus 0,1`` writes, merged by Compose
    itself (``config``: it parses and merges, and builds or starts nothing), reserve GPU 0
    for the first SuperNode's ClientApp executor and GPU 1 for the second's, and none for
    any other service. Catches an override whose services or keys Compose does not merge
    onto the base as the structural tests assume (``_merge``)."""
    commands = _compose_commands()
    if not commands:
        lacking(
            "neither `docker-compose` nor `docker compose` (v2 plugin) is on PATH; the GPU "
            "override is checked as YAML by test_every_supernode_has_its_gpu_shard_and_executor"
        )
    out = tmp_path / "compose"
    args = ["--num-supernodes", "2", "--gpus", "0,1", "--out-dir", str(out)]
    assert main(["compose", *args]) == 0
    for cmd in commands:
        result = subprocess.run(
            [*cmd, "-f", base, "-f", "docker-compose.gpu.yml", "config"],
            capture_output=True,
            text=True,
            env={"PATH": os.environ.get("PATH", "")},
            cwd=out,
            timeout=60,
        )
        assert result.returncode == 0, (cmd, result.stderr)
        services = load(result.stdout)["services"]
        for index, gpu in enumerate(["0", "1"]):
            devices = services[f"clientapp-{index}"]["deploy"]["resources"]["reservations"]
            assert devices["devices"] == [
                {"driver": "nvidia", "device_ids": [gpu], "capabilities": ["gpu"]}
            ], (cmd, devices)
        reserving = sorted(name for name, spec in services.items() if "deploy" in spec)
        assert reserving == ["clientapp-0", "clientapp-1"], (cmd, reserving)
