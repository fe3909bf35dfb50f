"""How a method declares itself: its name, reference, parameters and what it needs.

A method (one of the papers' or a baseline) is a strategy class, a client solver module
and a :class:`MethodDeclaration`, written once next to the strategy. Everything else comes
from the declaration: the run-config keys (``<method>.<param>``) and their validation,
``pflarena run`` flags, the defaults in ``[tool.flwr.app.config]`` (a test keeps them in
sync), ``pflarena methods`` and ``docs/methods.md``.

This module is torch-free and knows no method. Methods are found as entry points of the
group :data:`ENTRY_POINT_GROUP` (``pflarena.methods``), the built-ins' in pflarena's own
``pyproject.toml`` and an out-of-tree method's in its package's: one line each,
``<method name> = "<module>:<StrategyClass>"``. The strategies package loads them
(:mod:`pflarena.strategies`), the run config is validated against them on the server, and a
client accepts a solver module of a package that declares such an entry point.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict

__all__ = [
    "ENTRY_POINT_GROUP",
    "PLUGINS_ENV",
    "TRAINING_SETTINGS",
    "MethodDeclaration",
    "MethodParams",
    "builtin_entry_points",
    "hyphenate",
    "plugin_entry_points",
    "plugin_modules",
    "plugin_packages",
]

#: The common local-training settings of a run. A method declares which of them its
#: solver honours; a run that sets one it ignores is refused.
TRAINING_SETTINGS: tuple[str, ...] = (
    "local-epochs",
    "batch-size",
    "lr",
    "momentum",
    "weight-decay",
    "lr-milestones",
    "lr-gamma",
)


# ---------------------------------------------------------------- registration
# What an entry point names. As in pytest's plug-in registry (pluggy's
# load_setuptools_entrypoints), the entry point's *name* is the registry key, the method's
# name, known without importing anything, and ``ep.load()`` gives the registered object as it
# is. As in timm's model registry, that object is the one thing the key builds: the method's
# strategy class, which carries its MethodDeclaration, which names its solver module. Not a
# module whose import registers the method as a side effect (timm's decorators): the server
# would then have to import every plug-in to learn a name, and could not check that a name
# and what it registers agree (they must: ``fedavg = "...:FedAvg"`` with FedAvg's
# declaration named "fedavg"). Not the declaration object: the server needs the class, and a
# declaration does not lead back to it. A client loads no entry point: it reads their
# module paths only, to accept the solvers of the packages that declare methods.

#: The entry-point group every method is registered in, the built-ins included.
ENTRY_POINT_GROUP = "pflarena.methods"

#: The distribution whose entry points are the built-in methods.
_OWN_DISTRIBUTION = "pflarena"

#: The project's pyproject.toml, shipped inside the package (a link to the source tree's
#: file in a clone, package data in a wheel), or beside it in a laid-out Flower App.
_PACKAGE = Path(__file__).resolve().parents[1]
_SHIPPED_PYPROJECTS = (_PACKAGE / "_app" / "pyproject.toml", _PACKAGE.parent / "pyproject.toml")

_log = logging.getLogger("pflarena")

#: Environment variable naming plug-in modules (comma-separated) that declare more methods:
#: the alias of entry points for modules that are importable but not installed (a test
#: suite's, a notebook's). A module listed there is read as if each class in its
#: ``PFLARENA_STRATEGIES`` were an entry point; the server loads those strategies, a client
#: accepts the module itself as a solver. Like ``PYTEST_PLUGINS`` beside pytest's
#: ``pytest11`` entry points.
PLUGINS_ENV = "PFLARENA_PLUGINS"


def plugin_modules() -> list[str]:
    """The module names in ``PFLARENA_PLUGINS``."""
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def _distribution_name(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return _normalized_name(dist) if dist is not None else ""


@lru_cache(maxsize=256)
def _normalized_name(dist: Any) -> str:
    # once per distribution: each read of its metadata parses the file again (31 entry
    # points of one distribution, read by every listing, cost a quarter of a second)
    return (dist.metadata["Name"] or "").lower().replace("_", "-")


@lru_cache(maxsize=8)
def _group_entry_points(path: tuple[str, ...]) -> tuple[EntryPoint, ...]:
    # One scan of the installed distributions per sys.path (the first one costs ~0.1-0.4 s).
    return tuple(entry_points(group=ENTRY_POINT_GROUP))


def _installed() -> tuple[EntryPoint, ...]:
    return _group_entry_points(tuple(sys.path))


def plugin_entry_points() -> list[EntryPoint]:
    """The ``pflarena.methods`` entry points of installed distributions other than pflarena:
    the out-of-tree methods, in the order the distributions are found."""
    return [ep for ep in _installed() if _distribution_name(ep) != _OWN_DISTRIBUTION]


def plugin_packages() -> set[str]:
    """The top-level packages that declare out-of-tree methods; a client accepts solver
    modules in them. pflarena itself is not one: its solvers are ``pflarena.client.solvers``."""
    packages = {ep.value.split(":")[0].strip().split(".")[0] for ep in plugin_entry_points()}
    return packages - {_OWN_DISTRIBUTION}


def _shipped_table() -> tuple[Path, dict[str, str]] | None:
    """The ``pflarena.methods`` table of the pyproject.toml that ships with this package, and
    where it is; None where no such file holds one."""
    for path in _SHIPPED_PYPROJECTS:
        if not path.is_file():
            continue
        project = tomllib.loads(path.read_text()).get("project", {})
        table = project.get("entry-points", {}).get(ENTRY_POINT_GROUP)
        if project.get("name") == _OWN_DISTRIBUTION and table:
            return path, dict(table)
    return None  # e.g. a Flower App whose manifest was rewritten without the table


def choose_builtins(
    installed: list[EntryPoint], shipped: tuple[Path, dict[str, str]] | None
) -> tuple[list[EntryPoint], str | None]:
    """The built-in methods' entry points, and why they are not the metadata's (or None).

    They are those of pflarena's installed metadata (``installed``), in the order of the
    shipped pyproject.toml's table (setuptools writes entry points sorted by name; the
    catalogue's order, seed papers first, is the table's). Where the metadata lacks the group
    (pflarena installed before methods were entry points) or lists other methods than the
    table (a method added since ``pip install -e .``), the table is used, and the reason
    returned asks to reinstall.
    """
    if shipped is None:  # no pyproject.toml beside the code: the metadata as it is
        if not installed:
            raise RuntimeError(
                f"pflarena declares no methods: its installed metadata has no "
                f"{ENTRY_POINT_GROUP!r} entry points and no pyproject.toml ships with "
                f"{_PACKAGE}; reinstall pflarena"
            )
        return list(installed), None
    path, table = shipped
    if {ep.name: ep.value for ep in installed} == table:
        by_name = {ep.name: ep for ep in installed}
        return [by_name[name] for name in table], None
    if not installed:
        why = f"has no {ENTRY_POINT_GROUP!r} entry points (an install older than them)"
    else:
        names = {ep.name for ep in installed}
        why = (
            f"lists other {ENTRY_POINT_GROUP!r} entry points than its pyproject.toml (missing: "
            f"{', '.join(sorted(set(table) - names)) or '-'}; extra: "
            f"{', '.join(sorted(names - set(table))) or '-'}; or other targets)"
        )
    problem = (
        f"pflarena: the installed package's metadata {why}; the built-in methods are read "
        f"from {path.resolve()}. Reinstall pflarena (from a clone: pip install -e .)"
    )
    return [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in table.items()], problem


#: Set once the reinstall warning was given, so that the processes a command starts (the
#: simulation, the ServerApp) do not repeat it.
_WARNED_ENV = "PFLARENA_REINSTALL_WARNED"


@lru_cache(maxsize=1)
def builtin_entry_points() -> tuple[EntryPoint, ...]:
    """The built-in methods' entry points (:func:`choose_builtins` on this install); a
    one-line warning where the installed metadata is older than the code."""
    own = [ep for ep in _installed() if _distribution_name(ep) == _OWN_DISTRIBUTION]
    chosen, problem = choose_builtins(own, _shipped_table())
    if problem and not os.environ.get(_WARNED_ENV):
        _log.warning(problem)
        os.environ[_WARNED_ENV] = "1"
    return tuple(chosen)


def hyphenate(name: str) -> str:
    """``personal_epochs`` -> ``personal-epochs``; a trailing ``_`` (``lambda_``) is dropped."""
    return name.rstrip("_").replace("_", "-")


class MethodParams(BaseModel):
    """Base class of a method's parameters: a pydantic model with defaults, ranges and docs.

    Fields use underscores; the run config uses the hyphenated names under the method's
    namespace (``Ditto``'s ``personal_epochs`` is ``ditto.personal-epochs``). Give every
    field a one-line ``description``: it becomes the flag's help and the docs.
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,  # no NaN or infinity in any setting
        populate_by_name=True,
        alias_generator=hyphenate,
    )

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The hyphenated keys (without the method prefix) and their default values."""
        return cls().model_dump(by_alias=True)

    def run_problems(self, cfg: Any) -> list[str]:
        """Problems of these values in the context of a whole run (``cfg``: its RunConfig).

        Checked before anything starts, for the run's own method only; override for rules
        that involve common keys (pFedGT: one γ_i per client).
        """
        return []


@dataclass(frozen=True)
class MethodDeclaration:
    """Everything the platform needs to know about a method.

    Parameters
    ----------
    name
        The value of ``strategy=`` and the prefix of the method's run-config keys.
    kind
        ``"paper"`` for the five seed papers, ``"baseline"`` for what they compare against,
        ``"plugin"`` for out-of-tree methods (entry points of other packages, or
        modules named in ``PFLARENA_PLUGINS``).
    reference
        The paper (authors, title, venue, year) or other source.
    summary
        One line saying what the method does.
    solver
        The client solver: a module path whose ``train(job)`` and ``evaluate(job)`` answer
        this method's messages (``pflarena.client.solvers.<name>`` for built-in methods; an
        out-of-tree method's lies in the top-level package of its strategy).
    params
        The method's parameters; :class:`MethodParams` itself when it has none.
    global_model
        Whether the method has a global model to report global accuracy for.
    default_fraction_train
        Fraction of clients sampled per round when the run leaves ``fraction-train`` at 0.
    honours
        The :data:`TRAINING_SETTINGS` its solver uses; a run that sets another is refused.
    needs_validation
        The solver needs each client's validation split (``validation-fraction`` > 0).
    needs_server_data
        The strategy needs a server-held dataset (``server-fraction`` > 0).
    """

    name: str
    kind: Literal["paper", "baseline", "plugin"]
    reference: str
    summary: str
    solver: str
    params: type[MethodParams] = MethodParams
    global_model: bool = True
    default_fraction_train: float = 1.0
    honours: frozenset[str] = frozenset(TRAINING_SETTINGS)
    needs_validation: bool = False
    needs_server_data: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.honours) - set(TRAINING_SETTINGS)
        if unknown:
            raise ValueError(
                f"method {self.name!r} honours unknown settings {sorted(unknown)}; "
                f"known: {', '.join(TRAINING_SETTINGS)}"
            )
        if not 0.0 < self.default_fraction_train <= 1.0:
            raise ValueError(
                f"method {self.name!r}: default_fraction_train must be in (0, 1], "
                f"got {self.default_fraction_train}"
            )
        if not self.name or any(ch in self.name for ch in ". =\"'"):
            raise ValueError(f"method name {self.name!r} must be non-empty, without . = or quotes")

    def defaults(self) -> dict[str, Any]:
        """The method's run-config keys (``<name>.<param>``) and their defaults."""
        return {f"{self.name}.{key}": value for key, value in self.params.defaults().items()}

    def param_docs(self) -> list[tuple[str, Any, str, str]]:
        """``(key, default, type, description)`` of every parameter, in declaration order."""
        rows = []
        for field_name, field in self.params.model_fields.items():
            annotation = field.annotation
            type_name = getattr(annotation, "__name__", None) or str(annotation)
            rows.append(
                (
                    f"{self.name}.{hyphenate(field_name)}",
                    field.default,
                    type_name.replace("typing.", ""),
                    _with_bounds(field.description or "", field.metadata),
                )
            )
        return rows


def _with_bounds(description: str, metadata: list[Any]) -> str:
    bounds = []
    for item in metadata:
        for attr, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None:
                bounds.append(f"{symbol} {value}")
    return f"{description} ({', '.join(bounds)})" if bounds else description
