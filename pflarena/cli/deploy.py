"""The deployment subcommands of ``pflarena``: ``local-deploy``, ``certs`` and ``compose``.

``pflarena local-deploy --num-supernodes N [--tls] [--auth]`` starts a SuperLink and ``N``
SuperNodes on 127.0.0.1 (:class:`pflarena.deploy.local.LocalDeployment`) on shards written
as ``pflarena shards`` writes them, waits until every node is online, prints the ``flwr run``
line to use, and stops everything on Ctrl-C; ``--detach`` leaves it running and ``pflarena
local-deploy --stop`` stops it. ``pflarena certs`` makes the CA, server certificates and
SuperNode keys a TLS deployment with node authentication needs. ``pflarena compose`` writes
the docker compose files (:mod:`pflarena.deploy.compose`).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pflarena.cli.options import DATA_KEYS, add_config_flags, collect_overrides
from pflarena.core.config import ConfigError

__all__ = ["add_parsers"]


def _shards_for(args: argparse.Namespace, root: Path) -> list[Path]:
    """The shard files of a local deployment: ``--shards-dir``'s, or written now."""
    from pflarena.core.config import parse_run_config
    from pflarena.core.federation import build_federation
    from pflarena.core.shard_format import ShardError, read_shard_set, write_shards

    data_flags = collect_overrides(args, [k for k in DATA_KEYS if k != "num-clients"])
    if args.shards_dir:
        if data_flags:
            raise ConfigError(
                f"--shards-dir takes its data from the directory; drop {', '.join(data_flags)}"
            )
        shard_set = read_shard_set(args.shards_dir)
        count = args.num_supernodes or shard_set.num_clients
        if count > shard_set.num_clients:
            raise ConfigError(
                f"--num-supernodes {count}: {shard_set.directory} holds only "
                f"{shard_set.num_clients} shards"
            )
        return [shard_set.path(i) for i in range(count)]
    if not args.num_supernodes:
        raise ConfigError("pflarena local-deploy needs --num-supernodes N (or --shards-dir DIR)")
    out = root / "shards"
    if (out / "manifest.json").exists():
        try:
            existing = read_shard_set(out)
        except ShardError as exc:
            raise ConfigError(f"{out} holds shards that cannot be read: {exc}") from None
        if data_flags or existing.num_clients != args.num_supernodes:
            raise ConfigError(
                f"{out} already holds {existing.num_clients} shards; use them (same "
                "--num-supernodes, no data flags), pass --shards-dir, or choose another --dir"
            )
        print(f"using the shards already in {out}")
        return [existing.path(i) for i in range(existing.num_clients)]
    cfg = parse_run_config(data_flags | {"num-clients": str(args.num_supernodes)})
    spec = cfg.federation_spec()
    paths = write_shards(build_federation(spec), out, spec)
    print(f"wrote {len(paths)} shard files to {out} (as `pflarena shards` does)")
    return paths


def _warn_if_readable(shards: list[Path]) -> None:
    """Shards from ``--shards-dir`` that other users can read: said, not refused (they are
    the operator's files, where the operator put them)."""
    from pflarena.deploy.private import readable_by_others

    exposed = readable_by_others(Path(shards[0]).parent)
    if exposed:
        print(
            f"warning: other users of this host can read {exposed} (every client's data): "
            f"`chmod go-rwx {exposed}` keeps them out",
            file=sys.stderr,
        )


def _cmd_local_deploy(args: argparse.Namespace) -> int:
    from pflarena.deploy.private import private_files

    # Everything this command and its processes write (shards, state, logs, results) is the
    # operator's alone: umask 077, under a 0700 directory no one else could have prepared.
    with private_files():
        return _local_deploy(args)


