"""Methods are entry points of the group ``pflarena.methods``: the built-ins', an installed
out-of-tree package's, and the fallback of an install whose metadata predates them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import tomllib

import pflarena.core.methods as methods
from pflarena.client.solvers import _allowed
from pflarena.core.methods import ENTRY_POINT_GROUP, MethodDeclaration, choose_builtins
from pflarena.methods.fedavg.strategy import FedAvg
from pflarena.strategies import builtin_strategies, strategy_classes

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "pflarena-hello"


def _table() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["entry-points"][ENTRY_POINT_GROUP]


def _env(*paths: Path) -> dict[str, str]:
    """This environment with ``paths`` first on PYTHONPATH, then this checkout, and the
    reinstall warning not yet given."""
    env = dict(os.environ)
    env.pop(methods._WARNED_ENV, None)
    env.pop("PFLARENA_PLUGINS", None)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT), env.get("PYTHONPATH", "")])
    return env


# --------------------------------------------------------------------------- built-ins
def test_the_builtins_are_the_pyproject_tables_entry_points_in_its_order():
    table = _table()
    assert [c.declaration.name for c in builtin_strategies()] == list(table)
    assert [f"{c.__module__}:{c.__qualname__}" for c in builtin_strategies()] == list(
        table.values()
    )


def test_each_builtin_is_a_folder_of_its_own():
    """``pflarena/methods/<name>/`` (the name with ``_`` for ``-``) holds the method's
    strategy; its solver is a folder's ``solver.py``; every folder there is a method."""
    folders = {
        path.name
        for path in (ROOT / "pflarena" / "methods").iterdir()
        if path.is_dir() and not path.name.startswith("__")
    }
    registered = set()
    for cls in builtin_strategies():
        folder = cls.declaration.name.replace("-", "_")
        registered.add(folder)
        assert cls.__module__ == f"pflarena.methods.{folder}.strategy", cls
        solver = cls.declaration.solver
        assert solver.startswith("pflarena.methods.") and solver.endswith(".solver"), solver
        assert (ROOT / solver.replace(".", "/")).with_suffix(".py").is_file(), solver
    assert folders == registered


def _as_setuptools_writes(table: dict[str, str]) -> list[EntryPoint]:
    return [EntryPoint(n, v, ENTRY_POINT_GROUP) for n, v in sorted(table.items())]


def test_an_install_with_the_entry_points_uses_them_in_the_tables_order():
    table = _table()
    installed = _as_setuptools_writes(table)  # sorted by name, as in entry_points.txt
    chosen, problem = choose_builtins(installed, (ROOT / "pyproject.toml", table))
    assert problem is None
    assert [ep.name for ep in chosen] == list(table)
    assert all(any(ep is mine for mine in installed) for ep in chosen)


def test_an_install_older_than_the_entry_points_falls_back_to_the_table():
    table = _table()
    chosen, problem = choose_builtins([], (ROOT / "pyproject.toml", table))
    assert [(ep.name, ep.value) for ep in chosen] == list(table.items())
    assert "\n" not in problem and "has no 'pflarena.methods' entry points" in problem
    assert "Reinstall pflarena" in problem and str((ROOT / "pyproject.toml").resolve()) in problem


def test_an_install_missing_a_method_added_since_says_which():
    table = _table()
    installed = _as_setuptools_writes({k: v for k, v in table.items() if k != "splitgp"})
    chosen, problem = choose_builtins(installed, (ROOT / "pyproject.toml", table))
    assert [ep.name for ep in chosen] == list(table)
    assert "missing: splitgp; extra: -" in problem


def test_without_metadata_or_table_no_method_is_guessed():
    with pytest.raises(RuntimeError, match="declares no methods"):
        choose_builtins([], None)
    installed = _as_setuptools_writes(_table())
    assert choose_builtins(installed, None) == (installed, None)


