"""The data sets from the command line: ``pflarena data``, presets that need files, and
LEAF's character LSTM learning next-character prediction on a small synthetic corpus."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_data import write_fake_femnist, write_fake_shakespeare, write_fake_tiny_imagenet

from pflarena.cli import main
from pflarena.core.datasets import DATASETS, dataset_spec
from pflarena.core.federation import build_federation, clear_caches
from pflarena.core.presets import load_preset, preset_names

#: One preset per data set of this issue, at least.
FILE_PRESETS = ["page-shakespeare", "leaf-shakespeare", "ppfl-femnist", "leaf-femnist"]
FILE_PRESETS += [
    "page-tiny-imagenet",
    "page-cifar100",
    "pfedgt-har",
    "fedpg-fmnist",
    "fedpg-cifar100",
]


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PFLARENA_CACHE", str(tmp_path / "cache"))
    clear_caches()


def test_every_file_dataset_has_a_preset_and_each_preset_resolves() -> None:
    presets = {name: load_preset(name) for name in preset_names()}
    covered = {preset.config["dataset"] for preset in presets.values()}
    for name in ("shakespeare", "femnist", "tiny-imagenet"):
        assert name in covered
    for name in FILE_PRESETS:
        assert name in presets and presets[name].source
        strategy = ["--strategy", presets[name].strategies[-1]]  # a preset compares several
        code, out, err = cli(
            "run", "--preset", name, *strategy, "--check", "--output-dir", "/tmp/x"
        )
        assert code == 0, err
        assert f'dataset = "{presets[name].config["dataset"]}"' in out


@pytest.mark.parametrize("preset", FILE_PRESETS)
def test_a_preset_without_its_data_fails_naming_path_and_layout(
    preset: str, tmp_path: Path
) -> None:
    empty = tmp_path / "no-data"
    empty.mkdir()
    dataset = load_preset(preset).config["dataset"]
    strategy = ["--strategy", load_preset(preset).strategies[-1]]  # a preset compares several
    code, out, err = cli(
        "run", "--preset", preset, *strategy, "--data-dir", str(empty),
        "--output-dir", str(tmp_path / "run"),
    )  # fmt: skip
    # the error is the last line (the first names the engine the run would have used)
    assert code == 1 and err.strip().splitlines()[-1].startswith("pflarena run: error:"), err
    assert str(empty) in err
    layout_word = {
        "shakespeare": "all_data/*.json",
        "femnist": "all_data/*.json",
        "tiny-imagenet": "wnids.txt",
        "cifar100": "cifar-100-python",
        "har": "Inertial Signals",
        "fashion-mnist": "FashionMNIST/raw",
    }[dataset]
    assert layout_word in err
    assert not (tmp_path / "run" / "summary.json").exists()  # nothing started
    # No data-dir at all: the message says a folder is needed and what it must hold.
    code, _, err = cli("run", "--preset", preset, *strategy, "--output-dir", str(tmp_path / "run2"))
    assert code == 1 and "needs data-dir" in err and layout_word in err


def test_the_command_itself_fails_with_the_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pflarena.cli",
            "run",
            "--preset",
            "page-shakespeare",
            "--strategy",
            "page",
            "--data-dir",
            str(tmp_path),
            "--output-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"no LEAF shakespeare JSON files under {tmp_path / 'shakespeare' / 'data'}" in (
        result.stderr
    )


#: A fake copy for each new dataset, and the overrides that fit a preset to it.
FAKES = {
    "shakespeare": (write_fake_shakespeare, {"num-clients": 5, "min-client-samples": 0}),
    "femnist": (write_fake_femnist, {"num-clients": 4, "min-client-samples": 0}),
    "tiny-imagenet": (write_fake_tiny_imagenet, {}),
}


@pytest.mark.parametrize(
    "preset",
    ["page-shakespeare", "leaf-shakespeare", "ppfl-femnist", "leaf-femnist", "page-tiny-imagenet"],
)
def test_a_preset_starts_on_a_copy_in_the_real_layout(preset: str, tmp_path: Path) -> None:
    """What a run does before its first round: check the files, build every client's data
    and the server's share, build the model and score a batch."""
    import torch

    from pflarena.client.job import load_node_data
    from pflarena.core.datasets import check_files
    from pflarena.core.federation import load_server_data
    from pflarena.server.app import initial_arrays
    from pflarena.server.build import parse_config

    values = load_preset(preset).overrides("fedavg")
    write, fit = FAKES[values["dataset"]]
    write(tmp_path / "data")
    cfg = parse_config(values | fit | {"strategy": "fedavg", "data-dir": str(tmp_path / "data")})
    check_files(cfg.dataset, cfg.data_dir)
    federation = build_federation(cfg.federation_spec())
    assert len(federation.clients) == cfg.num_clients
    if cfg.server_fraction:
        assert len(load_server_data(cfg.federation_spec()).y) > 0
    assert len(initial_arrays(cfg)) > 0
    node = load_node_data(cfg, {"partition-id": 0}, torch.device("cpu"))
    from pflarena.core.models import build_model

    model = build_model(cfg.model_name(), node.info.input_shape, node.info.num_classes, seed=0)
    with torch.no_grad():
        logits = model.eval()(node.x_test[:4])
    assert logits.shape == (min(4, len(node.y_test)), node.info.num_classes)


