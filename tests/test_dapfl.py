"""Dap-FL: the aggregation weights, the clients' state, reward, actions and agents, checked
independently.

The pure pieces are compared with independent computations (fractions by hand, scikit-learn's
F1, the reward formula written out). One short in-process run on ``synthetic`` (logistic
regression) goes through the real ClientApp and strategy; every quantity is then recomputed
from what crossed the wire with numpy alone: each client's state (loss, accuracy, F1 of W(t)
on its training split), the reward of its previous action, its first-round random action,
its agent kept in its own state, and W(t+1) = Σ p_i ŵ_i(t) with p_i = n_i / Σ n_j.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import sklearn.metrics
from flwr.app import MessageType
from helpers import config, grid_for, run_local, stored
from local_grid import LocalGrid

from pflarena.algorithms.ddpg import DDPGAgent, DDPGConfig
from pflarena.core import keys
from pflarena.core.config import ConfigError
from pflarena.core.federation import load_client
from pflarena.core.seeds import AGENT_SEED_BITS, derive_seed
from pflarena.methods.dapfl import keys as dapfl_keys
from pflarena.methods.dapfl.solver import AGENT_KEY, f1_score, improvement_reward
from pflarena.methods.dapfl.strategy import DapFL, contribution_weights
from pflarena.server.build import parse_config

ROUNDS = 4
MAX_EPOCHS = 4
SETTING = {
    "strategy": "dapfl",
    "dataset": "synthetic",
    "num_clients": 4,
    "num_rounds": ROUNDS,
    "test_fraction": 0.3,
    "fraction_train": 1.0,
    "dapfl.max-epochs": MAX_EPOCHS,
    "dapfl.min-lr": 0.01,
    "dapfl.max-lr": 0.5,
}


# --------------------------------------------------------------------------- aggregation
def test_the_weights_are_each_uploads_share_of_the_examples_or_of_the_work():
    examples = [30, 10, 60, 20]
    epochs = [1, 5, 2, 3]
    by_examples = [Fraction(n, sum(examples)) for n in examples]
    work = [n * a for n, a in zip(examples, epochs, strict=True)]
    by_work = [Fraction(w, sum(work)) for w in work]
    for rule, expected in (
        ("examples", by_examples),
        ("work", by_work),
        ("uniform", [Fraction(1, 4)] * 4),
    ):
        weights = contribution_weights(np.array(examples), np.array(epochs), rule)
        np.testing.assert_allclose(weights, [float(f) for f in expected], rtol=1e-15)
        assert weights.sum() == pytest.approx(1.0, abs=1e-15) and np.all(weights > 0)
    # ordering: more examples, more weight; with 'work' the epochs count as well
    weights = contribution_weights(np.array(examples), np.array(epochs), "examples")
    assert list(np.argsort(weights)) == [1, 3, 0, 2]
    weights = contribution_weights(np.array(examples), np.array(epochs), "work")
    assert list(np.argsort(weights)) == [0, 1, 3, 2]  # 30, 50, 60, 120 example-epochs


@pytest.mark.parametrize(
    "examples, epochs, rule, message",
    [
        ([1, 2], [1], "examples", "one count and one epoch"),
        ([1, 0], [1, 1], "examples", "examples must be finite and > 0"),
        ([1, 2], [1, math.nan], "work", "epochs must be finite and > 0"),
        ([1, 2], [1, 1], "size", "weighting must be"),
    ],
)
def test_bad_inputs_to_the_weights_are_named(examples, epochs, rule, message):
    with pytest.raises(ValueError, match=message):
        contribution_weights(np.array(examples, float), np.array(epochs, float), rule)


# --------------------------------------------------------------------------- client pieces
@pytest.mark.parametrize("average", ["micro", "macro"])
def test_the_f1_score_is_scikit_learns(average):
    rng = np.random.default_rng(3)
    for _ in range(20):
        target = rng.integers(0, 6, 50)
        predicted = np.where(rng.random(50) < 0.6, target, rng.integers(0, 7, 50))
        assert f1_score(predicted, target, average) == pytest.approx(
            sklearn.metrics.f1_score(target, predicted, average=average), abs=1e-12
        )
    assert f1_score(predicted, target, "micro") == pytest.approx(np.mean(predicted == target))


def test_the_reward_is_the_weighted_improvement_and_bounded():
    previous = np.array([1.3, 0.40, 0.35])
    current = np.array([0.9, 0.55, 0.52])
    reward, clipped = improvement_reward(previous, current, (2.0, 3.0, 5.0), 1.0)
    assert reward == pytest.approx(2.0 * 0.4 + 3.0 * 0.15 + 5.0 * 0.17) and not clipped
    # a large loss change is clipped to ±c; c = 0 leaves it as it is (the authors' code)
    rng = np.random.default_rng(0)
    xi, c = (1.0, 1.0, 1.0), 0.5
    for _ in range(200):
        previous, current = rng.uniform(0, 1, 3), rng.uniform(0, 1, 3)
        previous[0], current[0] = rng.exponential(20.0, 2)  # losses far apart
        reward, clipped = improvement_reward(previous, current, xi, c)
        assert abs(reward) <= c + 2.0 + 1e-12
        assert clipped == (abs(previous[0] - current[0]) > c)
        unbounded, flag = improvement_reward(previous, current, xi, 0.0)
        assert unbounded == pytest.approx(
            (previous[0] - current[0]) + (current[1] - previous[1]) + (current[2] - previous[2])
        )
        assert not flag
    with pytest.raises(ValueError, match="finite"):
        improvement_reward(np.array([math.inf, 0, 0]), current)
    with pytest.raises(ValueError, match="loss, accuracy, F1"):
        improvement_reward(np.array([1.0, 0.5]), current)


def test_a_pending_step_takes_the_reward_known_with_the_next_state():
    agent = DDPGAgent(DDPGConfig(state_dim=3, action_dim=2), seed=0)
    agent.set_pending([1.0, 0.5, 0.5], [0.2, 0.7], 0.0)
    assert agent.complete([0.8, 0.6, 0.6], reward=0.3)
    assert agent.buffer.rewards[0] == pytest.approx(0.3)
    agent.set_pending([1.0, 0.5, 0.5], [0.2, 0.7], 0.25)
    assert agent.complete([0.8, 0.6, 0.6])  # no reward given: the pending one (PAGE)
    assert agent.buffer.rewards[1] == pytest.approx(0.25)


# --------------------------------------------------------------------------- a real run
def _logits(record, x: np.ndarray) -> np.ndarray:
    w = record["linear.weight"].numpy().astype(np.float64)
    b = record["linear.bias"].numpy().astype(np.float64)
    return x.astype(np.float64) @ w.T + b


def np_state(record, x, y) -> np.ndarray:
    """(mean cross-entropy, accuracy, micro F1 = accuracy) by numpy."""
    z = _logits(record, x)
    z = z - z.max(axis=1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    accuracy = float(np.mean(np.argmax(z, axis=1) == y))
    return np.array([-np.mean(log_probs[np.arange(len(y)), y]), accuracy, accuracy])


class Capture:
    """The train messages and replies of a run, by round and client."""

    def __init__(self, grid: LocalGrid) -> None:
        self.grid = grid
        self.sent: dict[int, object] = {}
        self.replies: dict[int, dict[int, tuple]] = {}
        grid.reply_filter = self

    def __call__(self, reply):
        msg = self.grid.sent[-1]
        if msg.metadata.message_type == MessageType.TRAIN and not reply.has_error():
            t = int(msg.content[keys.CONFIG][keys.SERVER_ROUND])
            metrics = reply.content[keys.METRICS]
            self.sent[t] = msg.content[keys.ARRAYS]
            self.replies.setdefault(t, {})[int(metrics[keys.CLIENT_ID])] = (
                reply.content[keys.ARRAYS],
                dict(metrics),
            )
        return reply


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    cfg = config(**SETTING)
    grid = grid_for(cfg)
    capture = Capture(grid)
    outcome = run_local(cfg, tmp_path_factory.mktemp("dapfl"), grid)
    return cfg, capture, grid, outcome


def test_the_global_model_is_the_example_weighted_sum_of_the_uploads(played):
    _, capture, _, _ = played
    for t in range(1, ROUNDS):
        uploads = capture.replies[t]
        clients = sorted(uploads)
        n = np.array([uploads[c][1][keys.NUM_EXAMPLES] for c in clients], dtype=np.float64)
        p = n / n.sum()
        for name in ("linear.weight", "linear.bias"):
            expected = sum(
                p[k] * uploads[c][0][name].numpy().astype(np.float64) for k, c in enumerate(clients)
            )
            np.testing.assert_allclose(capture.sent[t + 1][name].numpy(), expected, atol=1e-6)


def test_the_clients_state_reward_and_actions(played):
    cfg, capture, _, _ = played
    spec = cfg.federation_spec()
    log_lr = (math.log(0.01), math.log(0.5))
    for c in range(cfg.num_clients):
        data, _ = load_client(spec, c)
        u = np.random.default_rng(
            derive_seed(cfg.seed, c, 1, "dapfl-client", bits=AGENT_SEED_BITS)
        ).uniform(0, 1, 2)
        first = capture.replies[1][c][1]
        assert first[dapfl_keys.EPOCHS] == round(1 + u[0] * (MAX_EPOCHS - 1))  # random
        assert first[dapfl_keys.LR] == pytest.approx(
            math.exp(log_lr[0] + u[1] * (log_lr[1] - log_lr[0]))
        )
        assert dapfl_keys.REWARD not in first  # nothing to reward yet
        states = []
        for t in range(1, ROUNDS + 1):
            metrics = capture.replies[t][c][1]
            state = np_state(capture.sent[t], data.x_train, data.y_train)
            played_state = [
                metrics[dapfl_keys.STATE_LOSS],
                metrics[dapfl_keys.STATE_ACCURACY],
                metrics[dapfl_keys.STATE_F1],
            ]
            np.testing.assert_allclose(played_state, state, rtol=1e-4, atol=1e-6)
            states.append(state)
            assert metrics[dapfl_keys.EPOCHS] in range(1, MAX_EPOCHS + 1)
            assert 0.01 <= metrics[dapfl_keys.LR] <= 0.5
            assert metrics[dapfl_keys.SGD_TIME] >= 0
            # the agent updates from its second action on (a critic loss with each update)
            assert (dapfl_keys.CRITIC_LOSS in metrics) == (t > 1)
            if t > 1:
                previous = states[-2]
                change = float(np.clip(previous[0] - state[0], -1.0, 1.0))
                expected = change + (state[1] - previous[1]) + (state[2] - previous[2])
                assert metrics[dapfl_keys.REWARD] == pytest.approx(expected, abs=1e-4)


def test_each_client_keeps_its_agent_in_its_own_state(played):
    cfg, capture, grid, _ = played
    for context in grid.contexts.values():
        record = stored(context, AGENT_KEY)
        agent = DDPGAgent.from_arrays({k: record[k].numpy() for k in record.keys()})
        c = int(context.node_config["partition-id"])
        assert agent.steps == ROUNDS and agent.updates == ROUNDS - 1
        replies = [capture.replies[t][c][1] for t in range(1, ROUNDS + 1)]
        states = [
            [m[dapfl_keys.STATE_LOSS], m[dapfl_keys.STATE_ACCURACY], m[dapfl_keys.STATE_F1]]
            for m in replies
        ]
        np.testing.assert_allclose(agent.buffer.states[: ROUNDS - 1], states[:-1], 1e-6)
        np.testing.assert_allclose(agent.buffer.next_states[: ROUNDS - 1], states[1:], 1e-6)
        rewards = [m[dapfl_keys.REWARD] for m in replies[1:]]
        np.testing.assert_allclose(agent.buffer.rewards[: ROUNDS - 1], rewards, rtol=1e-5)
        # the stored action is u in [0, 1]² (before rounding): it maps to the epochs played
        for t in range(1, ROUNDS):
            epochs = 1 + agent.buffer.actions[t - 1, 0] * (MAX_EPOCHS - 1)
            assert round(float(epochs)) == replies[t - 1][dapfl_keys.EPOCHS]
        assert agent.pending is not None  # the last action waits for its reward
    for t in capture.replies:  # the agents never left their clients
        for upload, _ in capture.replies[t].values():
            assert list(upload.keys()) == ["linear.weight", "linear.bias"]


def test_the_run_reports_the_round_and_learns(played):
    _, _, _, outcome = played
    server = outcome.rounds[-1]["train"]["server"]
    assert server["max-weight"] < 1 and 0 < server["weight-entropy-ratio"] <= 1
    assert 1 <= server["mean-epochs"] <= MAX_EPOCHS and 0.01 <= server["mean-lr"] <= 0.5
    assert "client-reward" in server
    first = outcome.rounds[0]["evaluation"]["personalized"]["mean"]
    assert outcome.rounds[-1]["evaluation"]["personalized"]["mean"] > first + 0.1


# --------------------------------------------------------------------------- settings
def test_bad_settings_are_refused_and_named():
    with pytest.raises(ConfigError, match="dapfl.min-lr"):
        parse_config({"strategy": "dapfl", "dapfl.min-lr": 0.5, "dapfl.max-lr": 0.1})
    with pytest.raises(ConfigError, match="dapfl.min-epochs"):
        parse_config({"strategy": "dapfl", "dapfl.min-epochs": 9, "dapfl.max-epochs": 2})
    with pytest.raises(ConfigError, match="all 0"):
        parse_config(
            {
                "strategy": "dapfl",
                "dapfl.loss-weight": 0.0,
                "dapfl.accuracy-weight": 0.0,
                "dapfl.f1-weight": 0.0,
            }
        )
    with pytest.raises(ValueError, match="dapfl.min-lr"):
        DapFL(min_lr=0.5, max_lr=0.1)
