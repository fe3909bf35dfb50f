"""LEAF Shakespeare and FEMNIST, read from small fakes in LEAF's real JSON layout."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_data import (
    LEAF_LETTERS,
    fake_roles,
    femnist_image,
    shakespeare_samples,
    write_fake_femnist,
    write_fake_shakespeare,
    write_leaf_file,
)

from pflarena.core import federation as fed
from pflarena.core.config import ConfigError, parse_run_config
from pflarena.core.datasets import (
    SHAKESPEARE_VOCABULARY,
    DatasetError,
    check_files,
    dataset_spec,
    decode_characters,
    encode_text,
    leaf,
    load_femnist,
    load_shakespeare,
    to_tensors,
)
from pflarena.core.federation import (
    FederationSpec,
    build_federation,
    clear_caches,
    load_server_data,
)
from pflarena.core.shard_format import (
    ShardError,
    load_shard,
    write_shards,
)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test decodes into its own cache folder, and starts with empty memo caches."""
    monkeypatch.setenv("PFLARENA_CACHE", str(tmp_path / "cache"))
    clear_caches()


def ids(text: str) -> list[int]:
    return [LEAF_LETTERS.index(character) for character in text]


def client_sets(dataset) -> list[set[tuple]]:
    """Each client's samples as a set of (window ids, target) or (image bytes, label)."""
    return [{(x[row].tobytes(), int(y[row])) for row in range(len(y))} for x, y in dataset.clients]


# --------------------------------------------------------------------------------------
# Shakespeare
# --------------------------------------------------------------------------------------


def test_vocabulary_is_leafs_80_characters() -> None:
    assert SHAKESPEARE_VOCABULARY == LEAF_LETTERS and len(set(LEAF_LETTERS)) == 80
    encoded, unknown = encode_text("To be, or not}\n")
    assert encoded.tolist() == ids("To be, or not}\n") and unknown == 0
    assert decode_characters(encoded) == "To be, or not}\n"
    # Outside the vocabulary (here '|', 'é' and a tab): LEAF's unknown symbol, the space.
    encoded, unknown = encode_text("a|é\tb")
    assert encoded.tolist() == ids("a   b") and unknown == 3


@pytest.mark.parametrize("layout", ["all_data", "split"])
def test_shakespeare_roles_windows_and_targets(tmp_path: Path, layout: str) -> None:
    users = write_fake_shakespeare(tmp_path, layout=layout)
    data = load_shakespeare(tmp_path, num_clients=0)
    assert data.info.name == "shakespeare" and data.info.num_classes == 80
    assert data.info.input_shape == (80,) and data.info.vocabulary_size == 80
    # Every role with at least 2 windows, in name order; the one-window role is dropped.
    kept = sorted(role for role, (_, ys) in users.items() if len(ys) >= 2)
    assert "A_TINY_ROLE" not in kept and len(data.clients) == len(kept) == 7
    for (x, y), role in zip(data.clients, kept, strict=True):
        xs, ys = users[role]
        assert x.dtype == np.uint8 and x.shape == (len(ys), 80) and y.dtype == np.int64
        assert y.min() >= 0 and y.max() < 80
        expected = {
            (tuple(ids(window)), ids(target)[0]) for window, target in zip(xs, ys, strict=True)
        }
        assert {(tuple(x[r].tolist()), int(y[r])) for r in range(len(y))} == expected
    if layout == "all_data":  # all_data keeps each role's window order
        x, y = data.clients[0]
        xs, ys = users[kept[0]]
        assert decode_characters(x[3]) == xs[3] and decode_characters(y[:4]) == "".join(ys[:4])


def test_the_split_layout_reunites_each_roles_samples(tmp_path: Path) -> None:
    write_fake_shakespeare(tmp_path / "a", layout="all_data")
    write_fake_shakespeare(tmp_path / "b", layout="split")
    whole = load_shakespeare(tmp_path / "a", num_clients=0)
    split = load_shakespeare(tmp_path / "b", num_clients=0)
    assert client_sets(whole) == client_sets(split)


def test_leaf_filter_keeps_users_with_more_than_k_samples(tmp_path: Path) -> None:
    users = write_fake_shakespeare(tmp_path)
    counts = sorted(len(ys) for _, ys in users.values())
    k = counts[3]  # LEAF's remove_users.py keeps num_samples > k
    data = load_shakespeare(tmp_path, num_clients=0, min_client_samples=k)
    assert sorted(len(y) for _, y in data.clients) == [c for c in counts if c > k]


