"""Build pflarena's container images (``make images``, ``pflarena images``).

``docker/Dockerfile`` installs from two folders that this module makes on the host, so that
``docker build`` needs no network (pip runs with ``--no-index`` in it):

``build/wheelhouse/`` (``build/wheelhouse-arm64/`` for ``--platform linux/arm64``)
    every dependency as a wheel, with ``requirements.txt`` (pyproject.toml's dependencies,
    torch and torchvision pinned), ``edge-requirements.txt`` (the part of them a SuperNode
    running ClientApps imports: :data:`EDGE_PACKAGES`) and ``constraints.txt``
    (``docker/constraints.txt``). For the host's platform ``pip wheel`` makes it; for another
    (linux/arm64 on an x86-64 host) ``uv pip compile --python-platform`` resolves the edge
    requirements with that platform's markers and ``pip download --platform ...
    --only-binary=:all:`` fetches its wheels. Made again only when those inputs change
    (``.inputs`` records them). While the images build it is served over HTTP on the host's
    loopback (:data:`WHEELHOUSE_PORT`) and ``docker build --network host`` installs from that
    server: the wheels are read once per stage that installs them and enter neither the
    build context (which the classic builder sends whole on every build) nor any layer.
``build/pflarena-dist/``
    the project's wheel, built from this source tree every time (the build context).

Then it builds the targets ``superlink``, ``supernode``, ``edge`` and ``app`` on one base
image, tagged ``pflarena-<target>:<tag>`` (``<tag>-arm64`` for ``--platform linux/arm64``):

* by default Flower's official image of the installed flwr release with Python 3.11 on
  Ubuntu (:data:`FLOWER_BASE`), which ``docker build`` pulls;
* with ``--local-base``, where nothing can be pulled, ``pflarena-base:<...>`` made here from a
  Debian bookworm root filesystem (``debootstrap --variant=minbase`` with Python 3.11, a
  virtual environment ``/python/venv`` holding flwr from the wheelhouse, the user ``app``
  with UID 49999: Flower's layout), loaded with ``docker load`` as an image of the
  platform's architecture. For linux/arm64 on an x86-64 host debootstrap runs its second
  stage, and the build its ``RUN`` steps, under qemu-user through binfmt_misc
  (:func:`emulation_problem` says what is missing). It is made once: an existing image of
  that name is used as it is. debootstrap and chroot need root.

linux/arm64 builds ``superlink``, ``supernode`` and ``edge`` (not ``app``: the ServerApp's
host is an x86-64 server). Its torch is :data:`ARM64_TORCH_PINS`: from torch 2.11 on, PyPI's
linux aarch64 wheel is a CUDA build that requires ~3 GB of NVIDIA wheels, which an edge
device cannot use; 2.10.0 is the newest CPU-only one on PyPI.

The targets share their layers (``docker/Dockerfile`` says how): the edge's dependencies
are one layer, and the ``app`` image adds the ServerApp's on top of it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import tomllib

__all__ = [
    "EDGE_PACKAGES",
    "FLOWER_BASE",
    "PLATFORMS",
    "TARGETS",
    "Platform",
    "build_images",
    "edge_requirements",
    "emulation_problem",
    "image_name",
    "inputs_digest",
    "local_base_name",
    "main",
]

ROOT = Path(__file__).resolve().parents[2]
#: The images' targets in docker/Dockerfile, in the order they are built.
TARGETS = ("superlink", "supernode", "edge", "app")
#: The targets without torch (flwr and pflarena's wheel alone): they stop before the stage that
#: reads the wheelhouse.
FLOWER_ONLY = ("superlink", "supernode")
TORCH_PINS = ("torch==2.14.1", "torchvision==0.29.1")
#: torch on linux/arm64: the newest release whose PyPI aarch64 wheel is CPU-only (2.11 and
#: later are CUDA builds requiring the NVIDIA wheels), and its torchvision.
ARM64_TORCH_PINS = ("torch==2.10.0", "torchvision==0.25.0")
#: pyproject.toml's dependencies that a SuperNode running pflarena's ClientApps imports
#: (``pflarena.client.app``, every solver, the models): flwr (without the simulation extra),
#: torch and torchvision, timm (the NF-ResNet's layers), numpy, pydantic (the run config).
#: Not scipy, scikit-learn, cvxpy, opacus, matplotlib, flwr-datasets, Ray: the ServerApp,
#: the strategies and building data sets import them, a node with its shard file does not
#: (tests/test_deployment_compose.py imports the ClientApp without them).
EDGE_PACKAGES = ("flwr", "torch", "torchvision", "timm", "numpy", "pydantic")


@dataclass(frozen=True)
class Platform:
    """A platform the images can be built for."""

    name: str  # docker's: linux/arm64
    arch: str  # Debian's and the tag suffix: arm64
    machine: str  # uname -m: aarch64
    wheel_tags: tuple[str, ...]  # the wheel platform tags pip may fetch for it
    uv_platform: str  # uv's --python-platform
    torch_pins: tuple[str, ...]
    targets: tuple[str, ...]
    #: where its wheelhouse is served during a build: one port per platform, so that the
    #: builds of two platforms can run at once and each keeps its layers' cache
    wheelhouse_port: int


PLATFORMS = {
    "linux/amd64": Platform(
        "linux/amd64", "amd64", "x86_64",
        ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_18_x86_64",
         "manylinux_2_17_x86_64", "manylinux2014_x86_64"),
        "x86_64-manylinux_2_28", TORCH_PINS, TARGETS, 47391,
    ),
    "linux/arm64": Platform(
        "linux/arm64", "arm64", "aarch64",
        ("manylinux_2_28_aarch64", "manylinux_2_27_aarch64", "manylinux_2_18_aarch64",
         "manylinux_2_17_aarch64", "manylinux2014_aarch64"),
        "aarch64-manylinux_2_28", ARM64_TORCH_PINS, ("superlink", "supernode", "edge"), 47392,
    ),
}  # fmt: skip


def host_platform() -> Platform:
    """The platform of this machine (linux/amd64 where it is not one of :data:`PLATFORMS`)."""
    machine = os.uname().machine
    return next((p for p in PLATFORMS.values() if p.machine == machine), PLATFORMS["linux/amd64"])


def get_platform(name: str | None) -> Platform:
    """``linux/amd64`` or ``linux/arm64`` (``amd64``, ``arm64``, ``aarch64`` too); None: the
    host's. Raises ``ValueError`` for another."""
    if name is None:
        return host_platform()
    aliases = {"amd64": "linux/amd64", "x86_64": "linux/amd64", "arm64": "linux/arm64",
               "aarch64": "linux/arm64", "linux/aarch64": "linux/arm64"}  # fmt: skip
    key = aliases.get(name, name)
    if key not in PLATFORMS:
        raise ValueError(f"unknown platform {name!r}; known: {', '.join(PLATFORMS)}")
    return PLATFORMS[key]


