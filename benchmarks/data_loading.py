"""How long the file-based loaders take: the first load (parse and decode) against a load
from the cache, on generated copies in the real layouts, and the first load extrapolated
to the real datasets' sizes.

Generated copies (in a temporary folder, removed afterwards):

* LEAF Shakespeare: ``--roles`` roles of ``--windows`` 80-character windows, in
  ``all_data/``;
* LEAF FEMNIST: ``--writers`` writers of ``--images`` 28x28 images (784 values
  ``pixel / 255``), in ``all_data/``;
* Tiny-ImageNet: 200 classes of ``--per-class`` training JPEGs and one validation image
  each.

Each is loaded twice with an empty cache folder: the first load parses and decodes and
writes the cache, the second reads the cache. The real sizes used for the extrapolation:
Shakespeare 4,226,158 windows, FEMNIST 805,263 images (LEAF paper, Table 1),
Tiny-ImageNet 110,000 labelled images.

Usage::

    python benchmarks/data_loading.py
    python benchmarks/data_loading.py --roles 50 --windows 4000 --writers 40 --images 300
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "data_loading.md"
REAL = {"shakespeare": 4_226_158, "femnist": 805_263, "tiny-imagenet": 110_000}
LETTERS = "abcdefghijklmnopqrstuvwxyz ,.;:!?'ABCDEFGHIJKLMNOPQRSTUVWXYZ\n"


def write_json(path: Path, users: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    content = {
        "users": list(users),
        "num_samples": [len(ys) for _, ys in users.values()],
        "user_data": {user: {"x": xs, "y": ys} for user, (xs, ys) in users.items()},
    }
    path.write_text(json.dumps(content))


def write_shakespeare(data_dir: Path, roles: int, windows: int, rng: random.Random) -> int:
    for chunk in range(0, roles, 100):
        users = {}
        for role in range(chunk, min(roles, chunk + 100)):
            text = "".join(rng.choice(LETTERS) for _ in range(windows + 80))
            users[f"ROLE{role}"] = (
                [text[i : i + 80] for i in range(windows)],
                [text[i + 80] for i in range(windows)],
            )
        write_json(data_dir / "shakespeare" / "data" / "all_data" / f"all_data_{chunk}.json", users)
    return roles * windows


def write_femnist(data_dir: Path, writers: int, images: int, rng: np.random.Generator) -> int:
    for chunk in range(0, writers, 100):
        users = {}
        for writer in range(chunk, min(writers, chunk + 100)):
            pixels = rng.integers(0, 256, size=(images, 784)) / 255
            users[f"f{writer:04d}"] = (pixels.tolist(), rng.integers(0, 62, size=images).tolist())
        write_json(data_dir / "femnist" / "data" / "all_data" / f"all_data_{chunk}.json", users)
    return writers * images


def write_tiny_imagenet(data_dir: Path, per_class: int, rng: np.random.Generator) -> int:
    root = data_dir / "tiny-imagenet-200"
    wnids = [f"n{1000000 + index:08d}" for index in range(200)]
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    annotations = []
    for index, wnid in enumerate(wnids):
        folder = root / "train" / wnid / "images"
        folder.mkdir(parents=True)
        for number in range(per_class):
            pixels = rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{wnid}_{number}.JPEG", quality=90)
        name = f"val_{index}.JPEG"
        Image.fromarray(rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)).save(
            root / "val" / "images" / name, quality=90
        )
        annotations.append(f"{name}\t{wnid}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(annotations) + "\n")
    return 200 * (per_class + 1)


def timed(load) -> float:
    start = time.perf_counter()
    load()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--roles", type=int, default=20)
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--writers", type=int, default=20)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--per-class", type=int, default=20)
    args = parser.parse_args()

    from pflarena.core.datasets import load_femnist, load_shakespeare, load_tiny_imagenet

    work = Path(tempfile.mkdtemp(prefix="pflarena-loading-"))
    rows = []
    try:
        data = work / "data"
        cases = [
            (
                "shakespeare",
                write_shakespeare(data, args.roles, args.windows, random.Random(0)),
                lambda: load_shakespeare(data, num_clients=0),
            ),
            (
                "femnist",
                write_femnist(data, args.writers, args.images, np.random.default_rng(0)),
                lambda: load_femnist(data, num_clients=0),
            ),
            (
                "tiny-imagenet",
                write_tiny_imagenet(data, args.per_class, np.random.default_rng(0)),
                lambda: load_tiny_imagenet(data),
            ),
        ]
        for name, samples, load in cases:
            os.environ["PFLARENA_CACHE"] = str(work / f"cache-{name}")
            first, cached = timed(load), timed(load)
            rows.append((name, samples, first, cached, first / samples * REAL[name]))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    command = "python " + " ".join(["benchmarks/data_loading.py", *sys.argv[1:]])
    lines = [
        "# Loading the file-based datasets: first load against the cache",
        "",
        f"Command: `{command}`",
        "",
        "Generated copies in the real layouts (see the script). Wall times on a machine shared "
        "with other jobs: read the ratios, and the extrapolations as orders of magnitude.",
        "",
        "| dataset | samples | first load s | cached load s | first / cached | first load at "
        "the real size, s (extrapolated) |",
        "|---|---|---|---|---|---|",
    ]
    for name, samples, first, cached, real in rows:
        lines.append(
            f"| {name} | {samples:,} | {first:.2f} | {cached:.3f} | {first / cached:.0f} "
            f"| {real:,.0f} ({REAL[name]:,} samples) |"
        )
    RESULT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
