"""Following one deployed exchange across processes: ``PFLARENA_TRACE=1``.

With :data:`TRACE_ENV` set to ``1``, pflarena's processes in a deployment (the ServerApp,
``pflarena supernode``, ``pflarena executor`` and its children) write the wall time, to the
millisecond, in every log line, and the ServerApp logs when it pushed each
message and saw each reply; ``benchmarks/deployment.py`` builds its per-phase table of an
exchange from those lines. Off by default: the log lines are Flower's own.
"""

from __future__ import annotations

import os

__all__ = ["TRACE_ENV", "enable_trace", "tracing"]

#: Environment: ``1`` makes pflarena's deployment processes timestamp and trace their waits.
TRACE_ENV = "PFLARENA_TRACE"


def tracing() -> bool:
    """Whether :data:`TRACE_ENV` asks for timestamps and poll counts."""
    return os.environ.get(TRACE_ENV, "") == "1"


def enable_trace() -> None:
    """Turn on the timestamps of Flower's console log lines (``%(asctime)s``, local time to the
    millisecond: Flower's own option, which it uses for ``FLWR_LOG_LEVEL=DEBUG``), when
    :func:`tracing`."""
    if tracing():
        from flwr.supercore.logger import update_console_handler

        update_console_handler(timestamps=True)
