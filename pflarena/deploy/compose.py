"""Docker compose files for a multi-node deployment (``pflarena compose``).

Compose cannot loop, so the number of SuperNodes is set here, once, and the files are
generated. Every file works with Compose v2 (``docker compose``) and with the Python
``docker-compose`` 1.29 (no ``!reset``, no ``--wait``):

``docker-compose.yml``
    Plain HTTP (``--insecure``), CPU. A SuperLink (``--isolation process``, its state
    database on a volume, its one port published on **127.0.0.1 only**), the ServerApp
    executor ``serverapp`` (writing results under ``/runs``, the host's ``./runs``), and per
    SuperNode ``i`` a ``supernode-i`` (``--node-config`` naming its shard and ``state-dir``)
    with its ClientApp executor ``clientapp-i`` (its shard file alone mounted read-only, a
    volume for its client state). Optional edge nodes ``edge-j`` (``--edge-nodes``): a
    SuperNode that runs its ClientApps itself, limited to :data:`EDGE_CPUS` CPUs and
    :data:`EDGE_MEMORY` of memory.
``docker-compose.tls.yml``
    The same services with TLS everywhere and SuperNode authentication
    (``--enable-supernode-auth``; each SuperNode signs with its own key), the files made by
    ``pflarena certs --out certs --superlink-host superlink --supernodes N --node-keys N
    --secure``. No ``--insecure`` anywhere; the SuperLink's port is published on every
    interface, and what a stranger reaching it can do is nothing but try the Fleet API: the
    SuperLink is ``pflarena superlink --operator-token-hash`` (its Control API answers only
    the operator's token, :mod:`pflarena.deploy.superlink`); the SuperLink and every SuperNode
    run ``--isolation process`` with a SuperExec secret mounted only into themselves and their
    executor (``/secrets/<owner>``); every SuperNode and the ServerApp executor run only apps
    signed with the operator's key (the public half mounted at :data:`SIGNING_PUBLIC_KEY`).
    A complete file, not an override (an override cannot take a published port away).
``docker-compose.gpu.yml``
    An override for either: ``clientapp-i`` reserves GPU ``gpus[i]``.
``docker-compose.edge.yml``
    One SuperNode on an edge device joining a remote SuperLink over TLS with its own key
    and shard.

Start order rests on healthchecks: the SuperLink and each SuperNode answer ``GET /health``
on their HTTP port (probed with the image's Python), the executors and SuperNodes start once
what they connect to is healthy (``depends_on: condition: service_healthy``).

The images (``pflarena-<target>:${PFLARENA_TAG:-latest}``) are built by ``make images``
(:mod:`pflarena.deploy.images`, ``docker/Dockerfile``); the files name them and do not build.
Environment read by the files: ``PFLARENA_TAG`` (the images' tag), ``PFLARENA_PORT`` (the
published port, default 9091), ``PFLARENA_TRACE`` (``1``: timestamped, traced logs), ``PFLARENA_UID``/``PFLARENA_GID`` (the user the ServerApp
executor runs as, who owns what it writes under ``./runs``; default Flower's 49999).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "COMPOSE_FILES",
    "EDGE_CPUS",
    "EDGE_MEMORY",
    "EDGE_PLATFORMS",
    "SUPERLINK_PORT",
    "SUPERNODE_RUNTIME_PORT",
    "check_gpus",
    "clientapp_executor",
    "compose_files",
    "dump",
    "edge_image",
    "healthcheck",
    "load",
]

#: The SuperLink's one HTTP port (Fleet, Control and Runtime API) inside the network.
SUPERLINK_PORT = 9091
#: Each SuperNode's Runtime API port (one SuperNode per container, so the same everywhere).
SUPERNODE_RUNTIME_PORT = 9094
COMPOSE_FILES = (
    "docker-compose.yml",
    "docker-compose.tls.yml",
    "docker-compose.gpu.yml",
    "docker-compose.edge.yml",
)
#: An edge node's limits (the compose service's ``cpus`` and ``mem_limit``).
EDGE_CPUS = 1.0
EDGE_MEMORY = "1g"
#: The SuperLink's state: a SQLite file on its volume, so that a restarted SuperLink knows its
#: nodes and runs; ``PFLARENA_SUPERLINK_DATABASE=:flwr-in-memory:`` keeps it in memory
#: instead: each of the SuperLink's writes is then no SQLite transaction, which made a compose
#: round 0.6 s shorter here, but a restart forgets runs and nodes (``docs/deployment.md``,
#: "Round latency").
SUPERLINK_DATABASE = "/state/superlink.db"
DATABASE_ENV = "PFLARENA_SUPERLINK_DATABASE"
#: A SuperNode's wait between asks for a message while messages come (``--active-poll``).
ACTIVE_POLL_S = 0.1
#: The platforms an edge node's image can be written for (``--edge-platform``).
EDGE_PLATFORMS = ("linux/amd64", "linux/arm64")
#: An edge node's environment: its ClientApp executor (docker/edge-node): pflarena's warm
#: one by default, ``flower`` for Flower's.
EDGE_ENVIRONMENT = {"PFLARENA_EDGE_EXECUTOR": "${PFLARENA_EDGE_EXECUTOR:-warm}"}
#: Where the CA's certificate is mounted in every container of the TLS variant.
CA = "/certs/ca.crt"
#: Where the app signing public key is mounted (SuperNodes, edge nodes, the ServerApp executor).
SIGNING_PUBLIC_KEY = "/certs/app-signing.key.pub"
#: How often the healthchecks probe (each probe starts a Python interpreter: ~0.05 CPU-s).
HEALTH_INTERVAL = "5s"
TAG = "${PFLARENA_TAG:-latest}"
#: Passed through from the host: ``PFLARENA_TRACE=1 docker-compose up`` timestamps the logs of
#: the ServerApp, SuperNodes and executors (pflarena/core/trace.py).
TRACE = {"PFLARENA_TRACE": "${PFLARENA_TRACE:-0}"}


def _secret(owner: str) -> str:
    """Where the SuperExec secret of ``owner`` is mounted in its containers."""
    return f"/secrets/{owner}"


def clientapp_executor(
    runtime_api: str, tls: bool, secret_owner: str | None = None
) -> dict[str, Any]:
    """The program that runs SuperNode ``i``'s ClientApp tasks (service ``clientapp-i``):
    its ``entrypoint`` and ``command``. The one place that names it for every variant.

    pflarena's warm executor (``pflarena executor``, :mod:`pflarena.deploy.executor`: one
    forked child of a pre-imported parent per message; ``pflarena executor --stock`` is
    Flower's ``flower-superexec``). ``runtime_api`` is the SuperNode's Runtime API
    (``supernode-i:9094``); with ``tls`` the executor verifies it with the CA and signs its
    requests for tasks with the SuperExec secret of ``secret_owner``."""
    if tls and not secret_owner:
        raise ValueError("a TLS executor needs the SuperExec secret of its SuperNode")
    transport = ["--root-certificates", CA] if tls else ["--insecure"]
    secret = ["--superexec-auth-secret-file", _secret(secret_owner)] if tls and secret_owner else []
    return {
        "entrypoint": ["pflarena", "executor"],
        "command": [*transport, "--runtime-api-address", runtime_api, *secret],
    }


class _Dumper(yaml.SafeDumper):
    pass


class _Loader(yaml.SafeLoader):
    pass


def load(text: str) -> Any:
    """Parse a compose file."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader


