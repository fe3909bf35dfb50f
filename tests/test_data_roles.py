"""Tests of the data roles: each client's validation split and the server-held share.

Disjointness is checked on the pool rows that every role takes
(``federation._federation_rows``, the rows :func:`build_federation` and
:func:`load_server_data` index with), since ``digits`` holds duplicate images.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pflarena.core import federation as fed
from pflarena.core.datasets import load_natural, load_pooled
from pflarena.core.federation import (
    ClientData,
    DatasetError,
    FederationSpec,
    ServerData,
    build_federation,
    clear_caches,
    load_server_data,
)
from pflarena.core.partition import (
    server_indices,
    split_seed,
    train_test_indices,
    validation_indices,
    validation_seed,
)
from pflarena.core.shard_format import (
    SHARD_ARRAYS,
    ShardError,
    load_shard,
    write_shards,
)

POOLED = {"dataset": "digits", "num_clients": 6, "partition": "dirichlet", "alpha": 0.5}
NATURAL = {"dataset": "synthetic", "num_clients": 6, "partition": "natural"}
ROLES = {"validation_fraction": 0.2, "server_fraction": 0.1}


def spec_of(base: dict, **fields) -> FederationSpec:
    return FederationSpec(**(base | fields))


def role_sets(rows: fed._Rows) -> dict[str, np.ndarray]:
    """Every role's rows by name: ``server``, ``train3``, ``val3``, ``test3`` ..."""
    sets = {"server": rows.server}
    for client_id, (train, val, test) in enumerate(
        zip(rows.train, rows.val, rows.test, strict=True)
    ):
        sets |= {f"train{client_id}": train, f"val{client_id}": val, f"test{client_id}": test}
    return sets


def assert_disjoint(sets: dict[str, np.ndarray]) -> np.ndarray:
    joined = np.concatenate(list(sets.values()))
    assert len(np.unique(joined)) == len(joined), "a row has two roles"
    for name, part in sets.items():
        assert len(np.unique(part)) == len(part), f"a row is twice in {name}"
    return joined


def row_hashes(x: np.ndarray, y: np.ndarray) -> set[bytes]:
    """One key per sample: its bytes and its label (synthetic rows never repeat)."""
    x = np.ascontiguousarray(x).reshape(len(x), -1)
    return {
        row.tobytes() + int(label).to_bytes(8, "little") for row, label in zip(x, y, strict=True)
    }


# --------------------------------------------------------------------------------------
# Disjoint roles, sizes, and what the public arrays hold
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", [POOLED, NATURAL], ids=["pooled", "natural"])
def test_roles_are_disjoint_and_cover_the_data(base: dict) -> None:
    spec = spec_of(base, **ROLES)
    rows = fed._federation_rows(spec)
    joined = assert_disjoint(role_sets(rows))
    # dirichlet (flwr-datasets) and natural shares leave no sample out
    np.testing.assert_array_equal(np.sort(joined), np.arange(len(rows.y)))
    federation = build_federation(spec)
    for client, train, val, test in zip(
        federation.clients, rows.train, rows.val, rows.test, strict=True
    ):
        for x, y, picked in (
            (client.x_train, client.y_train, train),
            (client.x_val, client.y_val, val),
            (client.x_test, client.y_test, test),
        ):
            np.testing.assert_array_equal(x, rows.x[picked])
            np.testing.assert_array_equal(y, rows.y[picked])
            assert y.dtype == np.int64
    server = load_server_data(spec)
    assert isinstance(server, ServerData)
    np.testing.assert_array_equal(server.x, rows.x[rows.server])
    np.testing.assert_array_equal(server.y, rows.y[rows.server])
    assert server.info == federation.info


def test_pooled_sizes_are_ceilings_and_the_server_share_is_stratified() -> None:
    spec = spec_of(POOLED, **ROLES)
    pooled = load_pooled("digits")
    server = load_server_data(spec)
    assert server is not None
    assert server.num_samples == math.ceil(0.1 * 1797) == 180
    assert len(server.class_histogram) == 10 and sum(server.class_histogram) == 180
    expected = 0.1 * np.bincount(pooled.y)
    assert np.all(np.abs(np.array(server.class_histogram) - expected) <= 1)
    federation = build_federation(spec)
    assert sum(len(c.y_train) + len(c.y_val) + len(c.y_test) for c in federation.clients) == (
        1797 - 180
    )
    for client in federation.clients:
        share = len(client.y_train) + len(client.y_val) + len(client.y_test)
        assert len(client.y_test) == math.ceil(0.25 * share)
        assert len(client.y_val) == math.ceil(0.2 * (share - len(client.y_test)))


