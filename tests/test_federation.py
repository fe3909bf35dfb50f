"""Tests of pflarena.core.federation: the spec model, build_federation, load_client, shards.

The validation split and the server's share are tested in tests/test_data_roles.py.
"""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from pflarena.core import federation as fed
from pflarena.core import shard_format
from pflarena.core.datasets import DATASETS, MIXTURE_LABEL_MODES, DatasetInfo
from pflarena.core.federation import (
    ClientData,
    DatasetError,
    Federation,
    FederationSpec,
    build_federation,
    clear_caches,
    load_client,
    synthetic_mixture_truth,
)
from pflarena.core.partition import PARTITIONS
from pflarena.core.shard_format import (
    SHARD_ARRAYS,
    ShardError,
    load_shard,
    write_shards,
)

DIGITS = FederationSpec(dataset="digits", num_clients=8, partition="dirichlet", alpha=0.5, seed=0)


def assert_clients_equal(a: ClientData, b: ClientData) -> None:
    assert a.client_id == b.client_id
    for name in SHARD_ARRAYS:
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
            x_val=rng.integers(0, 256, (cid, 3, 4, 4), dtype=np.uint8),
            y_val=rng.integers(0, 10, cid).astype(np.int64),
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
    clear_caches()
    rebuilt = build_federation(DIGITS)
    assert rebuilt is not first
    for a, b in zip(first.clients, rebuilt.clients, strict=True):
        assert_clients_equal(a, b)
    other = build_federation(
        FederationSpec(dataset="digits", num_clients=8, partition="dirichlet", alpha=0.5, seed=1)
    )
    assert not np.array_equal(other.clients[0].y_train, first.clients[0].y_train)


def test_clients_reassemble_the_pooled_dataset_exactly() -> None:
    from pflarena.core.datasets import load_pooled

    federation = build_federation(
        FederationSpec(dataset="digits", num_clients=5, partition="iid", seed=2)
    )
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
    spec = FederationSpec(
        dataset="digits", num_clients=6, partition=partition, alpha=1.0, classes_per_client=2
    )
    federation = build_federation(spec)
    assert len(federation.clients) == 6
    if partition == "pathological":
        for client in federation.clients:
            labels = np.concatenate([client.y_train, client.y_test])
            assert len(np.unique(labels)) == 2


def test_synthetic_federations() -> None:
    synthetic = build_federation(
        FederationSpec(dataset="synthetic", num_clients=12, partition="natural", seed=3)
    )
    assert synthetic.info.input_shape == (30,) and synthetic.info.num_classes == 30
    assert all(len(c.y_train) + len(c.y_test) >= 20 for c in synthetic.clients)
    # Synthetic(0, 0), FedProx's most homogeneous setting, is allowed.
    homogeneous = FederationSpec(
        dataset="synthetic", num_clients=3, partition="natural", synthetic_alpha=0, synthetic_beta=0
    )
    assert len(build_federation(homogeneous).clients) == 3
    fixed = build_federation(
        FederationSpec(dataset="synthetic-mixture", num_clients=12, partition="natural", seed=3)
    )
    faithful = build_federation(
        FederationSpec(
            dataset="synthetic-mixture",
            num_clients=12,
            partition="natural",
            seed=3,
            mixture_label_mode="faithful",
        )
    )
    assert fixed.info == DatasetInfo("synthetic-mixture", 2, (150,))
    for a, b in zip(fixed.clients, faithful.clients, strict=True):
        np.testing.assert_array_equal(a.x_train, b.x_train)
    ones_fixed = np.mean(np.concatenate([c.y_train for c in fixed.clients]))
    ones_faithful = np.mean(np.concatenate([c.y_train for c in faithful.clients]))
    assert ones_faithful < ones_fixed - 0.05
    components, memberships = synthetic_mixture_truth(
        FederationSpec(dataset="synthetic-mixture", num_clients=12, partition="natural", seed=3)
    )
    assert components.shape == (3, 150) and memberships.shape == (12, 3)


def test_natively_federated_dataset_needs_natural_partition() -> None:
    with pytest.raises(ValidationError, match="'natural'"):
        FederationSpec(dataset="synthetic", num_clients=10, partition="dirichlet")
    with pytest.raises(ValidationError, match="natively federated"):
        FederationSpec(dataset="synthetic-mixture", num_clients=10, partition="iid")
    with pytest.raises(ValidationError, match="pfllib-dirichlet"):
        FederationSpec(dataset="digits", num_clients=10, partition="natural")


