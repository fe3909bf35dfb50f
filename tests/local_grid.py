"""The in-process Grid of fast tests: no SuperLink, no Ray, the real ClientApp.

:class:`pflarena.runtime.inprocess.InProcessGrid` keeping every message it sends (``sent``),
so tests can assert what went down; ``offline`` and ``reply_filter`` simulate dead nodes
and tampered replies.
"""

from __future__ import annotations

from typing import Any

from pflarena.runtime.inprocess import InProcessGrid


class LocalGrid(InProcessGrid):
    def __init__(self, *args: Any, keep_sent: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, keep_sent=keep_sent, **kwargs)
