"""Tests of pflarena.core.federation: build_federation, load_client and shard files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pflarena.core import federation as fed
from pflarena.core.datasets import DATASETS, DatasetInfo
from pflarena.core.federation import (
    ClientData,
    DatasetError,
    Federation,
    FederationSpec,
    ShardError,
    build_federation,
    load_client,
    load_shard,
    synthetic_mixture_truth,
    write_shards,
)
from pflarena.core.partition import PARTITIONS

DIGITS = FederationSpec("digits", 8, "dirichlet", alpha=0.5, seed=0)


def assert_clients_equal(a: ClientData, b: ClientData) -> None:
    assert a.client_id == b.client_id
    for name in ("x_train", "y_train", "x_test", "y_test"):
        left, right = getattr(a, name), getattr(b, name)
        assert left.dtype == right.dtype and left.shape == right.shape, name
        np.testing.assert_array_equal(left, right, err_msg=name)


def tiny_image_federation() -> Federation:
    """A hand-made uint8 federation with normalisation stats, for shard round-trips."""
    rng = np.random.default_rng(0)
    info = DatasetInfo("cifar10", 10, (3, 4, 4), (0.1, 0.2, 0.3), (0.4, 0.5, 0.6))
    clients = [
        ClientData(
            client_id=cid,
            x_train=rng.integers(0, 256, (6 + cid, 3, 4, 4), dtype=np.uint8),
            y_train=rng.integers(0, 10, 6 + cid).astype(np.int64),
            x_test=rng.integers(0, 256, (2, 3, 4, 4), dtype=np.uint8),
            y_test=rng.integers(0, 10, 2).astype(np.int64),
        )
        for cid in range(3)
    ]
    return Federation(info=info, clients=clients)


# --------------------------------------------------------------------------------------
# build_federation
# --------------------------------------------------------------------------------------


def test_build_federation_digits() -> None:
    federation = build_federation(DIGITS)
    assert federation.info == DatasetInfo("digits", 10, (1, 8, 8))
    assert [c.client_id for c in federation.clients] == list(range(8))
    sizes = [len(c.y_train) + len(c.y_test) for c in federation.clients]
    assert sum(sizes) == 1797
    for client, size in zip(federation.clients, sizes, strict=True):
        assert len(client.y_test) == math.ceil(0.25 * size)
        assert client.x_train.shape[1:] == (1, 8, 8) and client.y_train.dtype == np.int64


def test_build_federation_is_deterministic_and_memoised() -> None:
    first = build_federation(DIGITS)
    assert build_federation(DIGITS) is first
    build_federation.cache_clear()
    rebuilt = build_federation(DIGITS)
    assert rebuilt is not first
    for a, b in zip(first.clients, rebuilt.clients, strict=True):
        assert_clients_equal(a, b)
    other = build_federation(FederationSpec("digits", 8, "dirichlet", alpha=0.5, seed=1))
    assert not np.array_equal(other.clients[0].y_train, first.clients[0].y_train)


def test_clients_reassemble_the_pooled_dataset_exactly() -> None:
    from pflarena.core.datasets import load_pooled

    federation = build_federation(FederationSpec("digits", 5, "iid", seed=2))
    pooled = load_pooled("digits")
    rows = np.concatenate(
        [np.concatenate([c.x_train, c.x_test]).reshape(-1, 64) for c in federation.clients]
    )
    labels = np.concatenate([np.concatenate([c.y_train, c.y_test]) for c in federation.clients])
    # Same multiset of (image, label) rows: nothing lost, nothing duplicated.
    combined = np.column_stack([rows, labels])
    reference = np.column_stack([pooled.x.reshape(-1, 64), pooled.y])
    np.testing.assert_array_equal(np.unique(combined, axis=0, return_counts=True)[1].sum(), 1797)
    np.testing.assert_array_equal(
        combined[np.lexsort(combined.T[::-1])], reference[np.lexsort(reference.T[::-1])]
    )


@pytest.mark.parametrize("partition", ["iid", "pathological", "shards", "pfllib-dirichlet"])
def test_build_federation_pooled_partitions(partition: str) -> None:
    spec = FederationSpec("digits", 6, partition, alpha=1.0, classes_per_client=2)
    federation = build_federation(spec)
    assert len(federation.clients) == 6
    if partition == "pathological":
        for client in federation.clients:
            labels = np.concatenate([client.y_train, client.y_test])
            assert len(np.unique(labels)) == 2


def test_synthetic_federations() -> None:
    synthetic = build_federation(FederationSpec("synthetic", 12, "natural", seed=3))
    assert synthetic.info.input_shape == (30,) and synthetic.info.num_classes == 30
    assert all(len(c.y_train) + len(c.y_test) >= 20 for c in synthetic.clients)
    # Synthetic(0, 0), FedProx's most homogeneous setting, is allowed.
    homogeneous = FederationSpec("synthetic", 3, "natural", synthetic_alpha=0, synthetic_beta=0)
    assert len(build_federation(homogeneous).clients) == 3
    fixed = build_federation(FederationSpec("synthetic-mixture", 12, "natural", seed=3))
    faithful = build_federation(
        FederationSpec("synthetic-mixture", 12, "natural", seed=3, mixture_label_mode="faithful")
    )
    assert fixed.info == DatasetInfo("synthetic-mixture", 2, (150,))
    for a, b in zip(fixed.clients, faithful.clients, strict=True):
        np.testing.assert_array_equal(a.x_train, b.x_train)
    ones_fixed = np.mean(np.concatenate([c.y_train for c in fixed.clients]))
    ones_faithful = np.mean(np.concatenate([c.y_train for c in faithful.clients]))
    assert ones_faithful < ones_fixed - 0.05
    components, memberships = synthetic_mixture_truth(
        FederationSpec("synthetic-mixture", 12, "natural", seed=3)
    )
    assert components.shape == (3, 150) and memberships.shape == (12, 3)


def test_natively_federated_dataset_needs_natural_partition() -> None:
    with pytest.raises(DatasetError, match="'natural'"):
        build_federation(FederationSpec("synthetic", 10, "dirichlet"))
    with pytest.raises(DatasetError, match="natively federated"):
        build_federation(FederationSpec("synthetic-mixture", 10, "iid"))
    with pytest.raises(DatasetError, match="pfllib-dirichlet"):
        build_federation(FederationSpec("digits", 10, "natural"))


def test_unknown_names_list_the_allowed_ones() -> None:
    with pytest.raises(DatasetError) as error:
        build_federation(FederationSpec("not-a-dataset", 4))
    assert all(name in str(error.value) for name in DATASETS)
    with pytest.raises(DatasetError) as error:
        build_federation(FederationSpec("digits", 4, "by-writer"))
    assert all(name in str(error.value) for name in PARTITIONS)
    with pytest.raises(DatasetError, match="fixed, faithful"):
        build_federation(FederationSpec("synthetic-mixture", 4, "natural", mixture_label_mode="x"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_clients", 0),
        ("test_fraction", 1.0),
        ("alpha", 0.0),
        ("classes_per_client", 0),
        ("synthetic_beta", -1.0),
    ],
)
def test_out_of_range_values_are_rejected(field: str, value: float) -> None:
    spec = FederationSpec(**{"dataset": "digits", "num_clients": 4, field: value})
    with pytest.raises(DatasetError, match=field):
        build_federation(spec)


def test_too_many_clients_gives_an_actionable_error() -> None:
    with pytest.raises(DatasetError, match="client .* fewer clients or a larger alpha"):
        build_federation(FederationSpec("digits", 1000, "iid"))


def test_load_client() -> None:
    client, info = load_client(DIGITS, 3)
    assert info == build_federation(DIGITS).info
    assert_clients_equal(client, build_federation(DIGITS).clients[3])
    with pytest.raises(DatasetError, match="out of range"):
        load_client(DIGITS, 8)


def test_mnist_offline_federation(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    (tmp_path / "mnist").mkdir()
    np.savez(
        tmp_path / "mnist" / "mnist-70k.npz",
        x=rng.integers(0, 256, (40, 28, 28), dtype=np.uint8),
        y=np.arange(40) % 10,
    )
    federation = build_federation(FederationSpec("mnist", 4, "iid", data_dir=str(tmp_path)))
    assert federation.info.mean == (0.1307,) and federation.info.std == (0.3081,)
    assert all(c.x_train.dtype == np.uint8 for c in federation.clients)
    assert sum(len(c.y_train) + len(c.y_test) for c in federation.clients) == 40


# --------------------------------------------------------------------------------------
# Shards
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["digits", "images"])
def test_shard_round_trip(tmp_path: Path, source: str) -> None:
    federation = build_federation(DIGITS) if source == "digits" else tiny_image_federation()
    spec = DIGITS if source == "digits" else None
    paths = write_shards(federation, tmp_path / "shards", spec)
    assert [p.name for p in paths] == [f"client_{i:04d}.npz" for i in range(len(paths))]
    for path, original in zip(paths, federation.clients, strict=True):
        client, info = load_shard(path)
        assert info == federation.info
        assert_clients_equal(client, original)
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["num_clients"] == len(federation.clients)
    assert [entry["file"] for entry in manifest["shards"]] == [p.name for p in paths]
    assert manifest["spec"] == (None if spec is None else fed.asdict(spec))
    assert not list((tmp_path / "shards").glob("*.tmp"))


def test_missing_shard_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "client_0042.npz"
    with pytest.raises(ShardError, match="not found") as error:
        load_shard(path)
    assert str(path) in str(error.value)


def test_random_bytes_shard_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "client_0000.npz"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ShardError) as error:
        load_shard(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("keep", [0.3, 0.9, 0.999])
def test_truncated_shard_names_the_path(tmp_path: Path, keep: float) -> None:
    (path, *_) = write_shards(tiny_image_federation(), tmp_path)
    payload = path.read_bytes()
    path.write_bytes(payload[: int(len(payload) * keep)])
    with pytest.raises(ShardError) as error:
        load_shard(path)
    assert str(path) in str(error.value)


def test_shard_without_arrays_or_metadata(tmp_path: Path) -> None:
    path = tmp_path / "partial.npz"
    np.savez(path, x_train=np.zeros((2, 3)), y_train=np.zeros(2))
    with pytest.raises(ShardError, match="x_test, y_test, metadata") as error:
        load_shard(path)
    assert str(path) in str(error.value)
    arrays = {name: np.zeros((2, 3)) for name in ("x_train", "x_test")}
    arrays |= {name: np.zeros(2) for name in ("y_train", "y_test")}
    np.savez(path, metadata=np.array([json.dumps({"format": "pflarena-shard"})]), **arrays)
    with pytest.raises(ShardError, match="metadata lacks"):
        load_shard(path)


def test_shard_with_mismatched_shapes(tmp_path: Path) -> None:
    (path, *_) = write_shards(tiny_image_federation(), tmp_path)
    with np.load(path) as archive:
        arrays = dict(archive)
    arrays["y_train"] = arrays["y_train"][:-1]
    np.savez(path, **arrays)
    with pytest.raises(ShardError, match="y_train"):
        load_shard(path)


def test_failed_write_leaves_the_previous_shard_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    federation = tiny_image_federation()
    (path, *_) = write_shards(federation, tmp_path)

    def crash(stream, **arrays) -> None:
        stream.write(b"PK\x03\x04 half a shard")
        raise OSError("disk full")

    monkeypatch.setattr(fed.np, "savez", crash)
    with pytest.raises(OSError, match="disk full"):
        write_shards(federation, tmp_path)
    monkeypatch.undo()
    client, _ = load_shard(path)
    assert_clients_equal(client, federation.clients[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "client_0000.npz",
        "client_0001.npz",
        "client_0002.npz",
        "manifest.json",
    ]