def test_choosing_fewer_roles_is_seeded(tmp_path: Path) -> None:
    write_fake_shakespeare(tmp_path)
    every = client_sets(load_shakespeare(tmp_path, num_clients=0))
    picks = {
        seed: client_sets(load_shakespeare(tmp_path, num_clients=3, seed=seed)) for seed in range(6)
    }
    for seed, chosen in picks.items():
        assert len(chosen) == 3 and all(client in every for client in chosen)
        # In name order: the chosen roles appear in the order of the full list.
        positions = [every.index(client) for client in chosen]
        assert positions == sorted(positions)
        assert client_sets(load_shakespeare(tmp_path, num_clients=3, seed=seed)) == chosen
    assert len({tuple(every.index(c) for c in chosen) for chosen in picks.values()}) > 1


def test_too_many_clients_gives_the_counts(tmp_path: Path) -> None:
    write_fake_shakespeare(tmp_path)
    with pytest.raises(DatasetError, match=r"has 7 users .* fewer than num_clients=8"):
        load_shakespeare(tmp_path, num_clients=8)
    with pytest.raises(DatasetError, match="has 0 users with more than 1000"):
        load_shakespeare(tmp_path, num_clients=1, min_client_samples=1000)


def test_shakespeare_federation_uses_leafs_per_role_split(tmp_path: Path) -> None:
    write_fake_shakespeare(tmp_path)
    spec = FederationSpec(
        dataset="shakespeare", num_clients=7, data_dir=str(tmp_path), test_fraction=0.2
    )
    assert spec.partition == "natural"
    federation = build_federation(spec)
    roles = load_shakespeare(tmp_path, num_clients=7)
    for client, (x, y) in zip(federation.clients, roles.clients, strict=True):
        n = len(y)
        # LEAF's split_data.py: max(1, int(frac · n)) training samples, the rest for testing.
        assert len(client.y_train) == max(1, int(0.8 * n)) and len(client.y_test) == n - len(
            client.y_train
        )
        pieces = [client.x_train, client.x_test]
        got = {
            (row.tobytes(), int(t))
            for xs, ys in zip(pieces, [client.y_train, client.y_test], strict=True)
            for row, t in zip(xs, ys, strict=True)
        }
        assert got == {(x[r].tobytes(), int(y[r])) for r in range(n)}
        assert client.x_train.dtype == np.uint8
    clear_caches()
    again = build_federation(spec)
    for a, b in zip(federation.clients, again.clients, strict=True):
        assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    other = build_federation(spec.model_copy(update={"seed": 1}))
    assert any(
        not np.array_equal(a.y_test, b.y_test)
        for a, b in zip(federation.clients, other.clients, strict=True)
    )


def test_token_samples_reach_the_model_as_int64_ids(tmp_path: Path) -> None:
    write_fake_shakespeare(tmp_path)
    federation = build_federation(
        FederationSpec(dataset="shakespeare", num_clients=7, data_dir=str(tmp_path))
    )
    client = federation.clients[0]
    x, y = to_tensors(client.x_train, client.y_train, federation.info)
    assert x.dtype == torch.int64 and x.shape == (len(client.y_train), 80)
    assert torch.equal(x, torch.from_numpy(client.x_train.astype(np.int64)))
    assert y.dtype == torch.int64


def test_max_client_samples_caps_each_role_and_the_server_share_stays_apart(
    tmp_path: Path,
) -> None:
    write_fake_shakespeare(tmp_path)
    base = {"dataset": "shakespeare", "num_clients": 7, "data_dir": str(tmp_path)}
    spec = FederationSpec(**base, max_client_samples=40, server_fraction=0.1)
    capped = build_federation(spec)
    rows = fed._federation_rows(spec)  # by pool index: windows repeat within a role
    roles = load_shakespeare(tmp_path, num_clients=7)
    start = 0
    for client_id, (client, (_, y)) in enumerate(zip(capped.clients, roles.clients, strict=True)):
        n = len(y)
        own = np.arange(start, start + n)
        start += n
        held = math.ceil(0.1 * n)
        kept = np.concatenate([rows.train[client_id], rows.test[client_id]])
        assert len(kept) == len(client.y_train) + len(client.y_test) == min(40, n - held)
        assert np.isin(kept, own).all() and len(np.unique(kept)) == len(kept)
        assert np.isin(rows.server, own).sum() == held
        assert not np.isin(kept, rows.server).any()
    assert len(load_server_data(spec).y) == len(rows.server)
    # The choice is seeded and differs between seeds.
    clear_caches()
    assert np.array_equal(fed._federation_rows(spec).train[0], rows.train[0])
    other = fed._federation_rows(spec.model_copy(update={"seed": 1}))
    assert not all(np.array_equal(a, b) for a, b in zip(other.train, rows.train, strict=True))


