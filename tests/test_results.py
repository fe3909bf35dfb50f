import json

import pytest

from pflarena.server.results import (
    OutputDirError,
    ResultsWriter,
    plot_run,
    read_rounds,
    summarize_rounds,
)


def _eval(mean, weighted):
    stats = {"mean": mean, "weighted": weighted, "std": 0.1, "worst10": mean - 0.2}
    return {
        "personalized": stats,
        "global": {**stats, "mean": weighted},
        "per_client": {"0": {"personalized": mean, "test_samples": 10}},
    }


def test_summary_last_and_best(tmp_path):
    rounds = [
        {"round": 0, "evaluation": _eval(0.1, 0.1)},
        {"round": 1, "evaluation": _eval(0.8, 0.7), "bytes_up": 10, "bytes_down": 20},
        {"round": 2, "bytes_up": 10, "bytes_down": 20},
        {"round": 3, "evaluation": _eval(0.6, 0.75), "bytes_up": 10, "bytes_down": 20},
    ]
    summary = summarize_rounds(rounds)
    assert summary["personalized"]["last"]["mean"] == 0.6
    assert summary["personalized"]["last"]["round"] == 3
    assert summary["personalized"]["best"] == {
        "mean": 0.8,
        "weighted": 0.7,
        "std": 0.1,
        "worst10": pytest.approx(0.6),
        "round": 1,
    }
    assert summary["global"]["best"]["round"] == 3
    assert summary["bytes_up"] == 30 and summary["bytes_down"] == 60
    assert summary["rounds_completed"] == 3


def test_no_global_model_gives_null():
    rounds = [
        {
            "round": 1,
            "evaluation": {"personalized": _eval(0.5, 0.5)["personalized"], "global": None},
        }
    ]
    assert summarize_rounds(rounds)["global"] is None


def test_writer_never_overwrites_results(tmp_path):
    writer = ResultsWriter(tmp_path / "run")
    writer.append_round({"round": 0, "evaluation": _eval(0.5, 0.5)})
    writer.write_summary({"status": "completed"})
    writer.close()
    with pytest.raises(OutputDirError, match="already holds results"):
        ResultsWriter(tmp_path / "run")
    # What was written is intact.
    assert read_rounds(tmp_path / "run" / "rounds.jsonl")[0]["round"] == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"


def test_rounds_are_on_disk_before_close(tmp_path):
    writer = ResultsWriter(tmp_path / "run")
    writer.append_round({"round": 1, "x": float("nan")})
    # Read back without closing: the line was flushed, NaN stored as null.
    assert read_rounds(tmp_path / "run" / "rounds.jsonl") == [{"round": 1, "x": None}]
    writer.close()


def test_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "rounds.jsonl"
    path.write_text('{"round": 0}\n{"round": 1}\n{"round": 2, "evalu')
    assert [r["round"] for r in read_rounds(path)] == [0, 1]


def test_plots_written(tmp_path):
    writer = ResultsWriter(tmp_path / "run")
    for r in range(3):
        writer.append_round({"round": r, "evaluation": _eval(0.3 + 0.1 * r, 0.3)})
    writer.close()
    written = plot_run(tmp_path / "run")
    assert {p.name for p in written} == {"accuracy.png", "client_accuracy.png"}
    assert all(p.stat().st_size > 1000 for p in written)


def test_archive_run_copies_only_the_result_files_of_a_completed_run(tmp_path):
    from pflarena.server.results import archive_run

    run = tmp_path / "runs" / "a0.1-r2-fedavg"
    writer = ResultsWriter(run)
    writer.append_round({"round": 0, "evaluation": _eval(0.5, 0.5)})
    writer.write_config({"run_config": {"strategy": "fedavg"}})
    writer.write_summary({"status": "failed"})
    writer.close()
    (run / "checkpoint.npz").write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="no completed run"):
        archive_run(run, tmp_path / "archive")
    assert not (tmp_path / "archive").exists()

    (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    dest = archive_run(run, tmp_path / "archive")
    assert dest == tmp_path / "archive" / "a0.1-r2-fedavg"
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "rounds.jsonl", "summary.json"]
    for name in ("config.json", "rounds.jsonl", "summary.json"):
        assert (dest / name).read_bytes() == (run / name).read_bytes()
    # archiving again (the run was replaced) overwrites the copy
    (run / "summary.json").write_text(json.dumps({"status": "completed", "x": 1}))
    archive_run(run, tmp_path / "archive")
    assert json.loads((dest / "summary.json").read_text())["x"] == 1
    # extra files go along where the run has them; missing ones are skipped
    (run / "gammas.csv").write_text("round,gamma\n1,0.5\n")
    archive_run(run, tmp_path / "archive", extra=("gammas.csv", "absent.png"))
    assert (dest / "gammas.csv").read_text() == "round,gamma\n1,0.5\n"
    assert not (dest / "absent.png").exists()
