"""Simulation on an existing Ray cluster (``pflarena run|sweep --ray-address``): the clients
run on every node, the app's code is shipped to the workers, and the rounds are those of a
run on a private Ray instance."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import comparable

from pflarena.cli import main
from pflarena.runtime.flowerapp import FlowerApp
from pflarena.runtime.launch import project_root, run_simulations
from pflarena.runtime.simulation import _start_ray, app_packages, check_ray_address
from pflarena.server.build import parse_config
from pflarena.server.results import read_rounds

#: Client sampling (half the clients train each round) and client state kept across rounds.
SETTINGS = {"num-clients": 4, "num-rounds": 2, "fraction-train": 0.5}
STRATEGIES = ("ditto",)


@pytest.mark.parametrize("address", ["auto", "127.0.0.1:6379", "head-node:10001", "[::1]:6379"])
def test_a_ray_address_is_auto_or_host_and_port(address):
    assert check_ray_address(address) == address


@pytest.mark.parametrize("address", ["", "head", ":6379", "head:", "head:99999", "ray://head:1"])
def test_another_ray_address_is_refused_naming_what_is_expected(address):
    with pytest.raises(ValueError, match="expected auto or the head node's HOST:PORT"):
        check_ray_address(address)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--ray-address", "ray://head:10001"], "Ray Client's ray:// addresses"),
        (["--ray-address", "auto", "--engine", "inprocess"], "needs the Ray engine"),
        (["--ray-address", "auto", "--superlink"], "not to --superlink"),
    ],
)
def test_run_refuses_a_ray_address_it_cannot_use_before_starting(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    assert main(["run", "--strategy", "fedavg", "--output-dir", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (out / "rounds.jsonl").exists()


def test_the_workers_are_given_the_package_holding_the_app():
    app = FlowerApp.from_dir(project_root())
    import pflarena

    assert app_packages(app) == [str(Path(pflarena.__file__).resolve().parent)]


@pytest.fixture
def ray_cluster(monkeypatch):
    """A Ray cluster on this machine: a head node and a worker node, 1 CPU each (Ray's own
    ``ray.cluster_utils.Cluster``). Its files, its address file included, live in a temporary
    directory of its own (``RAY_TMPDIR``), so that no other Ray driver on this machine joins
    it by default; it is shut down when the test ends."""
    import ray
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="pflray-", dir="/tmp")  # short: Ray's socket paths
    monkeypatch.setenv("RAY_TMPDIR", temp_dir)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _client_tasks_per_node(cluster) -> dict[str, set[str]]:
    """The ``ClientAppActor.run`` tasks the cluster ran (its GCS task events), by node id."""
    from ray.core.generated import gcs_pb2

    accessor = cluster.global_state._connect_and_get_accessor()  # noqa: SLF001
    names: dict[bytes, str] = {}
    nodes: dict[bytes, str] = {}
    for raw in accessor.get_task_events():
        event = gcs_pb2.TaskEvents.FromString(raw)
        if event.task_info.name:
            names[event.task_id] = event.task_info.name
        if event.state_updates.HasField("node_id"):
            nodes[event.task_id] = event.state_updates.node_id.hex()
    per_node: dict[str, set[str]] = defaultdict(set)
    for task, name in names.items():
        if name == "ClientAppActor.run":
            per_node[nodes[task]].add(task.hex())
    return per_node


@pytest.mark.slow
def test_a_sweep_on_a_two_node_ray_cluster_runs_clients_on_both_and_gives_the_private_rounds(
    ray_cluster, tmp_path, monkeypatch
):
    """`pflarena sweep --ray-address HOST:PORT` against a head and a worker node: both
    nodes ran clients, the workers imported the shipped package, and the run's rounds equal
    those of the same run on a private Ray instance."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    sets = [f"--set={key}={value}" for key, value in SETTINGS.items()]
    result = subprocess.run(
        [sys.executable, "-m", "pflarena.cli", "sweep", "--strategies",
         ",".join(STRATEGIES), *sets, "--out", str(tmp_path / "cluster"), "--ray-address",
         ray_cluster.address, "--verbose"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert f"joined the Ray cluster at {ray_cluster.address} (2 nodes, 2.0 CPUs)" in result.stderr

    nodes = {node["NodeID"] for node in ray_cluster.global_state.node_table() if node["Alive"]}
    per_node = _client_tasks_per_node(ray_cluster)
    assert len(nodes) == 2 and set(per_node) == nodes, per_node
    # every message of the runs: each round evaluates all 4 clients, rounds 1-2 train 2
    per_run = 4 * (SETTINGS["num-rounds"] + 1) + 2 * SETTINGS["num-rounds"]
    assert sum(map(len, per_node.values())) == len(STRATEGIES) * per_run

    # the app's code reaches the workers as a py_modules package, which they import first:
    # a driver joins as the simulation process does (its ray.init, from a directory other
    # than the source tree, which Ray would put on the workers' path)
    monkeypatch.chdir(tmp_path)
    _start_ray(FlowerApp.from_dir(project_root()), {}, ray_cluster.address)

    @ray.remote(num_cpus=1)
    def where_pflarena_comes_from() -> tuple[str, str]:
        import pflarena

        return ray.get_runtime_context().get_node_id(), pflarena.__file__

    sources = dict(
        ray.get(
            [
                where_pflarena_comes_from.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
                ).remote()
                for node in nodes
            ]
        )
    )
    ray.shutdown()
    assert set(sources) == nodes
    assert all("/runtime_resources/py_modules_files/_ray_pkg_" in f for f in sources.values())

    # the same runs on a private Ray instance
    configs = [
        parse_config(SETTINGS | {"strategy": name, "output-dir": str(tmp_path / "private" / name)})
        for name in STRATEGIES
    ]
    code, tail = run_simulations(configs, verbosity=0, engine="ray")
    assert code == 0, "".join(tail)
    for name in STRATEGIES:
        (path,) = (tmp_path / "cluster").glob(f"**/{name}/seed-0/rounds.jsonl")
        on_cluster = read_rounds(path)
        assert len(on_cluster) == SETTINGS["num-rounds"] + 1
        assert comparable(on_cluster) == comparable(
            read_rounds(tmp_path / "private" / name / "rounds.jsonl")
        ), name