def test_leaf_keys_are_checked_against_the_dataset(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max-client-samples applies to natively federated"):
        FederationSpec(dataset="digits", max_client_samples=5)
    with pytest.raises(ValueError, match="min-client-samples applies to shakespeare, femnist"):
        FederationSpec(dataset="har", num_clients=30, min_client_samples=5)


def test_a_run_on_shakespeare_gets_the_lstm_and_refuses_image_models(tmp_path: Path) -> None:
    cfg = parse_run_config({"dataset": "shakespeare", "data-dir": str(tmp_path)})
    assert cfg.model_name() == "char-lstm"
    with pytest.raises(ConfigError, match="holds token ids"):
        parse_run_config({"dataset": "shakespeare", "model": "mlp"})
    with pytest.raises(ConfigError, match="reads token ids"):
        parse_run_config({"dataset": "digits", "model": "char-lstm"})


def test_token_shards_keep_their_vocabulary(tmp_path: Path) -> None:
    write_fake_shakespeare(tmp_path)
    spec = FederationSpec(dataset="shakespeare", num_clients=7, data_dir=str(tmp_path))
    federation = build_federation(spec)
    (path, *_) = write_shards(federation, tmp_path / "shards", spec)
    client, info = load_shard(path)
    assert info == federation.info and info.vocabulary_size == 80
    assert np.array_equal(client.x_train, federation.clients[0].x_train)
    with np.load(path) as archive:
        arrays = dict(archive)
    metadata = json.loads(str(arrays["metadata"][0]))
    del metadata["vocabulary_size"]
    arrays["metadata"] = np.array([json.dumps(metadata)])
    np.savez(path, **arrays)
    with pytest.raises(ShardError, match="metadata lacks: vocabulary_size") as error:
        load_shard(path)
    assert str(path) in str(error.value)


# --------------------------------------------------------------------------------------
# Missing and malformed files
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["shakespeare", "femnist"])
def test_missing_leaf_files_name_the_folder_and_the_layout(tmp_path: Path, name: str) -> None:
    with pytest.raises(DatasetError) as error:
        check_files(name, tmp_path)
    message = str(error.value)
    assert str(tmp_path / name / "data") in message
    assert f"{name}/data/all_data/*.json" in message and "user_data" in message
    assert "preprocess.sh" in message
    with pytest.raises(DatasetError, match="needs data-dir"):
        check_files(name, "")
    loader = load_shakespeare if name == "shakespeare" else load_femnist
    with pytest.raises(DatasetError, match=str(tmp_path / name / "data")):
        loader(tmp_path, num_clients=1)


def test_half_a_split_is_named(tmp_path: Path) -> None:
    write_leaf_file(tmp_path / "shakespeare" / "data" / "train" / "a.json", {})
    with pytest.raises(DatasetError, match="holds LEAF JSON files but .*test holds none"):
        check_files("shakespeare", tmp_path)


def _shakespeare_file(tmp_path: Path) -> Path:
    return tmp_path / "shakespeare" / "data" / "all_data" / "all_data.json"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "cannot read LEAF file"),
        (json.dumps([1, 2]), "found list"),
        (json.dumps({"users": ["a"], "num_samples": [1]}), "found .'num_samples', 'users'."),
        (
            json.dumps({"users": ["a", "b"], "num_samples": [1], "user_data": {}}),
            "2 users but 1 entry",
        ),
        (json.dumps({"users": ["a"], "num_samples": [1], "user_data": {}}), "user 'a' has no"),
        (
            json.dumps(
                {
                    "users": ["a"],
                    "num_samples": [2],
                    "user_data": {"a": {"x": ["a" * 80], "y": ["b"]}},
                }
            ),
            "has 1 sample, 'num_samples' says 2",
        ),
        (
            json.dumps(
                {"users": ["a"], "num_samples": [1], "user_data": {"a": {"x": ["abc"], "y": ["b"]}}}
            ),
            "string of 80 characters",
        ),
        (
            json.dumps(
                {
                    "users": ["a"],
                    "num_samples": [1],
                    "user_data": {"a": {"x": ["a" * 80], "y": ["bc"]}},
                }
            ),
            "'y' must be one character",
        ),
    ],
)
def test_malformed_shakespeare_files_name_the_path(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = _shakespeare_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(DatasetError, match=problem) as error:
        load_shakespeare(tmp_path, num_clients=0)
    assert str(path) in str(error.value)


def test_decoded_users_are_cached_and_rebuilt_when_a_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    roles = fake_roles()
    write_fake_shakespeare(tmp_path, roles)
    first = load_shakespeare(tmp_path, num_clients=0)
    assert list((tmp_path / "cache").glob("leaf-shakespeare-*.npz"))

    def unreadable(*args, **kwargs):
        raise AssertionError("the cache was not used")

    with monkeypatch.context() as patched:
        patched.setattr(leaf, "read_leaf_json", unreadable)
        assert client_sets(load_shakespeare(tmp_path, num_clients=0)) == client_sets(first)
    roles["THE_PLAY_ROLE0"] = ["a different line\n"]
    write_fake_shakespeare(tmp_path, roles)
    changed = load_shakespeare(tmp_path, num_clients=0)
    assert client_sets(changed) != client_sets(first)
    assert len(list((tmp_path / "cache").glob("leaf-shakespeare-*.npz"))) == 2


# --------------------------------------------------------------------------------------
# FEMNIST
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["all_data", "split"])
def test_femnist_writers_images_and_labels(tmp_path: Path, layout: str) -> None:
    sizes = (5, 9, 3, 12, 1, 7)
    users = write_fake_femnist(tmp_path, sizes, layout=layout)
    data = load_femnist(tmp_path, num_clients=0)
    assert data.info.name == "femnist" and data.info.num_classes == 62
    assert data.info.input_shape == (1, 28, 28) and not data.info.tokens
    writers = sorted(users)
    kept = [w for w in writers if len(users[w][1]) >= 2]  # the one-image writer is dropped
    assert len(data.clients) == len(kept) == 5
    for (x, y), name in zip(data.clients, kept, strict=True):
        writer = writers.index(name)
        expected = {
            (femnist_image(writer, s).tobytes(), (writer * 7 + s) % 62)
            for s in range(sizes[writer])
        }
        assert x.dtype == np.uint8 and x.shape == (sizes[writer], 1, 28, 28)
        assert {(x[r].tobytes(), int(y[r])) for r in range(len(y))} == expected


