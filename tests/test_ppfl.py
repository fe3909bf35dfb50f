"""PPFL through the real ClientApp and strategy: the reductions, the blocks, the schedules.

The membership and Laplacian math is tested in test_population.py and the model forms in
test_canonical.py; here they are checked as the strategy and the solver use them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord
from helpers import config, grid_for, run_local, stored
from local_grid import LocalGrid
from torch.nn import functional as F

from pflarena.client.app import app as client_app
from pflarena.core import keys
from pflarena.core.config import ConfigError
from pflarena.core.datasets import to_tensors
from pflarena.core.federation import load_client
from pflarena.core.models import ModelShape
from pflarena.methods.ppfl import keys as ppfl_keys
from pflarena.methods.ppfl.population import affinity_from_histograms, exponentiated_gradient_step
from pflarena.methods.ppfl.strategy import PPFL
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy
from pflarena.server.checkpoint import load_checkpoint
from pflarena.server.loop import run_rounds
from pflarena.server.results import ResultsWriter, comparable_rounds, read_rounds


def _recording(strategy):
    """Keep the arrays the strategy returns each round (θ^{t+1}, or None for a C-block)."""
    seen: list = []
    original = strategy.train_round

    def train_round(server_round, arrays, grid, send):
        new, metrics = original(server_round, arrays, grid, send)
        seen.append(new)
        return new, metrics

    strategy.train_round = train_round
    return seen


def _numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


# --------------------------------------------------------------------------- reductions
@pytest.mark.parametrize(
    "schedule",
    [
        {"ppfl.schedule": "alternate", "ppfl.form": "interpolate"},
        {"ppfl.schedule": "theta-first", "ppfl.form": "mix", "ppfl.mix": "prob"},
        {"ppfl.schedule": "rbcd", "ppfl.theta-probability": 1.0, "ppfl.form": "mix",
         "ppfl.mix": "logit"},
    ],
    ids=["alternate-ppfl2", "theta-first-ppfl1-prob", "rbcd-ppfl1-logit"],
)  # fmt: skip
def test_one_canonical_model_without_laplacian_is_fedavg_round_by_round(tmp_path, schedule):
    """Spec check 10: K = 1, λ = 0 reproduces FedAvg: the same models every round, bit for
    bit (same seed, same batches, the same weighted average), and the same accuracies."""
    common = {"num_clients": 4, "num_rounds": 3, "lr": 0.05, "momentum": 0.5}
    fedavg_cfg = config(strategy="fedavg", **common)
    ppfl_cfg = config(
        strategy="ppfl",
        **common,
        **{"ppfl.num-canonical": 1, "ppfl.lambda": 0.0, "ppfl.affinity": "none", **schedule},
    )
    fedavg = build_strategy(fedavg_cfg)
    ppfl = build_strategy(ppfl_cfg)
    fedavg_models, ppfl_models = _recording(fedavg), _recording(ppfl)
    fedavg_run = run_local(fedavg_cfg, tmp_path / "fedavg", strategy=fedavg)
    ppfl_run = run_local(ppfl_cfg, tmp_path / "ppfl", strategy=ppfl)
    assert len(ppfl_models) == 3
    for fedavg_model, ppfl_model in zip(fedavg_models, ppfl_models, strict=True):
        expected, got = _numpy(fedavg_model), _numpy(ppfl_model)
        assert set(got) == {f"canonical.0.{name}" for name in expected}
        for name, value in expected.items():
            np.testing.assert_array_equal(got[f"canonical.0.{name}"], value)
    for a, b in zip(fedavg_run.rounds, ppfl_run.rounds, strict=True):
        expected, got = dict(a["evaluation"]["personalized"]), dict(b["evaluation"]["personalized"])
        # PPFL1's log-probabilities go through one more log-softmax in the evaluation
        assert got.pop("loss") == pytest.approx(expected.pop("loss"), rel=1e-6)
        assert got == expected  # the accuracies, exactly
    assert ppfl.memberships.tolist() == [[1.0]] * 4


def test_a_complete_graph_with_a_large_lambda_drives_memberships_to_consensus(tmp_path):
    """Spec check 10: W = 11ᵀ and a large λ pull every c_i to one common vector."""
    cfg = config(
        strategy="ppfl", num_clients=4, num_rounds=6,
        **{"ppfl.schedule": "rbcd", "ppfl.theta-probability": 0.0, "ppfl.affinity": "complete",
           "ppfl.lambda": 5.0, "ppfl.membership-lr": 0.05, "ppfl.scaling": "paper"},
    )  # fmt: skip
    strategy = build_strategy(cfg)
    strategy.memberships = np.random.default_rng(0).dirichlet(3 * np.ones(3), size=4)
    spread = [np.ptp(strategy.memberships, axis=0).max()]
    original = strategy.train_round

    def train_round(*args):
        out = original(*args)
        spread.append(np.ptp(strategy.memberships, axis=0).max())
        return out

    strategy.train_round = train_round
    run_local(cfg, tmp_path, strategy=strategy)
    assert spread[-1] < 0.05 * spread[0]
    assert all(b < a + 1e-12 for a, b in zip(spread, spread[1:], strict=False))


# --------------------------------------------------------------------------- the C-block
def test_a_membership_block_is_one_eg_step_on_the_clients_true_gradients(tmp_path):
    """Algorithm 1's C-block: θ stays, each c_i moves by Eq. 15 on G_i = ∇_c f_i + 2λ(LC)_i/p_i
    with ∇_c f_i the full training-set gradient (computed here by autograd of the literal
    PPFL2 model, Σ_k c_k θ_k), and the client stores the c_i the server computed."""
    cfg = config(
        strategy="ppfl", dataset="synthetic-mixture", num_clients=4, num_rounds=1,
        **{"ppfl.schedule": "rbcd", "ppfl.theta-probability": 0.0, "ppfl.affinity": "labels",
           "ppfl.lambda": 0.3, "ppfl.membership-lr": 2.0, "ppfl.form": "interpolate"},
    )  # fmt: skip
    strategy = build_strategy(cfg)
    start = np.random.default_rng(1).dirichlet(np.ones(3), size=4)
    strategy.memberships = start.copy()
    grid = grid_for(cfg)
    returned = _recording(strategy)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    assert returned == [None]  # the C-block leaves θ
    assert [e["name"] for e in outcome.rounds[1]["exchanges"]] == [
        "affinity", "membership-gradient", "membership",
    ]  # fmt: skip
    theta = strategy.stacked(initial_arrays(cfg))
    histograms, sizes, grads = [], [], []
    for client in range(4):
        data, info = load_client(cfg.federation_spec(), client)
        x, y = to_tensors(data.x_train, data.y_train, info)
        histograms.append(np.bincount(data.y_train, minlength=2))
        sizes.append(len(y))
        c = torch.tensor(start[client], requires_grad=True)
        weight = sum(
            c[k] * torch.from_numpy(theta[f"canonical.{k}.linear.weight"].numpy()).double()
            for k in range(3)
        )
        bias = sum(
            c[k] * torch.from_numpy(theta[f"canonical.{k}.linear.bias"].numpy()).double()
            for k in range(3)
        )
        F.cross_entropy(x.double() @ weight.T + bias, y).backward()
        grads.append(c.grad.numpy())
    w = affinity_from_histograms(np.array(histograms, dtype=float))
    laplacian_rows = 2 * 0.3 * (np.diag(w.sum(1)) - w) @ start
    p = np.array(sizes) / sum(sizes)
    expected = exponentiated_gradient_step(
        start, np.array(grads) + laplacian_rows / p[:, None], 2.0
    )
    np.testing.assert_allclose(strategy.memberships, expected, atol=1e-6)
    np.testing.assert_allclose(strategy.histograms, np.array(histograms))
    for node in grid.node_ids:
        client = strategy.client_ids[node]
        held = stored(grid.contexts[node], "ppfl/membership")
        np.testing.assert_array_equal(held["c"].numpy(), strategy.memberships[client])


def test_rbcd_draws_blocks_with_the_given_probability_and_each_block_moves_only_itself(tmp_path):
    cfg = config(
        strategy="ppfl", num_clients=3, num_rounds=12, eval_every=12,
        **{"ppfl.schedule": "rbcd", "ppfl.theta-probability": 0.5, "ppfl.affinity": "none"},
    )  # fmt: skip
    strategy = build_strategy(cfg)
    before: list[np.ndarray] = []
    original = strategy.train_round

    def train_round(*args):
        before.append(strategy.memberships.copy())
        return original(*args)

    strategy.train_round = train_round
    returned = _recording(strategy)
    outcome = run_local(cfg, tmp_path, strategy=strategy)
    blocks = [strategy.blocks[r] for r in range(1, 13)]
    assert {"theta", "membership"} == set(blocks)
    expected = np.random.default_rng([cfg.seed, 0x9F1]).random(12) < 0.5
    assert [b == "theta" for b in blocks] == expected.tolist()
    for r, block in enumerate(blocks):
        after = strategy.history[r + 1]
        if block == "theta":
            assert returned[r] is not None and np.array_equal(after, before[r])
            names = [e["name"] for e in outcome.rounds[r + 1]["exchanges"]]
            assert names == ["theta"]
        else:
            assert returned[r] is None and not np.array_equal(after, before[r])


# --------------------------------------------------------------------------- replies and config
def test_a_membership_off_the_simplex_is_rejected_and_changes_nothing(tmp_path):
    cfg = config(strategy="ppfl", num_clients=3, num_rounds=1,
                 **{"ppfl.schedule": "alternate", "ppfl.affinity": "none"})  # fmt: skip
    grid = grid_for(cfg)
    victim = grid.node_ids[2]

    def tamper(reply):
        if reply.metadata.src_node_id == victim and ppfl_keys.MEMBERSHIP in reply.content:
            reply.content[ppfl_keys.MEMBERSHIP] = ArrayRecord(
                {"c": Array(np.array([0.9, 0.9, -0.8]))}
            )
        return reply

    grid.reply_filter = tamper
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    assert outcome.rounds[1]["exchanges"][0]["failures"] == 1
    client = strategy.client_ids[victim]
    np.testing.assert_array_equal(strategy.memberships[client], np.full(3, 1 / 3))
    others = [strategy.client_ids[n] for n in grid.node_ids if n != victim]
    assert all(not np.allclose(strategy.memberships[c], 1 / 3) for c in others)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ppfl.schedule": "gossip"}, "ppfl.schedule"),
        ({"ppfl.num-canonical": 0}, "ppfl.num-canonical"),
        ({"ppfl.membership-lr": 0}, "ppfl.membership-lr"),
        ({"ppfl.schedule": "rbcd", "ppfl.membership-steps": "epoch"}, "membership-steps=epoch"),
        ({"ppfl.membership-floor": 0.01}, "ppfl.membership-floor"),
        ({"ppfl.theta-probability": 1.5}, "ppfl.theta-probability"),
        ({"ppfl.canonical-layers": 7}, "ppfl.canonical-layers=7"),
        (
            {"ppfl.form": "interpolate", "model": "resnet18", "dataset": "cifar10"},
            "holds buffers",
        ),
    ],
)
def test_bad_config_is_refused_with_the_key_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(strategy="ppfl", **overrides)


def test_the_strategy_needs_the_number_of_clients():
    with pytest.raises(ValueError, match="num_clients"):
        PPFL(model=ModelShape("logreg", (4,), 2))


# --------------------------------------------------------------------------- results
@pytest.mark.parametrize("eval_every", [1, 4])
def test_memberships_are_saved_and_pictured_and_a_killed_run_resumes_identically(
    tmp_path, eval_every
):
    """eval_every=4: rounds 1-3 fold their membership epoch into the next round's message,
    so the round-2 checkpoint the run resumes from holds a folded epoch."""
    cfg = config(strategy="ppfl", num_clients=4, num_rounds=4, eval_every=eval_every,
                 **{"ppfl.affinity": "labels", "ppfl.lambda": 0.01})  # fmt: skip

    def grid(state: str, base: int) -> LocalGrid:
        nodes = [
            {"partition-id": i, "num-partitions": 4, "state-dir": str(tmp_path / state)}
            for i in range(4)
        ]
        return LocalGrid(client_app, cfg.to_run_config(), 4, node_configs=nodes, node_id_base=base)

    def run(out, grid_, resume=False):
        checkpoint = load_checkpoint(out, cfg.strategy) if resume else None
        writer = ResultsWriter(out, resume_after=checkpoint.server_round if checkpoint else None)
        if not resume:
            writer.write_config({"run_config": cfg.to_run_config()})
        try:
            strategy = build_strategy(cfg, state_dir=out / "server-state")
            run_rounds(grid_, cfg, strategy, initial_arrays(cfg), writer, resume=checkpoint)
            return strategy
        finally:
            writer.close()

    whole = run(tmp_path / "whole", grid("state-whole", 1_000_003))
    written = whole.write_artifacts(tmp_path / "whole")
    assert [p.name for p in written] == ["memberships.csv", "memberships.png"]
    lines = (tmp_path / "whole" / "memberships.csv").read_text().splitlines()
    assert lines[0] == "round,client,c0,c1,c2" and len(lines) == 1 + 4 * 4
    summary = whole.run_summary()
    assert summary["schedule"] == "theta-first" and summary["objective_last"] is not None

    broken = grid("state-broken", 2_000_003)

    def die_in_round_three(reply):
        sent = broken.sent[-1]
        if sent.content[keys.CONFIG].get(keys.SERVER_ROUND) == 3:
            raise KeyboardInterrupt("killed in round 3")
        return reply

    broken.reply_filter = die_in_round_three
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "broken", broken)
    resumed = run(tmp_path / "broken", grid("state-broken", 3_000_017), resume=True)

    def comparable(path):
        return comparable_rounds(read_rounds(path))

    assert comparable(tmp_path / "broken" / "rounds.jsonl") == comparable(
        tmp_path / "whole" / "rounds.jsonl"
    )
    np.testing.assert_array_equal(resumed.memberships, whole.memberships)
    assert resumed.blocks == whole.blocks and resumed.objective == whole.objective
    assert sorted(resumed.history) == sorted(whole.history)
    for r in whole.history:
        np.testing.assert_array_equal(resumed.history[r], whole.history[r])
    phases = {m.content[keys.CONFIG].get(keys.PHASE) for m in broken.sent}
    assert (ppfl_keys.PHASE_STEPS in phases) == (eval_every == 1)


def test_a_folded_membership_epoch_gives_the_unfolded_run(tmp_path):
    """theta-first's membership epoch of round t carried by round t+1's message (rounds
    1-4 of a run evaluated only at its end) gives what its own exchange after round t gives
    (evaluated every round, never folded): the same θ, memberships, losses and objective
    every round, and the same final evaluation, with one exchange a round instead of two."""
    setting = dict(strategy="ppfl", num_clients=4, num_rounds=5, local_epochs=2,
                   **{"ppfl.affinity": "labels", "ppfl.lambda": 0.01,
                      "ppfl.membership-lr": 0.9})  # fmt: skip
    runs = {}
    for name, every in (("unfolded", 1), ("folded", 5)):
        cfg = config(eval_every=every, **setting)
        grid = grid_for(cfg)
        strategy = build_strategy(cfg)
        thetas = _recording(strategy)
        outcome = run_local(cfg, tmp_path / name, grid, strategy)
        phases = [m.content[keys.CONFIG].get(keys.PHASE) for m in grid.sent]
        runs[name] = (strategy, outcome, thetas, phases)
    (s1, o1, t1, p1), (s2, o2, t2, p2) = runs["unfolded"], runs["folded"]
    assert p1.count(ppfl_keys.PHASE_STEPS) == 4 * 5
    assert p2.count(ppfl_keys.PHASE_STEPS) == 4  # only the last round's
    assert not np.allclose(s1.memberships, 0.25)  # the memberships moved
    np.testing.assert_allclose(s2.memberships, s1.memberships, rtol=0, atol=1e-6)
    for r in s1.history:
        np.testing.assert_allclose(s2.history[r], s1.history[r], rtol=0, atol=1e-6)
    assert s2.objective == pytest.approx(s1.objective, rel=1e-6)
    assert len(t1) == len(t2) == 5
    for a, b in zip(t1, t2, strict=True):
        a, b = _numpy(a), _numpy(b)
        for name in a:
            np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-6, err_msg=name)
    last1 = [r for r in o1.rounds if r["round"] == 5][0]["evaluation"]["personalized"]
    last2 = [r for r in o2.rounds if r["round"] == 5][0]["evaluation"]["personalized"]
    assert last2["weighted"] == pytest.approx(last1["weighted"], abs=1e-9)
    assert last2["loss"] == pytest.approx(last1["loss"], rel=1e-6)


# --------------------------------------------------------------------------- recovery
@pytest.mark.slow  # about 30 s on an idle 2-core machine, 100 s under load
def test_memberships_recover_the_true_mixture_weights_and_the_objective_decreases(tmp_path):
    """``synthetic-mixture`` (fixed labels, K* = 3): p(y|x, i) = Σ_k α_ik σ(±x·θ_k*) is
    PPFL1's probability mixture (Eq. 7), so c_i should recover α_i. After 10 rounds of the
    default schedule on 40 clients, with the components matched to the truth by the
    Hungarian algorithm on Σ_i |c_ik − α_il|: the mean total variation ½‖c_i − α_i‖₁ is below
    0.2 (uniform memberships are at 0.42; measured 0.135), every nearly pure client
    (max α > 0.9) has its component as the argmax, and F(θ^t, C^t) falls round after round
    up to minibatch noise (docs/papers/ppfl.md §8, checks 5 and 8)."""
    from scipy.optimize import linear_sum_assignment

    from pflarena.core.federation import synthetic_mixture_truth

    cfg = config(
        strategy="ppfl", dataset="synthetic-mixture", num_clients=40, num_rounds=10,
        local_epochs=5, lr=0.3, eval_every=10, test_fraction=0.2,
        **{"ppfl.membership-lr": 2.0},
    )  # fmt: skip
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, strategy=strategy)
    _, alpha = synthetic_mixture_truth(cfg.federation_spec())
    learnt = strategy.memberships
    cost = np.abs(learnt[:, :, None] - alpha[:, None, :]).sum(axis=0)  # K × K*
    rows, cols = linear_sum_assignment(cost)
    aligned = np.zeros_like(alpha)
    aligned[:, cols] = learnt[:, rows]
    tv = 0.5 * np.abs(aligned - alpha).sum(axis=1)
    uniform = 0.5 * np.abs(1 / 3 - alpha).sum(axis=1)
    assert tv.mean() < 0.2 and uniform.mean() > 0.4, (tv.mean(), uniform.mean())
    pure = alpha.max(axis=1) > 0.9
    assert pure.sum() >= 5
    assert (aligned[pure].argmax(axis=1) == alpha[pure].argmax(axis=1)).all()
    objective = [strategy.objective[r] for r in range(1, 11)]
    assert all(b <= a + 0.01 for a, b in zip(objective, objective[1:], strict=False)), objective
    assert objective[-1] < 0.75 * objective[0]
    assert outcome.rounds[-1]["evaluation"]["personalized"]["mean"] > 0.75


def test_ppfl2_is_cross_evaluated_and_ppfl1_says_why_it_cannot_be(tmp_path):
    """PPFL2's personalized model is one model of the architecture, Σ_k c_ik θ_k: its own
    column of the cross-evaluation is the protocol's personalized accuracy. PPFL1 mixes K
    outputs and has none to export."""
    cfg = config(
        strategy="ppfl", num_clients=3, num_rounds=1, cross_eval_clients=3,
        **{"ppfl.form": "interpolate", "ppfl.affinity": "none"},
    )  # fmt: skip
    last = run_local(cfg, tmp_path / "ppfl2").rounds[-1]["evaluation"]
    cross = last["cross"]
    assert cross["failures"] == 0
    for owner, values in cross["per_owner"].items():
        assert values["local"] == pytest.approx(last["per_client"][owner]["personalized"])
    mixed = config(
        strategy="ppfl", num_clients=3, num_rounds=1, cross_eval_clients=1,
        **{"ppfl.form": "mix", "ppfl.affinity": "none"},
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="PPFL1"):
        run_local(mixed, tmp_path / "ppfl1")


# --------------------------------------------------------------------------- the authors' optimizer
def _canonical_person(form: str = "mix"):
    from pflarena.algorithms.canonical import (
        CanonicalModel,
        PersonalizedModel,
        initial_stacked_state,
    )
    from pflarena.core.models import build_model

    stacked = initial_stacked_state("logreg", (6,), 3, 7, 2, 0, "canonical")
    state = {k: torch.as_tensor(v) for k, v in stacked.items()}
    model = CanonicalModel(build_model("logreg", (6,), 3), state, "canonical")
    return PersonalizedModel(model, torch.tensor([0.3, 0.7]), form, "prob")


def _momentum_reference(person, x, y, generators, lr, momentum, weight_decay, batch_size):
    """SGD with momentum written out (v ← μ v + g + wd·w, w ← w − lr v), the gradients from
    autograd, one velocity carried through every call's batches."""
    from pflarena.core.training import batches

    params = list(person.model.shared_parameters())
    velocity = [torch.zeros_like(p) for p in params]
    for generator in generators:
        for idx in batches(len(y), batch_size, generator=generator):
            grads = torch.autograd.grad(person.loss(x[idx], y[idx]), params)
            with torch.no_grad():
                for p, g, v in zip(params, grads, velocity, strict=True):
                    v.mul_(momentum).add_(g + weight_decay * p)
                    p.sub_(lr * v)
    return [p.detach().clone() for p in params]