def _fake_pflarena_metadata(where: Path, table: dict[str, str] | None) -> Path:
    """A pflarena .dist-info, with or without the entry points, ahead of the installed one."""
    info = where / "pflarena-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pflarena\nVersion: 0.1.0\n")
    if table is not None:
        lines = [f"{n} = {v}" for n, v in sorted(table.items())]
        (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n" + "\n".join(lines) + "\n")
    return where


LIST_METHODS = "from pflarena.strategies import declarations; print(','.join(declarations()))"


def test_both_installs_list_the_same_methods_and_only_the_old_one_warns(tmp_path):
    """The real lookups: a pflarena whose metadata carries the entry points (as a wheel or a
    fresh ``pip install -e .`` writes them) and one whose metadata predates them."""
    table = _table()
    outputs = {}
    for case, entries in (("new", table), ("old", None)):
        site = _fake_pflarena_metadata(tmp_path / case, entries)
        result = subprocess.run(
            [sys.executable, "-c", LIST_METHODS],
            capture_output=True, text=True, timeout=300, env=_env(site), cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        outputs[case] = result
    assert outputs["new"].stdout.strip() == outputs["old"].stdout.strip() == ",".join(table)
    assert "Reinstall pflarena" not in outputs["new"].stderr
    warnings = [line for line in outputs["old"].stderr.splitlines() if "Reinstall" in line]
    assert len(warnings) == 1 and "has no 'pflarena.methods' entry points" in warnings[0]


# --------------------------------------------------------------------------- plug-ins
class OutsideAvg(FedAvg):
    declaration = MethodDeclaration(
        name="outside-avg",
        kind="plugin",
        reference="tests/test_entry_points.py",
        summary="a solver outside its package",
        solver="json.tool",
    )


def _installed_plugin(monkeypatch, *entries: tuple[str, str]) -> None:
    """Entry points of a package that is not pflarena, as the metadata scan would give."""
    eps = tuple(EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in entries)
    monkeypatch.setattr(methods, "_installed", lambda: eps)


def test_an_installed_plugin_is_a_method_and_its_package_a_solver_source(monkeypatch):
    _installed_plugin(monkeypatch, ("toy-avg", "pflarena_test_methods:ToyAvg"))
    assert "toy-avg" in strategy_classes()
    assert methods.plugin_packages() == {"pflarena_test_methods"}
    assert _allowed("pflarena_test_methods") and _allowed("pflarena.methods.fedavg.solver")
    assert not _allowed("os") and not _allowed("pflarena.cli")
    # a built-in method's strategy or maths is not a solver
    assert not _allowed("pflarena.methods.fedavg.strategy")
    assert not _allowed("pflarena.methods.page.utility")


def test_a_plugin_is_refused_when_its_name_or_solver_disagrees(monkeypatch):
    _installed_plugin(monkeypatch, ("other-name", "pflarena_test_methods:ToyAvg"))
    with pytest.raises(ValueError, match="the entry point's name must be the method's"):
        strategy_classes()
    _installed_plugin(monkeypatch, ("outside-avg", f"{__name__}:OutsideAvg"))
    with pytest.raises(ValueError, match=r"solver 'json.tool' is outside the package"):
        strategy_classes()
    _installed_plugin(monkeypatch, ("nope", "pflarena_no_such_module:Nope"))
    with pytest.raises(ValueError, match="cannot be loaded"):
        strategy_classes()


@pytest.mark.slow
def test_an_installed_method_package_runs_through_the_cli(tmp_path):
    """tests/fixtures/pflarena-hello, a package with one entry-point line, installed into a
    temporary directory (its .dist-info found on PYTHONPATH, nothing in this environment),
    runs two rounds on digits through ``python -m pflarena run``: the server loads its
    strategy from the entry point, the clients accept its solver from its package."""
    src, site = tmp_path / "src", tmp_path / "site"
    shutil.copytree(FIXTURE, src)  # the build writes build/ and *.egg-info beside the sources
    try:
        install = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
             "--no-index", "--no-cache-dir", "--target", str(site), str(src)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert install.returncode == 0, install.stderr
        (info,) = site.glob("pflarena_hello-*.dist-info")
        assert (
            "hello-avg = pflarena_hello.strategy:HelloAvg"
            in (info / "entry_points.txt").read_text()
        )
        env = _env(site)
        listed = subprocess.run(
            [sys.executable, "-m", "pflarena", "methods", "hello-avg"],
            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert "FedAvg under another name" in listed.stdout
        out = tmp_path / "run"
        run = subprocess.run(
            [sys.executable, "-m", "pflarena", "run", "--strategy", "hello-avg",
             "--engine", "inprocess", "--dataset", "digits", "--num-clients", "3",
             "--num-rounds", "2", "--output-dir", str(out)],
            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert (summary["strategy"], summary["status"]) == ("hello-avg", "completed")
        rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
        assert [r["train"]["clients"] for r in rounds[1:]] == [3, 3]
        accuracy = [r["evaluation"]["personalized"]["mean"] for r in rounds]
        assert accuracy[-1] > accuracy[0] + 0.2
    finally:
        shutil.rmtree(site, ignore_errors=True)
        shutil.rmtree(src, ignore_errors=True)
