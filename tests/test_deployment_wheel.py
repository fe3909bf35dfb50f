"""pflarena as a real package: its wheel, installed without the source tree, runs.

The wheel is built from a copy of the project's files (``pyproject.toml``, ``README.md``,
``pflarena/``) with ``pip wheel --no-deps --no-build-isolation --no-index`` (no network: the
test venv's setuptools builds it) and installed with ``pip install --no-index --no-deps``
into a fresh virtual environment. That environment gets its dependencies (flwr, torch, ...)
from this test's own environment through a ``.pth`` line (nothing is downloaded), and the
commands run from a directory outside the source tree, without ``PYTHONPATH``, so the only
``pflarena`` they can import is the installed wheel's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import tomllib

from pflarena.runtime.appdir import APP_MANIFEST

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _check(result: subprocess.CompletedProcess, what: str) -> str:
    assert result.returncode == 0, (
        f"{what} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


def test_installed_wheel_runs_without_the_source_tree(tmp_path: Path) -> None:
    """``pflarena shards`` and a 2-round ``pflarena run`` (ServerApp and ClientApps) from the
    installed wheel. Catches a wheel that leaves out the Flower App's ``pyproject.toml`` or
    the presets, and a ``pflarena run`` that needs the source tree next to the package."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "pflarena", src / "pflarena", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    dist = tmp_path / "dist"
    _check(
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
             "--no-index", "-q", "-w", str(dist)],
            capture_output=True, text=True, timeout=300,
        ),
        "pip wheel",
    )  # fmt: skip
    (wheel,) = dist.glob("pflarena-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert f"pflarena/{APP_MANIFEST.as_posix()}" in names, "the wheel lacks the app manifest"
    assert "pflarena/presets/digits-main.toml" in names

    venv = tmp_path / "venv"
    _check(
        subprocess.run(
            [getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
            capture_output=True, text=True, timeout=120,
        ),
        "python -m venv",
    )  # fmt: skip
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # The dependencies: this environment's site-packages, appended to the new one's path
    # (its own site-packages, holding the wheel's pflarena, comes first).
    Path(site, "_pflarena_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _check(
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
             "--no-deps", "-q", str(wheel)],
            capture_output=True, text=True, timeout=300,
        ),
        "pip install",
    )  # fmt: skip

    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {
        "PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PFLARENA_RUNS_DIR": str(work / "runs"),
    }

    def run(*args: str, timeout: float = 600) -> str:
        result = subprocess.run(
            list(args), cwd=work, env=env, capture_output=True, text=True, timeout=timeout
        )
        return _check(result, " ".join(args[:3]))

    where = run(str(python), "-c", "import pflarena; print(pflarena.__file__)")
    assert where.strip().startswith(site), f"pflarena imported from {where.strip()}, not {site}"
    # The built-in methods are the wheel's entry points, in the pyproject table's order, and
    # read from them: no warning that the metadata lacks them.
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "[pflarena.methods]" in zipfile.ZipFile(wheel).read(entry_points).decode()
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    listed = subprocess.run(
        [str(python), "-c", "from pflarena.strategies import declarations; print(*declarations())"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert listed.stdout.split() == list(table["pflarena.methods"]), listed.stderr
    assert "Reinstall pflarena" not in listed.stderr, listed.stderr
    run("pflarena", "shards", "--dataset", "digits", "--partition", "iid", "--num-clients", "2",
        "--out", str(work / "shards"))  # fmt: skip
    out = work / "out"
    run("pflarena", "run", "--shards-dir", str(work / "shards"), "--strategy", "fedavg",
        "--num-rounds", "2", "--output-dir", str(out), "--quiet")  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["num_rounds"] == 2, summary
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    # The app directory laid out from the installed package, not the source tree.
    (app_dir,) = (tmp_path / "cache" / "pflarena" / "app").glob("pflarena-*")
    assert (app_dir / "pyproject.toml").read_text() == (ROOT / "pyproject.toml").read_text()
