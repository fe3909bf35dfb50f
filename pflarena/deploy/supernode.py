"""``pflarena supernode``: Flower's SuperNode with settable waits, running approved apps only.

flwr 1.41's SuperNode loop (``flwr/supernode/start_client_internal.py``) waits for the
SuperLink in two places no flag or environment variable sets:

* it sleeps a hard-coded 3 s whenever it asks for a message and finds none, so a message
  waits 1.5 s on average (3 s at worst) before its node sees it;
* when a message's objects are not yet on the SuperLink (the ServerApp pushes them after the
  message), it tries again after Flower's pull back-off: 1 s, doubling up to 10 s.

``pflarena supernode --idle-poll S <flower-supernode flags>`` runs ``flower-supernode``
unchanged except for those two waits: the sleep becomes ``S`` seconds and the back-off starts
at and is capped at ``S``. Without ``--idle-poll`` it is ``flower-supernode`` itself.

``--app-signing-public-key KEY.pub`` (repeatable) makes the node run only apps the operator
signed (:mod:`pflarena.deploy.approval`): the FAB of every new run is checked before the node
stores the run or creates a task for it, and an app that is not approved gets Flower's
``INVALID_FAB`` error reply (what ``--trusted-entities`` replies for a Hub app that fails its
check) and is never installed or imported; the node goes on serving approved runs. This
takes over Flower's FAB check (``_verify_fab`` in ``start_client_internal``), so it cannot
be combined with ``--trusted-entities``; :func:`check_fab_verification` fails, naming what
moved, if the installed flwr checks FABs differently.

The cost of ``--idle-poll`` is one pull request to the SuperLink every ``S`` seconds per idle SuperNode
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

__all__ = [
    "FLOWER_IDLE_SLEEP_S",
    "IdleClock",
    "check_fab_verification",
    "check_idle_sleep",
    "main",
    "patch_idle_sleep",
    "require_approved_apps",
]

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


#: The key Flower's FAB check looks up in its trusted entities; ours stands for the operator.
_APPROVAL_ENTITY = "pflarena-operator"


def check_fab_verification() -> ModuleType:
    """The SuperNode loop's module, after checking it verifies FABs as flwr 1.41 does.

    Raises
    ------
    RuntimeError
        ``_pull_and_store_message`` (with ``get_fab`` and ``trusted_entities`` arguments),
        ``_verify_fab`` or the ``valid_license`` check is gone: approvals could not be enforced.
    """
    module = importlib.import_module(_LOOP_MODULE)
    problems = []
    pull = getattr(module, "_pull_and_store_message", None)
    if pull is None:
        problems.append("_pull_and_store_message")
    else:
        params = inspect.signature(pull).parameters
        problems += [f"_pull_and_store_message({p}=...)" for p in ("get_fab", "trusted_entities")
                     if p not in params]  # fmt: skip
        source = inspect.getsource(pull)
        if "valid_license" not in source or "_verify_fab(" not in source:
            problems.append("_pull_and_store_message's FAB verification")
    if not callable(getattr(module, "_verify_fab", None)):
        problems.append("_verify_fab")
    if problems:
        import flwr

        raise RuntimeError(
            f"flwr {flwr.__version__}: {module.__file__} lacks {', '.join(problems)} (as in flwr "
            "1.41); pflarena supernode --app-signing-public-key cannot enforce approvals"
        )
    return module


def require_approved_apps(public_key_files: Sequence[str]) -> None:
    """Make this process's SuperNode run only apps approved with one of the keys in
    ``public_key_files`` (:func:`pflarena.deploy.approval.verify_fab`)."""
    from logging import ERROR, INFO

    from flwr.common.logger import log

    from pflarena.deploy.approval import load_public_keys, verify_fab

    keys = load_public_keys(public_key_files)
    module = check_fab_verification()
    pull_and_store = module._pull_and_store_message

    def verify(fab: Any, trusted_entities: Any) -> bool:
        ok, reason = verify_fab(fab.content, keys)
        log(INFO if ok else ERROR, "pflarena supernode: app %s %s", fab.hash_str[:12],
            reason if ok else f"refused: {reason}")  # fmt: skip
        return ok

    def checked_pull_and_store(*args: Any, **kwargs: Any) -> Any:
        get_fab = kwargs["get_fab"]

        def get_fab_for_check(fab_hash: str, run_id: int) -> Any:
            fab = get_fab(fab_hash, run_id)
            # Flower checks a FAB's signatures only once it is marked as checkable.
            fab.verifications = {"valid_license": _APPROVAL_ENTITY}
            return fab

        kwargs["get_fab"] = get_fab_for_check
        kwargs["trusted_entities"] = {_APPROVAL_ENTITY: ""}
        return pull_and_store(*args, **kwargs)

    module._verify_fab = verify
    module._pull_and_store_message = checked_pull_and_store
    log(INFO, "pflarena supernode: running apps approved with key(s) %s only", ", ".join(keys))


def main(argv: Sequence[str] | None = None) -> None:
    """``pflarena supernode [--idle-poll S] [--app-signing-public-key KEY.pub ...]
    <flower-supernode flags>``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--idle-poll", type=float, default=None)
    parser.add_argument("--app-signing-public-key", action="append", default=[])
    own, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if own.idle_poll is not None:
        patch_idle_sleep(own.idle_poll)
    if own.app_signing_public_key:
        if any(a == "--trusted-entities" or a.startswith("--trusted-entities=") for a in rest):
            raise SystemExit(
                "pflarena supernode: --app-signing-public-key replaces Flower's --trusted-entities "
                "check; give one of them"
            )
        try:
            require_approved_apps(own.app_signing_public_key)
        except (RuntimeError, OSError) as exc:
            raise SystemExit(f"pflarena supernode: {exc}") from None
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["pflarena supernode", *rest]
    flower_supernode()


if __name__ == "__main__":
    main()
