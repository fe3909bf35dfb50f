"""The strategies' shared base (:mod:`.base`, :mod:`.aggregation`, :mod:`.exchange`,
:mod:`.replies`, :mod:`.stacked`) and the registry of declared methods; each method's
strategy lives in its own package, ``pflarena/methods/<name>/strategy.py``.

Every method, built-in or out-of-tree, is an entry point of the group ``pflarena.methods``
(:data:`pflarena.core.methods.ENTRY_POINT_GROUP`): ``<name> = "<module>:<StrategyClass>"``,
the built-ins' in pflarena's ``pyproject.toml``, another package's in its own. Adding a
method: a folder ``methods/<name>/`` (docs/guide.md, "Adding a method"), one line in that
table, and the method's page. Modules named
in ``PFLARENA_PLUGINS`` (comma-separated), each listing its strategy classes in a module
attribute ``PFLARENA_STRATEGIES``, are the alias for code that is importable but not
installed.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from importlib.metadata import EntryPoint

from pflarena.core.methods import (
    ENTRY_POINT_GROUP,
    PLUGINS_ENV,
    MethodDeclaration,
    builtin_entry_points,
    plugin_entry_points,
    plugin_modules,
)
from pflarena.strategies.base import PflStrategy

__all__ = ["PLUGINS_ENV", "builtin_strategies", "declarations", "strategy_classes"]


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f" of {dist.metadata['Name']} {dist.version}" if dist is not None else ""
    return f"entry point {ep.name} = {ep.value!r} ({ENTRY_POINT_GROUP}{where})"


def _load(ep: EntryPoint) -> type[PflStrategy]:
    """The strategy class an entry point names; its declaration must carry the entry
    point's name."""
    try:
        cls = ep.load()
    except Exception as exc:  # an installed plug-in that does not import: say which
        raise ValueError(f"{_origin(ep)} cannot be loaded: {exc!r}") from exc
    if not (isinstance(cls, type) and issubclass(cls, PflStrategy)):
        raise ValueError(f"{_origin(ep)} names {cls!r}, not a PflStrategy subclass")
    declaration = getattr(cls, "declaration", None)
    if not isinstance(declaration, MethodDeclaration):
        raise ValueError(f"{_origin(ep)}: {cls.__name__} has no MethodDeclaration")
    if declaration.name != ep.name:
        raise ValueError(
            f"{_origin(ep)}: the entry point's name must be the method's, "
            f"{cls.__name__} declares {declaration.name!r}"
        )
    return cls


def _load_plugin(ep: EntryPoint) -> type[PflStrategy]:
    """An out-of-tree method: its solver must lie in its strategy's top-level package, the
    modules a client accepts as solvers (``client/solvers.py``)."""
    cls = _load(ep)
    package = ep.value.split(":")[0].strip().split(".")[0]
    solver = cls.declaration.solver
    if solver != package and not solver.startswith(package + "."):
        raise ValueError(
            f"{_origin(ep)}: solver {solver!r} is outside the package {package!r}; clients "
            f"accept an out-of-tree method's solver from its strategy's top-level package only"
        )
    return cls


@lru_cache(maxsize=1)
def builtin_strategies() -> tuple[type[PflStrategy], ...]:
    """One entry per built-in method, in the order `pflarena methods` lists them: the
    ``pflarena.methods`` entry points of pflarena's own pyproject.toml.

    Loaded on the first call, not when this package is imported: each method's strategy
    module imports this package's base (:mod:`pflarena.strategies.base`), so it may be the
    first module of a process to import it.
    """
    return tuple(_load(ep) for ep in builtin_entry_points())


def strategy_classes() -> dict[str, type[PflStrategy]]:
    """Every declared method's strategy class by method name: built-ins, then the entry
    points of other installed packages, then the ``PFLARENA_PLUGINS`` modules.

    Raises ValueError when two classes declare the same name, or a plug-in cannot be loaded
    or declares no method.
    """
    classes: list[type[PflStrategy]] = list(builtin_strategies())
    classes += [_load_plugin(ep) for ep in plugin_entry_points()]
    for module_name in plugin_modules():
        module = importlib.import_module(module_name)
        declared = getattr(module, "PFLARENA_STRATEGIES", None)
        if not declared:
            raise ValueError(
                f"plugin module {module_name!r} (from {PLUGINS_ENV}) has no PFLARENA_STRATEGIES"
            )
        classes += list(declared)
    by_name: dict[str, type[PflStrategy]] = {}
    for cls in classes:
        name = cls.declaration.name
        if name in by_name and by_name[name] is not cls:
            raise ValueError(f"two strategies declare the method {name!r}: {by_name[name]}, {cls}")
        by_name[name] = cls
    return by_name


def declarations() -> dict[str, MethodDeclaration]:
    """Every declared method by name (what the run config is validated against)."""
    return {name: cls.declaration for name, cls in strategy_classes().items()}
