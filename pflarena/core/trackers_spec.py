"""The names of the experiment trackers a run can log to (``tracker`` run-config key).

The trackers themselves live on the server side (:mod:`pflarena.server.trackers`); this
module only names them, so that the run config can be checked without importing them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "TRACKERS",
    "absolute_sqlite_uri",
    "check_trackers",
    "sqlite_store_path",
    "tracker_names",
]

#: Tracker name -> the optional dependency (pyproject extra) it needs.
TRACKERS: dict[str, str] = {"mlflow": "mlflow", "tensorboard": "tensorboard", "wandb": "wandb"}


def sqlite_store_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI, absolute (a relative one is taken
    from the current directory); None for any other URI."""
    if not uri.startswith("sqlite:///"):
        return None
    try:
        return Path(uri.removeprefix("sqlite:///")).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):  # ~nobody, a NUL byte: left to MLflow to refuse
        return None


def absolute_sqlite_uri(uri: str) -> str:
    """``uri`` with a relative ``sqlite:///`` path made absolute; other URIs unchanged."""
    path = sqlite_store_path(uri)
    return uri if path is None else f"sqlite:///{path}"


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