def test_data_lists_every_dataset_and_shows_where_to_get_one() -> None:
    code, out, _ = cli("data")
    assert code == 0
    for name in DATASETS:
        assert f"| {name} | {dataset_spec(name).kind} |" in out
    assert "| shakespeare | natural | 80 | 80 ids < 80 | char-lstm |" in out
    code, out, _ = cli("data", "tiny-imagenet")
    assert code == 0 and "cs231n.stanford.edu/tiny-imagenet-200.zip" in out
    code, out, _ = cli("data", "digits")
    assert code == 0 and "no files needed" in out


def test_data_check_reads_a_local_copy(tmp_path: Path) -> None:
    write_fake_shakespeare(tmp_path / "leaf")
    write_fake_femnist(tmp_path / "leaf")
    code, out, err = cli("data", "shakespeare", "--check", "--data-dir", str(tmp_path / "leaf"))
    assert code == 0, err
    assert "shakespeare: 7 clients" in out and "shape (80,), dtype uint8" in out
    assert out.rstrip().endswith("ok")
    code, out, _ = cli(
        "data", "femnist", "--check", "--data-dir", str(tmp_path / "leaf"), "--num-clients", "3"
    )
    assert code == 0 and "femnist: 3 clients" in out and "(1, 28, 28)" in out
    code, out, err = cli("data", "femnist", "--check", "--data-dir", str(tmp_path / "nothing"))
    assert code == 1 and str(tmp_path / "nothing" / "femnist" / "data") in err


def test_data_check_reads_tiny_imagenet(tmp_path: Path) -> None:
    write_fake_tiny_imagenet(tmp_path, train_per_class=1, val_per_class=1)
    code, out, err = cli("data", "tiny-imagenet", "--check", "--data-dir", str(tmp_path))
    assert code == 0, err
    assert "tiny-imagenet: 400 samples in one pool" in out
    assert "200 of 200 classes present, range 0..199" in out


# --------------------------------------------------------------------------------------
# The character LSTM learns next-character prediction
# --------------------------------------------------------------------------------------

#: Lines over a cycle of the alphabet: the next character follows from the current one.
CYCLE = "abcdefghijklmnopqrstuvwxyz"


def cycle_roles() -> dict[str, list[str]]:
    return {
        f"ROLE{role}": [(CYCLE * 3)[start : start + 30] + "\n" for start in range(role, 26, 8)]
        for role in range(4)
    }


def most_frequent_share(clients) -> float:
    """Accuracy of always predicting the commonest next character of the test splits."""
    targets = np.concatenate([client.y_test for client in clients])
    return float(np.bincount(targets).max() / len(targets))


#: Required gain of mean per-character accuracy over the most-frequent-character baseline.
MARGIN = 0.3


@pytest.mark.slow
def test_shakespeare_preset_runs_and_the_lstm_learns_in_flower_simulation(
    tmp_path: Path,
) -> None:
    """`pflarena run --preset leaf-shakespeare` on a fake LEAF tree, scaled down: the run
    completes in Flower's simulation runtime and LEAF's character LSTM (2 x 256 units)
    learns next-character prediction, from 0 to about 0.8 mean per-character accuracy in
    5 FedAvg rounds against a most-frequent-character baseline of 0.08."""
    write_fake_shakespeare(tmp_path / "leaf", cycle_roles())
    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pflarena.cli",
            "run",
            "--preset",
            "leaf-shakespeare",
            "--strategy",
            "fedavg",
            "--data-dir",
            str(tmp_path / "leaf"),
            "--output-dir",
            str(out),
            "--quiet",
            *("--set", "num-clients=4", "--set", "min-client-samples=0"),
            *("--set", "fraction-train=1.0", "--set", "min-train-clients=1"),
            *("--set", "num-rounds=5", "--set", "eval-every=5", "--set", "local-epochs=2"),
            *("--set", "batch-size=10", "--set", "lr=2.0", "--set", "test-fraction=0.25"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={**__import__("os").environ, "PFLARENA_CACHE": str(tmp_path / "cache")},
    )
    stuck = out / "stuck-calls.txt"  # where a client that never answered was
    assert not stuck.exists(), stuck.read_text()[-12000:]
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["dataset"] == "shakespeare"
    config = json.loads((out / "config.json").read_text())["run_config"]
    assert config["model"] == "char-lstm"
    from pflarena.core.config import parse_run_config

    spec = parse_run_config(config).federation_spec()
    baseline = most_frequent_share(build_federation(spec).clients)
    final = summary["personalized"]["last"]["mean"]
    print(f"per-character accuracy {final:.3f}, most-frequent-character baseline {baseline:.3f}")
    assert final > baseline + MARGIN, (final, baseline)


def test_a_missing_shards_folder_is_named_as_missing(tmp_path: Path) -> None:
    """A shards folder that is not there is said to be missing, not to lack a manifest; a
    folder without one still says so."""
    missing = tmp_path / "no-such-shards"
    code, _, err = cli("run", "--shards-dir", str(missing), "--strategy", "fedavg", "--check")
    assert code == 2 and f"the shard directory {missing} does not exist" in err, err
    assert "manifest" not in err
    code, _, err = cli("run", "--shards-dir", str(tmp_path), "--strategy", "fedavg", "--check")
    assert code == 2 and f"no manifest.json in {tmp_path}: not a shard directory" in err


def test_one_shard_file_is_one(tmp_path: Path) -> None:
    code, out, _ = cli(
        "shards", "--dataset", "digits", "--partition", "iid", "--num-clients", "1",
        "--out", str(tmp_path / "one"),
    )  # fmt: skip
    assert code == 0 and f"wrote 1 shard file to {tmp_path / 'one'}" in out
