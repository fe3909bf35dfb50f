"""A Flower deployment as processes on one host: ``pflarena local-deploy`` and ``pflarena certs``.

:class:`LocalDeployment` starts the topology a multi-host deployment runs (one SuperLink and
``N`` SuperNodes, each SuperNode holding one shard file named in its ``--node-config``) as
processes on 127.0.0.1, optionally with TLS and SuperNode authentication, with Flower's own
mechanisms only:

* TLS: a CA and server certificates made with ``openssl`` (:func:`make_certificates`); the
  SuperLink serves its one HTTP port (Fleet, Control and Runtime API) with
  ``--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile``; SuperNodes and the ``flwr`` CLI verify it
  with the CA (``--root-certificates``, ``root-certificates`` in the CLI's connection).
* Node authentication: the SuperLink runs with ``--enable-supernode-auth``; each SuperNode has
  its own EC P-384 key pair (``ssh-keygen``, :func:`make_node_key`), whose public key is
  registered with ``flwr supernode register``; the SuperNode signs its requests with
  ``--auth-supernode-private-key``. A SuperNode whose key is not registered is refused (it
  exits with Flower's code 305).
* With TLS, nothing a stranger on the host can reach runs code or reads runs
  (``docs/threat-model.md``): the SuperLink is ``pflarena superlink``, whose Control API
  answers only the operator's token (:mod:`pflarena.deploy.superlink`; the ``flwr`` CLI of
  :attr:`LocalDeployment.cli_home` holds it, :mod:`pflarena.deploy.operator`); the SuperLink
  and every SuperNode run with ``--isolation process`` and a SuperExec secret of their own
  (``--superexec-auth-secret-file``), shared only with the executor this deployment starts
  beside each (the ServerApp executor ``executor-superlink``, each node's ClientApp
  executor); every SuperNode is ``pflarena supernode --app-signing-public-key``, running only
  apps signed with the deployment's signing key (:mod:`pflarena.deploy.approval`);
  :meth:`LocalDeployment.approved_app` lays out the app and signs it.

Everything lives under one directory (``root``): the shards, certificates and keys, each
process's ``FLWR_HOME`` and log, the SuperLink's database, each SuperNode's ``state-dir``, the
``flwr`` CLI's ``config.toml`` (connection :data:`CONNECTION`) and ``deployment.json``, which
records every process started (PID and start time, so a reused PID is never signalled) for
``pflarena local-deploy --stop``.

Waits follow the work (:mod:`pflarena.deploy.waits`): a SuperNode asks for its next message
every ``active_poll`` seconds (default 0.1) for 30 s after each message, then doubles its wait
up to Flower's 3 s (``pflarena supernode --active-poll``); the warm executor asks its node for
a task every 0.1 s for 30 s after each task, then doubles up to ``task_poll``
(``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, Flower's 1 s by default here, since ten idle
SuperNodes polling every 0.1 s kept 0.7 of 2 cores busy); an idle deployment polls as
Flower's does (``benchmarks/results/deployment.md``).

GPUs (``gpus``, ``pflarena local-deploy --gpus``): one per SuperNode, as in the compose files.
SuperNode ``i``'s ClientApp executor runs with ``CUDA_VISIBLE_DEVICES=gpus[i % len(gpus)]``
(its children inherit it: each sees that GPU alone, as ``cuda:0``); fewer ids than SuperNodes
are shared round-robin. Every other process runs with ``CUDA_VISIBLE_DEVICES=""``: none of
them computes, and a CUDA context one of them made by accident would take memory on a GPU
meant for a ClientApp. The ids are recorded, so a SuperNode started later and an executor
restarted by :meth:`LocalDeployment.supervise` get the same GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pflarena.deploy.certs import (
    OPERATOR_TOKEN,
    OPERATOR_TOKEN_HASH,
    SIGNING_KEY,
    CertificateSet,
    make_certificates,
    make_node_key,
    make_operator_token,
    make_secret,
    make_signing_key,
    secret_path,
)
from pflarena.deploy.compose import check_gpus
from pflarena.deploy.errors import DeploymentError
from pflarena.deploy.private import PRIVATE_UMASK, check_owned, private_dir
from pflarena.deploy.supernode import FLOWER_IDLE_SLEEP_S
from pflarena.runtime.processes import (
    Supervised,
    flower_env,
    listening_socket,
    start_time,
    stop_all,
)

__all__ = [
    "CONNECTION",
    "CertificateSet",
    "DeploymentError",
    "EXECUTORS",
    "LocalDeployment",
    "executor_cmd",
    "make_certificates",
    "make_node_key",
    "stop_recorded",
]

#: Name of the ``flwr`` CLI connection a local deployment writes into its ``config.toml``.
CONNECTION = "local-deploy"
#: The file under a deployment's root that lists what it started.
STATE_FILE = "deployment.json"
#: Flower's default task poll interval, which a local deployment keeps unless told otherwise.
DEFAULT_TASK_POLL_S = 1.0
#: A SuperNode's wait between asks for a message while messages come (s).
DEFAULT_ACTIVE_POLL_S = 0.1
#: What may run a SuperNode's ClientApp messages (:class:`LocalDeployment`'s ``executor``).
EXECUTORS = ("warm", "flower")
#: Flower's exit code of a SuperNode the SuperLink refused to activate (an unregistered key;
#: ``pflarena supernode`` first waits out a node with its key still held online,
#: :mod:`pflarena.deploy.liveness`): :meth:`LocalDeployment.supervise` leaves it down.
EXIT_NODE_NOT_REGISTERED = 305
GRACE_S = 15.0
#: The variable that pins a process to its GPUs (CUDA's; torch honours it).
GPU_ENV = "CUDA_VISIBLE_DEVICES"


# --------------------------------------------------------------------------- processes
#: The name of a SuperNode's warm executor in a deployment's records: this and the node's.
EXECUTOR_PREFIX = "executor-"
#: A SuperNode that exits sooner than this after its start is not restarted (it cannot start:
#: a refused key, a bad flag), so that supervise() does not restart it every second.
RESTART_MIN_UPTIME_S = 10.0


def _executor_name(supernode: str) -> str:
    return f"{EXECUTOR_PREFIX}{supernode}"


def _pflarena_cmd() -> list[str]:
    """The ``pflarena`` command of this environment."""
    script = Path(sys.executable).parent / "pflarena"
    return [str(script)] if script.exists() else [sys.executable, "-m", "pflarena.cli"]


def executor_cmd(
    runtime_api_address: str,
    parent_pid: int | None = None,
    root_certificates: Path | None = None,
    *,
    secret: Path | None = None,
    stock: bool = False,
) -> list[str]:
    """``pflarena executor`` (the warm ClientApp executor; ``stock``: Flower's own,
    ``flower-superexec``) for the SuperNode whose Runtime API is at ``runtime_api_address``
    (``--isolation process``); it exits with ``parent_pid`` and signs its requests for tasks
    with the SuperExec ``secret``."""
    cmd = [*_pflarena_cmd(), "executor", *(["--stock"] if stock else [])]
    cmd += ["--runtime-api-address", runtime_api_address]
    if root_certificates is not None:
        cmd += ["--root-certificates", str(root_certificates)]
    else:
        cmd += ["--insecure"]
    if secret is not None:
        cmd += ["--superexec-auth-secret-file", str(secret)]
    if parent_pid is not None:
        cmd += ["--parent-pid", str(parent_pid)]
    return cmd


# --------------------------------------------------------------------------- deployment
@dataclass
class LocalDeployment:
    """A SuperLink and SuperNodes on 127.0.0.1, their files under ``root``.

    Parameters
    ----------
    root : pathlib.Path
        Where everything goes (created).
    shards : list of pathlib.Path
        One shard file per SuperNode: SuperNode ``i`` gets ``shards[i]`` as its
        ``data-path`` and ``root/state/sn-i`` as its ``state-dir``.
    tls : bool
        A secure deployment (its credentials under ``root/certs``): the SuperLink serves TLS
        and answers Control API calls only with the operator's token, every SuperExec
        authenticates with its secret, SuperNodes run only signed apps (module docstring).
    auth : bool
        Only registered SuperNodes may join (needs ``tls``).
    port : int
        The SuperLink's port (0: a free one).
    task_poll : float
        Seconds between the SuperExecs' checks for a new task (0.01-60).
    database : bool
        Keep the SuperLink's state in ``root/superlink.db`` (it then survives a restart of
        the SuperLink) instead of in memory, Flower's default. Measured on 2 loaded cores
        with 10 SuperNodes, SQLite refused concurrent reply uploads ("database is locked",
        HTTP 500), which the in-memory state does not; they are retried within
        ``PFLARENA_SUPERLINK_RETRY_S`` (:mod:`pflarena.deploy.liveness`).
    env : dict
        Extra environment of every process (e.g. ``PFLARENA_PLUGINS``).
    executor : str
        What runs each SuperNode's ClientApp messages: ``"warm"`` (default), pflarena's warm
        executor (:mod:`pflarena.deploy.executor`: one forked child of a pre-imported parent
        per message; the SuperNode runs with ``--isolation process`` and the executor is
        started beside it as ``executor-i``), or ``"flower"``, Flower's own (a fresh process
        per message: ``flower-superexec``, started beside the node in the same way; with
        ``tls``, with the node's secret).
    idle_poll : float or None
        The longest a SuperNode waits after asking for a message and finding none: ``None``
        keeps Flower's hard-coded 3 s.
    active_poll : float or None
        Seconds between a SuperNode's asks for a message for 30 s after each message
        (``pflarena supernode --active-poll``, :mod:`pflarena.deploy.supernode`); ``None``:
        Flower's waits (with ``idle_poll``, a fixed wait).
    trust : list of pathlib.Path
        Credentials (or directories of them) under ``root`` that pflarena did not make there
        but the operator vouches for (:mod:`pflarena.deploy.certs`): kept instead of refused.
    gpus : list of str or None
        GPU ids (indices or UUIDs, distinct): SuperNode ``i``'s ClientApp executor sees
        ``gpus[i % len(gpus)]`` alone, every other process none (module docstring). ``None``:
        every process inherits this one's ``CUDA_VISIBLE_DEVICES``, if any.
    """

    root: Path
    shards: list[Path]
    tls: bool = False
    auth: bool = False
    port: int = 0
    database: bool = False
    task_poll: float = DEFAULT_TASK_POLL_S
    env: dict[str, str] = field(default_factory=dict)
    executor: str = "warm"
    idle_poll: float | None = None
    active_poll: float | None = DEFAULT_ACTIVE_POLL_S
    superlink: Supervised | None = None
    supernodes: list[Supervised] = field(default_factory=list)
    executors: list[Supervised] = field(default_factory=list)
    trust: list[Path] = field(default_factory=list)
    gpus: list[str] | None = None
    #: The GPU of each SuperNode's executor, by the executor's process name (recorded, so
    #: that a restart, or a later command, gives it the same one).
    executor_gpus: dict[str, str] = field(default_factory=dict)
    certs: CertificateSet | None = None
    launcher: dict[str, Any] | None = None
    #: Listening sockets this process bound, by the name of the process that serves them
    #: (kept open: a restarted process inherits the same one, and the port stays ours).
    _sockets: dict[str, socket.socket] = field(default_factory=dict)
    _spawned_at: dict[str, float] = field(default_factory=dict)  # name -> time.monotonic()
    _left_down: set[str] = field(default_factory=set)  # SuperNodes supervise() gave up on

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        if self.auth and not self.tls:
            raise DeploymentError("SuperNode authentication needs TLS (--tls)")
        if self.idle_poll is not None and not 0.01 <= self.idle_poll <= 60:
            raise DeploymentError(f"idle poll {self.idle_poll} s: choose 0.01 to 60 s")
        longest = self.idle_poll if self.idle_poll is not None else FLOWER_IDLE_SLEEP_S
        if self.active_poll is not None and not 0.01 <= self.active_poll <= longest:
            raise DeploymentError(
                f"active poll {self.active_poll} s: choose 0.01 to the idle poll, {longest:g} s"
            )
        if not 0.01 <= self.task_poll <= 60:
            raise DeploymentError(f"task poll {self.task_poll} s: Flower allows 0.01 to 60 s")
        if not self.shards:
            raise DeploymentError("a deployment needs at least one SuperNode (one shard file)")
        if self.executor not in EXECUTORS:
            raise DeploymentError(
                f"executor {self.executor!r}: choose one of {', '.join(EXECUTORS)}"
            )
        for shard in self.shards:
            if not Path(shard).is_file():
                raise DeploymentError(f"shard file {shard} does not exist")
        if self.gpus is not None:
            try:
                self.gpus = check_gpus(self.gpus)
            except ValueError as exc:
                raise DeploymentError(str(exc)) from None

    @classmethod
    def from_record(cls, root: str | Path) -> LocalDeployment:
        """The deployment recorded in ``root/deployment.json`` (started by another process),
        to add SuperNodes to it, list its nodes or stop it."""
        state, procs = _recorded(Path(root))
        dep = cls(
            Path(root),
            [Path(s) for s in state["shards"]],
            tls=state["tls"],
            auth=state["auth"],
            database=state.get("database", False),
            task_poll=state.get("task_poll", DEFAULT_TASK_POLL_S),
            executor=state.get("executor", "flower"),
            idle_poll=state.get("idle_poll"),
            active_poll=state.get("active_poll"),
            gpus=state.get("gpus"),
        )
        dep.executor_gpus = dict(state.get("executor_gpus", {}))
        dep.port = int(state["address"].rsplit(":", 1)[1])
        dep.trust = [Path(p) for p in state.get("trust", [])]
        if dep.tls:
            dep.make_credentials()
        dep.superlink = next((p for p in procs if p.name == "superlink"), None)
        dep.supernodes = [
            p for p in procs if p.name != "superlink" and not p.name.startswith(EXECUTOR_PREFIX)
        ]
        dep.executors = [p for p in procs if p.name.startswith(EXECUTOR_PREFIX)]
        dep.launcher = state.get("launcher")
        return dep

    # ------------------------------------------------------------------ paths
    @property
    def cli_home(self) -> Path:
        """``FLWR_HOME`` of the ``flwr`` CLI (its ``config.toml`` names :data:`CONNECTION`)."""
        return self.root / "flwr-home"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def node_key(self, index: int) -> Path:
        return self.root / "keys" / f"supernode-{index}"

    @property
    def certs_dir(self) -> Path:
        return self.root / "certs"

    def secret(self, owner: str) -> Path:
        """The SuperExec secret of ``superlink`` or ``supernode-i`` (``tls`` only)."""
        return secret_path(self.certs_dir, owner)

    @property
    def signing_key(self) -> Path:
        """The app signing key (the operator's; its ``.pub`` is the nodes')."""
        return self.certs_dir / SIGNING_KEY

    def make_credentials(self) -> None:
        """The CA and the SuperLink's certificate, the operator's token, the SuperExec
        secrets of the SuperLink and of every SuperNode, and the app signing key (what
        pflarena made there before, or :attr:`trust` names, is kept: :mod:`pflarena.deploy.certs`)."""
        trust = self.trust
        self.certs = make_certificates(
            self.certs_dir, {"superlink": ["localhost", "127.0.0.1"]}, trust=trust
        )
        make_operator_token(self.certs_dir, trust=trust)
        make_secret(self.secret("superlink"), trust=trust)
        for index in range(len(self.shards)):
            make_secret(self.secret(f"supernode-{index}"), trust=trust)
        make_signing_key(self.signing_key, trust=trust)

    def runtime_certs(self, name: str) -> CertificateSet:
        """The TLS files of SuperNode ``name``'s Runtime API (``tls``): a CA of its own and a
        certificate for 127.0.0.1 signed by it. Its executor trusts that CA alone, so it talks
        to its own SuperNode only: not to another node, nor to a process that took the port
        after the node exited (such a process could hand it tasks and apps of its own)."""
        return make_certificates(
            self.certs_dir / "runtime" / name,
            {"runtime": ["127.0.0.1", "localhost"]},
            trust=self.trust,
        )

    def approved_app(self, app_root: Path | None = None) -> Path:
        """The app laid out for ``flwr run``; with ``tls``, under ``app_root`` (default
        ``root/app``) and signed with this deployment's key (nodes run nothing else), else
        where ``flwr_run_dir`` lays it out (``app_root``, or the user's cache)."""
        from pflarena.runtime.appdir import flwr_run_dir

        if not self.tls:
            return flwr_run_dir(app_root)
        from pflarena.deploy.approval import approve

        app = flwr_run_dir(app_root or self.root / "app")
        approve(app, self.signing_key)
        return app

    def state_dir(self, index: int) -> Path:
        return self.root / "state" / f"sn-{index}"

    def cli_env(self) -> dict[str, str]:
        return flower_env(self.cli_home) | self.env

    def process_env(self, home: Path, name: str = "") -> dict[str, str]:
        """The environment of this deployment's process ``name`` (with :attr:`gpus`, its
        ``CUDA_VISIBLE_DEVICES``: :meth:`gpu_env`)."""
        poll = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": repr(self.task_poll)}
        return flower_env(home) | poll | self.env | self.gpu_env(name)

    def gpu_of(self, index: int) -> str:
        """The GPU of SuperNode ``index``'s ClientApp executor: round-robin over
        :attr:`gpus` (more SuperNodes than GPUs share them)."""
        assert self.gpus
        return self.gpus[index % len(self.gpus)]

    def gpu_env(self, name: str) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` of process ``name``: nothing without :attr:`gpus`;
        a SuperNode's executor its GPU (:attr:`executor_gpus`); every other process none.
        The SuperLink, the SuperNodes (``--isolation process``: their executors run the
        ClientApps) and the ServerApp executor (pflarena's ServerApp aggregates on the CPU)
        never compute; an empty value keeps a CUDA context any of them made by accident off
        the GPUs, where it would take memory from a ClientApp."""
        if self.gpus is None:
            return {}
        return {GPU_ENV: self.executor_gpus.get(name, "")}

    # ------------------------------------------------------------------ starting
    def _spawn(self, name: str, cmd: list[str], home: Path) -> Supervised:
        """Start ``cmd`` as process ``name``: with umask 077 (what it writes is the operator's
        alone), inheriting the socket its ``--listen-fd`` names, its output in
        ``logs/NAME.log``; recorded in :data:`STATE_FILE` at once."""
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.root / "logs").mkdir(mode=0o700, exist_ok=True)
        fds = [int(cmd[cmd.index("--listen-fd") + 1])] if "--listen-fd" in cmd else []
        # A session of its own: a Ctrl-C in the terminal reaches this command only, which
        # then stops every process by PID, SuperNodes first.
        log = self.root / "logs" / f"{name}.log"
        env = self.process_env(home, name)
        proc = Supervised.spawn(name, cmd, log, env, cwd=home, pass_fds=fds, umask=PRIVATE_UMASK)
        self._spawned_at[name] = time.monotonic()
        if name == "superlink":
            self.superlink = proc
        elif name.startswith(EXECUTOR_PREFIX):
            self.executors.append(proc)
        else:
            self.supernodes.append(proc)
        self.save()  # recorded at once: `--stop` finds whatever was started
        return proc

    def start(self, wait_s: float = 120.0, say: Callable[[str], Any] = print) -> None:
        """Make :attr:`root` the operator's alone (:func:`~pflarena.deploy.private.private_dir`:
        refused if another user could have changed it), start the SuperLink, register the
        nodes' keys (``auth``), start the SuperNodes and wait until every one is online.
        Stops what it started if any step fails."""
        self.root = private_dir(self.root, say=say)
        if (self.root / STATE_FILE).exists() and running_processes(self.root):
            raise DeploymentError(
                f"a deployment recorded in {self.root / STATE_FILE} is still running; "
                f"stop it first (pflarena local-deploy --stop --dir {self.root})"
            )
        try:
            self.port = self._listen("superlink", self.port).getsockname()[1]
            if self.tls:
                self.make_credentials()
            self.start_superlink()
            self.write_cli_config()
            if self.auth:
                self.register(
                    *(
                        make_node_key(self.node_key(i), trust=self.trust)[1]
                        for i in range(len(self.shards))
                    )
                )
            for index in range(len(self.shards)):
                self.start_supernode(index)
            self.wait_online(len(self.shards), timeout=wait_s)
        except BaseException:
            self.stop()
            raise

    def _listen(self, name: str, port: int = 0) -> socket.socket:
        """The listening socket process ``name`` serves on: bound here, on 127.0.0.1 (to
        ``port``, or one the kernel picks), before anyone learns the port, so that no other
        process can take it (:func:`~pflarena.runtime.processes.listening_socket`); kept
        for a restart of ``name``."""
        if name not in self._sockets:
            try:
                self._sockets[name] = listening_socket("127.0.0.1", port)
            except OSError as exc:
                raise DeploymentError(
                    f"cannot listen on 127.0.0.1:{port} for the {name}: {exc.strerror}"
                    + ("; --port 0 picks a free port" if port else "")
                ) from None
        return self._sockets[name]

    def _serve_flags(self, name: str) -> list[str]:
        """``--port P --listen-fd N`` for process ``name`` (its socket: :meth:`_listen`)."""
        sock = self._listen(name)
        return ["--port", str(sock.getsockname()[1]), "--listen-fd", str(sock.fileno())]

    def superlink_cmd(self) -> list[str]:
        """``pflarena superlink`` (Flower's, with its requests bounded; with ``tls`` its
        Control API for the operator only), serving the socket bound for it, with ``--isolation
        process``: its ServerApp executor is started beside it, never by it."""
        cmd = [*_pflarena_cmd(), "superlink"]
        if self.tls:
            assert self.certs is not None
            cert, key = self.certs.servers["superlink"]
            cmd += [
                "--operator-token-hash", str(self.certs_dir / OPERATOR_TOKEN_HASH),
                "--ssl-ca-certfile", str(self.certs.ca_cert),
                "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
                "--superexec-auth-secret-file", str(self.secret("superlink")),
            ]  # fmt: skip
        else:
            cmd += ["--insecure"]
        if self.auth:
            cmd += ["--enable-supernode-auth"]
        if self.database:
            cmd += ["--database", str(self.root / "superlink.db")]
        cmd += ["--isolation", "process", "--host", "127.0.0.1", *self._serve_flags("superlink")]
        return cmd + ["--disable-runtime-dependency-installation"]

    def start_superlink(self) -> None:
        """Start the SuperLink, wait until it answers, and start its ServerApp executor
        (``executor-superlink``: Flower's, a fresh ``flwr-serverapp`` per run, its task token
        never on a command line; with ``tls``, with the SuperLink's secret and running only
        approved apps)."""
        home = self.root / "home-superlink"
        superlink = self._spawn("superlink", self.superlink_cmd(), home)
        self.wait_healthy()
        cmd = executor_cmd(
            self.address,
            parent_pid=superlink.pid,
            root_certificates=self.certs.ca_cert if self.tls and self.certs else None,
            secret=self.secret("superlink") if self.tls else None,
            stock=True,
        )
        if self.tls:
            cmd += ["--app-signing-public-key", f"{self.signing_key}.pub"]
        self._spawn(_executor_name("superlink"), cmd, home)

    def supernode_cmd(self, index: int, key: Path | None = None, name: str = "") -> list[str]:
        """``pflarena supernode`` (Flower's, kept alive: :mod:`pflarena.deploy.liveness`) for
        SuperNode ``index`` (``key``: its private key; with ``auth``, the registered one by
        default), as process ``name`` (default ``supernode-INDEX``), serving its Runtime API on
        the socket bound for ``name`` (with ``tls``, over TLS with :meth:`runtime_certs`), with
        ``--isolation process``: its executor runs beside it."""
        name = name or f"supernode-{index}"
        shard = Path(self.shards[index]).resolve()
        cmd = [*_pflarena_cmd(), "supernode"]
        if self.idle_poll is not None:
            cmd += ["--idle-poll", repr(self.idle_poll)]
        if self.active_poll is not None:
            cmd += ["--active-poll", repr(self.active_poll)]
        cmd += ["--superlink", self.address]
        if self.tls:
            assert self.certs is not None
            runtime = self.runtime_certs(name)
            cert, cert_key = runtime.servers["runtime"]
            cmd += ["--root-certificates", str(self.certs.ca_cert)]
            cmd += ["--app-signing-public-key", f"{self.signing_key}.pub"]
            cmd += ["--superexec-auth-secret-file", str(self.secret(f"supernode-{index}"))]
            cmd += ["--ssl-certfile", str(cert), "--ssl-keyfile", str(cert_key)]
            cmd += ["--ssl-ca-certfile", str(runtime.ca_cert)]
        else:
            cmd += ["--insecure"]
        key = key or (self.node_key(index) if self.auth else None)
        if key is not None:
            cmd += ["--auth-supernode-private-key", str(key)]
        # Node config values are TOML: paths are quoted.
        node_config = f'data-path="{shard}" state-dir="{self.state_dir(index)}"'
        cmd += ["--isolation", "process", "--host", "127.0.0.1", *self._serve_flags(name)]
        return cmd + ["--node-config", node_config]

    def start_supernode(
        self, index: int, key: Path | None = None, name: str | None = None
    ) -> Supervised:
        """Start SuperNode ``index`` (not waiting for it) and its executor beside it (the warm
        one, or Flower's with ``executor="flower"``: :func:`executor_cmd`), which trusts only
        this node's Runtime API certificate with ``tls`` and, with :attr:`gpus`, sees GPU
        :meth:`gpu_of` ``(index)`` alone; record them; returns the SuperNode's process."""
        name = name or f"supernode-{index}"
        cmd = self.supernode_cmd(index, key, name)
        if self.gpus is not None:
            self.executor_gpus[_executor_name(name)] = self.gpu_of(index)
        node = self._spawn(name, cmd, self.root / f"home-{name}")
        runtime = f"127.0.0.1:{cmd[cmd.index('--port') + 1]}"
        self._spawn(
            _executor_name(name),
            executor_cmd(
                runtime,
                parent_pid=node.pid,
                root_certificates=self.runtime_certs(name).ca_cert if self.tls else None,
                secret=self.secret(f"supernode-{index}") if self.tls else None,
                stock=self.executor == "flower",
            ),
            self.root / f"home-{name}",
        )
        return node

    def supervise(self, say: Callable[[str], Any] = print) -> list[str]:
        """Restart every SuperNode that exited, with its warm executor (``pflarena supernode``
        exits when it can no longer serve: :mod:`pflarena.deploy.liveness`; it activates anew),
        unless it exited within :data:`RESTART_MIN_UPTIME_S` of its start or was refused
        activation (:data:`EXIT_NODE_NOT_REGISTERED`): a node that cannot start is reported
        once and left down; and every warm executor that exited while its
        SuperNode runs (a killed executor is a node failure; the node serves again from its
        next message). Returns the names restarted."""
        restarted = []
        for node in list(self.supernodes):
            if node.alive() or node.name in self._left_down:
                continue
            code = node.popen.returncode if node.popen else "?"
            uptime = time.monotonic() - self._spawned_at.get(node.name, 0.0)
            if uptime < RESTART_MIN_UPTIME_S or code == EXIT_NODE_NOT_REGISTERED:
                self._left_down.add(node.name)
                say(f"{node.name} exited (code {code}) {uptime:.0f} s after its start; not "
                    f"restarted: see {node.log}")  # fmt: skip
                continue
            self.supernodes.remove(node)
            executor = next(
                (p for p in self.executors if p.name == _executor_name(node.name)), None
            )
            if executor is not None:  # it follows its parent out (--parent-pid)
                self.executors.remove(executor)
                stop_all([executor], grace=GRACE_S)
            home = self.root / f"home-{node.name}"
            again = self._spawn(node.name, node.cmd, home)
            if executor is not None:
                cmd = list(executor.cmd)
                cmd[cmd.index("--parent-pid") + 1] = str(again.pid)
                self._spawn(executor.name, cmd, home)
            say(f"{node.name} exited (code {code}); restarted it")
            restarted.append(node.name)
        nodes = {p.name: p for p in [*self.supernodes, self.superlink] if p is not None}
        for proc in list(self.executors):
            node = nodes.get(proc.name.removeprefix(EXECUTOR_PREFIX))
            if proc.alive() or node is None or not node.alive():
                continue
            self.executors.remove(proc)
            code = proc.popen.returncode if proc.popen else "?"
            self._spawn(proc.name, proc.cmd, self.root / f"home-{node.name}")
            say(f"{proc.name} exited (code {code}); restarted it")
            restarted.append(proc.name)
        return restarted

    def write_cli_config(self) -> None:
        """The operator's ``flwr`` CLI (:attr:`cli_home`): connection :data:`CONNECTION`, the
        default, with the operator's token when ``tls`` (:func:`~pflarena.deploy.operator.connect`)."""
        from pflarena.deploy.operator import connect

        connect(
            self.cli_home,
            CONNECTION,
            self.address,
            root_certificates=self.certs.ca_cert if self.certs else None,
            operator_token=self.certs_dir / OPERATOR_TOKEN if self.tls else None,
            default=True,
        )

    def flwr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """A ``flwr`` CLI command against this deployment (``CONNECTION`` is the default)."""
        return subprocess.run(
            ["flwr", *args],
            env=self.cli_env(),
            cwd=self.cli_home,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def register(self, *public_keys: Path) -> None:
        """``flwr supernode register KEY.pub local-deploy`` for each key (run side by side)."""
        calls = [
            (
                key,
                subprocess.Popen(
                    ["flwr", "supernode", "register", str(key), CONNECTION],
                    env=self.cli_env(),
                    cwd=self.cli_home,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                ),
            )
            for key in public_keys
        ]
        problems = []
        for key, call in calls:
            out, _ = call.communicate(timeout=120)
            if call.returncode != 0:
                problems.append(f"{key} ({call.returncode}): {out.strip()[-400:]}")
        if problems:
            raise DeploymentError("flwr supernode register failed for " + "; ".join(problems))

    # ------------------------------------------------------------------ waiting
    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Until the SuperLink answers on ``/health`` (over TLS with the CA when ``tls``)."""
        assert self.superlink is not None
        scheme = "https" if self.tls else "http"
        context = None
        if self.tls:
            assert self.certs is not None
            context = ssl.create_default_context(cafile=str(self.certs.ca_cert))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.superlink.alive():
                raise DeploymentError(
                    f"the SuperLink exited at start (code {self.superlink.popen.returncode}); "
                    f"its log {self.superlink.log}:\n{tail(self.superlink.log)}"
                )
            try:
                url = f"{scheme}://127.0.0.1:{self.port}/health"
                with urllib.request.urlopen(url, timeout=1, context=context):
                    return
            except OSError:
                time.sleep(0.2)
        raise DeploymentError(f"the SuperLink did not answer on {self.address} in {timeout:.0f}s")

    def online_nodes(self) -> list[int]:
        """Node ids the SuperLink lists as online (``flwr supernode list --format json``)."""
        result = self.flwr("supernode", "list", CONNECTION, "--format", "json")
        if result.returncode != 0:
            raise DeploymentError(
                f"flwr supernode list failed ({result.returncode}): "
                f"{(result.stdout + result.stderr).strip()[-600:]}"
            )
        nodes = json.loads(result.stdout).get("nodes", [])
        return [int(n["node-id"]) for n in nodes if n.get("status") == "online"]

    def wait_online(
        self, count: int, timeout: float = 120.0, watch: Sequence[Supervised] | None = None
    ) -> list[int]:
        """Until at least ``count`` SuperNodes are online; fails early if one of ``watch``
        (default: every SuperNode started) exits."""
        deadline = time.monotonic() + timeout
        watch = [*self.supernodes, *self.executors] if watch is None else watch
        while True:
            dead = [p for p in watch if not p.alive()]
            if dead:
                raise DeploymentError(
                    "SuperNode(s) exited: "
                    + ", ".join(
                        f"{p.name} (code {p.popen.returncode if p.popen else '?'})" for p in dead
                    )
                    + "".join(f"\n--- {p.log}:\n{tail(p.log)}" for p in dead)
                )
            online = self.online_nodes()
            if len(online) >= count:
                return online
            if time.monotonic() > deadline:
                raise DeploymentError(
                    f"{len(online)} of {count} SuperNodes online after {timeout:.0f}s; "
                    f"logs in {self.root / 'logs'}"
                )
            time.sleep(1.0)

    # ------------------------------------------------------------------ recording, stopping
    def processes(self) -> list[Supervised]:
        """SuperNodes first, then the SuperLink: the order they are stopped in."""
        return [*self.supernodes, *self.executors, *([self.superlink] if self.superlink else [])]

    def save(self, launcher_pid: int | None = None) -> None:
        """Write ``deployment.json``: what ``--stop`` needs, and how to use the deployment."""
        if launcher_pid is not None:
            self.launcher = {"pid": launcher_pid, "start_time": start_time(launcher_pid)}
        state = {
            "address": self.address,
            "connection": CONNECTION,
            "flwr_home": str(self.cli_home),
            "tls": self.tls,
            "auth": self.auth,
            "database": self.database,
            "task_poll": self.task_poll,
            "executor": self.executor,
            "idle_poll": self.idle_poll,
            "active_poll": self.active_poll,
            "shards": [str(Path(s).resolve()) for s in self.shards],
            "trust": [str(p) for p in self.trust],
            "gpus": self.gpus,
            "executor_gpus": self.executor_gpus,
            "launcher": self.launcher,
            "processes": [p.record() for p in self.processes()],
        }
        path = self.root / STATE_FILE
        partial = path.with_suffix(".tmp")
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(state, indent=2) + "\n")
        partial.replace(path)

    def stop(self, grace: float = GRACE_S) -> None:
        """Stop every process this deployment started, by PID (SuperNodes, then the
        SuperLink; SIGTERM, then SIGKILL after ``grace`` s). Safe to call twice."""
        stop_all([*self.supernodes, *self.executors], grace)
        if self.superlink is not None:
            stop_all([self.superlink], grace)
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()
        state = self.root / STATE_FILE
        if state.exists() and not running_processes(self.root):
            state.unlink(missing_ok=True)

    def run_command(self, app_dir: Path) -> str:
        """The ``flwr run`` line for this deployment."""
        from pflarena.core.shard_format import read_shard_set

        shards_dir = Path(self.shards[0]).resolve().parent
        run_config = f"num-clients={len(self.shards)}"
        with contextlib.suppress(Exception):
            read_shard_set(shards_dir)
            run_config += f" shards-dir='{shards_dir}'"
        return (
            f"FLWR_HOME={self.cli_home} FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \\\n"
            f"  flwr run {app_dir} {CONNECTION} --stream \\\n"
            f"  --run-config \"{run_config} num-rounds=5 output-dir='{self.root / 'runs' / 'run-1'}'\""
        )


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _recorded(root: Path) -> tuple[dict[str, Any], list[Supervised]]:
    path = Path(root) / STATE_FILE
    if not path.exists():
        raise DeploymentError(f"no deployment recorded in {root} (no {STATE_FILE})")
    # Its PIDs are signalled: a record another user could have written is not read.
    check_owned(path, "deployment record")
    try:
        state = json.loads(path.read_text())
        procs = [Supervised.from_record(p) for p in state["processes"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise DeploymentError(f"{path} is not a deployment record: {exc}") from None
    return state, procs


def running_processes(root: Path) -> list[str]:
    """Names of the recorded processes of the deployment in ``root`` that still run."""
    try:
        _, procs = _recorded(root)
    except DeploymentError:
        return []
    return [p.name for p in procs if p.alive()]


def stop_recorded(
    root: str | Path, grace: float = GRACE_S, say: Callable[[str], Any] = print
) -> int:
    """Stop the deployment recorded in ``root/deployment.json``; returns how many processes
    were still running. A PID whose start time differs from the record is another
    process now and is left alone."""
    root = Path(root)
    state, procs = _recorded(root)
    launcher = state.get("launcher")
    alive = [p for p in procs if p.alive()]
    if launcher and start_time(int(launcher["pid"])) == launcher["start_time"]:
        # The foreground `pflarena local-deploy` stops its processes itself on SIGTERM.
        os.kill(int(launcher["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + 2 * grace + 10
        while any(p.alive() for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    # SuperNodes first, so that they can deregister while the SuperLink still answers.
    stop_all([p for p in procs if p.name != "superlink"], grace)
    stop_all([p for p in procs if p.name == "superlink"], grace)
    say(f"stopped {len(alive)} process(es): {', '.join(p.name for p in alive) or 'none running'}")
    (root / STATE_FILE).unlink(missing_ok=True)
    return len(alive)
