"""What of a library's internals is missing: the check behind every wrapper of Flower.

pflarena leans on some of flwr 1.41's internals (its SuperNode loop, its executor factory,
its Grid's client, its CLI's credential store); each module that does lists what it uses and
refuses, naming what moved, when an upgrade changed it. This is the one place that looks.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping

__all__ = ["missing_internals"]


def missing_internals(wanted: Mapping[str, Iterable[str]]) -> list[str]:
    """``module.attribute`` for every attribute of ``wanted`` (module -> attribute names)
    that is not there, and ``module`` for a module that does not import."""
    missing = []
    for module_name, names in wanted.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        missing += [f"{module_name}.{name}" for name in names if not hasattr(module, name)]
    return missing
