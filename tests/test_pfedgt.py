"""pFedGT against independent references: autograd of Eq. 2, closed-form Nash equilibria of
quadratic games (docs/papers/pfedgt.md §8.3), an independent best-response solve for logistic
regression, Lemma 1's exact tracking, and the γ = 1 / γ → 0 special cases."""

from itertools import combinations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord
from helpers import config, grid_for, run_local, stored
from scipy.optimize import minimize

from pflarena.core import keys
from pflarena.core.datasets import to_tensors
from pflarena.core.federation import load_client
from pflarena.methods.local.solver import MODEL_KEY
from pflarena.methods.pfedgt import keys as pfedgt_keys
from pflarena.methods.pfedgt import solver as solver
from pflarena.methods.pfedgt.strategy import tracked_update
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy
from pflarena.strategies.exchange import direct_send

F64 = torch.float64


# ----------------------------------------------------------------------------- quadratic games
def quadratic_game(m: int, d: int, L: float, seed: int, low: float | None = None):
    """f_i(w) = ½ wᵀA_i w − b_iᵀw with symmetric A_i, eigenvalues in [low, L] (default [−L, L])."""
    rng = np.random.default_rng(seed)
    A, b = [], []
    for _ in range(m):
        q, _ = np.linalg.qr(rng.normal(size=(d, d)))
        eig = rng.uniform(-L if low is None else low, L, size=d)
        eig[0] = L
        A.append(q @ np.diag(eig) @ q.T)
        b.append(rng.normal(size=d))
    return np.array(A), np.array(b)


def nash_equilibrium(A, b, gammas, mu, rho):
    """Solve M w = r (docs/papers/pfedgt.md §8.3): the stacked first-order conditions
    ∇_{w_i} G_i = 0."""
    m, d = b.shape
    M, r = np.zeros((m * d, m * d)), np.zeros(m * d)
    for i in range(m):
        gt = ((m - 1) * gammas[i] + 1) / m
        rows = slice(i * d, (i + 1) * d)
        for j in range(m):
            cols = slice(j * d, (j + 1) * d)
            if i == j:
                M[rows, cols] = gt * A[i] + ((1 - gt) * mu + rho) * np.eye(d)
            else:
                M[rows, cols] = (1 - gammas[i]) / m * (A[j] - mu * np.eye(d))
        r[rows] = gt * b[i] + (1 - gammas[i]) / m * (b.sum(axis=0) - b[i])
    return np.linalg.solve(M, r).reshape(m, d)


def run_on_game(
    A,
    b,
    gammas,
    mu,
    rho,
    *,
    rounds,
    sample,
    steps,
    lr,
    seed=0,
    warm_start="personal",
    variant="exact",
    step_c=None,
    sampled=None,
):
    """pFedGT's own client solver and server aggregation, on a quadratic game.

    c⁰ = mean_i (∇f_i(θ⁰) − μθ⁰); λ = |S|/m unless ``step_c`` is given. Returns the
    personalized models after every round; ``sampled``, a list, receives each round's clients.
    """
    m, d = b.shape
    At, bt = torch.tensor(A), torch.tensor(b)
    rng = np.random.default_rng(seed)

    def grad(i, x):
        return At[i] @ x - bt[i]

    theta = torch.zeros(d, dtype=F64)
    w = [theta.clone() for _ in range(m)]
    c_stored = [grad(i, theta) - mu * theta for i in range(m)]
    c = torch.stack(c_stored).mean(0)
    history = []
    for _ in range(rounds):
        chosen = rng.choice(m, size=sample, replace=False)
        if sampled is not None:
            sampled.append(sorted(int(i) for i in chosen))
        delta_w, delta_c = [], []
        for i in chosen:
            x = (theta if warm_start == "theta" else w[i]).clone()
            c_new = solver.local_solve(
                [x],
                [lambda i=i, x=x: [grad(i, x)]] * steps,
                c_server=[c],
                c_stored=[c_stored[i]],
                weights=solver.GameWeights(gammas[i], mu, rho, m),
                lr=lr,
                variant=variant,
                full_grad=lambda i=i, x=x: [grad(i, x)],
            )[0]
            delta_w.append({"w": (x - theta).numpy()})
            delta_c.append({"c": (c_new - c_stored[i]).numpy()})
            w[i], c_stored[i] = x, c_new
        c = torch.from_numpy(tracked_update({"c": c.numpy()}, delta_c, step_c or sample / m)["c"])
        theta = torch.from_numpy(tracked_update({"w": theta.numpy()}, delta_w, 1.0)["w"])
        history.append(torch.stack(w).numpy().copy())
    return history


GAME = dict(m=5, d=6, L=1.0, seed=3)
GAMMA, MU, RHO = 0.5, 0.1, 1.5  # ρ > L: Theorem 1's unique equilibrium, contraction a_1


def _a1(m, gamma, mu, L, rho):
    gt = ((m - 1) * gamma + 1) / m
    return (1 - gt) * (mu + L) / ((1 - gt) * mu - gt * L + rho)


def game_blocks(A, b, gammas, mu, rho):
    """The blocks M_ij of the stacked first-order conditions M w = r
    (docs/papers/pfedgt.md §8.3)."""
    m, d = b.shape
    M = np.zeros((m * d, m * d))
    for i in range(m):
        gt = ((m - 1) * gammas[i] + 1) / m
        for j in range(m):
            if i == j:
                block = gt * A[i] + ((1 - gt) * mu + rho) * np.eye(d)
            else:
                block = (1 - gammas[i]) / m * (A[j] - mu * np.eye(d))
            M[i * d : (i + 1) * d, j * d : (j + 1) * d] = block
    return M


def round_map(M, d, participants, steps, lr):
    """The error map e ← T e of one round (exact variant, own-model warm start): a participant
    i takes ``steps`` gradient steps on G_i with the others frozen, e_i ← P^K e_i − (Σ_k P^k) η
    Σ_{j≠i} M_ij e_j with P = I − ηM_ii; the others keep their models."""
    n = M.shape[0]
    T = np.eye(n)
    for i in participants:
        rows = slice(i * d, (i + 1) * d)
        P = np.eye(d) - lr * M[rows, rows]
        power, total = np.eye(d), np.zeros((d, d))
        for _ in range(steps):
            total += power
            power = P @ power
        T[rows] = -lr * total @ M[rows]
        T[rows, rows] = power
    return T


