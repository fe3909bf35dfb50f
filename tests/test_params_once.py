"""A method's parameters are written once: in its declaration's pydantic model.

A strategy takes that model (``Ditto(DittoParams(lambda_=0.5))``, or the same values as
keywords, which the base class validates through the model); no ``__init__`` repeats a
declared parameter with a default of its own, so a default can never differ between the
flag, the docs and the code.
"""

import ast
import inspect
from pathlib import Path

import pytest
from pydantic import ValidationError

from pflarena.core.methods import hyphenate
from pflarena.methods.ditto.strategy import Ditto, DittoParams
from pflarena.methods.fedavg.strategy import FedAvgParams
from pflarena.strategies import strategy_classes
from pflarena.strategies.base import PflStrategy

PACKAGE = Path(__file__).resolve().parents[1] / "pflarena"
#: the strategies' base and every method's server side
STRATEGIES = sorted(
    [
        *PACKAGE.glob("strategies/*.py"),
        *PACKAGE.glob("methods/*/strategy.py"),
        PACKAGE / "methods" / "fedavg" / "partial.py",
    ]
)
#: infrastructure arguments only (the run's training settings, the model's layout, where
#: state lives); a method's own settings have none here
MAX_INIT_DEFAULTS = 40


def _declared_names(cls: type[PflStrategy]) -> set[str]:
    fields = cls.declaration.params.model_fields
    return set(fields) | {hyphenate(name).replace("-", "_") for name in fields}


@pytest.mark.parametrize("name", sorted(strategy_classes()))
def test_no_init_repeats_a_declared_parameter(name):
    cls = strategy_classes()[name]
    declared = _declared_names(cls)
    for klass in cls.__mro__:
        if klass is PflStrategy or "__init__" not in vars(klass):
            continue
        repeated = declared & set(inspect.signature(klass.__init__).parameters)
        assert not repeated, f"{klass.__name__}.__init__ repeats {sorted(repeated)}"


def test_the_strategies_init_defaults_are_few():
    """An AST count over every strategy module: defaults of ``__init__`` arguments."""
    count = 0
    assert len(STRATEGIES) > 31
    for path in STRATEGIES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                count += len(node.args.defaults)
                count += sum(d is not None for d in node.args.kw_defaults)
    assert count <= MAX_INIT_DEFAULTS, f"{count} defaults in strategies' __init__ methods"


def test_params_as_a_model_or_as_keywords():
    assert Ditto(DittoParams(lambda_=0.5)).params.lambda_ == 0.5
    assert Ditto(lambda_=0.5).params == DittoParams(lambda_=0.5)
    assert Ditto().params == DittoParams()  # every default from the model
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        Ditto(lambda_=-1)
    with pytest.raises(ValidationError, match="lamda"):
        Ditto(lamda=1)
    with pytest.raises(TypeError, match="either as a DittoParams or as keywords"):
        Ditto(DittoParams(), lambda_=1)
    with pytest.raises(TypeError, match="takes DittoParams, got FedAvgParams"):
        Ditto(FedAvgParams())


def test_a_method_written_to_take_keywords_only_is_refused_with_the_way_to_fix_it():
    from pflarena.server.build import parse_config
    from pflarena.strategies.base import StrategySetup

    class OldStyle(Ditto):
        def __init__(self, *, lambda_: float = 0.1, **kwargs) -> None:
            super().__init__(lambda_=lambda_, **kwargs)

    setup = StrategySetup(cfg=parse_config({"strategy": "ditto"}), params=DittoParams())
    with pytest.raises(TypeError, match=r"must take the method's parameters as `params`"):
        OldStyle.from_setup(setup)
    assert Ditto.from_setup(setup).params == DittoParams()
