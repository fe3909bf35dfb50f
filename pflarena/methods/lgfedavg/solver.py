"""Local solver for LG-FedAvg (Liang et al., 2020).

Per round: the client's local layers (the body, ``lgfedavg/local-layers``; the run's initial
body at first) under the received global layers (the head) are trained jointly by local
SGD; the local layers are kept, the global layers sent back
(:class:`~pflarena.client.common.KeptPartSolver`, FedPer's with the parts the other way
round).

The reading of the paper, decisions and measurements: docs/methods/lgfedavg.md.
"""

from __future__ import annotations

from pflarena.client.common import KeptPartSolver

__all__ = ["LOCAL_KEY", "evaluate", "personalized_model", "train"]

LOCAL_KEY = "lgfedavg/local-layers"

_SOLVER = KeptPartSolver(layers="global-layers", kept="body", key=LOCAL_KEY)
train, personalized_model, evaluate = _SOLVER.train, _SOLVER.personalized_model, _SOLVER.evaluate
