"""The evaluation protocol: one set of statistics for every strategy.

Each client reports, for the model(s) it was asked to evaluate, the number of correct
predictions, the number of test samples and the summed loss. The statistics below turn
those per-client counts into the figures every results table uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["AccuracyStats", "accuracy_stats", "worst_fraction_mean"]


@dataclass(frozen=True)
class AccuracyStats:
    """Accuracy over clients.

    Attributes
    ----------
    mean
        Unweighted mean of the per-client accuracies (every client counts once).
    weighted
        Pooled accuracy: total correct over total test samples, i.e. the accuracy on the
        union of the clients' test splits (the sample-weighted mean).
    std
        Population standard deviation of the per-client accuracies.
    worst10
        Mean accuracy of the worst 10% of clients (at least one client).
    loss
        Pooled mean test loss.
    num_clients
        Clients that reported.
    """

    mean: float
    weighted: float
    std: float
    worst10: float
    loss: float
    num_clients: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def worst_fraction_mean(values: Sequence[float], fraction: float = 0.1) -> float:
    """Mean of the lowest ``ceil(fraction * n)`` values (at least one)."""
    if not len(values):
        return float("nan")
    k = max(1, int(np.ceil(fraction * len(values))))
    return float(np.mean(np.sort(np.asarray(values, dtype=float))[:k]))


def accuracy_stats(
    correct: Sequence[int], count: Sequence[int], loss_sum: Sequence[float]
) -> AccuracyStats:
    """Summarise per-client evaluation counts (clients with no test data are skipped)."""
    correct_a = np.asarray(correct, dtype=float)
    count_a = np.asarray(count, dtype=float)
    loss_a = np.asarray(loss_sum, dtype=float)
    if not (correct_a.shape == count_a.shape == loss_a.shape):
        raise ValueError("correct, count and loss_sum must have one entry per client")
    keep = count_a > 0
    if not keep.any():
        nan = float("nan")
        return AccuracyStats(nan, nan, nan, nan, nan, 0)
    correct_a, count_a, loss_a = correct_a[keep], count_a[keep], loss_a[keep]
    per_client = correct_a / count_a
    return AccuracyStats(
        mean=float(per_client.mean()),
        weighted=float(correct_a.sum() / count_a.sum()),
        std=float(per_client.std()),
        worst10=worst_fraction_mean(per_client),
        loss=float(loss_a.sum() / count_a.sum()),
        num_clients=int(keep.sum()),
    )