def _local_deploy(args: argparse.Namespace) -> int:
    from pflarena.deploy import local as deploy
    from pflarena.deploy.private import private_dir

    root = Path(args.dir).resolve()
    if args.stop:
        deploy.stop_recorded(root)
        return 0
    if args.num_supernodes is not None and args.num_supernodes < 1:
        raise ConfigError("--num-supernodes must be at least 1")
    if args.auth and not args.tls:
        raise ConfigError("--auth needs --tls: Flower authenticates SuperNodes over TLS only")
    gpus = _gpus(args.gpus)
    root = private_dir(args.dir, say=print)
    shards = _shards_for(args, root)
    if args.shards_dir:
        _warn_if_readable(shards)
    dep = deploy.LocalDeployment(
        root,
        shards,
        tls=args.tls,
        auth=args.auth,
        port=args.port,
        database=args.database,
        task_poll=args.task_poll,
        executor=args.executor,
        idle_poll=args.idle_poll,
        active_poll=args.active_poll or None,
        trust=[Path(p) for p in args.trust],
        gpus=gpus,
    )
    stop_requested: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stop_requested.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        print(
            f"starting a SuperLink on {'127.0.0.1:' + str(args.port) if args.port else 'a free port'}"
            f" and {len(shards)} SuperNodes{' with TLS' if args.tls else ''}"
            f"{' and node authentication' if args.auth else ''}; logs in {root / 'logs'}"
        )
        if gpus is not None:
            print(
                "ClientApp executors pinned (CUDA_VISIBLE_DEVICES): "
                + ", ".join(f"supernode-{i} GPU {dep.gpu_of(i)}" for i in range(len(shards)))
            )
        start = time.monotonic()
        dep.start(wait_s=args.wait)
        dep.save(launcher_pid=None if args.detach else _own_pid())
        print(f"{len(shards)} SuperNodes online after {time.monotonic() - start:.0f}s")
        print(f"\nSuperLink: {dep.address}   flwr CLI connection: {deploy.CONNECTION}")
        if not args.tls:
            print(
                "plain HTTP on 127.0.0.1: it protects nothing from whoever reaches that address "
                "(any process on this host can submit a run that every SuperNode executes); "
                "--tls --auth locks it"
            )
        if args.tls:
            print(
                f"the Control API answers only the operator's token ({dep.certs_dir}/"
                f"operator.token, stored for the connection in {dep.cli_home}); SuperNodes run "
                f"only apps signed with {dep.signing_key}:\n  pflarena approve APP_DIR "
                f"--signing-key {dep.signing_key}"
            )
        print("run the app on it with:\n")
        # the laid-out app (~160 files), not a clone with its .venv (runtime/appdir.py),
        # signed for the nodes with --tls
        print(dep.run_command(dep.approved_app()))
        if args.detach:
            print(f"\nstop it with: pflarena local-deploy --stop --dir {root}")
            return 0
        print(f"\nCtrl-C (or pflarena local-deploy --stop --dir {root}) stops everything")
        while dep.superlink is not None and dep.superlink.alive():
            dep.supervise()  # a SuperNode or warm executor that exited: start it again
            time.sleep(1.0)
        print("the SuperLink exited; stopping the SuperNodes", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping the deployment ...")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not args.detach or sys.exc_info()[0] is not None:
            dep.stop()


def _gpus(value: str | None) -> list[str] | None:
    """``--gpus ID,ID,...`` as a list (``None`` when not given), refused here, before
    anything is written, unless its ids are distinct and non-empty (the check ``pflarena
    compose --gpus`` makes)."""
    if value is None:
        return None
    from pflarena.deploy.compose import check_gpus

    try:
        return check_gpus(value.split(","))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _own_pid() -> int:
    import os

    return os.getpid()


def _cmd_certs(args: argparse.Namespace) -> int:
    from pflarena.deploy import certs as deploy

    trust = [Path(p) for p in args.trust]
    servers: dict[str, list[str]] = {
        "superlink": [*args.superlink_host, "localhost", "127.0.0.1"],
    }
    for index in range(args.supernodes):
        # The SuperNode's Runtime API (process isolation: its ClientApp executor connects).
        servers[f"supernode-{index}"] = [f"supernode-{index}", "localhost", "127.0.0.1"]
    certs = deploy.make_certificates(args.out, servers, days=args.days, trust=trust)
    print(f"CA: {certs.ca_cert}")
    for stem, (cert, key) in certs.servers.items():
        print(f"{stem}: {cert} {key}")
    if args.secure:
        token, token_hash = deploy.make_operator_token(args.out, trust=trust)
        print(f"operator token: {token} (yours: `pflarena connect`); the SuperLink's: {token_hash}")
        for owner in ["superlink", *(f"supernode-{i}" for i in range(args.supernodes))]:
            path = deploy.make_secret(deploy.secret_path(args.out, owner), trust=trust)
            print(f"SuperExec secret of {owner} and its executor: {path}")
        private, public = deploy.make_signing_key(Path(args.out) / deploy.SIGNING_KEY, trust=trust)
        print(f"app signing key: {private} (yours: `pflarena approve`); the nodes': {public}")
    if args.node_keys:
        for index in range(args.node_keys):
            private, public = deploy.make_node_key(
                Path(args.out) / "keys" / f"supernode-{index}", trust=trust
            )
            print(f"SuperNode {index} key: {private} (register {public})")
        print(
            "register each public key with the SuperLink (TLS, --enable-supernode-auth):\n"
            "  flwr supernode register <key>.pub <connection>"
        )
    return 0


def _cmd_connect(args: argparse.Namespace) -> int:
    import os

    from pflarena.deploy.operator import connect

    home = Path(args.flwr_home or os.environ.get("FLWR_HOME") or Path.home() / ".flwr")
    path = connect(
        home,
        args.name,
        args.address,
        root_certificates=args.root_certificates,
        operator_token=args.operator_token,
        default=args.default,
    )
    token = " with the operator's token" if args.operator_token else ""
    print(f"wrote connection {args.name!r} ({args.address}) to {path}{token}")
    print(f"  flwr list {args.name}    flwr run APP_DIR {args.name} --stream")
    return 0


def _cmd_approve(args: argparse.Namespace) -> int:
    from pflarena.deploy.approval import APPROVAL_FILE, approve

    approval = approve(args.app_dir, args.signing_key)
    print(
        f"approved {args.app_dir} (digest {approval.digest[:16]}, key {approval.key}): "
        f"{Path(args.app_dir) / APPROVAL_FILE}; submit it with flwr run as it is now, any "
        "change to its files needs a new approval"
    )
    return 0


def _cmd_compose(args: argparse.Namespace) -> int:
    from pflarena.deploy.compose import compose_files, write_compose_files
    from pflarena.deploy.private import private_dir

    # Bad ids are refused (exit 2) before the directory is made; `--gpus ""` too, not taken
    # for the default ids.
    gpus = _gpus(args.gpus)
    # The files, and the shards, certificates and results the services mount from beside
    # them, under a directory that is the operator's alone.
    out_dir = private_dir(args.out_dir, "compose directory", say=print)
    command = f"pflarena compose --num-supernodes {args.num_supernodes}"
    if args.edge_nodes:
        command += f" --edge-nodes {args.edge_nodes}"
    if args.gpus:
        command += f" --gpus {args.gpus}"
    if args.edge_platform:
        command += f" --edge-platform {args.edge_platform}"
    files = compose_files(
        args.num_supernodes,
        gpus,
        edge_nodes=args.edge_nodes,
        shards_dir=args.shards_dir,
        certs_dir=args.certs_dir,
        runs_dir=args.runs_dir,
        image=args.image,
        command_line=command,
        edge_platform=args.edge_platform,
    )
    for path in write_compose_files(files, out_dir, force=args.force):
        print(f"wrote {path}")
    n = args.num_supernodes + args.edge_nodes
    print(
        f"\nshards:  pflarena shards --num-clients {n} --out {args.shards_dir} ...\n"
        "images:  make images   (no registry: make images LOCAL_BASE=1, as root)\n"
        f"results: mkdir -p {args.runs_dir}; export PFLARENA_UID=$(id -u) PFLARENA_GID=$(id -g)\n"
        "plain:   docker-compose up -d          (port 9091 on 127.0.0.1 only)\n"
        "GPUs:    docker-compose -f docker-compose.yml -f docker-compose.gpu.yml up -d\n"
        f"TLS:     pflarena certs --out {args.certs_dir} --superlink-host superlink "
        f"--supernodes {args.num_supernodes} --node-keys {n}\n"
        "         docker-compose -f docker-compose.tls.yml up -d superlink; flwr supernode "
        "register ...; docker-compose -f docker-compose.tls.yml up -d\n"
        'then, from the host: flwr run <app> <connection> --run-config "num-clients='
        f"{n} shards-dir='/shards' output-dir='/runs/NAME'\" (docs/deployment.md)"
    )
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``local-deploy``, ``certs`` and ``compose`` to ``pflarena``'s subcommands."""
    local = sub.add_parser(
        "local-deploy",
        help="start a SuperLink and N SuperNodes (one shard each) on 127.0.0.1",
        description="Start the deployment topology as processes on 127.0.0.1: a SuperLink and "
        "N SuperNodes, SuperNode i holding shard i (written as `pflarena shards` writes "
        "them, or from --shards-dir) and keeping its client state in its own state-dir. "
        "Waits until every node is online and prints the `flwr run` line to use. Ctrl-C "
        "stops everything; with --detach, `pflarena local-deploy --stop` does.",
    )
    local.add_argument("--num-supernodes", type=int, metavar="N", help="SuperNodes to start")
    local.add_argument("--tls", action="store_true", help="serve the SuperLink with TLS")
    local.add_argument(
        "--auth",
        action="store_true",
        help="SuperNode authentication: only nodes whose keys are registered may join (needs --tls)",
    )
    local.add_argument(
        "--dir",
        default="local-deploy",
        help="where shards, certificates, logs, state and deployment.json go (default ./local-deploy)",
    )
    local.add_argument(
        "--port", type=int, default=9091, help="the SuperLink's port (default 9091; 0: a free one)"
    )
    local.add_argument(
        "--shards-dir", help="use the shards in this directory instead of writing new ones"
    )
    local.add_argument(
        "--wait", type=float, default=180.0, help="seconds to wait for the nodes (default 180)"
    )
    local.add_argument(
        "--database",
        action="store_true",
        help="keep the SuperLink's state in DIR/superlink.db, so that it survives a restart of "
        "the SuperLink (default: in memory; SQLite may refuse concurrent uploads under load)",
    )
    local.add_argument(
        "--task-poll",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between the executors' checks for a task (FLWR_SUPEREXEC_TASK_POLL_INTERVAL; "
        "default 1, Flower's: 0.1 answers sooner but costs CPU on every idle SuperNode)",
    )
    local.add_argument(
        "--executor",
        choices=("warm", "flower"),
        default="warm",
        help="what runs each SuperNode's messages: warm (default), pflarena's warm executor, one "
        "forked child of a pre-imported parent per message, restarted if it dies while this "
        "command runs in the foreground; flower, Flower's own, a fresh process per message",
    )
    local.add_argument(
        "--gpus",
        metavar="ID,ID,...",
        help="one GPU per SuperNode: SuperNode i's ClientApp executor sees the i-th id alone "
        "(CUDA_VISIBLE_DEVICES; fewer ids than SuperNodes are shared round-robin), the "
        "SuperLink and the SuperNodes themselves see none (default: every process sees the "
        "GPUs this command sees)",
    )
    local.add_argument(
        "--active-poll",
        type=float,
        default=0.1,
        metavar="S",
        help="seconds between a SuperNode's asks for a message for 30 s after each message, "
        "after which its wait doubles up to --idle-poll (default 0.1; 0: Flower's waits)",
    )
    local.add_argument(
        "--idle-poll",
        type=float,
        default=None,
        metavar="S",
        help="the longest a SuperNode waits after finding no message (default: Flower's 3 s)",
    )
    local.add_argument(
        "--detach", action="store_true", help="start, print how to use it, and leave it running"
    )
    local.add_argument("--stop", action="store_true", help="stop the deployment recorded in --dir")
    local.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="PATH",
        help="a credential under --dir that pflarena did not make there but is yours (a "
        "directory: everything below it); without it such a file is refused (repeatable)",
    )
    add_config_flags(local, tuple(k for k in DATA_KEYS if k != "num-clients"))
    local.set_defaults(func=_cmd_local_deploy)

    certs = sub.add_parser(
        "certs",
        help="make a CA, server certificates (openssl) and SuperNode keys for a TLS deployment",
        description="Make, with openssl, a CA and certificates signed by it: one for the "
        "SuperLink (its subject alternative names: --superlink-host, localhost and 127.0.0.1) "
        "and, with --supernodes N, one per SuperNode Runtime API (supernode-0 .. N-1, for "
        "ClientApp executors in their own containers); with --node-keys N, N SuperNode key "
        "pairs (ssh-keygen, EC P-384) to register with `flwr supernode register`. Files "
        "pflarena made there before are kept; any other credential there is refused unless "
        "named with --trust. The directory is made 0700, every file 0600.",
    )
    certs.add_argument("--out", required=True, help="directory for the files")
    certs.add_argument(
        "--superlink-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name or IP the SuperLink is reached by (repeatable; e.g. superlink, "
        "its public DNS name)",
    )
    certs.add_argument(
        "--supernodes", type=int, default=0, help="SuperNode Runtime API certificates"
    )
    certs.add_argument("--node-keys", type=int, default=0, help="SuperNode key pairs to make")
    certs.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    certs.add_argument(
        "--secure",
        action="store_true",
        help="also the operator's token (operator.token; operator.token.sha256 for the "
        "SuperLink), a SuperExec secret for the SuperLink and each of --supernodes "
        "(secrets/), and the app signing key pair (app-signing.key, .pub for the nodes)",
    )
    certs.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="PATH",
        help="a credential in --out that pflarena did not make there but is yours (a "
        "directory: everything below it); without it such a file is refused (repeatable)",
    )
    certs.set_defaults(func=_cmd_certs)

    connect = sub.add_parser(
        "connect",
        help="write a flwr CLI connection, with the operator's token for a secure SuperLink",
        description="Write connection NAME into $FLWR_HOME/config.toml (other connections "
        "kept) and, with --operator-token, put the token into the flwr CLI's credential store "
        "for that address, so that `flwr run/list/stop/supernode register NAME` reach a "
        "SuperLink whose Control API answers only its operator (pflarena superlink).",
    )
    connect.add_argument("name", help="the connection's name (flwr run APP NAME)")
    connect.add_argument("--address", required=True, help="the SuperLink's HOST:PORT")
    connect.add_argument("--root-certificates", help="the CA certificate (TLS); else insecure")
    connect.add_argument("--operator-token", metavar="FILE", help="the operator's token file")
    connect.add_argument("--flwr-home", help="the CLI's home (default $FLWR_HOME, else ~/.flwr)")
    connect.add_argument("--default", action="store_true", help="make it the default connection")
    connect.set_defaults(func=_cmd_connect)

    approve = sub.add_parser(
        "approve",
        help="sign an app directory for SuperNodes that run approved apps only",
        description="Sign the Flower App in APP_DIR (the files flwr run puts in its FAB) with "
        "the operator's Ed25519 key and write pflarena-approval.json into it; SuperNodes "
        "started with `pflarena supernode --app-signing-public-key KEY.pub` run it, and "
        "nothing else. Approve again after any change to the app's files.",
    )
    approve.add_argument("app_dir", help="the app directory handed to flwr run")
    approve.add_argument("--signing-key", required=True, help="the Ed25519 private key (PEM)")
    approve.set_defaults(func=_cmd_approve)

    compose = sub.add_parser(
        "compose",
        help="write docker-compose.yml (N SuperNodes) and its TLS, GPU and edge files",
        description="Write docker-compose.yml (a SuperLink published on 127.0.0.1, the "
        "ServerApp executor, and N SuperNodes, each with its ClientApp executor, its shard "
        "mounted read-only and a state volume; plain HTTP), docker-compose.tls.yml (the same "
        "with TLS and SuperNode authentication), docker-compose.gpu.yml (an override: one GPU "
        "per ClientApp executor) and docker-compose.edge.yml (one SuperNode joining a remote "
        "SuperLink). Compose cannot loop: N is set here. Images: `make images`.",
    )
    compose.add_argument("--num-supernodes", type=int, required=True, metavar="N")
    compose.add_argument(
        "--gpus", metavar="ID,ID,...", help="one GPU id per SuperNode (default 0,1,...,N-1)"
    )
    compose.add_argument("--shards-dir", default="./shards", help="host directory of the shards")
    compose.add_argument("--certs-dir", default="./certs", help="host directory of the TLS files")
    compose.add_argument("--runs-dir", default="./runs", help="host directory for results")
    compose.add_argument(
        "--edge-nodes",
        type=int,
        default=0,
        metavar="K",
        help="also K edge nodes (1 CPU, 1 GiB; shards N..N+K-1; default 0)",
    )
    compose.add_argument(
        "--edge-platform",
        metavar="PLATFORM",
        help="the edge nodes' platform (linux/arm64: the images `pflarena images --platform "
        "linux/arm64` tags <tag>-arm64, run under emulation on an x86-64 host; default the "
        "host's images)",
    )
    compose.add_argument(
        "--image",
        default="pflarena",
        help="the images' prefix: <prefix>-<target> (default pflarena)",
    )
    compose.add_argument("--out-dir", default=".", help="where the files go (default .)")
    compose.add_argument("--force", action="store_true", help="replace compose files that differ")
    compose.set_defaults(func=_cmd_compose)

    add_bundle_parser(sub)

    from pflarena.deploy import images

    images.add_parser(sub)

    # `pflarena executor ...` is dispatched before parsing (its flags are Flower's); this
    # entry lists it in `pflarena --help`.
    sub.add_parser(
        "executor",
        add_help=False,
        help="a warm ClientApp executor: flower-superexec's flags, one forked child per message",
        description="See `pflarena executor --help` (pflarena.deploy.executor).",
    )
    sub.add_parser(
        "supernode",
        add_help=False,
        help="flower-supernode kept alive (a 500 retried; exits when it cannot serve), with "
        "--idle-poll S and --app-signing-public-key (approved apps only)",
        description="See pflarena.deploy.supernode.",
    )
    sub.add_parser(
        "superlink",
        add_help=False,
        help="flower-superlink whose Control API answers only the operator's token",
        description="See pflarena.deploy.superlink.",
    )


