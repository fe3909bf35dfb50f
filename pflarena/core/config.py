"""The run configuration: the common keys in one pydantic model, each method's in its own.

Flower hands the ServerApp and every ClientApp the same flat run config (defaults from
``[tool.flwr.app.config]`` in ``pyproject.toml``, overridden by ``--run-config``). Common
keys are flat (``num-clients``); a method's parameters live under its name
(``ditto.lambda``, from a ``[tool.flwr.app.config.ditto]`` table), declared by the method
(:class:`~pflarena.core.methods.MethodDeclaration`).

:func:`parse_run_config` validates the common keys and, given the declared methods (the
server and the CLI pass them), every method key too: an unknown key, a wrong type or an
out-of-range value stops the run with a message that names the key and what is allowed.
Without the declarations (a ClientApp, which reads its method's settings from the
messages) method keys are carried along unchecked.
"""

from __future__ import annotations

import contextlib
import difflib
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from pflarena.core.datasets import DatasetInfo, dataset_info
from pflarena.core.federation import FederationSpec, check_path_text
from pflarena.core.methods import TRAINING_SETTINGS, MethodDeclaration, MethodParams
from pflarena.core.shard_format import ShardError

__all__ = [
    "ConfigError",
    "RunConfig",
    "own_method_keys",
    "parse_run_config",
    "parse_float_list",
]

#: Keys of earlier releases that moved under a method's namespace.
RENAMED_KEYS: dict[str, str] = {
    "proximal-mu": "fedprox.mu",
    "ditto-lambda": "ditto.lambda",
    "personal-epochs": "ditto.personal-epochs or fedavg-ft.finetune-epochs",
    "ppfl.lr-milestones": "lr-milestones (every method's schedule)",
    "ppfl.lr-decay": "lr-gamma (every method's schedule)",
    "page.rl-optimizer": "page.server-optimizer and page.client-optimizer",
}


class ConfigError(ValueError):
    """An invalid run configuration; the message lists every offending key. ``needed``: the
    keys the run's method needs set and the config leaves at 0 (``validation-fraction``,
    ``server-fraction``), for a caller to say how to set them."""

    needed: tuple[str, ...] = ()


