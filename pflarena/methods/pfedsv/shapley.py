"""Shapley values of a cooperative game: exact enumeration or permutation sampling.

A game is a set of players and a utility ``v`` on coalitions (frozensets of players). The
Shapley value of player i is its marginal contribution ``v(C ∪ {i}) − v(C)`` averaged over
the orderings of the players, C being i's predecessors (pFedSV, Eq. 2), or equivalently the
weighted sum over coalitions ``S ⊆ N \\ {i}`` with weights ``|S|!(n−|S|−1)!/n!`` (Eq. 3).

:func:`shapley_values` evaluates each coalition at most once (the utilities are memoized in
``cache``, which the caller may pass in to count or reuse them), which matters when a
utility is an accuracy over a validation set. Permutation sampling telescopes: each sampled
ordering's marginals sum to ``v(N) − v(∅)``, so the estimate is efficient for every sample,
not only in expectation. Sampling switches to exact enumeration when that needs no more
distinct evaluations (``2^n`` coalitions against at most ``R·n`` for R orderings), and
draws distinct orderings when there are few of them.

Hand-written because the Shapley libraries (e.g. ``shap``) explain model features, not
arbitrary coalition games with a memoized, expensive utility.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Iterable, MutableMapping, Sequence
from typing import TypeVar

import numpy as np

__all__ = ["exact_evaluations", "sampled_evaluations", "shapley_values"]

P = TypeVar("P", bound=Hashable)

#: Draw orderings without replacement when there are at most this many of them.
DISTINCT_ORDERINGS_UP_TO = 10_000


def exact_evaluations(num_players: int) -> int:
    """Distinct utility evaluations of exact enumeration: every coalition, ``2^n``."""
    return 2**num_players


def sampled_evaluations(num_players: int, num_permutations: int) -> int:
    """An upper bound on the distinct evaluations of ``num_permutations`` orderings.

    Each ordering visits ``n`` non-empty prefixes, the last being the grand coalition, and
    the empty coalition is evaluated once: at most ``R·(n−1) + 2`` coalitions.
    """
    if num_players == 0:
        return 1
    return min(exact_evaluations(num_players), num_permutations * (num_players - 1) + 2)


def shapley_values(
    utility: Callable[[frozenset], float],
    players: Iterable[P],
    num_permutations: int | None = None,
    rng: np.random.Generator | int | None = None,
    *,
    cache: MutableMapping[frozenset, float] | None = None,
) -> dict[P, float]:
    """The Shapley value of each player, exact or estimated by permutation sampling.

    Parameters
    ----------
    utility
        ``v(coalition)`` for a frozenset of players; ``v(frozenset())`` is asked for too
        (pFedSV's utility returns 0 there).
    players
        The distinct players (hashable).
    num_permutations
        ``None``: exact, by enumeration of the ``2^n`` coalitions (Eq. 3). Otherwise the
        number R of orderings to sample (Eq. 2, Monte Carlo); when the exact value needs no
        more distinct evaluations than R orderings may, or R is at least ``n!``, the exact
        value is returned instead.
    rng
        The generator (or seed) of the sampled orderings.
    cache
        Utilities already known, by coalition; filled with every coalition evaluated.
        ``len(cache)`` afterwards is the number of distinct evaluations.

    Returns
    -------
    dict
        Player → Shapley value. The values sum to ``v(N) − v(∅)`` (up to rounding) for
        exact values and for every sample.

    Raises
    ------
    ValueError
        Repeated players, a non-positive ``num_permutations``, or a utility that is not a
        finite number.
    """
    order: list[P] = list(players)
    if len(set(order)) != len(order):
        raise ValueError(f"players must be distinct, got {order}")
    if num_permutations is not None and num_permutations < 1:
        raise ValueError(f"num_permutations must be a positive integer, got {num_permutations}")
    memo: MutableMapping[frozenset, float] = {} if cache is None else cache

    def value(coalition: frozenset) -> float:
        if coalition not in memo:
            result = float(utility(coalition))
            if not math.isfinite(result):
                raise ValueError(f"utility of {set(coalition)} is {result}, not a finite number")
            memo[coalition] = result
        return memo[coalition]

    n = len(order)
    if n == 0:
        return {}
    exact = (
        num_permutations is None
        or exact_evaluations(n) <= sampled_evaluations(n, num_permutations)
        or num_permutations >= math.factorial(n)
    )
    if exact:
        return _exact(value, order)
    generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    return _sampled(value, order, _orderings(n, num_permutations, generator))


def _exact(value: Callable[[frozenset], float], order: Sequence[P]) -> dict[P, float]:
    """Eq. 3: each coalition's utility enters every member's and non-member's value once."""
    n = len(order)
    # weight[s] = s!(n−s−1)!/n! for a coalition of size s not containing the player
    weight = [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)]
    values = dict.fromkeys(order, 0.0)
    for size in range(n + 1):
        for members in itertools.combinations(order, size):
            coalition = frozenset(members)
            v = value(coalition)
            for player in order:
                if player in coalition:  # v(S) as v(S' ∪ {i}) with |S'| = size − 1
                    values[player] += weight[size - 1] * v
                else:  # v(S) as v(S) with i ∉ S
                    values[player] -= weight[size] * v
    return values


def _orderings(n: int, count: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """``count`` orderings of ``range(n)``: distinct while there are few, else i.i.d."""
    if math.factorial(n) <= DISTINCT_ORDERINGS_UP_TO:
        everything = list(itertools.permutations(range(n)))
        chosen = rng.choice(len(everything), size=min(count, len(everything)), replace=False)
        return [everything[i] for i in chosen]
    return [tuple(int(i) for i in rng.permutation(n)) for _ in range(count)]


def _sampled(
    value: Callable[[frozenset], float],
    order: Sequence[P],
    orderings: Sequence[tuple[int, ...]],
) -> dict[P, float]:
    """Eq. 2 by Monte Carlo: one scan per ordering, each prefix's utility once."""
    totals = dict.fromkeys(order, 0.0)
    empty = value(frozenset())
    for ordering in orderings:
        prefix: frozenset = frozenset()
        previous = empty
        for index in ordering:
            player = order[index]
            prefix = prefix | {player}
            current = value(prefix)
            totals[player] += current - previous
            previous = current
    return {player: total / len(orderings) for player, total in totals.items()}
