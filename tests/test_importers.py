"""Partitions made by PFLlib and LEAF, converted to shard files and run with shards-dir."""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import config, grid_for, run_local

from pflarena.cli import main
from pflarena.core import keys
from pflarena.core.datasets import to_tensors
from pflarena.core.importers import (
    LEAF_LETTERS,
    ImportFormatError,
    import_leaf,
    import_pfllib,
    read_pfllib_npz,
)
from pflarena.core.shard_format import load_shard, read_shard_set

SIZES = [(20 + 3 * i, 7 + 2 * i) for i in range(4)]  # (train, test) per client: all differ


def write_pfllib_folder(
    root: Path,
    *,
    plain: bool = False,
    seed: int = 0,
    num_classes: int | None = 10,
    labels: int = 10,
    numpy1: bool = False,
) -> list[dict]:
    """A small dataset folder in PFLlib's layout (dataset/utils/dataset_utils.py: save_file).

    Inputs are floats normalised the way PFLlib's MNIST generator does ((v - 0.5) / 0.5),
    labels are in ``0..labels-1`` (each client's test split holds the largest); returns each
    client's arrays. ``config.json`` has save_file's keys; ``num_classes=None`` leaves that
    key out, as the older generator that wrote PFLlib's committed dataset/MNIST/config.json
    did. ``numpy1`` writes the pickles as numpy 1.x did (``numpy.core.multiarray``), as in
    that committed partition's files.
    """
    rng = np.random.default_rng(seed)
    clients = []
    statistic = []
    for split in ("train", "test"):
        (root / split).mkdir(parents=True, exist_ok=True)
    for client_id, (n_train, n_test) in enumerate(SIZES):
        arrays = {}
        for split, n in (("train", n_train), ("test", n_test)):
            x = ((rng.random((n, 1, 28, 28)) - 0.5) / 0.5).astype(np.float32)
            y = rng.integers(0, labels, n).astype(np.int64)
            if split == "test":
                y[0] = labels - 1
            arrays[split] = {"x": x, "y": y}
            with open(root / split / f"{client_id}.npz", "wb") as handle:
                if plain:
                    np.savez_compressed(handle, x=x, y=y)
                elif numpy1:
                    _savez_as_numpy1(handle, {"x": x, "y": y})
                else:  # PFLlib's own call: a dict, pickled into the archive
                    np.savez_compressed(handle, data={"x": x, "y": y})
        clients.append(arrays)
        every = np.concatenate([arrays["train"]["y"], arrays["test"]["y"]])
        present, counts = np.unique(every, return_counts=True)
        statistic.append([[int(c), int(n)] for c, n in zip(present, counts, strict=True)])
    config = {
        "num_clients": len(SIZES),
        "num_classes": num_classes,
        "non_iid": True,
        "balance": False,
        "partition": "dir",
        "Size of samples for labels in clients": statistic,
        "alpha": 0.1,
        "batch_size": 10,
    }
    if num_classes is None:
        del config["num_classes"]
    (root / "config.json").write_text(json.dumps(config, separators=(",", ":")))
    return clients


def _savez_as_numpy1(handle, data: dict) -> None:
    """``np.savez_compressed(handle, data=data)`` as numpy 1.x wrote it: the pickle (protocol
    3, which names classes as text) names ``numpy.core`` where numpy 2 names ``numpy._core``."""
    array = np.array(data, dtype=object)
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, np.lib.format.header_data_from_array_1_0(array))
    buffer.write(pickle.dumps(array, protocol=3))
    payload = buffer.getvalue().replace(b"cnumpy._core.", b"cnumpy.core.")
    assert b"numpy._core" not in payload
    with zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data.npy", payload)