class RunConfig(FederationSpec):
    """Every common run-config key, with its default, type and allowed range.

    The data keys (dataset, partition, seed, the validation and server fractions, ...) are
    the data layer's :class:`~pflarena.core.federation.FederationSpec`, inherited with their
    checks; the rest are declared here. Field names use underscores; the run config uses
    the hyphenated aliases (``num-clients``), as Flower configs do. The method keys
    (``<method>.<param>``) are kept beside the fields: :meth:`method_values`,
    :meth:`params`.
    """

    # What runs (the data keys, with the model config, come from FederationSpec).
    strategy: str = Field("fedavg", description="the method to run (see `pflarena methods`)")
    model: str = Field("", description="model name; empty picks the dataset's default")
    shards_dir: str = Field(
        "",
        description="a directory of shard files (`pflarena shards`, `pflarena shards import`): "
        "client i trains on its own file, num-clients is the directory's, and the data keys "
        "(dataset, partition, ...) are not used; empty: build the data from the data keys",
    )

    # Federation.
    num_rounds: int = Field(20, ge=1, description="training rounds")
    fraction_train: float = Field(
        0.0,
        ge=0,
        le=1,
        description="fraction of clients sampled per round; 0 = the method's default "
        "(see `pflarena methods`)",
    )
    min_train_clients: int = Field(1, ge=1, description="at least this many clients per round")
    min_available_clients: int = Field(
        0,
        ge=0,
        description="start once this many clients are connected, the others taking part from "
        "the first round after they connect (nodes that come online over time); 0: wait for "
        "all num-clients",
    )
    round_timeout: float = Field(600.0, gt=0, description="seconds to wait for replies")
    max_failure_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="stop the run (resumable from its last checkpoint) when more than this "
        "share of a round's sampled clients, or of an evaluation's clients, fail; 1: never stop",
    )
    checkpoint_every: int = Field(
        1, ge=1, description="save the server state to resume from every k rounds (and the last)"
    )
    resume: bool = Field(
        False,
        description="continue the run in output-dir from its checkpoint (pflarena run --resume)",
    )

    # Local training: the TRAINING_SETTINGS a method declares it honours.
    local_epochs: int = Field(2, ge=1, description="local epochs per round")
    batch_size: int = Field(32, ge=1, description="local minibatch size")
    lr: float = Field(0.1, gt=0, description="local learning rate")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum")
    weight_decay: float = Field(0.0, ge=0, description="SGD weight decay")
    lr_milestones: str = Field(
        "",
        description="rounds after which lr is multiplied by lr-gamma, comma-separated (a "
        "multi-step schedule: with '100,150', rounds 101-150 at a tenth); empty: constant",
    )
    lr_gamma: float = Field(0.1, gt=0, le=1, description="lr's factor at each of lr-milestones")

    # Evaluation and results.
    eval_every: int = Field(1, ge=1, description="evaluate the clients every k rounds")
    fraction_evaluate: float = Field(
        1.0,
        gt=0,
        le=1,
        description="share of the connected clients each evaluation after round 0 tests (a "
        "fresh seeded sample each time, at least one client; the round's record says how many); "
        "round 0 and the last round test every client unless initial-evaluation or "
        "final-evaluation is sample",
    )
    initial_evaluation: Literal["all", "sample"] = Field(
        "all",
        description="round 0's evaluation of the initial models: every client (all), or a "
        "fraction-evaluate sample (sample; where the engine knows each node's client without "
        "a message, the in-process engine's simulated nodes; elsewhere every client)",
    )
    final_evaluation: Literal["all", "sample"] = Field(
        "all",
        description="the last round's evaluation: every client (all), or a fraction-evaluate "
        "sample like the others (sample)",
    )
    cross_eval_clients: int = Field(
        0,
        ge=0,
        description="cross-evaluation at every evaluation: the personalized models of this "
        "many clients (a seeded sample, fixed for the run) are tested on every client's test "
        "split, giving local, synthetic and global accuracy; 0: off (the models leave their "
        "clients)",
    )
    cross_eval_every: int = Field(
        0,
        ge=0,
        description="cross-evaluate every k rounds (at the evaluations on those rounds, round 0 "
        "included) and at the last round; a multiple of eval-every; 0: at every evaluation",
    )
    cross_eval_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="synthetic accuracy: the share c of the other clients whose test splits "
        "join a model's own (0: local accuracy, 1: global accuracy)",
    )
    output_dir: str = Field("", description="results directory; empty: runs/<time>-<strategy>")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where clients compute")
    state_precision: Literal["float32", "float16"] = Field(
        "float32",
        description="the precision of the models a client keeps in its state (Ditto's, "
        "pFedMe's, APFL's, Local's ...): float16 halves their disk and write time, and rounds "
        "the stored weights to float16 each time they are saved (computation stays float32)",
    )
    state_io: Literal["direct", "buffered"] = Field(
        "direct",
        description="how state files of 1 MiB and more (a client's personal model, a "
        "server's per-client pool) are written and read: direct, past the page cache "
        "(O_DIRECT: a state written once and read rounds later takes no new cache pages, "
        "and where the file system refuses, through it), or buffered, through the page cache",
    )
    tracker: str = Field(
        "",
        description="experiment trackers the ServerApp logs to: mlflow, tensorboard, wandb, "
        "or several (comma-separated); empty: none",
    )
    tracking_uri: str = Field(
        "",
        description="MLflow tracking URI; empty: $MLFLOW_TRACKING_URI, else ./mlruns (a "
        "relative sqlite:/// path is made absolute here, where the command runs)",
    )
    tracking_experiment: str = Field(
        "pflarena", description="MLflow experiment name (Weights & Biases: the project)"
    )
    tracking_group: str = Field(
        "", description="the sweep a run belongs to (set by pflarena sweep): W&B's run group"
    )
    tracking_parent: str = Field(
        "", description="MLflow run id of the parent run (set by pflarena sweep)"
    )

    #: ``((key, value), ...)`` of every ``<method>.<param>`` key, sorted by key.
    _method_values: tuple[tuple[str, Any], ...] = PrivateAttr(default=())

    @field_validator("shards_dir", "output_dir")
    @classmethod
    def _is_a_path(cls, value: str) -> str:
        return check_path_text(value)

    @field_validator("lr_milestones")
    @classmethod
    def _milestones(cls, value: str) -> str:
        return ",".join(str(m) for m in parse_milestones(value, "lr-milestones"))

    def milestones(self) -> tuple[int, ...]:
        """``lr-milestones`` as sorted rounds."""
        return parse_milestones(self.lr_milestones, "lr-milestones")

    @field_validator("tracking_uri")
    @classmethod
    def _absolute_sqlite_store(cls, value: str) -> str:
        """A relative ``sqlite:///`` store resolved against the current directory now: the
        ServerApp of a simulation runs in a scratch directory of its own, where the store
        and its artifacts would be lost."""
        from pflarena.core.trackers_spec import absolute_sqlite_uri

        return absolute_sqlite_uri(value)

    @field_validator("tracker")
    @classmethod
    def _known_trackers(cls, value: str) -> str:
        from pflarena.core.trackers_spec import check_trackers

        return check_trackers(value)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        from pflarena.core.model_names import MODEL_NAMES

        if value and value not in MODEL_NAMES:
            raise ValueError(f"unknown model {value!r}; allowed: {', '.join(MODEL_NAMES)}")
        return value

    @model_validator(mode="after")
    def _available_within_clients(self) -> RunConfig:
        if self.min_available_clients > self.num_clients:
            raise ValueError(
                f"min-available-clients={self.min_available_clients} exceeds "
                f"num-clients={self.num_clients}"
            )
        return self

    @model_validator(mode="after")
    def _model_fits_dataset(self) -> RunConfig:
        """Token models need token data and the other models numbers (``model`` or default)."""
        from pflarena.core.datasets import dataset_info
        from pflarena.core.model_names import check_model_fits

        if self.shards_dir:
            return self  # checked against the shards' own description (_shards_dir_problems)
        check_model_fits(self.model_name(), dataset_info(self.dataset))
        return self

    # ------------------------------------------------------------------ method keys
    def method_values(self, method: str | None = None) -> dict[str, Any]:
        """The method keys as given: all of them, or one method's without its prefix."""
        if method is None:
            return dict(self._method_values)
        prefix = f"{method}."
        return {k[len(prefix) :]: v for k, v in self._method_values if k.startswith(prefix)}

    def params(self, declaration: MethodDeclaration) -> MethodParams:
        """The validated parameters of ``declaration``'s method (defaults where unset)."""
        return declaration.params.model_validate(self.method_values(declaration.name))

    def with_method_values(self, values: Mapping[str, Any]) -> RunConfig:
        """A copy whose method keys are ``values`` (``<method>.<param>`` -> value)."""
        copy = self.model_copy()
        copy._method_values = tuple(sorted(values.items()))
        return copy

    # ------------------------------------------------------------------ derived
    def model_name(self) -> str:
        """The model to build: ``model`` if set, else the data's default."""
        from pflarena.core.model_names import default_model_for

        return self.model or default_model_for(self.data_name(), self.data_info())

    def data_info(self) -> DatasetInfo:
        """What the clients' data is: the shard directory's, else the dataset's."""
        if self.shards_dir:
            from pflarena.core.shard_format import read_shard_set

            return read_shard_set(self.shards_dir).info
        return dataset_info(self.dataset)

    def data_name(self) -> str:
        """The data's name: the shard directory's, else ``dataset``."""
        return self.data_info().name if self.shards_dir else self.dataset

    def federation_spec(self) -> FederationSpec:
        """The data half of the config, as the data layer's frozen spec."""
        return FederationSpec(**{name: getattr(self, name) for name in FederationSpec.model_fields})

    def training_values(self) -> dict[str, Any]:
        """The :data:`TRAINING_SETTINGS` of this run, by run-config key."""
        return {key: getattr(self, key.replace("-", "_")) for key in TRAINING_SETTINGS}

    def to_run_config(self) -> dict[str, Any]:
        """The flat, hyphenated mapping Flower passes around (method keys included)."""
        return self.model_dump(by_alias=True) | self.method_values()

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, RunConfig)
            and super().__eq__(other)
            and self._method_values == other._method_values
        )

    def __hash__(self) -> int:
        return hash((tuple(self.model_dump().items()), self._method_values))


