"""Words the console prints around numbers."""

from __future__ import annotations

__all__ = ["count"]


def count(number: int, noun: str, plural: str | None = None) -> str:
    """``number`` and ``noun``, plural unless the number is one: ``1 round``, ``4 rounds``
    (``plural`` where adding an s is wrong: ``count(2, "class", "classes")``)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"
