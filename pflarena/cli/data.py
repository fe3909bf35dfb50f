"""``pflarena data`` (list the data sets, where to get one, fetch one, check a local copy)
and ``pflarena shards`` (write one data file per client, or import another toolkit's
partition; ``--stats`` prints and draws what each client got)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pflarena.cli.options import DATA_KEYS, add_config_flags, collect_overrides
from pflarena.core.config import ConfigError, parse_run_config
from pflarena.core.datasets import DatasetSpec, check_files
from pflarena.core.datasets.base import counted
from pflarena.core.importers import IMPORT_FORMATS

__all__ = ["add_parser", "add_shards_parser", "data_command", "shards_command"]


def fetch_command(args: argparse.Namespace) -> int:
    """``pflarena data fetch NAME --data-dir DIR [--from PATH]``."""
    from pflarena.core.datasets import dataset_spec
    from pflarena.core.datasets.fetch import fetch_dataset

    if args.target is None:
        raise ConfigError(
            "pflarena data fetch needs a data set name: pflarena data fetch NAME --data-dir DIR"
        )
    dataset_spec(args.target)  # an unknown name: the registered ones listed
    print(fetch_dataset(args.target, args.data_dir, source=args.source, progress=not args.quiet))
    return 0


def fetch_parser(prog: str = "pflarena data fetch") -> argparse.ArgumentParser:
    """The flags of ``pflarena data fetch``, for its own ``--help`` (they are parsed by
    ``pflarena data``'s parser, which ``data fetch NAME`` shares)."""
    fetch = argparse.ArgumentParser(
        prog=prog,
        usage=f"{prog} NAME --data-dir DIR [--from PATH] [--quiet]",
        description="Download data set NAME into DIR, laid out as `--data-dir DIR` reads it. "
        "mnist, fashion-mnist, cifar10, cifar100, emnist: the files torchvision downloads, "
        "checked against its MD5s, unpacked by torchvision; har, tiny-imagenet: one archive "
        "each, checked against its published checksum, then unpacked. A download cut short "
        "is continued by the same command; a fetch that fails removes what it made. "
        "femnist, shakespeare: built by LEAF's scripts (it prints the steps). A data set "
        "already in DIR is not fetched again; digits, synthetic, synthetic-on-demand and "
        "synthetic-mixture ship "
        "with pflarena.",
        epilog="Without network, --from installs the same from a copy made elsewhere: "
        "torchvision's download files (e.g. MNIST's four *-ubyte.gz, CIFAR-10's "
        "cifar-10-python.tar.gz) or a folder holding them, pflarena's single-file copies "
        "(mnist-70k.npz, cifar10-jpeg.tar), the archive of har or tiny-imagenet, LEAF's "
        "data/ folder for femnist and shakespeare. Each is checked (MD5, checksum, or the "
        "loader's own check) before anything is put in place. "
        "Example: pflarena data fetch mnist --data-dir data --from ~/Downloads/MNIST/raw",
    )
    fetch.add_argument("name", metavar="NAME", help="the data set (`pflarena data` lists them)")
    fetch.add_argument("--data-dir", metavar="DIR", help="the folder to put it in (required)")
    fetch.add_argument(
        "--from",
        metavar="PATH",
        help="install it from this local file or folder instead of downloading it",
    )
    fetch.add_argument("--quiet", action="store_true", help="no progress bar")
    return fetch


class _DataHelp(argparse.Action):
    """``-h``/``--help`` of ``pflarena data``: after ``data fetch``, the help of ``fetch``."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        if getattr(namespace, "name", None) == "fetch":
            fetch_parser(f"{parser.prog} fetch").print_help()
        else:
            parser.print_help()
        parser.exit()


def data_command(args: argparse.Namespace) -> int:
    from pflarena.core.datasets import DATASETS, dataset_spec

    if args.name == "fetch":
        return fetch_command(args)
    if args.source is not None:
        raise ConfigError("--from belongs to pflarena data fetch NAME --data-dir DIR --from PATH")
    if args.target is not None:
        raise ConfigError(
            f"pflarena data takes one data set name, got {args.name!r} and {args.target!r} "
            "(to download one: pflarena data fetch NAME --data-dir DIR)"
        )
    if args.name is None:
        print("| dataset | kind | classes | sample | default model | files |")
        print("|---|---|---|---|---|---|")
        for name in DATASETS:
            spec = dataset_spec(name)
            shape = "x".join(map(str, spec.info.input_shape))
            sample = f"{shape} ids < {spec.info.vocabulary_size}" if spec.info.tokens else shape
            files = "embedded" if spec.check is None else spec.layout
            print(
                f"| {name} | {spec.kind} | {spec.info.num_classes} | {sample} "
                f"| {spec.default_model} | {files} |"
            )
        print(
            "\n`pflarena data NAME` shows where to get a data set; "
            "`pflarena data fetch NAME --data-dir DIR` downloads it; "
            "`pflarena data NAME --check --data-dir DIR` reads a local copy."
        )
        return 0
    spec = dataset_spec(args.name)
    if not args.check:
        print(
            f"{spec.name}: {spec.kind}, {spec.info.num_classes} classes, samples "
            f"{spec.info.input_shape}, default partition {spec.default_partition}, "
            f"default model {spec.default_model}"
        )
        if spec.check is None:
            print("ships with pflarena: no files needed")
        else:
            print(f"layout under data-dir: {spec.layout}\nget it: {spec.source}")
            print(f"or: pflarena data fetch {spec.name} --data-dir DIR")
        return 0
    return _check_data(spec, args)


def _check_data(spec: DatasetSpec, args: argparse.Namespace) -> int:
    """Read a local copy of a data set and print what the loader found."""
    import numpy as np

    from pflarena.core.datasets import load_natural, load_pooled

    check_files(spec.name, args.data_dir)
    if spec.kind == "pooled":
        pooled = load_pooled(spec.name, args.data_dir)
        shares = [pooled.y]
        x = pooled.x
        print(f"{spec.name}: {counted(len(pooled.y), 'sample')} in one pool")
    else:
        natural = load_natural(
            spec.name,
            args.num_clients if args.num_clients is not None else (10 if spec.embedded else 0),
            seed=args.seed,
            data_dir=args.data_dir,
            min_client_samples=args.min_client_samples,
        )
        shares = [y for _, y in natural.clients]
        x = np.concatenate([client_x[:1] for client_x, _ in natural.clients])
        sizes = np.array([len(y) for y in shares])
        print(
            f"{spec.name}: {counted(len(shares), 'client')}, {counted(int(sizes.sum()), 'sample')} "
            f"(per client min {sizes.min()}, median {int(np.median(sizes))}, max {sizes.max()})"
        )
    labels = np.concatenate(shares)
    present = np.unique(labels)
    print(f"samples: shape {tuple(x.shape[1:])}, dtype {x.dtype}")
    print(
        f"labels: {len(present)} of {spec.info.num_classes} classes present, "
        f"range {labels.min()}..{labels.max()}"
    )
    if labels.min() < 0 or labels.max() >= spec.info.num_classes:
        print(f"error: labels outside 0..{spec.info.num_classes - 1}", file=sys.stderr)
        return 1
    print("ok")
    return 0


def shards_import_command(args: argparse.Namespace) -> int:
    from pflarena.core.importers import import_leaf, import_pfllib
    from pflarena.core.shard_format import read_shard_set

    if not 0 <= args.import_validation_fraction < 1:
        raise ConfigError("--validation-fraction must be in [0, 1)")
    options = {"validation_fraction": args.import_validation_fraction, "seed": args.import_seed}
    if args.format == "pfllib":
        paths = import_pfllib(
            args.folder, args.out, name=args.name, num_classes=args.num_classes, **options
        )
    else:
        if args.num_classes is not None:
            raise ConfigError(f"--num-classes applies to --format pfllib, not {args.format}")
        paths = import_leaf(args.folder, args.out, dataset=args.format.split("-", 1)[1], **options)
    shard_set = read_shard_set(args.out)
    record = json.loads((shard_set.directory / "manifest.json").read_text()).get("import", {})
    if record.get("num_classes_source") == "inferred":
        print(
            f"config.json has no num_classes: {shard_set.info.num_classes} classes inferred "
            f"from the labels (largest label {record['largest_label']}, "
            f"{counted(record['labels_present'], 'distinct label')}; --num-classes sets the count)"
        )
    print(
        f"wrote {counted(len(paths), 'shard file')} ({shard_set.info.name}: {shard_set.info.num_classes} "
        f"classes, samples {shard_set.info.input_shape}, {sum(shard_set.num_train)} train / "
        f"{sum(shard_set.num_val)} validation / {sum(shard_set.num_test)} test) to "
        f"{shard_set.directory}"
    )
    print(f"simulate on them: pflarena run --shards-dir {shard_set.directory} --strategy fedavg")
    return 0


def shards_command(args: argparse.Namespace) -> int:
    from pflarena.core.federation import build_federation
    from pflarena.core.shard_format import write_shards

    if not args.out and not args.stats:
        raise ConfigError(
            "pflarena shards needs --out DIR (or --stats, to only look at the partition)"
        )

    overrides = collect_overrides(args, list(DATA_KEYS))
    cfg = parse_run_config(overrides)
    spec = cfg.federation_spec()
    federation = build_federation(spec)
    if args.out:
        paths = write_shards(federation, args.out, spec)
        print(f"wrote {counted(len(paths), 'shard file')} to {Path(args.out).resolve()}")
        example = paths[0].resolve()
        print(
            f"start each SuperNode with its own file, e.g. --node-config 'data-path=\"{example}\"'"
        )
    if args.stats:
        from pflarena.core.partition_stats import (
            format_partition_summary,
            partition_summary,
            partition_text,
            plot_partition,
        )

        summary = partition_summary(federation, partition_text(cfg.to_run_config()))
        print(format_partition_summary(summary))
        picture = Path(
            args.plot or (Path(args.out) / "partition.png" if args.out else "partition.png")
        )
        print(f"partition picture: {plot_partition(summary, picture)}")
    return 0


def add_parser(sub: Any, full_help: bool = False) -> None:
    """``pflarena data``."""
    data = sub.add_parser(
        "data",
        help="list the data sets, show where to get one, fetch one (data fetch NAME "
        "--data-dir DIR), or check a local copy",
        usage="pflarena data [NAME] [--check --data-dir DIR ...]\n"
        "       pflarena data fetch NAME --data-dir DIR [--from PATH] [--quiet]",
        description="Without NAME: every data set. With NAME: where to get it and its layout; "
        "--check reads a local copy. `data fetch NAME --data-dir DIR` downloads it into DIR "
        "(torchvision's data sets, har, tiny-imagenet; checksummed and resumable), or with "
        "--from PATH installs it from a local copy; for LEAF's it prints the steps to build "
        "it. `pflarena data fetch --help`: its own flags.",
        add_help=False,
    )
    data.add_argument("-h", "--help", action=_DataHelp, help="show this help message and exit")
    data.add_argument(
        "name", nargs="?", help="a data set name, or `fetch` to download one: data fetch NAME"
    )
    data.add_argument("target", nargs="?", help=argparse.SUPPRESS)  # NAME of `data fetch NAME`
    data.add_argument("--quiet", action="store_true", help="data fetch: no progress bar")
    data.add_argument(
        "--from",
        dest="source",
        metavar="PATH",
        help="data fetch: install from this local file or folder instead of downloading",
    )
    data.add_argument(
        "--check", action="store_true", help="read the local copy in --data-dir and summarise it"
    )
    data.add_argument("--data-dir", default="", help="folder holding the data set's files")
    data.add_argument(
        "--num-clients",
        type=int,
        default=None,
        help="natively federated data sets: clients to form (default: every eligible one)",
    )
    data.add_argument(
        "--min-client-samples", type=int, default=0, help="LEAF data sets: LEAF's -k filter"
    )
    data.add_argument("--seed", type=int, default=0, help="seed of the choice of clients")
    data.set_defaults(func=data_command)


def add_shards_parser(sub: Any, full_help: bool = False) -> None:
    """``pflarena shards`` and ``pflarena shards import``."""
    shards = sub.add_parser(
        "shards",
        help="write one data file per client (deployments, --shards-dir), or import a "
        "partition made by another toolkit",
    )
    add_config_flags(shards, DATA_KEYS)
    shards.add_argument(
        "--out", help="directory for the shard files (required unless --stats is given)"
    )
    shards.add_argument(
        "--stats",
        action="store_true",
        help="print each client's samples and label histogram and draw the partition "
        "(clients x classes) to <out>/partition.png (or --plot)",
    )
    shards.add_argument("--plot", help="with --stats: the partition picture's file")
    shards.set_defaults(func=shards_command)
    shards_commands = shards.add_subparsers(dest="shards_command", metavar="{import}")
    imports = shards_commands.add_parser(
        "import",
        help="convert another toolkit's partitioned dataset folder into shard files",
        description="Convert a dataset folder partitioned by another toolkit into shard files, "
        "keeping its clients, their samples and its train/test split: pfllib (config.json, "
        "train/<i>.npz, test/<i>.npz), leaf-femnist and leaf-shakespeare (LEAF's train/*.json "
        "and test/*.json).",
    )
    imports.add_argument("folder", help="the toolkit's dataset folder")
    imports.add_argument(
        "--format", required=True, choices=IMPORT_FORMATS, help="the folder's layout"
    )
    imports.add_argument("--out", required=True, help="directory for the shard files")
    imports.add_argument("--name", help="the data's name (pfllib; default pfllib-<folder>)")
    imports.add_argument(
        "--num-classes",
        type=int,
        help="pfllib: the number of classes (default: config.json's num_classes, else the "
        "largest label plus one); must agree with config.json and exceed every label",
    )
    imports.add_argument(
        "--validation-fraction",
        dest="import_validation_fraction",
        type=float,
        default=0.0,
        help="carve a seeded validation split out of each client's training split (default 0)",
    )
    imports.add_argument(
        "--seed", dest="import_seed", type=int, default=0, help="seed of that split (default 0)"
    )
    imports.set_defaults(func=shards_import_command)
