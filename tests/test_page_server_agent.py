"""PAGE's server agent: the absorbing vertex of a softmax actor on Adam, the options that keep
the weights inside the simplex, and the per-round check of what its critic knows.

* On an uninformative critic (rewards independent of the action) a softmax actor on Adam
  walks to a vertex of the simplex and stays there (the policy gradient μ ⊙ (g − ⟨μ, g⟩)
  vanishes at a vertex, Adam's normalized step does not), while plain SGD at the same
  rate stays at the uniform point: the mechanism of the earlier default's collapse.
* The reward's gradient in p (autograd through W = Σ p_i ŵ_i) matches finite differences.
* The optimizers and the critic cosine reach the run as configured.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import config
from test_page import page_config, page_run

from pflarena.algorithms.ddpg import DDPGAgent, DDPGConfig
from pflarena.core.config import ConfigError
from pflarena.methods.page.strategy import aggregate_loss_gradient, tangent_cosine
from pflarena.server.results import read_rounds

N = 20


def _simplex_agent(optimizer: str) -> DDPGAgent:
    """A server-like agent at Table 7's Synthetic rates (the DDPGConfig defaults)."""
    cfg = DDPGConfig(
        state_dim=N,
        action_dim=N,
        action_space="simplex",
        actor_hidden=(64, 64),
        critic_hidden=(64, 64),
        optimizer=optimizer,
    )
    return DDPGAgent(cfg, seed=0)


def _uninformed_play(agent: DDPGAgent, steps: int, seed: int = 0) -> list[float]:
    """``steps`` rounds of act / update with a reward drawn independently of the action
    (the critic can learn nothing about the action); the policy's largest weight after
    each."""
    rng = np.random.default_rng(seed)
    state = rng.uniform(0.5, 0.6, N)
    largest = []
    for _ in range(steps):
        agent.complete(state)
        agent.update(rng)
        action = agent.act(state, rng)
        agent.set_pending(state, action, float(rng.normal(1.0, 0.1)))
        state = rng.uniform(0.5, 0.6, N)
        largest.append(float(agent.policy(state).max()))
    return largest


def test_adam_on_an_uninformed_critic_reaches_a_vertex_and_never_returns_and_sgd_does_not():
    """The mechanism of the earlier default's collapse: Adam's step has the size of its
    learning rate whatever the gradient's, so an uninformed critic's noise moves the logits
    a full step each update and the softmax saturates (measured here: 0.96 after 70
    updates); at a vertex the softmax's gradient μ ⊙ (g − ⟨μ, g⟩) is tiny in size but not
    in sign, which Adam's normalized step still follows, so the policy stays among the
    vertices (here it hops once from one client's vertex to another's, through 0.51) and
    never returns to the interior. Plain SGD scales the same noise by μ_i ≈ 1/N and stays
    at the uniform 1/N."""
    adam = _uninformed_play(_simplex_agent("adam"), 300)
    sgd = _uninformed_play(_simplex_agent("sgd"), 300)
    print(f"largest weight: adam {adam[99]:.3f} → {adam[-1]:.3f}, sgd {max(sgd):.4f}")
    assert adam[99] > 0.99
    assert min(adam[100:]) > 0.5  # never back inside
    assert np.mean(np.array(adam[100:]) > 0.95) > 0.8  # on a vertex nearly every update
    assert max(sgd) < 1.5 / N


def test_the_critics_action_gradient_is_its_derivative():
    """``action_gradient`` against central differences of the critic (in float64)."""
    import copy

    agent = _simplex_agent("adam")
    rng = np.random.default_rng(0)
    state, action = rng.uniform(0, 1, N), rng.dirichlet(np.full(N, 50.0))
    grad = agent.action_gradient(state, action)
    critic = copy.deepcopy(agent.critic).double()
    eps = 1e-6
    for i in (0, 7, 13):
        up, down = action.copy(), action.copy()
        up[i] += eps
        down[i] -= eps
        with torch.no_grad():
            q = [
                float(critic(torch.tensor(state[None]), torch.tensor(a[None]))) for a in (up, down)
            ]
        assert grad[i] == pytest.approx((q[0] - q[1]) / (2 * eps), rel=1e-3, abs=1e-7)


