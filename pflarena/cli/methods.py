"""Everything generated from the method declarations: tables, docs, Flower's config table.

``pflarena methods`` prints :func:`methods_table` and :func:`method_details`;
``docs/methods.md`` is :func:`methods_markdown`; the ``[tool.flwr.app.config]`` table of
``pyproject.toml`` is :func:`flower_config_toml` (``pflarena methods --flower-config``
prints it, and a test checks that pyproject.toml holds exactly that).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pflarena.core.config import RunConfig, toml_value
from pflarena.core.methods import TRAINING_SETTINGS, MethodDeclaration
from pflarena.strategies import declarations

__all__ = [
    "write_generated",
    "flower_config",
    "flower_config_toml",
    "method_details",
    "methods_markdown",
    "methods_table",
]

KIND_LABEL = {"paper": "seed paper", "baseline": "baseline", "plugin": "plugin"}


def flower_config() -> dict[str, Any]:
    """Every run-config key with its default: the common keys, then each method's."""
    table = RunConfig().model_dump(by_alias=True)
    for declaration in declarations().values():
        table |= declaration.defaults()
    return table


def flower_config_toml() -> str:
    """``[tool.flwr.app.config]`` and one sub-table per method with parameters."""
    lines = ["[tool.flwr.app.config]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in RunConfig().model_dump(by_alias=True).items()]
    for declaration in declarations().values():
        defaults = declaration.params.defaults()
        if defaults:
            lines += ["", f"[tool.flwr.app.config.{declaration.name}]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in defaults.items()]
    return "\n".join(lines) + "\n"


def _participation(declaration: MethodDeclaration) -> str:
    return f"{declaration.default_fraction_train:g}"


def methods_table() -> str:
    """One row per method: name, kind, global model, default participation, reference."""
    header = "| method | kind | global model | default participation | reference |"
    rows = [header, "|---|---|---|---|---|"]
    for declaration in declarations().values():
        rows.append(
            f"| {declaration.name} | {KIND_LABEL[declaration.kind]} "
            f"| {'yes' if declaration.global_model else 'no'} | {_participation(declaration)} "
            f"| {declaration.reference} |"
        )
    return "\n".join(rows)


def method_details(name: str) -> str:
    """A method's declaration and parameters, as Markdown."""
    methods = declarations()
    if name not in methods:
        raise ValueError(f"unknown method {name!r}; methods: {', '.join(methods)}")
    d = methods[name]
    needs = [
        text
        for flag, text in (
            (d.needs_validation, "a validation split on each client (validation-fraction > 0)"),
            (d.needs_server_data, "a server-held dataset (server-fraction > 0)"),
        )
        if flag
    ]
    lines = [
        f"## {d.name}",
        "",
        d.summary[:1].upper() + d.summary[1:] + ".",
        "",
        f"- kind: {KIND_LABEL[d.kind]}",
        f"- reference: {d.reference}",
        f"- global model: {'yes' if d.global_model else 'no'}",
        f"- default participation (fraction-train = 0): {_participation(d)}",
        f"- local-training settings honoured: "
        f"{', '.join(s for s in TRAINING_SETTINGS if s in d.honours)}",
        f"- client solver: `{d.solver}`",
    ]
    if needs:
        lines.append(f"- needs: {'; '.join(needs)}")
    rows = d.param_docs()
    lines.append("")
    if rows:
        lines += ["| key | default | type | description |", "|---|---|---|---|"]
        lines += [f"| `{k}` | `{v!r}` | {t} | {desc} |" for k, v, t, desc in rows]
    else:
        lines.append("No parameters of its own.")
    return "\n".join(lines)


def methods_markdown() -> str:
    """``docs/methods.md``: the table and every method's details."""
    parts = [
        "# Methods",
        "",
        "Generated from the method declarations by `pflarena methods --markdown`; a test keeps "
        "this file in sync. Method parameters are run-config keys `<method>.<param>`: "
        "`pflarena run --strategy ditto --ditto.lambda 0.5`, `--set ditto.lambda=0.5`, or "
        '`flwr run . --run-config "ditto.lambda=0.5"`.',
        "",
        methods_table(),
    ]
    for name in declarations():
        parts += ["", method_details(name)]
    return "\n".join(parts) + "\n"


def write_generated(root: Path) -> None:
    """Rewrite pyproject.toml's ``[tool.flwr.app.config]`` tables and docs/methods.md."""
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    start = text.index("[tool.flwr.app.config]")
    end = text.index("# ----", start)
    pyproject.write_text(text[:start] + flower_config_toml() + "\n" + text[end:])
    (root / "docs" / "methods.md").write_text(methods_markdown())


def command(args: argparse.Namespace) -> int:
    if args.flower_config:
        print(flower_config_toml(), end="")
    elif args.markdown:
        print(methods_markdown(), end="")
    elif args.name:
        print(method_details(args.name))
    else:
        print(methods_table())
        print("\n`pflarena methods NAME` shows a method's parameters.")
    return 0


def add_parser(sub: Any, full_help: bool = False) -> None:
    """``pflarena methods``."""
    methods = sub.add_parser("methods", help="list the methods, or one method's parameters")
    methods.add_argument("name", nargs="?", help="a method name")
    methods.add_argument(
        "--markdown", action="store_true", help="every method as Markdown (docs/methods.md)"
    )
    methods.add_argument(
        "--flower-config",
        action="store_true",
        help="the [tool.flwr.app.config] table the declarations imply (pyproject.toml)",
    )
    methods.set_defaults(func=command)


if __name__ == "__main__":  # `make generated`
    write_generated(Path(__file__).resolve().parents[2])
