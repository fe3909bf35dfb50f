"""PPFL's membership and Laplacian math against independent references (cvxpy, loops,
finite differences): docs/papers/ppfl.md §8's checks 1-4, 10 and 13."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from scipy.optimize import approx_fprime

from pflarena.methods.ppfl.population import (
    affinity_from_histograms,
    affinity_problem,
    exponentiated_gradient_step,
    floor_on_simplex,
    laplacian,
    laplacian_gradient,
    laplacian_penalty,
    membership_step_gradient,
    mm_surrogate_penalty,
    penalty_gradient,
    population_objective,
)

#: tight interior-point tolerances: the default ones stop about 1e-5 from the optimum. At
#: these CLARABEL may end on "almost solved" and cvxpy warns that the solution "may be
#: inaccurate"; the comparisons below bound the error themselves.
pytestmark = pytest.mark.filterwarnings("ignore:Solution may be inaccurate")
TIGHT = {"tol_gap_abs": 1e-12, "tol_gap_rel": 1e-12, "tol_feas": 1e-12, "max_iter": 500}


def _kl_prox(g: np.ndarray, c0: np.ndarray, lr: float, floor: float = 0.0) -> np.ndarray:
    """argmin over the (ε-truncated) simplex of ⟨g, c − c0⟩ + KL(c‖c0)/η, by cvxpy."""
    c = cp.Variable(len(c0))
    objective = g @ (c - c0) + cp.sum(cp.rel_entr(c, c0)) / lr
    constraints = [cp.sum(c) == 1, c >= floor]
    cp.Problem(cp.Minimize(objective), constraints).solve(solver=cp.CLARABEL, **TIGHT)
    return np.asarray(c.value)


def _random_simplex(rng: np.random.Generator, k: int) -> np.ndarray:
    return rng.dirichlet(np.ones(k))


@pytest.mark.parametrize("case", range(12))
def test_exponentiated_gradient_step_is_the_kl_prox_on_the_simplex(case):
    rng = np.random.default_rng(case)
    k = int(rng.integers(2, 7))
    c0 = 0.5 * _random_simplex(rng, k) + 0.5 / k  # interior: the floor stays inactive
    g = rng.normal(scale=2.0, size=k)
    lr = float(rng.uniform(0.05, 1.5))
    ours = exponentiated_gradient_step(c0, g, lr)
    reference = _kl_prox(g, c0, lr)
    assert ours.min() >= 1e-6
    assert np.max(np.abs(ours - reference)) < 1e-6
    assert abs(ours.sum() - 1.0) < 1e-12


@pytest.mark.parametrize("case", range(8))
def test_the_floor_makes_it_the_kl_prox_on_the_truncated_simplex(case):
    # large steps push coordinates far below ε: the step is then the prox with c ≥ ε
    rng = np.random.default_rng(100 + case)
    k = int(rng.integers(3, 7))
    c0 = _random_simplex(rng, k)
    g = rng.normal(scale=30.0, size=k)
    lr, floor = 2.0, 1e-3
    ours = exponentiated_gradient_step(c0, g, lr, eps=floor)
    assert (ours >= floor - 1e-15).all() and abs(ours.sum() - 1.0) < 1e-12
    assert np.sum(ours <= floor + 1e-12) >= 1  # the floor is active in these cases
    assert np.max(np.abs(ours - _kl_prox(g, c0, lr, floor))) < 1e-6


def test_floor_on_simplex_is_the_kl_projection():
    rng = np.random.default_rng(3)
    for _ in range(10):
        k = int(rng.integers(2, 8))
        p = rng.dirichlet(0.3 * np.ones(k)) + 1e-4
        p /= p.sum()
        floor = 0.02
        q = cp.Variable(k)
        cp.Problem(cp.Minimize(cp.sum(cp.rel_entr(q, p))), [cp.sum(q) == 1, q >= floor]).solve(
            solver=cp.CLARABEL, **TIGHT
        )
        assert np.max(np.abs(floor_on_simplex(p, floor) - q.value)) < 1e-6


def test_a_zero_coordinate_comes_back_only_through_the_floor():
    c0 = np.array([0.0, 0.5, 0.5])
    out = exponentiated_gradient_step(c0, np.array([-100.0, 0.0, 0.0]), 1.0)
    assert out[0] == pytest.approx(1e-6)
    assert (out >= 1e-6).all() and abs(out.sum() - 1) < 1e-12


def test_rows_are_stepped_independently_and_k1_stays_exactly_one():
    rng = np.random.default_rng(0)
    c = rng.dirichlet(np.ones(4), size=5)
    g = rng.normal(size=(5, 4))
    together = exponentiated_gradient_step(c, g, 0.7)
    apart = np.stack([exponentiated_gradient_step(c[i], g[i], 0.7) for i in range(5)])
    np.testing.assert_array_equal(together, apart)
    one = exponentiated_gradient_step(np.array([1.0]), np.array([123.4]), 3.0)
    assert one.tolist() == [1.0]


def test_bad_membership_input_is_refused():
    with pytest.raises(ValueError, match="simplex|summing"):
        exponentiated_gradient_step(np.array([0.5, 0.6]), np.zeros(2), 0.1)
    with pytest.raises(ValueError, match="NaN"):
        exponentiated_gradient_step(np.array([0.5, 0.5]), np.array([np.nan, 0.0]), 0.1)
    with pytest.raises(ValueError, match="step size"):
        exponentiated_gradient_step(np.array([0.5, 0.5]), np.zeros(2), 0.0)
    with pytest.raises(ValueError, match="shape"):
        exponentiated_gradient_step(np.array([0.5, 0.5]), np.zeros(3), 0.1)


# ------------------------------------------------------------------ the Laplacian
def _psd_affinity(rng: np.random.Generator, m: int) -> np.ndarray:
    return affinity_from_histograms(rng.integers(0, 20, size=(m, 6)).astype(float))


def test_laplacian_penalty_is_half_the_weighted_pairwise_distances():
    rng = np.random.default_rng(1)
    m, k = 7, 3
    w = _psd_affinity(rng, m)
    c = rng.dirichlet(np.ones(k), size=m)
    loops = 0.5 * sum(w[i, j] * np.sum((c[i] - c[j]) ** 2) for i in range(m) for j in range(m))
    assert laplacian_penalty(w, c) == pytest.approx(loops, rel=1e-12)
    np.testing.assert_allclose(laplacian(w) @ np.ones(m), 0.0, atol=1e-12)


def test_laplacian_gradient_matches_finite_differences():
    rng = np.random.default_rng(2)
    m, k = 5, 4
    w = _psd_affinity(rng, m)
    c = rng.dirichlet(np.ones(k), size=m)
    numeric = approx_fprime(c.ravel(), lambda v: laplacian_penalty(w, v.reshape(m, k)), 1e-7)
    np.testing.assert_allclose(laplacian_gradient(w, c).ravel(), numeric, atol=1e-5)
    np.testing.assert_allclose(penalty_gradient(w, c, 0.3), 0.3 * laplacian_gradient(w, c))
    # the authors' code: λ D C, no −W C and no factor 2 (docs/papers/ppfl.md §9.4)
    np.testing.assert_allclose(
        penalty_gradient(w, c, 0.3, "degree-only"), 0.3 * np.diag(w.sum(1)) @ c
    )


def test_mm_surrogate_majorizes_and_touches_with_a_psd_affinity():
    rng = np.random.default_rng(4)
    m, k = 8, 3
    w = _psd_affinity(rng, m)
    assert affinity_problem(w) is None
    c_t = rng.dirichlet(np.ones(k), size=m)
    assert mm_surrogate_penalty(w, c_t, c_t) == pytest.approx(laplacian_penalty(w, c_t))
    for _ in range(200):
        c = rng.dirichlet(np.ones(k), size=m)
        assert mm_surrogate_penalty(w, c, c_t) >= laplacian_penalty(w, c) - 1e-10
    # the same gradient at C^t: the EG step on the surrogate is the step of Eq. 14-15
    numeric = approx_fprime(
        c_t.ravel(), lambda v: mm_surrogate_penalty(w, v.reshape(m, k), c_t), 1e-7
    )
    np.testing.assert_allclose(numeric, laplacian_gradient(w, c_t).ravel(), atol=1e-5)


def test_without_psd_the_surrogate_can_undercut():
    rng = np.random.default_rng(5)
    m, k = 6, 3
    w = np.abs(rng.normal(size=(m, m)))
    w = (w + w.T) / 2
    np.fill_diagonal(w, 0.0)  # nonnegative, symmetric, zero diagonal: indefinite
    assert "positive semi-definite" in affinity_problem(w)
    c_t = rng.dirichlet(np.ones(k), size=m)
    gaps = [
        mm_surrogate_penalty(w, c, c_t) - laplacian_penalty(w, c)
        for c in rng.dirichlet(np.ones(k), size=(300, m))
    ]
    assert min(gaps) < -1e-6


def test_affinity_is_the_cosine_of_histograms_and_checked():
    counts = np.array([[3.0, 0.0, 1.0], [6.0, 0.0, 2.0], [0.0, 5.0, 0.0], [0.0, 0.0, 0.0]])
    w = affinity_from_histograms(counts)
    for i in range(3):
        for j in range(3):
            expected = counts[i] @ counts[j] / np.linalg.norm(counts[i]) / np.linalg.norm(counts[j])
            assert w[i, j] == pytest.approx(expected)
    assert w[3].tolist() == [0.0, 0.0, 0.0, 0.0]  # an empty histogram is like no one
    assert affinity_problem(w) is None
    centered = affinity_from_histograms(counts[:3], "centered-cosine")
    assert affinity_problem(centered) is None and centered.min() >= 0
    assert "symmetric" in affinity_problem(np.array([[1.0, 0.2], [0.3, 1.0]]))
    assert "negative" in affinity_problem(np.array([[1.0, -0.2], [-0.2, 1.0]]))
    assert "square" in affinity_problem(np.ones((2, 3)))


# ------------------------------------------------------------------ the C-block
def test_normalized_scaling_is_the_paper_step_with_step_size_over_p():
    rng = np.random.default_rng(6)
    m, k = 4, 3
    c = rng.dirichlet(np.ones(k), size=m)
    grads = rng.normal(size=(m, k))
    penalty = rng.normal(size=(m, k))
    p = np.array([0.1, 0.2, 0.3, 0.4])
    lr = 0.05
    normalized = exponentiated_gradient_step(
        c, membership_step_gradient(grads, p, penalty, "normalized"), lr
    )
    paper = np.stack(
        [
            exponentiated_gradient_step(
                c[i], membership_step_gradient(grads[i], p[i], penalty[i], "paper"), lr / p[i]
            )
            for i in range(m)
        ]
    )
    np.testing.assert_allclose(normalized, paper, atol=1e-12)


def test_mm_and_eg_converge_to_the_exact_convex_membership_block():
    """Spec check 13: with θ fixed and f_i convex in c_i (a linear-regression PPFL2 loss,
    f_i(c) = ‖A_i c − b_i‖²/n_i), repeated MM + EG steps on C reach the cvxpy optimum of
    min_C Σ p_i f_i(c_i) + λ tr(CᵀLC) over the product of simplices."""
    rng = np.random.default_rng(7)
    m, k, n, lam = 6, 3, 20, 0.05
    a = rng.normal(size=(m, n, k))
    b = rng.normal(size=(m, n))
    p = rng.uniform(1, 3, size=m)
    p /= p.sum()
    w = _psd_affinity(rng, m)

    def grad_f(i: int, ci: np.ndarray) -> np.ndarray:
        return 2.0 * a[i].T @ (a[i] @ ci - b[i]) / n

    c = np.full((m, k), 1.0 / k)
    for _ in range(4000):
        loss_grads = np.stack([grad_f(i, c[i]) for i in range(m)])
        step = membership_step_gradient(loss_grads, p, penalty_gradient(w, c, lam), "paper")
        c = exponentiated_gradient_step(c, step, 2.0, eps=1e-12)

    var = cp.Variable((m, k))
    lap = laplacian(w)
    lap_sqrt = np.linalg.cholesky(lap + 1e-12 * np.eye(m)).T  # L = RᵀR (PSD)
    objective = sum(p[i] * cp.sum_squares(a[i] @ var[i] - b[i]) / n for i in range(m))
    objective = objective + lam * cp.sum_squares(lap_sqrt @ var)
    cp.Problem(cp.Minimize(objective), [var >= 0, cp.sum(var, axis=1) == 1]).solve(
        solver=cp.CLARABEL, **TIGHT
    )

    def value(cm: np.ndarray) -> float:
        losses = [np.sum((a[i] @ cm[i] - b[i]) ** 2) / n for i in range(m)]
        return population_objective(losses, p, w, cm, lam)

    assert value(c) == pytest.approx(value(var.value), abs=1e-7)
    assert np.max(np.abs(c - var.value)) < 1e-3


def test_the_codes_scaling_leaves_the_penalty_row_as_it_is():
    grads, penalty = np.array([[0.5, -0.5]]), np.array([[2.0, 1.0]])
    p = np.array([0.25])
    np.testing.assert_allclose(membership_step_gradient(grads, p, penalty, "code"), [[2.5, 0.5]])
    np.testing.assert_allclose(
        membership_step_gradient(grads, p, penalty, "normalized"), [[8.5, 3.5]]
    )
    np.testing.assert_allclose(
        membership_step_gradient(grads, p, penalty, "paper"), [[2.125, 0.875]]
    )
