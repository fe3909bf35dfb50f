"""What a partition gave each client: sample counts and label histograms, printed and drawn.

PFLlib prints each client's size and ``(label, count)`` pairs when it generates a data set,
and FL-bench draws the partition as a clients x classes picture; :func:`partition_summary`
gives both from a :class:`~pflarena.core.federation.Federation` (or any list of per-client
label arrays), :func:`format_partition_summary` prints it, :func:`plot_partition` draws it.
``pflarena shards --stats`` uses all three; a config check can call
:func:`print_partition_summary` with the run's federation spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pflarena.core.drawing import pyplot

__all__ = [
    "LISTED_CLIENTS",
    "ClientSummary",
    "PartitionSummary",
    "format_partition_summary",
    "partition_summary",
    "plot_partition",
    "print_partition_summary",
]


@dataclass(frozen=True)
class ClientSummary:
    """One client's share: samples per split, and its labels over every split."""

    client_id: int
    num_train: int
    num_val: int
    num_test: int
    label_counts: tuple[int, ...]  # label_counts[c]: the client's samples of class c

    @property
    def total(self) -> int:
        return self.num_train + self.num_val + self.num_test

    @property
    def classes(self) -> int:
        """Classes the client has at least one sample of."""
        return sum(1 for count in self.label_counts if count)


@dataclass(frozen=True)
class PartitionSummary:
    """Every client's :class:`ClientSummary`, and what the data is."""

    dataset: str
    num_classes: int
    clients: tuple[ClientSummary, ...]
    title: str = ""

    def matrix(self) -> np.ndarray:
        """``(clients, classes)`` sample counts."""
        return np.array([c.label_counts for c in self.clients], dtype=np.int64).reshape(
            len(self.clients), self.num_classes
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "num_classes": self.num_classes,
            "clients": [
                {
                    "client": c.client_id,
                    "train": c.num_train,
                    "val": c.num_val,
                    "test": c.num_test,
                    "labels": {str(k): v for k, v in enumerate(c.label_counts) if v},
                }
                for c in self.clients
            ],
        }


def partition_text(run_config: dict[str, Any]) -> str:
    """The partition a run's data was split by, with its parameter (``dirichlet α=0.1``,
    ``pathological 2 classes/client``, ``shards <dir>``)."""
    if run_config.get("shards-dir"):
        return f"shards {Path(str(run_config['shards-dir'])).name}"
    partition = str(run_config.get("partition", "") or "")
    if partition == "dirichlet" and "alpha" in run_config:
        return f"dirichlet α={run_config['alpha']}"
    if partition == "pathological" and "classes-per-client" in run_config:
        return f"pathological {run_config['classes-per-client']} classes/client"
    return partition or "default partition"


def partition_summary(federation: Any, title: str = "") -> PartitionSummary:
    """The summary of a federation's clients.

    Parameters
    ----------
    federation : Federation
        :func:`~pflarena.core.federation.build_federation`'s result, or anything with
        ``info`` (``name``, ``num_classes``) and ``clients`` (each with ``client_id`` and
        ``y_train``, ``y_val``, ``y_test``).
    title : str
        What the partition is (``dirichlet α=0.1``), for the printout and the picture.
    """
    num_classes = int(federation.info.num_classes)
    clients = []
    for client in federation.clients:
        labels = np.concatenate(
            [
                np.asarray(y, dtype=np.int64).ravel()
                for y in (client.y_train, client.y_val, client.y_test)
            ]
        )
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f"client {client.client_id} holds labels outside 0..{num_classes - 1}")
        counts = np.bincount(labels, minlength=num_classes)
        clients.append(
            ClientSummary(
                client_id=int(client.client_id),
                num_train=len(client.y_train),
                num_val=len(client.y_val),
                num_test=len(client.y_test),
                label_counts=tuple(int(c) for c in counts),
            )
        )
    return PartitionSummary(federation.info.name, num_classes, tuple(clients), title)


#: The most clients a run's ``--check`` lists (the first ones; the spread of the sizes
#: still covers every client): ``pflarena shards --stats`` lists every one.
LISTED_CLIENTS = 40


