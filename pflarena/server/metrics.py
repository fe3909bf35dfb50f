"""What each accuracy figure pflarena shows means, defined once.

Every client reports, for its personalized model and (where the method has one) for the
global model, its correct predictions and test samples on its own test split
(:mod:`pflarena.core.evaluation`). Two figures are formed from them for each model:

- ``mean``, **mean over clients**: the unweighted mean of the per-client accuracies, every
  client counting once;
- ``weighted``, **pooled**: total correct over total test samples, the accuracy on the union
  of the clients' test splits (the sample-weighted mean).

The headline figures, the ones the console, ``accuracy.png``, the leaderboard, ``compare``
and the trackers show first, are the **personalized accuracy, mean over clients** (the
protocol's: how well an average client is served) and the **global accuracy, pooled** (how
well the one global model does on all the test data). Wherever a figure is shown its label
comes from :func:`label`, so that one name always means one number; ``summary.json`` holds
both figures of both models and names the headline ones (:func:`definitions`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["HEADLINE", "SCOPES", "STATISTICS", "definitions", "label", "short_label"]

#: The models evaluated: each client's personalized model, and the method's global model.
SCOPES = ("personalized", "global")

#: The statistics over clients, their names, and what they mean.
STATISTICS: dict[str, tuple[str, str]] = {
    "mean": (
        "mean over clients",
        "the unweighted mean of the per-client test accuracies (every client counts once)",
    ),
    "weighted": (
        "pooled",
        "total correct over total test samples: the accuracy on the union of the clients' "
        "test splits (the sample-weighted mean over clients)",
    ),
    "worst10": ("worst 10% of clients", "the mean accuracy of the worst 10% of clients"),
    "std": ("std over clients", "the population standard deviation of the client accuracies"),
}

#: The statistic shown first for each scope.
HEADLINE: dict[str, str] = {"personalized": "mean", "global": "weighted"}

_SHORT = {"mean": "mean", "weighted": "pooled", "worst10": "worst10%", "std": "std"}
_SCOPE_SHORT = {"personalized": "pers.", "global": "global"}


def label(scope: str, statistic: str | None = None) -> str:
    """The long name of a figure, e.g. ``global accuracy (pooled)``."""
    statistic = statistic or HEADLINE[scope]
    return f"{scope} accuracy ({STATISTICS[statistic][0]})"


def short_label(scope: str, statistic: str | None = None) -> str:
    """The column name of a figure, e.g. ``global pooled``, ``pers. mean``."""
    statistic = statistic or HEADLINE[scope]
    return f"{_SCOPE_SHORT[scope]} {_SHORT[statistic]}"


def definitions() -> dict[str, Any]:
    """What ``summary.json``'s accuracy blocks hold, for a reader of the file alone."""
    return {
        "personalized": "each client's personalized model on its own test split",
        "global": "the method's global model on each client's test split (null without one)",
        **{name: text for name, (_, text) in STATISTICS.items()},
        "headline": {scope: HEADLINE[scope] for scope in SCOPES},
    }
