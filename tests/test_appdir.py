"""The directory ``flwr run`` is handed (``runtime/appdir.py``): the app laid out from the
package, so that Flower builds the FAB without walking a clone's ``.venv``."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk

from pflarena.runtime.appdir import flwr_run_dir

ROOT = Path(__file__).resolve().parents[1]


def _modules(root: Path) -> set[str]:
    return {
        path.relative_to(root).as_posix()
        for path in (root / "pflarena").rglob("*.py")
        if "__pycache__" not in path.parts
    }


def test_the_laid_out_app_is_the_package_and_its_manifest_only(tmp_path: Path) -> None:
    app = flwr_run_dir(tmp_path)
    assert sorted(path.name for path in app.iterdir()) == ["pflarena", "pyproject.toml"]
    assert (app / "pyproject.toml").read_bytes() == (ROOT / "pyproject.toml").read_bytes()
    assert _modules(app) == _modules(ROOT)
    presets = {path.name for path in (ROOT / "pflarena" / "presets").glob("*.toml")}
    assert presets and {path.name for path in (app / "pflarena" / "presets").iterdir()} == presets
    assert flwr_run_dir(tmp_path) == app  # made once, then found
    assert [path.name for path in tmp_path.iterdir()] == [app.name]  # no scratch left behind


def test_flowers_fab_of_the_laid_out_app_holds_every_module(tmp_path: Path) -> None:
    """Flower's own FAB builder accepts the directory (its structure rules) and packs every
    module of the package; catches a layout that leaves out code the ClientApp imports."""
    app = flwr_run_dir(tmp_path)
    fab = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(app)))
    packed = {name for name in fab.namelist() if name.endswith(".py")}
    assert packed == _modules(ROOT)
    assert "pyproject.toml" in fab.namelist()
