"""``pflarena supernode``: Flower's SuperNode with settable waits for the SuperLink.

flwr 1.41's SuperNode loop (``flwr/supernode/start_client_internal.py``) waits for the
SuperLink in two places no flag or environment variable sets:

* it sleeps a hard-coded 3 s whenever it asks for a message and finds none, so a message
  waits 1.5 s on average (3 s at worst) before its node sees it;
* when a message's objects are not yet on the SuperLink (the ServerApp pushes them after the
  message), it tries again after Flower's pull back-off: 1 s, doubling up to 10 s.

``pflarena supernode --idle-poll S <flower-supernode flags>`` runs ``flower-supernode``
unchanged except for those two waits: the sleep becomes ``S`` seconds and the back-off starts
at and is capped at ``S``. Without ``--idle-poll`` it is ``flower-supernode`` itself.

The cost is one pull request to the SuperLink every ``S`` seconds per idle SuperNode
(``benchmarks/results/deployment.md`` measures both sides). This leans on a Flower internal:
:func:`check_idle_sleep` fails, naming the file, when the installed flwr no longer has exactly
one ``time.sleep(3)`` and its ``pull_objects`` in that loop, so an upgrade cannot silently keep
or drop the change.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["FLOWER_IDLE_SLEEP_S", "IdleClock", "check_idle_sleep", "main", "patch_idle_sleep"]

#: The SuperNode's wait after an empty pull in flwr 1.41 (seconds).
FLOWER_IDLE_SLEEP_S = 3
_LOOP_MODULE = "flwr.supernode.start_client_internal"
_IDLE_LINE = f"time.sleep({FLOWER_IDLE_SLEEP_S})"


class IdleClock:
    """Stands in for the ``time`` module inside Flower's SuperNode loop: every call passes
    through, except ``sleep(3)``, which sleeps ``idle_s`` instead."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s

    def sleep(self, seconds: float) -> None:
        time.sleep(self.idle_s if seconds == FLOWER_IDLE_SLEEP_S else seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def check_idle_sleep() -> ModuleType:
    """The SuperNode loop's module, after checking it sleeps ``time.sleep(3)`` exactly once.

    Raises
    ------
    RuntimeError
        The installed flwr's loop differs (an upgrade): the patch would do nothing or too much.
    """
    module = importlib.import_module(_LOOP_MODULE)
    count = inspect.getsource(module).count(_IDLE_LINE)
    if count != 1 or not hasattr(module, "time") or not hasattr(module, "pull_objects"):
        import flwr

        raise RuntimeError(
            f"flwr {flwr.__version__}: {module.__file__} has {count} `{_IDLE_LINE}` (expected 1, "
            "as in flwr 1.41); pflarena supernode --idle-poll cannot set the SuperNode's wait. "
            "Run it without --idle-poll."
        )
    return module


def patch_idle_sleep(idle_s: float) -> None:
    """Make the SuperNode loop of this process wait ``idle_s`` s after an empty pull and
    between its tries for a message's objects."""
    import functools

    if not 0.01 <= idle_s <= 60:
        raise ValueError(f"--idle-poll {idle_s}: choose 0.01 to 60 seconds")
    module = check_idle_sleep()
    module.time = IdleClock(idle_s)
    module.pull_objects = functools.partial(
        module.pull_objects, initial_backoff=idle_s, backoff_cap=idle_s
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``pflarena supernode [--idle-poll S] <flower-supernode flags>``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--idle-poll", type=float, default=None)
    own, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if own.idle_poll is not None:
        patch_idle_sleep(own.idle_poll)
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["pflarena supernode", *rest]
    flower_supernode()


if __name__ == "__main__":
    main()