DEBIAN_SUITE = "bookworm"  # Python 3.11, the version every pin was tested on
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: Debian packages of the local base: Python, its venv module, certificates for TLS.
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates", "libsqlite3-0")
#: Also in the wheelhouse: the local base's virtual environment gets them.
BUILD_TOOLS = ("setuptools>=68", "wheel")
APP_UID = 49999  # Flower's images run as user `app` with this UID
#: The wheelhouse's server during a build (the host's platform; linux/arm64's is 47392):
#: docker/Dockerfile's WHEELHOUSE_URL names this port. Fixed, so that the dependencies' layers
#: are cached across builds (the URL is a build argument); ``PFLARENA_WHEELHOUSE_PORT`` moves
#: it (and rebuilds those layers).
WHEELHOUSE_PORT = 47391
#: The edge image's entrypoint (docker/edge-node): the SuperNode and its ClientApp executor.
EDGE_ENTRYPOINT = "edge-node"


def flower_base() -> str:
    """Flower's Ubuntu image with Python 3.11 for the installed flwr release."""
    return f"flwr/superexec:{version('flwr')}-py3.11-ubuntu24.04"


FLOWER_BASE = flower_base()


def image_name(
    target: str, tag: str = "latest", prefix: str = "pflarena", platform: str | None = None
) -> str:
    """``pflarena-<target>:<tag>``; with a ``platform``, ``<tag>-<arch>`` (``latest-arm64``):
    one image store holds one image per name, whatever its architecture."""
    suffix = f"-{get_platform(platform).arch}" if platform else ""
    return f"{prefix}-{target}:{tag}{suffix}"


def local_base_name(platform: str | None = None) -> str:
    """The locally made base image's name: distribution, Python and flwr in its tag (and the
    architecture, for a platform other than the host's)."""
    name = f"pflarena-base:{DEBIAN_SUITE}-py3.11-flwr{version('flwr')}"
    target = get_platform(platform)
    return name if target == host_platform() else f"{name}-{target.arch}"


