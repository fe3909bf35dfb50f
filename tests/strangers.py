"""What a stranger tries against a secure deployment, for the loopback and container tests.

A stranger holds the CA's certificate (public: every node has it) and reaches the SuperLink's
port, and on the same host the SuperNodes' Runtime API ports. With those they try to
register a SuperNode key, list runs and nodes, submit an app whose ServerApp and ClientApp
write marker files, and take a ServerApp task or a ClientApp message from a Runtime API
without the SuperExec secret. :func:`stranger_app` is that app; :func:`no_marker` checks
none of its code ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = [
    "REFUSED",
    "acquire_task",
    "control_api_refuses",
    "markers",
    "stranger_app",
    "stranger_cli",
    "stranger_home",
]

#: What the SuperLink answers a Control API call without the operator's token.
REFUSED = "answers only its operator"

_SERVER = """
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    Path(str(context.run_config["marker"]) + ".server").write_text("the ServerApp ran")
    FedAvg(fraction_evaluate=0.0, min_train_nodes=1, min_available_nodes=1).start(
        grid=grid, initial_arrays=ArrayRecord([np.zeros(2)]), num_rounds=1, timeout=60
    )
"""
_CLIENT = """
from pathlib import Path

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    Path(f"{context.run_config['marker']}.client-{context.node_id}").write_text("ran")
    content = RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})})
    return Message(content, reply_to=msg)
"""


def stranger_app(root: Path, marker: str) -> Path:
    """A Flower App whose ServerApp writes ``<marker>.server`` and whose ClientApp writes
    ``<marker>.client-<node id>``: written under ``root/stranger-app``."""
    app = root / "stranger-app"
    (app / "stranger").mkdir(parents=True, exist_ok=True)
    (app / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "stranger"\nversion = "1.0.0"\ndependencies = ["flwr>=1.41"]\n\n'
        '[tool.flwr.app]\npublisher = "stranger"\n\n[tool.flwr.app.components]\n'
        'serverapp = "stranger.server_app:app"\nclientapp = "stranger.client_app:app"\n\n'
        f'[tool.flwr.app.config]\nmarker = "{marker}"\n'
    )
    (app / "stranger" / "__init__.py").write_text("")
    (app / "stranger" / "server_app.py").write_text(_SERVER)
    (app / "stranger" / "client_app.py").write_text(_CLIENT)
    return app


def markers(marker: str) -> list[Path]:
    """The files the stranger's code would have written."""
    path = Path(marker)
    return sorted(path.parent.glob(path.name + ".*")) if path.parent.is_dir() else []


def stranger_home(root: Path, address: str, ca: Path) -> Path:
    """A ``flwr`` CLI home whose connection ``stranger`` names the SuperLink and its CA only."""
    home = root / "stranger-home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "stranger"\n\n[superlink.stranger]\naddress = "{address}"\n'
        f'root-certificates = "{ca}"\n'
    )
    return home


def stranger_cli(home: Path, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """``flwr ARGS`` from the stranger's home (the output joined into ``stdout``)."""
    env = os.environ | {
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }
    return subprocess.run(
        ["flwr", *args],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


_ACQUIRE = """
import sys
from flwr.proto.runtime_pb2 import AcquireTaskRequest
from flwr.supercore.constant import TaskType
from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.tls import validate_and_resolve_root_certificates

address, ca = sys.argv[1], (sys.argv[2] or None)
client = RuntimeHttpClient.from_server_address(
    server_address=address,
    insecure=ca is None,
    root_certificates=validate_and_resolve_root_certificates(ca, ca is None),
    interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
)
try:
    response = client.AcquireTask(
        AcquireTaskRequest(supported_task_types=[TaskType.SERVER_APP, TaskType.CLIENT_APP])
    )
except Exception as exc:  # the refusal: an HTTP error
    status = getattr(getattr(exc, "response", None), "status_code", None)
    print(f"refused {status} {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
else:
    print("task" if response.HasField("task") and response.token else "no task")
"""


def acquire_task(address: str, ca: Path | None = None, python: list[str] | None = None) -> str:
    """Ask the Runtime API at ``address`` for a task as Flower's SuperExec does, without its
    secret: ``refused <status> ...``, ``task`` or ``no task``. ``python`` runs the probe
    elsewhere (``docker run ... python``); by default with this interpreter."""
    cmd = [*(python or [sys.executable]), "-c", _ACQUIRE, address, str(ca) if ca else ""]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return (result.stdout.strip().splitlines() or [result.stderr.strip()[-300:]])[-1]


def control_api_refuses(home: Path, node_key: Path, app: Path) -> None:
    """From the stranger's ``home``: register ``node_key``, list runs and nodes, submit
    ``app``; every call must fail with the SuperLink's refusal."""
    attempts = {
        "register a node": stranger_cli(home, "supernode", "register", str(node_key), "stranger"),
        "list runs": stranger_cli(home, "list", "stranger"),
        "list nodes": stranger_cli(home, "supernode", "list", "stranger"),
        "submit a run": stranger_cli(home, "run", str(app), "stranger", "--format", "json"),
    }
    for what, result in attempts.items():
        said = " ".join((result.stdout + result.stderr).split())
        print(f"stranger tries to {what}: exit {result.returncode}: {said[-160:]}")
        # `flwr run --format json` exits 0 and says `"success": false`.
        failed = result.returncode != 0 or '"success": false' in said
        assert failed and REFUSED in said, (what, said)