def test_quadratic_game_converges_at_the_rate_of_the_game():
    """Full participation: every round's error is T times the last one, T the round's exact
    linear map built from the game's blocks; each round contracts by at most ‖T‖₂ (0.22), on
    average by T's spectral radius (0.10), and ‖T‖₂ lies below Theorem 1's a₁ (0.47, a bound a
    run twice as slow would still meet). Catches any change in a step's coefficients (γ, μ,
    ρ, m, the messages) that still converges."""
    A, b = quadratic_game(**GAME)  # indefinite A_i: the f_i are nonconvex
    m, d = b.shape
    gammas = [GAMMA] * m
    w_star = nash_equilibrium(A, b, gammas, MU, RHO)
    lr, steps = 1 / (RHO + GAME["L"] + MU), 40  # lr ≤ 1/L of every G_i
    history = run_on_game(A, b, gammas, MU, RHO, rounds=30, sample=m, steps=steps, lr=lr)
    T = round_map(game_blocks(A, b, gammas, MU, RHO), d, range(m), steps, lr)
    norm, radius = np.linalg.norm(T, 2), max(abs(np.linalg.eigvals(T)))
    assert radius <= norm < _a1(m, GAMMA, MU, GAME["L"], RHO) < 1
    errors = [(h - w_star).ravel() for h in history]
    e = np.zeros(m * d) - w_star.ravel()  # w⁰ = θ⁰ = 0
    sizes = [np.linalg.norm(e)]
    for error in errors:
        e = T @ e
        np.testing.assert_allclose(error, e, rtol=0, atol=1e-9 * sizes[0])
        sizes.append(np.linalg.norm(error))
    assert sizes[-1] < 1e-6 * sizes[0]
    sizes = np.array(sizes)
    last = int(np.nonzero(sizes > 1e-12 * sizes[0])[0][-1])  # before rounding noise
    assert last >= 8
    assert np.all(sizes[1 : last + 1] <= norm * sizes[:last])
    # per round, after the first few, the error shrinks by ρ(T) on (geometric) average
    np.testing.assert_allclose((sizes[last] / sizes[3]) ** (1 / (last - 3)), radius, rtol=0.1)


def test_quadratic_game_partial_participation_converges_at_the_sampled_rate():
    """2 of 5 clients a round and λ = |S|/m: every round's error is T_S times the last one for
    the clients S actually sampled, so each round contracts by at most ‖T_S‖₂; the
    mean-square rate over uniform samples (λ_max of E[T_SᵀT_S]) lies below Theorem 2's
    a = 1 − p_min(1 − a₁). Catches c drifting from the mean of the stored messages (another
    λ), which the iterates then leave the linear map to show."""
    A, b = quadratic_game(**GAME)
    m, d = b.shape
    gammas = [GAMMA] * m
    w_star = nash_equilibrium(A, b, gammas, MU, RHO)
    lr, steps, sample = 1 / (RHO + GAME["L"] + MU), 40, 2
    sampled: list[list[int]] = []
    history = run_on_game(
        A, b, gammas, MU, RHO, rounds=80, sample=sample, steps=steps, lr=lr, sampled=sampled
    )
    M = game_blocks(A, b, gammas, MU, RHO)
    e = -w_star.ravel()
    start = np.linalg.norm(e)
    for chosen, h in zip(sampled, history, strict=True):
        T = round_map(M, d, chosen, steps, lr)
        before = np.linalg.norm(e)
        e = T @ e
        error = (h - w_star).ravel()
        np.testing.assert_allclose(error, e, rtol=0, atol=1e-9 * start)
        if before > 1e-7 * start:
            assert np.linalg.norm(error) <= np.linalg.norm(T, 2) * before + 1e-9 * start
    assert np.linalg.norm(e) < 1e-6 * start
    subsets = list(combinations(range(m), sample))
    Q = sum((T := round_map(M, d, S, steps, lr)).T @ T for S in subsets) / len(subsets)
    p_min, a1 = sample / m, _a1(m, GAMMA, MU, GAME["L"], RHO)
    assert np.linalg.eigvalsh(Q).max() < 1 - p_min * (1 - a1) < 1


def test_quadratic_game_fails_without_the_message_correction(monkeypatch):
    """The test above can fail: drop Eq. 7's message terms and the equilibrium is missed."""
    monkeypatch.setattr(
        solver, "corrected_gradient", lambda g, w, cs, cl, ci, *, a, b, rho: g + rho * w
    )
    A, b = quadratic_game(**GAME)
    gammas = [GAMMA] * GAME["m"]
    w_star = nash_equilibrium(A, b, gammas, MU, RHO)
    history = run_on_game(
        A, b, gammas, MU, RHO, rounds=40, sample=GAME["m"], steps=40, lr=1 / (RHO + GAME["L"] + MU)
    )
    assert np.linalg.norm(history[-1] - w_star) > 1e-2


def test_gamma_zero_equilibrium_is_consensus_at_the_federated_optimum():
    """γ → 0: every user ends at argmin of the average loss, FedAvg's target (with μ as a
    proximal pull towards the others' models along the way)."""
    A, b = quadratic_game(m=4, d=5, L=1.0, seed=7, low=0.3)  # convex f_i
    gammas, mu, rho = [0.0] * 4, 1.0, 0.0
    w_fl = np.linalg.solve(A.sum(0), b.sum(0))
    np.testing.assert_allclose(
        nash_equilibrium(A, b, gammas, mu, rho), np.tile(w_fl, (4, 1)), atol=1e-10
    )
    history = run_on_game(A, b, gammas, mu, rho, rounds=150, sample=4, steps=30, lr=0.5)
    np.testing.assert_allclose(history[-1], np.tile(w_fl, (4, 1)), atol=1e-6)


# ----------------------------------------------------------------------------- Eq. 7
def _logistic_setup(m=4, n=20, d=3, k=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, d, generator=gen, dtype=F64) + i for i in range(m)]
    ys = [torch.randint(0, k, (n,), generator=gen) for _ in range(m)]
    ws = [torch.randn(k, d, generator=gen, dtype=F64) for _ in range(m)]

    def f(i, w):
        return torch.nn.functional.cross_entropy(xs[i] @ w.T, ys[i])

    def grad(i, w):
        w = w.detach().requires_grad_(True)
        return torch.autograd.grad(f(i, w), w)[0]

    return f, grad, ws