def test_femnist_tensors_are_leafs_pixel_values(tmp_path: Path) -> None:
    users = write_fake_femnist(tmp_path, (4, 6))
    federation = build_federation(
        FederationSpec(dataset="femnist", num_clients=2, data_dir=str(tmp_path))
    )
    client = federation.clients[1]
    x, y = to_tensors(client.x_train, client.y_train, federation.info)
    assert x.dtype == torch.float32 and x.shape[1:] == (1, 28, 28)
    leaf_values = np.array(users[sorted(users)[1]][0], dtype=np.float32)  # pixel / 255
    for row in x.reshape(len(x), -1).numpy():
        assert np.abs(leaf_values - row).max(axis=1).min() < 1e-7  # no normalisation


def test_femnist_federation_is_deterministic_and_splits_each_writer(tmp_path: Path) -> None:
    write_fake_femnist(tmp_path)
    spec = FederationSpec(
        dataset="femnist", num_clients=3, data_dir=str(tmp_path), test_fraction=0.25, seed=4
    )
    federation = build_federation(spec)
    chosen = load_femnist(tmp_path, num_clients=3, seed=4)
    for client, (_, y) in zip(federation.clients, chosen.clients, strict=True):
        assert len(client.y_test) == math.ceil(0.25 * len(y))
        assert sorted(np.concatenate([client.y_train, client.y_test])) == sorted(y)
        assert client.y_train.min() >= 0 and client.y_train.max() < 62
    clear_caches()
    again = build_federation(spec)
    assert all(
        np.array_equal(a.x_test, b.x_test)
        for a, b in zip(federation.clients, again.clients, strict=True)
    )
    assert dataset_spec("femnist").default_model == "cnn"


def test_femnists_default_model_is_the_fedavg_cnn_with_62_outputs() -> None:
    from pflarena.core.models import build_model

    model = build_model(dataset_spec("femnist").default_model, (1, 28, 28), 62)
    # 5x5 convolutions of 32 and 64 channels ("same" padding), 512 units, 62 outputs.
    expected = (25 * 32 + 32) + (32 * 25 * 64 + 64) + (7 * 7 * 64 * 512 + 512) + (512 * 62 + 62)
    assert sum(p.numel() for p in model.parameters()) == expected == 1_690_046


@pytest.mark.parametrize(
    ("x", "y", "problem"),
    [
        ([[0.5] * 783], [3], "flattened 28x28 image of 784 values"),
        ([[1.5] * 784], [3], r"must lie in \[0, 1\]"),
        ([[0.5] * 784], [62], r"labels must be 0..61"),
        ([[0.5] * 784], [2.5], "integer class labels"),
        ([["a"] * 784], [1], "lists of 784 numbers"),
    ],
)
def test_malformed_femnist_files_name_the_path(tmp_path: Path, x, y, problem: str) -> None:
    path = tmp_path / "femnist" / "data" / "all_data" / "all_data_0.json"
    write_leaf_file(path, {"f0001_00": (x, y)})
    with pytest.raises(DatasetError, match=problem) as error:
        load_femnist(tmp_path, num_clients=0)
    assert str(path) in str(error.value) and "f0001_00" in str(error.value)


def test_shakespeare_windows_of_a_line_follow_leafs_rule() -> None:
    # The fake's windows: 80 spaces of padding, then one window per character of the line.
    xs, ys = shakespeare_samples(["Hi!\n"])
    assert xs[0] == " " * 80 and ys == ["H", "i", "!", "\n"]
    assert xs[3] == " " * 77 + "Hi!"
