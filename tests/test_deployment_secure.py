"""A TLS deployment with SuperNode authentication on loopback, started by ``pflarena local-deploy``.

One deployment serves every test of this module (starting one costs tens of seconds): it is
started with ``pflarena local-deploy --tls --auth --num-supernodes 5 --detach`` (a SuperLink
serving TLS with ``--enable-supernode-auth``, five SuperNodes whose keys were registered with
``flwr supernode register``, each holding one shard written as ``pflarena shards`` writes
them) and stopped with ``pflarena local-deploy --stop``. The teardown then checks, by the
PIDs ``deployment.json`` recorded, that nothing it started is left, and stops by PID what
``--stop`` missed (also when a test failed).

* An unregistered SuperNode (a key the SuperLink was never told about) is refused.
* A stranger (the CA's certificate and the ports, nothing else) is refused every Control API
  call (registering a key, listing runs and nodes, submitting an app) and every Runtime API
  task, on the SuperLink and on each SuperNode, while the operator's run beside them
  completes with the rounds of the same run in-process; apps the operator did not sign are
  refused even when submitted with the operator's token; none of the stranger's code runs.
* pFedGT runs 3 rounds on the five registered nodes, over TLS, to completion, while one
  SuperNode is stopped after round 1 (``kill``, SIGTERM: the SIGKILL case, which costs
  Flower's 60 s heartbeat patience, is ``test_deployment_faults.py::test_supernode_stopped_mid_run``)
  and a replacement with a new registered key joins on the same shard and ``state-dir``; the
  run completes and ``rounds.jsonl`` names the clients of every round.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deployment_harness import evaluations, flwr_run_args, in_process_rounds, run_config
from processes import cmdline, descendants, proc_state
from strangers import acquire_task, control_api_refuses, markers, stranger_app, stranger_home

from pflarena.core.config import toml_value
from pflarena.deploy.liveness import ACTIVATION_WAIT_ENV
from pflarena.deploy.local import CONNECTION, STATE_FILE, LocalDeployment, make_node_key
from pflarena.server.results import read_rounds

pytestmark = pytest.mark.slow

NUM_NODES = 5
RUN_TIMEOUT_S = 400.0
PFLARENA = [sys.executable, "-m", "pflarena.cli"]


def _pflarena(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PFLARENA, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


class Secured:
    """The module's deployment (``dep``) and what the tests ran on it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dep: LocalDeployment | None = None
        self.pids: set[int] = set()
        self.children: set[int] = set()
        self.runs: list[subprocess.Popen] = []  # `flwr run` processes

    def attach(self) -> LocalDeployment:
        self.dep = LocalDeployment.from_record(self.root)
        self.note()
        return self.dep

    def note(self) -> None:
        """Remember our processes and the helpers Flower started below them."""
        assert self.dep is not None
        self.pids |= {p.pid for p in self.dep.processes()}
        self.children |= descendants({p for p in self.pids if proc_state(p)})

    def logs(self, lines: int = 25) -> str:
        from pflarena.deploy.local import tail

        return "\n".join(
            f"----- {path.name} -----\n{tail(path, lines)}"
            for path in sorted((self.root / "logs").glob("*.log"))
        )

    def submit(self, name: str, run_config: dict[str, Any]) -> tuple[subprocess.Popen, Path]:
        """``flwr run <app> local-deploy --run-config FILE --stream`` in the background."""
        assert self.dep is not None
        overrides = self.root / f"{name}.toml"
        overrides.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()))
        log = self.root / "logs" / f"flwr-run-{name}.log"
        with open(log, "wb") as handle:
            proc = subprocess.Popen(
                flwr_run_args(CONNECTION, overrides, self.dep.approved_app(self.root / "app")),
                env=self.dep.cli_env(),
                cwd=self.dep.cli_home,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.runs.append(proc)
        return proc, log

    def wait(self, proc: subprocess.Popen, log: Path) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None:
            self.note()
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"flwr run did not end in {RUN_TIMEOUT_S:.0f}s\n{self.logs()}")
            time.sleep(1.0)
        assert proc.returncode == 0, f"flwr run exited {proc.returncode}\n{log.read_text()[-3000:]}"

    def completed(self, out: Path) -> list[dict[str, Any]]:
        """Check the run completed (its summary and the SuperLink agree); its rounds."""
        assert self.dep is not None
        assert (out / "summary.json").exists(), f"no summary.json\n{self.logs()}"
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "completed", f"{summary}\n{self.logs()}"
        run_id = int(json.loads((out / "config.json").read_text())["run_id"])
        listed = self.dep.flwr("list", CONNECTION, "--run-id", str(run_id), "--format", "json")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        (run,) = [r for r in json.loads(listed.stdout)["runs"] if int(r["run-id"]) == run_id]
        assert run["status"] == "finished:completed", run
        return read_rounds(out / "rounds.jsonl")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """``pflarena local-deploy --tls --auth`` with five SuperNodes, for every test here."""
    root = tmp_path_factory.mktemp("secured")
    state = Secured(root)
    try:
        started = _pflarena(
            "local-deploy", "--tls", "--auth", "--num-supernodes", str(NUM_NODES), "--port", "0",
            "--detach", "--dir", str(root), "--partition", "iid", "--seed", "0",
        )  # fmt: skip
        assert started.returncode == 0, f"{started.stdout}{started.stderr}\n{state.logs()}"
        assert "flwr run" in started.stdout and f"{NUM_NODES} SuperNodes online" in started.stdout
        state.attach()
        yield state
    finally:
        _stop_and_check(state)