def test_persistent_momentum_continues_the_velocity_across_theta_blocks():
    """Two θ-blocks with the buffers carried equal one SGD-with-momentum run over both
    blocks' batches (the authors' clients keep their optimizer); fresh buffers do not."""
    from pflarena.methods.ppfl.solver import train_theta

    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(40, 6)), dtype=torch.float32)
    y = torch.as_tensor(rng.integers(0, 3, 40))
    settings = {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 8}
    seeds = (11, 12)
    reference = _momentum_reference(
        _canonical_person(),
        x,
        y,
        [torch.Generator().manual_seed(s) for s in seeds],
        **settings,
    )
    carried, fresh = _canonical_person(), _canonical_person()
    buffers: list[torch.Tensor] = []
    for seed in seeds:
        train_theta(
            carried, x, y, epochs=1, generator=torch.Generator().manual_seed(seed),
            momentum_buffers=buffers, **settings,
        )  # fmt: skip
        train_theta(
            fresh, x, y, epochs=1, generator=torch.Generator().manual_seed(seed), **settings
        )
    assert len(buffers) == len(reference)
    for got, want in zip(carried.model.shared_parameters(), reference, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)
    gap = max(
        float((got.detach() - want).abs().max())
        for got, want in zip(fresh.model.shared_parameters(), reference, strict=True)
    )
    assert gap > 1e-3