def emulation_problem(platform: str | None) -> str | None:
    """Why containers of ``platform`` cannot run on this host, or None: a foreign
    architecture runs under qemu-user, registered with binfmt_misc with the F flag (the
    interpreter opened at registration, so that it works inside containers)."""
    target = get_platform(platform)
    if target == host_platform():
        return None
    entry = Path("/proc/sys/fs/binfmt_misc") / f"qemu-{target.machine}"
    how = (
        "apt-get install qemu-user-static; mount -t binfmt_misc binfmt_misc "
        f"/proc/sys/fs/binfmt_misc; cat /usr/lib/binfmt.d/qemu-{target.machine}.conf > "
        "/proc/sys/fs/binfmt_misc/register (as root; `make binfmt` does it)"
    )
    if not entry.is_file():
        return f"no binfmt_misc handler for {target.machine} ({entry} is missing): {how}"
    text = entry.read_text()
    if "enabled" not in text.splitlines()[0]:
        return f"the binfmt_misc handler {entry} is disabled: {how}"
    flags = next((ln.split()[1] for ln in text.splitlines() if ln.startswith("flags:")), "")
    if "F" not in flags:
        return f"{entry} lacks the F flag (containers cannot reach its interpreter): {how}"
    return None


def _run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kwargs)


def image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


# --------------------------------------------------------------------------- the wheels
def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower()


def requirements(root: Path = ROOT, platform: str | None = None) -> list[str]:
    """pyproject.toml's dependencies, torch and torchvision replaced by their pins (the
    platform's)."""
    pins = get_platform(platform).torch_pins
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = {_name(pin) for pin in pins}
    return [*pins, *(d for d in deps if _name(d) not in pinned)]


def edge_requirements(root: Path = ROOT, platform: str | None = None) -> list[str]:
    """The edge image's part of :func:`requirements`: :data:`EDGE_PACKAGES`, flwr without
    its extras (the simulation extra is Ray)."""
    kept = [r for r in requirements(root, platform) if _name(r) in EDGE_PACKAGES]
    missing = set(EDGE_PACKAGES) - {_name(r) for r in kept}
    if missing:
        raise RuntimeError(f"pyproject.toml no longer depends on {', '.join(sorted(missing))}")
    return [re.sub(r"\[[^\]]*\]", "", r) for r in kept]


def wheelhouse_dir(root: Path = ROOT, platform: str | None = None) -> Path:
    """``build/wheelhouse`` for the host's platform, ``build/wheelhouse-<arch>`` for another."""
    target = get_platform(platform)
    name = "wheelhouse" if target == host_platform() else f"wheelhouse-{target.arch}"
    return root / "build" / name


def make_wheelhouse(
    root: Path = ROOT, extra_index_url: str | None = None, platform: str | None = None
) -> Path:
    """The platform's wheelhouse (:func:`wheelhouse_dir`): every dependency as a wheel
    (downloads what pip's cache lacks). Another platform's holds the edge's requirements
    only, resolved for that platform."""
    if sys.version_info[:2] != (3, 11):
        raise RuntimeError(
            "the wheelhouse is made with this interpreter's wheels and the images run Python "
            f"3.11: run this with Python 3.11, not {sys.version.split()[0]}"
        )
    target = get_platform(platform)
    foreign = target != host_platform()
    out = wheelhouse_dir(root, platform)
    reqs = "" if foreign else "\n".join(requirements(root, platform)) + "\n"
    edge = "\n".join([*edge_requirements(root, platform), *BUILD_TOOLS]) + "\n"
    constraints = (root / "docker" / "constraints.txt").read_text()
    stamp = hashlib.sha256(
        f"{target.name}\0{reqs}\0{edge}\0{constraints}\0{extra_index_url}".encode()
    ).hexdigest()
    if (out / ".inputs").is_file() and (out / ".inputs").read_text() == stamp:
        print(f"{out}: up to date")
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / "constraints.txt").write_text(constraints)
    index = ["--extra-index-url", extra_index_url] if extra_index_url else []
    if not foreign:
        (out / "requirements.txt").write_text(reqs)
        (out / "edge-requirements.txt").write_text(edge)
        _run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", out, "--find-links", out,
             *index, "-r", out / "requirements.txt", "-c", out / "constraints.txt", *BUILD_TOOLS],
        )  # fmt: skip
    else:
        # pip evaluates environment markers for the machine it runs on, not for --platform:
        # uv resolves for the target's (platform_machine == "aarch64"), pip fetches the pins.
        (out / "edge.in").write_text(edge)
        uv_index = ["--extra-index-url", extra_index_url] if extra_index_url else []
        try:
            _run(
                [sys.executable, "-m", "uv", "pip", "compile", "-q", "--no-header",
                 "--no-annotate", "--python-platform", target.uv_platform, "--python-version",
                 "3.11", *uv_index, "-c", out / "constraints.txt", out / "edge.in",
                 "-o", out / "edge-requirements.txt"],
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(
                f"resolving the {target.name} requirements needs uv (`pip install uv`; flwr "
                "brings it) and the package index"
            ) from exc
        platforms = [a for tag in target.wheel_tags for a in ("--platform", tag)]
        _run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             *platforms, "--python-version", "3.11", "--implementation", "cp", *index,
             "-d", out, "-r", out / "edge-requirements.txt"],
        )  # fmt: skip
    (out / ".inputs").write_text(stamp)
    return out


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base's name)
        pass