@pytest.mark.parametrize("gamma,mu,rho", [(0.8, 0.05, 0.0), (0.3, 0.5, 0.2)])
def test_eq7_equals_autograd_of_the_game_objective(gamma, mu, rho):
    """Eq. 7 (messages) equals ∇ of Eq. 2 built literally, with the j = i term exact."""
    m = 4
    f, grad, ws = _logistic_setup(m=m)
    i = 1
    w_now = ws[i] + 0.3  # the local iterate w_i^{t,e}, away from the stored w_i^t

    w_var = w_now.clone().requires_grad_(True)
    objective = gamma * f(i, w_var) + (1 - gamma) / m * f(i, w_var) + rho / 2 * w_var.pow(2).sum()
    for j in range(m):
        if j != i:
            objective = objective + (1 - gamma) / m * (
                f(j, ws[j]).detach()
                + (grad(j, ws[j]) * (w_var - ws[j])).sum()
                + mu / 2 * (w_var - ws[j]).pow(2).sum()
            )
    expected = torch.autograd.grad(objective, w_var)[0]

    messages = [grad(j, ws[j]) - mu * ws[j] for j in range(m)]
    c = torch.stack(messages).mean(0)
    g = grad(i, w_now)
    weights = solver.GameWeights(gamma, mu, rho, m)
    got = solver.corrected_gradient(
        g, w_now, c, g - mu * w_now, messages[i], a=weights.a, b=weights.b, rho=rho
    )
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-9)


def test_gamma_zero_step_is_the_average_gradient_plus_proximal_pull():
    """γ = 0: the step is (1/m)∇f_i(w) + ((m−1)/m)(mean_{j≠i} ∇f_j(w_j) + μ(w − mean_{j≠i} w_j))."""
    m, mu = 4, 0.3
    _, grad, ws = _logistic_setup(m=m, seed=2)
    i, w_now = 2, ws[2] - 0.2
    messages = [grad(j, ws[j]) - mu * ws[j] for j in range(m)]
    c = torch.stack(messages).mean(0)
    g = grad(i, w_now)
    got = solver.corrected_gradient(
        g, w_now, c, g - mu * w_now, messages[i], a=1.0, b=1 / m, rho=0.0
    )
    others = [j for j in range(m) if j != i]
    expected = g / m + (m - 1) / m * (
        torch.stack([grad(j, ws[j]) for j in others]).mean(0)
        + mu * (w_now - torch.stack([ws[j] for j in others]).mean(0))
    )
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-9)


# ----------------------------------------------------------------------------- Lemma 1
def test_lemma1_exact_tracking_with_lambda_s_over_m():
    rng = np.random.default_rng(0)
    m, d, s = 10, 7, 3
    c_i = rng.normal(size=(m, d))
    exact = {"c": c_i.mean(0)}
    loose = {"c": c_i.mean(0)}
    for _ in range(100):
        chosen = rng.choice(m, size=s, replace=False)
        new = c_i.copy()
        new[chosen] = rng.normal(size=(s, d))
        deltas = [{"c": new[i] - c_i[i]} for i in chosen]
        exact = tracked_update(exact, deltas, s / m)
        loose = tracked_update(loose, deltas, 0.7)
        c_i = new
        np.testing.assert_allclose(exact["c"], c_i.mean(0), atol=1e-12)
    assert np.linalg.norm(loose["c"] - c_i.mean(0)) > 1e-3  # λ = 0.7 ≠ |S|/m: no exact tracking


def test_tracked_update_is_unweighted_mean_step():
    current = {"x": np.array([1.0, 2.0])}
    out = tracked_update(current, [{"x": np.array([2.0, 0.0])}, {"x": np.array([0.0, 4.0])}], 0.5)
    np.testing.assert_allclose(out["x"], [1.5, 3.0])
    assert tracked_update(current, [], 1.0)["x"] is not current["x"]


# ----------------------------------------------------------------------------- through Flower
def _numpy_logistic(x, y, k):
    """f(w) and ∇f for softmax regression with w = [W (k×d) row-major, bias (k)]."""
    n, d = x.shape
    onehot = np.eye(k)[y]

    def unpack(w):
        return w[: k * d].reshape(k, d), w[k * d :]

    def value_grad(w):
        W, bias = unpack(w)
        z = x @ W.T + bias
        z = z - z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        loss = -np.mean(np.log(p[np.arange(n), y] + 1e-300))
        diff = (p - onehot) / n
        return loss, np.concatenate([(diff.T @ x).ravel(), diff.sum(0)])

    return value_grad


def test_logistic_fixed_point_is_a_nash_equilibrium(tmp_path):
    """Run pFedGT through the Flower client and strategy on `synthetic` (logistic regression),
    then check every w_i against an independent scipy solve of its best response."""
    m, gamma, mu, rho = 4, 0.5, 0.5, 0.05
    cfg = config(
        strategy="pfedgt",
        dataset="synthetic",
        partition="natural",
        num_clients=m,
        num_rounds=120,
        eval_every=120,
        batch_size=100000,
        local_epochs=20,
        lr=0.15,
        fraction_train=1.0,
        **{"pfedgt.gamma": gamma},
        **{"pfedgt.mu": mu},
        **{"pfedgt.rho": rho},
        **{"pfedgt.lambda-rule": "fixed", "pfedgt.lambda": 1.0},
        **{"pfedgt.variant": "exact"},
        **{"pfedgt.warm-start": "personal"},
    )
    grid = grid_for(cfg)
    run_local(cfg, tmp_path, grid=grid)
    final = _personal_models(grid)
    oracles = _logistic_oracles(cfg)
    for i in range(m):
        game = GameObjective(i, final, oracles, gamma, mu, rho)
        best = game.best_response()
        assert np.linalg.norm(game(final[i])[1]) < 1e-4, f"client {i}: ∇G_i(w_i) is not ~0"
        assert np.linalg.norm(best - final[i]) < 1e-3 * max(1.0, np.linalg.norm(best))