def test_natural_sizes_are_per_client_ceilings() -> None:
    spec = spec_of(NATURAL, **ROLES)
    generated = load_natural("synthetic", 6, seed=0)
    federation = build_federation(spec)
    server = load_server_data(spec)
    assert server is not None
    held = [math.ceil(0.1 * len(y)) for _, y in generated.clients]
    assert server.num_samples == sum(held)
    for client, (_, y), server_part in zip(
        federation.clients, generated.clients, held, strict=True
    ):
        share = len(y) - server_part
        assert len(client.y_train) + len(client.y_val) + len(client.y_test) == share
        assert len(client.y_test) == math.ceil(0.25 * share)
        assert len(client.y_val) == math.ceil(0.2 * (share - len(client.y_test)))
    # Samples are continuous: compare rows directly, nothing the server holds reaches a client.
    server_rows = row_hashes(server.x, server.y)
    for client in federation.clients:
        for x, y in ((client.x_train, client.y_train), (client.x_val, client.y_val)):
            assert not server_rows & row_hashes(x, y)
        assert not server_rows & row_hashes(client.x_test, client.y_test)
        assert not row_hashes(client.x_val, client.y_val) & row_hashes(client.x_test, client.y_test)


@pytest.mark.parametrize("base", [POOLED, NATURAL], ids=["pooled", "natural"])
def test_validation_is_carved_from_the_training_split(base: dict) -> None:
    plain = fed._federation_rows(spec_of(base))
    with_val = fed._federation_rows(spec_of(base, validation_fraction=0.3))
    for train0, test0, train, val, test in zip(
        plain.train, plain.test, with_val.train, with_val.val, with_val.test, strict=True
    ):
        np.testing.assert_array_equal(test, test0)  # the train/test split is unchanged
        np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), np.sort(train0))
        # the remaining training rows keep the training split's order
        np.testing.assert_array_equal(train, train0[np.isin(train0, train)])
        assert len(val) == math.ceil(0.3 * len(train0))


# --------------------------------------------------------------------------------------
# Determinism and seeds
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", [POOLED, NATURAL], ids=["pooled", "natural"])
def test_roles_are_deterministic_for_a_seed(base: dict) -> None:
    spec = spec_of(base, **ROLES)
    first, first_server = build_federation(spec), load_server_data(spec)
    assert build_federation(spec) is first and load_server_data(spec) is first_server
    clear_caches()
    again, again_server = build_federation(spec), load_server_data(spec)
    assert again is not first and again_server is not first_server
    assert first_server is not None and again_server is not None
    np.testing.assert_array_equal(again_server.x, first_server.x)
    np.testing.assert_array_equal(again_server.y, first_server.y)
    for a, b in zip(first.clients, again.clients, strict=True):
        for name in SHARD_ARRAYS:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    other_spec = spec_of(base, seed=1, **ROLES)
    other, other_server = build_federation(other_spec), load_server_data(other_spec)
    assert other_server is not None
    assert not np.array_equal(other_server.x[:20], first_server.x[:20])
    assert not all(
        len(a.y_val) == len(b.y_val) and np.array_equal(a.x_val, b.x_val)
        for a, b in zip(first.clients, other.clients, strict=True)
    )


def test_each_split_draws_from_its_own_seed() -> None:
    assert validation_seed(0, 3) != split_seed(0, 3)
    assert validation_seed(0, 3) != validation_seed(0, 4) != validation_seed(1, 4)
    # The same sizes drawn with the two seeds are different subsets.
    _, test = train_test_indices(200, 0.25, seed=0, client_id=3)
    _, val = validation_indices(200, 0.25, seed=0, client_id=3)
    assert len(test) == len(val) == 50 and not np.array_equal(np.sort(test), val)