@pytest.mark.parametrize("plain", [False, True])
def test_pfllib_folder_becomes_one_shard_per_client_unchanged(tmp_path, plain):
    clients = write_pfllib_folder(tmp_path / "MNIST", plain=plain)
    paths = import_pfllib(tmp_path / "MNIST", tmp_path / "shards")
    assert [p.name for p in paths] == [f"client_{i:04d}.npz" for i in range(len(SIZES))]
    shard_set = read_shard_set(tmp_path / "shards")
    assert shard_set.source == "pfllib" and shard_set.info.name == "pfllib-mnist"
    assert (shard_set.info.num_classes, shard_set.info.input_shape) == (10, (1, 28, 28))
    assert shard_set.info.mean is None and shard_set.info.std is None
    for client_id, expected in enumerate(clients):
        data, info = load_shard(paths[client_id])
        assert data.client_id == client_id
        # PFLlib's split and its already-normalised floats, bit for bit
        for split in ("train", "test"):
            assert np.array_equal(getattr(data, f"x_{split}"), expected[split]["x"])
            assert np.array_equal(getattr(data, f"y_{split}"), expected[split]["y"])
        assert len(data.y_val) == 0
        x, _ = to_tensors(data.x_train, data.y_train, info)  # no normalisation on top
        assert np.array_equal(x.numpy(), expected["train"]["x"])


def test_pfllib_import_can_carve_a_validation_split(tmp_path):
    clients = write_pfllib_folder(tmp_path / "MNIST")
    import_pfllib(tmp_path / "MNIST", tmp_path / "shards", validation_fraction=0.25, seed=3)
    for client_id, expected in enumerate(clients):
        data, _ = load_shard(tmp_path / "shards" / f"client_{client_id:04d}.npz")
        n = len(expected["train"]["y"])
        assert (
            len(data.y_val) == int(np.ceil(0.25 * n)) and len(data.y_train) + len(data.y_val) == n
        )
        merged = np.concatenate([data.x_train, data.x_val])
        assert sorted(map(bytes, merged)) == sorted(map(bytes, expected["train"]["x"]))
        assert np.array_equal(data.x_test, expected["test"]["x"])