def test_the_run_schedule_scales_both_step_sizes():
    """PPFL's messages carry the run's schedule (lr-milestones, lr-gamma) on θ's step and
    on the membership step, the folded epoch's included."""
    cfg = config(
        strategy="ppfl",
        num_clients=3,
        lr=0.2,
        **{"lr-milestones": "2,4", "ppfl.membership-lr": 0.5},
    )
    strategy = build_strategy(cfg)
    for server_round, factor in ((1, 1.0), (2, 1.0), (3, 0.1), (5, 0.01)):
        sent = strategy._config(server_round, ppfl_keys.PHASE_THETA)
        assert sent[keys.LR] == pytest.approx(0.2 * factor)
        assert sent["ppfl.membership-lr"] == pytest.approx(0.5 * factor)
    with pytest.raises(ConfigError, match="it is now lr-milestones"):
        config(strategy="ppfl", **{"ppfl.lr-milestones": "10,20"})


def test_the_paper_presets_keep_momentum_and_decay_the_step_sizes():
    from pflarena.core.presets import load_preset
    from pflarena.server.build import parse_config

    for name in ("ppfl-synthetic", "ppfl-mnist"):
        cfg = parse_config(load_preset(name).overrides("ppfl") | {"strategy": "ppfl"})
        params = cfg.params(PPFL.declaration)
        assert cfg.momentum == 0.9 and params.persistent_momentum
        assert cfg.milestones() == (100, 150) and cfg.lr_gamma == 0.1