# --------------------------------------------------------------------------------------
# Absent unless asked for
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", [POOLED, NATURAL], ids=["pooled", "natural"])
def test_zero_fractions_change_nothing(base: dict) -> None:
    spec = spec_of(base)
    explicit = spec_of(base, validation_fraction=0.0, server_fraction=0.0)
    assert explicit == spec and hash(explicit) == hash(spec)
    assert load_server_data(spec) is None
    federation = build_federation(spec)
    rows = fed._federation_rows(spec)
    assert len(rows.server) == 0
    for client, train, test in zip(federation.clients, rows.train, rows.test, strict=True):
        assert client.x_val.shape == (0, *federation.info.input_shape)
        assert client.x_val.dtype == client.x_train.dtype
        assert client.y_val.shape == (0,) and client.y_val.dtype == np.int64
        np.testing.assert_array_equal(client.x_train, rows.x[train])
        np.testing.assert_array_equal(client.x_test, rows.x[test])
    shares = [
        np.concatenate([train, test]) for train, test in zip(rows.train, rows.test, strict=True)
    ]
    np.testing.assert_array_equal(np.sort(np.concatenate(shares)), np.arange(len(rows.y)))


def test_client_data_defaults_to_an_empty_validation_split() -> None:
    client = ClientData(
        client_id=0,
        x_train=np.zeros((3, 1, 8, 8), dtype=np.float32),
        y_train=np.zeros(3, dtype=np.int64),
        x_test=np.zeros((1, 1, 8, 8), dtype=np.float32),
        y_test=np.zeros(1, dtype=np.int64),
    )
    assert client.x_val.shape == (0, 1, 8, 8) and client.x_val.dtype == np.float32
    assert client.y_val.shape == (0,) and client.y_val.dtype == np.int64


# --------------------------------------------------------------------------------------
# Splits at their limits
# --------------------------------------------------------------------------------------


def test_server_split_falls_back_to_unstratified_for_tiny_classes() -> None:
    labels = np.array([0] * 30 + [1] * 9 + [2])  # class 2 has one sample: cannot stratify
    kept, server = server_indices(labels, 0.25, seed=0)
    assert len(server) == 10 and len(kept) == 30
    np.testing.assert_array_equal(np.sort(np.concatenate([kept, server])), np.arange(40))
    assert np.all(np.diff(kept) > 0) and np.all(np.diff(server) > 0)
    kept_again, server_again = server_indices(labels, 0.25, seed=0)
    np.testing.assert_array_equal(server_again, server)
    # fewer server samples than classes: also drawn unstratified
    _, few = server_indices(np.arange(40) % 10, 0.05, seed=0)
    assert len(few) == 2


def test_a_validation_share_that_empties_the_training_split_is_refused() -> None:
    with pytest.raises(DatasetError, match="validation_fraction"):
        validation_indices(1, 0.5, seed=0, client_id=4)
    spec = spec_of(POOLED, num_clients=500, partition="iid", validation_fraction=0.9)
    with pytest.raises(DatasetError, match="client .*validation_fraction"):
        build_federation(spec)


# --------------------------------------------------------------------------------------
# Shards
# --------------------------------------------------------------------------------------


def test_shards_round_trip_the_validation_split_and_hold_no_server_data(tmp_path: Path) -> None:
    spec = spec_of(NATURAL, **ROLES)
    federation = build_federation(spec)
    paths = write_shards(federation, tmp_path, spec)
    server = load_server_data(spec)
    assert server is not None
    server_rows = row_hashes(server.x, server.y)
    for path, original in zip(paths, federation.clients, strict=True):
        with np.load(path) as archive:
            assert sorted(archive.files) == sorted([*SHARD_ARRAYS, "metadata"])
        client, _ = load_shard(path)
        assert len(client.y_val) > 0
        for name in SHARD_ARRAYS:
            left, right = getattr(client, name), getattr(original, name)
            assert left.dtype == right.dtype and left.shape == right.shape, name
            np.testing.assert_array_equal(left, right, err_msg=name)
        for split in ("train", "val", "test"):
            x, y = getattr(client, f"x_{split}"), getattr(client, f"y_{split}")
            assert not server_rows & row_hashes(x, y)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["spec"]["server_fraction"] == 0.1
    assert [entry["num_val"] for entry in manifest["shards"]] == [
        len(c.y_val) for c in federation.clients
    ]


def write_version1_shard(path: Path) -> dict[str, np.ndarray]:
    """A shard as written before the validation split existed."""
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (5, 3, 4, 4), dtype=np.uint8),
        "y_train": rng.integers(0, 10, 5).astype(np.int64),
        "x_test": rng.integers(0, 256, (2, 3, 4, 4), dtype=np.uint8),
        "y_test": rng.integers(0, 10, 2).astype(np.int64),
    }
    metadata = {
        "format": "pflarena-shard",
        "version": 1,
        "dataset": "cifar10",
        "num_classes": 10,
        "input_shape": [3, 4, 4],
        "mean": [0.1, 0.2, 0.3],
        "std": [0.4, 0.5, 0.6],
        "client_id": 7,
    }
    np.savez(path, metadata=np.array([json.dumps(metadata)]), **arrays)
    return arrays