@contextmanager
def serve_wheelhouse(wheelhouse: Path, port: int | None = None):
    """Serve ``wheelhouse`` on 127.0.0.1 for the duration; yields its URL. The standard
    library's server: pip's ``--find-links`` reads its directory listing."""
    if port is None:
        port = int(os.environ.get("PFLARENA_WHEELHOUSE_PORT", WHEELHOUSE_PORT))
    handler = functools.partial(_QuietHandler, directory=str(wheelhouse))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise RuntimeError(
            f"cannot serve the wheelhouse on 127.0.0.1:{port} ({exc.strerror}): is another "
            "`pflarena images` running? PFLARENA_WHEELHOUSE_PORT picks another port"
        ) from exc
    thread = threading.Thread(target=server.serve_forever, name="wheelhouse", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.shutdown()
        server.server_close()


def make_project_wheel(root: Path = ROOT) -> Path:
    """``build/pflarena-dist``: the project's wheel alone, built from the source tree. Two
    builds at once (two platforms) take turns (a lock), and a wheel equal to the one there
    leaves the folder untouched, so that a ``docker build`` reading it is not disturbed."""
    import fcntl

    out = root / "build" / "pflarena-dist"
    out.parent.mkdir(parents=True, exist_ok=True)
    with (root / "build" / ".pflarena-dist.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".pflarena-dist-") as tmp:
            # setuptools builds under build/lib and would package files left there by an
            # older tree.
            shutil.rmtree(root / "build" / "lib", ignore_errors=True)
            # Fixed timestamps in the zip: the same source, the same wheel, and docker's
            # cache of the layer that installs it holds (it compares the files' content).
            _run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                 "--wheel-dir", tmp, root],
                env=os.environ | {"SOURCE_DATE_EPOCH": "315532800"},
            )  # fmt: skip
            shutil.rmtree(root / "build" / "lib", ignore_errors=True)
            made = {p.name: p.read_bytes() for p in Path(tmp).iterdir()}
            there = {p.name: p.read_bytes() for p in out.iterdir()} if out.is_dir() else {}
            if made != there:
                shutil.rmtree(out, ignore_errors=True)
                os.replace(tmp, out)
                out.chmod(0o755)
                Path(tmp).mkdir()  # for the context manager's cleanup
    return out


# --------------------------------------------------------------------------- the local base
@contextmanager
def _bind(source: Path, target: Path):
    target.mkdir(parents=True, exist_ok=True)
    _run(["mount", "--bind", source, target])
    try:
        yield target
    finally:
        _run(["umount", target])