def _personal_models(grid) -> dict[int, np.ndarray]:
    """Every client's w_i (logistic regression: [W row-major, bias]) by client id."""
    models = {}
    for ctx in grid.contexts.values():
        state = stored(ctx, solver.PERSONAL_KEY)
        weight, bias = state["linear.weight"].numpy(), state["linear.bias"].numpy()
        models[int(ctx.node_config["partition-id"])] = np.concatenate(
            [weight.ravel(), bias]
        ).astype(np.float64)
    return models


def _logistic_oracles(cfg) -> list:
    """f_i and ∇f_i of every client's training set, in numpy (:func:`_numpy_logistic`)."""
    oracles = []
    for i in range(cfg.num_clients):
        data, info = load_client(cfg.federation_spec(), i)
        x, y = to_tensors(data.x_train, data.y_train, info)
        oracles.append(_numpy_logistic(x.numpy().astype(np.float64), y.numpy(), info.num_classes))
    return oracles


class GameObjective:
    """G_i(w; w_−i) of Eq. 2 from the others' models themselves (not from any message):
    γ̃_i f_i(w) + ((1−γ_i)/m) Σ_{j≠i} [∇f_j(w_j)ᵀw + (μ/2)‖w − w_j‖²] + (ρ/2)‖w‖², up to a
    constant, with its gradient (Eq. 4)."""

    def __init__(self, i, models, oracles, gamma, mu, rho):
        self.m = len(oracles)
        self.i, self.oracle = i, oracles[i]
        self.gamma, self.mu, self.rho = gamma, mu, rho
        self.others = [models[j] for j in range(self.m) if j != i]
        self.g_others = sum(oracles[j](models[j])[1] for j in range(self.m) if j != i)
        self.start = models[i]

    def __call__(self, w):
        m, gamma, mu, rho = self.m, self.gamma, self.mu, self.rho
        gt = ((m - 1) * gamma + 1) / m
        loss, grad = self.oracle(w)
        value = (
            gt * loss
            + (1 - gamma)
            / m
            * (self.g_others @ w + mu / 2 * sum(np.sum((w - wj) ** 2) for wj in self.others))
            + rho / 2 * w @ w
        )
        gradient = (
            gt * grad
            + (1 - gamma) / m * (self.g_others + mu * ((m - 1) * w - sum(self.others)))
            + rho * w
        )
        return value, gradient

    def best_response(self) -> np.ndarray:
        """argmin_w G_i(w; w_−i) by scipy's L-BFGS-B."""
        return minimize(
            self,
            np.zeros_like(self.start),
            jac=True,
            method="L-BFGS-B",
            options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 5000},
        ).x


def test_partial_participation_through_the_client_app_is_best_response_dynamics(tmp_path):
    """The theory through the real ClientApp and strategy, 2 of 4 clients a round and
    λ = |S^t|/m (``lambda-rule=tracking``): every round each participant's new w_i is its best
    response to the others' current models (Theorem 2's update, checked against scipy on
    Eq. 2 built from the models, not the messages), and the run ends at the Nash equilibrium.
    Catches |S| in place of m in the client's (1−γ_i)/m (each best response is off by
    13%; the fixed point alone cannot show it, the term vanishes where c_i = c_i^t), and Δc
    measured from c instead of the stored c_i (c stops being the mean of the messages; the
    best responses are off by 17–38% from round 2 and the run never reaches the
    equilibrium). ρ = 1 keeps each G_i well conditioned, so 40 full-batch steps solve it."""
    m, gamma, mu, rho, rounds = 4, 0.5, 0.5, 1.0, 25
    cfg = config(
        strategy="pfedgt",
        dataset="synthetic",
        partition="natural",
        num_clients=m,
        fraction_train=0.5,
        batch_size=100000,
        local_epochs=40,
        lr=0.2,
        **{"pfedgt.gamma": gamma, "pfedgt.mu": mu, "pfedgt.rho": rho},
        **{"pfedgt.lambda-rule": "tracking", "pfedgt.variant": "exact"},
        **{"pfedgt.warm-start": "personal"},
    )
    grid, strategy, arrays = grid_for(cfg), build_strategy(cfg), initial_arrays(cfg)
    strategy.initialise_message(grid, arrays, direct_send(grid, 60))
    oracles = _logistic_oracles(cfg)
    client_of = {n: int(ctx.node_config["partition-id"]) for n, ctx in grid.contexts.items()}
    for server_round in range(1, rounds + 1):
        before = _personal_models(grid)
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        assert len(messages) == m // 2
        arrays, metrics = strategy.aggregate_train(
            server_round, list(grid.send_and_receive(messages))
        )
        assert metrics["message-tracking-error"] < 1e-5  # Lemma 1
        after = _personal_models(grid)
        for msg in messages:
            i = client_of[msg.metadata.dst_node_id]
            best = GameObjective(i, before, oracles, gamma, mu, rho).best_response()
            assert np.linalg.norm(after[i] - best) < 1e-3 * max(1.0, np.linalg.norm(best)), (
                f"round {server_round}, client {i}: w_i is not its best response"
            )
    for i in range(m):
        game = GameObjective(i, after, oracles, gamma, mu, rho)
        assert np.linalg.norm(game(after[i])[1]) < 1e-4, f"client {i}: ∇G_i(w_i) is not ~0"
        best = game.best_response()
        assert np.linalg.norm(best - after[i]) < 1e-4 * max(1.0, np.linalg.norm(best))


@pytest.mark.parametrize("model", ["mlp", "small-cnn-bn"])
def test_gamma_one_with_own_model_warm_start_is_local_training(tmp_path, model):
    """γ = 1 with the own-model warm start (``warm-start=personal``): the messages drop out
    and each w_i is exactly the model the `local` strategy trains, BatchNorm statistics
    included. Catches message terms that survive γ = 1 and, with BatchNorm, statistics that
    do not stay with the client."""
    common = dict(num_rounds=3, fraction_train=1.0, alpha=0.3, model=model)
    g_cfg = config(
        strategy="pfedgt", **{"pfedgt.gamma": 1.0}, **{"pfedgt.warm-start": "personal"}, **common
    )
    l_cfg = config(strategy="local", **common)
    g_grid, l_grid = grid_for(g_cfg), grid_for(l_cfg)
    run_local(g_cfg, tmp_path / "g", grid=g_grid)
    run_local(l_cfg, tmp_path / "l", grid=l_grid)
    for node_id, ctx in g_grid.contexts.items():
        ours = stored(ctx, solver.PERSONAL_KEY)
        theirs = stored(l_grid.contexts[node_id], MODEL_KEY)
        assert list(ours.keys()) == list(theirs.keys())
        for name in theirs.keys():
            np.testing.assert_allclose(ours[name].numpy(), theirs[name].numpy(), atol=1e-5)