def test_version1_shard_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "client_0007.npz"
    arrays = write_version1_shard(path)
    client, info = load_shard(path)
    assert client.client_id == 7 and info.input_shape == (3, 4, 4)
    for name, array in arrays.items():
        np.testing.assert_array_equal(getattr(client, name), array)
    assert client.x_val.shape == (0, 3, 4, 4) and client.x_val.dtype == np.uint8
    assert client.y_val.shape == (0,) and client.y_val.dtype == np.int64


def test_version2_shard_needs_the_validation_arrays(tmp_path: Path) -> None:
    path = tmp_path / "client_0007.npz"
    arrays = write_version1_shard(path)
    with np.load(path) as archive:
        metadata = json.loads(str(archive["metadata"][0]))
    metadata["version"] = 2
    np.savez(path, metadata=np.array([json.dumps(metadata)]), **arrays)
    with pytest.raises(ShardError, match="lacks array.*x_val, y_val") as error:
        load_shard(path)
    assert str(path) in str(error.value)
    metadata["version"] = 4
    np.savez(path, metadata=np.array([json.dumps(metadata)]), **arrays)
    with pytest.raises(ShardError, match="versions 1, 2, 3"):
        load_shard(path)


# --------------------------------------------------------------------------- through a run
def test_a_run_gives_clients_their_validation_split():
    import torch

    from pflarena.client.job import load_node_data
    from pflarena.server.build import parse_config

    cfg = parse_config({"dataset": "digits", "num-clients": 4, "validation-fraction": 0.2})
    data = load_node_data(cfg, {"partition-id": 1, "num-partitions": 4}, torch.device("cpu"))
    spec_client = build_federation(cfg.federation_spec()).clients[1]
    assert len(data.y_val) == len(spec_client.y_val) > 0
    assert len(data.y_train) + len(data.y_val) == len(
        build_federation(cfg.federation_spec().model_copy(update={"validation_fraction": 0.0}))
        .clients[1]
        .y_train
    )
    plain = parse_config({"dataset": "digits", "num-clients": 4})
    assert (
        len(
            load_node_data(
                plain, {"partition-id": 1, "num-partitions": 4}, torch.device("cpu")
            ).y_val
        )
        == 0
    )


def test_the_server_app_loads_server_data_and_records_it(tmp_path):
    import json

    from flwr.app import Context, RecordDict
    from helpers import grid_for

    from pflarena.server.app import main
    from pflarena.server.build import parse_config

    cfg = parse_config(
        {
            "dataset": "digits",
            "num-clients": 3,
            "num-rounds": 1,
            "server-fraction": 0.1,
            "output-dir": str(tmp_path / "run"),
        }
    )
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg.to_run_config()
    )
    main(grid_for(cfg), context)
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["server_data"]
    server = load_server_data(cfg.federation_spec())
    assert recorded == {
        "num_samples": server.num_samples,
        "class_histogram": server.class_histogram,
    }
    assert recorded["num_samples"] == 180 and sum(recorded["class_histogram"]) == 180  # ⌈0.1·1797⌉
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"


def test_methods_that_need_a_data_role_refuse_runs_without_it():
    from pflarena.core.config import ConfigError, parse_run_config
    from pflarena.core.methods import MethodDeclaration

    methods = {
        "needs-val": MethodDeclaration("needs-val", "plugin", "r", "s", "m", needs_validation=True),
        "needs-server": MethodDeclaration(
            "needs-server", "plugin", "r", "s", "m", needs_server_data=True
        ),
    }
    with pytest.raises(ConfigError, match="needs a validation split: set validation-fraction"):
        parse_run_config({"strategy": "needs-val"}, methods)
    with pytest.raises(ConfigError, match="needs server-held data: set server-fraction"):
        parse_run_config({"strategy": "needs-server"}, methods)
    parse_run_config({"strategy": "needs-val", "validation-fraction": 0.1}, methods)
    parse_run_config({"strategy": "needs-server", "server-fraction": 0.1}, methods)
