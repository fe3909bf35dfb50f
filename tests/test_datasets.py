"""Tests of pflarena.core.datasets: registry, loaders, generators and tensor conversion."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pflarena.core import datasets as ds
from pflarena.core.datasets import (
    CIFAR10_CLASSES,
    DATASETS,
    EMBEDDED_DATASETS,
    HAR_SIGNALS,
    NATURAL_DATASETS,
    POOLED_DATASETS,
    TORCHVISION_DATASETS,
    DatasetError,
    DatasetInfo,
    DatasetSpec,
    dataset_names,
    dataset_spec,
    generate_synthetic,
    generate_synthetic_mixture,
    load_har,
    load_natural,
    load_pooled,
    mixture_labels,
    mixture_sample_counts,
    read_cifar10_jpeg_tar,
    register_dataset,
    registry,
    to_tensors,
)
from pflarena.core.datasets import io as dataset_io
from pflarena.core.federation import FederationSpec, build_federation, synthetic_mixture_truth

# --------------------------------------------------------------------------------------
# Helpers that write tiny fake data files
# --------------------------------------------------------------------------------------


def write_fake_mnist(data_dir: Path, num_samples: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """``<data_dir>/mnist/mnist-70k.npz`` with random uint8 images."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(num_samples, 28, 28), dtype=np.uint8)
    y = (np.arange(num_samples) % 10).astype(np.uint8)
    (data_dir / "mnist").mkdir(parents=True)
    np.savez(data_dir / "mnist" / "mnist-70k.npz", x=x, y=y)
    return x, y


def _jpeg_bytes(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), color).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def class_color(split: str, label: int, number: int) -> tuple[int, int, int]:
    """A solid colour that encodes split, class and file number."""
    return (20 * label + 10, 100 if split == "train" else 200, 60 * number + 30)


def write_fake_cifar_tar(data_dir: Path, per_class: dict[str, int]) -> Path:
    """A JPEG tar in the offline CIFAR-10 layout, test entries first as in the real one."""
    path = data_dir / "cifar10" / "cifar10-jpeg.tar"
    path.parent.mkdir(parents=True)
    with tarfile.open(path, "w") as archive:
        for split in ("test", "train"):
            for label, name in enumerate(CIFAR10_CLASSES):
                # Write file numbers in reverse to check the reader sorts them.
                for number in reversed(range(per_class[split])):
                    payload = _jpeg_bytes(class_color(split, label, number))
                    member = tarfile.TarInfo(f"{split}/{name}/{number:04d}.jpg")
                    member.size = len(payload)
                    archive.addfile(member, io.BytesIO(payload))
    return path


def har_value(signal: int, row: int, step: int) -> float:
    """The value the fake HAR tree stores: encodes signal, global row and time step."""
    return signal * 1000.0 + row + step / 1000.0


def write_fake_har(data_dir: Path, per_subject: int = 4, num_subjects: int = 30) -> dict:
    """A tiny UCI HAR tree: subjects alternate between train and test."""
    root = data_dir / "UCI HAR Dataset"
    rows = {"train": [], "test": []}
    row = 0
    for subject in range(1, num_subjects + 1):
        split = "train" if subject % 3 else "test"
        for sample in range(per_subject):
            rows[split].append((row, subject, (subject + sample) % 6 + 1))
            row += 1
    for split, entries in rows.items():
        signal_dir = root / split / "Inertial Signals"
        signal_dir.mkdir(parents=True)
        for signal_index, signal in enumerate(HAR_SIGNALS):
            table = np.array(
                [[har_value(signal_index, r, t) for t in range(128)] for r, _, _ in entries]
            )
            np.savetxt(signal_dir / f"{signal}_{split}.txt", table, fmt="%.6e")
        np.savetxt(root / split / f"y_{split}.txt", [e[2] for e in entries], fmt="%d")
        np.savetxt(root / split / f"subject_{split}.txt", [e[1] for e in entries], fmt="%d")
    return rows


# --------------------------------------------------------------------------------------
# Registry and tensors
# --------------------------------------------------------------------------------------


