"""``pflarena-serverapp``: Flower's ``flwr-serverapp``, installing only apps the operator signed.

A SuperLink's ServerApp executor starts ``flwr-serverapp`` for every run it is handed; that
process fetches the run's FAB, installs it and imports the app. In a secure deployment only
the operator can submit a run (:mod:`pflarena.deploy.superlink`), and SuperNodes refuse apps
the operator did not sign (:mod:`pflarena.deploy.approval`); this command applies the same
check on the server side, so that a leaked operator token does not run code on the SuperLink's
host either.

``pflarena executor --app-signing-public-key KEY.pub`` (also with ``--stock``) starts this
command instead of ``flwr-serverapp`` for ServerApp tasks (:func:`require_approved_serverapps`)
and hands it the keys in :data:`KEYS_ENV`. It is ``flwr-serverapp`` with one change: the FAB
is verified before Flower's ``install_from_fab`` unpacks it; an app that is not approved
raises there, before anything of it is installed or imported, and Flower ends the run as
``finished:failed`` with the reason ("ServerApp failed with exception: ...").
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["COMMAND", "KEYS_ENV", "main", "require_approved_serverapps"]

#: This command's console script (pyproject.toml's [project.scripts]).
COMMAND = "pflarena-serverapp"
#: The app signing public keys (files, separated by os.pathsep) this command trusts.
KEYS_ENV = "PFLARENA_APP_SIGNING_PUBLIC_KEYS"
_RUNTIME_MODULE = "flwr.superlink.runtime.run_serverapp"


class AppNotApproved(RuntimeError):
    """The run's app is not signed with a key this ServerApp executor trusts."""


def _check_internals() -> Any:
    """``run_serverapp``'s module, after checking flwr starts ServerApps as 1.41 does."""
    import flwr
    from flwr.supercore.constant import TASK_TYPE_TO_COMMAND, TaskType

    module = importlib.import_module(_RUNTIME_MODULE)
    problems = []
    if not callable(getattr(module, "install_from_fab", None)):
        problems.append(f"{_RUNTIME_MODULE}.install_from_fab")
    if TASK_TYPE_TO_COMMAND.get(TaskType.SERVER_APP) not in ("flwr-serverapp", COMMAND):
        problems.append("flwr-serverapp as the ServerApp task's command")
    if problems:
        raise RuntimeError(
            f"flwr {flwr.__version__} lacks {', '.join(problems)} (as in flwr 1.41): ServerApps "
            "cannot be restricted to approved apps"
        )
    return module


def require_approved_serverapps(public_key_files: Sequence[str]) -> None:
    """Make this process's SuperExec start :data:`COMMAND` for ServerApp tasks, trusting
    the keys in ``public_key_files`` (checked now: a bad file fails here, not per run)."""
    from flwr.supercore.constant import TASK_TYPE_TO_COMMAND, TaskType

    from pflarena.deploy.approval import load_public_keys

    load_public_keys(public_key_files)
    _check_internals()
    os.environ[KEYS_ENV] = os.pathsep.join(os.path.abspath(p) for p in public_key_files)
    TASK_TYPE_TO_COMMAND[TaskType.SERVER_APP] = COMMAND


def main(argv: Sequence[str] | None = None) -> None:
    """``pflarena-serverapp <flwr-serverapp flags>``, with :data:`KEYS_ENV` set."""
    from logging import INFO

    from flwr.common.logger import log

    from pflarena.deploy.approval import load_public_keys, verify_fab

    files = [f for f in os.environ.get(KEYS_ENV, "").split(os.pathsep) if f]
    if not files:
        raise SystemExit(f"{COMMAND}: {KEYS_ENV} names no app signing public key")
    keys = load_public_keys(files)
    module = _check_internals()
    install_from_fab = module.install_from_fab

    def install_approved(fab_file: Any, *args: Any, **kwargs: Any) -> Any:
        ok, reason = verify_fab(fab_file, keys) if isinstance(fab_file, bytes) else (False, "")
        if not ok:
            raise AppNotApproved(f"the run's app is not approved: {reason}")
        log(INFO, "%s: app %s", COMMAND, reason)
        return install_from_fab(fab_file, *args, **kwargs)

    module.install_from_fab = install_approved
    from flwr.superlink.cli import flwr_serverapp

    sys.argv = [COMMAND, *(sys.argv[1:] if argv is None else argv)]
    flwr_serverapp()


if __name__ == "__main__":
    main()
