#!/bin/bash
# What benchmarks/gpu/run.sh needs on a GPU machine that has Python and PyTorch but no network:
# pflarena and its other dependencies as wheels in .whl/, and MNIST in .gpudata/mnist/.
# Both are git-ignored; the device tool carries them with the tree (64 MiB in all).
#
#   benchmarks/gpu/prepare.sh MNIST_NPZ [PYTHON_VERSION]
#
# MNIST_NPZ: an offline copy of mnist-70k.npz (arrays x, y). PYTHON_VERSION: the GPU machine's
# (default 3.12). The wheels are the versions installed in this project's .venv, resolved from
# pflarena's own requirements, without: what the machine's image already holds
# (benchmarks/gpu/image-packages.txt: torch, numpy, scipy, matplotlib, ...) but grpcio and
# protobuf, which flwr pins closely; what only optional features need (cvxpy and its solvers
# for solver="cvxpy", Ray for --engine ray, the experiment trackers); and what only
# `pflarena data` and the partitioners of Hugging Face datasets import (flwr-datasets with
# datasets, pyarrow, pandas), and Flower's own tools a simulation never starts (uv, its
# SuperLink's database and HTTP server).
set -euo pipefail
npz=${1:?MNIST_NPZ (mnist-70k.npz)}
pyver=${2:-3.12}
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}

rm -rf .whl .gpudata
mkdir -p .whl .gpudata/mnist
cp "$npz" .gpudata/mnist/mnist-70k.npz

# name==version of every installed distribution pflarena needs at run time, but the excluded.
$PY - benchmarks/gpu/image-packages.txt > .whl/requirements.txt <<'PYEOF'
import re
import sys
from importlib.metadata import distribution, PackageNotFoundError
from pathlib import Path

EXCLUDED = re.compile(
    r"^(torch|torchvision|triton|nvidia-.*|cuda-.*|cvxpy|clarabel|ecos|osqp|scs|qdldl|"
    r"ray|mlflow.*|wandb|tensorboard.*|pflarena|flwr-datasets|datasets|pyarrow|pandas|"
    r"huggingface-hub|hf-xet|multiprocess|dill|xxhash|uv|sqlalchemy|alembic|mako|fastapi|"
    r"starlette|uvicorn)$"
)
THERE = {
    line.strip().lower().replace("_", "-")
    for line in Path(sys.argv[1]).read_text().splitlines()
    if line.strip() and not line.startswith("#")
} - {"grpcio", "protobuf"}

def name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")

seen, todo = set(), ["pflarena"]
while todo:
    current = todo.pop()
    if current in seen:
        continue
    seen.add(current)
    try:
        dist = distribution(current)
    except PackageNotFoundError:
        continue
    for requirement in dist.requires or []:
        if "extra ==" in requirement:
            continue  # an optional feature's dependency
        dependency = name(requirement)
        if not EXCLUDED.match(dependency):
            todo.append(dependency)
for current in sorted(seen - {"pflarena"} - THERE):
    try:
        print(f"{current}=={distribution(current).version}")
    except PackageNotFoundError:
        pass
PYEOF
$PY -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any --implementation cp \
    -r .whl/requirements.txt -d .whl
$PY -m pip wheel -q --no-deps --no-build-isolation . -w .whl
du -sh .whl .gpudata
echo "carry .whl and .gpudata: benchmarks/gpu/run.sh OUT runs there"