def test_gamma_one_with_theta_warm_start_is_fedavg_then_local_training():
    """γ = 1 with the paper's θ warm start (the default): θ is FedAvg's global model with
    unweighted averaging (η_s = 1, Δw against θ), and each participant's w_i is the model its
    FedAvg client trains from it that round, i.e. FedAvg followed by E epochs of local
    training, not local training alone. FedAvg runs through its own strategy with every
    reply's example count set to 1, so its average is unweighted too. Catches Δw measured
    from w_i (θ leaves FedAvg's path from round 2), a server step other than the plain mean,
    and message terms that survive γ = 1."""
    common = dict(num_rounds=3, fraction_train=0.4, alpha=0.3)
    g_cfg = config(strategy="pfedgt", **{"pfedgt.gamma": 1.0}, **common)
    f_cfg = config(strategy="fedavg", **common)
    g_grid, f_grid = grid_for(g_cfg), grid_for(f_cfg)
    trained: dict[int, dict[str, np.ndarray]] = {}

    def equal_weights(reply):
        if not reply.has_error() and keys.ARRAYS in reply.content.array_records:  # train
            reply.content.metric_records[keys.METRICS][keys.NUM_EXAMPLES] = 1
            trained[reply.metadata.src_node_id] = {
                n: a.numpy() for n, a in reply.content.array_records[keys.ARRAYS].items()
            }
        return reply

    f_grid.reply_filter = equal_weights
    g_strategy, f_strategy = build_strategy(g_cfg), build_strategy(f_cfg)
    theta = fedavg = initial_arrays(g_cfg)
    for strategy, grid in ((g_strategy, g_grid), (f_strategy, f_grid)):  # round 0, as a run
        messages = list(strategy.configure_evaluate(0, theta, ConfigRecord(), grid))
        strategy.aggregate_evaluate(0, list(grid.send_and_receive(messages)))
    for server_round in (1, 2, 3):
        trained.clear()
        g_messages = list(g_strategy.configure_train(server_round, theta, ConfigRecord(), g_grid))
        f_messages = list(f_strategy.configure_train(server_round, fedavg, ConfigRecord(), f_grid))
        nodes = [msg.metadata.dst_node_id for msg in g_messages]
        assert nodes == [msg.metadata.dst_node_id for msg in f_messages]
        theta, _ = g_strategy.aggregate_train(
            server_round, list(g_grid.send_and_receive(g_messages))
        )
        fedavg, _ = f_strategy.aggregate_train(
            server_round, list(f_grid.send_and_receive(f_messages))
        )
        for name in fedavg.keys():
            np.testing.assert_allclose(theta[name].numpy(), fedavg[name].numpy(), atol=1e-5)
        for node in nodes:
            ours = stored(g_grid.contexts[node], solver.PERSONAL_KEY)
            for name, value in trained[node].items():
                np.testing.assert_allclose(ours[name].numpy(), value, atol=1e-5)


def test_pfedgt_learns_and_beats_fedavg_on_skewed_digits(tmp_path):
    results = {}
    for strategy in ("pfedgt", "fedavg"):
        cfg = config(
            strategy=strategy,
            num_clients=10,
            num_rounds=8,
            alpha=0.1,
            fraction_train=0.5,
            local_epochs=2,
        )
        outcome = run_local(cfg, tmp_path / strategy, grid=grid_for(cfg))
        results[strategy] = [r["evaluation"]["personalized"]["mean"] for r in outcome.rounds]
        server = outcome.rounds[-1]["train"]["server"]
        if strategy == "pfedgt":  # the state metrics reach rounds.jsonl
            assert server["theta-norm"] > 0 and server["message-tracking-error"] >= 0
        else:
            assert server == {}
    assert results["pfedgt"][-1] > results["pfedgt"][0] + 0.4
    assert results["pfedgt"][-1] > results["fedavg"][-1] + 0.1


def test_init_round_sets_c0_to_the_mean_message(tmp_path):
    cfg = config(strategy="pfedgt", num_rounds=1, fraction_train=0.4)
    grid = grid_for(cfg)
    strategy = build_strategy(cfg)
    strategy.initialise_message(grid, initial_arrays(cfg), direct_send(grid, 60))
    messages = [stored(ctx, solver.MESSAGE_KEY) for ctx in grid.contexts.values()]
    for name in strategy.trainable:
        np.testing.assert_allclose(
            strategy.message[name], np.mean([s[name].numpy() for s in messages], axis=0), rtol=1e-6
        )
    # and the messages are the full-batch gradient at θ⁰ minus μθ⁰ (checked on one client)
    ctx = next(iter(grid.contexts.values()))
    data, info = load_client(cfg.federation_spec(), int(ctx.node_config["partition-id"]))
    x, y = to_tensors(data.x_train, data.y_train, info)
    from pflarena.core.models import build_model

    net = build_model(cfg.model_name(), info.input_shape, info.num_classes, seed=cfg.seed).double()
    loss = torch.nn.functional.cross_entropy(net(x.double()), y)
    grads = dict(
        zip(
            [n for n, _ in net.named_parameters()],
            torch.autograd.grad(loss, list(net.parameters())),
            strict=True,
        )
    )
    for name, param in net.named_parameters():
        expected = (grads[name] - strategy.params.mu * param).detach().numpy()
        np.testing.assert_allclose(
            stored(ctx, solver.MESSAGE_KEY)[name].numpy(),
            expected,
            rtol=1e-4,
            atol=1e-6,
        )


