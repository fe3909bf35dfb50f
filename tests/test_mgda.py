"""FedPG's server math (pflarena.algorithms.mgda) against independent references.

References: the min-norm QP solved by cvxpy in its primal form ``min ‖Gᵀλ‖²`` on the
gradients themselves (not the Gram matrix), MGDA's two-gradient closed form, finite
differences for ``∇F``, and a two-level grid search for the drift coefficient.
Sign convention under test: the update is ``θ − η d``, so a common descent direction has
``⟨d, g_k⟩ ≥ 0`` for every gradient.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pflarena.algorithms import mgda

SETTINGS = settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


# ---------------------------------------------------------------- references


def reference_min_norm(grads: np.ndarray) -> float:
    """``min_{λ ∈ Δ} ½‖Gᵀλ‖²`` by cvxpy on the primal (sum of squares) form.

    With more parameters than gradients, ``Gᵀ = QR`` (thin QR) and ``‖Gᵀλ‖ = ‖Rλ‖``.
    """
    g = np.asarray(grads, dtype=np.float64)
    scale = float(np.abs(g).max()) or 1.0
    factor = (g / scale).T
    if factor.shape[0] > factor.shape[1]:
        factor = np.linalg.qr(factor, mode="r")
    lam = cp.Variable(g.shape[0])
    problem = cp.Problem(cp.Minimize(cp.sum_squares(factor @ lam)), [cp.sum(lam) == 1, lam >= 0])
    problem.solve(solver="CLARABEL", tol_gap_abs=1e-13, tol_gap_rel=1e-13, tol_feas=1e-13)
    weights = np.maximum(lam.value, 0.0)
    weights /= weights.sum()
    return objective(g, weights)


def objective(grads: np.ndarray, weights: np.ndarray) -> float:
    u = weights @ np.asarray(grads, dtype=np.float64)
    return 0.5 * float(u @ u)


def assert_matches_reference(grads: np.ndarray, weights: np.ndarray) -> None:
    g = np.asarray(grads, dtype=np.float64)
    assert weights.shape == (g.shape[0],)
    assert weights.min() >= 0.0
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    got, want = objective(g, weights), reference_min_norm(g)
    scale = float((g**2).sum(axis=1).max())
    assert abs(got - want) <= 1e-6 * want + 1e-12 * scale, (got, want)


def mgda_two(g1: np.ndarray, g2: np.ndarray) -> float:
    """MGDA's closed form for the weight of g1 (docs/papers/fedpg.md §8.2)."""
    diff = g1 - g2
    return float(np.clip((g2 - g1) @ g2 / (diff @ diff), 0.0, 1.0))


def brute_force_gamma(g_i: np.ndarray, d: np.ndarray, others: np.ndarray) -> float:
    """Largest γ on a grid of 10^5 points, refined by a second grid of 10^4 points."""
    dg = others @ d  # ⟨d, g_j⟩
    ig = others @ g_i  # ⟨g_i, g_j⟩

    def feasible(gammas: np.ndarray) -> np.ndarray:  # ⟨(1−γ) d + γ g_i, g_j⟩ ≥ 0 for all j
        return np.all((1 - gammas)[:, None] * dg + gammas[:, None] * ig >= 0, axis=1)

    coarse = np.linspace(0.0, 1.0, 100_001)
    ok = feasible(coarse)
    if not ok.any():
        return 0.0
    start = coarse[np.nonzero(ok)[0][-1]]
    fine = np.linspace(start, min(1.0, start + 1e-5), 10_001)
    return float(fine[np.nonzero(feasible(fine))[0][-1]])


def spec_columns(grads, losses, stale=None, *, with_fair=True):
    """Q of eq. (5) from the formulas of docs/papers/fedpg.md (§2.3, §2.4, §9.5, §9.8),
    written out here."""
    g = np.asarray(grads, dtype=np.float64)
    norms = np.linalg.norm(g, axis=1)
    kept = norms > 1e-6
    mu = norms[kept].mean()
    scaled = mu * g[kept] / norms[kept, None]
    cols = [scaled]
    if with_fair:
        loss = np.asarray(losses, dtype=np.float64)[kept]
        n = loss.size
        h = (loss.sum() / (np.sqrt(n) * (loss @ loss)) * loss - 1 / np.sqrt(n)) / np.linalg.norm(
            loss
        )
        cols.append((h / np.linalg.norm(h)) @ scaled)
    if stale is not None:
        s = np.asarray(stale, dtype=np.float64)
        s = s[np.linalg.norm(s, axis=1) > 1e-6]
        cols.append(mu * s / np.linalg.norm(s, axis=1)[:, None])
    return np.vstack([np.atleast_2d(c) for c in cols if np.size(c)]), scaled