class _RunsCode:
    """Pickles to a call of os.system: what a malicious dataset file could hold."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pfllib_files_are_read_without_running_pickled_code(tmp_path):
    path = tmp_path / "0.npz"
    payload = np.empty((), dtype=object)
    payload[()] = {"x": np.zeros((2, 3), np.float32), "y": _RunsCode()}
    with open(path, "wb") as handle:
        np.savez_compressed(handle, data=payload)
    with pytest.raises(ImportFormatError, match=r"refusing to load (posix|os)\.system"):
        read_pfllib_npz(path)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda root: (root / "config.json").unlink(), "no config.json"),
        (lambda root: (root / "test" / "2.npz").unlink(), r"test/2\.npz not found"),
        (lambda root: (root / "train" / "1.npz").write_bytes(b"junk"), "cannot read"),
        (
            lambda root: np.savez(root / "train" / "0.npz", x=np.zeros((2, 1, 28, 28)), y=[3, 12]),
            r"labels 3\.\.12 outside 0\.\.9",
        ),
        (
            lambda root: np.savez(root / "train" / "0.npz", x=np.zeros((2, 1, 28, 28)), y=[1]),
            "2 samples but 1 labels",
        ),
        (
            lambda root: np.savez(root / "test" / "3.npz", x=np.zeros((2, 1, 8, 8)), y=[1, 2]),
            "differ in shape",
        ),
    ],
)
def test_a_damaged_pfllib_folder_is_refused_naming_the_problem(tmp_path, damage, message):
    write_pfllib_folder(tmp_path / "MNIST")
    damage(tmp_path / "MNIST")
    with pytest.raises(ImportFormatError, match=message):
        import_pfllib(tmp_path / "MNIST", tmp_path / "shards")


def test_two_rounds_of_fedavg_on_pfllib_shards_train_every_client_on_its_own_file(tmp_path):
    clients = write_pfllib_folder(tmp_path / "MNIST")
    import_pfllib(tmp_path / "MNIST", tmp_path / "shards")
    cfg = config(
        strategy="fedavg",
        shards_dir=str(tmp_path / "shards"),
        num_clients=len(SIZES),
        num_rounds=2,
        fraction_train=1.0,
        model="cnn-pfllib",
    )
    assert cfg.data_name() == "pfllib-mnist" and cfg.model_name() == "cnn-pfllib"
    grid = grid_for(cfg)
    replies = []
    grid.reply_filter = lambda reply: replies.append(reply) or reply
    outcome = run_local(cfg, tmp_path, grid)
    assert [r["round"] for r in outcome.rounds] == [0, 1, 2]
    trained = [
        r.content[keys.METRICS]
        for r in replies
        if keys.TRAIN_LOSS in r.content.get(keys.METRICS, {})
    ]
    assert len(trained) == 2 * len(SIZES)
    for metrics in trained:  # each client's training used its own file's training split
        assert metrics[keys.NUM_EXAMPLES] == len(
            clients[int(metrics[keys.CLIENT_ID])]["train"]["y"]
        )
    evaluation = outcome.rounds[-1]["evaluation"]["per_client"]
    assert {int(c): e["test_samples"] for c, e in evaluation.items()} == {
        i: len(c["test"]["y"]) for i, c in enumerate(clients)
    }


def test_shards_dir_takes_its_clients_and_refuses_what_does_not_fit(tmp_path, capsys):
    write_pfllib_folder(tmp_path / "MNIST")
    import_pfllib(tmp_path / "MNIST", tmp_path / "shards")
    shards = str(tmp_path / "shards")
    with pytest.raises(ValueError, match=r"num-clients=10, but shards-dir .* holds 4 clients"):
        config(strategy="fedavg", shards_dir=shards, num_clients=10)
    with pytest.raises(ValueError, match="the shards' own splits"):
        config(strategy="fedavg", shards_dir=shards, num_clients=4, validation_fraction=0.2)
    with pytest.raises(ValueError, match="pfedsv needs a validation split"):
        config(strategy="pfedsv", shards_dir=shards, num_clients=4)
    with pytest.raises(ValueError, match="no manifest.json"):
        config(strategy="fedavg", shards_dir=str(tmp_path), num_clients=4)
    # `pflarena run --shards-dir` takes num-clients from the manifest
    assert main(["run", "--shards-dir", shards, "--strategy", "fedavg", "--check"]) == 0
    assert "num-clients = 4\n" in capsys.readouterr().out


def leaf_file(users: dict[str, tuple[list, list]]) -> dict:
    return {
        "users": list(users),
        "num_samples": [len(y) for _, y in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }


def test_leaf_femnist_and_shakespeare_folders_become_shards(tmp_path):
    rng = np.random.default_rng(1)
    images = {
        split: {
            user: (rng.random((n, 784)).round(4).tolist(), rng.integers(0, 62, n).tolist())
            for user, n in (("f0001_14", 5 if split == "train" else 2), ("f0002_30", 3))
        }
        for split in ("train", "test")
    }
    for split, users in images.items():
        (tmp_path / "femnist" / split).mkdir(parents=True)
        (tmp_path / "femnist" / split / f"all_data_0_niid_0_keep_0_{split}_9.json").write_text(
            json.dumps(leaf_file(users))
        )
    import_leaf(tmp_path / "femnist", tmp_path / "femnist-shards", dataset="femnist")
    shard_set = read_shard_set(tmp_path / "femnist-shards")
    assert (shard_set.num_clients, shard_set.info.num_classes) == (2, 62)
    for client_id, user in enumerate(images["train"]):
        data, _ = load_shard(shard_set.path(client_id))
        for split in ("train", "test"):
            x, y = images[split][user]
            assert np.allclose(getattr(data, f"x_{split}").reshape(len(y), -1), np.float32(x))
            assert getattr(data, f"y_{split}").tolist() == y

    line = "ROMEO. But soft, what light through yonder window breaks? It is the east, and Jul"
    lines = {"train": [line[:80], line[1:80] + "i"], "test": [line[2:80] + "ie"]}
    labels = {"train": ["i", "e"], "test": ["t"]}
    for split in ("train", "test"):
        (tmp_path / "shakespeare" / split).mkdir(parents=True)
        (tmp_path / "shakespeare" / split / "data.json").write_text(
            json.dumps(
                leaf_file({"THE_TRAGEDY_OF_ROMEO_AND_JULIET_ROMEO": (lines[split], labels[split])})
            )
        )
    import_leaf(tmp_path / "shakespeare", tmp_path / "text-shards", dataset="shakespeare")
    shard_set = read_shard_set(tmp_path / "text-shards")
    assert shard_set.info.tokens and shard_set.info.vocabulary_size == len(LEAF_LETTERS) == 80
    data, info = load_shard(shard_set.path(0))
    # LEAF's word_to_indices / letter_to_index: the position in ALL_LETTERS
    for split in ("train", "test"):
        expected = [[LEAF_LETTERS.find(c) for c in text] for text in lines[split]]
        assert getattr(data, f"x_{split}").tolist() == expected
        assert getattr(data, f"y_{split}").tolist() == [LEAF_LETTERS.find(c) for c in labels[split]]
    assert to_tensors(data.x_train, data.y_train, info)[0].dtype.is_floating_point is False
    # a run on them gets LEAF's character LSTM; a model that reads numbers is refused
    text_shards = str(tmp_path / "text-shards")
    assert config(strategy="fedavg", shards_dir=text_shards, num_clients=1).model_name() == (
        "char-lstm"
    )
    with pytest.raises(ValueError, match="holds token ids"):
        config(strategy="fedavg", shards_dir=text_shards, num_clients=1, model="mlp")


def test_a_damaged_leaf_folder_is_refused_naming_the_problem(tmp_path):
    for split, users in (
        ("train", {"a": ([[0.0] * 784], [1])}),
        ("test", {"b": ([[0.0] * 784], [1])}),
    ):
        (tmp_path / split).mkdir()
        (tmp_path / split / "x.json").write_text(json.dumps(leaf_file(users)))
    with pytest.raises(ImportFormatError, match="different users"):
        import_leaf(tmp_path, tmp_path / "out", dataset="femnist")
    with pytest.raises(ImportFormatError, match="unknown LEAF data set"):
        import_leaf(tmp_path, tmp_path / "out", dataset="celeba")
    with pytest.raises(ImportFormatError, match=r"train/\*\.json and test/\*\.json"):
        import_leaf(tmp_path / "nowhere", tmp_path / "out", dataset="femnist")


@pytest.mark.slow
def test_pflarena_run_on_an_imported_pfllib_folder_in_flower_simulation(tmp_path):
    """2 rounds of FedAvg through `pflarena run --shards-dir`: each simulated client
    evaluates on its own file (all test sizes differ), num-clients from the manifest."""
    import subprocess
    import sys

    clients = write_pfllib_folder(tmp_path / "MNIST")
    assert main(["shards", "import", "--format", "pfllib", str(tmp_path / "MNIST"),
                 "--out", str(tmp_path / "shards")]) == 0  # fmt: skip
    result = subprocess.run(
        [
            sys.executable, "-m", "pflarena.cli", "run", "--shards-dir",
            str(tmp_path / "shards"), "--strategy", "fedavg", "--num-rounds", "2",
            "--fraction-train", "1.0", "--model", "cnn-pfllib", "--output-dir",
            str(tmp_path / "run"), "--quiet",
        ],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["dataset"], summary["num_clients"], summary["rounds_completed"]) == (
        "pfllib-mnist",
        len(SIZES),
        2,
    )
    rounds = [
        json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()
    ]
    for record in rounds:
        per_client = record["evaluation"]["per_client"]
        assert {int(c): e["test_samples"] for c, e in per_client.items()} == {
            i: len(c["test"]["y"]) for i, c in enumerate(clients)
        }
    assert [r["train"]["clients"] for r in rounds[1:]] == [len(SIZES), len(SIZES)]


def _set_num_classes(root, value):
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps(config | {"num_classes": value}))


def _empty_client(root, split):
    np.savez(root / split / "1.npz", x=np.zeros((0, 1, 28, 28), np.float32), y=np.zeros(0, int))


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda root: _set_num_classes(root, 10**12),
            r"num_classes=1000000000000 is outside 2\.\.",
        ),
        (lambda root: _set_num_classes(root, 1), r"num_classes=1 is outside 2\.\."),
        (lambda root: _empty_client(root, "train"), "client 1 .* has no training samples"),
        (lambda root: _empty_client(root, "test"), "client 1 .* has no test samples"),
    ],
)
def test_pfllib_import_bounds_classes_and_refuses_empty_clients(tmp_path, damage, message):
    write_pfllib_folder(tmp_path / "MNIST")
    damage(tmp_path / "MNIST")
    with pytest.raises(ImportFormatError, match=message):
        import_pfllib(tmp_path / "MNIST", tmp_path / "shards")
    assert not (tmp_path / "shards" / "manifest.json").exists()


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


@pytest.mark.parametrize("labels", [10, 7])
def test_a_pfllib_config_without_num_classes_imports_with_the_classes_inferred(
    tmp_path, capsys, labels
):
    """PFLlib's older generator (its committed dataset/MNIST) wrote no num_classes: the
    count is the largest label plus one, said in the output and recorded in the manifest."""
    clients = write_pfllib_folder(tmp_path / "MNIST", num_classes=None, labels=labels, numpy1=True)
    assert "num_classes" not in json.loads((tmp_path / "MNIST" / "config.json").read_text())
    out = tmp_path / "shards"
    assert main(["shards", "import", "--format", "pfllib", str(tmp_path / "MNIST"),
                 "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert f"config.json has no num_classes: {labels} classes inferred from the labels" in printed
    assert f"pfllib-mnist: {labels} classes" in printed
    assert read_shard_set(out).info.num_classes == labels
    assert _manifest(out)["import"] == {
        "num_classes_source": "inferred",
        "largest_label": labels - 1,
        "labels_present": labels,
    }
    for client_id, expected in enumerate(clients):  # numpy 1.x pickles read bit for bit
        data, _ = load_shard(out / f"client_{client_id:04d}.npz")
        assert np.array_equal(data.x_test, expected["test"]["x"])
        assert np.array_equal(data.y_train, expected["train"]["y"])


def test_a_pfllib_num_classes_below_the_labels_is_refused_naming_both_numbers(tmp_path):
    write_pfllib_folder(tmp_path / "MNIST", num_classes=8, labels=10)
    with pytest.raises(
        ImportFormatError,
        match=r"/0\.npz: labels \d\.\.9 outside 0\.\.7 \(.*config\.json says num_classes=8; "
        r"the labels need num_classes >= 10\)",
    ):
        import_pfllib(tmp_path / "MNIST", tmp_path / "shards")
    assert not (tmp_path / "shards" / "manifest.json").exists()


def test_pfllib_num_classes_given_must_agree_with_config_and_labels(tmp_path, capsys):
    folder, out = tmp_path / "MNIST", tmp_path / "shards"

    def run(*flags: str) -> int:
        return main(["shards", "import", "--format", "pfllib", str(folder), "--out", str(out),
                     *flags])  # fmt: skip

    # config.json says 10: the same count given is taken, another is refused naming both
    write_pfllib_folder(folder, num_classes=10)
    assert run("--num-classes", "10") == 0
    assert _manifest(out)["import"]["num_classes_source"] == "given"
    assert "inferred" not in capsys.readouterr().out
    assert run("--num-classes", "12") == 1
    assert "num_classes=12 was given but" in capsys.readouterr().err
    with pytest.raises(ImportFormatError, match=r"num_classes=12 was given but .* num_classes=10"):
        import_pfllib(folder, out, num_classes=12)
    # no num_classes in config.json, labels 0..6: 10 classes declares three no client holds
    write_pfllib_folder(folder, num_classes=None, labels=7)
    assert run("--num-classes", "10") == 0
    assert read_shard_set(out).info.num_classes == 10
    assert _manifest(out)["import"] == {
        "num_classes_source": "given",
        "largest_label": 6,
        "labels_present": 7,
    }
    # ... but a count the labels exceed is refused, naming both numbers
    assert run("--num-classes", "5") == 1
    err = capsys.readouterr().err
    assert "outside 0..4 (num_classes=5 was given; the labels need num_classes >= 7)" in err
    assert run("--num-classes", "1") == 1
    assert "num_classes=1 is outside 2.." in capsys.readouterr().err
    with pytest.raises(ImportFormatError, match="not a whole number"):
        import_pfllib(folder, out, num_classes="ten")  # type: ignore[arg-type]
    # and only PFLlib folders take it
    assert run("--num-classes", "10", "--format", "leaf-femnist") == 2


def test_a_pfllib_folder_whose_labels_are_all_one_class_needs_num_classes(tmp_path):
    write_pfllib_folder(tmp_path / "MNIST", num_classes=None, labels=1)
    with pytest.raises(ImportFormatError, match=r"every label is 0: give the number of classes"):
        import_pfllib(tmp_path / "MNIST", tmp_path / "shards")
    import_pfllib(tmp_path / "MNIST", tmp_path / "shards", num_classes=2)
    assert read_shard_set(tmp_path / "shards").info.num_classes == 2