def _cmd_bundle(args: argparse.Namespace) -> int:
    from pflarena.deploy import bundles
    from pflarena.deploy.private import private_files

    with private_files():
        if args.role == "superlink":
            made = bundles.superlink_bundle(
                args.dir, args.address, reissue=args.reissue, days=args.days, trust=args.trust
            )
            then = "copy it to the SuperLink's host, then there: tar -xf superlink.tar && "
            then += "cd superlink && ./start.sh   (or ./run-superlink.sh without Docker)"
        elif args.role == "supernode":
            made = bundles.node_bundle(
                args.dir,
                args.name,
                shard=args.shard,
                data_path=args.data_path,
                superlink=args.superlink,
                new_key=args.new_key,
                public_key=args.public_key,
                days=args.days,
                trust=args.trust,
            )
            then = f"copy it to the node's host, then there: tar -xf {args.name}.tar && "
            then += f"cd {args.name} && ./start.sh   (or ./run-node.sh without Docker)"
        else:
            made = bundles.operator_bundle(
                args.dir, superlink=args.superlink, connection=args.connection
            )
            then = "copy it to the operator's machine, then there: tar -xf operator.tar && "
            then += "operator/connect.sh"
    print(f"bundle {made.name}: {made.archive} (and {made.directory}/), {len(made.files)} files")
    for note in made.notes:
        print(note)
    print(then)
    return 0