def test_a_run_with_persistent_momentum_stores_each_clients_buffers(tmp_path):
    cfg = config(
        strategy="ppfl",
        num_clients=3,
        num_rounds=2,
        momentum=0.9,
        **{"ppfl.persistent-momentum": True, "ppfl.num-canonical": 2},
    )
    grid = grid_for(cfg)
    run_local(cfg, tmp_path, grid=grid)
    assert len(grid.contexts) == 3
    for context in grid.contexts.values():
        record = stored(context, "ppfl/momentum")
        assert record is not None and len(record) > 0


def test_the_stored_momentum_round_trips_in_thetas_shapes_and_reads_the_old_layout():
    """The buffers are stored as one flat array and come back in θ's shapes, bit for bit;
    a record in the earlier one-array-per-buffer layout is still read (a resumed run), and
    a flat record of the wrong size is refused, naming both sizes."""
    from types import SimpleNamespace

    from pflarena.methods.ppfl import solver as solver

    person = _mixed_person("mlp", "prob")
    parameters = person.model.shared_parameters()
    buffers = [torch.randn_like(p) for p in parameters]
    job = SimpleNamespace(method="ppfl", device=torch.device("cpu"), state={})
    flat = torch.cat([b.reshape(-1) for b in buffers]).numpy()
    job.state["ppfl/momentum"] = ArrayRecord({solver.MOMENTUM_FLAT: Array(flat)})
    back = solver._stored_momentum(job, parameters)
    assert [b.shape for b in back] == [p.shape for p in parameters]
    assert all(torch.equal(a, b) for a, b in zip(back, buffers, strict=True))
    job.state["ppfl/momentum"] = ArrayRecord(
        {str(i): Array(b.numpy()) for i, b in enumerate(buffers)}
    )
    assert all(
        torch.equal(a, b)
        for a, b in zip(solver._stored_momentum(job, parameters), buffers, strict=True)
    )
    job.state["ppfl/momentum"] = ArrayRecord({solver.MOMENTUM_FLAT: Array(flat[:-1])})
    with pytest.raises(ValueError, match=f"{len(flat) - 1} values for θ of {len(flat)}"):
        solver._stored_momentum(job, parameters)
    assert solver._stored_momentum(SimpleNamespace(method="ppfl", state={}), parameters) == []


