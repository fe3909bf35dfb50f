"""How a client finds a method's local solver: through the module path a message names.

A solver module defines ``train(job) -> (records, metrics)`` and ``evaluate(job) ->
metrics``, and, for the cross-evaluation (``cross-eval-clients``),
``personalized_model(job) -> nn.Module``: the model ``evaluate`` tests as personalized, in the
run's architecture. Every message carries the ``solver`` its strategy's declaration names; the
ClientApp imports it with :func:`load_solver`, which accepts the built-in methods' solvers
(``pflarena/methods/<name>/solver.py``), modules
of the top-level packages that declare methods as ``pflarena.methods`` entry points in this
client's environment, and the plugin modules named in ``PFLARENA_PLUGINS`` (and nothing
else: a server cannot make a client import arbitrary code). The entry points are read, not
loaded: the client side imports no strategy.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from flwr.app import ArrayRecord
from torch import nn

from pflarena.client.job import ClientJob
from pflarena.core.methods import ENTRY_POINT_GROUP, PLUGINS_ENV, plugin_modules, plugin_packages

__all__ = ["Solver", "SolverError", "load_solver"]

#: A built-in method's solver: ``pflarena/methods/<name>/solver.py`` (a message naming any
#: other module of pflarena, its strategies' above all, is refused).
_BUILTIN_SOLVER = re.compile(r"pflarena\.methods\.[a-z][a-z0-9_]*\.solver")


class SolverError(ValueError):
    """A message names a solver this client cannot or may not load."""


@dataclass(frozen=True)
class Solver:
    """A method's client side: what it does with a train and an evaluate message."""

    train: Callable[[ClientJob], tuple[dict[str, ArrayRecord], dict]]
    """Returns the reply's ArrayRecords by record key, and its metrics."""
    evaluate: Callable[[ClientJob], dict]
    personalized_model: Callable[[ClientJob], nn.Module] | None = None
    """The model ``evaluate`` tests as personalized; ``None``: no cross-evaluation."""


def _allowed(module_name: str) -> bool:
    if _BUILTIN_SOLVER.fullmatch(module_name) or module_name in plugin_modules():
        return True
    top = module_name.split(".")[0]
    return top in plugin_packages()


@lru_cache(maxsize=64)
def load_solver(module_name: str) -> Solver:
    """The solver in ``module_name``; raise :class:`SolverError` saying what is wrong."""
    if not _allowed(module_name):
        raise SolverError(
            f"solver module {module_name!r} is neither a built-in method's solver "
            "(pflarena.methods.<name>.solver), nor in a package that "
            f"declares {ENTRY_POINT_GROUP} entry points, nor listed in {PLUGINS_ENV} on this "
            "client (install the method's package where the ClientApps run)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SolverError(f"cannot import solver module {module_name!r}: {exc}") from exc
    missing = [name for name in ("train", "evaluate") if not callable(getattr(module, name, None))]
    if missing:
        raise SolverError(f"solver module {module_name!r} lacks {', '.join(missing)}()")
    return Solver(
        train=module.train,
        evaluate=module.evaluate,
        personalized_model=getattr(module, "personalized_model", None),
    )