def test_registry_names() -> None:
    assert EMBEDDED_DATASETS == ("digits", "synthetic", "synthetic-on-demand", "synthetic-mixture")
    assert set(EMBEDDED_DATASETS) < set(DATASETS)
    for name in ("mnist", "fashion-mnist", "cifar10", "cifar100", "emnist", "har"):
        assert name in DATASETS
        assert ds.dataset_info(name).name == name


def test_name_lists_are_derived_from_the_registry() -> None:
    assert DATASETS == (
        "digits",
        "synthetic",
        "synthetic-on-demand",
        "synthetic-mixture",
        "mnist",
        "fashion-mnist",
        "cifar10",
        "cifar100",
        "emnist",
        "har",
        "shakespeare",
        "femnist",
        "tiny-imagenet",
    )
    assert dataset_names() == DATASETS
    assert NATURAL_DATASETS == (
        "synthetic",
        "synthetic-on-demand",
        "synthetic-mixture",
        "har",
        "shakespeare",
        "femnist",
    )
    assert ("digits", *TORCHVISION_DATASETS, "tiny-imagenet") == POOLED_DATASETS
    assert set(NATURAL_DATASETS) | set(POOLED_DATASETS) == set(DATASETS)
    for name in DATASETS:
        spec = dataset_spec(name)
        assert spec.name == name and spec.info.name == name
        assert spec.default_partition == ("natural" if spec.kind == "natural" else "dirichlet")
        assert (name in NATURAL_DATASETS) == (spec.kind == "natural")
        assert (name in EMBEDDED_DATASETS) == spec.embedded
        assert set(spec.reads) <= set(registry.LOADER_ARGUMENTS)
        if spec.kind == "pooled":
            assert set(spec.reads) <= set(registry.POOLED_LOADER_ARGUMENTS)
    assert dataset_spec("har").reads == ("data_dir", "num_clients")
    assert dataset_spec("mnist").reads == ("data_dir",)


def test_declarations_are_checked() -> None:
    info = DatasetInfo("toy", 2, (3,))
    with pytest.raises(ValueError, match="kind"):
        DatasetSpec(name="toy", info=info, kind="federated", loader=lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="info names"):
        DatasetSpec(name="other", info=info, kind="pooled", loader=lambda: None)
    with pytest.raises(ValueError, match="natural loaders may read"):
        DatasetSpec(name="toy", info=info, kind="natural", loader=lambda: None, reads=("alpha",))
    with pytest.raises(ValueError, match="pooled loaders may read"):
        DatasetSpec(name="toy", info=info, kind="pooled", loader=lambda seed: None, reads=("seed",))
    with pytest.raises(ValueError, match="takes no"):
        DatasetSpec(name="toy", info=info, kind="natural", loader=lambda: None, reads=("seed",))
    with pytest.raises(ValueError, match="already registered"):
        register_dataset(dataset_spec("digits"))


@pytest.fixture
def toy_dataset():
    """A pooled data set registered for one test: 40 samples, 4 classes, 3 features."""

    def load() -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(0)
        return rng.normal(size=(40, 3)).astype(np.float32), np.arange(40) % 4

    spec = register_dataset(
        DatasetSpec(
            name="toy",
            info=DatasetInfo("toy", 4, (3,)),
            kind="pooled",
            loader=load,
            embedded=True,
        )
    )
    yield spec
    del registry._REGISTRY["toy"]


def test_a_registered_dataset_is_usable_everywhere(toy_dataset: DatasetSpec) -> None:
    assert "toy" in dataset_names("pooled") and "toy" not in DATASETS  # DATASETS: import time
    pooled = load_pooled("toy")
    assert pooled.x.shape == (40, 3) and pooled.y.dtype == np.int64
    with pytest.raises(DatasetError, match="pooled; natively federated datasets"):
        load_natural("toy", 4)
    federation = build_federation(FederationSpec(dataset="toy", num_clients=4, partition="iid"))
    assert federation.info == toy_dataset.info
    assert sum(len(c.y_train) + len(c.y_test) for c in federation.clients) == 40


def test_unknown_dataset_lists_allowed_names() -> None:
    with pytest.raises(DatasetError) as error:
        load_pooled("imagenet-1k")
    for name in DATASETS:
        assert name in str(error.value)


