"""The experiment trackers (pflarena/server/trackers.py), checked by reading back what was
logged: MLflow's client on a real local store, TensorBoard's own event reader (both in the
``dev`` extra: imported, so that a broken install fails here instead of skipping)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pflarena.cli import main
from pflarena.core.config import ConfigError
from pflarena.server.build import parse_config
from pflarena.server.trackers import (
    SweepGroup,
    TrackerSet,
    check_available,
    default_tracking_uri,
    open_trackers,
    round_metrics,
)


def _uri(tmp_path: Path) -> str:
    return default_tracking_uri(tmp_path)


def _records():
    """Three rounds as the run loop records them (two clients)."""
    out = []
    for number in range(3):
        out.append(
            {
                "round": number,
                "elapsed_s": float(number),
                "round_time_s": 0.5,
                "bytes_up": 1000 * number,
                "bytes_down": 2000 * number,
                "train": {"loss": 2.0 - number / 2, "clients": 2, "failures": 0, "server": {}}
                if number
                else None,
                "evaluation": {
                    "personalized": {"mean": 0.5 + number / 10, "weighted": 0.6, "worst10": 0.3},
                    "global": {"mean": 0.4, "weighted": 0.45 + number / 100, "worst10": 0.2},
                    "per_client": {
                        "0": {"personalized": 0.3 + number / 10, "test_samples": 10},
                        "1": {"personalized": 0.7, "test_samples": 30},
                    },
                },
            }
        )
    return out


def _cfg(tmp_path, **extra):
    return parse_config(
        {
            "strategy": "ditto",
            "ditto.lambda": 0.25,
            "num-clients": 2,
            "output-dir": str(tmp_path / "run"),
            "tracker": "mlflow,tensorboard",
            "tracking-uri": _uri(tmp_path),
        }
        | extra
    )


def _config_record(cfg):
    from pflarena.server.build import declaration_of

    return {
        "run_config": cfg.to_run_config(),
        "method": "ditto",
        "method_params": cfg.params(declaration_of(cfg)).model_dump(by_alias=True),
        "model": cfg.model_name(),
    }


def test_unknown_trackers_and_missing_extras_are_named(monkeypatch):
    with pytest.raises(ConfigError, match="unknown tracker 'neptune'"):
        parse_config({"tracker": "mlflow,neptune"})
    assert parse_config({"tracker": " mlflow , tensorboard "}).tracker == "mlflow,tensorboard"
    import builtins

    real = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name == "mlflow":
            raise ImportError("No module named 'mlflow'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    with pytest.raises(ConfigError, match=r"pip install 'pflarena\[mlflow\]'"):
        check_available(["mlflow"])


def test_the_default_store_is_mlflow_tracking_uri_else_a_local_one(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert default_tracking_uri(tmp_path) == "http://tracking.example:5000"


def test_round_metrics_name_each_figure():
    metrics = round_metrics(_records()[2])
    assert metrics["personalized/mean"] == pytest.approx(0.7)
    assert metrics["global/pooled"] == pytest.approx(0.47)
    assert metrics["global/mean"] == pytest.approx(0.4)
    assert metrics["personalized/worst10"] == pytest.approx(0.3)
    assert metrics["traffic/bytes_up"] == 2000 and metrics["train/loss"] == 1.0


def test_a_run_logged_to_both_trackers_reads_back(tmp_path):
    cfg = _cfg(tmp_path)
    out = Path(cfg.output_dir)
    out.mkdir()
    trackers = open_trackers(cfg, out, _config_record(cfg))
    assert [t.name for t in trackers.trackers] == ["mlflow", "tensorboard"]
    for record in _records():
        trackers.log_round(record)
    (out / "summary.json").write_text(json.dumps({"status": "completed"}))
    (out / "accuracy.png").write_bytes(_png())
    summary = {
        "status": "completed",
        "personalized": {"last": {"mean": 0.7, "weighted": 0.6, "worst10": 0.3}},
        "method": {"dp": {"epsilon": 3.5}},
    }
    trackers.finish(summary, out)
    assert trackers.failures == {}

    # MLflow, read back with its client
    client = MlflowClient(tracking_uri=cfg.tracking_uri)
    run_id = json.loads((out / "trackers.json").read_text())["mlflow_run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["ditto.lambda"] == "0.25" and run.data.params["num-clients"] == "2"
    history = client.get_metric_history(run_id, "personalized/mean")
    assert [(m.step, round(m.value, 6)) for m in history] == [(0, 0.5), (1, 0.6), (2, 0.7)]
    assert [m.value for m in client.get_metric_history(run_id, "client/0/personalized")] == [
        pytest.approx(0.3),
        pytest.approx(0.4),
        pytest.approx(0.5),
    ]
    assert client.get_metric_history(run_id, "final/dp_epsilon")[0].value == 3.5
    artifacts = {f.path for f in client.list_artifacts(run_id)}
    assert {"summary.json", "accuracy.png", "metric-definitions.json", "per-client"} <= artifacts
    table = json.loads(
        Path(
            client.download_artifacts(run_id, "per-client/round-0002.json", str(tmp_path))
        ).read_text()
    )
    assert table["personalized_accuracy"] == {"0": pytest.approx(0.5), "1": pytest.approx(0.7)}

    # TensorBoard, read back with its event reader
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"histograms": 0})
    events.Reload()
    pooled = events.Scalars("global/pooled")
    assert [(e.step, round(e.value, 6)) for e in pooled] == [(0, 0.45), (1, 0.46), (2, 0.47)]
    histograms = events.Histograms("personalized/per_client")
    assert [h.step for h in histograms] == [0, 1, 2]
    assert histograms[-1].histogram_value.num == 2  # two clients
    assert histograms[-1].histogram_value.sum == pytest.approx(1.2)
    assert "plots/accuracy" in events.Tags()["images"]


def test_a_failing_tracker_is_dropped_and_the_others_go_on(tmp_path):
    class Broken:
        name = "broken"

        def log_round(self, record):
            raise OSError("disk full")

    class Kept:
        name = "kept"

        def __init__(self):
            self.rounds = []

        def log_round(self, record):
            self.rounds.append(record["round"])

    kept = Kept()
    trackers = TrackerSet([Broken(), kept])
    for record in _records():
        trackers.log_round(record)
    assert kept.rounds == [0, 1, 2]
    assert trackers.failures == {"broken": "OSError: disk full"}
    assert [t.name for t in trackers.trackers] == ["kept"]


def test_a_tracker_that_cannot_start_is_left_out(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cfg = _cfg(tmp_path, **{"tracking-uri": f"sqlite:///{blocker}/under-a-file/mlflow.db"})
    out = Path(cfg.output_dir)
    out.mkdir()
    trackers = open_trackers(cfg, out, _config_record(cfg))
    assert [t.name for t in trackers.trackers] == ["tensorboard"]
    assert "mlflow" in trackers.failures


def test_a_sweep_groups_its_runs_under_one_parent_run(tmp_path):
    cfg = _cfg(tmp_path)
    group = SweepGroup.open(cfg, tmp_path / "sweep", planned=2)
    assert group.parent_id
    again = SweepGroup.open(cfg, tmp_path / "sweep", planned=2)  # a continued sweep
    assert again.parent_id == group.parent_id
    client = MlflowClient(tracking_uri=cfg.tracking_uri)
    for seed in (0, 1):
        member = group.member(cfg.model_copy(update={"seed": seed}))
        out = tmp_path / f"run-{seed}"
        out.mkdir()
        trackers = open_trackers(member, out, _config_record(member))
        trackers.log_round(_records()[0])
    board = tmp_path / "leaderboard.md"
    board.write_text("# board\n")
    group.finish([board], complete=True)
    children = client.search_runs(
        [client.get_experiment_by_name("pflarena").experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{group.parent_id}'",
    )
    assert len(children) == 2
    assert sorted(run.info.run_name for run in children) == [
        f"{tmp_path.parent.name}/{tmp_path.name}/run-{seed}" for seed in (0, 1)
    ]
    assert client.get_run(group.parent_id).info.status == "FINISHED"
    assert [f.path for f in client.list_artifacts(group.parent_id)] == ["leaderboard.md"]


@pytest.mark.slow
def test_a_real_run_logs_from_the_server_app_and_survives_a_broken_tracker(tmp_path, capsys):
    """A whole run (in-process engine) with both trackers: what MLflow and TensorBoard hold
    is what the run's own files say; then a run whose MLflow store cannot be opened still
    completes and writes all its files."""
    uri = _uri(tmp_path)
    common = ["run", "--engine", "inprocess", "--strategy", "fedavg", "--num-clients", "3"]
    common += ["--num-rounds", "2", "--set", "fraction-train=1.0"]
    out = tmp_path / "ok"
    code = main(
        [
            *common,
            "--tracker",
            "mlflow,tensorboard",
            "--tracking-uri",
            uri,
            "--output-dir",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr()
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    client = MlflowClient(tracking_uri=uri)
    run_id = json.loads((out / "trackers.json").read_text())["mlflow_run_id"]
    history = client.get_metric_history(run_id, "personalized/mean")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == [
        r["evaluation"]["personalized"]["mean"] for r in rounds
    ]
    assert client.get_run(run_id).data.params["strategy"] == "fedavg"
    assert {"summary.json", "accuracy.png", "client_accuracy.png"} <= {
        f.path for f in client.list_artifacts(run_id)
    }
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("global/pooled")] == [  # stored as float32
        pytest.approx(r["evaluation"]["global"]["weighted"], rel=1e-6) for r in rounds
    ]

    blocker = tmp_path / "file"
    blocker.write_text("")
    broken = tmp_path / "broken"
    code = main(
        [
            *common,
            "--tracker",
            "mlflow",
            "--tracking-uri",
            f"sqlite:///{blocker}/x/mlflow.db",
            "--output-dir",
            str(broken),
        ]
    )
    assert code == 0
    assert json.loads((broken / "summary.json").read_text())["status"] == "completed"
    assert (broken / "accuracy.png").exists() and (broken / "rounds.jsonl").exists()
    assert "tracker mlflow failed" in capsys.readouterr().err


def _png() -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [0, 1])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def test_a_resumed_run_continues_its_mlflow_run(tmp_path):
    cfg = _cfg(tmp_path, tracker="mlflow")
    out = Path(cfg.output_dir)
    out.mkdir()
    first = open_trackers(cfg, out, _config_record(cfg))
    first.log_round(_records()[0])
    first.finish(
        {"status": "interrupted", "client_failures": {"text": "1 of 2 clients failed in round 0"}},
        out,
    )
    client = MlflowClient(tracking_uri=cfg.tracking_uri)
    stopped = client.get_run(first.trackers[0].run_id)
    assert stopped.info.status == "KILLED"  # resumable: not FAILED
    assert stopped.data.tags["pflarena.client_failures"] == "1 of 2 clients failed in round 0"
    resumed = cfg.model_copy(update={"resume": True})
    again = open_trackers(resumed, out, _config_record(resumed))
    (tracker,) = again.trackers
    assert tracker.run_id == first.trackers[0].run_id
    for record in _records()[1:]:
        again.log_round(record)
    again.finish({"status": "completed"}, out)
    assert client.get_run(tracker.run_id).info.status == "FINISHED"
    assert client.get_run(tracker.run_id).data.tags["pflarena.client_failures"] == "none"
    steps = [m.step for m in client.get_metric_history(tracker.run_id, "personalized/mean")]
    assert sorted(steps) == [0, 1, 2]
    assert len(client.search_runs([client.get_experiment_by_name("pflarena").experiment_id])) == 1


def test_a_file_store_works_where_mlflow_allows_it(tmp_path, monkeypatch):
    """MLflow 3 refuses its file store unless MLFLOW_ALLOW_FILE_STORE is set; with it set, a
    ``file:`` tracking URI is logged to and read back like the default SQLite store."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    cfg = _cfg(tmp_path, tracker="mlflow", **{"tracking-uri": uri})
    out = Path(cfg.output_dir)
    out.mkdir()
    trackers = open_trackers(cfg, out, _config_record(cfg))
    for record in _records():
        trackers.log_round(record)
    trackers.finish({"status": "completed"}, out)
    assert trackers.failures == {}
    run_id = trackers.trackers[0].run_id
    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "global/pooled")
    assert [round(m.value, 6) for m in history] == [0.45, 0.46, 0.47]
    assert (tmp_path / "mlruns").is_dir()