def dump(data: Any, header: str) -> str:
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines()) + body


def flower_version() -> str:
    """The installed flwr release."""
    return version("flwr")


def _node_config(shard_name: str) -> str:
    # TOML values: paths are quoted.
    return f'data-path="/data/{shard_name}" state-dir="/state"'


def healthcheck(port: int, tls: bool, cafile: str = CA) -> dict[str, Any]:
    """``GET /health`` on ``port`` inside the container, with the image's Python (Flower's
    images have no curl); over TLS verified with the CA at ``cafile`` (the certificates
    name 127.0.0.1)."""
    scheme, context = (
        ("https", f"ssl.create_default_context(cafile='{cafile}')") if tls else ("http", "None")
    )
    probe = (
        "import ssl, urllib.request; "
        f"urllib.request.urlopen('{scheme}://127.0.0.1:{port}/health', timeout=4, context={context})"
    )
    return {
        "test": ["CMD", "python", "-c", probe],
        "interval": HEALTH_INTERVAL,
        "timeout": "5s",
        "retries": 3,
        "start_period": "120s",
    }


def _healthy(*services: str) -> dict[str, Any]:
    return {name: {"condition": "service_healthy"} for name in services}


def edge_image(prefix: str, platform: str | None) -> dict[str, Any]:
    """An edge service's ``image`` (and ``platform``): ``<prefix>-edge:${PFLARENA_TAG}``, or
    for a ``platform`` such as ``linux/arm64`` the image ``pflarena images --platform`` tags
    ``${PFLARENA_TAG}-arm64``, run as that platform (under emulation on another host)."""
    if platform is None:
        return {"image": f"{prefix}-edge:{TAG}"}
    arch = platform.rsplit("/", 1)[-1]
    if platform not in EDGE_PLATFORMS:
        raise ValueError(f"--edge-platform {platform}: choose {', '.join(EDGE_PLATFORMS)}")
    return {"image": f"{prefix}-edge:{TAG}-{arch}", "platform": platform}


