"""Everything generated from the method declarations: tables, docs, Flower's config table.

``pflarena methods`` prints :func:`methods_table` and :func:`method_details`;
``docs/methods.md`` is :func:`methods_markdown`; the ``[tool.flwr.app.config]`` table of
``pyproject.toml`` is :func:`flower_config_toml` (``pflarena methods --flower-config``
prints it, and a test checks that pyproject.toml holds exactly that); each method's page
``docs/methods/<name>.md`` holds :func:`method_page_block` between its markers, around a
hand-written part (:func:`write_generated` rewrites all of these: ``make generated``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import Field, create_model

from pflarena.core.config import RunConfig, toml_value
from pflarena.core.methods import (
    PLUGINS_ENV,
    TRAINING_SETTINGS,
    MethodDeclaration,
    MethodParams,
    hyphenate,
    plugin_entry_points,
)


def declarations() -> dict[str, MethodDeclaration]:
    """Every declared method (:func:`pflarena.strategies.declarations`: imports torch and
    Flower with the strategies)."""
    from pflarena.strategies import declarations as live

    return live()


#: What ``pflarena methods`` and ``pflarena methods NAME`` show of the built-in methods,
#: written from their declarations by ``make generated`` (:func:`write_generated`), so that
#: listing them imports neither torch nor Flower; a test keeps it equal to the declarations.
CATALOG = Path(__file__).resolve().parents[1] / "methods" / "catalog.json"


class _Shown:
    """A parameter's default as the catalog keeps it: its ``repr``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class CatalogEntry:
    """A method's declaration as :data:`CATALOG` holds it (what the listing shows)."""

    name: str
    kind: str
    reference: str
    summary: str
    solver: str
    global_model: bool
    default_fraction_train: float
    honours: tuple[str, ...]
    needs_validation: bool
    needs_server_data: bool
    params: tuple[tuple[str, str, str, str], ...]
    fields: tuple[dict[str, Any], ...] = ()
    rules: bool = True
    params_model: str = ""

    def param_docs(self) -> list[tuple[str, Any, str, str]]:
        return [(key, _Shown(default), kind, text) for key, default, kind, text in self.params]


#: The field types a catalog entry can rebuild (:func:`params_fields`); a method with another
#: is validated against its own declaration (``rules``).
_FIELD_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}
_BOUNDS = ("ge", "gt", "le", "lt")


def params_fields(params: type[MethodParams]) -> list[dict[str, Any]] | None:
    """Each field of ``params`` as the catalog keeps it (its name, type or choices, default
    and bounds), or None when a field is of a kind the catalog cannot rebuild."""
    rows: list[dict[str, Any]] = []
    for name, field in params.model_fields.items():
        annotation = field.annotation
        row: dict[str, Any] = {"field": name}
        if get_origin(annotation) is Literal and all(
            isinstance(choice, str) for choice in get_args(annotation)
        ):
            row["choices"] = list(get_args(annotation))
        elif annotation in _FIELD_TYPES.values() and type(field.default) in (int, float, bool, str):
            row["type"] = annotation.__name__
        else:
            return None
        row["default"] = field.default
        for item in field.metadata:
            bounds = {b: getattr(item, b) for b in _BOUNDS if getattr(item, b, None) is not None}
            if not bounds or len(bounds) != 1 or type(item).__name__.lower() not in _BOUNDS:
                return None  # another constraint (a pattern, a length): not rebuilt
            row |= bounds
        aliases = {field.alias, field.validation_alias, field.serialization_alias} - {None}
        if aliases != {hyphenate(name)}:
            return None  # an alias of its own
        rows.append(row)
    return rows


def has_rules(declaration: MethodDeclaration) -> bool:
    """Whether the method's parameters are checked by more than their types and bounds (a
    validator, ``run_problems``, a configuration of their own, a field the catalog cannot
    rebuild): then only the method's own parameters model validates them, and the catalog
    says where it lives."""
    params = declaration.params
    decorators = params.__pydantic_decorators__
    return bool(
        decorators.field_validators
        or decorators.model_validators
        or decorators.root_validators
        or decorators.validators
        or params.run_problems is not MethodParams.run_problems
        or params.model_config != MethodParams.model_config
        or params_fields(params) is None
    )


def params_model_path(params: type[MethodParams]) -> str:
    """Where a parameters model lives: ``module:class``."""
    return f"{params.__module__}:{params.__qualname__}"