# --------------------------------------------------------------------------- per-copy outputs
def _mixed_person(model_name: str, mix: str, count: int = 3):
    from pflarena.algorithms.canonical import (
        CanonicalModel,
        PersonalizedModel,
        initial_stacked_state,
    )
    from pflarena.core.models import build_model

    stacked = initial_stacked_state(model_name, (6,), 4, 3, count, 0, "canonical")
    state = {k: torch.as_tensor(v) for k, v in stacked.items()}
    model = CanonicalModel(build_model(model_name, (6,), 4), state, "canonical")
    return PersonalizedModel(model, torch.full((count,), 1.0 / count), "mix", mix)


def _prob_steps_in_numpy(person, x, y, c, order, lr, weight, penalty, batch_size):
    """The membership epoch of PPFL1 with mix=prob written out in float64: p_k(y|x) from
    each copy's own forward pass, ∂/∂c_k of the batch's mean −log Σ_j c_j p_j(y|x) in closed
    form (−mean p_k / Σ_j c_j p_j), then the exponentiated-gradient step."""
    with torch.no_grad():
        p = np.stack(
            [
                F.softmax(person.model.output(k, x), dim=-1).double().numpy()[np.arange(len(y)), y]
                for k in range(person.model.count)
            ],
            axis=1,
        )
    for start in range(0, len(y), batch_size):
        idx = order[start : start + batch_size]
        grad = -(p[idx] / (p[idx] @ c)[:, None]).mean(axis=0)
        c = exponentiated_gradient_step(c, weight * grad + penalty, lr, 0.0)
    return c


