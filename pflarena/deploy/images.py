"""Build pflarena's container images (``make images``, ``pflarena images``).

``docker/Dockerfile`` installs from two folders that this module makes on the host, so that
``docker build`` needs no network (pip runs with ``--no-index`` in it):

``build/wheelhouse/``
    every dependency as a wheel (``pip wheel`` of pyproject.toml's dependencies with torch
    and torchvision pinned, under ``docker/constraints.txt``), with ``requirements.txt`` and
    ``constraints.txt``. Made again only when those inputs change (``.inputs`` records them).
    While the images build it is served over HTTP on the host's loopback
    (:data:`WHEELHOUSE_PORT`) and ``docker build --network host`` installs from that server:
    the wheels (~3.4 GB) are read once, by one ``pip install``, and enter neither the build
    context (which the classic builder sends whole on every build) nor any layer.
``build/pflarena-dist/``
    the project's wheel, built from this source tree every time (the build context).

Then it builds the targets ``superlink``, ``supernode``, ``app`` and ``edge`` on one base
image, tagged ``pflarena-<target>:<tag>``:

* by default Flower's official image of the installed flwr release with Python 3.11 on
  Ubuntu (:data:`FLOWER_BASE`), which ``docker build`` pulls;
* with ``--local-base``, where nothing can be pulled, ``pflarena-base:<...>`` made here from a
  Debian bookworm root filesystem (``debootstrap --variant=minbase`` with Python 3.11, a
  virtual environment ``/python/venv`` holding flwr from the wheelhouse, the user ``app``
  with UID 49999: Flower's layout) by ``docker import``. It is made once: an existing image
  of that name is used as it is. debootstrap and chroot need root.

The four targets share their layers (``docker/Dockerfile`` says how): the dependencies are
installed once, into one layer, whatever the order of the builds.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import tomllib

__all__ = [
    "FLOWER_BASE",
    "TARGETS",
    "build_images",
    "image_name",
    "inputs_digest",
    "local_base_name",
    "main",
]

ROOT = Path(__file__).resolve().parents[2]
#: The images' targets in docker/Dockerfile, in the order they are built.
TARGETS = ("superlink", "supernode", "app", "edge")
#: The targets without torch (flwr and pflarena's wheel alone): they stop before the stage that
#: reads the wheelhouse.
FLOWER_ONLY = ("superlink", "supernode")
TORCH_PINS = ("torch==2.14.1", "torchvision==0.29.1")
DEBIAN_SUITE = "bookworm"  # Python 3.11, the version every pin was tested on
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: Debian packages of the local base: Python, its venv module, certificates for TLS.
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates", "libsqlite3-0")
#: Also in the wheelhouse: the local base's virtual environment gets them.
BUILD_TOOLS = ("setuptools>=68", "wheel")
APP_UID = 49999  # Flower's images run as user `app` with this UID
#: The wheelhouse's server during a build: docker/Dockerfile's WHEELHOUSE_URL names this port.
#: Fixed, so that the dependencies' layer is cached across builds (the URL is a build argument);
#: ``PFLARENA_WHEELHOUSE_PORT`` moves it (and rebuilds that layer).
WHEELHOUSE_PORT = 47391


def flower_base() -> str:
    """Flower's Ubuntu image with Python 3.11 for the installed flwr release."""
    return f"flwr/superexec:{version('flwr')}-py3.11-ubuntu24.04"


FLOWER_BASE = flower_base()


def image_name(target: str, tag: str = "latest", prefix: str = "pflarena") -> str:
    """``pflarena-<target>:<tag>``."""
    return f"{prefix}-{target}:{tag}"


def local_base_name() -> str:
    """The locally made base image's name: distribution, Python and flwr in its tag."""
    return f"pflarena-base:{DEBIAN_SUITE}-py3.11-flwr{version('flwr')}"


def _run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kwargs)


def image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


# --------------------------------------------------------------------------- the wheels
def requirements(root: Path = ROOT) -> list[str]:
    """pyproject.toml's dependencies, torch and torchvision replaced by their pins."""
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = {pin.split("==")[0] for pin in TORCH_PINS}
    kept = [d for d in deps if d.split(">")[0].split("=")[0].split("[")[0].strip() not in pinned]
    return [*TORCH_PINS, *kept]


