"""Experiment trackers: a run logged to MLflow, TensorBoard and/or Weights & Biases from the
ServerApp.

The ServerApp records the rounds (:mod:`pflarena.server.loop`), so the trackers log from
there, and a run logs the same way in a simulation and in a deployment (``flwr run . ...
--run-config "tracker='mlflow'"``). ``tracker`` names them (``mlflow``, ``tensorboard``,
``wandb``, or several, comma-separated); each needs its optional dependency (``pip install
'pflarena[mlflow]'``, ``'pflarena[tensorboard]'``, ``'pflarena[wandb]'``).

What is logged, per run:

- the run config and the method's parameters (MLflow params; TensorBoard's HParams view
  and a text table; W&B's run config);
- per round: the personalized accuracy (mean over clients, pooled, worst 10 %), the global
  model's accuracy (pooled and mean over clients), the bytes sent each way, the training
  loss, and the per-client personalized accuracies (MLflow: one metric per client,
  ``client/<id>/personalized``, and a ``per-client/round-<r>.json`` table; TensorBoard: a
  histogram);
- at the end: ``summary.json``, ``config.json`` and the run's plots as artifacts, the
  summary's headline figures and the run's status.

MLflow: ``tracking-uri`` (empty: ``$MLFLOW_TRACKING_URI``, else ``./mlruns`` of the current
directory: a local SQLite store), the experiment ``tracking-experiment``, and, for a sweep's
runs, ``tracking-parent``: the sweep's parent run (``mlflow.parentRunId``). A local SQLite
store keeps the artifacts beside its database (``<store>/artifacts``), whatever the current
directory. A resumed run continues its MLflow run (its id is kept in
``<output-dir>/trackers.json``). TensorBoard writes event files to
``<output-dir>/tensorboard`` (``tensorboard --logdir`` on a runs or sweep directory shows
every run below it). Weights & Biases: the project ``tracking-experiment``, its files under
``<output-dir>/wandb``; ``WANDB_MODE=offline`` logs without an account (``wandb sync``
uploads later), a resumed run continues its W&B run.

A tracker never costs the run its own files: an error in a tracker is logged once as a
warning and that tracker is dropped; the run goes on and writes its results as always.
"""

from __future__ import annotations

import json
import os
import sys
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from pflarena.core.config import ConfigError, RunConfig
from pflarena.core.trackers_spec import (
    TRACKERS,
    absolute_sqlite_uri,
    sqlite_store_path,
    tracker_names,
)
from pflarena.server.metrics import definitions

__all__ = [
    "MLflowTracker",
    "SweepGroup",
    "TensorBoardTracker",
    "TrackerSet",
    "WandbTracker",
    "check_available",
    "artifact_root",
    "default_tracking_uri",
    "open_trackers",
    "round_metrics",
]

#: Where a run keeps what its trackers need to continue it (the MLflow run id).
STATE_FILE = "trackers.json"


def check_available(names: list[str]) -> None:
    """Raise :class:`ConfigError` naming the extra to install for a tracker that cannot be
    imported (before a run starts, so that it does not fail later)."""
    modules = {"mlflow": "mlflow", "tensorboard": "torch.utils.tensorboard", "wandb": "wandb"}
    for name in names:
        try:
            __import__(modules[name])
        except ImportError as exc:
            raise ConfigError(
                f"--tracker {name} needs its optional dependency: pip install "
                f"'pflarena[{TRACKERS[name]}]' ({exc})"
            ) from None


def default_tracking_uri(cwd: Path | None = None) -> str:
    """``$MLFLOW_TRACKING_URI``, else a local store in ``mlruns/`` of ``cwd`` (default: the
    current directory): the SQLite database ``mlruns/mlflow.db`` (MLflow's own local
    default since its file store went into maintenance; ``mlflow ui --backend-store-uri
    sqlite:///mlruns/mlflow.db`` shows it), artifacts in ``mlruns/artifacts``."""
    if os.environ.get("MLFLOW_TRACKING_URI"):  # a relative sqlite:/// made absolute here
        return absolute_sqlite_uri(os.environ["MLFLOW_TRACKING_URI"])
    root = ((cwd or Path.cwd()) / "mlruns").resolve()
    return f"sqlite:///{root / 'mlflow.db'}"


def _mlflow_client(uri: str) -> Any:
    import mlflow

    uri = absolute_sqlite_uri(uri)
    if (path := sqlite_store_path(uri)) is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return mlflow.MlflowClient(tracking_uri=uri)