@pytest.mark.parametrize("model_name", ["logreg", "mlp"])
@pytest.mark.parametrize("mix", ["prob", "logit", "loss"])
def test_the_membership_epoch_on_per_copy_outputs_equals_the_full_forward_passes(
    model_name, mix, monkeypatch
):
    """PPFL1's membership epoch computed on the copies' outputs (once) takes the steps the
    K forward passes per minibatch take; for mix=prob both equal the closed-form gradient's
    steps in float64."""
    from pflarena.methods.ppfl import solver as solver

    torch.manual_seed(0)
    x, y = torch.randn(50, 6), torch.randint(0, 4, (50,))
    c0 = np.array([0.2, 0.5, 0.3])
    penalty = np.array([0.01, -0.02, 0.0])
    args = dict(mode="epoch", lr=0.9, weight=1.0, penalty=penalty, batch_size=8, floor=0.0)
    person = _mixed_person(model_name, mix)
    assert solver.per_copy_outputs_apply(person)
    fast, fast_loss, fast_steps = solver.membership_steps(
        person, x, y, c0, generator=torch.Generator().manual_seed(3), **args
    )
    monkeypatch.setattr(solver, "per_copy_outputs_apply", lambda person: False)
    slow, slow_loss, slow_steps = solver.membership_steps(
        person, x, y, c0, generator=torch.Generator().manual_seed(3), **args
    )
    assert fast_steps == slow_steps == 7
    assert not np.allclose(fast, c0, atol=1e-3)  # the steps move c
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-6)
    assert fast_loss == pytest.approx(slow_loss, rel=1e-5)
    if mix == "prob":
        order = torch.randperm(50, generator=torch.Generator().manual_seed(3)).numpy()
        reference = _prob_steps_in_numpy(person, x, y, c0, order, 0.9, 1.0, penalty, 8)
        np.testing.assert_allclose(fast, reference, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mix", ["prob", "logit", "loss"])
def test_the_start_loss_from_the_copies_table_is_the_forward_pass_loss(mix):
    """f_i from the table the membership epoch computed equals the K forward passes'
    (training_loss), at a membership away from uniform; and for mix=prob the literal
    −mean log Σ_k c_k p_k(y|x) in float64."""
    from pflarena.methods.ppfl import solver as solver

    torch.manual_seed(1)
    x, y = torch.randn(70, 6), torch.randint(0, 4, (70,))
    c = np.array([0.1, 0.6, 0.3])
    person = _mixed_person("mlp", mix)
    person.membership = torch.as_tensor(c, dtype=torch.float32)
    table = solver.copy_log_likelihoods(person, x, y)
    got = solver.table_loss(table, y, c, mix)
    assert got == pytest.approx(solver.training_loss(person, x, y), rel=1e-5)
    if mix == "prob":
        with torch.no_grad():
            p = np.stack(
                [
                    F.softmax(person.model.output(k, x), dim=-1).double().numpy()[np.arange(70), y]
                    for k in range(3)
                ],
                axis=1,
            )
        assert got == pytest.approx(-np.log(p @ c).mean(), rel=1e-5)


def test_per_copy_outputs_are_not_used_where_they_would_change_the_result():
    """PPFL2 (one interpolated model) and models with dropout or batch normalization keep
    the forward passes."""
    from pflarena.methods.ppfl.solver import per_copy_outputs_apply

    assert not per_copy_outputs_apply(_canonical_person("interpolate"))
    person = _mixed_person("mlp", "prob")
    person.model.base.extra = torch.nn.Dropout(0.5)
    assert not per_copy_outputs_apply(person)
