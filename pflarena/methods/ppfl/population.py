"""PPFL's server-side math: memberships on the simplex, the affinity graph and its Laplacian.

Di, Yang, Ye and Chang, "PPFL: A Personalized Federated Learning Framework for
Heterogeneous Population", INFORMS Journal on Computing (docs/methods/ppfl.md). Client i's
membership vector ``c_i`` lives on the probability simplex Δ^K; the memberships of all M
clients are the rows of ``C`` (M × K). The objective is (Eq. 4, matrix form Eq. 9)

    F(θ, C) = Σ_i p_i f_i(θ, c_i) + (λ/2) Σ_ij w_ij ‖c_i − c_j‖²
            = Σ_i p_i f_i(θ, c_i) + λ tr(Cᵀ L C),        L = D − W,  D = diag(W 1),

and the membership block is updated by one step of mirror descent with the entropy mirror
map (exponentiated gradient, Eq. 15) on the majorization-minimization surrogate of Eq. 13,
which decouples the Laplacian over clients. Everything here is plain numpy so that the
strategy, the client solver and the tests share one implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

__all__ = [
    "MEMBERSHIP_FLOOR",
    "affinity_from_histograms",
    "affinity_problem",
    "exponentiated_gradient_step",
    "floor_on_simplex",
    "laplacian",
    "laplacian_gradient",
    "laplacian_product",
    "laplacian_penalty",
    "log_sum_exp",
    "membership_step_gradient",
    "mm_surrogate_penalty",
    "penalty_gradient",
    "population_objective",
    "uniform_memberships",
]

#: Remark 3.2: every membership coordinate is kept at or above ε, so that a coordinate that
#: reaches 0 can still grow again (a multiplicative update never moves it off 0).
MEMBERSHIP_FLOOR = 1e-6


def uniform_memberships(num_clients: int, num_canonical: int) -> np.ndarray:
    """``C⁰``: every client's membership ``1/K`` in every coordinate (paper, O4.3)."""
    return np.full((num_clients, num_canonical), 1.0 / num_canonical)


def floor_on_simplex(p: np.ndarray, eps: float = MEMBERSHIP_FLOOR) -> np.ndarray:
    """The KL projection of each row of ``p`` onto ``{c ∈ Δ^K : c ≥ eps}``.

    ``argmin_{c ≥ eps, 1ᵀc = 1} KL(c ‖ p)`` is ``c_k = max(eps, s·p_k)`` with the one scale
    ``s`` that makes the row sum to 1 (the KKT conditions of the problem), so coordinates
    at or above the floor keep their ratios and only those below it are lifted to ``eps``.
    Composed with the exponentiated-gradient update it is the exact mirror step on the
    truncated simplex (:func:`exponentiated_gradient_step`).

    Parameters
    ----------
    p
        Nonnegative rows summing to 1, shape ``(K,)`` or ``(M, K)``.
    eps
        The floor; ``K · eps`` must be below 1.
    """
    p = np.asarray(p, dtype=np.float64)
    rows = np.atleast_2d(p)
    k = rows.shape[1]
    if not 0.0 <= eps * k < 1.0:
        raise ValueError(f"the floor eps={eps} times K={k} must be in [0, 1)")
    out = np.empty_like(rows)
    for i, row in enumerate(rows):
        if row.min() >= eps:  # nothing to lift: the row itself (exact, no rescaling)
            out[i] = row
            continue
        order = np.argsort(-row)  # largest first
        ranked = row[order]
        tops = np.cumsum(ranked)
        for kept in range(k, 0, -1):  # the top ``kept`` coordinates scaled, the rest at eps
            scale = (1.0 - (k - kept) * eps) / tops[kept - 1] if tops[kept - 1] > 0 else np.inf
            if scale * ranked[kept - 1] >= eps:
                break
        lifted = np.full(k, eps)
        lifted[:kept] = scale * ranked[:kept]
        out[i, order] = lifted
    return out.reshape(p.shape)