def rng_grads(seed: int, k: int, p: int, shift: float = 0.5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(k, p)) + shift * rng.normal(size=p)


def adversarial_sets() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    base = rng.normal(size=20)
    other = rng.normal(size=20)
    e = np.eye(6)
    return {
        "conflicting-triple": np.array([[1.0, 0.0, 0.0], [-0.9, 0.5, 0.0], [0.2, -1.0, 0.1]]),
        "collinear": np.outer([1.0, 2.0, 5.0], base),
        "opposite": np.vstack([base, -base]),
        "opposite-and-more": np.vstack([base, -base, other]),
        "120-degrees": np.array([[1.0, 0.0], [-0.5, np.sqrt(3) / 2], [-0.5, -np.sqrt(3) / 2]]),
        "duplicates": np.vstack([base, base, other, other, base + other]),
        "one-zero": np.vstack([base, np.zeros(20), other]),
        "orthogonal": e,
        "orthogonal-plus-mean": np.vstack([e, -e.sum(axis=0)]),
        "nearly-parallel": np.vstack([base + 1e-7 * rng.normal(size=20) for _ in range(8)]),
        "mixed-scales": np.vstack([1e3 * base, 1e-3 * other, base + other]),
        "many-in-few-dims": rng.normal(size=(100, 5)),
        "many-in-many-dims": rng_grads(1, 100, 2000),
        "many-shifted": rng_grads(2, 60, 30, shift=3.0),
        # rank 20 up to float32 rounding: a singular, ill-conditioned Gram matrix
        "low-rank-float32": (
            rng.normal(size=(100, 20)) @ rng.normal(size=(20, 300)) + rng.normal(size=300)
        ).astype(np.float32),
    }


ADVERSARIAL = adversarial_sets()
#: The sets with 0 in the convex hull of their normalized gradients: Pareto stationary.
STATIONARY = (
    "opposite",
    "120-degrees",
    "orthogonal-plus-mean",
    "opposite-and-more",
    "many-in-few-dims",
)
INT_GRADS = hnp.arrays(
    np.float64,
    st.tuples(st.integers(2, 12), st.integers(1, 8)),
    elements=st.integers(-4, 4).map(float),
)


# ---------------------------------------------------------------- the min-norm QP


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_fast_solver_matches_cvxpy_on_adversarial_sets(name):
    grads = ADVERSARIAL[name]
    assert_matches_reference(grads, mgda.min_norm_weights(grads, solver="fast"))


@pytest.mark.parametrize(("k", "p"), [(2, 3), (3, 1), (5, 50), (10, 10), (30, 500), (100, 40)])
@pytest.mark.parametrize("seed", [0, 1])
def test_fast_and_cvxpy_solvers_match_the_reference_on_random_sets(k, p, seed):
    grads = rng_grads(seed, k, p)
    for solver in ("auto", "fast", "cvxpy"):
        assert_matches_reference(grads, mgda.min_norm_weights(grads, solver=solver))


@SETTINGS
@given(INT_GRADS)
def test_fast_solver_matches_cvxpy_on_integer_gradients(grads):
    # Small integer entries: duplicates, collinear rows, zero rows and 0 in the hull abound.
    assert_matches_reference(grads, mgda.min_norm_weights(grads))


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_min_norm_point_satisfies_kkt(name):
    """docs/papers/fedpg.md §8.2: ``(Pλ)_k ≥ λᵀPλ − tol`` for every k, with equality on
    the support."""
    g = ADVERSARIAL[name]
    lam = mgda.min_norm_weights(g)
    u = lam @ g
    inner = g @ u
    scale = float((g**2).sum(axis=1).max())
    if u @ u <= 1e-12 * scale:  # 0 is in the hull (to the solver's accuracy)
        return
    assert inner.min() >= u @ u - 1e-9 * scale
    assert np.all(np.abs(inner[lam > 1e-9] - u @ u) <= 1e-7 * scale)