def parse_float_list(text: str, key: str) -> list[float]:
    """``"0.8, 0.5,0.9"`` -> ``[0.8, 0.5, 0.9]``; a bad entry raises ValueError naming ``key``."""
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{key} must be comma-separated numbers, got {text!r}") from None


def parse_milestones(text: str, key: str) -> tuple[int, ...]:
    """``"150, 100"`` -> ``(100, 150)``; an entry that is not a round >= 1 raises ValueError
    naming ``key``."""
    rounds = []
    for part in text.split(","):
        if not part.strip():
            continue
        if not part.strip().isdigit() or int(part) < 1:
            raise ValueError(f"{key} must be rounds >= 1 separated by commas, got {text!r}")
        rounds.append(int(part))
    return tuple(sorted(rounds))  # a repeated round decays twice, as torch's MultiStepLR


def _common_keys() -> list[str]:
    return [field.alias or name for name, field in RunConfig.model_fields.items()]


def _suggest(key: str, known: list[str]) -> str:
    if key in RENAMED_KEYS:
        return f"; it is now {RENAMED_KEYS[key]}"
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.75)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _describe(error: dict[str, Any], prefix: str, known: list[str]) -> str:
    if not error["loc"]:  # a rule over several keys: its message names them
        return str(error["msg"]).removeprefix("Value error, ")
    key = prefix + ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key {key!r}{_suggest(key, known)} (see `pflarena run --help`)"
    return f"{key}: {error['msg']} (got {error.get('input')!r})"