def _stop_and_check(state: Secured) -> None:
    """``pflarena local-deploy --stop``; then nothing recorded may run: what is left is
    stopped by PID here and fails the check. A ``flwr run`` still running (a test failed)
    is stopped first."""
    for proc in state.runs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    if (state.root / STATE_FILE).exists():
        if state.dep is None:
            state.attach()
        else:
            state.note()
        stopped = _pflarena("local-deploy", "--stop", "--dir", str(state.root), timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # SuperNodes this process started (the unregistered one, the replacement) are our
    # children: reap them, or their executors, which watch the parent's PID, see a zombie
    # and keep running.
    own = [p.popen for p in (state.dep.supernodes if state.dep else []) if p.popen is not None]
    deadline = time.monotonic() + 20
    while (alive := {p for p in state.pids | state.children if proc_state(p)}) and (
        time.monotonic() < deadline
    ):
        for popen in own:
            popen.poll()
        time.sleep(0.5)
    leftovers = {pid: cmdline(pid)[:160] for pid in alive}
    for pid in alive:  # ours, recorded: stop by PID
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not alive, f"still running after --stop: {[(p, leftovers[p]) for p in sorted(alive)]}"


# --------------------------------------------------------------------------- tests
def test_unregistered_supernode_is_refused(secured: Secured) -> None:
    """A SuperNode with a key the SuperLink does not know exits with Flower's code 305 and
    never shows up among the nodes; catches a SuperLink started without
    ``--enable-supernode-auth`` (the node would join and be listed online)."""
    dep = secured.dep
    assert dep is not None
    before = dep.online_nodes()
    assert len(before) == NUM_NODES
    private, _ = make_node_key(secured.root / "keys" / "unregistered")
    # The SuperLink refuses an unregistered key as it refuses a key whose node it still holds
    # online, so the node tries again for a while (PFLARENA_ACTIVATION_WAIT_S): 3 s here.
    env, dep.env = dep.env, {**dep.env, ACTIVATION_WAIT_ENV: "3"}
    try:
        intruder = dep.start_supernode(0, key=private, name="unregistered")
    finally:
        dep.env = env
    secured.note()
    try:
        code = intruder.popen.wait(timeout=90)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"an unregistered SuperNode kept running\n{secured.logs()}") from None
    log = intruder.log.read_text(errors="replace")
    assert code != 0 and "Exit Code: 305" in log, f"exit {code}\n{log[-2000:]}"
    assert "is its key registered" in log, log[-2000:]
    assert sorted(dep.online_nodes()) == sorted(before)
    assert "No SuperNode found with the given public key" in dep.superlink.log.read_text()