def exponentiated_gradient_step(
    c: np.ndarray, grad: np.ndarray, lr: float, eps: float = MEMBERSHIP_FLOOR
) -> np.ndarray:
    """One mirror-descent step with the entropy mirror map on the simplex (Eq. 14-15).

    ``c⁺ = argmin_{c ∈ Δ^K, c ≥ eps} ⟨g, c − c⁰⟩ + KL(c ‖ c⁰)/η``, whose closed form is
    the exponentiated-gradient (multiplicative-weights) update of Eq. 15,
    ``c⁺_k ∝ c⁰_k exp(−η g_k)``, computed in the log domain (``log c⁰ − η g`` minus its
    log-sum-exp, so no exponential overflows), followed by the ε floor of Remark 3.2
    (:func:`floor_on_simplex`; it changes nothing when every coordinate is already at or
    above ``eps``).

    Parameters
    ----------
    c
        Current membership(s) on the simplex, shape ``(K,)`` or ``(M, K)`` (one per row).
    grad
        The gradient ``G_{c_i}`` of Eq. 14, same shape.
    lr
        The step size η (> 0).
    eps
        The floor ε (1e-6 in docs/papers/ppfl.md §9.14).

    Returns
    -------
    numpy.ndarray
        The new membership(s), every coordinate ≥ ``eps``, rows summing to 1.
    """
    c = np.asarray(c, dtype=np.float64)
    grad = np.asarray(grad, dtype=np.float64)
    if c.shape != grad.shape:
        raise ValueError(f"membership shape {c.shape} and gradient shape {grad.shape} differ")
    if c.ndim not in (1, 2) or c.shape[-1] < 1:
        raise ValueError(f"memberships must be (K,) or (M, K), got shape {c.shape}")
    if not np.isfinite(grad).all():
        raise ValueError("the membership gradient contains NaN or infinity")
    if not (np.isfinite(lr) and lr > 0):
        raise ValueError(f"the membership step size must be > 0, got {lr}")
    if (c < 0).any() or not np.allclose(c.sum(axis=-1), 1.0, atol=1e-6):
        raise ValueError("memberships must be nonnegative with rows summing to 1")
    with np.errstate(divide="ignore"):  # a zero coordinate stays at -inf until the floor
        logits = np.log(c) - lr * grad
    # (the row maximum is finite: c > 0 somewhere on the simplex)
    return floor_on_simplex(np.exp(logits - log_sum_exp(logits)[..., None]), eps)


def log_sum_exp(a: np.ndarray) -> np.ndarray:
    """``log Σ exp`` over the last axis, shifted by its maximum (rows with a finite one).

    Written out because :func:`scipy.special.logsumexp` does the same behind array-API
    dispatch that costs about 0.1 ms a call, and a client's membership epoch calls it once
    per minibatch on a K-vector.
    """
    top = a.max(axis=-1, keepdims=True)
    return top[..., 0] + np.log(np.exp(a - top).sum(axis=-1))


# ------------------------------------------------------------------ the affinity graph
def affinity_from_histograms(
    histograms: np.ndarray, mode: Literal["cosine", "centered-cosine"] = "cosine"
) -> np.ndarray:
    """The paper's affinity matrix W from clients' label (or word) histograms (§5.4, O4.3).

    ``cosine``: ``w_ij = cos(h_i, h_j)`` (Table 1 data). ``centered-cosine``:
    ``0.5 + 0.5 cos(h_i − h̄, h_j − h̄)`` with ``h̄`` the mean histogram (the authors'
    Dirichlet data). Both are Gram matrices of unit vectors (plus a constant), hence
    symmetric and positive semi-definite, which the MM step needs. A client with an all-zero
    histogram has zero similarity to everyone (scikit-learn's convention).
    """
    from sklearn.metrics.pairwise import cosine_similarity

    counts = np.asarray(histograms, dtype=np.float64)
    if counts.ndim != 2:
        raise ValueError(f"histograms must be (clients, classes), got shape {counts.shape}")
    if (counts < 0).any() or not np.isfinite(counts).all():
        raise ValueError("histograms must be finite and nonnegative")
    if mode == "cosine":
        return cosine_similarity(counts)
    if mode == "centered-cosine":
        return 0.5 + 0.5 * cosine_similarity(counts - counts.mean(axis=0))
    raise ValueError(f"unknown affinity mode {mode!r}; use 'cosine' or 'centered-cosine'")


