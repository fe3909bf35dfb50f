"""FedPG: the round's math on hand-made replies, the client's gradient and P-model, real runs.

The server math itself (QP, fair column, drift closed form) is tested in test_mgda.py; here
it is checked as the strategy uses it: the update, γ_i, the stale window, the ablations,
S-FedPG's Armijo step, and that checkpoints carry the state a resume needs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord
from helpers import (
    comparable,
    config,
    die_in_round,
    grid_for,
    run_local,
    run_resumable,
    stateful_grid,
    stored,
)
from local_grid import LocalGrid
from torch.nn import functional as F

from pflarena.algorithms.mgda import fair_objective, fairness_weights
from pflarena.core import keys
from pflarena.core.config import ConfigError
from pflarena.core.datasets import to_tensors
from pflarena.core.federation import load_client
from pflarena.core.models import build_model
from pflarena.core.training import full_gradient, training_loss
from pflarena.methods.fedpg import keys as fedpg_keys
from pflarena.methods.fedpg.strategy import (
    FedPG,
    common_descent_direction,
    drift_coefficient,
    stale_window,
)
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy, parse_config
from pflarena.server.results import read_rounds
from pflarena.strategies.aggregation import flatten, unflatten

GRAD = fedpg_keys.GRADIENT
R = 6  # rounds of the shared run


def _client_tensors(cfg, client):
    data, info = load_client(cfg.federation_spec(), client)
    x, y = to_tensors(data.x_train, data.y_train, info)
    return x, y, info


def _model(cfg, info, arrays):
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes, seed=cfg.seed)
    model.load_state_dict({k: torch.from_numpy(arrays[k].numpy().copy()) for k in arrays.keys()})
    return model


def _strategy(**params) -> FedPG:
    return FedPG(trainable=["w"], num_clients=10, **params)


def _conflicting(seed=0, k=5, dim=40):
    rng = np.random.default_rng(seed)
    grads = rng.normal(size=(k, dim)) + 0.5  # mostly aligned ...
    grads[1] = -0.8 * grads[0] + 0.3 * rng.normal(size=dim)  # ... with one conflicting pair
    return grads, rng.uniform(0.5, 2.5, size=k)


# --------------------------------------------------------------------------- the math
def test_direction_is_the_mgda_direction_rescaled_and_sigma_is_its_factor():
    grads, losses = _conflicting()
    stale = np.random.default_rng(1).normal(size=(2, grads.shape[1]))
    d, weights, sigma = _strategy().common_direction(grads, losses, stale)
    reference, ref_weights = common_descent_direction(grads, losses=losses, stale_grads=stale)
    np.testing.assert_allclose(d, reference, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(weights, ref_weights, atol=1e-12)
    u = common_descent_direction(grads, losses=losses, stale_grads=stale, rescale="none")[0]
    assert sigma == pytest.approx(np.linalg.norm(d) / np.linalg.norm(u))
    assert (np.concatenate([grads, stale]) @ d > 0).all()  # a common descent direction


def test_gamma_keeps_every_other_online_client_descending_and_is_maximal():
    grads, losses = _conflicting(seed=3)
    strategy = _strategy()
    d, _, _ = strategy.common_direction(grads, losses, None)
    gammas = strategy.drift(grads, d, None)
    assert (gammas >= 0).all() and (gammas <= 1).all() and (gammas < 1).any()
    for i, gamma in enumerate(gammas):
        drifted = (1 - gamma) * d + gamma * grads[i]
        others = np.delete(grads, i, 0)
        assert (others @ drifted >= -1e-9).all()  # θ − η d_i harms no other client
        assert grads[i] @ drifted > 0  # and still descends for client i
        if gamma < 1:  # the largest such γ: a little more harms someone
            more = (1 - gamma - 1e-6) * d + (gamma + 1e-6) * grads[i]
            assert (others @ more < 0).any()
        assert gamma == pytest.approx(drift_coefficient(grads[i], d, others))


def test_a_gamma_floor_and_the_ablations_change_what_they_should():
    grads, losses = _conflicting(seed=4)
    stale = np.random.default_rng(2).normal(size=(3, grads.shape[1])) + 0.5
    d, weights, _ = _strategy().common_direction(grads, losses, stale)
    adaptive = _strategy().drift(grads, d, None)
    floored = _strategy(gamma="0.6").drift(grads, d, None)
    np.testing.assert_allclose(floored, np.maximum(adaptive, 0.6))
    assert (floored > adaptive).any()
    np.testing.assert_allclose(_strategy(gamma=1.0).drift(grads, d, None), 1.0)
    # M2: no fair column (weight 0, another direction)
    d2, w2, _ = _strategy(fairness=False).common_direction(grads, losses, stale)
    assert weights[5] > 0 and w2[5] == 0 and not np.allclose(d, d2)
    # M1: the FedSGD average of the norm-equalized gradients
    d1, w1, _ = _strategy(direction="average").common_direction(grads, losses, stale)
    norms = np.linalg.norm(grads, axis=1, keepdims=True)
    np.testing.assert_allclose(d1, (grads / norms * norms.mean()).mean(axis=0))
    np.testing.assert_allclose(w1[:5], 0.2)
    # §9.18: protecting the stale gradients too can only lower γ
    both = _strategy(drift_absent=True).drift(grads, d, stale)
    assert (both <= adaptive + 1e-12).all()
    for i, gamma in enumerate(both):
        assert (stale @ ((1 - gamma) * d + gamma * grads[i]) >= -1e-9).all()


def test_the_stale_window_is_m_over_s_rounds():
    # round 10: 10 clients seen, 2 online, so τ = 5 and clients last seen in rounds 5..9 count
    last_seen = {0: 10, 1: 10, 2: 9, 3: 7, 4: 5, 5: 4, 6: 1, 7: 9, 8: 6, 9: 3}
    tau, absent = stale_window(last_seen, [0, 1], 10)
    assert tau == 5 and absent == [2, 3, 4, 7, 8]
    tau, absent = stale_window(last_seen, [0, 1, 2, 3], 10)  # τ = ⌈10/4⌉ = 3: rounds 7..9
    assert tau == 3 and absent == [7]


def test_bad_config_is_refused_with_the_key_named():
    for value in ("big", 1.5, -0.1):
        with pytest.raises(ConfigError, match=r"fedpg\.gamma.*'adaptive' or a number"):
            parse_config({"strategy": "fedpg", "fedpg.gamma": value})
    with pytest.raises(ConfigError, match=r"fedpg\.grad-mode"):
        parse_config({"strategy": "fedpg", "fedpg.grad-mode": "exact"})
    with pytest.raises(ConfigError, match=r"momentum=0.9 set, but fedpg"):
        parse_config({"strategy": "fedpg", "momentum": 0.9})
    with pytest.raises(ValueError, match="gamma"):
        FedPG(gamma="sometimes")
    assert (
        parse_config({"strategy": "fedpg", "fedpg.gamma": 0.3}).params(FedPG.declaration).gamma
        == "0.3"
    )


# --------------------------------------------------------------------------- the solver
def test_the_solvers_gradient_is_the_full_training_set_gradient():
    cfg = config(strategy="fedpg")
    x, y, info = _client_tensors(cfg, 0)
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes, seed=cfg.seed)
    ours = full_gradient(model, x, y, batch_size=7)  # batches that do not divide N
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for mine, (_, param) in zip(ours, model.named_parameters(), strict=True):
        torch.testing.assert_close(mine, param.grad, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- rounds
def _gradient_replies(grid: LocalGrid, replace):
    """Replace each gradients reply's g_i and L_i by ``replace(client) -> (record, loss)``."""

    def swap(reply):
        if GRAD in reply.content.array_records:
            client = int(reply.content[keys.METRICS][keys.CLIENT_ID])
            record, loss = replace(client, reply.content[GRAD])
            reply.content[GRAD] = record
            reply.content[keys.METRICS][keys.TRAIN_LOSS] = loss
        return reply

    grid.reply_filter = swap


