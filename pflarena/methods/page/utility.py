"""PAGE's players' utility: the reciprocal of a loss (Definition 1), bounded by a floor.

The server's agent (``pflarena/methods/page/strategy.py``) and every client's
(``pflarena/methods/page/solver.py``) are rewarded by it; it is a module of its own
because the solver may not import the strategy (an edge node's image holds only what its
ClientApp needs). The reading of the paper: docs/papers/page.md.
"""

from __future__ import annotations

import math

__all__ = ["ZERO_LOSS", "reciprocal_reward"]

#: A loss of exactly 0 under an unbounded reciprocal reward (``floor=0``) counts as this,
#: so that 1/f stays finite.
ZERO_LOSS = 1e-12


def reciprocal_reward(loss: float, floor: float, scale: float = 1.0) -> tuple[float, bool]:
    """``(k / max(f, f_min), whether the floor bounded it)``: PAGE's u = 1/f (Definition 1),
    bounded above by k / f_min (docs/papers/page.md §9.11); ``floor=0`` is the paper's unbounded k/f.

    Parameters
    ----------
    loss
        The loss f >= 0.
    floor
        f_min; 0 leaves the reward unbounded (a zero loss then counts as 1e-12).
    scale
        The reward scale k (PAGE's biased variants, §3.7).
    """
    if not math.isfinite(loss) or loss < 0:
        raise ValueError(f"a reward needs a finite loss >= 0, got {loss}")
    if floor > 0:
        return scale / max(loss, floor), loss < floor
    return scale / max(loss, ZERO_LOSS), loss < ZERO_LOSS