def make_local_base(
    wheelhouse: Path,
    name: str | None = None,
    mirror: str = DEBIAN_MIRROR,
    platform: str | None = None,
) -> str:
    """A base image with Flower's layout from a Debian root filesystem of ``platform``'s
    architecture; kept if it exists."""
    target = get_platform(platform)
    name = name or local_base_name(platform)
    if image_exists(name):
        print(f"{name}: exists, kept")
        return name
    for tool in ("debootstrap", "chroot", "mount"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"--local-base needs `{tool}` (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise RuntimeError("--local-base runs debootstrap and chroot: run it as root (sudo)")
    foreign = target != host_platform()
    if foreign and (problem := emulation_problem(target.name)):
        raise RuntimeError(f"a {target.name} base on this host runs under emulation: {problem}")
    with tempfile.TemporaryDirectory(prefix="pflarena-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        # Another architecture: the first stage unpacks here, the second (the packages'
        # scripts) runs in the chroot under qemu-user.
        _run(
            ["debootstrap", "--variant=minbase", f"--arch={target.arch}",
             *(["--foreign"] if foreign else []), f"--include={','.join(DEBIAN_PACKAGES)}",
             DEBIAN_SUITE, rootfs, mirror],
        )  # fmt: skip
        if foreign:
            _run(["chroot", rootfs, "/debootstrap/debootstrap", "--second-stage"])
        flwr = f"flwr=={version('flwr')}"
        with _bind(wheelhouse, rootfs / "tmp" / "wheels"):
            _run(["chroot", rootfs, "python3", "-m", "venv", "/python/venv"])
            _run(
                ["chroot", rootfs, "/python/venv/bin/python", "-m", "pip", "install", "-q",
                 "--no-cache-dir", "--no-index", "--find-links", "/tmp/wheels",
                 "-c", "/tmp/wheels/constraints.txt", flwr, *BUILD_TOOLS],
            )  # fmt: skip
        _run(
            ["chroot", rootfs, "useradd", "--no-create-home", "--home-dir", "/app", "-c", "",
             "--uid", str(APP_UID), "app"],
        )  # fmt: skip
        _run(["chroot", rootfs, "sh", "-c", "mkdir -p /app && chown -R app:app /app /python"])
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / cache).glob("*"):
                if path.is_file():
                    path.unlink()
        load_rootfs(rootfs, name, target, Path(tmp))
    return name


#: The local base's configuration (Flower's images' layout).
BASE_CONFIG = {
    "Env": [
        "PATH=/python/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONUNBUFFERED=1",
        "PYTHONDONTWRITEBYTECODE=1",
        "PYTHONIOENCODING=UTF-8",
        "LANG=C.UTF-8",
        "LC_ALL=C.UTF-8",
        "HOME=/app",
    ],
    "WorkingDir": "/app",
    "User": "app",
}


def load_rootfs(rootfs: Path, name: str, target: Platform, scratch: Path) -> None:
    """``docker load`` ``rootfs`` as image ``name`` of ``target``'s architecture: one layer
    and :data:`BASE_CONFIG`. (``docker import --platform`` records the host's architecture
    on an engine without the experimental flag; an image archive says what it is.)"""
    layer = scratch / "layer.tar"
    _run(["tar", "--numeric-owner", "-C", rootfs, "-cf", layer, "."])
    digest = hashlib.sha256()
    with layer.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    config = {
        "architecture": target.arch,
        "os": "linux",
        "config": BASE_CONFIG,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest.hexdigest()}"]},
        "history": [{"created_by": f"pflarena images --local-base: Debian {DEBIAN_SUITE}"}],
    }
    data = json.dumps(config, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(data).hexdigest()}.json"
    (scratch / config_name).write_bytes(data)
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": ["layer.tar"]}]
    (scratch / "manifest.json").write_text(json.dumps(manifest))
    archive = scratch / "image.tar"
    _run(["tar", "-C", scratch, "-cf", archive, "manifest.json", config_name, "layer.tar"])
    layer.unlink()
    _run(["docker", "load", "-i", archive])
    archive.unlink()


