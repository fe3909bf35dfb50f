"""``label-groups``: the PPFL paper's pathological group split (docs/papers/ppfl.md §5.2).

The classes are dealt into ``label_groups`` disjoint groups; each group's samples are
shuffled and cut into (almost) equal consecutive pieces, one per client of that group; the
clients are then put in a random order. So every client holds the classes of exactly one
group, clients of one group share a distribution, and the groups are the K* "canonical
behaviours" PPFL should find (MNIST: 4 groups of 2, 2, 3 and 3 digits over 100 clients,
25 per group; CIFAR-10 uses 3 groups).

It reproduces the authors' ``pathological/data/mnist/generate_data.py`` (INFORMSJoC
2023.0376) step by step with Python's ``random.Random(seed)``: ``domain_labels`` draws the
groups (sizes ``C // G`` with the remainder on the last groups: 2, 2, 3, 3 for ten classes in
four groups, the paper's), a second ``Random(seed)`` shuffles each group's indices and then
the client order; a group of ``n`` samples over ``m`` clients gives the first ``n mod m``
clients one sample more. With ``seed=12345`` and the 70,000 MNIST images (train then test)
it is the paper's Table 1 split. The authors' script only handles 2, 3 and 4 groups; the
same draws extend to any number.
"""

from __future__ import annotations

import random

import numpy as np

from pflarena.core.datasets import DatasetError
from pflarena.core.partition.registry import PartitionSpec, check_clients, register_partition

__all__ = ["group_labels", "label_group_partition"]


def group_labels(num_classes: int, num_groups: int, seed: int) -> list[list[int]]:
    """The class groups, drawn as the authors' ``domain_labels`` draws them.

    Group sizes are ``num_classes // num_groups``, the last ``num_classes % num_groups``
    groups one larger; each group but the last is ``rng.sample`` of the classes left, the
    last takes the rest.
    """
    if not 1 <= num_groups <= num_classes:
        raise DatasetError(
            f"label-groups: {num_groups} groups of {num_classes} classes is impossible; "
            f"use 1 to {num_classes} groups"
        )
    rng = random.Random(seed)
    base, extra = divmod(num_classes, num_groups)
    sizes = [base] * (num_groups - extra) + [base + 1] * extra
    remaining = list(range(num_classes))
    groups = []
    for size in sizes[:-1]:
        chosen = rng.sample(remaining, k=size)
        remaining = list(set(remaining) - set(chosen))
        groups.append(chosen)
    groups.append(remaining)
    return groups


def label_group_partition(
    labels: np.ndarray, num_clients: int, label_groups: int, seed: int, num_classes: int | None
) -> list[np.ndarray]:
    """Split ``labels`` over clients by class groups (the PPFL paper's MNIST/CIFAR split).

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``.
    num_clients : int
        Number of clients; group g gets ``num_clients // label_groups`` of them, the first
        ``num_clients % label_groups`` groups one more.
    label_groups : int
        Number of class groups K*.
    seed : int
        Seed of both ``random.Random`` streams (the paper: 12345).
    num_classes : int, optional
        Number of classes; default ``labels.max() + 1``.

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client, in the shuffled client order.
    """
    labels = np.asarray(labels)
    check_clients(labels, num_clients)
    classes = int(num_classes if num_classes is not None else labels.max() + 1)
    if num_clients < label_groups:
        raise DatasetError(
            f"label-groups: {num_clients} clients cannot cover {label_groups} groups; "
            "use at least one client per group"
        )
    groups = group_labels(classes, label_groups, seed)
    per_group, residual = divmod(num_clients, label_groups)
    clients_of = [per_group + (1 if g < residual else 0) for g in range(label_groups)]
    rng = random.Random(seed)
    pieces: list[np.ndarray] = []
    for group, count in zip(groups, clients_of, strict=True):
        indices: list[int] = []
        for label in group:
            indices.extend(np.flatnonzero(labels == label).tolist())
        rng.shuffle(indices)
        size, extra = divmod(len(indices), count)
        if size == 0:
            raise DatasetError(
                f"label-groups: the group of classes {sorted(group)} has {len(indices)} "
                f"samples for {count} clients; use fewer clients"
            )
        start = 0
        for client in range(count):
            stop = start + size + (1 if client < extra else 0)
            pieces.append(np.asarray(indices[start:stop], dtype=np.int64))
            start = stop
    order = list(range(num_clients))
    rng.shuffle(order)
    return [pieces[i] for i in order]


register_partition(
    PartitionSpec(
        "label-groups",
        label_group_partition,
        reads=("num_clients", "label_groups", "seed", "num_classes"),
    )
)