def _method_problems(
    cfg: RunConfig, methods: Mapping[str, MethodDeclaration], known: list[str]
) -> tuple[list[str], dict[str, Any]]:
    """Method keys and method-specific rules, checked against the declarations.

    Returns the problems and the method keys given, with their validated values.
    """
    problems: list[str] = []
    normalized: dict[str, Any] = {}
    by_method: dict[str, dict[str, Any]] = {}
    for key, value in cfg.method_values().items():
        name, _, param = key.partition(".")
        if name not in methods:
            problems.append(
                f"unknown key {key!r}: no method {name!r}{_suggest(key, known)} "
                f"(methods: {', '.join(methods)})"
            )
            continue
        by_method.setdefault(name, {})[param] = value
    for name, values in by_method.items():
        declaration = methods[name]
        try:
            params = declaration.params.model_validate(values)
        except ValidationError as exc:
            problems += [_describe(err, f"{name}.", known) for err in exc.errors()]
            continue
        dumped = params.model_dump(by_alias=True)
        normalized |= {f"{name}.{k}": dumped[k] for k in values if k in dumped}
        # A parameter of a method this run does not use is ignored: refuse it when set.
        if name != cfg.strategy:
            changed = [
                f"{name}.{k}"
                for k, v in params.model_dump(by_alias=True).items()
                if v != declaration.params.defaults()[k]
            ]
            if changed:
                problems.append(
                    f"{', '.join(changed)} set, but strategy is {cfg.strategy!r}: "
                    f"{name} parameters would be ignored"
                )
    if cfg.strategy not in methods:
        from pflarena.core.suggest import did_you_mean

        problems.append(
            f"unknown strategy {cfg.strategy!r}{did_you_mean(cfg.strategy, methods)}; "
            f"allowed: {', '.join(methods)}"
        )
        return problems, normalized
    declaration = methods[cfg.strategy]
    with contextlib.suppress(ValidationError):  # invalid values are already reported
        problems += cfg.params(declaration).run_problems(cfg)
    if cfg.shards_dir:
        problems += _shards_dir_problems(cfg, declaration)
    else:
        if declaration.needs_validation and cfg.validation_fraction == 0:
            problems.append(f"{cfg.strategy} needs a validation split: set validation-fraction > 0")
        if declaration.needs_server_data and cfg.server_fraction == 0:
            problems.append(f"{cfg.strategy} needs server-held data: set server-fraction > 0")
    if cfg.cross_eval_every % cfg.eval_every:
        problems.append(
            f"cross-eval-every={cfg.cross_eval_every} is not a multiple of eval-every="
            f"{cfg.eval_every}: cross-evaluations happen only at evaluations"
        )
    if cfg.cross_eval_clients > cfg.num_clients:
        problems.append(
            f"cross-eval-clients={cfg.cross_eval_clients} is more than num-clients="
            f"{cfg.num_clients}"
        )
    defaults = RunConfig().training_values()
    ignored = [
        f"{key}={value}"
        for key, value in cfg.training_values().items()
        if key not in declaration.honours and value != defaults[key]
    ]
    if ignored:
        problems.append(
            f"{', '.join(ignored)} set, but {cfg.strategy}'s local solver does not use it "
            f"(it honours {', '.join(s for s in TRAINING_SETTINGS if s in declaration.honours)})"
        )
    return problems, normalized