@pytest.mark.parametrize(
    "name", ["low-rank-float32", "nearly-parallel", "duplicates", "collinear", "many-shifted"]
)
def test_degenerate_sets_are_solved_to_kkt_accuracy_in_few_iterations(name):
    """Singular or ill-conditioned Gram matrices: a certified optimum within 400 steps."""
    g = ADVERSARIAL[name].astype(np.float64)
    lam = mgda.min_norm_weights(g, max_iter=400)
    u = lam @ g
    f = u @ u
    assert f - (g @ u).min() <= 1e-9 * f


@SETTINGS
@given(
    hnp.arrays(np.float64, st.integers(1, 30), elements=st.floats(-10, 10, width=64)),
    hnp.arrays(np.float64, st.integers(1, 30), elements=st.floats(-10, 10, width=64)),
)
def test_two_gradients_match_the_mgda_closed_form(a, b):
    size = min(a.size, b.size)
    g1, g2 = a[:size], b[:size]
    if np.linalg.norm(g1 - g2) < 1e-3 * max(np.linalg.norm(g1), np.linalg.norm(g2), 1.0):
        return  # (near) duplicates: every weight is optimal
    lam = mgda.min_norm_weights(np.vstack([g1, g2]))
    assert lam[0] == pytest.approx(mgda_two(g1, g2), abs=1e-9)
    assert lam[1] == pytest.approx(1 - mgda_two(g1, g2), abs=1e-9)


def test_two_gradient_edge_cases():
    g = np.array([1.0, 2.0, -1.0])
    np.testing.assert_allclose(mgda.min_norm_weights(np.vstack([g, 3 * g])), [1.0, 0.0])
    np.testing.assert_allclose(mgda.min_norm_weights(np.vstack([g, -g])), [0.5, 0.5])
    assert mgda.min_norm_weights(np.vstack([g, g])).sum() == pytest.approx(1.0)
    np.testing.assert_allclose(
        mgda.min_norm_weights(np.vstack([g, np.zeros(3)])), [0.0, 1.0], atol=1e-12
    )


def test_small_and_degenerate_cases():
    np.testing.assert_array_equal(mgda.min_norm_weights(np.array([[3.0, 4.0]])), [1.0])
    zeros = mgda.min_norm_weights(np.zeros((4, 3)))
    assert zeros.sum() == pytest.approx(1.0) and zeros.min() >= 0
    lam = mgda.min_norm_weights(ADVERSARIAL["one-zero"])
    np.testing.assert_allclose(lam, [0.0, 1.0, 0.0], atol=1e-9)
    # 0 in the hull of three or more: the min-norm point is 0.
    for name in ("120-degrees", "opposite-and-more", "orthogonal-plus-mean"):
        g = ADVERSARIAL[name]
        assert np.linalg.norm(mgda.min_norm_weights(g) @ g) < 1e-8


def test_gram_matrix_accumulates_float32_in_float64_by_chunks():
    g = np.random.default_rng(0).normal(size=(4, 1001)).astype(np.float32)
    want = g.astype(np.float64) @ g.astype(np.float64).T
    np.testing.assert_allclose(mgda.gram_matrix(g, chunk=100), want, rtol=1e-12)
    lam = mgda.min_norm_weights_from_gram(want)
    assert_matches_reference(g, lam)


def test_large_k_is_fast_and_exact():
    grads = rng_grads(5, 400, 300)
    assert_matches_reference(grads, mgda.min_norm_weights(grads))


# ---------------------------------------------------------------- the fair objective