def test_to_tensors_normalises_uint8_per_channel() -> None:
    info = DatasetInfo("fake", 2, (2, 1, 2), mean=(0.5, 0.25), std=(0.5, 0.25))
    x = np.array([[[[0, 255]], [[51, 102]]]], dtype=np.uint8)
    features, labels = to_tensors(x, np.array([1]), info)
    expected = np.array([[[[-1.0, 1.0]], [[(0.2 - 0.25) / 0.25, (0.4 - 0.25) / 0.25]]]])
    assert features.dtype == torch.float32 and labels.dtype == torch.int64
    np.testing.assert_allclose(features.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_to_tensors_leaves_float_inputs_unchanged() -> None:
    info = DatasetInfo("fake", 3, (4,), mean=(9.0,), std=(9.0,))
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    features, labels = to_tensors(x, np.arange(5, dtype=np.uint8), info)
    np.testing.assert_array_equal(features.numpy(), x)
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 1, 2, 3, 4]


# --------------------------------------------------------------------------------------
# digits
# --------------------------------------------------------------------------------------


def test_digits_loader() -> None:
    pooled = load_pooled("digits")
    assert pooled.x.shape == (1797, 1, 8, 8) and pooled.x.dtype == np.float32
    assert pooled.y.dtype == np.int64 and set(pooled.y.tolist()) == set(range(10))
    assert pooled.x.min() == 0.0 and pooled.x.max() == 1.0
    np.testing.assert_array_equal(pooled.x * 16, np.round(pooled.x * 16))  # 17 grey levels
    assert pooled.info == DatasetInfo("digits", 10, (1, 8, 8))


# --------------------------------------------------------------------------------------
# FedProx Synthetic(alpha, beta)
# --------------------------------------------------------------------------------------


def test_synthetic_shapes_sizes_and_determinism() -> None:
    data = generate_synthetic(200, alpha=0.5, beta=0.5, seed=4)
    sizes = np.array([len(y) for _, y in data.clients])
    assert len(data.clients) == 200
    assert sizes.min() >= 20
    assert 260 < sizes.mean() < 340  # lognormal with mean 300
    x0, y0 = data.clients[0]
    assert x0.shape == (sizes[0], 30) and x0.dtype == np.float32
    assert y0.dtype == np.int64 and y0.min() >= 0 and y0.max() < 30
    assert data.info == DatasetInfo("synthetic", 30, (30,))
    again = generate_synthetic(200, alpha=0.5, beta=0.5, seed=4)
    np.testing.assert_array_equal(again.clients[7][0], data.clients[7][0])
    other = generate_synthetic(200, alpha=0.5, beta=0.5, seed=5)
    assert not np.array_equal(other.clients[7][1], data.clients[7][1])


def test_synthetic_feature_heterogeneity_grows_with_beta() -> None:
    def spread(beta: float) -> float:
        data = generate_synthetic(60, alpha=0.01, beta=beta, seed=0)
        return float(np.std([x.mean() for x, _ in data.clients]))

    assert spread(5.0) > 3 * spread(0.01)


# --------------------------------------------------------------------------------------
# FedEM / PPFL synthetic mixture
# --------------------------------------------------------------------------------------


def test_mixture_sizes_match_reference_generator() -> None:
    # ppfl.md §5.1: seed 12345, 300 clients -> sum 67,758, min 50, median 93, max 1000.
    sizes = mixture_sample_counts(300, np.random.RandomState(12345))
    assert sizes.sum() == 67_758
    assert (sizes.min(), int(np.median(sizes)), sizes.max()) == (50, 93, 1000)


def test_mixture_labels_faithful_reproduces_current_index_bug() -> None:
    components = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    counts = [5, 12, 3]
    x = np.tile([2.0, 2.0], (20, 1))  # component 0 and 1 say 1, component 2 says 0
    noises = [np.zeros(count) for count in counts]
    fixed = mixture_labels(x, components, counts, noises, "fixed")
    faithful = mixture_labels(x, components, counts, noises, "faithful")
    # fixed: rows 0-4 component 0, 5-16 component 1, 17-19 component 2
    assert fixed.tolist() == [1] * 17 + [0] * 3
    # faithful: every component writes rows 0..count-1; the last writer wins, rows >= 12
    # (the largest count) keep 0: rows 0-2 component 2, rows 3-11 component 1.
    assert faithful.tolist() == [0] * 3 + [1] * 9 + [0] * 8


