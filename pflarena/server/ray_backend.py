"""Flower's ``RayBackend`` kept alive from one simulation run to the next."""

from __future__ import annotations

from collections.abc import Callable
from logging import WARNING
from typing import Any

from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
from flwr.supercore import log

__all__ = ["ReusableRayBackend"]


class ReusableRayBackend(RayBackend):
    """Flower's ``RayBackend`` whose Ray instance and actor pool serve several runs.

    ``build`` creates the pool once (a later run only brings its ClientApp loader), and
    ``terminate``, which Flower's ``run_api`` calls when a run ends, keeps the actors unless
    one was lost; :meth:`close` terminates them and shuts Ray down (Flower's ``terminate``).
    """

    def build(self, app_fn: Callable[[], Any]) -> None:
        if self.pool is None:
            super().build(app_fn)
        else:
            self.app_fn = app_fn

    def terminate(self) -> None:
        if self.pool is not None and len(self.pool.pool) < self.pool.num_actors:
            log(WARNING, "pflarena: an actor was lost; the next run gets a new pool")
            self.pool.terminate_all_actors()
            self.pool = None

    def close(self) -> None:
        """Terminate the actors and shut Ray down."""
        super().terminate()
        self.pool = None
