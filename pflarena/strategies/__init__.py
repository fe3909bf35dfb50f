"""The strategies, one module per method, and the list of declared methods.

Adding a method: write ``strategies/<method>.py`` (the strategy class with its
``declaration``) and ``client/solvers/<method>.py``, and add the class to
:data:`BUILTIN_STRATEGIES` below. Methods outside the package are loaded from the modules
named in ``PFLARENA_PLUGINS`` (comma-separated); each lists its strategy classes in a
module attribute ``PFLARENA_STRATEGIES``.
"""

from __future__ import annotations

import importlib

from pflarena.core.methods import PLUGINS_ENV, MethodDeclaration, plugin_modules
from pflarena.strategies.apfl import APFL
from pflarena.strategies.base import PflStrategy
from pflarena.strategies.cfl import CFL
from pflarena.strategies.dapfl import DapFL
from pflarena.strategies.ditto import Ditto
from pflarena.strategies.fedala import FedALA
from pflarena.strategies.fedamp import FedAMP
from pflarena.strategies.fedavg import FedAvg
from pflarena.strategies.fedavg_ft import FedAvgFT
from pflarena.strategies.fedbabu import FedBABU
from pflarena.strategies.feddyn import FedDyn
from pflarena.strategies.fedem import FedEM
from pflarena.strategies.fedfomo import FedFomo
from pflarena.strategies.fedmgda import FedMGDA
from pflarena.strategies.fedper import FedPer
from pflarena.strategies.fedpg import FedPG
from pflarena.strategies.fedprox import FedProx
from pflarena.strategies.fedrep import FedRep
from pflarena.strategies.ifca import IFCA
from pflarena.strategies.lgfedavg import LGFedAvg
from pflarena.strategies.local import Local
from pflarena.strategies.page import Page
from pflarena.strategies.perfedavg import PerFedAvg
from pflarena.strategies.pfedgt import PFedGT
from pflarena.strategies.pfedhn import PFedHN
from pflarena.strategies.pfedme import PFedMe
from pflarena.strategies.pfedsv import PFedSV
from pflarena.strategies.ppfl import PPFL
from pflarena.strategies.scaffold import Scaffold

__all__ = ["BUILTIN_STRATEGIES", "PLUGINS_ENV", "declarations", "strategy_classes"]

#: One entry per built-in method, in the order `pflarena methods` lists them.
BUILTIN_STRATEGIES: tuple[type[PflStrategy], ...] = (
    PFedGT,
    PFedSV,
    Local,
    FedAvg,
    FedAvgFT,
    FedProx,
    Ditto,
    FedFomo,
    FedPG,
    FedMGDA,
    PPFL,
    IFCA,
    FedEM,
    Page,
    PFedMe,
    PerFedAvg,
    APFL,
    FedAMP,
    FedALA,
    PFedHN,
    Scaffold,
    FedDyn,
    CFL,
    DapFL,
    # Baselines II, split models (issue 17)
    FedPer,
    FedRep,
    LGFedAvg,
    FedBABU,
)

# Baselines II, part B: split models (Fed-ROD, FedRecon, SplitGP).
from pflarena.strategies.fedrecon import FedRecon  # noqa: E402
from pflarena.strategies.fedrod import FedRoD  # noqa: E402
from pflarena.strategies.splitgp import SplitGP  # noqa: E402

BUILTIN_STRATEGIES += (FedRoD, FedRecon, SplitGP)


def strategy_classes() -> dict[str, type[PflStrategy]]:
    """Every declared method's strategy class by method name: built-ins, then plugins.

    Raises ValueError when two classes declare the same name or a plugin declares none.
    """
    classes: list[type[PflStrategy]] = list(BUILTIN_STRATEGIES)
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
