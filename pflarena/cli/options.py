"""Flags and run-config handling shared by the ``pflarena`` subcommands."""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pflarena.core.config import ConfigError, RunConfig, parse_run_config
from pflarena.core.federation import FederationSpec
from pflarena.core.methods import MethodDeclaration
from pflarena.runtime.engines import DEFAULT_CLIENTS_PER_GPU, ENGINES

__all__ = [
    "DATA_KEYS",
    "HELP_ALL",
    "add_config_flags",
    "add_method_flags",
    "collect_overrides",
    "parse_run",
    "run_declarations",
    "validate_run",
    "run_overrides",
    "with_shard_clients",
    "with_tracking",
]

# Keys that describe data only (the data layer's FederationSpec): what `pflarena shards` takes.
DATA_KEYS: tuple[str, ...] = tuple(
    field.alias or name for name, field in FederationSpec.model_fields.items()
)


ENGINE_HELP = (
    "inprocess (default): no Ray, clients in forked worker processes; ray: Flower's Ray "
    "engine (chosen with --ray-address or --gpus-per-client)"
)

WORKERS_HELP = (
    "in-process clients at once (default: cores / --cpus-per-client; on a GPU, "
    "--clients-per-gpu per GPU; 1: one by one)"
)
CLIENTS_PER_GPU_HELP = (
    f"in-process clients training at once on each GPU when --workers is not given "
    f"(default {DEFAULT_CLIENTS_PER_GPU}; docs/gpu.md)"
)


RAY_ADDRESS_HELP = (
    "run the clients on an existing Ray cluster (auto: RAY_ADDRESS or the cluster `ray start` "
    "started here; or the head's HOST:PORT) instead of a private Ray instance; the app's code "
    "is shipped to the workers, whose nodes need its dependencies and see its paths"
)


#: The run-config flags ``pflarena run --help`` shows; ``--help-all`` shows every one.
COMMON_FLAGS: tuple[str, ...] = (
    "strategy",
    "dataset",
    "data-dir",
    "shards-dir",
    "num-clients",
    "partition",
    "alpha",
    "num-rounds",
    "fraction-train",
    "local-epochs",
    "batch-size",
    "lr",
    "model",
    "seed",
    "eval-every",
    "output-dir",
    "device",
    "tracker",
)


HELP_ALL = "--help-all"

#: The run-config keys a method may need set (``MethodDeclaration.needs_validation``,
#: ``needs_server_data``): always listed by ``run --help``.
NEEDED_KEYS: tuple[str, ...] = ("validation-fraction", "server-fraction")


@functools.cache
def help_keys() -> frozenset[str]:
    """The run-config and method keys ``pflarena run --help`` lists: the common ones, every
    key a built-in preset sets (a paper's setting needs them) and every key a method may
    need; ``--help-all`` lists every one."""
    from pflarena.core.presets import load_preset, preset_names

    keys = set(COMMON_FLAGS) | set(NEEDED_KEYS)
    for name in preset_names():
        preset = load_preset(name)
        for strategy in preset.strategies or (None,):
            keys |= set(preset.overrides(strategy))
    return frozenset(keys)


def presets_setting(key: str, strategy: str, dataset: str = "") -> list[str]:
    """The built-in presets that set ``key`` (to more than 0) for a run of ``strategy``,
    those on ``dataset`` first."""
    from pflarena.core.presets import load_preset, preset_names

    found = []
    for name in preset_names():
        preset = load_preset(name)
        values = preset.overrides(strategy) if strategy in preset.strategies else {}
        if isinstance(values.get(key), int | float) and values[key] > 0:
            found.append((values.get("dataset") != dataset, name))
    return [name for _, name in sorted(found)]


def with_flag_hints(error: ConfigError, strategy: str, dataset: str = "") -> ConfigError:
    """``error`` with each key the method needs (:data:`NEEDED_KEYS`, ``error.needed``)
    named as the flag that sets it and the preset that sets it for ``strategy`` (one on
    ``dataset`` if any): ``set validation-fraction > 0`` becomes ``set validation-fraction
    > 0: --validation-fraction 0.2, or --preset pfedsv-digits --strategy pfedsv``."""
    text = str(error)
    for key in getattr(error, "needed", ()):
        said = f"set {key} > 0"
        presets = presets_setting(key, strategy, dataset)
        hint = f"--{key} 0.2"
        if presets:
            hint += f", or --preset {presets[0]} --strategy {strategy}, which sets it"
        text = text.replace(said, f"{said}: {hint}", 1)
    return ConfigError(text)


