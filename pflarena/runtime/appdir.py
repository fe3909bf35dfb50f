"""The Flower App directory of an installed pflarena (a wheel, no source tree).

A Flower App is a directory with a ``pyproject.toml`` (its components and the
``[tool.flwr.app.config]`` defaults) and the code: ``flwr run`` builds the FAB from it and
pflarena's simulation runtime reads it. From a clone that directory is the source tree. A
wheel carries the same ``pyproject.toml`` as package data (``pflarena/_app/pyproject.toml``,
a link to the project's own file in the source tree), and :func:`installed_app_dir` lays out
an app directory from the installed package: that file and a copy of the package's code,
under ``$PFLARENA_APP_DIR`` (default ``$XDG_CACHE_HOME/pflarena/app``, else
``~/.cache/pflarena/app``), one directory per installed content, made once and atomically.

``flwr run`` is handed that laid-out directory from a clone too (:func:`flwr_run_dir`):
Flower walks and resolves every file under the directory it is given before it filters
them (``collect_files`` in ``flwr/cli/utils.py``), and a clone's ``.venv`` holds ~50,000
files, which cost ~10 s of CPU per ``flwr run`` (``flwr build --app .`` in a clone with its
``.venv``: 10.1 s wall, 7.6 s user; the laid-out app has ~160 files).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["APP_MANIFEST", "flwr_run_dir", "installed_app_dir"]

#: Where the app's ``pyproject.toml`` lies inside the package.
APP_MANIFEST = Path("_app") / "pyproject.toml"
_CODE_SUFFIXES = (".py", ".toml", ".json", ".md")


def _package_dir() -> Path:
    import pflarena

    return Path(pflarena.__file__).resolve().parent


def _cache_root() -> Path:
    if os.environ.get("PFLARENA_APP_DIR"):
        return Path(os.environ["PFLARENA_APP_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pflarena" / "app"


def _code_files(package: Path) -> list[Path]:
    return sorted(
        path
        for path in package.rglob("*")
        if path.is_file()
        and path.suffix in _CODE_SUFFIXES
        and "__pycache__" not in path.parts
        and path.relative_to(package).parts[0] != APP_MANIFEST.parts[0]
    )


def installed_app_dir(cache_root: Path | None = None) -> Path:
    """The app directory of the installed package (made on first use), under
    ``cache_root`` (default ``$PFLARENA_APP_DIR``, else the user's cache).

    Raises
    ------
    RuntimeError
        The installed package carries no ``_app/pyproject.toml`` (built by other means
        than the project's own packaging), or the cache directory cannot be written.
    """
    package = _package_dir()
    manifest = package / APP_MANIFEST
    if not manifest.is_file():
        raise RuntimeError(
            f"{package} has no {APP_MANIFEST} (the Flower App's pyproject.toml); install pflarena "
            "from its wheel (`pip install pflarena-*.whl`) or from a clone (`pip install -e .`)"
        )
    files = _code_files(package)
    digest = hashlib.sha256(manifest.read_bytes())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    target = (cache_root or _cache_root()) / f"pflarena-{digest.hexdigest()[:16]}"
    if (target / "pyproject.toml").is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".making-", dir=target.parent))
        for path in files:
            copy = scratch / "pflarena" / path.relative_to(package)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy)
        shutil.copy2(manifest, scratch / "pyproject.toml")
        try:
            scratch.rename(target)
        except OSError:  # made meanwhile by another process: use that one
            shutil.rmtree(scratch, ignore_errors=True)
    except OSError as exc:
        raise RuntimeError(
            f"cannot lay out the Flower App directory under {target.parent}: {exc} "
            "(set PFLARENA_APP_DIR to a writable directory)"
        ) from None
    return target


def flwr_run_dir(cache_root: Path | None = None) -> Path:
    """The directory to hand ``flwr run``: the app laid out from the package
    (:func:`installed_app_dir`), from a clone as from a wheel, so that Flower builds the FAB
    from the app's ~160 files instead of walking the whole clone. Made again when the
    package's code changes (the directory's name is a digest of it)."""
    return installed_app_dir(cache_root)