def _shards_dir_problems(cfg: RunConfig, declaration: MethodDeclaration) -> list[str]:
    """A run on a shard directory: the directory's clients, its own splits, no server data."""
    from pflarena.core.model_names import ModelError, check_model_fits
    from pflarena.core.shard_format import read_shard_set

    try:
        shard_set = read_shard_set(cfg.shards_dir)
    except ShardError as error:
        return [f"shards-dir: {error}"]
    problems = []
    if cfg.num_clients != shard_set.num_clients:
        problems.append(
            f"num-clients={cfg.num_clients}, but shards-dir {shard_set.directory} holds "
            f"{shard_set.num_clients} clients (leave num-clients out, or set it to that)"
        )
    if cfg.validation_fraction or cfg.server_fraction:
        problems.append(
            "validation-fraction and server-fraction apply when pflarena builds the data; a "
            "shards-dir run uses the shards' own splits and has no server-held data"
        )
    if cfg.label_permutation_groups:
        problems.append(
            "label-permutation-groups applies when pflarena builds the data; a shards-dir run "
            "holds the shards' labels (write the shards with it instead)"
        )
    if declaration.needs_validation and 0 in shard_set.num_val:
        problems.append(
            f"{cfg.strategy} needs a validation split, but some shards in {shard_set.directory} "
            "have none (write them with --validation-fraction > 0)"
        )
    if declaration.needs_server_data:
        problems.append(
            f"{cfg.strategy} needs server-held data, which a shards-dir run does not have"
        )
    try:
        check_model_fits(cfg.model_name(), shard_set.info)
    except ModelError as error:
        problems.append(f"shards-dir {shard_set.directory}: {error}")
    return problems


def own_method_keys(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """A stored run config without the other methods' ``<method>.<param>`` keys.

    A run's ``config.json`` holds every method's table as Flower fused it then, defaults
    included. A method whose default changed since would make that config a run that sets
    another method's parameter, which :func:`parse_run_config` refuses; the run's own
    method's keys (and every common key) are what the run used.
    """
    strategy = run_config.get("strategy", "")
    return {
        key: value
        for key, value in run_config.items()
        if "." not in key or key.startswith(f"{strategy}.")
    }


def parse_run_config(
    run_config: Mapping[str, Any], methods: Mapping[str, MethodDeclaration] | None = None
) -> RunConfig:
    """Validate a flat run config; raise :class:`ConfigError` naming every bad key.

    Parameters
    ----------
    run_config
        Flat keys: common ones (``num-clients``) and method ones (``ditto.lambda``).
    methods
        The declared methods by name. Given, every method key is validated against its
        method's parameters, ``strategy`` must name one of them, and a run that sets a
        training setting its method ignores, or another method's parameter, is refused.
        Without it (a ClientApp) method keys are kept unchecked.
    """
    common = {k: v for k, v in run_config.items() if "." not in k}
    dotted = {k: v for k, v in run_config.items() if "." in k}
    known = _common_keys()
    if methods is not None:
        known += [key for declaration in methods.values() for key in declaration.defaults()]
    try:
        cfg = RunConfig.model_validate(common).with_method_values(dotted)
    except ValidationError as exc:
        problems = [_describe(err, "", known) for err in exc.errors()]
        raise ConfigError("invalid run config:\n  " + "\n  ".join(problems)) from None
    if methods is not None:
        problems, normalized = _method_problems(cfg, methods, known)
        if problems:
            error = ConfigError("invalid run config:\n  " + "\n  ".join(problems))
            declaration = methods.get(cfg.strategy)
            if declaration is not None and not cfg.shards_dir:
                error.needed = tuple(
                    key
                    for key, needs, value in (
                        (
                            "validation-fraction",
                            declaration.needs_validation,
                            cfg.validation_fraction,
                        ),
                        ("server-fraction", declaration.needs_server_data, cfg.server_fraction),
                    )
                    if needs and value == 0
                )
            raise error
        cfg = cfg.with_method_values(normalized)
    return cfg


def toml_value(value: Any) -> str:
    """``value`` as a TOML value: run configs handed to Flower as a TOML file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string