def make_wheelhouse(root: Path = ROOT, extra_index_url: str | None = None) -> Path:
    """``build/wheelhouse``: every dependency as a wheel (downloads what pip's cache lacks)."""
    if sys.version_info[:2] != (3, 11):
        raise RuntimeError(
            "the wheelhouse is made with this interpreter's wheels and the images run Python "
            f"3.11: run this with Python 3.11, not {sys.version.split()[0]}"
        )
    out = root / "build" / "wheelhouse"
    reqs = "\n".join(requirements(root)) + "\n"
    constraints = (root / "docker" / "constraints.txt").read_text()
    stamp = hashlib.sha256(f"{reqs}\0{constraints}\0{extra_index_url}".encode()).hexdigest()
    if (out / ".inputs").is_file() and (out / ".inputs").read_text() == stamp:
        print(f"{out}: up to date")
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / "requirements.txt").write_text(reqs)
    (out / "constraints.txt").write_text(constraints)
    index = ["--extra-index-url", extra_index_url] if extra_index_url else []
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", out, "--find-links", out, *index,
         "-r", out / "requirements.txt", "-c", out / "constraints.txt", *BUILD_TOOLS],
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
    """``build/pflarena-dist``: the project's wheel alone, built from the source tree."""
    out = root / "build" / "pflarena-dist"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # setuptools builds under build/lib and would package files left there by an older tree.
    shutil.rmtree(root / "build" / "lib", ignore_errors=True)
    # Fixed timestamps in the zip: the same source, the same wheel, and docker's cache of
    # the layer that installs it holds (it compares the files' content).
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--wheel-dir", out, root],
        env=os.environ | {"SOURCE_DATE_EPOCH": "315532800"},
    )  # fmt: skip
    shutil.rmtree(root / "build" / "lib", ignore_errors=True)
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


def make_local_base(wheelhouse: Path, name: str | None = None, mirror: str = DEBIAN_MIRROR) -> str:
    """A base image with Flower's layout from a Debian root filesystem; kept if it exists."""
    name = name or local_base_name()
    if image_exists(name):
        print(f"{name}: exists, kept")
        return name
    for tool in ("debootstrap", "chroot", "mount"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"--local-base needs `{tool}` (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise RuntimeError("--local-base runs debootstrap and chroot: run it as root (sudo)")
    with tempfile.TemporaryDirectory(prefix="pflarena-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}",
             DEBIAN_SUITE, rootfs, mirror],
        )  # fmt: skip
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
        changes = [
            "ENV PATH=/python/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV PYTHONUNBUFFERED=1",
            "ENV PYTHONDONTWRITEBYTECODE=1",
            "ENV PYTHONIOENCODING=UTF-8",
            "ENV LANG=C.UTF-8",
            "ENV LC_ALL=C.UTF-8",
            "ENV HOME=/app",
            "WORKDIR /app",
            "USER app",
        ]
        tar = subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE
        )
        args = [a for change in changes for a in ("--change", change)]
        _run(["docker", "import", *args, "-", name], stdin=tar.stdout)
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0:
            raise RuntimeError("tar of the root filesystem failed")
    return name


# --------------------------------------------------------------------------- the images
def inputs_digest(root: Path = ROOT, base: str = "") -> str:
    """A digest of everything the images are made of: the Dockerfile, .dockerignore, the
    dependencies' pins, pyproject.toml, the package's source files and the base's name.
    Equal digests, equal images (the test suite tags its images with it)."""
    digest = hashlib.sha256(base.encode())
    files = [
        root / "docker" / "Dockerfile",
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
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_images(
    *,
    local_base: bool = False,
    base: str | None = None,
    tags: Sequence[str] = ("latest",),
    targets: Sequence[str] = TARGETS,
    root: Path = ROOT,
    extra_index_url: str | None = None,
) -> dict[str, float]:
    """Make the wheels (and the local base), then ``docker build`` each target; returns the
    seconds each step took."""
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise ValueError(f"unknown image target(s) {', '.join(unknown)}; known: {TARGETS}")
    if not tags:
        raise ValueError("give at least one tag")
    if not (root / "docker" / "Dockerfile").is_file():
        raise RuntimeError(f"{root} is not a source tree with docker/Dockerfile")
    times: dict[str, float] = {}
    t0 = time.monotonic()
    wheelhouse = make_wheelhouse(root, extra_index_url)
    times["wheelhouse"] = time.monotonic() - t0
    t0 = time.monotonic()
    make_project_wheel(root)
    times["project wheel"] = time.monotonic() - t0
    if local_base:
        t0 = time.monotonic()
        base = make_local_base(wheelhouse, base)
        times["local base"] = time.monotonic() - t0
    base = base or FLOWER_BASE
    digest = (wheelhouse / ".inputs").read_text()[:16]
    with serve_wheelhouse(wheelhouse) as url:
        for target in targets:
            t0 = time.monotonic()
            names = [image_name(target, tag) for tag in tags]
            wheels = [] if target in FLOWER_ONLY else [
                "--build-arg", f"WHEELHOUSE_URL={url}", "--build-arg", f"WHEELHOUSE_DIGEST={digest}"
            ]  # fmt: skip
            _run(
                ["docker", "build", "--network", "host", "-f", root / "docker" / "Dockerfile",
                 "--target", target, "--build-arg", f"BASE_IMAGE={base}", *wheels,
                 *[a for n in names for a in ("-t", n)],
                 root],
            )  # fmt: skip
            times[target] = time.monotonic() - t0
    return times


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``pflarena images``."""
    parser = sub.add_parser(
        "images",
        help="build the container images (superlink, supernode, app, edge)",
        description=__doc__.split("\n\n")[0] + " Images are named pflarena-<target>:<tag>.",
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
        "--target", action="append", choices=TARGETS, help="build only this target (repeatable)"
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
        targets=args.target or TARGETS,
        extra_index_url=args.extra_index_url,
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
