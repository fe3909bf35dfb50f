"""Small fakes of the real on-disk layouts of LEAF Shakespeare, LEAF FEMNIST and Tiny-ImageNet.

Written here from the formats' descriptions (LEAF's README and preprocessing scripts,
Tiny-ImageNet's archive), independently of the loaders they test.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
from PIL import Image

#: LEAF's 80 characters (models/utils/language_utils.py: ALL_LETTERS), written out again.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def write_leaf_file(path: Path, users: dict[str, tuple[list, list]], hierarchies=None) -> None:
    """One LEAF JSON file: users, num_samples, user_data (and hierarchies when given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    content = {
        "users": list(users),
        "num_samples": [len(ys) for _, ys in users.values()],
        "user_data": {user: {"x": xs, "y": ys} for user, (xs, ys) in users.items()},
    }
    if hierarchies is not None:
        content["hierarchies"] = hierarchies
    path.write_text(json.dumps(content))


def write_leaf(
    data_dir: Path,
    name: str,
    users: dict[str, tuple[list, list]],
    layout: str = "all_data",
    train_fraction: float = 0.8,
    users_per_file: int = 3,
    seed: int = 0,
) -> None:
    """A LEAF data set under ``<data_dir>/<name>/data/``.

    ``all_data``: the users spread over several files. ``split``: LEAF's ``split_data.py
    --by_sample`` output, ``int(frac · n)`` random training samples per user in
    ``train/``, the rest in ``test/``, for users with at least 2 samples.
    """
    root = data_dir / name / "data"
    names = list(users)
    chunks = [names[i : i + users_per_file] for i in range(0, len(names), users_per_file)]
    if layout == "all_data":
        for index, chunk in enumerate(chunks):
            write_leaf_file(
                root / "all_data" / f"all_data_{index}.json", {u: users[u] for u in chunk}
            )
        return
    rng = random.Random(seed)
    for index, chunk in enumerate(chunks):
        train, test = {}, {}
        for user in chunk:
            xs, ys = users[user]
            if len(ys) < 2:
                continue
            count = max(1, int(train_fraction * len(ys)))
            chosen = set(rng.sample(range(len(ys)), count))
            train[user] = ([xs[i] for i in sorted(chosen)], [ys[i] for i in sorted(chosen)])
            rest = [i for i in range(len(ys)) if i not in chosen]
            test[user] = ([xs[i] for i in rest], [ys[i] for i in rest])
        write_leaf_file(root / "train" / f"all_data_{index}_train_8.json", train)
        write_leaf_file(root / "test" / f"all_data_{index}_test_8.json", test)


def shakespeare_samples(lines: list[str], length: int = 80) -> tuple[list[str], list[str]]:
    """LEAF's windows of a role (shake_utils.py): each line padded on the left with
    ``length`` spaces, every window of ``length`` characters and the character after it."""
    xs, ys = [], []
    for line in lines:
        padded = " " * length + line
        for start in range(len(padded) - length):
            xs.append(padded[start : start + length])
            ys.append(padded[start + length])
    return xs, ys


def fake_roles(num_roles: int = 7, seed: int = 0) -> dict[str, list[str]]:
    """Roles with lines of different lengths (one short role with a single character)."""
    rng = random.Random(seed)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "Ay,", "me!"]
    roles = {}
    for index in range(num_roles):
        lines = [
            " ".join(rng.choice(words) for _ in range(2 + (index + line) % 4)) + "\n"
            for line in range(1 + index)
        ]
        roles[f"THE_PLAY_ROLE{index}"] = lines
    roles["A_TINY_ROLE"] = ["!"]  # one window only: LEAF's split drops it
    return roles


def write_fake_shakespeare(
    data_dir: Path, roles: dict[str, list[str]] | None = None, layout: str = "all_data"
) -> dict[str, tuple[list[str], list[str]]]:
    """Shakespeare in LEAF's layout; returns each role's windows and targets."""
    roles = fake_roles() if roles is None else roles
    users = {role: shakespeare_samples(lines) for role, lines in roles.items()}
    write_leaf(data_dir, "shakespeare", users, layout=layout)
    return users


def femnist_pixel(writer: int, sample: int, position: int) -> int:
    """The grey level the fake FEMNIST stores: encodes writer, sample and pixel."""
    return (37 * writer + 11 * sample + position) % 256


def write_fake_femnist(
    data_dir: Path, sizes: tuple[int, ...] = (5, 9, 3, 12, 1, 7), layout: str = "all_data"
) -> dict[str, tuple[list, list]]:
    """FEMNIST in LEAF's layout: writer w has ``sizes[w]`` images of 784 values pixel/255."""
    users = {}
    for writer, size in enumerate(sizes):
        xs = [
            [femnist_pixel(writer, sample, p) / 255 for p in range(784)] for sample in range(size)
        ]
        ys = [(writer * 7 + sample) % 62 for sample in range(size)]
        users[f"f{writer:04d}_{writer % 3:02d}"] = (xs, ys)
    write_leaf(data_dir, "femnist", users, layout=layout)
    return users


def tiny_imagenet_wnids(count: int = 200) -> list[str]:
    """WordNet-like ids, in a shuffled file order (the loader sorts them)."""
    wnids = [f"n{1000000 + 7919 * index:08d}" for index in range(count)]
    random.Random(3).shuffle(wnids)
    return wnids


def tiny_colour(split: int, label: int, number: int) -> tuple[int, int, int]:
    """A solid colour that encodes split (0 train, 1 val), sorted label and file number."""
    return (label, 60 + 120 * split, 40 * number + 20)


def write_fake_tiny_imagenet(
    data_dir: Path, train_per_class: int = 2, val_per_class: int = 1, grey_label: int = 5
) -> list[str]:
    """``tiny-imagenet-200`` with 200 classes of solid-colour 64x64 JPEGs.

    One training image of class ``grey_label`` is grey-level (as some real ones are).
    Returns the wnids in sorted order (label order).
    """
    root = data_dir / "tiny-imagenet-200"
    wnids = tiny_imagenet_wnids()
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (root / "words.txt").write_text("".join(f"{w}\tthing {w}\n" for w in wnids))
    label = {wnid: index for index, wnid in enumerate(sorted(wnids))}
    annotations = []
    number = 0
    for wnid in wnids:
        folder = root / "train" / wnid / "images"
        folder.mkdir(parents=True)
        for image in range(train_per_class):
            colour = tiny_colour(0, label[wnid], image)
            if label[wnid] == grey_label and image == 0:
                Image.new("L", (64, 64), 128).save(folder / f"{wnid}_{image}.JPEG", quality=95)
            else:
                Image.new("RGB", (64, 64), colour).save(folder / f"{wnid}_{image}.JPEG", quality=95)
        (root / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
        for image in range(val_per_class):
            name = f"val_{number}.JPEG"
            number += 1
            Image.new("RGB", (64, 64), tiny_colour(1, label[wnid], image)).save(
                root / "val" / "images" / name, quality=95
            )
            annotations.append(f"{name}\t{wnid}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(annotations) + "\n")
    (root / "test" / "images").mkdir(parents=True)
    Image.new("RGB", (64, 64), (1, 2, 3)).save(root / "test" / "images" / "test_0.JPEG")
    return sorted(wnids)


def femnist_image(writer: int, sample: int) -> np.ndarray:
    """The fake FEMNIST image of a writer's sample, ``(1, 28, 28)`` uint8."""
    return np.array([femnist_pixel(writer, sample, p) for p in range(784)], dtype=np.uint8).reshape(
        1, 28, 28
    )