def catalog_entries(methods: dict[str, MethodDeclaration]) -> list[dict[str, Any]]:
    """The catalog's entries for ``methods`` (JSON-ready); a method with ``rules`` names
    where its parameters model lives (``params_model``: a torch-free module,
    ``pflarena/methods/<name>/params.py``), which validates its keys in place of fields
    rebuilt from the catalog."""
    return [
        {
            "name": d.name,
            "kind": d.kind,
            "reference": d.reference,
            "summary": d.summary,
            "solver": d.solver,
            "global_model": d.global_model,
            "default_fraction_train": d.default_fraction_train,
            "honours": [s for s in TRAINING_SETTINGS if s in d.honours],
            "needs_validation": d.needs_validation,
            "needs_server_data": d.needs_server_data,
            "params": [[k, repr(v), t, text] for k, v, t, text in d.param_docs()],
            "fields": params_fields(d.params) or [],
            "rules": has_rules(d),
        }
        | ({"params_model": params_model_path(d.params)} if has_rules(d) else {})
        for d in methods.values()
    ]


def listed_declarations() -> dict[str, Any]:
    """What ``pflarena methods`` lists: :data:`CATALOG`'s entries, or the declarations
    themselves where plug-ins are loaded (``PFLARENA_PLUGINS``, or an installed package's
    ``pflarena.methods`` entry points: reading the metadata imports nothing) or there is no
    catalog."""
    if os.environ.get(PLUGINS_ENV) or plugin_entry_points() or not CATALOG.is_file():
        return declarations()
    return _catalog_entries()


def _catalog_entries() -> dict[str, CatalogEntry]:
    entries = json.loads(CATALOG.read_text())
    return {
        entry["name"]: CatalogEntry(
            **entry
            | {
                "honours": tuple(entry["honours"]),
                "params": tuple(tuple(row) for row in entry["params"]),
                "fields": tuple(entry.get("fields", ())),
            }
        )
        for entry in entries
    }