def test_pfedgt_over_tls_with_a_node_killed_and_replaced(secured: Secured, tmp_path: Path) -> None:
    """pFedGT, 10 rounds, every client every round, on the five registered SuperNodes over TLS.
    After round 1, SuperNode 4 is killed (SIGTERM) and a new SuperNode (a new key, registered
    for it) joins with the same shard and ``state-dir``, so it holds client 4.

    The run completes (its summary and the SuperLink agree) and learns; ``rounds.jsonl``
    names every round's clients: all five in round 1, and all five again, without failures,
    in every round configured once the new node was online; the last evaluation has each
    client's own test split (the shards'). One run serves both acceptance checks (a pFedGT
    run over TLS by registered nodes, a node lost and replaced mid-run) to keep the suite
    short. Catches a run that stalls or fails on a vanished node, a replacement that cannot
    join, and rounds that do not record who took part.
    """
    import numpy as np

    dep = secured.dep
    assert dep is not None
    _, public = make_node_key(secured.root / "keys" / "replacement")
    dep.register(public)  # before the run: joining then needs only the node's start
    out = tmp_path / "out"
    proc, log = secured.submit(
        "pfedgt",
        {
            "strategy": "pfedgt",
            "num-clients": NUM_NODES,
            "shards-dir": str(secured.root / "shards"),
            # Enough rounds that some begin after the new node is online: on the warm executor
            # a round takes a few seconds, a node's start (its executor's imports) longer.
            "num-rounds": 10,
            "eval-every": 10,
            "fraction-train": 1.0,
            "lr": 0.1,
            "local-epochs": 2,
            "round-timeout": 180.0,
            "output-dir": str(out),
        },
    )
    rounds_file = out / "rounds.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (rounds_file.exists() and any(r["round"] >= 1 for r in read_rounds(rounds_file))):
        assert proc.poll() is None, f"flwr run ended early\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no round 1\n{secured.logs()}"
        time.sleep(0.3)
    secured.note()
    victim = dep.supernodes[NUM_NODES - 1]
    assert victim.name == f"supernode-{NUM_NODES - 1}"
    assert victim.stop(signal.SIGTERM, wait=30), "SuperNode 4 did not stop"
    replacement = dep.start_supernode(
        NUM_NODES - 1, key=secured.root / "keys" / "replacement", name="replacement"
    )
    secured.note()
    dep.wait_online(NUM_NODES, timeout=120, watch=[replacement])
    joined_after = max(r["round"] for r in read_rounds(rounds_file))
    secured.wait(proc, log)
    rounds = secured.completed(out)
    logs = secured.logs
    for record in rounds[1:]:
        print(f"round {record['round']}: {record['train']}")
    print(f"the replacement was online during round {joined_after + 1}")

    assert [r["round"] for r in rounds] == list(range(11)), f"{rounds}\n{logs()}"
    assert rounds[1]["train"]["sampled"] == [0, 1, 2, 3, 4], rounds[1]
    assert rounds[1]["train"]["failures"] == 0, rounds[1]
    assert [e["name"] for e in rounds[1]["exchanges"]] == ["init", "train"], rounds[1]
    later = [r for r in rounds if r["round"] > joined_after + 1]
    assert later, f"the run ended before a round began with the new node online\n{logs()}"
    for record in later:
        assert record["train"]["sampled"] == [0, 1, 2, 3, 4], f"{record}\n{logs()}"
        assert (record["train"]["clients"], record["train"]["failures"]) == (5, 0), record
    sizes = {str(i): len(np.load(path)["y_test"]) for i, path in enumerate(dep.shards)}
    per_client = rounds[-1]["evaluation"]["per_client"]
    assert {k: v["test_samples"] for k, v in per_client.items()} == sizes, per_client
    first, last = (r["evaluation"]["personalized"]["mean"] for r in (rounds[0], rounds[-1]))
    assert last > first, (first, last)
    assert replacement.alive(), f"the new SuperNode exited\n{logs()}"
    assert "Sending: train message" in replacement.log.read_text(), "the new node never trained"


def _runtime_apis(dep: LocalDeployment) -> list[tuple[str, Path]]:
    """The Runtime API addresses of the deployment's SuperNodes (from their command lines),
    each with the CA of its certificate (a stranger holding it still needs the secret)."""
    apis = []
    for node in dep.supernodes:
        args = cmdline(node.pid).split()
        if node.alive() and "--port" in args:
            port = int(args[args.index("--port") + 1])
            apis.append((f"127.0.0.1:{port}", dep.runtime_certs(node.name).ca_cert))
    return apis