def test_nan_update_is_rejected_and_eq5_uses_the_rest():
    cfg = config(
        strategy="pfedgt",
        fraction_train=1.0,
        **{"pfedgt.lambda-rule": "fixed", "pfedgt.lambda": 0.7},
    )
    grid, strategy, arrays = grid_for(cfg), build_strategy(cfg), initial_arrays(cfg)
    strategy.initialise_message(grid, arrays, direct_send(grid, 60))
    before = {k: v.copy() for k, v in strategy.message.items()}
    replies = list(
        grid.send_and_receive(list(strategy.configure_train(1, arrays, ConfigRecord(), grid)))
    )
    name = strategy.trainable[0]
    bad = replies[0].content[pfedgt_keys.DELTA_C][name].numpy().copy()
    bad.flat[0] = np.nan
    replies[0].content[pfedgt_keys.DELTA_C][name] = Array(bad)
    strategy.aggregate_train(1, replies)
    assert strategy.last_failed == [replies[0].metadata.src_node_id]
    rest = [r.content[pfedgt_keys.DELTA_C][name].numpy() for r in replies[1:]]
    np.testing.assert_allclose(
        strategy.message[name],
        before[name] + 0.7 / len(rest) * np.sum(rest, 0),
        rtol=1e-5,
        atol=1e-7,
    )


@pytest.mark.parametrize("message_step", [0.4, 0.7])
def test_tracking_error_measures_c_against_the_stored_messages(message_step):
    # 2 of 5 clients a round: λ = |S|/m = 0.4 tracks the mean exactly (Lemma 1), 0.7 drifts
    cfg = config(
        strategy="pfedgt",
        fraction_train=0.4,
        **{"pfedgt.lambda-rule": "fixed", "pfedgt.lambda": message_step},
    )
    grid, strategy, arrays = grid_for(cfg), build_strategy(cfg), initial_arrays(cfg)
    strategy.initialise_message(grid, arrays, direct_send(grid, 60))
    for server_round in (1, 2, 3):
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        arrays, metrics = strategy.aggregate_train(
            server_round, list(grid.send_and_receive(messages))
        )
    messages = [stored(ctx, solver.MESSAGE_KEY) for ctx in grid.contexts.values()]
    mean = {n: np.mean([s[n].numpy() for s in messages], axis=0) for n in strategy.trainable}
    diff = np.concatenate([(strategy.message[n] - mean[n]).ravel() for n in strategy.trainable])
    norm = np.linalg.norm(np.concatenate([mean[n].ravel() for n in strategy.trainable]))
    assert metrics["message-tracking-error"] == pytest.approx(
        np.linalg.norm(diff) / norm, rel=1e-3, abs=1e-6
    )
    if message_step == 0.4:
        assert metrics["message-tracking-error"] < 1e-5
    else:
        assert metrics["message-tracking-error"] > 1e-3
    theta = np.concatenate([arrays[n].numpy().ravel() for n in strategy.trainable])
    assert metrics["theta-norm"] == pytest.approx(np.linalg.norm(theta), rel=1e-5)


def test_a_rejected_update_leaves_c_tracking_the_stored_messages(tmp_path):
    """Lemma 1 survives a lost update: the rejected client's new c_i never takes effect."""
    cfg = config(
        strategy="pfedgt",
        num_rounds=3,
        fraction_train=0.6,
        **{"pfedgt.lambda-rule": "tracking"},
    )
    grid = grid_for(cfg)
    victim: list[int] = []

    def nan_in_transit(reply):
        content = reply.content
        sync_round = None if reply.has_error() else content.array_records.get(pfedgt_keys.DELTA_C)
        if sync_round is not None and not victim:  # the first train reply of the run
            victim.append(reply.metadata.src_node_id)
            name = next(iter(sync_round.keys()))
            bad = sync_round[name].numpy().copy()
            bad.flat[0] = np.nan
            sync_round[name] = Array(bad)
        return reply

    grid.reply_filter = nan_in_transit
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    assert victim and outcome.rounds[1]["train"]["failures"] == 1
    for record in outcome.rounds[1:]:
        assert record["train"]["server"]["message-tracking-error"] < 1e-6
    # c is the mean of the messages the clients hold now; the victim kept its old one
    held = [stored(ctx, solver.MESSAGE_KEY) for ctx in grid.contexts.values()]
    for name in strategy.trainable:
        np.testing.assert_allclose(
            strategy.message[name],
            np.mean([h[name].numpy() for h in held], axis=0),
            rtol=1e-5,
            atol=1e-7,
        )


# ----------------------------------------------------------------------------- BatchNorm
def _record_batchnorm_inputs(monkeypatch) -> list[dict[str, list[torch.Tensor]]]:
    """Per local training (one per train message, in order): each BatchNorm layer's inputs in
    training mode, batch by batch."""
    calls: list[dict[str, list[torch.Tensor]]] = []
    original = solver._module_gradients

    def recording(model, *args, **kwargs):
        inputs: dict[str, list[torch.Tensor]] = {}
        calls.append(inputs)
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                assert module.momentum == 0.1  # the EMA below uses PyTorch's default

                def hook(mod, args, name=name):
                    if mod.training:
                        inputs.setdefault(name, []).append(args[0].detach().double().clone())

                module.register_forward_pre_hook(hook)
        yield from original(model, *args, **kwargs)

    monkeypatch.setattr(solver, "_module_gradients", recording)
    return calls


def _running_statistics(start: dict, inputs: list[torch.Tensor]) -> dict[str, np.ndarray]:
    """BatchNorm's documented update, batch by batch: r ← 0.9 r + 0.1 x̄ for the mean and the
    unbiased variance of each channel, and one more tracked batch per step."""
    mean, var = start["running_mean"].astype(np.float64), start["running_var"].astype(np.float64)
    for x in inputs:
        x = x.numpy()
        mean = 0.9 * mean + 0.1 * x.mean(axis=(0, 2, 3))
        var = 0.9 * var + 0.1 * x.var(axis=(0, 2, 3), ddof=1)
    tracked = int(start["num_batches_tracked"]) + len(inputs)
    return {"running_mean": mean, "running_var": var, "num_batches_tracked": tracked}


