"""``pflarena supernode``: Flower's SuperNode with waits that follow the work, running
approved apps only.

flwr 1.41's SuperNode loop (``flwr/supernode/start_client_internal.py``) waits in three places
no flag or environment variable sets:

* it sleeps a hard-coded 3 s whenever it asks the SuperLink for a message and finds none, so
  a message waits 1.5 s on average (3 s at worst) before its node sees it;
* when a message's objects are not yet on the SuperLink (the ServerApp pushes them after the
  message), it tries again after Flower's pull back-off: 1 s, doubling up to 10 s;
* while its ClientApp works, it checks for the reply every 0.5 s (and, sending it, for each
  of the reply's objects), so a reply waits 0.25 s on average before it leaves.

``pflarena supernode --active-poll A [--idle-poll I] [--active-window W] <flower-supernode
flags>`` runs ``flower-supernode`` with those waits following the work
(:class:`~pflarena.deploy.waits.ActivityPoll`): for ``W`` seconds after each message (default
30) it asks for the next one every ``A`` seconds, then doubles its wait per empty poll up to
``I`` (default Flower's 3 s), so an idle node costs what it costs today; a message's objects
are fetched after 0.02 s, doubling to 0.1 s (for as long as Flower's time bound, 2 h, allows;
not its 500 tries, which at these waits would end after 50 s); a reply is checked for every
0.02 s. ``--idle-poll
S`` alone makes the first two waits a fixed ``S`` seconds (the back-off starts at and is
capped at ``S``). Without these flags it is ``flower-supernode`` itself, kept alive: a 500
from the SuperLink is retried, and a node that can no longer serve (its loop or its heartbeat
ended) exits with status 1 instead of running on unseen, for its supervisor to start it again
(:mod:`pflarena.deploy.liveness`).

``--app-signing-public-key KEY.pub`` (repeatable) makes the node run only apps the operator
signed (:mod:`pflarena.deploy.approval`): the FAB of every new run is checked before the node
stores the run or creates a task for it, and an app that is not approved gets Flower's
``INVALID_FAB`` error reply (what ``--trusted-entities`` replies for a Hub app that fails its
check) and is never installed or imported; the node goes on serving approved runs. This
takes over Flower's FAB check (``_verify_fab`` in ``start_client_internal``), so it cannot
be combined with ``--trusted-entities``; :func:`check_fab_verification` fails, naming what
moved, if the installed flwr checks FABs differently.

Its Runtime API always serves within the request limits ``pflarena superlink`` has
(:mod:`pflarena.deploy.limits`, the same flags), and ``--listen-fd N`` serves it on a
listening socket the launcher bound (:mod:`pflarena.deploy.serving`).

The waits lean on Flower internals: :func:`check_loop_waits` fails, naming the file, when the
installed flwr's loop no longer has exactly one ``time.sleep(3)``, two ``time.sleep(0.5)`` and
its ``pull_objects``, so an upgrade cannot silently keep or drop the change
(``benchmarks/results/deployment.md`` measures what the waits cost and save).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from pflarena.deploy.liveness import LOOP_ENDED, keep_node_alive, stopped_reason
from pflarena.deploy.waits import ActivityPoll, PollClock, enable_trace, tracing

__all__ = [
    "FLOWER_IDLE_SLEEP_S",
    "check_fab_verification",
    "check_loop_waits",
    "main",
    "patch_waits",
    "require_approved_apps",
]

#: The SuperNode's wait after an empty pull in flwr 1.41 (seconds).
FLOWER_IDLE_SLEEP_S = 3
#: Its wait between checks for a reply (and for a reply's object) in flwr 1.41 (seconds).
FLOWER_REPLY_SLEEP_S = 0.5
#: While active: the first and longest wait between tries for a message's objects, and the
#: wait between checks for a reply (seconds).
FETCH_INITIAL_S = 0.02
FETCH_CAP_S = 0.1
REPLY_CHECK_S = 0.02
_LOOP_MODULE = "flwr.supernode.start_client_internal"
_IDLE_LINE = f"time.sleep({FLOWER_IDLE_SLEEP_S})"
_REPLY_LINE = f"time.sleep({FLOWER_REPLY_SLEEP_S})"


def check_loop_waits() -> ModuleType:
    """The SuperNode loop's module, after checking its waits are flwr 1.41's: exactly one
    ``time.sleep(3)``, two ``time.sleep(0.5)``, ``pull_objects`` and
    ``_pull_and_store_message``.

    Raises
    ------
    RuntimeError
        The installed flwr's loop differs (an upgrade): the patch would do nothing or too much.
    """
    module = importlib.import_module(_LOOP_MODULE)
    source = inspect.getsource(module)
    idle, reply = source.count(_IDLE_LINE), source.count(_REPLY_LINE)
    names = ("time", "pull_objects", "_pull_and_store_message")
    if idle != 1 or reply != 2 or not all(hasattr(module, n) for n in names):
        import flwr

        raise RuntimeError(
            f"flwr {flwr.__version__}: {module.__file__} has {idle} `{_IDLE_LINE}` and {reply} "
            f"`{_REPLY_LINE}` (expected 1 and 2, as in flwr 1.41); pflarena supernode cannot set "
            "the SuperNode's waits. Run it without --active-poll/--idle-poll."
        )
    return module


def patch_waits(
    idle_s: float = FLOWER_IDLE_SLEEP_S,
    active_s: float | None = None,
    window_s: float = 30.0,
) -> ActivityPoll:
    """Set the waits of this process's SuperNode loop (the module docstring): adaptive with
    ``active_s``; a fixed ``idle_s`` without. Returns the poll the loop asks."""
    if not 0.01 <= idle_s <= 60:
        raise ValueError(f"--idle-poll {idle_s:g}: choose 0.01 to 60 seconds")
    module = check_loop_waits()
    if active_s is None:
        poll = ActivityPoll(idle_s, idle_s, 0.0, "supernode")
        module.time = PollClock(poll, FLOWER_IDLE_SLEEP_S)
        fetch = {"initial_backoff": idle_s, "backoff_cap": idle_s}
    else:
        if not 0.01 <= active_s <= idle_s:
            raise ValueError(f"--active-poll {active_s:g}: choose 0.01 to --idle-poll {idle_s:g}")
        poll = ActivityPoll(active_s, idle_s, window_s, "supernode")
        module.time = PollClock(poll, FLOWER_IDLE_SLEEP_S, FLOWER_REPLY_SLEEP_S, REPLY_CHECK_S)
        fetch = {"initial_backoff": FETCH_INITIAL_S, "backoff_cap": FETCH_CAP_S}
    # Bounded by Flower's time limit (PULL_MAX_TIME), not its 500 tries: at these waits they
    # would last 50 s, where Flower's last over an hour (a large model over a slow link).
    fetch["max_tries_per_object"] = None
    module.pull_objects = functools.partial(module.pull_objects, **fetch)
    pull_and_store = module._pull_and_store_message

    @functools.wraps(pull_and_store)
    def pull_and_store_noting_work(*args: Any, **kwargs: Any) -> Any:
        run_id = pull_and_store(*args, **kwargs)
        if run_id is not None:  # a message came: the next may follow soon
            poll.touch()
        return run_id

    module._pull_and_store_message = pull_and_store_noting_work
    return poll


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
    pull = inspect.unwrap(pull) if pull is not None else None  # Flower's, under our wrappers
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

    @functools.wraps(pull_and_store)
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
    """``pflarena supernode [--active-poll A] [--idle-poll I] [--active-window W]
    [--app-signing-public-key KEY.pub ...] [--max-request-mb MB] [--max-unauthenticated-kb KB]
    [--request-timeout S] [--header-timeout S] [--listen-fd N] <flower-supernode flags>``.

    The Runtime API's server always keeps the request limits (:mod:`pflarena.deploy.limits`;
    the flags and defaults are ``pflarena superlink``'s); ``--listen-fd N`` serves it on the
    listening TCP socket inherited as descriptor ``N`` instead of binding
    ``--host``/``--port`` (:mod:`pflarena.deploy.serving`)."""
    from pflarena.deploy.private import private_umask
    from pflarena.deploy.serving import add_flags, install_supernode, serving_from_flags

    private_umask()  # its state, database and logs: the operator's alone (containers too)

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--idle-poll", type=float, default=None)
    parser.add_argument("--active-poll", type=float, default=None)
    parser.add_argument("--active-window", type=float, default=30.0)
    parser.add_argument("--app-signing-public-key", action="append", default=[])
    add_flags(parser)
    own, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    try:
        serving, rest = serving_from_flags(own, rest)
    except ValueError as exc:
        raise SystemExit(f"pflarena supernode: {exc}") from None
    enable_trace()
    try:
        keep_node_alive()
        if own.idle_poll is not None or own.active_poll is not None:
            idle = FLOWER_IDLE_SLEEP_S if own.idle_poll is None else own.idle_poll
            patch_waits(idle, own.active_poll, own.active_window)
        elif tracing():  # Flower's waits, counted for the trace
            check_loop_waits().time = PollClock(
                ActivityPoll(FLOWER_IDLE_SLEEP_S, FLOWER_IDLE_SLEEP_S, 0.0, "supernode"),
                FLOWER_IDLE_SLEEP_S,
            )
    except (RuntimeError, ValueError) as exc:
        raise SystemExit(f"pflarena supernode: {exc}") from None
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
    try:
        install_supernode(serving)
    except RuntimeError as exc:
        raise SystemExit(f"pflarena supernode: {exc}") from None
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["pflarena supernode", *rest]
    try:
        flower_supernode()
    except SystemExit:
        # Flower's graceful shutdown exits with 0; a node stopped for its heartbeat failed.
        if (reason := stopped_reason()) is not None:
            raise SystemExit(f"pflarena supernode: the heartbeat failed: {reason}") from None
        raise
    # Flower's loop returns only on an error, which its connection logs and swallows; with
    # --isolation process the Runtime API's server thread would keep this process alive,
    # serving nothing and unseen by the SuperLink. Exit now, whatever threads remain.
    print(f"pflarena supernode: {LOOP_ENDED}; exiting", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


if __name__ == "__main__":
    main()