def test_the_loss_gradient_in_the_weights_matches_finite_differences():
    """∂F/∂p of F(p) = mean cross-entropy of Σ p_i ŵ_i (a logistic model), by autograd,
    against central differences of the aggregate evaluated directly."""
    from flwr.app import ArrayRecord

    from pflarena.core.models import build_model
    from pflarena.core.training import evaluate
    from pflarena.strategies.aggregation import weighted_combination

    torch.manual_seed(0)
    model = build_model("logreg", (5,), 3, seed=0)
    records = []
    for i in range(4):
        m = build_model("logreg", (5,), 3, seed=i + 1)
        records.append(ArrayRecord(m.state_dict()))
    x = torch.randn(300, 5)
    y = torch.randint(0, 3, (300,))
    p = np.array([0.1, 0.2, 0.3, 0.4])
    grad = aggregate_loss_gradient(model, records, p, x, y, batch_size=128)

    def loss(q):
        model.load_state_dict(weighted_combination(records, q).to_torch_state_dict())
        return evaluate(model, x, y).loss

    eps = 1e-3
    for i in range(4):
        up, down = p.copy(), p.copy()
        up[i] += eps
        down[i] -= eps
        assert grad[i] == pytest.approx((loss(up) - loss(down)) / (2 * eps), rel=1e-2, abs=1e-4)


def test_the_tangent_cosine_ignores_moves_off_the_simplex():
    a = np.array([1.0, 0.0, 0.0])
    assert tangent_cosine(a, a + 5.0) == pytest.approx(1.0)
    assert tangent_cosine(a, -a) == pytest.approx(-1.0)
    assert tangent_cosine(a, np.array([0.0, 1.0, -1.0])) == pytest.approx(0.0, abs=1e-12)
    assert tangent_cosine(a, np.full(3, 2.0)) is None  # no move along the simplex


def test_bad_server_agent_settings_are_named():
    with pytest.raises(ConfigError, match="page.server-optimizer"):
        page_config(**{"page.server-optimizer": "rmsprop"})
    with pytest.raises(ConfigError, match="page.client-optimizer"):
        page_config(**{"page.client-optimizer": "lbfgs"})
    # the earlier single key names its replacements
    with pytest.raises(ConfigError, match="page.server-optimizer and page.client-optimizer"):
        config(strategy="page", dataset="synthetic", **{"page.rl-optimizer": "adam"})


def test_the_run_gives_each_side_its_optimizer_and_logs_the_critic_cosine(tmp_path):
    """Defaults: the server's agent on plain SGD, the clients' on Adam; every round after
    the first records the critic cosine, a number in [−1, 1]."""
    cfg = page_config(num_rounds=3)
    strategy = page_run(cfg, tmp_path)
    assert strategy.agent.config.optimizer == "sgd"
    assert strategy.train_config(1, 0)["page.rl-optimizer"] == "adam"  # the clients'
    records = read_rounds(tmp_path / "rounds.jsonl")
    server = [r["train"]["server"] for r in records if r.get("train")]
    assert len(server) == 3
    assert "critic-cosine" not in server[0]  # round 1: random, no critic yet
    for record in server[1:]:
        assert -1.0 <= record["critic-cosine"] <= 1.0
    swapped = page_config(
        **{"num_rounds": 1, "page.server-optimizer": "adam", "page.client-optimizer": "sgd"}
    )
    strategy = page_run(swapped, tmp_path / "swapped")
    assert strategy.agent.config.optimizer == "adam"
    assert strategy.train_config(1, 0)["page.rl-optimizer"] == "sgd"