def artifact_root(uri: str) -> Path | None:
    """Where a local SQLite store keeps its runs' artifacts: ``artifacts/`` beside its
    database; None for other stores (a ``file:`` store keeps them inside itself, a server
    decides for itself)."""
    path = sqlite_store_path(uri)
    return None if path is None else path.parent / "artifacts"


def _experiment_id(client: Any, name: str, uri: str) -> str:
    """The experiment ``name``, made when missing; with a local SQLite store its artifacts
    go beside the database (MLflow would put them under the current directory, which for a
    simulation is a scratch directory removed at the end). An experiment made by another
    tool keeps the place it was given; if that is a local folder away from the store, it is
    said once."""
    root = artifact_root(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        location = str(experiment.artifact_location or "")
        local = location.removeprefix("file://")
        if root is not None and local.startswith("/") and not Path(local).is_relative_to(root):
            log(
                WARNING,
                "pflarena: the MLflow experiment %r keeps its artifacts in %s (set when it was "
                "made); a new --tracking-experiment keeps them in %s",
                name,
                location,
                root,
            )
        return experiment.experiment_id
    location = None if root is None else root.as_uri()
    return client.create_experiment(name, artifact_location=location)


def round_metrics(record: dict[str, Any]) -> dict[str, float]:
    """The scalar metrics of one round's record, by name (accuracies as fractions)."""
    out: dict[str, float] = {}
    evaluation = record.get("evaluation") or {}
    for scope in ("personalized", "global"):
        stats = evaluation.get(scope) or {}
        for key, name in (("mean", "mean"), ("weighted", "pooled"), ("worst10", "worst10")):
            value = stats.get(key)
            if isinstance(value, int | float):
                out[f"{scope}/{name}"] = float(value)
    for key in ("bytes_up", "bytes_down"):
        if isinstance(record.get(key), int | float):
            out[f"traffic/{key}"] = float(record[key])
    train = record.get("train") or {}
    if isinstance(train.get("loss"), int | float):
        out["train/loss"] = float(train["loss"])
    for key, value in (train.get("server") or {}).items():
        if isinstance(value, int | float):
            out[f"method/{key}"] = float(value)
    if isinstance(record.get("round_time_s"), int | float):
        out["time/round_s"] = float(record["round_time_s"])
    return out


def _per_client(record: dict[str, Any]) -> dict[str, float]:
    per_client = (record.get("evaluation") or {}).get("per_client") or {}
    return {
        str(client): float(values["personalized"])
        for client, values in per_client.items()
        if isinstance(values, dict) and isinstance(values.get("personalized"), int | float)
    }


def _params(config_record: dict[str, Any]) -> dict[str, str]:
    """The run config and the method's parameters, flat (``<method>.<param>``)."""
    run_config = dict(config_record.get("run_config", {}))
    method = config_record.get("method", run_config.get("strategy", ""))
    params = {k: v for k, v in run_config.items() if "." not in k}
    params |= {f"{method}.{k}": v for k, v in (config_record.get("method_params") or {}).items()}
    params["model"] = config_record.get("model", "")
    return {k: str(v) for k, v in sorted(params.items())}


def _typed_params(config_record: dict[str, Any]) -> dict[str, Any]:
    """:func:`_params` with each value's own type (numbers stay numbers)."""
    run_config = dict(config_record.get("run_config", {}))
    method = config_record.get("method", run_config.get("strategy", ""))
    params = {k: v for k, v in run_config.items() if "." not in k}
    params |= {f"{method}.{k}": v for k, v in (config_record.get("method_params") or {}).items()}
    params["model"] = config_record.get("model", "")
    return {
        k: v if isinstance(v, bool | int | float | str) else json.dumps(v)
        for k, v in sorted(params.items())
    }


#: The figures TensorBoard's HParams view shows against the parameters.
HPARAM_METRICS = (
    ("personalized", "mean"),
    ("personalized", "pooled"),
    ("personalized", "worst10"),
    ("global", "pooled"),
)


def _summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    out = {}
    for scope in ("personalized", "global"):
        for point in ("last", "best"):
            block = ((summary.get(scope) or {}).get(point)) or {}
            for key, name in (("mean", "mean"), ("weighted", "pooled"), ("worst10", "worst10")):
                if isinstance(block.get(key), int | float):
                    out[f"final/{scope}/{name}/{point}"] = float(block[key])
    for key in ("wall_time_s", "startup_s", "rounds_time_s", "bytes_up", "bytes_down"):
        if isinstance(summary.get(key), int | float):
            out[f"final/{key}"] = float(summary[key])
    epsilon = (((summary.get("method") or {}).get("dp")) or {}).get("epsilon")
    if isinstance(epsilon, int | float):
        out["final/dp_epsilon"] = float(epsilon)
    return out


class MLflowTracker:
    """One MLflow run per pflarena run, through :class:`mlflow.MlflowClient` (no global
    active-run state, so several runs of one process do not mix)."""

    name = "mlflow"

    def __init__(self, cfg: RunConfig, output_dir: Path, config_record: dict[str, Any]) -> None:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

        uri = absolute_sqlite_uri(cfg.tracking_uri or default_tracking_uri())
        self.client = _mlflow_client(uri)
        experiment_id = _experiment_id(self.client, cfg.tracking_experiment, uri)
        state = _read_state(output_dir)
        if cfg.resume and state.get("mlflow_run_id"):
            self.run_id = state["mlflow_run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        name = _run_name(cfg, output_dir)
        tags = {
            MLFLOW_RUN_NAME: name,
            "pflarena.strategy": cfg.strategy,
            "pflarena.dataset": cfg.data_name(),
            "pflarena.seed": str(cfg.seed),
            "pflarena.output_dir": str(output_dir),
        }
        if cfg.tracking_parent:
            tags[MLFLOW_PARENT_RUN_ID] = cfg.tracking_parent
        run = self.client.create_run(experiment_id, tags=tags, run_name=name)
        self.run_id = run.info.run_id
        _write_state(output_dir, {"mlflow_run_id": self.run_id})
        from mlflow.entities import Param

        params = _params(config_record)
        items = [Param(k, v[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow's batch limit on params
            self.client.log_batch(self.run_id, params=items[start : start + 100])
        self.client.log_dict(self.run_id, definitions(), "metric-definitions.json")

    def log_round(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step = int(record["round"])
        stamp = _millis()
        metrics = [Metric(k, v, stamp, step) for k, v in round_metrics(record).items()]
        per_client = _per_client(record)
        metrics += [
            Metric(f"client/{client}/personalized", value, stamp, step)
            for client, value in per_client.items()
        ]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit on metrics
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])
        if per_client:
            self.client.log_dict(
                self.run_id,
                {"round": step, "personalized_accuracy": per_client},
                f"per-client/round-{step:04d}.json",
            )

    def finish(self, summary: dict[str, Any], output_dir: Path, files: list[Path]) -> None:
        from mlflow.entities import Metric

        stamp = _millis()
        metrics = [Metric(k, v, stamp, 0) for k, v in _summary_metrics(summary).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)
        self.client.set_tag(self.run_id, "pflarena.status", str(summary.get("status")))
        self.client.set_tag(self.run_id, "pflarena.client_failures", _failures_text(summary))
        for path in files:
            self.client.log_artifact(self.run_id, str(path))
        # An interrupted run can be resumed: MLflow's KILLED, not FAILED.
        status = {"completed": "FINISHED", "interrupted": "KILLED"}.get(
            str(summary.get("status")), "FAILED"
        )
        self.client.set_terminated(self.run_id, status=status)


class TensorBoardTracker:
    """Event files in ``<output-dir>/tensorboard`` (torch's ``SummaryWriter``)."""

    name = "tensorboard"

    def __init__(self, cfg: RunConfig, output_dir: Path, config_record: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.dir = output_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.dir))
        params = _params(config_record)
        table = "| key | value |\n|---|---|\n" + "".join(
            f"| {k} | {v} |\n" for k, v in params.items()
        )
        self.writer.add_text("config", table, 0)
        self._write_hparams(config_record)
        self.writer.add_text(
            "metric-definitions", json.dumps(definitions(), indent=2).replace("\n", "  \n"), 0
        )
        self.writer.flush()

    def _write_hparams(self, config_record: dict[str, Any]) -> None:
        """The run config and method parameters for TensorBoard's HParams view, written
        into this run's own event file (``SummaryWriter.add_hparams`` would open a run
        directory of its own, apart from the scalars), with the headline figures as its
        metrics: the view reads their values from this run's scalars."""
        from torch.utils.tensorboard.summary import hparams

        values = {
            key: value if isinstance(value, bool | int | float | str) else str(value)
            for key, value in _typed_params(config_record).items()
        }
        metrics = {f"{scope}/{name}": 0.0 for scope, name in HPARAM_METRICS}
        for summary in hparams(values, metrics):
            self.writer.file_writer.add_summary(summary)

    def log_round(self, record: dict[str, Any]) -> None:
        import numpy as np

        step = int(record["round"])
        for key, value in round_metrics(record).items():
            self.writer.add_scalar(key, value, step)
        per_client = _per_client(record)
        if per_client:
            self.writer.add_histogram(
                "personalized/per_client",
                np.asarray(list(per_client.values()), dtype=float),
                step,
                bins=np.linspace(0.0, 1.0, 21),
            )
        self.writer.flush()

    def finish(self, summary: dict[str, Any], output_dir: Path, files: list[Path]) -> None:
        for key, value in _summary_metrics(summary).items():
            self.writer.add_scalar(key, value, 0)
        self.writer.add_text("summary", "```\n" + json.dumps(summary, indent=2) + "\n```", 0)
        import matplotlib.image

        for path in files:
            if path.suffix == ".png":
                image = matplotlib.image.imread(str(path))
                self.writer.add_image(f"plots/{path.stem}", image[..., :3], 0, dataformats="HWC")
        self.writer.close()


class WandbTracker:
    """One Weights & Biases run per pflarena run (``wandb.init`` with
    ``reinit="create_new"`` and the run object's own methods, so several runs of one
    process do not mix). Its files go to ``<output-dir>/wandb``; ``WANDB_MODE=offline``
    logs without an account or network (``wandb sync <output-dir>/wandb/offline-run-*``
    uploads later). A resumed run continues its W&B run (its id kept in ``trackers.json``)."""

    name = "wandb"

    def __init__(self, cfg: RunConfig, output_dir: Path, config_record: dict[str, Any]) -> None:
        import wandb

        state = _read_state(output_dir)
        resume = cfg.resume and state.get("wandb_run_id")
        self.run = wandb.init(
            project=cfg.tracking_experiment,
            name=_run_name(cfg, output_dir),
            group=cfg.tracking_group or None,
            dir=str(output_dir),
            config=_typed_params(config_record),
            tags=[cfg.strategy, cfg.data_name()],
            id=state["wandb_run_id"] if resume else None,
            resume="must" if resume else None,
            reinit="create_new",
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        self.step = 0
        if not resume:
            _write_state(output_dir, {"wandb_run_id": self.run.id})
        self.run.summary["metric_definitions"] = definitions()

    def log_round(self, record: dict[str, Any]) -> None:
        import wandb

        values: dict[str, Any] = dict(round_metrics(record))
        per_client = _per_client(record)
        if per_client:
            values["personalized/per_client"] = wandb.Histogram(
                list(per_client.values()), num_bins=20
            )
        self.step = int(record["round"])
        self.run.log(values, step=self.step)

    def finish(self, summary: dict[str, Any], output_dir: Path, files: list[Path]) -> None:
        import wandb

        self.run.summary.update(_summary_metrics(summary))
        self.run.summary["status"] = str(summary.get("status"))
        self.run.summary["client_failures"] = _failures_text(summary)
        images = {
            f"plots/{path.stem}": wandb.Image(str(path)) for path in files if path.suffix == ".png"
        }
        if images:  # at the last round's step (W&B refuses a step that goes back)
            self.run.log(images, step=self.step)
        for path in files:
            if path.suffix != ".png":
                self.run.save(str(path), base_path=str(path.parent), policy="now")
        self.run.finish(exit_code=0 if summary.get("status") == "completed" else 1)


def _failures_text(summary: dict[str, Any]) -> str:
    """The run's client failures in one line (``summary.json``'s ``client_failures``)."""
    return str((summary.get("client_failures") or {}).get("text") or "none")


_CLASSES = {"mlflow": MLflowTracker, "tensorboard": TensorBoardTracker, "wandb": WandbTracker}


class TrackerSet:
    """The run's trackers; every call guarded: a failing tracker is dropped with a warning."""

    def __init__(self, trackers: list[Any]) -> None:
        self.trackers = trackers
        self.failures: dict[str, str] = {}

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:  # noqa: BLE001 (a tracker must never end the run)
                self._drop(tracker.name, exc)
                self.trackers.remove(tracker)

    def _drop(self, name: str, exc: BaseException) -> None:
        self.failures[name] = f"{type(exc).__name__}: {exc}"
        log(
            WARNING,
            "pflarena: tracker %s failed (%s: %s); it logs nothing more, the run goes on "
            "and its own files are written as always",
            name,
            type(exc).__name__,
            exc,
        )

    def log_round(self, record: dict[str, Any]) -> None:
        self._each("log_round", record)

    def finish(self, summary: dict[str, Any], output_dir: Path) -> None:
        files = [
            output_dir / name
            for name in ("summary.json", "config.json", "rounds.jsonl")
            if (output_dir / name).exists()
        ]
        files += sorted(output_dir.glob("*.png")) + sorted(output_dir.glob("*.csv"))
        self._each("finish", summary, output_dir, files)


def open_trackers(cfg: RunConfig, output_dir: Path, config_record: dict[str, Any]) -> TrackerSet:
    """The trackers ``cfg.tracker`` names, started; one that cannot start is left out with
    a warning (the run goes on)."""
    trackers = TrackerSet([])
    for name in tracker_names(cfg.tracker):
        try:
            trackers.trackers.append(_CLASSES[name](cfg, output_dir, config_record))
        except Exception as exc:  # noqa: BLE001 (a tracker must never end the run)
            trackers._drop(name, exc)
    return trackers


class SweepGroup:
    """A sweep's runs grouped in the trackers: in MLflow, one parent run (named after the
    sweep's directory, its id kept in ``<out>/trackers.json`` so that continuing the sweep
    continues it) whose children are the sweep's runs, and which gets the leaderboard as
    artifacts at the end. TensorBoard needs nothing: ``tensorboard --logdir <out>`` shows
    every run of the sweep, each under its directory. A failure here only warns: the runs
    are run and tracked on their own."""

    def __init__(self, client: Any = None, parent_id: str = "", group: str = "") -> None:
        self.client, self.parent_id, self.group = client, parent_id, group

    @classmethod
    def open(cls, cfg: RunConfig, out: Path, planned: int) -> SweepGroup:
        group = f"sweep {out.name}" if cfg.tracker else ""
        if "mlflow" not in tracker_names(cfg.tracker):
            return cls(group=group)
        try:
            from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

            uri = absolute_sqlite_uri(cfg.tracking_uri or default_tracking_uri())
            client = _mlflow_client(uri)
            experiment_id = _experiment_id(client, cfg.tracking_experiment, uri)
            parent_id = _read_state(out).get("mlflow_parent_run_id", "")
            if parent_id:
                client.update_run(parent_id, status="RUNNING")
            else:
                name = f"sweep {out.name}"
                run = client.create_run(
                    experiment_id,
                    tags={MLFLOW_RUN_NAME: name, "pflarena.sweep": str(out)},
                    run_name=name,
                )
                parent_id = run.info.run_id
                out.mkdir(parents=True, exist_ok=True)
                _write_state(out, {"mlflow_parent_run_id": parent_id})
                client.log_param(parent_id, "planned_runs", str(planned))
            return cls(client, parent_id, group)
        except Exception as exc:  # noqa: BLE001 (the sweep runs untracked as a group)
            print(
                f"pflarena sweep: warning: the MLflow parent run could not be opened "
                f"({type(exc).__name__}: {exc}); each run is tracked on its own",
                file=sys.stderr,
            )
            return cls(group=group)

    def member(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` as a member of the sweep: a child of its MLflow parent run, in its W&B
        group."""
        update = {"tracking_group": self.group} if self.group else {}
        if self.parent_id:
            update["tracking_parent"] = self.parent_id
        return cfg.model_copy(update=update) if update else cfg

    def finish(self, files: list[Path], complete: bool) -> None:
        """The leaderboard's files as the parent run's artifacts; the parent run ended
        (``FINISHED``, or ``FAILED`` while some runs did not complete)."""
        if not self.parent_id:
            return
        try:
            for path in files:
                self.client.log_artifact(self.parent_id, str(path))
            self.client.set_terminated(self.parent_id, status="FINISHED" if complete else "FAILED")
        except Exception as exc:  # noqa: BLE001 (the leaderboard files are written already)
            print(
                f"pflarena sweep: warning: the leaderboard was not logged to MLflow "
                f"({type(exc).__name__}: {exc})",
                file=sys.stderr,
            )


def _run_name(cfg: RunConfig, output_dir: Path) -> str:
    """A run's name in a tracker: a sweep's run is ``<setting>/<method>/seed-<s>`` under the
    sweep's directory (its folder name alone, ``seed-0``, would not tell them apart)."""
    if cfg.tracking_parent or cfg.tracking_group:
        return "/".join(output_dir.parts[-3:])
    return output_dir.name


def _millis() -> int:
    import time

    return int(time.time() * 1000)


def _read_state(output_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((output_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_state(output_dir: Path, values: dict[str, Any]) -> None:
    path = output_dir / STATE_FILE
    path.write_text(json.dumps(_read_state(output_dir) | values) + "\n")