def test_mixture_modes_share_features_and_truth() -> None:
    fixed = generate_synthetic_mixture(60, seed=3, label_mode="fixed")
    faithful = generate_synthetic_mixture(60, seed=3, label_mode="faithful")
    for (x_a, _), (x_b, _) in zip(fixed.clients, faithful.clients, strict=True):
        np.testing.assert_array_equal(x_a, x_b)
    np.testing.assert_array_equal(fixed.components, faithful.components)
    assert fixed.components.shape == (3, 150)
    assert fixed.mixture_weights.shape == (60, 3)
    np.testing.assert_allclose(fixed.mixture_weights.sum(axis=1), 1.0)
    spec = FederationSpec(dataset="synthetic-mixture", num_clients=60, partition="natural", seed=3)
    components, memberships = synthetic_mixture_truth(spec)
    np.testing.assert_array_equal(components, fixed.components)
    np.testing.assert_array_equal(memberships, fixed.mixture_weights)


def test_mixture_faithful_mode_biases_labels_to_zero() -> None:
    fixed = generate_synthetic_mixture(100, seed=3, label_mode="fixed")
    faithful = generate_synthetic_mixture(100, seed=3, label_mode="faithful")
    ones_fixed = np.mean(np.concatenate([y for _, y in fixed.clients]))
    ones_faithful = np.mean(np.concatenate([y for _, y in faithful.clients]))
    assert 0.45 < ones_fixed < 0.55
    assert ones_faithful < ones_fixed - 0.08


def test_mixture_fixed_labels_follow_the_true_memberships() -> None:
    # Components are independent, so sign(x . theta_k) agrees with a client's labels on
    # about alpha_ik + (1 - alpha_ik) / 2 of its samples under the fixed generator.
    for mode, should_match in (("fixed", True), ("faithful", False)):
        mixture = generate_synthetic_mixture(100, seed=3, label_mode=mode)
        worst = 0.0
        for client, (x, y) in enumerate(mixture.clients):
            if len(y) < 300:
                continue
            agreement = np.mean(y[:, None] == (x @ mixture.components.T > 0), axis=0)
            expected = 0.5 + 0.5 * mixture.mixture_weights[client]
            worst = max(worst, float(np.abs(agreement - expected).max()))
        assert (worst < 0.12) == should_match, (mode, worst)


def test_mixture_reference_test_sets_keep_the_training_stream() -> None:
    small = generate_synthetic_mixture(3, seed=12345, dimension=5, n_test=7)
    assert small.test_clients is not None and len(small.test_clients) == 3
    assert all(len(y) == 7 for _, y in small.test_clients)
    without = generate_synthetic_mixture(3, seed=12345, dimension=5)
    # Client 0's training set is drawn before any test set, later ones are not.
    np.testing.assert_array_equal(small.clients[0][0], without.clients[0][0])
    assert not np.array_equal(small.clients[1][0], without.clients[1][0])


# --------------------------------------------------------------------------------------
# UCI HAR on a fake tree
# --------------------------------------------------------------------------------------


def test_har_loader_on_fake_uci_tree(tmp_path: Path) -> None:
    rows = write_fake_har(tmp_path)
    data = load_har(tmp_path)
    assert len(data.clients) == 30
    assert data.info == DatasetInfo("har", 6, (9, 1, 128))
    by_subject: dict[int, list[tuple[int, int]]] = {}
    for split in ("train", "test"):  # train rows come first in the pool
        for row, subject, label in rows[split]:
            by_subject.setdefault(subject, []).append((row, label))
    for client_id, (x, y) in enumerate(data.clients):
        expected = by_subject[client_id + 1]
        assert x.shape == (4, 9, 1, 128) and x.dtype == np.float32
        assert y.tolist() == [label - 1 for _, label in expected]
        for position, (row, _) in enumerate(expected):
            for signal in (0, 4, 8):
                np.testing.assert_allclose(
                    x[position, signal, 0, [0, 127]],
                    [har_value(signal, row, 0), har_value(signal, row, 127)],
                    rtol=1e-6,
                )


