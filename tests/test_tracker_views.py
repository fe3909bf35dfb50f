"""What the trackers show beyond the scalars: TensorBoard's HParams view (read back from the
event file), Weights & Biases offline (read back from its run file), and MLflow's artifacts
beside its store whatever the current directory. The three trackers are in the ``dev``
extra: imported here, so that a broken install fails these tests instead of skipping them."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from wandb.proto import wandb_internal_pb2

from pflarena.server.build import parse_config
from pflarena.server.trackers import artifact_root, open_trackers
from tests.test_trackers import _config_record, _png, _records


def _cfg(tmp_path, tracker, **extra):
    return parse_config(
        {
            "strategy": "ditto",
            "ditto.lambda": 0.25,
            "num-clients": 2,
            "output-dir": str(tmp_path / "run"),
            "tracker": tracker,
        }
        | extra
    )


def _log_a_run(cfg) -> Path:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True)
    trackers = open_trackers(cfg, out, _config_record(cfg))
    assert [t.name for t in trackers.trackers] == cfg.tracker.split(","), trackers.failures
    for record in _records():
        trackers.log_round(record)
    (out / "summary.json").write_text(json.dumps({"status": "completed"}))
    (out / "accuracy.png").write_bytes(_png())
    trackers.finish({"status": "completed", "personalized": {"last": {"mean": 0.7}}}, out)
    assert trackers.failures == {}
    return out


def test_tensorboard_writes_the_hparams_view_into_the_run_s_own_event_file(tmp_path):
    out = _log_a_run(_cfg(tmp_path, "tensorboard"))
    # one event file, no run directory of its own (add_hparams would make one)
    assert [p.name for p in (out / "tensorboard").iterdir() if p.is_dir()] == []
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    assert set(content) >= {"_hparams_/experiment", "_hparams_/session_start_info"}
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["ditto.lambda"].number_value == 0.25
    assert start.hparams["num-clients"].number_value == 2
    assert start.hparams["strategy"].string_value == "ditto"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]
    ).experiment
    metrics = {m.name.tag for m in experiment.metric_infos}
    assert {"personalized/mean", "global/pooled"} <= metrics
    # the view's metrics are this run's scalars
    assert metrics <= set(events.Tags()["scalars"])


def _wandb_records(path: Path):
    """The records of a W&B run file (``run-<id>.wandb``): W&B's LevelDB-style log (a
    7-byte header, 32 KiB blocks of checksummed chunks), each a ``Record`` protobuf. wandb
    0.2x no longer ships a Python reader (its Go core writes the file), hence this one."""
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    index, pending = 7, b""
    while index + 7 <= len(data):
        space = 32768 - index % 32768
        if space < 7:  # a block's zero padding
            index += space
            continue
        _crc, length, kind = struct.unpack("<IHB", data[index : index + 7])
        chunk = data[index + 7 : index + 7 + length]
        index += 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk if kind == 4 else chunk)
            pending = b""
            yield record
        elif kind in (2, 3):  # first, middle
            pending += chunk


def _finished_wandb_run(out: Path) -> list:
    """The records of the W&B run logged in ``out``; wandb's core process may still be
    writing the file as finish() returns, so it is read once it ends with the exit record."""
    run_id = json.loads((out / "trackers.json").read_text())["wandb_run_id"]
    (run_file,) = (out / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        records = list(_wandb_records(run_file))
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        time.sleep(0.5)
    return records


def test_wandb_offline_logs_the_config_rounds_and_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = _log_a_run(_cfg(tmp_path, "wandb", **{"tracking-experiment": "arena-test"}))
    records = _finished_wandb_run(out)
    runs, history, summary, exits = [], [], {}, []
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            runs.append(record.run)
        elif kind == "history":
            history.append(
                {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
            )
        elif kind == "summary":
            summary |= {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.summary.update
            }
        elif kind == "exit":
            exits.append(record.exit.exit_code)
    run = runs[0]
    assert run.project == "arena-test" and run.display_name == "run"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["ditto.lambda"] == 0.25 and config["num-clients"] == 2
    rounds = [h for h in history if "personalized/mean" in h]
    assert [h["_step"] for h in rounds] == [0, 1, 2]
    assert [round(h["personalized/mean"], 6) for h in rounds] == [0.5, 0.6, 0.7]
    assert [round(h["global/pooled"], 6) for h in rounds] == [0.45, 0.46, 0.47]
    assert rounds[-1]["personalized/per_client/_type"] == "histogram"
    assert summary["final/personalized/mean/last"] == 0.7 and summary["status"] == "completed"
    assert any("plots/accuracy/_type" in h for h in history)
    assert exits == [0]


def test_mlflow_keeps_artifacts_beside_its_store_whatever_the_current_directory(
    tmp_path, monkeypatch
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = tmp_path / "store"
    # a relative sqlite:/// URI, given where the command runs ...
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path, "mlflow", **{"tracking-uri": "sqlite:///store/mlflow.db"})
    assert cfg.tracking_uri == f"sqlite:///{store / 'mlflow.db'}"
    # ... and the ServerApp running in another directory
    monkeypatch.chdir(elsewhere)
    out = _log_a_run(cfg)
    assert list(elsewhere.iterdir()) == []  # no ./artifacts, no ./mlruns
    client = MlflowClient(tracking_uri=cfg.tracking_uri)
    run_id = json.loads((out / "trackers.json").read_text())["mlflow_run_id"]
    artifact_uri = client.get_run(run_id).info.artifact_uri
    assert artifact_uri.startswith((store / "artifacts").as_uri())
    assert artifact_root(cfg.tracking_uri) == store / "artifacts"
    assert list((store / "artifacts").rglob("accuracy.png"))


def test_an_experiment_made_elsewhere_keeps_its_place_and_says_so(tmp_path, monkeypatch, caplog):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    other = tmp_path / "other-artifacts"
    MlflowClient(tracking_uri=uri).create_experiment("pflarena", artifact_location=other.as_uri())
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path, "mlflow", **{"tracking-uri": uri})
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.propagate = True
    try:
        with caplog.at_level(logging.WARNING):
            _log_a_run(cfg)
    finally:
        FLOWER_LOGGER.propagate = False
    assert "keeps its artifacts in" in caplog.text and str(other) in caplog.text


def test_a_relative_sqlite_store_in_mlflow_tracking_uri_is_made_absolute_where_set(
    tmp_path, monkeypatch
):
    from pflarena.server.trackers import default_tracking_uri

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///db/mlflow.db")
    assert default_tracking_uri() == f"sqlite:///{tmp_path.resolve() / 'db' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert default_tracking_uri() == "http://tracking.example:5000"


def test_a_sweep_s_wandb_runs_share_a_group_and_are_named_by_their_place(tmp_path, monkeypatch):
    from pflarena.server.trackers import SweepGroup

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sweep = tmp_path / "my-sweep"
    cfg = _cfg(tmp_path, "wandb", **{"output-dir": str(sweep / "all" / "ditto" / "seed-0")})
    group = SweepGroup.open(cfg, sweep, planned=1)
    member = group.member(cfg)
    assert member.tracking_group == "sweep my-sweep" and not member.tracking_parent
    out = _log_a_run(member)
    (run,) = [r.run for r in _finished_wandb_run(out) if r.WhichOneof("record_type") == "run"]
    assert run.run_group == "sweep my-sweep"
    assert run.display_name == "all/ditto/seed-0"