def add_bundle_parser(sub: argparse._SubParsersAction) -> None:
    """``pflarena bundle superlink|supernode|operator``."""
    bundle = sub.add_parser(
        "bundle",
        help="make what another host of a federation needs: the SuperLink's, a SuperNode's, "
        "the operator's",
        description="From the operator's federation directory (--dir; made by the first "
        "`pflarena bundle superlink`), make one host's bundle: a directory and a .tar under "
        "DIR/bundles/ holding that host's credentials and nothing more, and a ready way to "
        "start it (docker-compose.yml with start.sh; a plain script and a systemd unit for "
        "a host without Docker). Directories 0700, files 0600. docs/deployment.md, "
        "'Several hosts'.",
    )
    roles = bundle.add_subparsers(dest="role", required=True, metavar="ROLE")

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dir", required=True, help="the federation directory (0700)")
        parser.add_argument(
            "--days", type=int, default=365, help="validity of new certificates (default 365)"
        )
        parser.add_argument(
            "--trust",
            action="append",
            default=[],
            metavar="PATH",
            help="a credential under --dir that pflarena did not make there but is yours",
        )

    link = roles.add_parser(
        "superlink",
        help="the SuperLink's host (makes the federation's CA, certificate, operator token, "
        "secrets and app signing key where missing)",
        description="The SuperLink's bundle. Its certificate names every --address given "
        "(now and before): the DNS names and IPs the nodes and the operator dial.",
    )
    common(link)
    link.add_argument(
        "--address",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="a name or IP the SuperLink is dialled by (repeatable; port default 9091)",
    )
    link.add_argument(
        "--reissue",
        action="store_true",
        help="replace a SuperLink certificate that lacks an --address (same CA: other bundles "
        "stay valid; the SuperLink needs its new bundle)",
    )
    node = roles.add_parser(
        "supernode",
        help="one SuperNode host: its key pair, its data, the CA, the SuperLink's address",
        description="SuperNode host NAME's bundle: its node key pair (made once; --new-key "
        "rotates it), the CA's certificate, the SuperLink's address (checked against its "
        "certificate), a SuperExec secret and Runtime API certificate for its own executor, "
        "its data and state paths.",
    )
    node.add_argument("name", help="the host's name (lower-case letters, digits, dashes)")
    common(node)
    data = node.add_mutually_exclusive_group(required=True)
    data.add_argument("--shard", help="its shard file here (copied into the bundle)")
    data.add_argument("--data-path", help="its data file's absolute path on its own host")
    node.add_argument(
        "--superlink", metavar="HOST[:PORT]", help="the address it dials (default: the first)"
    )
    keys = node.add_mutually_exclusive_group()
    keys.add_argument(
        "--new-key", action="store_true", help="a new key pair (the old one is kept, retired)"
    )
    keys.add_argument(
        "--public-key",
        metavar="FILE",
        help="the host keeps its private key: its OpenSSH EC public key (ssh-keygen -t ecdsa "
        "-b 384 there); the bundle then holds no private key",
    )
    op = roles.add_parser(
        "operator",
        help="the operator's machine: the connection (address, CA, token) and the signing key",
        description="The operator's bundle: connect.sh (a flwr connection with the operator's "
        "token), the CA's certificate and the app signing key.",
    )
    op.add_argument("--dir", required=True, help="the federation directory")
    op.add_argument("--superlink", metavar="HOST[:PORT]", help="the address it dials")
    op.add_argument(
        "--connection", default="federation", help="the connection's name (default federation)"
    )
    bundle.set_defaults(func=_cmd_bundle)