def affinity_problem(affinity: np.ndarray, tol: float = 1e-8) -> str | None:
    """Why ``affinity`` cannot serve as W for the MM step, or ``None``.

    W must be square, finite, symmetric, elementwise nonnegative (a similarity) and
    positive semi-definite (smallest eigenvalue ≥ ``-tol`` times its largest magnitude):
    the MM surrogate of Eq. 13 majorizes F only when ``−Cᵀ(W ⊗ I)C`` is concave
    (docs/papers/ppfl.md §9.6).
    """
    w = np.asarray(affinity, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        return f"W must be square, got shape {w.shape}"
    if not np.isfinite(w).all():
        return "W contains NaN or infinity"
    if not np.allclose(w, w.T, atol=1e-10):
        return "W is not symmetric"
    if (w < -1e-12).any():
        return "W has negative entries"
    scale = max(1.0, float(np.abs(w).max(initial=0.0)))
    smallest = float(np.linalg.eigvalsh(w).min(initial=0.0))
    if smallest < -tol * scale:
        return f"W is not positive semi-definite (smallest eigenvalue {smallest:.3g})"
    return None


def laplacian(affinity: np.ndarray) -> np.ndarray:
    """``L = D − W`` with ``D = diag(W 1)`` (the M × M graph Laplacian; Eq. 9 lifts it by ⊗ I_K)."""
    w = np.asarray(affinity, dtype=np.float64)
    return np.diag(w.sum(axis=1)) - w


def laplacian_product(affinity: np.ndarray, memberships: np.ndarray) -> np.ndarray:
    """``L C = D C − W C`` (M × K), without forming the M × M Laplacian: at 3,550 clients
    L is 96 MB, and building it (and D) for every product took most of a PPFL round's
    server time."""
    w = np.asarray(affinity, dtype=np.float64)
    c = np.asarray(memberships, dtype=np.float64)
    return w.sum(axis=1)[:, None] * c - w @ c


def laplacian_penalty(affinity: np.ndarray, memberships: np.ndarray) -> float:
    """``(1/2) Σ_ij w_ij ‖c_i − c_j‖² = tr(Cᵀ L C)``: Eq. 4's penalty without its λ."""
    c = np.asarray(memberships, dtype=np.float64)
    return float(np.sum(c * laplacian_product(affinity, c)))


def laplacian_gradient(affinity: np.ndarray, memberships: np.ndarray) -> np.ndarray:
    """``∇_C tr(Cᵀ L C) = 2 L C`` (M × K); row i is ``2(d_ii c_i − Σ_j w_ij c_j)``."""
    return 2.0 * laplacian_product(affinity, memberships)


def mm_surrogate_penalty(
    affinity: np.ndarray, memberships: np.ndarray, reference: np.ndarray
) -> float:
    """The Laplacian part of the MM surrogate S_t of Eq. 13, without its λ.

    ``Σ_i d_ii ‖c_i‖² − [tr(C_tᵀ W C_t) + 2 tr((W C_t)ᵀ (C − C_t))]``: the concave
    ``−tr(Cᵀ W C)`` (W PSD) replaced by its tangent at ``C_t = reference``. It majorizes
    :func:`laplacian_penalty` and touches it at ``C_t``, with the same gradient there, and
    it separates over clients: client i's part is ``d_ii ‖c_i‖² − 2⟨(W C_t)_i, c_i⟩`` plus
    constants.
    """
    w = np.asarray(affinity, dtype=np.float64)
    c = np.asarray(memberships, dtype=np.float64)
    c_ref = np.asarray(reference, dtype=np.float64)
    degree = w.sum(axis=1)
    tangent = np.trace(c_ref.T @ w @ c_ref) + 2.0 * np.trace((w @ c_ref).T @ (c - c_ref))
    return float(np.sum(degree * np.sum(c * c, axis=1)) - tangent)


def penalty_gradient(
    affinity: np.ndarray,
    memberships: np.ndarray,
    lam: float,
    mode: Literal["laplacian", "degree-only"] = "laplacian",
) -> np.ndarray:
    """The Laplacian term's gradient in every client's membership step (M × K).

    ``laplacian``: ``2λ L C`` (Eq. 14, the gradient of λ tr(CᵀLC), equal to the MM
    surrogate's at C^t). ``degree-only``: ``λ D C``, what the authors' code computes
    (``get_penalty``: no ``−W C``, no factor 2; docs/papers/ppfl.md §9.4).
    """
    c = np.asarray(memberships, dtype=np.float64)
    w = np.asarray(affinity, dtype=np.float64)
    if mode == "laplacian":
        return lam * laplacian_gradient(w, c)
    if mode == "degree-only":
        return lam * w.sum(axis=1)[:, None] * c
    raise ValueError(f"unknown penalty mode {mode!r}; use 'laplacian' or 'degree-only'")


def membership_step_gradient(
    loss_gradient: np.ndarray,
    weight: np.ndarray | float,
    penalty: np.ndarray,
    scaling: Literal["paper", "normalized", "code"] = "paper",
) -> np.ndarray:
    """``G_{c_i}`` of Eq. 14 from client i's loss gradient ``∇_c f_i`` and its penalty row.

    ``paper``: ``G = p_i ∇_c f_i + π_i`` (Eq. 14-15 as printed). ``normalized``:
    ``G = ∇_c f_i + π_i / p_i``, the paper's G divided by p_i: the same direction on each
    client's block with the step η/p_i, so the same fixed points as F (docs/papers/ppfl.md §9.3).
    ``code``: ``G = ∇_c f_i + π_i``, what the authors' code computes (the loss gradient
    without p_i, the penalty row as it is): the Laplacian weighs about p_i times less
    than in F. ``weight`` is ``p_i`` (a scalar, or one per row).
    """
    g = np.asarray(loss_gradient, dtype=np.float64)
    pi = np.asarray(penalty, dtype=np.float64)
    p = np.asarray(weight, dtype=np.float64)
    if g.ndim == 2 and p.ndim == 1:
        p = p[:, None]
    if (p <= 0).any():
        raise ValueError("client weights p_i must be > 0")
    if scaling == "paper":
        return p * g + pi
    if scaling == "normalized":
        return g + pi / p
    if scaling == "code":
        return g + pi
    raise ValueError(f"unknown scaling {scaling!r}; use 'paper', 'normalized' or 'code'")


def population_objective(
    losses: Sequence[float] | np.ndarray,
    weights: Sequence[float] | np.ndarray,
    affinity: np.ndarray | None,
    memberships: np.ndarray,
    lam: float,
) -> float:
    """``F(θ, C) = Σ_i p_i f_i + λ tr(Cᵀ L C)`` (Eq. 9) from the clients' losses f_i."""
    value = float(np.dot(np.asarray(weights, dtype=np.float64), np.asarray(losses, np.float64)))
    if affinity is not None and lam > 0:
        value += lam * laplacian_penalty(affinity, memberships)
    return value