def test_fairness_weights_match_finite_differences():
    """docs/papers/fedpg.md §8.4: ``∇F = Σ h_i ∇L_i`` for toy quadratic losses."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 4, 3))
    b = rng.normal(size=(5, 4))

    def losses(w):
        return 0.5 * ((a @ w - b) ** 2).sum(axis=1) + 1.0

    w = rng.normal(size=3)
    grads = np.einsum("kij,ki->kj", a, a @ w - b)
    analytic = mgda.fairness_weights(losses(w)) @ grads
    eps = 1e-6
    numeric = np.array(
        [
            (mgda.fair_objective(losses(w + eps * e)) - mgda.fair_objective(losses(w - eps * e)))
            / (2 * eps)
            for e in np.eye(3)
        ]
    )
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-10)


@SETTINGS
@given(hnp.arrays(np.float64, st.integers(2, 20), elements=st.floats(0.01, 10.0)))
def test_fairness_weight_properties(losses):
    h = mgda.fairness_weights(losses)
    assert abs(h @ losses) <= 1e-9 * np.abs(h).sum() * losses.max() + 1e-12
    assert h.sum() <= 1e-12
    threshold = (losses @ losses) / losses.sum()
    clear = np.abs(losses - threshold) > 1e-9 * threshold
    assert np.all((h[clear] > 0) == (losses[clear] > threshold))
    cos = losses.sum() / (np.linalg.norm(losses) * np.sqrt(losses.size))
    assert mgda.fair_objective(losses) == pytest.approx(-cos)


def test_equal_losses_give_zero_fairness_weights():
    assert np.abs(mgda.fairness_weights(np.full(7, 0.3))).max() < 1e-12
    np.testing.assert_array_equal(mgda.fairness_weights(np.zeros(3)), np.zeros(3))


# ---------------------------------------------------------------- the common direction


def check_common_direction(grads, losses, stale=None, *, fairness=True):
    """Algorithm 1 lines 5–11 (docs/papers/fedpg.md §3.2), recomputed here; returns (d, weights)."""
    g = np.asarray(grads, dtype=np.float64)
    d, w = mgda.common_descent_direction(g, losses=losses, fairness=fairness, stale_grads=stale)
    k = g.shape[0]
    r = 0 if stale is None else len(stale)
    assert d.shape == (g.shape[1],) and w.shape == (k + 1 + r,)
    norms = np.linalg.norm(g, axis=1)
    assert np.all(w[:k][norms <= 1e-6] == 0)
    if not d.any():
        return d, w
    assert w.min() >= 0 and w.sum() == pytest.approx(1.0)
    with_fair = fairness and w[k] > 0
    cols, scaled = spec_columns(g, losses, stale, with_fair=with_fair)
    parts = [w[:k][norms > 1e-6]]
    if with_fair:
        parts.append(w[k : k + 1])
    if stale is not None:
        parts.append(w[k + 1 :][np.linalg.norm(stale, axis=1) > 1e-6])
    lam = np.concatenate(parts)
    u = lam @ cols
    # QP (5): λ is the min-norm point of these columns (cvxpy reference).
    qscale = float((cols**2).sum(axis=1).max())
    assert abs(objective(cols, lam) - reference_min_norm(cols)) <= (
        1e-6 * reference_min_norm(cols) + 1e-12 * qscale
    )
    # §2.6: d is u rescaled to the norm of the mean scaled gradient.
    assert np.linalg.norm(d) == pytest.approx(np.linalg.norm(scaled.mean(axis=0)), rel=1e-9)
    np.testing.assert_allclose(d / np.linalg.norm(d), u / np.linalg.norm(u), atol=1e-9)
    # Eq. (6): ⟨d, q_k⟩ ≥ ‖d‖‖u‖ (1 − tol) > 0 for every column, hence for every gradient.
    assert (cols @ d).min() >= (1 - 1e-6) * np.linalg.norm(d) * np.linalg.norm(u)
    assert (g @ d).min() >= -1e-9 * np.linalg.norm(d) * norms.max()
    assert np.all(g[norms > 1e-6] @ d > 0)
    return d, w


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
@pytest.mark.parametrize("fairness", [True, False])
def test_common_direction_on_adversarial_sets(name, fairness):
    grads = ADVERSARIAL[name]
    losses = np.random.default_rng(len(name)).uniform(0.5, 2.0, size=len(grads))
    d, _ = check_common_direction(grads, losses, fairness=fairness)
    if name in STATIONARY:
        # 0 is in the hull of the normalized gradients (docs/papers/fedpg.md §8.3)
        assert not d.any()
    else:
        assert d.any()


@SETTINGS
@given(INT_GRADS, st.data())
def test_common_direction_on_integer_gradients(grads, data):
    losses = np.array(
        data.draw(st.lists(st.floats(0.1, 5.0), min_size=len(grads), max_size=len(grads)))
    )
    check_common_direction(grads, losses)


@pytest.mark.parametrize(("k", "p"), [(2, 5), (10, 100), (40, 20), (100, 3000)])
def test_common_direction_on_random_sets_with_stale_gradients(k, p):
    rng = np.random.default_rng(k)
    grads = rng_grads(k, k, p) * rng.uniform(0.1, 10.0, size=(k, 1))
    stale = rng_grads(k + 1, k // 2 + 1, p)
    stale[0] = 0.0
    losses = rng.uniform(0.1, 3.0, size=k)
    d, w = check_common_direction(grads, losses, stale)
    assert w[k + 1] == 0.0  # the zero stale gradient
    assert np.all(stale[1:] @ d > 0)


def test_conflicting_case_fedsgd_average_is_not_common_descent():
    """docs/papers/fedpg.md §8.1: the plain average hurts a client; the min-norm direction does
    not."""
    g = np.array([[1.0, 0.0, 0.0], [-0.9, 0.5, 0.0], [0.2, -1.0, 0.1]])
    mean = g.mean(axis=0)
    assert (g @ mean).min() < 0
    d, _ = check_common_direction(g, np.array([1.0, 2.0, 3.0]))
    assert (g @ d).min() > 0


def test_rescaling_options():
    """docs/papers/fedpg.md §8.5 and §9.7: the norm of d, and its direction unchanged."""
    grads = rng_grads(0, 6, 30) * np.arange(1, 7)[:, None]
    losses = np.linspace(1.0, 2.0, 6)
    d, w = mgda.common_descent_direction(grads, losses=losses)
    raw, _ = mgda.common_descent_direction(grads, losses=losses, rescale="raw_mean")
    none, w_none = mgda.common_descent_direction(grads, losses=losses, rescale="none")
    assert np.linalg.norm(raw) == pytest.approx(np.linalg.norm(grads.mean(axis=0)))
    cols, scaled = spec_columns(grads, losses)
    assert np.linalg.norm(d) == pytest.approx(np.linalg.norm(scaled.mean(axis=0)))
    np.testing.assert_allclose(none, w_none[:7] @ cols, atol=1e-10)
    for other in (raw, none):
        np.testing.assert_allclose(other / np.linalg.norm(other), d / np.linalg.norm(d))


def test_norm_equalization_ignores_one_huge_gradient():
    """docs/papers/fedpg.md §8.9: scaling one gradient by 1e3 keeps the direction; zero gradients
    are dropped."""
    grads = rng_grads(4, 5, 40)
    losses = np.array([1.0, 1.5, 0.7, 2.0, 1.1])
    d, w = mgda.common_descent_direction(grads, losses=losses)
    big = grads.copy()
    big[2] *= 1e3
    d_big, w_big = mgda.common_descent_direction(big, losses=losses)
    np.testing.assert_allclose(d_big / np.linalg.norm(d_big), d / np.linalg.norm(d), atol=1e-8)
    np.testing.assert_allclose(w_big, w, atol=1e-8)
    with_zero = np.vstack([grads, np.full(40, 1e-8)])
    d_zero, w_zero = mgda.common_descent_direction(with_zero, losses=np.append(losses, 9.0))
    np.testing.assert_allclose(d_zero, d, atol=1e-10)
    assert w_zero[5] == 0.0


def test_equal_losses_skip_the_fair_column():
    """docs/papers/fedpg.md §9.6 / §8.3: h = 0 leaves the fair column out instead of giving
    d = 0."""
    grads = rng_grads(1, 4, 10)
    d, w = mgda.common_descent_direction(grads, losses=np.full(4, 0.8))
    plain, w_plain = mgda.common_descent_direction(grads, fairness=False)
    assert w[4] == 0.0 and d.any()
    np.testing.assert_allclose(d, plain, atol=1e-12)
    np.testing.assert_allclose(w, w_plain, atol=1e-12)


def test_fair_column_that_closes_the_hull_is_dropped():
    """docs/papers/fedpg.md §9.6: u = 0 only because of the fair column → solve again without it."""
    g = np.array([[1.0, 0.0], [2.0, 0.0]])  # scaled: both 1.5 e_1; f points along −e_1
    d, w = mgda.common_descent_direction(g, losses=np.array([1.0, 3.0]))
    assert w[2] == 0.0
    np.testing.assert_allclose(d, [1.5, 0.0])


def test_single_client_and_all_zero_gradients():
    g = np.array([[3.0, -4.0]])
    d, w = mgda.common_descent_direction(g, losses=np.array([0.5]))
    np.testing.assert_allclose(d, [3.0, -4.0])
    np.testing.assert_allclose(w, [1.0, 0.0])
    d, w = mgda.common_descent_direction(np.zeros((3, 4)), losses=np.ones(3))
    assert not d.any() and not w.any()


def test_float32_gradients():
    grads = rng_grads(2, 8, 50).astype(np.float32)
    losses = np.linspace(0.5, 1.5, 8)
    d, _ = check_common_direction(grads, losses)
    assert d.dtype == np.float64


# ---------------------------------------------------------------- direction drift


def drift_case(seed: int, k: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    grads = rng_grads(seed, k, p, shift=0.3)
    d, _ = mgda.common_descent_direction(grads, fairness=False)
    return grads, d


def check_drift(g_i, d, others):
    gamma = mgda.drift_coefficient(g_i, d, others)
    assert 0.0 <= gamma <= 1.0
    brute = brute_force_gamma(g_i, d, others)
    if len(others) == 0 or gamma == 0.0:
        assert brute == pytest.approx(gamma, abs=1e-6)
        return gamma

    def worst(gamma: float) -> float:
        return float((others @ mgda.drifted_direction(g_i, d, gamma)).min())

    scale = np.linalg.norm(others, axis=1).max() * max(np.linalg.norm(d), np.linalg.norm(g_i))
    assert worst(gamma) >= -1e-12 * scale  # feasible
    # maximal: a little more breaks some constraint (docs/papers/fedpg.md §8.6)
    if gamma < 1 - 1e-6:
        assert worst(gamma + 1e-6) < 0
    if brute == 0.0 and worst(0.0) < 0:
        # No grid point is feasible: the feasible set is the single point γ (an isolated
        # intersection of an upper and a lower bound), which no grid holds.
        assert worst(gamma - 1e-6) < 0
    else:
        assert gamma == pytest.approx(brute, abs=1e-6)
    return gamma


@pytest.mark.parametrize(("seed", "k", "p"), [(0, 3, 5), (1, 10, 20), (2, 30, 200), (3, 8, 3)])
def test_drift_matches_brute_force_on_random_sets(seed, k, p):
    grads, d = drift_case(seed, k, p)
    gammas = mgda.drift_coefficients(grads, d)
    for i in range(k):
        others = np.delete(grads, i, axis=0)
        assert gammas[i] == pytest.approx(check_drift(grads[i], d, others), abs=1e-12)
        if d.any():  # d_i stays a strict descent direction for client i itself
            assert grads[i] @ mgda.drifted_direction(grads[i], d, gammas[i]) > 0


@SETTINGS
@given(INT_GRADS)
def test_drift_matches_brute_force_on_integer_gradients(grads):
    d, _ = mgda.common_descent_direction(grads, fairness=False)
    for i in range(len(grads)):
        check_drift(grads[i], d, np.delete(grads, i, axis=0))


@SETTINGS
@given(
    hnp.arrays(np.float64, (3, 4), elements=st.integers(-3, 3).map(float)),
    hnp.arrays(np.float64, 4, elements=st.integers(-3, 3).map(float)),
)
def test_drift_matches_brute_force_for_any_direction(others, d):
    # d need not be a descent direction here: the answer may be 0 (infeasible) or interior.
    g_i = np.array([1.0, -2.0, 0.5, 3.0])
    check_drift(g_i, d, others)


def test_drift_edge_cases():
    g_i = np.array([1.0, -1.0, 0.0])
    d = np.array([1.0, 0.0, 0.0])
    # No other online clients: full drift.
    assert mgda.drift_coefficient(g_i, d, np.zeros((0, 3))) == 1.0
    # No conflict: g_i·g_j ≥ d·g_j for every j.
    assert mgda.drift_coefficient(g_i, d, np.array([[1.0, -1.0, 0.0], [0.0, 0.0, 1.0]])) == 1.0
    # d orthogonal to a g_j that g_i conflicts with: no drift at all.
    assert mgda.drift_coefficient(g_i, d, np.array([[0.0, 1.0, 0.0]])) == 0.0
    # One conflicting client: |d·g_j| / (|d·g_j| + |g_i·g_j|) (docs/papers/fedpg.md §2.7).
    g_j = np.array([1.0, 3.0, 0.0])  # d·g_j = 1, g_i·g_j = −2
    assert mgda.drift_coefficient(g_i, d, g_j[None]) == pytest.approx(1 / 3)
    # Positive scaling of the other gradients does not matter; of g_i it does.
    assert mgda.drift_coefficient(g_i, d, 7.0 * g_j[None]) == pytest.approx(1 / 3)
    assert mgda.drift_coefficient(2 * g_i, d, g_j[None]) == pytest.approx(1 / 5)
    # d is not a descent direction for some g_j and drifting cannot fix it: 0.
    assert mgda.drift_coefficient(g_i, d, np.array([[-1.0, 3.0, 0.0]])) == 0.0
    # ... but when drifting fixes it, the largest feasible γ.
    assert mgda.drift_coefficient(g_i, d, np.array([[-1.0, -3.0, 0.0]])) == 1.0
    np.testing.assert_allclose(mgda.drifted_direction(g_i, d, 0.25), [1.0, -0.25, 0.0])


def test_drift_coefficients_for_one_client_and_spec_identity():
    assert mgda.drift_coefficients(np.array([[1.0, 2.0]]), np.array([1.0, 2.0]))[0] == 1.0
    # θ_i = θ − η d_i = θ_new − η γ (g_i − d), the identity of docs/papers/fedpg.md §2.7 in this
    # sign convention
    grads, d = drift_case(7, 5, 9)
    gamma = mgda.drift_coefficients(grads, d)[0]
    np.testing.assert_allclose(
        -mgda.drifted_direction(grads[0], d, gamma), -d - gamma * (grads[0] - d)
    )


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("grads", "match"),
    [
        (np.array([[1.0, np.nan]]), "NaN or infinite"),
        (np.array([[1.0, np.inf], [0.0, 1.0]]), "NaN or infinite"),
        (np.ones(3), "2-D"),
        (np.ones((2, 2, 2)), "2-D"),
        (np.zeros((0, 4)), "K=0"),
        (np.zeros((3, 0)), "no parameters"),
        (np.array([["a", "b"]]), "real-valued"),
    ],
)
def test_bad_gradients_raise(grads, match):
    with pytest.raises(ValueError, match=match):
        mgda.min_norm_weights(grads)
    with pytest.raises(ValueError, match=match):
        mgda.common_descent_direction(grads, fairness=False)


def test_bad_arguments_raise():
    g = np.eye(3)
    with pytest.raises(ValueError, match="solver"):
        mgda.min_norm_weights(g, solver="osqp")
    with pytest.raises(ValueError, match="losses"):
        mgda.common_descent_direction(g)
    with pytest.raises(ValueError, match="losses has 2 entries"):
        mgda.common_descent_direction(g, losses=[1.0, 2.0])
    with pytest.raises(ValueError, match="losses contains NaN"):
        mgda.common_descent_direction(g, losses=[1.0, np.nan, 2.0])
    with pytest.raises(ValueError, match="rescale"):
        mgda.common_descent_direction(g, fairness=False, rescale="median")
    with pytest.raises(ValueError, match="stale_grads has 2 parameters"):
        mgda.common_descent_direction(g, fairness=False, stale_grads=np.ones((1, 2)))
    with pytest.raises(ValueError, match="stale_grads contains NaN"):
        mgda.common_descent_direction(g, fairness=False, stale_grads=np.full((1, 3), np.nan))
    with pytest.raises(ValueError, match="gram must be a square"):
        mgda.min_norm_weights_from_gram(np.ones((2, 3)))
    with pytest.raises(ValueError, match="other_grads has 2 parameters"):
        mgda.drift_coefficient(g[0], g[1], np.ones((1, 2)))
    with pytest.raises(ValueError, match="direction has 2 entries"):
        mgda.drift_coefficient(g[0], np.ones(2), g)
    with pytest.raises(ValueError, match="g_i contains NaN"):
        mgda.drift_coefficient(np.array([np.nan, 0.0, 0.0]), g[1], g)
    with pytest.raises(ValueError, match="other_grads must be a 2-D"):
        mgda.drift_coefficient(g[0], g[1], g[2])
