"""What a run's state takes on disk (``pflarena/server/build.py``: ``disk_estimate``): each
method's declared per-client state against what its clients really write, the versions the
clients hold against an exact enumeration of the rounds' samples, and a run refused at
``--check``, at its start and in a sweep when its state would not fit the free space."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from helpers import config, grid_for, run_local, stateful_grid

from pflarena.algorithms.ddpg import DDPGAgent, DDPGConfig, saved_bytes
from pflarena.cli.command import main
from pflarena.core import footprint
from pflarena.core.config import ConfigError
from pflarena.core.federation import load_server_data
from pflarena.core.footprint import DiskEstimate, Federation, Footprint, disk_used, stored_versions
from pflarena.server import build
from pflarena.server.app import main as serverapp_main
from pflarena.server.build import (
    CHECKPOINT_OVERHEAD,
    ENTRY_OVERHEAD,
    build_strategy,
    disk_estimate,
    federation_of,
    parse_config,
)
from pflarena.strategies import strategy_classes
from pflarena.strategies.base import CHECKPOINT_BYTES_PER_CLIENT

KB = 1024


def _config(method: str, **overrides):
    """A small digits run of ``method``, with the settings it needs (a validation split,
    server-held data) and without the ones it refuses (``local-epochs``)."""
    base = {"dataset": "digits", "alpha": 0.5, "lr": 0.1, "strategy": method}
    base |= {k.replace("_", "-"): v for k, v in overrides.items()}
    for extra in ({"local-epochs": 1}, {}):
        for needs in ({}, {"validation-fraction": 0.2}, {"server-fraction": 0.1}):
            try:
                return parse_config(base | extra | needs)
            except ConfigError:
                continue
    raise AssertionError(f"no small config of {method} parses")


def _declared(cfg) -> float:
    cls = strategy_classes()[cfg.strategy]
    return math.fsum(
        t.nbytes for t in cls.client_footprint(cfg.params(cls.declaration), federation_of(cfg))
    )


def _newest_versions(state_dir: Path) -> list[int]:
    """Each client's newest state version, in bytes (every entry's file)."""
    sizes = []
    for client in sorted(state_dir.glob("*/client-*")):
        versions = sorted(client.glob("v*"), key=lambda v: int(v.name[1:]))
        if versions:
            sizes.append(sum(f.stat().st_size for f in versions[-1].iterdir()))
    return sizes


# PAGE's server needs its own data, which run_local's strategy has (server-fraction); its
# clients' agent is checked apart below against a real agent.
STATEFUL = [
    m
    for m in sorted(strategy_classes())
    if m != "page" and _declared(_config(m, num_clients=4, num_rounds=2)) > 0
]


STATELESS = ["cfl", "fedavg", "fedavg-ft", "fedbabu", "fedmgda", "fedprox", "fedrecon"]
STATELESS += ["ifca", "perfedavg", "pfedhn"]


def test_the_methods_declare_state_or_are_known_to_keep_none():
    """A method (a new one too) is either stateful, declaring what its clients keep, or in
    :data:`STATELESS`, whose clients are checked below to write nothing."""
    assert set(STATEFUL) == set(strategy_classes()) - set(STATELESS) - {"page"}


@pytest.mark.parametrize("method", STATELESS)
def test_a_method_that_declares_no_state_writes_none(method, tmp_path):
    cfg = _config(method, num_clients=4, num_rounds=2, fraction_train=1.0)
    run_local(cfg, tmp_path, grid=stateful_grid(cfg, tmp_path / "state", 100))
    assert _newest_versions(tmp_path / "state") == []


@pytest.mark.parametrize(
    ("method", "overrides"),
    [(m, {}) for m in STATEFUL]
    + [
        ("ditto", {"state_precision": "float16"}),
        ("fedper", {"fedper.head-layers": 2}),
        ("fedavg", {"fedavg.personal-model": "local-result"}),
        ("fedmgda", {"fedmgda.personal-model": "local-result"}),
        ("ppfl", {"ppfl.persistent-momentum": True, "momentum": 0.9}),
        ("pfedgt", {"pfedgt.c-init": "zeros"}),
    ],
)
def test_a_clients_declared_state_is_what_it_writes(method, overrides, tmp_path):
    """Every client trained in both rounds: its newest version's files hold the declared
    bytes, plus each file's headers (about 260 bytes an array)."""
    cfg = _config(method, num_clients=4, num_rounds=2, fraction_train=1.0, **overrides)
    declared = _declared(cfg)
    assert declared > 0
    run_local(cfg, tmp_path, grid=stateful_grid(cfg, tmp_path / "state", 100))
    written = _newest_versions(tmp_path / "state")
    assert len(written) == 4
    for size in written:
        assert declared <= size <= 1.02 * declared + 4 * KB, (method, declared, written)