def format_partition_summary(
    summary: PartitionSummary, max_labels: int = 12, all_sizes: np.ndarray | None = None
) -> str:
    """PFLlib's printout, one line per client: its samples (train/val/test), the classes
    it has and its ``label:count`` pairs, largest first (``max_labels`` of them, then how
    many more), and a closing line with the spread of the clients' sizes. ``all_sizes``:
    every client's samples where ``summary`` holds the first clients only (the line then
    says how many more there are)."""
    lines = [
        f"partition of {summary.dataset}"
        + (f" ({summary.title})" if summary.title else "")
        + f": {len(summary.clients)} clients, {summary.num_classes} classes"
    ]
    width = len(str(max((c.client_id for c in summary.clients), default=0)))
    for client in summary.clients:
        pairs = sorted(
            ((label, count) for label, count in enumerate(client.label_counts) if count),
            key=lambda pair: (-pair[1], pair[0]),
        )
        shown = " ".join(f"{label}:{count}" for label, count in pairs[:max_labels])
        if len(pairs) > max_labels:
            shown += f" (+{len(pairs) - max_labels} more)"
        lines.append(
            f"client {client.client_id:>{width}}: {client.total:>6} samples "
            f"({client.num_train} train / {client.num_val} val / {client.num_test} test), "
            f"{client.classes:>3} classes | {shown}"
        )
    sizes = np.array([c.total for c in summary.clients])
    listed = ""
    if all_sizes is not None and len(all_sizes) > len(summary.clients):
        lines.append(
            f"... and {len(all_sizes) - len(summary.clients)} more clients (`pflarena shards "
            "--stats` lists every one)"
        )
        sizes = np.asarray(all_sizes)
        listed = f" (of the {len(summary.clients)} listed)"
    if sizes.size:
        lines.append(
            f"samples per client: min {sizes.min()}, median {int(np.median(sizes))}, "
            f"max {sizes.max()}; classes per client{listed}: min "
            f"{min(c.classes for c in summary.clients)}, max "
            f"{max(c.classes for c in summary.clients)}"
        )
    return "\n".join(lines)


def plot_partition(summary: PartitionSummary, path: str | Path) -> Path:
    """The partition as a picture: one row per client, one column per class, each cell's
    samples as a bubble (area and colour; up to 40 x 40) or a coloured cell (larger
    partitions), with a labelled colour bar; beside it each client's samples."""
    plt = pyplot()

    matrix = summary.matrix()
    clients, classes = matrix.shape
    height = min(14.0, 2.5 + 0.22 * clients)
    width = min(18.0, 4.5 + 0.28 * classes)
    fig, (ax, side) = plt.subplots(
        1,
        2,
        figsize=(width + 2.5, height),
        sharey=True,
        gridspec_kw={"width_ratios": [max(classes, 4), max(2, classes // 4)]},
        layout="constrained",
    )
    peak = max(int(matrix.max()), 1)
    if clients <= 40 and classes <= 40:
        rows, cols = np.nonzero(matrix)
        values = matrix[rows, cols]
        image = ax.scatter(
            cols,
            rows,
            s=20 + 380 * values / peak,
            c=values,
            cmap="viridis",
            vmin=0,
            vmax=peak,
            edgecolors="black",
            linewidths=0.3,
        )
        ax.set_xlim(-0.6, classes - 0.4)
        ax.set_ylim(clients - 0.4, -0.6)
        ax.grid(alpha=0.25)
    else:
        image = ax.imshow(
            np.where(matrix > 0, matrix, np.nan),
            aspect="auto",
            cmap="viridis",
            vmin=0,
            vmax=peak,
            interpolation="nearest",
        )
    from matplotlib.ticker import MaxNLocator  # whole-number ticks: clients and classes

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if classes <= 40:  # every class and client named
        ax.set_xticks(range(classes))
    if clients <= 40:
        ax.set_yticks(range(clients))
    ax.set_xlabel("class (label)")
    ax.set_ylabel("client id")
    ax.set_title("samples per client and class")
    fig.colorbar(
        image, ax=ax, shrink=0.85, aspect=40, pad=0.01, label="samples of the class at the client"
    )
    side.barh(range(clients), matrix.sum(axis=1), color="C1")
    side.set_xlabel("samples")
    side.set_title("per client")
    side.grid(alpha=0.25, axis="x")
    fig.suptitle(
        f"{summary.dataset}"
        + (f" · {summary.title}" if summary.title else "")
        + f" · {clients} clients · {classes} classes"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def print_partition_summary(
    spec: Any,
    file: Any = None,
    plot: str | Path | None = None,
    max_clients: int | None = None,
) -> PartitionSummary:
    """Build the federation a run config describes (``cfg.federation_spec()``), print its
    :func:`format_partition_summary` to ``file`` (default stdout) and, with ``plot``, draw it
    there; return the summary. Builds the data: the data set's files must be there.

    With ``max_clients``, a larger federation lists its first ``max_clients`` clients, each
    built alone where its data set allows (:func:`~pflarena.core.federation.load_client`),
    and the spread of every client's size (:func:`~pflarena.core.federation.client_sizes`):
    a run of 100,000 virtual clients is checked without drawing them all."""
    import sys
    from types import SimpleNamespace

    from pflarena.core.federation import build_federation, client_sizes, load_client

    title = partition_text(spec.model_dump(by_alias=True))
    all_sizes = None
    if max_clients is not None and spec.num_clients > max_clients:
        listed = [load_client(spec, client_id) for client_id in range(max_clients)]
        federation = SimpleNamespace(info=listed[0][1], clients=[c for c, _ in listed])
        all_sizes = np.sum(client_sizes(spec), axis=0)
    else:
        federation = build_federation(spec)
    summary = partition_summary(federation, title)
    print(format_partition_summary(summary, all_sizes=all_sizes), file=file or sys.stdout)
    if plot is not None:
        plot_partition(summary, plot)
    return summary
