"""The package's layering (docs/architecture.md, "Layout and layering"): no import cycle
between pflarena's modules, each subpackage imports only the layers below it, and each
imports on its own in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pflarena"

#: What each subpackage may import besides itself (and the top-level ``pflarena``).
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    # maths more than one method uses (the DDPG agent, the min-norm QP, K canonical models,
    # split heads): both sides import it
    "algorithms": {"core"},
    "strategies": {"core", "algorithms"},  # the strategies' shared base, no method
    "client": {"core", "algorithms"},  # an edge image holds the ClientApp alone: no strategy code
    # one package per method (methods/<name>/): its strategy above the strategies' base, its
    # solver above the client's, and, per file, a solver never reaching a strategy (below)
    "methods": {"core", "algorithms", "strategies", "client"},
    "server": {"core", "strategies"},
    "runtime": {"core", "strategies", "server"},
    "deploy": {"core", "runtime"},
    "reporting": {"core", "server"},  # reads runs' results files; nothing below imports it
    "cli": {"core", "strategies", "server", "runtime", "deploy", "reporting"},
    "__main__": {"cli"},  # `python -m pflarena`: the command
}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the pflarena modules it imports, at the top or inside a function (both
    run some time; a cycle through a function-level import is still a cycle)."""
    modules = _modules()

    def known(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from pflarena.cli import run` imports the module pflarena.cli.run
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            else:
                continue
            for target in targets:
                if target == "pflarena" or target.startswith("pflarena."):
                    graph[name].add(known(target))
        graph[name].discard(name)
    return graph


@lru_cache(maxsize=1)
def _package_graph() -> dict[str, set[str]]:
    """:func:`import_graph`, built once for the tests that only read it."""
    return import_graph()


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_the_checks_find_a_cycle_and_an_upward_import() -> None:
    graph = {"pflarena.core.a": {"pflarena.cli.b"}, "pflarena.cli.b": {"pflarena.core.a"}}
    assert cycles(graph) == [["pflarena.cli.b", "pflarena.core.a"]]
    assert cycles({"pflarena.core.a": set(), "pflarena.cli.b": {"pflarena.core.a"}}) == []


def test_no_import_cycle() -> None:
    assert cycles(_package_graph()) == []


def test_each_layer_imports_only_the_layers_below() -> None:
    graph = _package_graph()
    assert {_layer(m) for m in graph} - {""} == set(ALLOWED), "a subpackage ALLOWED misses"
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if _layer(module)
        and _layer(target)
        and _layer(target) != _layer(module)
        and _layer(target) not in ALLOWED[_layer(module)]
    )
    assert upward == []


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_on_its_own(package: str) -> None:
    """Every module of the package (but ``__main__``, which runs), in a fresh interpreter
    whose first import is the package's."""
    modules = sorted(
        m for m in _package_graph() if _layer(m) == package and not m.endswith(".__main__")
    )
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    result = subprocess.run(
        [sys.executable, "-c", code, *modules], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]


#: What a method's parameters module never imports, not even through the modules it imports:
#: the command imports it to check a run config (pflarena.cli.options.validate_run).
HEAVY_FOR_PARAMS = ("torch", "flwr", "pflarena.strategies", "pflarena.server", "pflarena.client")


@pytest.mark.parametrize(
    "path",
    sorted(PACKAGE.glob("methods/*/params.py")),
    ids=lambda path: path.parent.name,
)
def test_a_methods_parameters_import_no_torch_flower_or_strategy(path: Path) -> None:
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(','.join(m for m in {HEAVY_FOR_PARAMS!r} if m in sys.modules) or 'none')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "none", f"{module} imports {result.stdout.strip()}"


def test_a_methods_package_imports_nothing() -> None:
    """``pflarena/methods/<name>/__init__.py`` imports nothing: importing one of its modules
    brings that module alone."""
    inits = [PACKAGE / "methods" / "__init__.py", *PACKAGE.glob("methods/*/__init__.py")]
    assert len(inits) > 1
    for path in inits:
        tree = ast.parse(path.read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)], path


def test_the_console_script_and_app_components_resolve() -> None:
    """``pflarena`` (pyproject's [project.scripts]) and the Flower App's components."""
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    refs = [
        project["project"]["scripts"]["pflarena"],
        *project["tool"]["flwr"]["app"]["components"].values(),
    ]
    assert refs == ["pflarena.cli:main", "pflarena.server.app:app", "pflarena.client.app:app"]
    code = (
        "import importlib, sys\n"
        "for ref in sys.argv[1:]:\n"
        "    module, attr = ref.split(':')\n"
        "    assert getattr(importlib.import_module(module), attr) is not None, ref\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *refs], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]


def _server_side(module: str) -> bool:
    """A module a client never needs: the strategies' base, a method's strategy, and the
    layers above them."""
    top = ("strategies", "server", "runtime", "deploy", "reporting", "cli")
    return _layer(module) in top or (
        _layer(module) == "methods" and module.rsplit(".", 1)[-1] == "strategy"
    )


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for succ in graph[todo.pop()] - seen:
            seen.add(succ)
            todo.append(succ)
    return seen


SOLVERS = sorted(PACKAGE.glob("methods/*/solver.py"))


@pytest.mark.parametrize("path", SOLVERS, ids=lambda path: path.parent.name)
def test_a_methods_solver_reaches_no_strategy(path: Path) -> None:
    """Every module a method's solver imports, and every module those import (at the top or
    inside a function), is client-side: the ClientApp of an edge image loads it alone."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    reached = sorted(m for m in _reached(_package_graph(), module) if _server_side(m))
    assert reached == [], f"{module} reaches {reached}"


def test_the_client_side_checks_see_a_strategy() -> None:
    graph = {
        "pflarena.methods.a.solver": {"pflarena.methods.a.maths"},
        "pflarena.methods.a.maths": {"pflarena.methods.b.strategy"},
        "pflarena.methods.b.strategy": {"pflarena.strategies.base"},
        "pflarena.strategies.base": set(),
    }
    reached = _reached(graph, "pflarena.methods.a.solver")
    assert sorted(m for m in reached if _server_side(m)) == [
        "pflarena.methods.b.strategy",
        "pflarena.strategies.base",
    ]


def test_the_clientapp_and_every_solver_load_no_strategy() -> None:
    """In a fresh interpreter: the ClientApp and every built-in solver, then no module of
    the strategies, the server or a method's strategy is loaded."""
    modules = [".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in SOLVERS]
    assert len(modules) >= 29
    code = (
        "import importlib, sys\n"
        "for m in sys.argv[1:]:\n"
        "    importlib.import_module(m)\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('pflarena.') and "
        "(m.split('.')[1] in ('strategies', 'server', 'runtime', 'cli') or "
        "m.endswith('.strategy')))) or 'none')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "pflarena.client.app", *modules],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "none"