def _services(
    num_supernodes: int,
    edge_nodes: int,
    tls: bool,
    *,
    shards_dir: str,
    certs_dir: str,
    runs_dir: str,
    prefix: str,
    edge_platform: str | None = None,
) -> dict[str, Any]:
    """One variant's whole file (plain HTTP or TLS with SuperNode authentication)."""
    superlink = f"superlink:{SUPERLINK_PORT}"
    transport = ["--root-certificates", CA] if tls else ["--insecure"]
    ca_mount = [f"{certs_dir}/ca.crt:{CA}:ro"] if tls else []

    def image(target: str) -> str:
        return f"{prefix}-{target}:{TAG}"

    def secret_mount(owner: str) -> str:
        return f"{certs_dir}/secrets/{owner}:{_secret(owner)}:ro"

    signing_mount = [f"{certs_dir}/app-signing.key.pub:{SIGNING_PUBLIC_KEY}:ro"] if tls else []
    approved_only = ["--app-signing-public-key", SIGNING_PUBLIC_KEY] if tls else []
    if tls:
        superlink_transport = [
            "--operator-token-hash", "/certs/operator.token.sha256",
            "--ssl-ca-certfile", CA, "--ssl-certfile", "/certs/superlink.pem",
            "--ssl-keyfile", "/certs/superlink.key", "--enable-supernode-auth",
            "--superexec-auth-secret-file", _secret("superlink"),
        ]  # fmt: skip
        superlink_mounts = [
            *ca_mount,
            f"{certs_dir}/superlink.pem:/certs/superlink.pem:ro",
            f"{certs_dir}/superlink.key:/certs/superlink.key:ro",
            f"{certs_dir}/operator.token.sha256:/certs/operator.token.sha256:ro",
            secret_mount("superlink"),
        ]
        # TLS: reachable from other hosts (SuperNodes elsewhere, the flwr CLI).
        published = f"${{PFLARENA_PORT:-{SUPERLINK_PORT}}}:{SUPERLINK_PORT}"
    else:
        superlink_transport, superlink_mounts = ["--insecure"], []
        # Plain HTTP serves the Control and Runtime APIs to whoever reaches the port: this
        # host only.
        published = f"127.0.0.1:${{PFLARENA_PORT:-{SUPERLINK_PORT}}}:{SUPERLINK_PORT}"

    services: dict[str, Any] = {
        "superlink": {
            "image": image("superlink"),
            "command": [
                *superlink_transport,
                "--isolation",
                "process",
                "--host",
                "0.0.0.0",
                "--port",
                str(SUPERLINK_PORT),
                "--database",
                f"${{{DATABASE_ENV}:-{SUPERLINK_DATABASE}}}",
                "--disable-runtime-dependency-installation",
            ],  # fmt: skip
            "ports": [published],
            "volumes": ["superlink-state:/state", *superlink_mounts],
            "healthcheck": healthcheck(SUPERLINK_PORT, tls),
            "restart": "unless-stopped",
        },
        "serverapp": {
            "image": image("app"),
            # Flower's executor (--stock: a fresh ServerApp process per run, its task token
            # in a file descriptor, not on a command line every user of the host can read;
            # a SuperLink's 500 retried); with TLS with the SuperLink's secret, starting
            # approved apps only (pflarena-serverapp).
            "entrypoint": ["pflarena", "executor", "--stock"],
            "command": [
                *transport,
                "--runtime-api-address",
                superlink,
                *(["--superexec-auth-secret-file", _secret("superlink")] if tls else []),
                *approved_only,
            ],
            # The ServerApp writes results under /runs (output-dir='/runs/NAME') as this
            # user, so that they belong to whoever runs compose (PFLARENA_UID=$(id -u));
            # HOME is writable by any user.
            "user": "${PFLARENA_UID:-49999}:${PFLARENA_GID:-49999}",
            "environment": {"HOME": "/tmp", **TRACE},
            # It reads the shards' manifest (shards-dir='/shards') for the data's description.
            "volumes": [
                f"{runs_dir}:/runs",
                f"{shards_dir}:/shards:ro",
                *ca_mount,
                *signing_mount,
                *([secret_mount("superlink")] if tls else []),
            ],
            "depends_on": _healthy("superlink"),
            "restart": "unless-stopped",
        },
    }
    volumes: dict[str, Any] = {"superlink-state": {}}
    for i in range(num_supernodes):
        node, shard = f"supernode-{i}", f"client_{i:04d}.npz"
        runtime_tls, node_mounts = [], []
        if tls:
            runtime_tls = [
                "--auth-supernode-private-key", f"/keys/{node}",
                "--ssl-certfile", f"/certs/{node}.pem", "--ssl-keyfile", f"/certs/{node}.key",
                "--ssl-ca-certfile", CA, "--superexec-auth-secret-file", _secret(node),
                *approved_only,
            ]  # fmt: skip
            node_mounts = [
                *ca_mount,
                f"{certs_dir}/{node}.pem:/certs/{node}.pem:ro",
                f"{certs_dir}/{node}.key:/certs/{node}.key:ro",
                f"{certs_dir}/keys/{node}:/keys/{node}:ro",
                secret_mount(node),
                *signing_mount,
            ]
        services[node] = {
            "image": image("supernode"),
            "command": [
                # Waits that follow the work (pflarena supernode, as local-deploy runs it).
                "--active-poll",
                str(ACTIVE_POLL_S),
                *transport,
                "--superlink",
                superlink,
                *runtime_tls,
                "--isolation",
                "process",
                "--host",
                "0.0.0.0",
                "--port",
                str(SUPERNODE_RUNTIME_PORT),
                "--node-config",
                _node_config(shard),
            ],  # fmt: skip
            **({"volumes": node_mounts} if node_mounts else {}),
            "environment": TRACE,
            "healthcheck": healthcheck(SUPERNODE_RUNTIME_PORT, tls),
            "depends_on": _healthy("superlink"),
            # With authentication a node is refused (exit 305, after its activation wait:
            # deploy/liveness.py) until its key is registered; restarted meanwhile.
            "restart": "unless-stopped",
        }
        services[f"clientapp-{i}"] = {
            "image": image("app"),
            **clientapp_executor(f"{node}:{SUPERNODE_RUNTIME_PORT}", tls, node),
            "environment": TRACE,
            "volumes": [
                f"{shards_dir}/{shard}:/data/{shard}:ro",
                f"{node}-state:/state",
                *ca_mount,
                *([secret_mount(node)] if tls else []),
            ],
            "depends_on": _healthy(node),
            "restart": "unless-stopped",
        }
        volumes[f"{node}-state"] = {}
    for j in range(edge_nodes):
        node, shard = f"edge-{j}", f"client_{num_supernodes + j:04d}.npz"
        key = f"supernode-{num_supernodes + j}"
        auth = ["--auth-supernode-private-key", f"/keys/{key}", *approved_only] if tls else []
        services[node] = {
            **edge_image(prefix, edge_platform),
            "command": [
                "--active-poll",
                str(ACTIVE_POLL_S),
                *transport,
                "--superlink",
                superlink,
                *auth,
                "--node-config",
                _node_config(shard),
            ],  # fmt: skip
            "environment": {**EDGE_ENVIRONMENT, **TRACE},
            "volumes": [
                f"{shards_dir}/{shard}:/data/{shard}:ro",
                f"{node}-state:/state",
                *ca_mount,
                *([f"{certs_dir}/keys/{key}:/keys/{key}:ro"] if tls else []),
                *signing_mount,
            ],
            # An edge device: one CPU and 1 GiB (a degraded link is added with tc netem in
            # its network namespace: docs/deployment.md).
            "cpus": EDGE_CPUS,
            "mem_limit": EDGE_MEMORY,
            "depends_on": _healthy("superlink"),
            "restart": "unless-stopped",
        }
        volumes[f"{node}-state"] = {}
    return {"services": services, "volumes": volumes}


