"""A method's server memory at a federation's size (``pflarena/core/footprint.py``): the
terms against what the strategies really allocate, and a run refused before it starts,
at ``--check`` and in the ServerApp, when they do not fit the machine."""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, RecordDict
from helpers import config, grid_for, run_local

from pflarena.algorithms import mgda
from pflarena.algorithms.ddpg import DDPGAgent
from pflarena.cli.command import main
from pflarena.core import footprint
from pflarena.core.config import ConfigError
from pflarena.core.footprint import (
    FLOAT32,
    MEMORY_SHARE,
    Federation,
    Footprint,
    footprint_problem,
    human_bytes,
    memory_limit,
)
from pflarena.core.versions import DiskVersions
from pflarena.methods.fedamp.strategy import MODELS
from pflarena.methods.page.strategy import Page
from pflarena.methods.pfedhn.strategy import PFedHN
from pflarena.server.app import initial_arrays
from pflarena.server.app import main as serverapp_main
from pflarena.server.build import build_strategy, check_footprint, federation_of, parse_config
from pflarena.strategies import strategy_classes

MB = 1024**2


def _terms(cfg) -> tuple[Federation, list[Footprint]]:
    cls = strategy_classes()[cfg.strategy]
    federation = federation_of(cfg)
    return federation, cls.server_footprint(cfg.params(cls.declaration), federation)


def test_the_federation_is_the_runs_numbers():
    """The model's bytes and values are the initial model's, the sample the strategy's own
    count."""
    cfg = config(strategy="fedavg", num_clients=40, fraction_train=0.3, num_rounds=7)
    federation = federation_of(cfg)
    arrays = [a.numpy() for a in initial_arrays(cfg).values()]
    assert federation.model_bytes == sum(a.nbytes for a in arrays)
    assert federation.model_params == sum(a.size for a in arrays)
    assert federation.sampled == build_strategy(cfg).num_to_sample(40) == 12
    assert (federation.num_clients, federation.num_rounds) == (40, 7)


def test_a_refusal_names_the_largest_terms_and_the_numbers():
    federation = Federation(3550, 355, 2, model_bytes=6 * MB, model_params=1_500_000)
    terms = [Footprint("a", 10 * MB), Footprint("b", 30 * 1024 * MB), Footprint("c", 2 * MB)]
    problem = footprint_problem("m", federation, terms, limit=24 * 1024 * MB)
    assert problem is not None
    assert problem.startswith("m cannot run 3550 clients here: its server would hold 30 GB")
    assert problem.index("b: 30 GB") < problem.index("a: 10 MB") < problem.index("c: 2 MB")
    assert "the model is 6 MB" in problem and "of the 24 GB this machine" in problem
    # within the share: no problem
    fits = [Footprint("a", MEMORY_SHARE * 24 * 1024 * MB)]
    assert footprint_problem("m", federation, fits, limit=24 * 1024 * MB) is None
    assert [human_bytes(n) for n in (1536, 3 * 1024**4, 3 * 1024**5)] == [
        "1.5 KB",
        "3 TB",
        "3,072 TB",
    ]


def test_the_memory_limit_is_the_machines_or_its_cgroups(tmp_path, monkeypatch):
    cgroup = tmp_path / "memory.max"
    monkeypatch.setattr(footprint, "_CGROUP_LIMIT", cgroup)
    machine = memory_limit()  # no cgroup file: the physical memory
    assert machine == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    cgroup.write_text("max\n")
    assert memory_limit() == machine
    cgroup.write_text(f"{machine // 4}\n")
    assert memory_limit() == machine // 4


def test_fedamps_terms_are_what_its_round_reads(tmp_path, monkeypatch):
    """FedAMP reads every client's latest model and flattens them for the distances: the
    memory traced while the first cloud model is built is those two terms (and one cloud
    model), within 15 %."""
    n = 60
    cfg = config(strategy="fedamp", num_clients=n)
    strategy = build_strategy(cfg, state_dir=tmp_path)
    initial = initial_arrays(cfg)
    rng = np.random.default_rng(0)
    pool = strategy.pool(MODELS)
    for client in range(n):
        record = ArrayRecord(
            {k: Array(rng.standard_normal(a.shape).astype(np.float32)) for k, a in initial.items()}
        )
        pool.put(client, 1, {MODELS: record})
    strategy.server_round = 2
    # a cold read, as in a large federation: nothing of the pool in the per-process cache
    monkeypatch.setattr(DiskVersions, "_cache", type(DiskVersions._cache)())
    monkeypatch.setattr(DiskVersions, "_cache_bytes", 0)
    federation, terms = _terms(cfg)
    by_what = {t.what.split(" (")[0]: t.nbytes for t in terms}
    expected = (
        by_what["every client's latest model, read for the cloud models"]
        + by_what["those models flattened for their distances"]
        + federation.model_bytes
    )
    tracemalloc.start()
    try:
        strategy.cloud_for(0, initial)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak == pytest.approx(expected, rel=0.15), (human_bytes(peak), human_bytes(expected))