#: Defaults of a plain run that the main job (``make run``, ``--preset digits-main``) sets
#: otherwise, said in ``--help``.
DEFAULTS_THAT_DIFFER: dict[str, str] = {
    "alpha": "the main job, --preset digits-main, uses 0.1",
}


RUN_EPILOG = (
    "Common flags only: `pflarena run --help-all` lists every run-config key and every "
    "method's parameters (--<method>.<param>, e.g. --ditto.lambda 0.5), `pflarena methods "
    "NAME` one method's parameters; any key also works as --set KEY=VALUE."
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_runtime_flags(parser: argparse.ArgumentParser, *, check_help: str, quiet_help: str) -> None:
    """How the runs are executed (not what they compute): the flags ``run`` and ``sweep``
    share. Their own wording for ``--check`` and ``--quiet``, which differ in what they
    print."""
    parser.add_argument(
        "--cpus-per-client",
        type=float,
        default=1.0,
        metavar="N",
        help="CPUs per simulated client (default 1)",
    )
    parser.add_argument(
        "--gpus-per-client",
        type=float,
        default=0.0,
        metavar="N",
        help="GPU fraction per simulated client (default 0)",
    )
    parser.add_argument("--check", action="store_true", help=check_help)
    parser.add_argument("--engine", choices=ENGINES, default=None, help=ENGINE_HELP)
    parser.add_argument("--workers", type=_positive_int, metavar="N", help=WORKERS_HELP)
    parser.add_argument(
        "--clients-per-gpu", type=_positive_int, metavar="N", help=CLIENTS_PER_GPU_HELP
    )
    parser.add_argument("--ray-address", metavar="auto|HOST:PORT", help=RAY_ADDRESS_HELP)
    parser.add_argument("--quiet", action="store_true", help=quiet_help)
    parser.add_argument("--verbose", action="store_true", help="stream the whole Flower log")


def add_config_flags(
    parser: argparse.ArgumentParser,
    only: tuple[str, ...] | None = None,
    *,
    full_help: bool = True,
    skip: tuple[str, ...] = (),
) -> None:
    title = "run config (see pyproject.toml [tool.flwr.app.config])"
    if not full_help:
        title = f"common run-config flags ({HELP_ALL} lists all)"
    group = parser.add_argument_group(title)
    listed = help_keys() if not full_help else set()
    named: list[str] = []  # listed by name only: keys the presets set, beyond the common ones
    for name, field in RunConfig.model_fields.items():
        alias = name.replace("_", "-")
        if (only is not None and alias not in only) or alias in ("resume", *skip):
            continue  # --resume DIR is a flag of its own
        shown = full_help or alias in COMMON_FLAGS or alias in NEEDED_KEYS
        if not shown and alias in listed:
            named.append(f"--{alias}")
        text = f"{field.description or ''} (default: {field.default!r}"
        text += f"; {DEFAULTS_THAT_DIFFER[alias]})" if alias in DEFAULTS_THAT_DIFFER else ")"
        # a key of a few values takes only those (one line naming them otherwise)
        choices = get_args(field.annotation) if get_origin(field.annotation) is Literal else ()
        group.add_argument(
            f"--{alias}",
            dest=alias,
            default=None,
            metavar="{" + ",".join(choices) + "}" if choices else "VALUE",
            choices=list(choices) if choices and all(isinstance(c, str) for c in choices) else None,
            help=text.strip().replace("%", "%%") if shown else argparse.SUPPRESS,
        )
    if named:
        parser.add_argument_group(
            f"run-config flags the presets set ({HELP_ALL} describes them)", ", ".join(named)
        )


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, whose paragraphs never break a flag at its hyphens (``--ditto.lambda``
    stays whole in a list of flags)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        text = " ".join(text.split())
        return textwrap.fill(
            text,
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
            break_long_words=False,
        )


def add_method_flags(
    parser: argparse.ArgumentParser,
    methods: dict[str, MethodDeclaration],
    *,
    full_help: bool = True,
) -> list[str]:
    """One flag group per method with parameters (``--ditto.lambda``); returns the keys.
    Without ``full_help`` the flags work but are not listed (``--help-all`` and ``pflarena
    methods NAME`` show them)."""
    keys = []
    listed = help_keys() if not full_help else set()
    named: list[str] = []  # without full_help: the keys the presets set, by name
    for declaration in methods.values():
        rows = declaration.param_docs()
        if not rows:
            continue
        group: Any = parser  # unlisted: no group heading either
        if full_help:
            group = parser.add_argument_group(
                f"{declaration.name} parameters",
                f"{declaration.summary} ({declaration.reference})",
            )
        for key, default, _type, description in rows:
            if not full_help and key in listed:
                named.append(f"--{key}")
            group.add_argument(
                f"--{key}",
                dest=key,
                default=None,
                metavar="VALUE",
                help=f"{description} (default: {default!r})".replace("%", "%%")
                if full_help
                else argparse.SUPPRESS,
            )
            keys.append(key)
    if named:
        parser.add_argument_group(
            f"method parameters the presets set ({HELP_ALL} describes them)", ", ".join(named)
        )
    return keys


def parse_run(values: Mapping[str, Any]) -> RunConfig:
    """:func:`validate_run`, its errors naming the flag (and a preset) that sets a key the
    run's method needs (:func:`with_flag_hints`)."""
    try:
        return validate_run(values)
    except ConfigError as error:
        strategy = str(values.get("strategy", RunConfig.model_fields["strategy"].default))
        dataset = str(values.get("dataset", RunConfig.model_fields["dataset"].default))
        raise with_flag_hints(error, strategy, dataset) from None


def run_declarations() -> dict[str, MethodDeclaration]:
    """Every declared method, as a run config is validated against them: the methods'
    catalog (:func:`pflarena.cli.methods.catalog_declarations`), which imports neither
    torch nor Flower, or, where plug-ins are loaded, the strategies' own declarations."""
    from pflarena.cli.methods import catalog_declarations

    declared = catalog_declarations()
    if declared is not None:
        return declared
    from pflarena.strategies import declarations

    return declarations()


def validate_run(values: Mapping[str, Any]) -> RunConfig:
    """``values`` validated as the server validates a run config
    (:func:`pflarena.server.build.parse_config`: every declared method), against
    :func:`run_declarations`: without importing torch or Flower unless plug-ins are loaded.
    A method whose parameters have rules of their own brings its own parameters model
    (``pflarena/methods/<name>/params.py``), whose checks of the run's model read the
    models' names (:mod:`pflarena.core.model_layouts`)."""
    return parse_run_config(values, run_declarations())


def collect_overrides(args: argparse.Namespace, keys: list[str]) -> dict[str, str]:
    overrides = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    for item in getattr(args, "set", None) or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        overrides[key.strip()] = value.strip()
    return overrides


def default_output_dir(values: dict[str, Any]) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    root = Path(os.environ.get("PFLARENA_RUNS_DIR", "runs"))
    name = f"{stamp}-{values.get('strategy', 'fedavg')}-{values.get('dataset', 'digits')}-s{values.get('seed', 0)}"
    return str((root / name).resolve())


def run_overrides(
    args: argparse.Namespace, keys: list[str], base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The run's keys: the preset's (if any), then ``base`` (a ``--config`` file's), then
    flags and ``--set`` on top."""
    from pflarena.core.presets import load_preset

    explicit = dict(base or {}) | collect_overrides(args, keys)
    values = explicit
    if getattr(args, "preset", None):
        values = load_preset(args.preset).overrides(explicit.get("strategy")) | explicit
    return with_shard_clients(values, explicit)


def with_shard_clients(values: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``num-clients`` taken from its ``shards-dir``'s manifest, unless
    ``num-clients`` was ``given`` explicitly (then the run is checked against it)."""
    from pflarena.core.shard_format import ShardError, read_shard_set

    if not values.get("shards-dir") or "num-clients" in given:
        return values
    try:
        shard_set = read_shard_set(str(values["shards-dir"]))
    except ShardError:
        return values  # the run config's validation names the problem (a usage error)
    return values | {"num-clients": shard_set.num_clients}


def with_tracking(cfg: RunConfig, cwd: Path | None = None) -> RunConfig:
    """``cfg`` with its trackers checked (their optional dependencies installed) and
    MLflow's default store made explicit: ``$MLFLOW_TRACKING_URI``, else ``mlruns/`` in the
    current directory (the simulation runs in a scratch directory of its own)."""
    if not cfg.tracker:
        return cfg
    from pflarena.core.trackers_spec import tracker_names
    from pflarena.server.trackers import check_available, default_tracking_uri

    names = tracker_names(cfg.tracker)
    check_available(names)
    if "mlflow" in names and not cfg.tracking_uri:
        cfg = cfg.model_copy(update={"tracking_uri": default_tracking_uri(cwd)})
    return cfg