def test_a_cfl_checkpoint_holds_the_declared_cluster_and_one_model_per_split(tmp_path):
    """CFL's estimate counts one cluster and states what each split adds: with splits
    forced from round 1 (no warm-up, ε₁ above every mean update, ε₂ below every client's),
    the checkpoint holds the declared bytes and one model per split recorded."""
    cfg = _config("cfl", num_clients=6, num_rounds=2, fraction_train=1.0,
                  **{"cfl.warmup-rounds": 0, "cfl.eps-1": 10.0, "cfl.eps-2": 1e-9})  # fmt: skip
    cls = strategy_classes()["cfl"]
    federation = federation_of(cfg)
    (term,) = cls.checkpoint_footprint(cfg.params(cls.declaration), federation)
    assert term.nbytes == federation.model_bytes and "each split adds" in term.what
    arrays, _ = _checkpoint_parts(cfg, tmp_path)
    with np.load(tmp_path / "run-cfl" / "checkpoint.npz") as saved:
        clusters = {n.split(".")[1] for n in saved.files if n.startswith("global/cluster.")}
    assert len(clusters) >= 2  # it split
    assert arrays == term.nbytes + (len(clusters) - 1) * federation.model_bytes


def _checkpoint_parts(cfg, tmp_path) -> tuple[int, int]:
    """Run ``cfg`` (nodes with 19-digit ids, as Flower's are); its checkpoint's arrays'
    bytes and its JSON part's."""
    strategy = None
    if cfg.server_fraction > 0:  # PAGE's server agent learns on data of its own
        strategy = build_strategy(cfg, load_server_data(cfg.federation_spec()))
    grid = stateful_grid(cfg, tmp_path / "state", 10**18)
    run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    with np.load(tmp_path / f"run-{cfg.strategy}" / "checkpoint.npz") as saved:
        arrays = sum(saved[n].nbytes for n in saved.files if n not in ("header", "checksum"))
        return arrays, saved["header"].nbytes


@pytest.mark.parametrize(
    ("method", "overrides"),
    [(m, {}) for m in sorted(strategy_classes())]
    + [("ppfl", {"ppfl.canonical-layers": 1}), ("pfedsv", {"pfedsv.variant": "D+C"})],
)
def test_a_methods_declared_checkpoint_is_what_it_writes(method, overrides, tmp_path):
    """Every client trained in both rounds: the checkpoint's arrays are the declared bytes
    (PAGE's agent within a few hundred bytes: its counters and settings beside its
    networks, and no index lines, which the declaration counts as for a client's packed
    agent)."""
    extra = overrides | ({"server_fraction": 0.1} if method == "page" else {})
    cfg = _config(method, num_clients=6, num_rounds=2, fraction_train=1.0, **extra)
    cls = strategy_classes()[method]
    terms = cls.checkpoint_footprint(cfg.params(cls.declaration), federation_of(cfg))
    declared = math.fsum(t.nbytes for t in terms)
    arrays, _ = _checkpoint_parts(cfg, tmp_path)
    assert declared - 2 * KB <= arrays <= declared + 2 * KB, (method, declared, arrays, terms)


