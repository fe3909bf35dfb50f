"""``did you mean ...?``: the closest known names to a misspelt one (:mod:`difflib`)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(name: str, known: Iterable[str], *, limit: int = 3) -> str:
    """``" (did you mean 'fedavg'?)"`` for the names of ``known`` closest to ``name``, or
    ``""`` when none is close; meant to follow an error message's first clause."""
    choices = [str(k) for k in known]
    close = difflib.get_close_matches(str(name), choices, n=limit, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in choices}
        close = [lowered[c] for c in difflib.get_close_matches(str(name).lower(), lowered, n=limit)]
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)"
