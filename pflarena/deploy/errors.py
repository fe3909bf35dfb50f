"""The error every deployment module raises when something cannot be started, reached or
stopped; its message says why."""

from __future__ import annotations

__all__ = ["DeploymentError"]


class DeploymentError(RuntimeError):
    """A deployment could not be started, reached or stopped; the message says why."""
