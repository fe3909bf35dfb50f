"""The key convention (docs/guide.md, "Adding a method"): a name that a client solver writes
into its reply and its strategy reads (a metric, a record, an array or config entry in a
record) is a constant in ``pflarena/core/keys.py`` that both sides use, never a string
literal spelled twice.

The check reads the sources (no run): the names a solver writes as string literals, in the
forms the solvers use for their replies, and the string constants it names at module level
(a record or array prefix), must not appear as a string literal in the modules of its
strategy class (its own and those it inherits from). A reply built another way (a dict kept
in a variable and merged later, a helper's keyword arguments) escapes the check.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest

from pflarena.strategies import builtin_strategies

#: Constructors whose first argument, a dict display, names what a record carries.
RECORDS = {"ArrayRecord", "ConfigRecord", "MetricRecord", "RecordDict"}
#: The helpers whose result is a reply's metrics (client/common.py).
METRICS_HELPERS = {"train_metrics", "eval_metrics"}
METRICS = "metrics"  # the variable the solvers build their reply metrics in


def _is_keys_constant(node: ast.expr | None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "keys"
    )


def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_metrics(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == METRICS
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in METRICS_HELPERS
    )


def _is_client_state(target: ast.expr) -> bool:
    """``job.state[...]``: the client's own state, which no message carries."""
    return (
        isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Attribute)
        and target.value.attr == "state"
    )


def reply_literals(source: str) -> dict[str, int]:
    """The string literals a solver's source writes as names into what it sends back, with
    a line of each: the keys of a dict display that also has a ``keys.`` constant as a key,
    of one merged into the reply metrics (``metrics |= {...}``, ``train_metrics(...) |
    {...}``), of one given to a record's constructor (unless the record goes into the
    client's ``job.state``), the subscripts assigned in ``metrics[...] = ...``, and the
    values of module-level ``NAME = "..."`` constants (prefixes of record or array names)."""
    tree = ast.parse(source)
    found: dict[str, int] = {}
    for node in tree.body:
        name = _literal(node.value) if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if name is not None:
            found.setdefault(name, node.lineno)
    local = set()  # records stored in the client's state
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(_is_client_state(t) for t in node.targets):
            local.add(id(node.value))
    dicts: list[ast.Dict] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(_is_keys_constant(k) for k in node.keys):
            dicts.append(node)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.BitOr):
            if _is_metrics(node.target) and isinstance(node.value, ast.Dict):
                dicts.append(node.value)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            if _is_metrics(node.left) and isinstance(node.right, ast.Dict):
                dicts.append(node.right)
        elif isinstance(node, ast.Call) and id(node) not in local:
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name in RECORDS and node.args and isinstance(node.args[0], ast.Dict):
                dicts.append(node.args[0])
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if not (isinstance(target, ast.Subscript) and _is_metrics(target.value)):
                    continue
                if (name := _literal(target.slice)) is not None:
                    found.setdefault(name, target.lineno)
    for display in dicts:
        for key in display.keys:
            if (name := _literal(key)) is not None:
                found.setdefault(name, key.lineno)
    return found


def string_literals(source: str) -> set[str]:
    """Every string constant of a module but its docstrings."""
    tree = ast.parse(source)
    docstrings = set()
    scopes = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    for node in ast.walk(tree):
        if isinstance(node, scopes) and node.body and isinstance(node.body[0], ast.Expr):
            docstrings.add(id(node.body[0].value))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    }


def shared_literals(solver: str, strategies: list[str]) -> dict[str, int]:
    """The reply names ``solver`` writes as literals that a strategy module spells too."""
    spelled = set().union(*(string_literals(s) for s in strategies))
    return {name: line for name, line in reply_literals(solver).items() if name in spelled}


def test_the_check_finds_a_shared_literal_and_passes_constants() -> None:
    solver = (
        "PREFIX = 'cluster'\n"
        "def train(job):\n"
        "    metrics = train_metrics(job, 0.0, 1)\n"
        "    metrics |= {'m-one': 1, keys.M_TWO: 2}\n"
        "    metrics['m-three'] = 3\n"
        "    job.state[KEY] = ArrayRecord({'kept': Array(x)})\n"
        "    out = train_metrics(job, 0.0, 1) | {'m-four': 4}\n"
        "    kwargs = job.train_kwargs() | {'epochs': 2}\n"
        "    return {keys.ARRAYS: a, 'extra': ArrayRecord({'peers': p})}, metrics\n"
    )
    found = {"cluster", "m-one", "m-three", "m-four", "extra", "peers"}
    assert set(reply_literals(solver)) == found
    strategy = (
        '"""Reads m-one."""\n'
        "CLUSTER_PREFIX = 'cluster'\n"
        "def aggregate(replies):\n"
        "    return [(r['m-one'], r['peers'], r['kept'], r[keys.M_TWO]) for r in replies]\n"
    )
    assert set(shared_literals(solver, [strategy])) == {"cluster", "m-one", "peers"}
    constants = solver.replace("'m-one'", "keys.M_ONE").replace("'cluster'", "keys.PREFIX")
    assert shared_literals(constants, [strategy]) == {"peers": 9}


def _methods() -> list[tuple[str, Path, list[Path]]]:
    methods = []
    for cls in builtin_strategies():
        spec = importlib.util.find_spec(cls.declaration.solver)
        assert spec is not None and spec.origin is not None, cls.declaration.solver
        strategies = sorted(
            {
                Path(inspect.getfile(base))
                for base in cls.__mro__
                if base.__module__.startswith("pflarena.strategies.")
            }
        )
        methods.append((cls.declaration.name, Path(spec.origin), strategies))
    return methods


@pytest.mark.parametrize(
    ("method", "solver", "strategies"), _methods(), ids=[m[0] for m in _methods()]
)
def test_a_strategy_and_its_solver_share_reply_names_through_core_keys(
    method: str, solver: Path, strategies: list[Path]
) -> None:
    shared = shared_literals(solver.read_text(), [s.read_text() for s in strategies])
    assert shared == {}, (
        f"{method}: {solver.name} writes these reply names as literals that "
        f"{', '.join(s.name for s in strategies)} spell too (line in the solver); make each "
        f"a {method.upper().replace('-', '_')}_ constant in pflarena/core/keys.py: {shared}"
    )