# --------------------------------------------------------------------------- the images
def inputs_digest(root: Path = ROOT, base: str = "") -> str:
    """A digest of everything the images are made of: the Dockerfile, .dockerignore, the
    dependencies' pins, pyproject.toml, the package's source files, the edge's entrypoint and
    the base's name (which names the platform: :func:`local_base_name`). Equal digests, equal
    images (the test suite tags its images with it)."""
    digest = hashlib.sha256(base.encode())
    files = [
        root / "docker" / "Dockerfile",
        root / "docker" / EDGE_ENTRYPOINT,
        root / ".dockerignore",
        root / "docker" / "constraints.txt",
        root / "pyproject.toml",
        *sorted(
            p
            for p in (root / "pflarena").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ),
    ]
    for path in files:
        if not path.exists():  # a tree from before the file existed
            continue
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_images(
    *,
    local_base: bool = False,
    base: str | None = None,
    tags: Sequence[str] = ("latest",),
    targets: Sequence[str] | None = None,
    root: Path = ROOT,
    extra_index_url: str | None = None,
    platform: str | None = None,
) -> dict[str, float]:
    """Make the wheels (and the local base), then ``docker build`` each target; returns the
    seconds each step took. ``platform`` (``linux/arm64``): build for it, tagged
    ``<tag>-arm64`` (:func:`image_name`); None builds for this host, tagged ``<tag>``."""
    target_platform = get_platform(platform)
    targets = list(target_platform.targets if targets is None else targets)
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"unknown image target(s) {', '.join(unknown)}; known: {TARGETS}")
    unsupported = sorted(set(targets) - set(target_platform.targets))
    if unsupported:
        raise ValueError(
            f"{target_platform.name} builds {', '.join(target_platform.targets)}, not "
            f"{', '.join(unsupported)} (the ServerApp's executor runs on the x86-64 server)"
        )
    if not tags:
        raise ValueError("give at least one tag")
    if not (root / "docker" / "Dockerfile").is_file():
        raise RuntimeError(f"{root} is not a source tree with docker/Dockerfile")
    if problem := emulation_problem(target_platform.name):
        raise RuntimeError(f"building {target_platform.name} images here: {problem}")
    times: dict[str, float] = {}
    t0 = time.monotonic()
    wheelhouse = make_wheelhouse(root, extra_index_url, platform=target_platform.name)
    times["wheelhouse"] = time.monotonic() - t0
    t0 = time.monotonic()
    make_project_wheel(root)
    times["project wheel"] = time.monotonic() - t0
    if local_base:
        t0 = time.monotonic()
        base = make_local_base(wheelhouse, base, platform=target_platform.name)
        times["local base"] = time.monotonic() - t0
    base = base or FLOWER_BASE
    digest = (wheelhouse / ".inputs").read_text()[:16]
    platform_args = ["--platform", target_platform.name] if platform else []
    port = os.environ.get("PFLARENA_WHEELHOUSE_PORT") or target_platform.wheelhouse_port
    with serve_wheelhouse(wheelhouse, int(port)) as url:
        for target in targets:
            t0 = time.monotonic()
            names = [image_name(target, tag, platform=platform) for tag in tags]
            wheels = [] if target in FLOWER_ONLY else [
                "--build-arg", f"WHEELHOUSE_URL={url}", "--build-arg", f"WHEELHOUSE_DIGEST={digest}"
            ]  # fmt: skip
            _run(
                ["docker", "build", "--network", "host", *platform_args,
                 "-f", root / "docker" / "Dockerfile", "--target", target,
                 "--build-arg", f"BASE_IMAGE={base}", *wheels,
                 *[a for n in names for a in ("-t", n)],
                 root],
            )  # fmt: skip
            times[target] = time.monotonic() - t0
    return times


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``pflarena images``."""
    parser = sub.add_parser(
        "images",
        help="build the container images (superlink, supernode, edge, app)",
        description=__doc__.split("\n\n")[0] + " Images are named pflarena-<target>:<tag> "
        "(<tag>-arm64 with --platform linux/arm64).",
    )
    parser.add_argument(
        "--local-base",
        action="store_true",
        help="make the base image here (debootstrap of Debian bookworm, docker import; needs "
        "root) instead of pulling Flower's; kept once made",
    )
    parser.add_argument("--base", help=f"the base image (default {FLOWER_BASE}, or the local one)")
    parser.add_argument(
        "--tag", action="append", help="a tag for every image (repeatable; default latest)"
    )
    parser.add_argument(
        "--target",
        action="append",
        choices=TARGETS,
        help="build only this target (repeatable; default every target of the platform)",
    )
    parser.add_argument(
        "--platform",
        help="build for this platform: linux/arm64 (an edge device; on an x86-64 host under "
        "qemu-user emulation: superlink, supernode, edge) or linux/amd64; default this host's, "
        "tagged without a suffix",
    )
    parser.add_argument(
        "--extra-index-url",
        help="another package index for the wheelhouse, e.g. https://download.pytorch.org/whl/cpu "
        "(with torch's pins adjusted) for torch without CUDA",
    )
    parser.set_defaults(func=_cmd_images)


def _cmd_images(args: argparse.Namespace) -> int:
    if shutil.which("docker") is None:
        raise RuntimeError("docker is not installed")
    times = build_images(
        local_base=args.local_base,
        base=args.base,
        tags=args.tag or ("latest",),
        targets=args.target,
        extra_index_url=args.extra_index_url,
        platform=args.platform,
    )
    print("\n".join(f"{step}: {seconds:.0f} s" for step, seconds in times.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pflarena.deploy.images", allow_abbrev=False)
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["images", *(argv if argv is not None else sys.argv[1:])])
    try:
        return args.func(args)
    except (ValueError, OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"pflarena images: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