def test_the_global_update_is_theta_minus_eta_d_for_hand_made_gradients(tmp_path):
    """Two clients, no fair column: MGDA's closed form on norm-equalized gradients, rescaled
    to the norm of their mean, computed here by hand."""
    cfg = config(
        strategy="fedpg", num_clients=2, num_rounds=1, fraction_train=1.0, lr=0.5,
        **{"fedpg.fairness": False},
    )  # fmt: skip
    grid = grid_for(cfg)
    rng = np.random.default_rng(7)
    made: dict[int, dict[str, np.ndarray]] = {}

    def replace(client, real):
        made[client] = {n: rng.normal(size=real[n].numpy().shape).astype(np.float32) for n in real}
        if client == 1:  # conflicting with client 0 in part
            made[1] = {n: (-0.5 * made[0][n] + v).astype(np.float32) for n, v in made[1].items()}
        return ArrayRecord({n: Array(v) for n, v in made[client].items()}), 1.0 + client

    _gradient_replies(grid, replace)
    strategy = build_strategy(cfg)
    theta0 = initial_arrays(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    names = strategy.trainable
    g = [np.concatenate([made[c][n].astype(np.float64).ravel() for n in names]) for c in (0, 1)]
    mu = (np.linalg.norm(g[0]) + np.linalg.norm(g[1])) / 2
    s = [mu * v / np.linalg.norm(v) for v in g]
    lam = np.clip((s[1] - s[0]) @ s[1] / np.sum((s[0] - s[1]) ** 2), 0, 1)
    u = lam * s[0] + (1 - lam) * s[1]
    d = u * np.linalg.norm((s[0] + s[1]) / 2) / np.linalg.norm(u)
    expected = flatten(theta0, names) - 0.5 * d
    np.testing.assert_allclose(flatten(outcome.arrays, names), expected, rtol=1e-5, atol=1e-6)
    assert outcome.rounds[1]["train"]["server"]["step"] == 0.5
    assert strategy.weights[1]["online"] == pytest.approx({0: lam, 1: 1 - lam})


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """4 clients of digits, full participation, η_0 = 1 (full gradients), 6 rounds."""
    tmp = tmp_path_factory.mktemp("fedpg")
    cfg = config(strategy="fedpg", num_clients=4, num_rounds=R, fraction_train=1.0, lr=1.0)
    grid = grid_for(cfg)
    sent_theta: dict[int, ArrayRecord] = {}
    strategy = build_strategy(cfg, state_dir=tmp / "server-state")
    outcome = run_local(cfg, tmp, grid=grid, strategy=strategy)
    for msg in grid.sent:
        config_ = msg.content[keys.CONFIG]
        if config_.get(keys.PHASE) == fedpg_keys.PHASE_GRADIENTS:
            sent_theta[int(config_[keys.SERVER_ROUND])] = msg.content[keys.ARRAYS]
    sent_theta[R + 1] = outcome.arrays
    return cfg, grid, strategy, outcome, sent_theta, tmp


def test_fedpg_learns_on_digits_and_records_each_exchange(learned):
    cfg, _, strategy, outcome, _, _ = learned
    start = outcome.rounds[0]["evaluation"]
    end = outcome.rounds[-1]["evaluation"]
    assert end["personalized"]["mean"] > start["personalized"]["mean"] + 0.3
    assert end["global"]["mean"] > start["global"]["mean"] + 0.3
    model_bytes = sum(len(a.data) for a in initial_arrays(cfg).values())
    for record in outcome.rounds[1:]:
        first, second = record["exchanges"]
        assert (first["name"], second["name"]) == ("gradients", "personalize")
        assert first["sent"] == second["sent"] == 4 and record["train"]["failures"] == 0
        assert first["bytes_down"] == 4 * model_bytes  # θ^t
        assert (
            first["bytes_up"] == second["bytes_down"] == 4 * model_bytes
        )  # g_i; d (MLP: no buffers)
        assert second["bytes_up"] == 0
        server = record["train"]["server"]
        assert 0 <= server["min-gamma"] <= server["mean-gamma"] <= 1
        assert server["window-tau"] == 1 and server["window-stale"] == 0  # everyone online
    assert set(strategy.gammas) == set(range(1, R + 1))


def test_the_pool_holds_each_clients_true_gradient_at_theta(learned):
    cfg, _, strategy, _, sent_theta, _ = learned
    pool = strategy.pool("gradients")
    for client in range(4):
        x, y, info = _client_tensors(cfg, client)
        model = _model(cfg, info, sent_theta[R])  # every client's latest upload: round R
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        record = pool.get(client, GRAD)
        for name, param in model.named_parameters():
            np.testing.assert_allclose(record[name].numpy(), param.grad.numpy(), atol=2e-6)


def test_each_clients_p_model_is_the_drifted_step_from_theta_t(learned):
    cfg, grid, strategy, _, sent_theta, _ = learned
    theta3, theta4 = sent_theta[R], sent_theta[R + 1]
    eta = strategy.step_size(R)
    names = strategy.trainable
    d = (flatten(theta3, names) - flatten(theta4, names)) / eta
    for node, context in grid.contexts.items():
        client = strategy.client_ids[node]
        gamma = strategy.gammas[R][client]
        g = flatten(strategy.pool("gradients").get(client, GRAD), names)
        expected = flatten(theta3, names) - eta * ((1 - gamma) * d + gamma * g)
        personal = stored(context, "fedpg/personal-model")
        np.testing.assert_allclose(flatten(personal, names), expected, rtol=1e-4, atol=1e-5)


def test_checkpoint_and_artifacts(learned):
    cfg, _, strategy, _, _, tmp = learned
    arrays, meta = strategy.checkpoint_state()
    twin = build_strategy(cfg, state_dir=tmp / "server-state")
    twin.restore_state(arrays, meta)
    assert twin.gammas == strategy.gammas and twin.weights == strategy.weights
    assert twin.last_seen == strategy.last_seen == {c: R for c in range(4)}
    assert twin.held == strategy.held and twin.window == strategy.window
    summary = strategy.run_summary()
    assert summary["stale_window"]["max_gradients_held"] == 4
    assert summary["stale_window"]["max_bytes_held"] > 0
    files = strategy.write_artifacts(tmp / "artifacts")
    assert [f.name for f in files] == [
        "gammas.csv",
        "gammas.png",
        "qp-weights.csv",
        "qp-weights.png",
    ]
    assert len((tmp / "artifacts" / "gammas.csv").read_text().splitlines()) == 1 + R * 4
    assert all(f.stat().st_size > 0 for f in files)


def test_the_line_search_step_satisfies_armijo(tmp_path):
    cfg = config(
        strategy="fedpg", num_clients=3, num_rounds=1, fraction_train=1.0, lr=1.0,
        eval_every=10, **{"fedpg.line-search": True},
    )  # fmt: skip
    grid = grid_for(cfg)
    seen: dict[int, tuple[np.ndarray, float]] = {}
    strategy = build_strategy(cfg)

    def swap(reply):
        if GRAD in reply.content.array_records:
            client = int(reply.content[keys.METRICS][keys.CLIENT_ID])
            seen[client] = (
                flatten(reply.content[GRAD], strategy.trainable),
                float(reply.content[keys.METRICS][keys.TRAIN_LOSS]),
            )
        return reply

    grid.reply_filter = swap
    theta0 = initial_arrays(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    record = outcome.rounds[1]
    names = [e["name"] for e in record["exchanges"]]
    trials = int(record["train"]["server"]["line-search-trials"])
    assert names == [
        "gradients",
        *[f"line-search-{k}" for k in range(1, trials + 1)],
        "personalize",
    ]
    assert record["exchanges"][1]["bytes_down"] > 0 and record["exchanges"][2]["bytes_down"] == 0
    eta = record["train"]["server"]["step"]
    assert trials > 1  # 2^s η = 32 is far too long a step here
    assert record["train"]["server"]["line-search-fallback"] == 0
    assert eta == pytest.approx(2.0 ** (6 - trials))  # 2^s η_0, halved trials − 1 times
    names_ = strategy.trainable
    theta = flatten(theta0, names_)
    d = (theta - flatten(outcome.arrays, names_)) / eta

    def armijo(step):
        moved = ArrayRecord(
            {n: Array(v) for n, v in unflatten(theta - step * d, theta0, names_).items()}
        )
        old, new, slopes = [], [], []
        for client in range(3):
            x, y, info = _client_tensors(cfg, client)
            g, loss = seen[client]
            old.append(loss)
            new.append(training_loss(_model(cfg, info, moved), x, y))
            slopes.append(g @ d)
        old, new, slopes = map(np.array, (old, new, slopes))
        fair_slope = fairness_weights(old) @ slopes  # F' is checked where d descends it
        fair = fair_slope <= 0 or (
            fair_objective(new) <= fair_objective(old) - 1e-4 * step * fair_slope
        )
        return bool((new <= old - 1e-4 * step * slopes).all() and fair)

    assert armijo(eta * (1 - 1e-6)) or armijo(eta)
    assert not armijo(2 * eta)  # the previous trial failed: the accepted step is the largest


def test_without_personalization_there_is_one_exchange_and_p_equals_g(tmp_path):
    cfg = config(
        strategy="fedpg", num_clients=3, num_rounds=1, fraction_train=1.0, lr=1.0,
        **{"fedpg.personalize": False},
    )  # fmt: skip
    grid = grid_for(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid)
    record = outcome.rounds[1]
    assert [e["name"] for e in record["exchanges"]] == ["gradients"]
    evaluation = record["evaluation"]
    assert evaluation["personalized"] == evaluation["global"]
    for context in grid.contexts.values():
        assert stored(context, "fedpg/personal-model") is None
        assert stored(context, "fedpg/gradient") is None  # nothing kept on the client


def test_stale_gradients_age_out_and_a_killed_run_resumes_to_the_same_results(tmp_path):
    """1 of 4 clients a round: τ = M, absent clients' gradients join the QP while they are
    inside the window and are evicted after; a run killed in round 4 resumes identically."""
    cfg = config(
        strategy="fedpg", num_clients=4, num_rounds=5, fraction_train=0.25, lr=1.0,
        eval_every=10,
    )  # fmt: skip

    _, whole = run_resumable(
        cfg, tmp_path / "whole", stateful_grid(cfg, tmp_path / "state-whole", 1_000_003)
    )
    rounds = read_rounds(tmp_path / "whole" / "rounds.jsonl")
    # replay the window and the evictions from the sampled clients
    params = sum(a.numpy().size for a in initial_arrays(cfg).values())
    last_seen: dict[int, int] = {}
    held: set[int] = set()
    used = evicted = 0
    for record in rounds[1:]:
        t = record["round"]
        (online,) = record["train"]["sampled"]
        last_seen[online] = t
        held.add(online)
        tau, absent = stale_window(last_seen, [online], t)
        assert tau == len(last_seen)  # M / |S| with one client a round
        stale = [a for a in absent if a in held]
        assert sorted(whole.weights[t]["stale"]) == stale
        assert record["train"]["server"]["window-stale"] == len(stale)
        out = {c for c in held if c != online and last_seen[c] < t + 1 - tau}
        held -= out
        used, evicted = used + len(stale), evicted + len(out)
        assert record["train"]["server"]["window-bytes"] == 4 * params * len(held)
    assert whole.held == held and used > 0

    broken = stateful_grid(cfg, tmp_path / "state-broken", 2_000_003)
    die_in_round(broken, 4, phase=fedpg_keys.PHASE_PERSONALIZE)
    with pytest.raises(KeyboardInterrupt):
        run_resumable(cfg, tmp_path / "broken", broken)
    _, resumed = run_resumable(
        cfg,
        tmp_path / "broken",
        stateful_grid(cfg, tmp_path / "state-broken", 3_000_017),
        resume=True,
    )

    assert comparable(read_rounds(tmp_path / "broken" / "rounds.jsonl")) == comparable(
        read_rounds(tmp_path / "whole" / "rounds.jsonl")
    )
    assert resumed.weights == whole.weights and resumed.gammas == whole.gammas
    assert resumed.held == whole.held and resumed.last_seen == whole.last_seen


def test_a_lost_personalize_reply_leaves_no_p_model_and_is_charged_to_that_exchange(tmp_path):
    cfg = config(strategy="fedpg", num_clients=3, num_rounds=2, fraction_train=1.0, lr=1.0)
    grid = grid_for(cfg)
    victim = grid.node_ids[1]

    def lose(reply):
        sent = {m.metadata.message_id: m for m in grid.sent}.get(reply.metadata.reply_to_message_id)
        phase = sent.content[keys.CONFIG].get(keys.PHASE) if sent is not None else None
        if (
            phase == fedpg_keys.PHASE_PERSONALIZE
            and reply.metadata.src_node_id == victim
            and sent.content[keys.CONFIG][keys.SERVER_ROUND] == 2
        ):
            del reply.content[keys.METRICS]
        return reply

    grid.reply_filter = lose
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    first, second = outcome.rounds[1], outcome.rounds[2]
    assert [e["failures"] for e in first["exchanges"]] == [0, 0]
    assert [e["failures"] for e in second["exchanges"]] == [0, 1]
    assert second["train"]["failures"] == 1
    # the victim's round-2 P-model was not accepted: it holds its round-1 one
    context = grid.contexts[victim]
    client = strategy.client_ids[victim]
    [problem] = second["train"]["problems"]
    assert problem["client"] == client
    assert problem["exchange"] == second["exchanges"][1]["name"]
    assert "metrics" in problem["problem"]
    accepted = stored(context, "fedpg/personal-model", accepted=strategy.accepted[client])
    assert strategy.accepted[client] == 2 * 100 + 1  # its round-2 gradients reply
    others = [n for n in grid.node_ids if n != victim]
    assert all(strategy.accepted[strategy.client_ids[n]] == 2 * 100 + 2 for n in others)
    key, names = "fedpg/personal-model", strategy.trainable
    round_one = flatten(stored(context, key, accepted=1 * 100 + 2), names)
    np.testing.assert_array_equal(flatten(accepted, names), round_one)
    # the rejected write is gone (the next message rolled the client back) ...
    np.testing.assert_array_equal(flatten(stored(context, key), names), round_one)
    # ... while the clients whose reply was accepted moved on to their round-2 P-model
    other = grid.contexts[others[0]]
    assert not np.array_equal(
        flatten(stored(other, key), names), flatten(stored(other, key, accepted=102), names)
    )


# --------------------------------------------------------------------------- S-FedPG's bound
def _search_run(tmp_path, lower: str, unsafe_above: float):
    """One S-FedPG round on 3 clients with hand-made unit gradients whose centroid is far
    from their min-norm point, no fair column, and trial losses made here: a trial step above
    ``unsafe_above`` raises every client's loss by 1, any other leaves it level (so no step
    meets Armijo and the search ends at its lower bound)."""
    cfg = config(
        strategy="fedpg", num_clients=3, num_rounds=1, fraction_train=1.0, lr=1.0,
        eval_every=10,
        **{"fedpg.line-search": True, "fedpg.fairness": False, "fedpg.personalize": False,
           "fedpg.line-search-lower": lower},
    )  # fmt: skip
    grid = grid_for(cfg)
    strategy = build_strategy(cfg)
    names = strategy.trainable
    theta0 = initial_arrays(cfg)
    size = flatten(theta0, names).size
    a, b, c = np.zeros(size), np.zeros(size), np.zeros(size)
    a[:2], b[:2], c[1] = [1.0, 0.1], [-1.0, 0.1], 1.0
    made = [v / np.linalg.norm(v) for v in (a, b, c)]
    old = {0: 2.0, 1: 1.5, 2: 1.0}
    steps: list[float] = []

    def swap(reply):
        sent = {m.metadata.message_id: m for m in grid.sent}[reply.metadata.reply_to_message_id]
        phase = sent.content[keys.CONFIG].get(keys.PHASE)
        client = int(reply.content[keys.METRICS][keys.CLIENT_ID])
        if phase == fedpg_keys.PHASE_GRADIENTS:
            like = ArrayRecord({n: theta0[n] for n in names})
            vector = unflatten(made[client], like, names)
            reply.content[GRAD] = ArrayRecord(
                {n: Array(v.astype(np.float32)) for n, v in vector.items()}
            )
            reply.content[keys.METRICS][keys.TRAIN_LOSS] = old[client]
        elif phase == fedpg_keys.PHASE_LINE_SEARCH:
            step = float(sent.content[keys.CONFIG]["fedpg.step"])  # its run-config-style key
            if client == 0:
                steps.append(step)
            raised = old[client] + (1.0 if step > unsafe_above else 0.0)
            reply.content[keys.METRICS][fedpg_keys.TRIAL_LOSS] = raised
        return reply

    grid.reply_filter = swap
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    # computed apart: the min-norm point of the three is the midpoint of a and b (c only adds
    # to the second coordinate), d_r their mean, d = u‖d_r‖/‖u‖ and σ = ‖d_r‖/‖u‖
    u = (made[0] + made[1]) / 2
    mean = sum(made) / 3
    sigma = np.linalg.norm(mean) / np.linalg.norm(u)
    d = u * sigma
    return outcome, steps, sigma, d, flatten(theta0, names), names


@pytest.mark.parametrize("lower", ["times-sigma", "over-sigma"])
@pytest.mark.parametrize("unsafe_above", [3.0, 0.0])
def test_the_line_search_falls_back_at_its_lower_bound(tmp_path, lower, unsafe_above):
    """No trial meets Armijo: the trials halve from 2^s η down to the last one at or above
    the bound (1/2)^s η σ (paper) or (1/2)^s η / σ (``over-sigma``), and the round takes the
    largest tried step that raised no loss, else the smallest tried step."""
    outcome, steps, sigma, d, theta0, names = _search_run(tmp_path, lower, unsafe_above)
    assert sigma > 3  # far apart: the two bounds differ by σ² ≈ 16, four halvings
    eta, s = 1.0, 5
    bound = 0.5**s * eta * (sigma if lower == "times-sigma" else 1 / sigma)
    expected_steps = []
    trial = 2.0**s * eta
    while trial >= bound:
        expected_steps.append(trial)
        trial /= 2
    assert steps == expected_steps
    assert len(expected_steps) == (8 if lower == "times-sigma" else 13)
    server = outcome.rounds[1]["train"]["server"]
    assert server["line-search-fallback"] == 1
    assert server["line-search-trials"] == len(expected_steps)
    safe = [t for t in expected_steps if t <= unsafe_above]
    taken = max(safe) if safe else min(expected_steps)
    assert taken == (2.0 if unsafe_above == 3.0 else expected_steps[-1])
    assert server["step"] == pytest.approx(taken)
    np.testing.assert_allclose(
        flatten(outcome.arrays, names), theta0 - taken * d, rtol=1e-5, atol=1e-6
    )


# --------------------------------------------------------------------------- M4
def _m4_run(tmp_path, absent_clients: bool):
    cfg = config(
        strategy="fedpg", num_clients=4, num_rounds=4, fraction_train=0.25, lr=0.5,
        eval_every=10,
        **{"fedpg.fairness": False, "fedpg.personalize": False,
           "fedpg.absent-clients": absent_clients},
    )  # fmt: skip
    grid = grid_for(cfg)
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    sent = [
        m for m in grid.sent if m.content[keys.CONFIG].get(keys.PHASE) == fedpg_keys.PHASE_GRADIENTS
    ]
    return cfg, strategy, outcome, sent


@pytest.mark.parametrize("absent_clients", [False, True])
def test_m4_leaves_the_stale_gradients_out_of_the_direction(tmp_path, absent_clients):
    """One client a round, no fair column: without the absent clients (M4) the update is
    θ^{t+1} = θ^t − η^t g_t with g_t the online client's full training gradient at θ^t,
    computed here with torch; with them (the default) stale gradients join the QP and the
    update is another one."""
    cfg, strategy, outcome, sent = _m4_run(tmp_path, absent_clients)
    names = strategy.trainable
    thetas = [flatten(m.content[keys.ARRAYS], names) for m in sent] + [
        flatten(outcome.arrays, names)
    ]
    matches = []
    for t, msg in enumerate(sent, start=1):
        client = strategy.client_ids[msg.metadata.dst_node_id]
        x, y, info = _client_tensors(cfg, client)
        model = _model(cfg, info, msg.content[keys.ARRAYS])
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
        g = np.concatenate([p.grad.double().numpy().ravel() for _, p in model.named_parameters()])
        eta = outcome.rounds[t]["train"]["server"]["step"]
        matches.append(np.allclose(thetas[t], thetas[t - 1] - eta * g, rtol=1e-4, atol=1e-6))
        if not absent_clients:
            assert strategy.weights[t]["stale"] == {}
            assert outcome.rounds[t]["train"]["server"]["window-stale"] == 0
    assert matches[0]  # round 1: nobody is absent yet either way
    if absent_clients:
        stale_rounds = [t for t in strategy.weights if strategy.weights[t]["stale"]]
        assert stale_rounds
        assert not all(matches[t - 1] for t in stale_rounds)
    else:
        assert all(matches)


# --------------------------------------------------------------------------- dropout
def test_with_dropout_the_gradient_is_train_mode_and_the_loss_eval_mode():
    """docs/papers/fedpg.md §9.12 on a network with dropout: ``full_gradient`` (train mode,
    mini-batches, a fresh mask per batch) is an unbiased estimate of the expected train-mode
    full-batch gradient, estimated here apart from one-pass backward calls, and not the eval-mode
    gradient; ``training_loss`` is the deterministic eval-mode loss."""
    cfg = config(strategy="fedpg")
    x, y, _ = _client_tensors(cfg, 0)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(x[0].numel(), 32),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.8),
        torch.nn.Linear(32, 10),
    )

    def flat(grads) -> torch.Tensor:
        return torch.cat([g.reshape(-1) for g in grads]).double()

    runs = 120
    ours, apart = [], []
    for seed in range(runs):
        torch.manual_seed(seed)
        ours.append(flat(full_gradient(net, x, y, batch_size=64)))
        torch.manual_seed(10_000 + seed)
        net.train()
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        apart.append(flat(p.grad for p in net.parameters()))
    ours, apart = torch.stack(ours), torch.stack(apart)
    net.eval()
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    evaluated = flat(p.grad for p in net.parameters())
    varies = (ours.var(0) > 0) & (apart.var(0) > 0)
    assert int(varies.sum()) > 100  # the masks really change the gradient
    ours, apart, evaluated = ours[:, varies], apart[:, varies], evaluated[varies]
    z_apart = (ours.mean(0) - apart.mean(0)) / (ours.var(0) / runs + apart.var(0) / runs).sqrt()
    z_eval = (ours.mean(0) - evaluated) / (ours.var(0) / runs).sqrt()
    assert float(z_apart.pow(2).mean().sqrt()) < 1.5  # ≈ 1: the same expectation
    assert float(z_eval.pow(2).mean().sqrt()) > 3.0  # the eval-mode gradient is another one
    # the loss of the fair objective and of Armijo: eval mode, the same on every call
    with torch.no_grad():
        expected = float(F.cross_entropy(net(x), y))
    net.train()
    assert training_loss(net, x, y) == pytest.approx(expected, rel=1e-6)
    assert training_loss(net, x, y) == pytest.approx(expected, rel=1e-6)