@pytest.mark.parametrize("start_buffers", ["personal", "theta"])
def test_batchnorm_statistics_come_from_the_clients_own_training(monkeypatch, start_buffers):
    """With the θ warm start, a client's running statistics after a round are its own previous
    statistics carried forward by the batches of its own local training
    (docs/papers/pfedgt.md §9.14), and θ's are the participants' mean. Catches a client whose
    training starts from θ's averaged statistics (what ``start-buffers=theta`` asks for, checked
    here too): from round 2 on, θ's statistics differ from the client's own, which the test asserts
    it meets."""
    cfg = config(
        strategy="pfedgt",
        model="small-cnn-bn",
        fraction_train=0.4,
        **{"pfedgt.start-buffers": start_buffers},
    )
    grid, strategy, arrays = grid_for(cfg), build_strategy(cfg), initial_arrays(cfg)
    strategy.initialise_message(grid, arrays, direct_send(grid, 60))
    calls = _record_batchnorm_inputs(monkeypatch)
    layers = ["features.1", "features.4"]
    own_differs_from_theta = 0
    for server_round in (1, 2, 3):
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        nodes = [m.metadata.dst_node_id for m in messages]
        before = {n: stored(grid.contexts[n], solver.PERSONAL_KEY) for n in nodes}
        calls.clear()
        replies = list(grid.send_and_receive(messages))
        assert len(calls) == len(nodes) and all(not r.has_error() for r in replies)
        for node, inputs in zip(nodes, calls, strict=True):
            after = stored(grid.contexts[node], solver.PERSONAL_KEY)
            for layer in layers:
                own = {
                    k: before[node][f"{layer}.{k}"].numpy()
                    for k in ("running_mean", "running_var", "num_batches_tracked")
                }
                theta = {k: arrays[f"{layer}.{k}"].numpy() for k in own}
                if not np.allclose(own["running_mean"], theta["running_mean"]):
                    own_differs_from_theta += 1
                expected = _running_statistics(
                    own if start_buffers == "personal" else theta, inputs[layer]
                )
                for key in ("running_mean", "running_var"):
                    np.testing.assert_allclose(
                        after[f"{layer}.{key}"].numpy(), expected[key], rtol=1e-5, atol=1e-6
                    )
                assert (
                    int(after[f"{layer}.num_batches_tracked"].numpy())
                    == (expected["num_batches_tracked"])
                )
        arrays, _ = strategy.aggregate_train(server_round, replies)
        # θ's statistics: the plain mean of the participants' (only for evaluating θ)
        for layer in layers:
            name = f"{layer}.running_var"
            held = [stored(grid.contexts[n], solver.PERSONAL_KEY)[name].numpy() for n in nodes]
            np.testing.assert_allclose(arrays[name].numpy(), np.mean(held, axis=0), rtol=1e-6)
    assert own_differs_from_theta >= 2


def _one_round_replies(cfg):
    grid, strategy, arrays = grid_for(cfg), build_strategy(cfg), initial_arrays(cfg)
    strategy.initialise_message(grid, arrays, direct_send(grid, 60))
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    return strategy, arrays, list(grid.send_and_receive(messages))


@pytest.mark.parametrize("damage", ["nan", "inf", "shape", "missing"])
def test_a_bad_buffer_upload_is_rejected_and_never_reaches_theta(caplog, damage):
    """Uploaded BatchNorm statistics are checked like Δw and Δc: a NaN or infinite running
    variance, a wrong shape or a missing buffer record rejects the reply (logged), and θ's
    statistics are the mean over the other participants. Catches a strategy that averages
    the buffers unchecked (θ's running variance would be NaN)."""
    cfg = config(strategy="pfedgt", model="small-cnn-bn", fraction_train=0.6)
    strategy, arrays, replies = _one_round_replies(cfg)
    name = "features.1.running_var"
    buffers = replies[0].content.array_records[pfedgt_keys.BUFFERS]
    if damage == "missing":
        del replies[0].content.array_records[pfedgt_keys.BUFFERS]
    else:
        bad = buffers[name].numpy().copy()
        if damage == "shape":
            bad = bad[:-1]
        else:
            bad.flat[0] = np.nan if damage == "nan" else np.inf
        buffers[name] = Array(bad)
    with caplog.at_level("WARNING"):
        theta, _ = strategy.aggregate_train(1, replies)
    assert strategy.last_failed == [replies[0].metadata.src_node_id]
    assert "rejected reply" in caplog.text and (
        "buffers" in caplog.text and (name in caplog.text or damage == "missing")
    )
    rest = [r.content.array_records[pfedgt_keys.BUFFERS][name].numpy() for r in replies[1:]]
    assert np.isfinite(theta[name].numpy()).all()
    np.testing.assert_allclose(theta[name].numpy(), np.mean(rest, axis=0), rtol=1e-6)


def test_buffers_from_a_model_without_any_are_rejected():
    cfg = config(strategy="pfedgt", fraction_train=0.4)  # digits' MLP: no buffers
    strategy, _, replies = _one_round_replies(cfg)
    assert pfedgt_keys.BUFFERS not in replies[0].content.array_records
    replies[0].content.array_records[pfedgt_keys.BUFFERS] = ArrayRecord(
        {"features.1.running_var": Array(np.ones(3, dtype=np.float32))}
    )
    strategy.aggregate_train(1, replies)
    assert strategy.last_failed == [replies[0].metadata.src_node_id]


# ----------------------------------------------------------------------------- Algorithm 2
def algorithm2_as_printed(w, c_server, c_stored, gradients, *, gamma, mu, rho, m, lr):
    """Algorithm 2 (ClientUpdate) line by line, in numpy: line 1 starts c_i at c; each step
    takes the batch gradient (line 4), steps with the c_i of the previous step (line 5) and
    sets c_i from that gradient and the updated w (line 6, docs/papers/pfedgt.md §9.3). Returns
    every iterate and the final c_i (line 9)."""
    c_i = c_server.copy()
    iterates = []
    for gradient in gradients:
        g = gradient(w)
        w = w - lr * (
            g + (1 - gamma) * (c_server - c_i) + (1 - gamma) / m * (c_i - c_stored) + rho * w
        )
        c_i = g - mu * w
        iterates.append(w)
    return iterates, c_i