@pytest.mark.parametrize("method", ["fedavg", "ifca", "cfl", "fedpg"])
def test_a_checkpoints_records_are_about_what_is_declared(method, tmp_path):
    """The JSON part: the run's bookkeeping per client, and what IFCA, CFL and FedPG record
    per sampled client and round (declared for four-digit client ids: two-digit ones take
    a little less)."""
    cfg = _config(method, num_clients=40, num_rounds=3, fraction_train=0.5)
    cls = strategy_classes()[method]
    records = cls.checkpoint_records(cfg.params(cls.declaration), federation_of(cfg))
    _, header = _checkpoint_parts(cfg, tmp_path)
    assert 0.5 * records <= header <= records + KB, (method, records, header)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_an_agents_saved_bytes_are_what_it_saves(optimizer):
    """:func:`saved_bytes` against a real agent's packed arrays once it has stepped on as
    many transitions (PAGE's and Dap-FL's client agents: a box action of 2 from a state of 3)."""
    config = DDPGConfig(
        state_dim=3,
        action_dim=2,
        action_space="box",
        low=(1.0, -9.0),
        high=(5.0, -2.0),
        actor_hidden=(16, 16),
        critic_hidden=(16, 16),
        batch_size=2,
        optimizer=optimizer,
    )
    agent = DDPGAgent(config, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(7):
        state, next_state = rng.random(3), rng.random(3)
        agent.remember(state, agent.act(state, rng), float(rng.random()), next_state)
        agent.update(rng)
    saved = sum(int(a.nbytes) for a in agent.to_packed().values())
    assert saved_bytes(config, 7) == pytest.approx(saved, rel=0.02)
    assert saved_bytes(config, 10**9) > saved_bytes(config, 7)  # up to the buffer's capacity


@pytest.mark.parametrize(("rounds", "initial", "most"), [(3, 0, 2), (3, 1, 2), (4, 0, 3)])
def test_the_versions_held_are_the_samples_expectation(rounds, initial, most):
    """:func:`stored_versions` against an exact enumeration: every sequence of the rounds'
    samples (2 of 5 clients a round, each sample equally likely), each client holding
    min(times trained + initial, most) versions."""
    n, m = 5, 2
    samples = list(itertools.combinations(range(n), m))
    total = 0
    for sequence in itertools.product(samples, repeat=rounds):
        trained = [sum(c in s for s in sequence) for c in range(n)]
        total += sum(min(k + initial, most) for k in trained)
    exact = total / len(samples) ** rounds
    federation = Federation(n, m, rounds, model_bytes=1, model_params=1)
    assert stored_versions(federation, most, initial) == pytest.approx(exact, rel=1e-12)


def test_the_estimate_counts_the_versions_the_pools_and_the_checkpoint():
    """FedFomo: each client's two models in as many versions as the sampling predicts, the
    server's pool of each client's latest model, and the checkpoint (the model and the
    affinity matrix P, with the run's records) twice."""
    cfg = _config("fedfomo", num_clients=40, num_rounds=6, fraction_train=0.25)
    federation = federation_of(cfg)
    estimate = disk_estimate(cfg)
    client, pools, checkpoint = estimate.terms
    model = federation.model_bytes  # digits' MLP: float32 throughout
    entry = model + ENTRY_OVERHEAD  # each model one entry, one file
    assert client.nbytes == pytest.approx(stored_versions(federation, 2) * 2 * entry)
    assert pools.nbytes == pytest.approx(stored_versions(federation, 2) * entry)
    assert client.what.startswith("client state") and "its model and the round's" in client.what
    records = CHECKPOINT_BYTES_PER_CLIENT * 40
    assert checkpoint.nbytes == 2 * (model + 40 * 40 * 8 + records + 2 * CHECKPOINT_OVERHEAD)
    assert checkpoint.what.startswith("the checkpoint, twice") and "affinity" in checkpoint.what
    # a deployment's nodes keep the clients' state on their own disks
    assert disk_estimate(cfg, clients_here=False).terms == (pools, checkpoint)
    # float16 halves what the clients keep, not the server's pools
    half = disk_estimate(cfg.model_copy(update={"state_precision": "float16"}))
    versions = stored_versions(federation, 2)
    assert half.terms[0].nbytes == pytest.approx(versions * 2 * (model / 2 + ENTRY_OVERHEAD))
    assert half.terms[1].nbytes == pools.nbytes
    # checkpoints further apart: a third version (the last checkpoint's) at most
    every = disk_estimate(cfg.model_copy(update={"checkpoint_every": 3}))
    assert every.terms[0].nbytes == pytest.approx(stored_versions(federation, 3) * 2 * entry)


def test_disk_used_counts_a_hard_linked_file_once(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"1" * 100_000)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").hardlink_to(tmp_path / "a" / "x")
    once = disk_used(tmp_path / "a")
    assert 100_000 <= once < 120_000
    assert disk_used(tmp_path / "a", tmp_path / "b") == once
    assert disk_used(tmp_path / "missing") == 0
    assert disk_used(tmp_path / "a" / "x", tmp_path / "b") == once  # a file, and its link


def _small_disk(monkeypatch, free: int) -> None:
    real = footprint.disk_free
    monkeypatch.setattr(build, "disk_free", lambda directory: (real(directory)[0], free))


def test_check_states_the_estimate_and_a_run_too_large_is_refused(tmp_path, monkeypatch, capsys):
    """``run --check`` says what the state will take; a run whose estimate exceeds the free
    space is refused, with the numbers, before it writes anything; a stateless method is
    not."""
    out = tmp_path / "run"
    argv = ["run", "--dataset", "digits", "--partition", "iid", "--num-clients", "40"]
    argv += ["--num-rounds", "3", "--output-dir", str(out)]
    assert main([*argv, "--check", "--strategy", "ditto"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "state on disk, up to about" in err and "its personal model: 216 KB" in err, err
    _small_disk(monkeypatch, 100 * KB)
    assert main([*argv, "--strategy", "ditto"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "ditto cannot keep its state for 40 clients in" in err, err
    assert "more than the 100 KB free there" in err and 'state-precision = "float16"' in err
    assert not out.exists()
    # a method whose clients keep nothing still writes its checkpoint (the model, twice)
    assert main([*argv, "--strategy", "fedavg"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "fedavg cannot keep its state" in err and "the checkpoint, twice" in err, err
    assert not out.exists()
    _small_disk(monkeypatch, 10 * 1024 * KB)
    assert main([*argv, "--check", "--strategy", "fedavg"]) == 0


def test_a_resumed_runs_state_already_there_is_not_asked_for_again(tmp_path, monkeypatch):
    cfg = _config("ditto", num_clients=40, num_rounds=3, output_dir=str(tmp_path))
    estimate = disk_estimate(cfg)
    assert estimate.held == 0 and estimate.needed == estimate.total
    (tmp_path / "client-state").mkdir()
    (tmp_path / "client-state" / "v1.npz").write_bytes(b"0" * 200_000)
    (tmp_path / "checkpoint.npz").write_bytes(b"0" * 100_000)
    resumed = disk_estimate(cfg)
    assert resumed.held >= 300_000
    assert resumed.needed == pytest.approx(estimate.total - resumed.held)
    # refused on what is still needed: free space for that much passes
    build.check_disk_space([cfg], [resumed])
    _small_disk(monkeypatch, int(resumed.needed) - 1)
    with pytest.raises(ConfigError, match="of it there already"):
        build.check_disk_space([cfg], [resumed])


def test_a_sweeps_runs_on_one_disk_are_summed(tmp_path, monkeypatch):
    cfgs = [_config(m, num_clients=40, output_dir=str(tmp_path / m)) for m in ("ditto", "fedper")]
    estimates = [disk_estimate(c) for c in cfgs]
    both = sum(e.total for e in estimates)
    _small_disk(monkeypatch, int(both))
    build.check_disk_space(cfgs, estimates)
    _small_disk(monkeypatch, int(max(e.total for e in estimates)) + 1)  # each fits alone
    with pytest.raises(ConfigError, match="these 2 runs would keep up to about"):
        build.check_disk_space(cfgs, estimates)


def test_sweep_check_states_each_runs_disk_and_refuses_a_sweep_too_large(
    tmp_path, monkeypatch, capsys
):
    """``sweep --check`` lists each run to do with its estimate and their sum; a sweep whose
    runs would not fit together is refused after the listing, and nothing is written."""
    out = tmp_path / "sweep"
    argv = ["sweep", "--strategies", "fedavg,ditto", "--seeds", "0", "--num-clients", "40"]
    argv += ["--num-rounds", "3", "--out", str(out), "--check"]
    assert main(argv) == 0
    listed = capsys.readouterr().out.splitlines()
    rows = {line.split()[1]: line for line in listed if line.startswith("  new")}
    assert set(rows) == {"all/fedavg/seed-0", "all/ditto/seed-0"}
    assert all("state on disk up to about" in row for row in rows.values())
    assert listed[-1].startswith("state on disk, up to about ") and "2 run(s)" in listed[-1]
    _small_disk(monkeypatch, 100 * KB)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "all/ditto/seed-0" in captured.out
    assert "these 2 runs would keep up to about" in " ".join(captured.err.split())
    assert not out.exists()


def test_an_estimate_without_terms_refuses_nothing(tmp_path):
    empty = DiskEstimate((), tmp_path)
    assert str(empty) == "no per-client state" and empty.total == 0
    assert footprint.disk_problem("fedavg", 10, empty, 0) is None
    one = DiskEstimate((Footprint("x", 2 * KB),), tmp_path)
    assert footprint.disk_problem("m", 10, one, KB) is not None


def test_the_serverapp_refuses_pools_its_disk_cannot_hold(tmp_path, monkeypatch):
    """A deployment's ServerApp checks its own disk for the server's pools (FedFomo keeps a
    model per client), before it writes anything; the clients' state is their nodes'."""
    out = tmp_path / "run"
    cfg = _config("fedfomo", num_clients=40, output_dir=str(out))
    pools = disk_estimate(cfg, clients_here=False)
    assert [t.what.split(",")[0] for t in pools.terms] == ["the server's pools", "the checkpoint"]
    _small_disk(monkeypatch, int(pools.total) - 1)
    context = Context(1, 0, {}, RecordDict(), cfg.to_run_config())
    with pytest.raises(ConfigError, match="fedfomo cannot keep its state for 40 clients"):
        serverapp_main(grid_for(config(num_clients=2)), context)
    assert not out.exists()


def test_the_versions_of_a_long_run_are_every_clients_most():
    """Ten thousand rounds (whose binomial coefficients no float holds): every client has
    trained often enough to hold its most."""
    federation = Federation(100, 10, 10_000, model_bytes=1, model_params=1)
    assert stored_versions(federation, 2) == pytest.approx(200)
    assert stored_versions(Federation(100, 10, 0, 1, 1), 2, initial=1) == pytest.approx(100)