def _finished(dep: LocalDeployment, run_id: int, timeout: float = 180.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        listed = dep.flwr("list", CONNECTION, "--run-id", str(run_id), "--format", "json")
        runs = json.loads(listed.stdout).get("runs", []) if listed.returncode == 0 else []
        run = next((r for r in runs if int(r["run-id"]) == run_id), {})
        if str(run.get("status", "")).startswith("finished"):
            return run
        assert time.monotonic() < deadline, f"run {run_id}: {run}"
        time.sleep(1.0)


def test_a_stranger_is_refused_while_the_operators_run_completes(
    secured: Secured, tmp_path: Path
) -> None:
    """While the operator's FedAvg run goes on, a stranger holding the CA's certificate:

    * registers a SuperNode key, lists runs and nodes, submits an app whose ServerApp and
      ClientApp write files: every ``flwr`` call fails with the SuperLink's refusal;
    * asks the SuperLink's and every SuperNode's Runtime API for a task as Flower's SuperExec
      does, without the secret: HTTP 401 from each;
    * with the operator's token leaked, submits the same app unsigned, then signed with a key
      of their own: the ServerApp executor refuses both (``finished:failed``, "not
      approved") before installing them.

    None of the stranger's files appear; the operator's run completes with the evaluations
    of the same run in-process on the same shards. Catches a Control API open to anyone, a
    Runtime API that hands out tasks without the secret, and an executor that runs any app."""
    from pflarena.deploy.certs import make_signing_key

    dep = secured.dep
    assert dep is not None and dep.certs is not None
    nodes_before = len(
        json.loads(dep.flwr("supernode", "list", "--format", "json").stdout)["nodes"]
    )
    out = tmp_path / "operator"
    cfg = run_config(out, num_clients=NUM_NODES, num_rounds=3, round_timeout=180.0,
                     shards_dir=str(secured.root / "shards"))  # fmt: skip
    proc, log = secured.submit("operator", cfg.to_run_config())
    rounds_file = out / "rounds.jsonl"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (rounds_file.exists() and any(r["round"] >= 1 for r in read_rounds(rounds_file))):
        assert proc.poll() is None, f"flwr run ended early\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no round 1\n{secured.logs()}"
        time.sleep(0.3)

    marker = str(tmp_path / "stranger-was-here")
    app = stranger_app(tmp_path, marker)
    home = stranger_home(tmp_path, dep.address, dep.certs.ca_cert)
    control_api_refuses(home, make_node_key(tmp_path / "stranger-node")[1], app)

    runtimes = [(dep.address, dep.certs.ca_cert), *_runtime_apis(dep)]
    assert len(runtimes) == 1 + NUM_NODES, runtimes
    for address, ca in runtimes:
        answer = acquire_task(address, ca)
        print(f"stranger asks {address} for a task: {answer}")
        assert answer.startswith("refused 401"), (address, answer)

    # The operator's token leaked: Flower accepts the run, the ServerApp executor does not.
    other_key, _ = make_signing_key(tmp_path / "stranger-signing.key")
    for label in ("unsigned", "signed by the stranger"):
        if label != "unsigned":
            from pflarena.deploy.approval import approve

            approve(app, other_key)
        started = dep.flwr("run", str(app), CONNECTION, "--format", "json", timeout=120)
        assert started.returncode == 0, started.stdout + started.stderr
        run = _finished(dep, int(json.loads(started.stdout)["run-id"]))
        print(f"the operator's token submits the stranger's app {label}: {run['status']}: "
              f"{run.get('status-details', '')}")  # fmt: skip
        assert run["status"] == "finished:failed", run
        assert "not approved" in run.get("status-details", ""), run

    secured.wait(proc, log)
    rounds = secured.completed(out)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for record in rounds[1:]:
        assert (record["train"]["clients"], record["train"]["failures"]) == (NUM_NODES, 0), record
    local = in_process_rounds(cfg, dep.shards, tmp_path)
    assert evaluations(rounds) == pytest.approx(evaluations(local), abs=1e-9)
    assert markers(marker) == [], "the stranger's code ran"
    nodes_after = len(json.loads(dep.flwr("supernode", "list", "--format", "json").stdout)["nodes"])
    assert nodes_after == nodes_before, (nodes_before, nodes_after)


def test_a_registered_node_killed_and_started_again_at_once_rejoins(secured: Secured) -> None:
    """A SuperNode with a registered key is killed (SIGKILL: it cannot leave) right after it
    came online, and started again at once with the same key, as a supervisor does. The
    SuperLink still holds that key's node online (until its heartbeats are missed, about a
    minute) and refuses to activate it (412, code 2004), on which Flower's node exits with
    305. ``pflarena supernode`` tries again and rejoins as the same node once the SuperLink
    lets the dead one go. Catches a keyed node that cannot come back after a crash (a
    bundle's ``start.sh``, ``local-deploy``'s supervision)."""
    dep = secured.dep
    assert dep is not None
    private, public = make_node_key(secured.root / "keys" / "comeback")
    dep.register(public)
    before = set(dep.online_nodes())
    first = dep.start_supernode(0, key=private, name="comeback")
    secured.note()
    deadline = time.monotonic() + 120
    while not (new := set(dep.online_nodes()) - before):
        assert first.alive() and time.monotonic() < deadline, secured.logs()
        time.sleep(0.5)
    (node_id,) = new
    assert first.stop(signal.SIGKILL, wait=10), "the SuperNode survived SIGKILL"
    again = dep.start_supernode(0, key=private, name="comeback-again")
    secured.note()
    deadline = time.monotonic() + 150
    while "Connection successful after" not in again.log.read_text(errors="replace"):
        assert again.alive(), f"it did not wait for the SuperLink\n{secured.logs(40)}"
        assert time.monotonic() < deadline, secured.logs(40)
        time.sleep(1.0)
    log = again.log.read_text(errors="replace")
    assert "refused to activate this node (code 2004)" in log, log[-3000:]
    assert node_id in dep.online_nodes() and again.alive(), secured.logs(40)
    assert again.stop(signal.SIGTERM, wait=30), "the SuperNode did not stop"
