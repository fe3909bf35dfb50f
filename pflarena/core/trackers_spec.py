"""The names of the experiment trackers a run can log to (``tracker`` run-config key).

The trackers themselves live on the server side (:mod:`pflarena.server.trackers`); this
module only names them, so that the run config can be checked without importing them.
"""

from __future__ import annotations

__all__ = ["TRACKERS", "check_trackers", "tracker_names"]

#: Tracker name -> the optional dependency (pyproject extra) it needs.
TRACKERS: dict[str, str] = {"mlflow": "mlflow", "tensorboard": "tensorboard"}


def tracker_names(value: str) -> list[str]:
    """``"mlflow, tensorboard"`` -> ``["mlflow", "tensorboard"]`` (empty entries dropped)."""
    return [name.strip() for name in value.split(",") if name.strip()]


def check_trackers(value: str) -> str:
    """``value`` normalised (``mlflow,tensorboard``); ValueError naming an unknown tracker."""
    names = tracker_names(value)
    unknown = [name for name in names if name not in TRACKERS]
    if unknown:
        raise ValueError(
            f"unknown tracker {', '.join(map(repr, unknown))}; allowed: {', '.join(TRACKERS)}"
        )
    return ",".join(dict.fromkeys(names))