def test_har_federation_and_client_count(tmp_path: Path) -> None:
    write_fake_har(tmp_path)
    federation = build_federation(
        FederationSpec(
            dataset="har",
            num_clients=30,
            partition="natural",
            data_dir=str(tmp_path),
            test_fraction=0.25,
        )
    )
    assert [len(c.y_train) + len(c.y_test) for c in federation.clients] == [4] * 30
    assert all(len(c.y_test) == 1 for c in federation.clients)
    with pytest.raises(DatasetError, match="30 subjects"):
        build_federation(
            FederationSpec(
                dataset="har", num_clients=10, partition="natural", data_dir=str(tmp_path)
            )
        )


def test_har_missing_files_name_paths_and_source(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as error:
        load_har(tmp_path)
    message = str(error.value)
    assert "body_acc_x_train.txt" in message and "archive.ics.uci.edu" in message


# --------------------------------------------------------------------------------------
# MNIST / CIFAR-10 offline formats
# --------------------------------------------------------------------------------------


def test_mnist_offline_npz_reader(tmp_path: Path) -> None:
    x, y = write_fake_mnist(tmp_path)
    pooled = load_pooled("mnist", str(tmp_path))
    assert pooled.x.shape == (60, 1, 28, 28) and pooled.x.dtype == np.uint8
    np.testing.assert_array_equal(pooled.x[:, 0], x)
    assert pooled.y.dtype == np.int64 and pooled.y.tolist() == y.tolist()
    features, _ = to_tensors(pooled.x[:2], pooled.y[:2], pooled.info)
    expected = (x[:2].astype(np.float32) / 255 - 0.1307) / 0.3081
    np.testing.assert_allclose(features[:, 0].numpy(), expected, rtol=1e-5, atol=1e-5)


def test_cifar10_offline_tar_reader_orders_and_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PFLARENA_CACHE", str(cache))
    data_dir = tmp_path / "data"
    write_fake_cifar_tar(data_dir, {"train": 2, "test": 1})
    pooled = load_pooled("cifar10", str(data_dir))
    assert pooled.x.shape == (30, 3, 32, 32) and pooled.x.dtype == np.uint8
    # train first (class order, then file number), then test
    assert pooled.y.tolist() == [k for k in range(10) for _ in range(2)] + list(range(10))
    expected = [class_color("train", k, n) for k in range(10) for n in range(2)]
    expected += [class_color("test", k, 0) for k in range(10)]
    mean_colors = pooled.x.reshape(30, 3, -1).mean(axis=2)
    np.testing.assert_allclose(mean_colors, np.array(expected, dtype=float), atol=4)
    # The decoded arrays are cached under $PFLARENA_CACHE, nothing is written to data_dir.
    assert len(list(cache.glob("cifar10-jpeg-*.npz"))) == 1
    assert sorted(p.name for p in data_dir.rglob("*") if p.is_file()) == ["cifar10-jpeg.tar"]

    def no_decode(path: Path) -> None:
        raise AssertionError("decoded again instead of reading the cache")

    monkeypatch.setattr(dataset_io, "_decode_cifar10_tar", no_decode)
    again_x, again_y = read_cifar10_jpeg_tar(data_dir / "cifar10" / "cifar10-jpeg.tar")
    np.testing.assert_array_equal(again_x, pooled.x)
    np.testing.assert_array_equal(again_y, pooled.y)


def test_cifar10_tar_with_unknown_class_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PFLARENA_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as archive:
        payload = _jpeg_bytes((1, 2, 3))
        member = tarfile.TarInfo("train/zebra/0000.jpg")
        member.size = len(payload)
        archive.addfile(member, io.BytesIO(payload))
    with pytest.raises(DatasetError, match="zebra"):
        read_cifar10_jpeg_tar(path)


@pytest.mark.parametrize("name", ["mnist", "cifar10", "cifar100"])
def test_missing_image_files_say_what_was_tried(tmp_path: Path, name: str) -> None:
    with pytest.raises(DatasetError) as error:
        load_pooled(name, str(tmp_path))
    message = str(error.value)
    assert f"pflarena data fetch {name} --data-dir {tmp_path}` downloads them" in message
    assert "--from PATH" in message
    if name == "mnist":
        assert "mnist-70k.npz" in message
    if name == "cifar10":
        assert "cifar10-jpeg.tar" in message
    with pytest.raises(DatasetError, match="needs data_dir"):
        load_pooled(name, "")