def catalog_declarations() -> dict[str, MethodDeclaration] | None:
    """The built-in methods' declarations rebuilt from :data:`CATALOG`, without importing
    the strategies (torch, Flower): the same names, flags and needs, and parameters models
    that validate as the methods' own do. A method without ``rules`` (:func:`has_rules`)
    gets a model with the same fields, types, defaults and bounds; a method with rules its
    own model, imported from the module the catalog names (``params_model``:
    ``pflarena/methods/<name>/params.py``, which imports neither torch nor Flower). None
    where plug-ins are loaded or there is no catalog."""
    if os.environ.get(PLUGINS_ENV) or plugin_entry_points() or not CATALOG.is_file():
        return None
    stat = CATALOG.stat()
    return dict(_catalog_declarations(stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=1)
def _catalog_declarations(mtime_ns: int, size: int) -> dict[str, MethodDeclaration]:
    # once per version of the file: a sweep validates every planned run against them
    return {name: _declaration(entry) for name, entry in _catalog_entries().items()}


def catalog_rules() -> set[str]:
    """The built-in methods whose parameters only their own model validates (the catalog
    names its module)."""
    return {name for name, entry in _catalog_entries().items() if entry.rules}


def _params_model(path: str) -> type[MethodParams]:
    """The parameters model at ``module:class``."""
    import importlib

    module, _, name = path.partition(":")
    params = getattr(importlib.import_module(module), name)
    if not (isinstance(params, type) and issubclass(params, MethodParams)):
        raise TypeError(f"{CATALOG}: {path} is not a MethodParams model; make generated")
    return params


def _declaration(entry: CatalogEntry) -> MethodDeclaration:
    params: type[MethodParams] = MethodParams
    if entry.params_model:
        params = _params_model(entry.params_model)
    elif entry.fields:
        definitions: dict[str, Any] = {}
        for row in entry.fields:
            kind = _FIELD_TYPES[row["type"]] if "type" in row else Literal[tuple(row["choices"])]
            bounds = {b: row[b] for b in _BOUNDS if b in row}
            definitions[row["field"]] = (kind, Field(row["default"], **bounds))
        params = create_model(f"{entry.name}-params", __base__=MethodParams, **definitions)
    return MethodDeclaration(
        name=entry.name,
        kind=entry.kind,  # type: ignore[arg-type]
        reference=entry.reference,
        summary=entry.summary,
        solver=entry.solver,
        params=params,
        global_model=entry.global_model,
        default_fraction_train=entry.default_fraction_train,
        honours=frozenset(entry.honours),
        needs_validation=entry.needs_validation,
        needs_server_data=entry.needs_server_data,
    )


__all__ = [
    "write_generated",
    "flower_config",
    "method_page",
    "method_page_block",
    "method_pages",
    "methods_table_linked",
    "presets_using",
    "write_method_pages",
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


def methods_table(methods: dict[str, Any] | None = None) -> str:
    """One row per method: name, kind, global model, default participation, reference
    (``methods``: :func:`listed_declarations` unless given)."""
    header = "| method | kind | global model | default participation | reference |"
    rows = [header, "|---|---|---|---|---|"]
    for declaration in (methods or listed_declarations()).values():
        rows.append(
            f"| {declaration.name} | {KIND_LABEL[declaration.kind]} "
            f"| {'yes' if declaration.global_model else 'no'} | {_participation(declaration)} "
            f"| {declaration.reference} |"
        )
    return "\n".join(rows)


def method_details(name: str, methods: dict[str, Any] | None = None) -> str:
    """A method's declaration and parameters, as Markdown."""
    methods = methods or listed_declarations()
    if name not in methods:
        from pflarena.core.suggest import did_you_mean

        raise ValueError(
            f"unknown method {name!r}{did_you_mean(name, methods)}; methods: {', '.join(methods)}"
        )
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


def methods_table_linked() -> str:
    """:func:`methods_table` with each method's name linked to its page (for docs/methods.md)."""
    rows = methods_table(declarations()).split("\n")
    for i, name in enumerate(declarations(), start=2):
        rest = rows[i].split(" | ", 1)[1]
        rows[i] = f"| [{name}](methods/{name}.md) | {rest}"
    return "\n".join(rows)


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
        methods_table_linked(),
    ]
    for name in declarations():
        parts += ["", method_details(name, declarations())]
    return "\n".join(parts) + "\n"


#: The markers around the generated part of a method's page (``docs/methods/<name>.md``).
PAGE_BEGIN = "<!-- generated from the declaration: do not edit; make generated -->"
PAGE_END = "<!-- end generated -->"
#: What a page created by :func:`write_method_pages` holds until its hand-written part is
#: written; a test refuses a page that still holds it.
PAGE_STUB = "<!-- hand-written part: not written yet -->"


def method_page(name: str) -> str:
    """The path of a method's page, relative to the repository root."""
    return f"docs/methods/{name}.md"


def presets_using(name: str) -> list[str]:
    """The presets (``pflarena/presets/``) whose strategies or strategy include ``name``."""
    from pflarena.core.presets import load_preset, preset_names

    found = []
    for preset_name in preset_names():
        preset = load_preset(preset_name)
        if name in preset.strategies or preset.config.get("strategy") == name:
            found.append(preset_name)
    return found


def method_page_block(name: str) -> str:
    """The generated part of a method's page, markers included: :func:`method_details`
    under a heading of its own, the solver's module path and the presets using the method."""
    details = method_details(name, declarations()).split("\n", 2)[2]  # without its heading
    presets = presets_using(name)
    lines = [
        PAGE_BEGIN,
        "",
        f"## Declaration: `{name}`",
        "",
        details,
        "",
        "Presets using it (`pflarena run --preset NAME`): "
        + (", ".join(f"`{p}`" for p in presets) if presets else "none")
        + f". Every method's declaration: [docs/methods.md](../methods.md#{name}).",
        "",
        PAGE_END,
    ]
    return "\n".join(lines)


def _page_stub(name: str) -> str:
    declaration = declarations()[name]
    return f"# {name}: {declaration.reference}\n\n{method_page_block(name)}\n\n{PAGE_STUB}\n"


def method_pages(root: Path) -> dict[str, str]:
    """Every declared method's page as it should read: the page on disk with its generated
    block rewritten, or a stub (heading, generated block, :data:`PAGE_STUB`) where there is
    no page. Raises ValueError for a page whose markers are missing or out of order."""
    pages = {}
    for name in declarations():
        path = root / method_page(name)
        if not path.is_file():
            pages[name] = _page_stub(name)
            continue
        text = path.read_text(encoding="utf-8")
        start, end = text.find(PAGE_BEGIN), text.find(PAGE_END)
        if start < 0 or end < start:
            raise ValueError(f"{path}: no generated block ({PAGE_BEGIN} ... {PAGE_END})")
        pages[name] = text[:start] + method_page_block(name) + text[end + len(PAGE_END) :]
    return pages


def write_method_pages(root: Path) -> None:
    """Rewrite the generated block of every method's page; create a stub where one is missing."""
    for name, text in method_pages(root).items():
        path = root / method_page(name)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


def write_generated(root: Path) -> None:
    """Rewrite pyproject.toml's ``[tool.flwr.app.config]`` tables, docs/methods.md, the
    generated block of every method's page (docs/methods/<name>.md), :data:`CATALOG` and
    the models' layouts (:data:`pflarena.core.model_layouts.LAYOUTS`)."""
    from pflarena.core.model_layouts import write_model_layouts

    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    start = text.index("[tool.flwr.app.config]")
    end = text.index("# ----", start)
    pyproject.write_text(text[:start] + flower_config_toml() + "\n" + text[end:])
    (root / "docs" / "methods.md").write_text(methods_markdown())
    write_method_pages(root)
    CATALOG.write_text(json.dumps(catalog_entries(builtin_declarations()), indent=1) + "\n")
    write_model_layouts()


def builtin_declarations() -> dict[str, MethodDeclaration]:
    """The built-in methods' declarations (no plug-ins): what :data:`CATALOG` holds."""
    from pflarena.strategies import builtin_strategies

    return {cls.declaration.name: cls.declaration for cls in builtin_strategies()}


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
