"""Tiny-ImageNet, read from a small fake of the ``tiny-imagenet-200`` folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from fake_data import tiny_colour, write_fake_tiny_imagenet
from PIL import Image

from pflarena.core.datasets import (
    DatasetError,
    check_files,
    dataset_spec,
    load_pooled,
    load_tiny_imagenet,
)
from pflarena.core.federation import (
    FederationSpec,
    build_federation,
    clear_caches,
    load_server_data,
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 classes, 2 training and 1 validation image each (600 JPEG files)."""
    data_dir = tmp_path_factory.mktemp("tiny")
    write_fake_tiny_imagenet(data_dir)
    return data_dir


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PFLARENA_CACHE", str(tmp_path / "cache"))
    clear_caches()


def close(a: np.ndarray, colour: tuple[int, int, int], tolerance: int = 4) -> bool:
    """A decoded image ``(3, 64, 64)`` is the solid colour up to JPEG rounding."""
    return bool(np.abs(a.astype(int) - np.array(colour)[:, None, None]).max() <= tolerance)


def test_pool_is_train_then_validation_with_sorted_wnid_labels(tiny_dir: Path) -> None:
    x, y = load_tiny_imagenet(tiny_dir)
    assert x.shape == (600, 3, 64, 64) and x.dtype == np.uint8 and y.dtype == np.int64
    assert y.min() == 0 and y.max() == 199
    # Training images: class by class (labels in sorted-wnid order), 2 per class.
    assert np.array_equal(y[:400], np.repeat(np.arange(200), 2))
    for row in range(400):
        label, number = divmod(row, 2)
        if label == 5 and number == 0:  # the grey-level image, widened to RGB
            assert close(x[row], (128, 128, 128))
        else:
            assert close(x[row], tiny_colour(0, label, number)), row
    # Validation images: one per class, in file-name order, labelled by the annotations.
    assert np.array_equal(np.bincount(y[400:], minlength=200), np.ones(200))
    for row in range(400, 600):
        assert close(x[row], tiny_colour(1, int(y[row]), 0)), row


def test_validation_order_follows_the_file_names(tiny_dir: Path) -> None:
    _, y = load_tiny_imagenet(tiny_dir)
    annotations = (tiny_dir / "tiny-imagenet-200" / "val" / "val_annotations.txt").read_text()
    wnids = sorted((tiny_dir / "tiny-imagenet-200" / "wnids.txt").read_text().split())
    by_name = sorted(line.split("\t")[:2] for line in annotations.splitlines())
    assert [wnids.index(wnid) for _, wnid in by_name] == y[400:].tolist()


def test_registration_and_the_pooled_form(tiny_dir: Path) -> None:
    spec = dataset_spec("tiny-imagenet")
    assert spec.kind == "pooled" and spec.default_model == "resnet18-64"
    assert spec.info.num_classes == 200 and spec.info.input_shape == (3, 64, 64)
    pooled = load_pooled("tiny-imagenet", tiny_dir)
    assert pooled.x.shape == (600, 3, 64, 64) and pooled.info is spec.info
    check_files("tiny-imagenet", tiny_dir)


def test_partitioned_federation_is_deterministic(tiny_dir: Path) -> None:
    spec = FederationSpec(
        dataset="tiny-imagenet",
        num_clients=4,
        partition="dirichlet",
        alpha=0.3,
        data_dir=str(tiny_dir),
        server_fraction=0.1,
    )
    federation = build_federation(spec)
    server = load_server_data(spec)
    total = sum(len(c.y_train) + len(c.y_test) for c in federation.clients) + len(server.y)
    assert total == 600 and len(server.y) == 60
    assert all(c.x_train.dtype == np.uint8 for c in federation.clients)
    clear_caches()
    again = build_federation(spec)
    for a, b in zip(federation.clients, again.clients, strict=True):
        assert np.array_equal(a.y_train, b.y_train) and np.array_equal(a.x_test, b.x_test)


def test_decoded_pool_is_cached(tiny_dir: Path, tmp_path: Path, monkeypatch) -> None:
    first = load_tiny_imagenet(tiny_dir)
    assert len(list((tmp_path / "cache").glob("tiny-imagenet-*.npz"))) == 1
    from pflarena.core.datasets import tiny_imagenet

    def undecodable(files):
        raise AssertionError("decoded again")

    monkeypatch.setattr(tiny_imagenet, "_decode", undecodable)
    second = load_tiny_imagenet(tiny_dir)
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])


# --------------------------------------------------------------------------------------
# Missing and malformed files
# --------------------------------------------------------------------------------------


@pytest.fixture
def copy_of(tiny_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(tiny_dir, target)
    return target


@pytest.mark.parametrize(
    "missing",
    ["", "wnids.txt", "train", "val/images", "val/val_annotations.txt"],
)
def test_missing_parts_are_named_with_the_layout(copy_of: Path, missing: str) -> None:
    root = copy_of / "tiny-imagenet-200"
    path = root / missing if missing else root
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    with pytest.raises(DatasetError) as error:
        check_files("tiny-imagenet", copy_of)
    message = str(error.value)
    assert f"not found: {path}" in message
    assert "wnids.txt, train/<wnid>/images/*.JPEG" in message and "tiny-imagenet-200.zip" in message
    with pytest.raises(DatasetError, match=str(path)):
        load_tiny_imagenet(copy_of)


def test_no_data_dir_says_what_is_needed() -> None:
    with pytest.raises(DatasetError, match="needs data-dir: a folder holding 'tiny-imagenet-200/'"):
        check_files("tiny-imagenet", "")
    with pytest.raises(DatasetError, match="needs data_dir"):
        load_tiny_imagenet("")


def test_malformed_parts_name_the_path(copy_of: Path) -> None:
    root = copy_of / "tiny-imagenet-200"
    annotations = root / "val" / "val_annotations.txt"
    original = annotations.read_text()
    annotations.write_text(original + "val_0.JPEG n99999999\t0\t0\t1\t1\n")
    with pytest.raises(DatasetError, match=r"val_annotations.txt line 201: expected") as error:
        load_tiny_imagenet(copy_of)
    assert str(annotations) in str(error.value)
    annotations.write_text(original.replace("val_7.JPEG", "val_missing.JPEG"))
    with pytest.raises(DatasetError, match="image not found: .*val_missing.JPEG"):
        load_tiny_imagenet(copy_of)
    annotations.write_text(original)
    wnids = root / "wnids.txt"
    listed = wnids.read_text().split()
    wnids.write_text("\n".join(listed[:199]) + "\n")
    with pytest.raises(DatasetError, match="expected 200 distinct WordNet ids") as error:
        load_tiny_imagenet(copy_of)
    assert str(wnids) in str(error.value)
    wnids.write_text("\n".join(listed) + "\n")
    first = sorted(listed)[0]
    image = root / "train" / first / "images" / f"{first}_1.JPEG"
    Image.new("RGB", (32, 32)).save(image)
    with pytest.raises(DatasetError, match="is 32x32, expected 64x64") as error:
        load_tiny_imagenet(copy_of)
    assert str(image) in str(error.value)
    image.write_bytes(b"not a jpeg")
    with pytest.raises(DatasetError, match="cannot decode Tiny-ImageNet image") as error:
        load_tiny_imagenet(copy_of)
    assert str(image) in str(error.value)
    for other in (root / "train" / first / "images").glob("*.JPEG"):
        other.unlink()
    with pytest.raises(DatasetError, match=f"no training images in .*{first}"):
        load_tiny_imagenet(copy_of)