def test_pages_agent_term_counts_its_networks_weights():
    """The networks' term is four copies (the networks, their targets, Adam's two moments)
    of the actor's and critic's parameters as torch counts them, in the agent the strategy
    builds."""
    cfg = config(strategy="page", num_clients=30, server_fraction=0.1, **{"page.server-hidden": 16})
    params = cfg.params(Page.declaration)
    agent = DDPGAgent(Page.server_agent_config(params, 30), seed=0)
    weights = sum(p.numel() for net in (agent.actor, agent.critic) for p in net.parameters())
    _, terms = _terms(cfg)
    (networks,) = [t for t in terms if t.what.startswith("the server agent's networks")]
    assert networks.nbytes == 4 * weights * FLOAT32


@pytest.mark.parametrize("affinity", ["labels", "centered-labels"])
def test_ppfls_affinity_term_covers_building_and_checking_w(affinity):
    """PPFL's W term is at least the peak of building W from every client's histogram and
    checking it, as the strategy does (tracemalloc), and there is none without a Laplacian
    term."""
    n = 600
    cfg = config(strategy="ppfl", num_clients=n, **{"ppfl.affinity": affinity})
    _, terms = _terms(cfg)
    (term,) = [t for t in terms if t.what.startswith("the affinity W")]
    strategy = build_strategy(cfg)
    strategy.histograms = np.random.default_rng(0).dirichlet(np.ones(10), n) * 50
    import sklearn.metrics.pairwise  # noqa: F401  (its import's memory is not W's)

    tracemalloc.start()
    try:
        w = strategy.affinity()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert w.shape == (n, n)
    assert 2 * w.nbytes <= peak <= term.nbytes, (peak / w.nbytes, term)
    for off in ({"ppfl.affinity": "none"}, {"ppfl.lambda": 0.0}):
        _, terms = _terms(config(strategy="ppfl", num_clients=n, **off))
        assert not [t for t in terms if t.what.startswith("the affinity W")]


def test_pfedhns_terms_count_its_embeddings_and_heads():
    cfg = config(strategy="pfedhn", num_clients=40)
    strategy = build_strategy(cfg)
    assert isinstance(strategy, PFedHN)
    net = strategy.net
    embeddings = net.embeddings.weight.numel()
    heads = sum(p.numel() for name, p in net.named_parameters() if name.startswith("heads"))
    _, terms = _terms(cfg)
    named = {t.what.split(" (")[0]: t.nbytes for t in terms}
    assert named["the client embeddings and their momentum"] == 2 * embeddings * FLOAT32
    assert named["the heads and their momentum"] == pytest.approx(2 * heads * FLOAT32, rel=0.01)
    # a gradient of every hypernetwork parameter per reply (FedAvg's default 100 % here)
    weights = sum(p.numel() for p in net.parameters())
    grads = named["the round's hypernetwork gradients, one per reply"]
    assert grads == 40 * weights * FLOAT32


@pytest.mark.parametrize("method", sorted(strategy_classes()))
def test_every_method_fits_a_small_run_and_names_its_replies(method):
    """Every method has terms, each positive, and a small run of it fits this machine."""
    run = {"strategy": method, "dataset": "digits", "num-clients": 10}
    try:
        cfg = parse_config(run | {"validation-fraction": 0.2, "server-fraction": 0.1})
    except ConfigError:  # a method that refuses a server share
        cfg = parse_config(run | {"validation-fraction": 0.2})
    federation, terms = _terms(cfg)
    assert terms and all(t.nbytes > 0 for t in terms), terms
    assert terms[0].what.startswith("the round's"), terms
    assert footprint_problem(method, federation, terms) is None