def test_paper_variant_follows_algorithm_2_step_by_step():
    """``local_solve(variant="paper")`` against :func:`algorithm2_as_printed` with a numpy
    softmax-regression gradient, iterate by iterate. Catches the exact variant's semantics
    (line 5 with the message at the current iterate), line 6 with the pre-step w or with a
    gradient recomputed at the updated w, c_i starting from the stored message instead of c,
    and a returned message other than the last step's."""
    rng = np.random.default_rng(4)
    n, d, k, m = 24, 3, 3, 5
    gamma, mu, rho, lr = 0.6, 0.4, 0.1, 0.3
    x, y = rng.normal(size=(n, d)) + 0.5, rng.integers(0, k, n)
    steps = [rng.permutation(n)[:6] for _ in range(8)]  # one minibatch per step
    w0 = rng.normal(size=k * d + k)
    c_server, c_stored = rng.normal(size=w0.size), rng.normal(size=w0.size)

    expected, expected_message = algorithm2_as_printed(
        w0,
        c_server,
        c_stored,
        [lambda w, idx=idx: _numpy_logistic(x[idx], y[idx], k)(w)[1] for idx in steps],
        gamma=gamma,
        mu=mu,
        rho=rho,
        m=m,
        lr=lr,
    )

    def split(flat):
        return [torch.tensor(flat[: k * d].reshape(k, d)), torch.tensor(flat[k * d :])]

    params = [p.requires_grad_(True) for p in split(w0)]
    xt, yt = torch.tensor(x), torch.tensor(y)
    seen = []

    def oracle(idx):
        def gradient():
            seen.append(np.concatenate([p.detach().numpy().ravel() for p in params]))
            logits = xt[idx] @ params[0].T + params[1]
            return list(
                torch.autograd.grad(torch.nn.functional.cross_entropy(logits, yt[idx]), params)
            )

        return gradient

    message = solver.local_solve(
        params,
        [oracle(torch.tensor(idx)) for idx in steps],
        c_server=split(c_server),
        c_stored=split(c_stored),
        weights=solver.GameWeights(gamma, mu, rho, m),
        lr=lr,
        variant="paper",
    )
    final = np.concatenate([p.detach().numpy().ravel() for p in params])
    assert len(seen) == len(steps)
    np.testing.assert_allclose(seen[0], w0, rtol=0, atol=0)
    for step, (got, want) in enumerate(zip([*seen[1:], final], expected, strict=True)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"step {step}")
    got_message = np.concatenate([c.detach().numpy().ravel() for c in message])
    np.testing.assert_allclose(got_message, expected_message, rtol=1e-12, atol=1e-12)


def _batch_gradients(x, y, k, order):
    """∇f_i on each minibatch of ``order`` (index tensors), from :func:`_numpy_logistic`."""
    oracles = [_numpy_logistic(x[idx.numpy()], y[idx.numpy()], k) for idx in order]
    return [lambda w, oracle=oracle: oracle(w)[1] for oracle in oracles]


def _flat(record, names) -> np.ndarray:
    """Trainable arrays as one float64 vector, in ``names`` order (numpy arrays or Arrays)."""
    return np.concatenate(
        [np.asarray(getattr(record[n], "numpy", lambda n=n: record[n])()).ravel() for n in names]
    ).astype(np.float64)


def test_client_uploads_follow_algorithm_2_through_the_client_app(monkeypatch):
    """Two rounds through the real ClientApp and strategy with the defaults (paper variant,
    θ warm start): each participant's Δw and Δc equal :func:`algorithm2_as_printed` replayed
    in numpy from θ^t, c^t and the client's stored c_i^t over the minibatches it drew. Catches
    wiring faults the solver-level test cannot see: another warm start, c_i starting from the
    stored message, |S| in place of m in (1−γ)/m, Δw not against θ, Δc against c instead
    of the stored c_i, or another variant as the default."""
    m, gamma, mu, rho, lr = 6, 0.5, 0.5, 0.1, 0.2
    cfg = config(
        strategy="pfedgt",
        dataset="synthetic",
        partition="natural",
        num_clients=m,
        fraction_train=0.5,
        batch_size=16,
        local_epochs=1,
        lr=lr,
        **{"pfedgt.gamma": gamma, "pfedgt.mu": mu, "pfedgt.rho": rho},
    )
    grid, strategy, arrays = grid_for(cfg), build_strategy(cfg), initial_arrays(cfg)
    strategy.initialise_message(grid, arrays, direct_send(grid, 60))
    names = strategy.trainable
    drawn: list[list[torch.Tensor]] = []
    original = solver.batches

    def recording(*args, **kwargs):
        order = list(original(*args, **kwargs))
        drawn.append(order)
        yield from order

    monkeypatch.setattr(solver, "batches", recording)
    for server_round in (1, 2):
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        nodes = [msg.metadata.dst_node_id for msg in messages]
        theta, c = _flat(arrays, names), _flat(strategy.message, names)
        held = {n: _flat(stored(grid.contexts[n], solver.MESSAGE_KEY), names) for n in nodes}
        drawn.clear()
        replies = list(grid.send_and_receive(messages))
        assert len(drawn) == len(nodes) == m // 2
        for node, reply, order in zip(nodes, replies, drawn, strict=True):
            data, info = load_client(
                cfg.federation_spec(), int(grid.contexts[node].node_config["partition-id"])
            )
            x, y = to_tensors(data.x_train, data.y_train, info)
            x, y = x.numpy().astype(np.float64), y.numpy()
            iterates, message = algorithm2_as_printed(
                theta,
                c,
                held[node],
                _batch_gradients(x, y, info.num_classes, order),
                gamma=gamma,
                mu=mu,
                rho=rho,
                m=m,
                lr=lr,
            )
            delta_w = _flat(reply.content.array_records[pfedgt_keys.DELTA_W], names)
            delta_c = _flat(reply.content.array_records[pfedgt_keys.DELTA_C], names)
            np.testing.assert_allclose(delta_w, iterates[-1] - theta, rtol=1e-4, atol=2e-6)
            np.testing.assert_allclose(delta_c, message - held[node], rtol=1e-4, atol=2e-6)
        arrays, _ = strategy.aggregate_train(server_round, replies)


def test_lambda_default_is_exact_tracking_and_a_fixed_lambda_needs_its_rule():
    """λ = |S^t|/m is the default (docs/papers/pfedgt.md §11: the paper's 0.7 let θ and c grow on
    CIFAR-10); a λ set without ``lambda-rule=fixed`` would be ignored, so it is refused."""
    assert build_strategy(config(strategy="pfedgt")).params.lambda_rule == "tracking"
    with pytest.raises(ValueError, match=r"pfedgt.lambda=0.25 takes effect only with"):
        config(strategy="pfedgt", **{"pfedgt.lambda": 0.25})
    fixed = build_strategy(
        config(strategy="pfedgt", **{"pfedgt.lambda-rule": "fixed", "pfedgt.lambda": 0.25})
    )
    assert (fixed.params.lambda_rule, fixed.params.lambda_) == ("fixed", 0.25)