def test_unknown_names_list_the_allowed_ones() -> None:
    with pytest.raises(ValidationError) as error:
        FederationSpec(dataset="not-a-dataset", num_clients=4)
    assert all(name in str(error.value) for name in DATASETS)
    with pytest.raises(ValidationError) as error:
        FederationSpec(dataset="digits", num_clients=4, partition="by-writer")
    assert all(name in str(error.value) for name in PARTITIONS)
    with pytest.raises(ValidationError, match="'fixed' or 'faithful'"):
        FederationSpec(
            dataset="synthetic-mixture", num_clients=4, partition="natural", mixture_label_mode="x"
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_clients", 0),
        ("test_fraction", 1.0),
        ("test_fraction", 0.0),
        ("validation_fraction", 1.0),
        ("validation_fraction", -0.1),
        ("server_fraction", 1.0),
        ("server_fraction", -0.1),
        ("alpha", 0.0),
        ("alpha", float("inf")),
        ("classes_per_client", 0),
        ("class_assignment", "balanced"),
        ("shards_per_client", 0),
        ("label_groups", 0),
        ("label_permutation_groups", -1),
        ("seed", -1),
        ("synthetic_alpha", -1.0),
        ("synthetic_beta", -1.0),
        ("synthetic_beta", float("nan")),
        ("min_client_samples", -1),
        ("quantity_sigma", -0.1),
        ("max_client_samples", -1),
    ],
)
def test_out_of_range_values_are_rejected(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        FederationSpec(**{"dataset": "digits", "num_clients": 4, field: value})


def test_spec_fields_defaults_and_descriptions() -> None:
    assert list(FederationSpec.model_fields) == [
        "dataset",
        "num_clients",
        "partition",
        "alpha",
        "classes_per_client",
        "class_assignment",
        "shards_per_client",
        "quantity_sigma",
        "label_groups",
        "label_permutation_groups",
        "test_fraction",
        "validation_fraction",
        "server_fraction",
        "seed",
        "data_dir",
        "synthetic_alpha",
        "synthetic_beta",
        "synthetic_model",
        "synthetic_samples",
        "mixture_label_mode",
        "min_client_samples",
        "max_client_samples",
    ]
    defaults = FederationSpec().model_dump(by_alias=True)
    assert defaults == {
        "dataset": "digits",
        "num-clients": 10,
        "partition": "dirichlet",
        "alpha": 0.5,
        "classes-per-client": 2,
        "class-assignment": "first-deterministic",
        "shards-per-client": 2,
        "quantity-sigma": 0.0,
        "label-groups": 4,
        "label-permutation-groups": 0,
        "test-fraction": 0.25,
        "validation-fraction": 0.0,
        "server-fraction": 0.0,
        "seed": 0,
        "data-dir": "",
        "synthetic-alpha": 0.5,
        "synthetic-beta": 0.5,
        "synthetic-model": "per-client",
        "synthetic-samples": 0,
        "mixture-label-mode": "fixed",
        "min-client-samples": 0,
        "max-client-samples": 0,
    }
    for name, field in FederationSpec.model_fields.items():
        assert field.description and "\n" not in field.description, name
    mode = FederationSpec.model_fields["mixture_label_mode"].annotation
    assert typing.get_args(mode) == MIXTURE_LABEL_MODES


def test_spec_is_frozen_hashable_and_takes_both_key_styles() -> None:
    by_alias = FederationSpec.model_validate(
        {"dataset": "digits", "num-clients": 8, "partition": "dirichlet", "alpha": 0.5}
    )
    assert by_alias == DIGITS and hash(by_alias) == hash(DIGITS)
    assert FederationSpec(dataset="digits", num_clients=8, alpha=1) == FederationSpec(
        dataset="digits", num_clients=8, alpha=1.0
    )
    assert FederationSpec(dataset="digits", num_clients=8, seed=1) != DIGITS
    with pytest.raises(ValidationError):
        DIGITS.seed = 3  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        FederationSpec(dataset="digits", num_clients=8, lr=0.1)  # type: ignore[call-arg]
    # Explicit zero fractions are the same spec as leaving them out.
    explicit = FederationSpec(
        dataset="digits",
        num_clients=8,
        partition="dirichlet",
        alpha=0.5,
        seed=0,
        validation_fraction=0.0,
        server_fraction=0,
    )
    assert explicit == DIGITS and build_federation(explicit) is build_federation(DIGITS)


def test_too_many_clients_gives_an_actionable_error() -> None:
    with pytest.raises(DatasetError, match="client .* fewer clients or a larger alpha"):
        build_federation(FederationSpec(dataset="digits", num_clients=1000, partition="iid"))


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
    federation = build_federation(
        FederationSpec(dataset="mnist", num_clients=4, partition="iid", data_dir=str(tmp_path))
    )
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
    assert manifest["spec"] == (None if spec is None else spec.model_dump())
    assert manifest["version"] == shard_format.SHARD_FORMAT_VERSION == 3
    assert [entry["num_val"] for entry in manifest["shards"]] == [
        len(c.y_val) for c in federation.clients
    ]
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

    monkeypatch.setattr(shard_format.np, "savez", crash)
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


def _float_federation() -> Federation:
    """Three clients of float inputs (where NaN can hide), as a PFLlib import writes."""
    rng = np.random.default_rng(1)
    info = DatasetInfo("floats", 4, (3,))
    clients = [
        ClientData(
            client_id=cid,
            x_train=rng.normal(size=(5, 3)).astype(np.float32),
            y_train=rng.integers(0, 4, 5).astype(np.int64),
            x_test=rng.normal(size=(2, 3)).astype(np.float32),
            y_test=rng.integers(0, 4, 2).astype(np.int64),
        )
        for cid in range(3)
    ]
    return Federation(info=info, clients=clients)


def _rewrite(path: Path, **changes: np.ndarray) -> None:
    with np.load(path) as archive:
        arrays = dict(archive)
    np.savez(path, **(arrays | changes))


@pytest.mark.parametrize(
    "array, value, message",
    [
        ("y_train", np.array([0, 1, 2, 3, 4]), r"y_train holds labels 0\.\.4, outside 0\.\.3"),
        ("y_test", np.array([-1, 0]), r"y_test holds labels -1\.\.0"),
        ("y_train", np.array([0.0, 1.5, 2.0, 3.0, 1.0]), "y_train holds labels that are not whole"),
        ("y_test", np.array([np.nan, 1.0]), "y_test holds labels that are not whole"),
        ("x_train", np.full((5, 3), np.nan, np.float32), "x_train holds NaN or infinite"),
        ("x_test", np.array([[np.inf, 0, 0], [0, 0, 0]], np.float32), "x_test holds NaN"),
    ],
)
def test_a_shard_with_values_that_cannot_be_true_is_refused_at_load(
    tmp_path: Path, array: str, value: np.ndarray, message: str
) -> None:
    (path, *_) = write_shards(_float_federation(), tmp_path)
    _rewrite(path, **{array: value})
    with pytest.raises(ShardError, match=message) as error:
        load_shard(path)
    assert str(path) in str(error.value)


def test_whole_float_labels_load_as_integers(tmp_path: Path) -> None:
    (path, *_) = write_shards(_float_federation(), tmp_path)
    _rewrite(path, y_test=np.array([3.0, 1.0]))
    client, _ = load_shard(path)
    assert client.y_test.dtype == np.int64 and client.y_test.tolist() == [3, 1]


@pytest.mark.parametrize("name", ["../elsewhere/client_0001.npz", "/etc/hostname", "a/../../x"])
def test_a_manifest_naming_files_outside_its_directory_is_refused(tmp_path: Path, name) -> None:
    from pflarena.core.shard_format import read_shard_set

    shards = tmp_path / "shards"
    write_shards(_float_federation(), shards)
    outside = tmp_path / "elsewhere"
    write_shards(_float_federation(), outside)  # a real file there: only the path is wrong
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["shards"][1]["file"] = name
    (shards / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="outside its directory"):
        read_shard_set(shards)


def test_a_shard_whose_sizes_differ_from_the_manifest_is_refused(tmp_path: Path) -> None:
    from pflarena.core.shard_format import load_shard_client

    paths = write_shards(_float_federation(), tmp_path)
    load_shard_client(tmp_path, 1)
    with np.load(paths[1]) as archive:
        arrays = dict(archive)
    arrays["x_train"], arrays["y_train"] = arrays["x_train"][:3], arrays["y_train"][:3]
    np.savez(paths[1], **arrays)
    with pytest.raises(ShardError, match=r"3 train .* the manifest says 5"):
        load_shard_client(tmp_path, 1)


def test_client_sizes_are_those_of_the_built_federation() -> None:
    spec = FederationSpec(dataset="digits", num_clients=4, validation_fraction=0.2)
    built = build_federation(spec)
    assert fed.client_sizes(spec) == (
        [len(c.y_train) for c in built.clients],
        [len(c.y_val) for c in built.clients],
        [len(c.y_test) for c in built.clients],
    )


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("seed", 2**32, "less than or equal to 4294967295"),
        ("seed", 99999999999999999999, "less than or equal to 4294967295"),
        ("num_clients", 10**9, "less than or equal to 100000"),
    ],
)
def test_seed_and_client_count_ranges(field: str, value: int, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        FederationSpec(**{field: value})
    FederationSpec(**{field: 2**32 - 1 if field == "seed" else 100_000})


def test_shard_files_get_the_permissions_open_would_give(tmp_path) -> None:
    """Written atomically through a 0600 temporary file, shards and their manifest still end
    with ``0o666`` less the umask: ClientApps in containers read them as another user."""
    import os

    from pflarena.core.config import parse_run_config
    from pflarena.core.federation import build_federation
    from pflarena.core.shard_format import write_shards

    spec = parse_run_config({"num-clients": "2"}).federation_spec()
    old = os.umask(0o022)
    try:
        paths = write_shards(build_federation(spec), tmp_path / "shards", spec)
    finally:
        os.umask(old)
    for path in [*paths, tmp_path / "shards" / "manifest.json"]:
        assert path.stat().st_mode & 0o777 == 0o644, (path, oct(path.stat().st_mode))