def test_check_refuses_a_run_whose_server_would_not_fit(tmp_path, monkeypatch, capsys):
    """``run --check`` says why, with the numbers, and writes nothing; FedAvg, whose server
    holds only the round's replies (30 of them here), passes the same check."""
    monkeypatch.setattr(footprint, "memory_limit", lambda: 64 * MB)
    out = tmp_path / "run"
    argv = ["run", "--check", "--dataset", "digits", "--partition", "iid", "--num-clients", "300"]
    assert main([*argv, "--strategy", "fedamp", "--output-dir", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "fedamp cannot run 300 clients here" in err, err
    assert "those models flattened for their distances (300 x 55210 float32)" in err, err
    assert "of the 64 MB this machine gives the run" in err, err
    assert not out.exists()
    fedavg = ["--strategy", "fedavg", "--fraction-train", "0.1", "--output-dir", str(out)]
    assert main([*argv, *fedavg]) == 0


def test_the_serverapp_refuses_it_on_its_own_machine(tmp_path, monkeypatch):
    """Before it writes anything: a deployment's server need not be the command's machine."""
    monkeypatch.setattr(footprint, "memory_limit", lambda: 64 * MB)
    out = tmp_path / "run"
    cfg = config(strategy="fedamp", num_clients=300, output_dir=str(out))
    context = Context(1, 0, {}, RecordDict(), cfg.to_run_config())
    with pytest.raises(ConfigError, match="fedamp cannot run 300 clients here"):
        serverapp_main(grid_for(config(num_clients=2)), context)
    assert not out.exists()
    check_footprint(cfg, limit=64 * 1024 * MB)  # a machine of 64 GB would hold it


def test_pfedgts_c0_exchange_counts_every_clients_reply_only_when_it_runs():
    """``c-init=round`` has every client reply with a model-sized c_i⁰ before round 1, all
    held at once; ``c-init=zeros`` sends nothing."""
    federations = {}
    for n in (20, 40):
        for c_init in ("round", "zeros"):
            cfg = config(strategy="pfedgt", num_clients=n, **{"pfedgt.c-init": c_init})
            federation, terms = _terms(cfg)
            federations[n, c_init] = {t.what.split(" (")[0]: t.nbytes for t in terms}
    exchange = "the c⁰ exchange's replies, every client's"
    assert exchange not in federations[20, "zeros"]
    assert federations[20, "round"][exchange] == 20 * federation.model_bytes
    assert federations[40, "round"][exchange] == 2 * federations[20, "round"][exchange]


def _reply_bytes(replies) -> int:
    return sum(
        len(a.data) for m in replies for r in m.content.array_records.values() for a in r.values()
    )


@pytest.mark.parametrize("method", ["fedavg", "feddyn", "scaffold", "fedmgda", "cfl", "pfedgt"])
def test_what_an_aggregation_holds_is_within_its_terms(method, tmp_path, monkeypatch):
    """The replies' bytes plus the memory traced while the server aggregates them (a
    multi-exchange round: from the end of its exchange) stay within the method's terms, and
    the terms are not half as much again. The Gram matrix's float64
    chunk is made small, so that it is the stacked float32 updates that count, as at scale."""
    monkeypatch.setattr(mgda, "GRAM_CHUNK_VALUES", 1 << 14)
    import scipy.cluster.hierarchy  # noqa: F401  (CFL's split imports it: not a round's cost)

    extra = {  # CFL splits in round 1; pFedGT's round without its c⁰ exchange
        "cfl": {"cfl.warmup-rounds": 0, "cfl.eps-1": 10.0, "cfl.eps-2": 1e-9},
        "pfedgt": {"pfedgt.c-init": "zeros"},
    }.get(method, {})
    cfg = config(
        strategy=method, num_clients=40, num_rounds=1, fraction_train=1.0, model="mlp", **extra
    )
    strategy = build_strategy(cfg)
    measured: list[tuple[int, int]] = []  # (the replies' bytes, the peak traced after them)

    def traced(call, replies_of):
        def wrapped(*args, **kwargs):
            replies = replies_of(args)
            tracemalloc.start()
            try:
                return call(*args, **kwargs)
            finally:
                measured.append((_reply_bytes(replies), tracemalloc.get_traced_memory()[1]))
                tracemalloc.stop()

        return wrapped

    if method == "cfl":  # its aggregation follows the exchange within train_round
        train_round = strategy.train_round

        def round_traced(server_round, arrays, grid, send):
            def send_then_trace(*args, **kwargs):
                exchange = send(*args, **kwargs)
                measured.append((_reply_bytes(exchange.replies), 0))
                tracemalloc.start()
                return exchange

            try:
                return train_round(server_round, arrays, grid, send_then_trace)
            finally:
                replies, _ = measured.pop()
                measured.append((replies, tracemalloc.get_traced_memory()[1]))
                tracemalloc.stop()

        strategy.train_round = round_traced
    else:
        aggregate = strategy.aggregate_train

        def aggregate_traced(server_round, replies):
            replies = list(replies)
            return traced(aggregate, lambda args: replies)(server_round, replies)

        strategy.aggregate_train = aggregate_traced
    run_local(cfg, tmp_path, strategy=strategy)
    federation, terms = _terms(cfg)
    total = sum(t.nbytes for t in terms)
    ((replies, peak),) = measured
    held = replies + peak
    assert held <= total, (human_bytes(held), human_bytes(total))
    assert total <= 1.5 * held, (human_bytes(held), human_bytes(total))