def check_gpus(gpus: Sequence[str]) -> list[str]:
    """``gpus`` (device ids as ``--gpus`` lists them: indices or ``GPU-...`` UUIDs) stripped
    of blanks; ``ValueError`` unless there is at least one and they are distinct and
    non-empty (``pflarena compose`` and ``pflarena local-deploy`` share this check). A
    repeated id is a slip, not a way to share a GPU, and an empty one would hide every GPU
    (``CUDA_VISIBLE_DEVICES=""``) from the executor it was meant for."""
    ids = [str(g).strip() for g in gpus]
    if not ids or any(not g for g in ids) or len(set(ids)) != len(ids):
        given = ",".join(str(g) for g in gpus)
        raise ValueError(f"--gpus must be distinct, non-empty device ids, got {given!r}")
    return ids


def compose_files(
    num_supernodes: int,
    gpus: Sequence[str] | None = None,
    *,
    edge_nodes: int = 0,
    shards_dir: str = "./shards",
    certs_dir: str = "./certs",
    runs_dir: str = "./runs",
    image: str = "pflarena",
    command_line: str = "",
    edge_platform: str | None = None,
) -> dict[str, str]:
    """The four compose files' text for ``num_supernodes`` SuperNodes (and ``edge_nodes``
    edge nodes after them).

    ``gpus[i]`` is the GPU (a device id) of SuperNode ``i``'s ClientApp executor in
    ``docker-compose.gpu.yml``; by default ``0 .. N-1``. SuperNode ``i`` holds
    ``<shards_dir>/client_<i:04d>.npz`` (the files ``pflarena shards`` writes), edge node
    ``j`` the file ``N + j``. Images are ``<image>-<target>``; ``edge_platform``
    (``linux/arm64``) gives the edge nodes (in the federation files and in
    ``docker-compose.edge.yml``) that platform's image (:func:`edge_image`). Raises
    ``ValueError`` for a count below 1, a negative number of edge nodes, an unknown edge
    platform, or GPUs that are not one distinct id per SuperNode.
    """
    if num_supernodes < 1:
        raise ValueError("--num-supernodes must be at least 1")
    if edge_nodes < 0:
        raise ValueError("--edge-nodes must be 0 or more")
    gpus = (
        [str(g).strip() for g in gpus]
        if gpus is not None
        else [str(i) for i in range(num_supernodes)]
    )
    if len(gpus) != num_supernodes:
        raise ValueError(
            f"--gpus names {len(gpus)} GPU(s) for {num_supernodes} SuperNodes: give one per SuperNode"
        )
    check_gpus(gpus)
    header = (
        f"Generated by `{command_line or f'pflarena compose --num-supernodes {num_supernodes}'}`"
        "; do not edit.\nSee docs/deployment.md. Images: `make images`."
    )
    dirs = {"shards_dir": shards_dir, "certs_dir": certs_dir, "runs_dir": runs_dir}
    edge_image(image, edge_platform)  # refuses an unknown platform before anything is made
    plain = _services(
        num_supernodes, edge_nodes, False, prefix=image, edge_platform=edge_platform, **dirs
    )
    secure = _services(
        num_supernodes, edge_nodes, True, prefix=image, edge_platform=edge_platform, **dirs
    )
    gpu = {
        "services": {
            f"clientapp-{i}": {
                "deploy": {
                    "resources": {
                        "reservations": {
                            "devices": [
                                {
                                    "driver": "nvidia",
                                    "device_ids": [gpus[i]],
                                    "capabilities": ["gpu"],
                                }
                            ]
                        }
                    }
                }
            }
            for i in range(num_supernodes)
        }
    }
    edge = {
        "services": {
            "supernode": {
                **edge_image(image, edge_platform),
                "command": [
                    "--active-poll",
                    str(ACTIVE_POLL_S),
                    "--root-certificates",
                    CA,
                    "--superlink",
                    "${SUPERLINK_ADDRESS:?host:port of the SuperLink}",
                    "--auth-supernode-private-key",
                    "/keys/supernode",
                    "--app-signing-public-key",
                    SIGNING_PUBLIC_KEY,
                    "--node-config",
                    _node_config("shard.npz"),
                ],  # fmt: skip
                "environment": {**EDGE_ENVIRONMENT, **TRACE},
                "volumes": [
                    "${SHARD_FILE:?this node's shard file}:/data/shard.npz:ro",
                    "${CA_CERT:-./certs/ca.crt}:" + CA + ":ro",
                    "${NODE_KEY:?this node's private key}:/keys/supernode:ro",
                    "${APP_SIGNING_KEY:-./certs/app-signing.key.pub}:" + SIGNING_PUBLIC_KEY + ":ro",
                    "edge-state:/state",
                ],
                "restart": "unless-stopped",
            }
        },
        "volumes": {"edge-state": {}},
    }
    up = "docker-compose -f"  # Compose v2: `docker compose -f`
    return {
        "docker-compose.yml": dump(
            plain,
            header + f"\nPlain HTTP, published on 127.0.0.1 only: {up} docker-compose.yml up -d\n"
            "It protects nothing from whoever reaches 127.0.0.1:9091 (any process on this host can "
            "submit a run that every SuperNode executes): across machines use docker-compose.tls.yml.",
        ),
        "docker-compose.tls.yml": dump(
            secure,
            header
            + "\nTLS, SuperNode authentication, the Control API for the operator only, approved "
            "apps only (the port on every interface):\npflarena certs --out certs --superlink-host "
            f"superlink --supernodes {num_supernodes} --node-keys {num_supernodes + edge_nodes} "
            f"--secure; {up} docker-compose.tls.yml up -d superlink;\npflarena connect NAME "
            "--address HOST:PORT --root-certificates certs/ca.crt --operator-token "
            "certs/operator.token;\nregister the keys (flwr supernode register), then the same "
            "without `superlink`; pflarena approve APP_DIR --signing-key certs/app-signing.key.",
        ),
        "docker-compose.gpu.yml": dump(
            gpu,
            header + f"\nOne GPU per ClientApp executor: {up} docker-compose.yml "
            "-f docker-compose.gpu.yml up -d (or on docker-compose.tls.yml).",
        ),
        "docker-compose.edge.yml": dump(
            edge,
            header + "\nOne SuperNode on an edge device: SUPERLINK_ADDRESS=host:9091 "
            f"SHARD_FILE=./shard.npz NODE_KEY=./supernode {up} docker-compose.edge.yml up -d",
        ),
    }


def write_compose_files(files: dict[str, str], out_dir: Path, force: bool = False) -> list[Path]:
    """Write ``files`` into ``out_dir``; refuses (``FileExistsError``) to replace a file that
    differs unless ``force``, before writing any."""
    out_dir.mkdir(parents=True, exist_ok=True)
    differing = [
        name
        for name, text in files.items()
        if (out_dir / name).exists() and (out_dir / name).read_text() != text
    ]
    if differing and not force:
        raise FileExistsError(
            f"{', '.join(differing)} in {out_dir} differ from what would be written; "
            "pass --force to replace them"
        )
    paths = []
    for name, text in files.items():
        (out_dir / name).write_text(text)
        paths.append(out_dir / name)
    return paths
