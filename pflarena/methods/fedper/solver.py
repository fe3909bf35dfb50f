"""Local solver for FedPer (Arivazhagan et al., 2019).

Per round: the received base layers (the body) with the client's own personalization layers
(the head, ``fedper/head``; the run's initial head at first) are trained jointly by local SGD;
the head is kept, the body is sent back (:class:`~pflarena.client.common.KeptPartSolver`,
LG-FedAvg's with the parts the other way round).

The reading of the paper, decisions and measurements: docs/methods/fedper.md.
"""

from __future__ import annotations

from pflarena.client.common import KeptPartSolver

__all__ = ["HEAD_KEY", "evaluate", "personalized_model", "train"]

HEAD_KEY = "fedper/head"

_SOLVER = KeptPartSolver(layers="head-layers", kept="head", key=HEAD_KEY)
train, personalized_model, evaluate = _SOLVER.train, _SOLVER.personalized_model, _SOLVER.evaluate
