"""Local solvers, one module per method, and the registry the ClientApp dispatches on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flwr.app import ArrayRecord

from pflarena.client.job import ClientJob
from pflarena.client.solvers import ditto, fedavg, local, pfedgt

__all__ = ["Solver", "SOLVERS"]


@dataclass(frozen=True)
class Solver:
    """A method's client side: what it does with a train and an evaluate message."""

    train: Callable[[ClientJob], tuple[dict[str, ArrayRecord], dict]]
    """Returns the reply's ArrayRecords by record key, and its metrics."""
    evaluate: Callable[[ClientJob], dict]


SOLVERS: dict[str, Solver] = {
    "local": Solver(local.train, local.evaluate),
    "fedavg": Solver(fedavg.train, fedavg.evaluate),
    "fedprox": Solver(fedavg.train, fedavg.evaluate),
    "fedavg-ft": Solver(fedavg.train, fedavg.evaluate_finetuned),
    "ditto": Solver(ditto.train, ditto.evaluate),
    "pfedgt": Solver(pfedgt.train, pfedgt.evaluate),
}
