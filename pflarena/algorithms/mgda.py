"""The min-norm common descent direction (MGDA) and direction drift: the server-side maths
of FedPG, FedMGDA and CFL.

Gradients come as a 2-D array ``grads`` of shape ``(K, P)``, one flattened client gradient
per row. Equation and section numbers refer to the reading of the FedPG paper
(``docs/papers/fedpg.md``).

**Sign convention.** Every direction returned here points *up* the losses, like a gradient:
the model update is ``θ ← θ − η d``, and ``d`` is a common descent direction when
``⟨d, g_k⟩ ≥ 0`` for every gradient ``g_k`` (so ``−d`` has a non-positive inner product
with every gradient). The reading writes the opposite sign (``d_spec = −Qλ``, update
``ω + η d_spec``); ``d`` here is ``−d_spec`` and the formulas below are rewritten to match.

* :func:`min_norm_weights` — the weights ``λ`` on the simplex minimizing ``‖λᵀG‖²``, the
  MGDA min-norm point of QP (5) (§2.4, §3.4).
* :func:`common_descent_direction` — Algorithm 1 up to line 11 (§3.2): drop zero gradients,
  equalize norms, add the fair column ``∇F'`` (§2.3, §9.5, §9.6), solve QP (5), rescale to the
  FedSGD norm (§2.6, §9.7).
* :func:`drift_coefficient`, :func:`drift_coefficients`, :func:`drifted_direction` — the
  direction drift of §2.7, eq. (8), in closed form.

Which clients' stale gradients enter the QP (§2.5, §9.8) is the caller's business; they are
passed in as ``stale_grads``.
"""

from __future__ import annotations

import numpy as np

from pflarena.core.footprint import FLOAT32, Footprint

__all__ = [
    "ZERO_GRAD_NORM",
    "common_descent_direction",
    "drift_coefficient",
    "drift_coefficients",
    "drifted_direction",
    "fair_objective",
    "fairness_weights",
    "gram_chunk_bytes",
    "gram_matrix",
    "stacked_gram_footprint",
    "min_norm_weights",
    "min_norm_weights_from_gram",
    "weighted_rows",
]

#: Gradients with at most this norm are dropped before the QP (§2.4, step 1).
ZERO_GRAD_NORM = 1e-6
#: ``‖h‖·‖L‖`` at or below this means equal losses: no fair column (§9.6).
_EQUAL_LOSSES = 1e-12
#: ``λᵀPλ`` at or below this times ``max_k P_kk`` is floating-point noise around 0.
_NOISE = 1e-15
#: Absolute slack on the duality gap (scaled units): the rounding error of computing it.
_GAP_FLOOR = 1e-13
#: Iterations with an unchanged support before the KKT system on it is solved.
_SETTLED = 10
#: Active-set cycles tried from a settled support before FISTA resumes.
_CYCLES = 3
#: FISTA iterations before Wolfe's algorithm takes over.
_FISTA_ITERS = 150
#: Ridge of the active-set KKT systems (scaled units), below the gap floor.
_RIDGE = 1e-14
_SOLVERS = ("auto", "fast", "cvxpy")
_RESCALES = ("scaled_mean", "raw_mean", "none")


# ---------------------------------------------------------------- input checks


def _matrix(name: str, value: object, *, allow_empty: bool = False) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array (clients, parameters), got shape {array.shape}"
        )
    if not allow_empty and array.shape[0] == 0:
        raise ValueError(f"{name} has no rows (K=0): at least one gradient is needed")
    if array.shape[1] == 0:
        raise ValueError(f"{name} has no parameters (shape {array.shape})")
    if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
        raise ValueError(f"{name} must be real-valued, got dtype {array.dtype}")
    chunk = _chunk_for(array.shape[0])  # checked a chunk at a time, as they are summed
    for start in range(0, array.shape[1], chunk):
        if not np.isfinite(array[:, start : start + chunk]).all():
            raise ValueError(f"{name} contains NaN or infinite values")
    return array


def _vector(name: str, value: object, size: int | None = None) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {array.shape}")
    if size is not None and array.shape[0] != size:
        raise ValueError(f"{name} has {array.shape[0]} entries, expected {size}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def _solver_name(solver: str) -> str:
    if solver not in _SOLVERS:
        raise ValueError(f"solver must be one of {_SOLVERS}, got {solver!r}")
    return "fast" if solver == "auto" else solver


# ---------------------------------------------------------------- the QP (5)


#: The float64 numbers a chunk of :func:`gram_matrix` holds at most (32 MiB), whatever K.
GRAM_CHUNK_VALUES = 1 << 22


def _chunk_for(rows: int) -> int:
    return min(1 << 20, max(1 << 10, GRAM_CHUNK_VALUES // max(rows, 1)))


def gram_chunk_bytes(rows: int) -> int:
    """The most bytes a float64 chunk of :func:`gram_matrix` holds for ``rows`` gradients."""
    return rows * _chunk_for(rows) * 8


def stacked_gram_footprint(what: str, rows: int, values: int) -> list[Footprint]:
    """What a server holds to take a Gram matrix of ``rows`` vectors of ``values`` float32
    numbers (``what``: the round's gradients, updates): the vectors stacked once, and one
    float64 chunk of them (:func:`gram_matrix`)."""
    return [
        Footprint(f"{what} stacked ({rows} x {values} float32)", rows * values * FLOAT32),
        Footprint("a float64 chunk of them for the Gram matrix", gram_chunk_bytes(rows)),
    ]


def weighted_rows(weights: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``weightsᵀ rows`` (a ``P`` vector) in float64, over column chunks as in
    :func:`gram_matrix`: float32 rows are never copied whole into float64."""
    rows = _matrix("rows", rows)
    weights = _vector("weights", weights, size=rows.shape[0])
    out = np.empty(rows.shape[1])
    chunk = _chunk_for(rows.shape[0])
    for start in range(0, rows.shape[1], chunk):
        out[start : start + chunk] = weights @ np.asarray(
            rows[:, start : start + chunk], dtype=np.float64
        )
    return out


def gram_matrix(grads: np.ndarray, *, chunk: int | None = None) -> np.ndarray:
    """The ``K×K`` Gram matrix ``G Gᵀ`` in float64, accumulated over column chunks (§3.4).

    Float32 gradients are converted one chunk of ``chunk`` parameters at a time (by default
    :data:`GRAM_CHUNK_VALUES` / K, at least 2¹⁰ and at most 2²⁰), so the float64 copy never
    holds more than ``K·chunk`` numbers: 32 MiB, not a float64 copy of the round's replies.
    """
    grads = _matrix("grads", grads)
    k, p = grads.shape
    chunk = chunk or _chunk_for(k)
    out = np.zeros((k, k))
    for start in range(0, p, chunk):
        block = np.asarray(grads[:, start : start + chunk], dtype=np.float64)
        out += block @ block.T
    return (out + out.T) / 2


def min_norm_weights(
    grads: np.ndarray, *, solver: str = "auto", tol: float = 1e-10, max_iter: int = 20_000
) -> np.ndarray:
    """Weights ``λ ∈ Δ_K`` of the min-norm point of the convex hull of the rows of ``grads``.

    Solves QP (5) of docs/papers/fedpg.md §2.4, ``min_{λ ∈ Δ_K} ½ ‖λᵀG‖²``, on the Gram
    matrix ``G Gᵀ``.

    Parameters
    ----------
    grads : ndarray, shape (K, P)
        One gradient per row, finite, ``K ≥ 1``.
    solver : {"auto", "fast", "cvxpy"}
        ``"fast"`` is the hand-written solver of :func:`min_norm_weights_from_gram`;
        ``"cvxpy"`` solves the same QP with cvxpy (the reference); ``"auto"`` is ``"fast"``
        (the tests check it against cvxpy to 1e-6 in objective).
    tol : float
        Relative accuracy of the fast solver: it stops once the Frank–Wolfe duality gap, an
        upper bound on ``f(λ) − f*``, is at most ``tol · λᵀPλ`` (plus rounding slack).
    max_iter : int
        Iteration (and active-set cycle) cap of the fast solver.

    Returns
    -------
    ndarray, shape (K,)
        Non-negative weights summing to 1.

    Raises
    ------
    ValueError
        ``grads`` is not 2-D, has no rows or no columns, or has non-finite entries; or an
        unknown ``solver``.
    """
    return min_norm_weights_from_gram(gram_matrix(grads), solver=solver, tol=tol, max_iter=max_iter)


def min_norm_weights_from_gram(
    gram: np.ndarray, *, solver: str = "auto", tol: float = 1e-10, max_iter: int = 20_000
) -> np.ndarray:
    """:func:`min_norm_weights` for a precomputed Gram matrix ``P = G Gᵀ`` (K×K, PSD).

    The fast solver is hand-written because cvxpy spends milliseconds to seconds building
    and canonicalizing a problem for this tiny dense QP, which is solved every round:

    * ``K = 1``: ``λ = [1]``; ``K = 2``: MGDA's closed form
      ``λ_1 = clip(((g_2−g_1)·g_2)/‖g_1−g_2‖², 0, 1)`` (docs/papers/fedpg.md §8.2).
    * Otherwise accelerated projected gradient (FISTA) on the simplex, the reading's
      recommended default (§3.4): step ``1/λ_max(P)``, exact sort-based Euclidean
      projection, adaptive restarts. Once its support has stopped changing, the KKT
      system on that support is solved directly (a few active-set cycles), which is exact
      when the support is right.
    * Where FISTA stalls (a singular or ill-conditioned ``P``: more gradients than their
      rank allows, nearly parallel gradients), Wolfe's min-norm-point algorithm from the
      shortest gradient, an exact active-set method whose support stays small there.

    Every path stops on the Frank–Wolfe duality gap
    ``λᵀPλ − min_k (Pλ)_k ≤ tol · λᵀPλ + 1e-13 · max_k P_kk`` (the last term is rounding),
    which bounds ``f(λ) − f*`` and certifies the KKT condition of eq. (6):
    ``(Pλ)_k ≥ (1 − tol) λᵀPλ − 1e-13 · max_k P_kk`` for every ``k``.
    """
    solver = _solver_name(solver)
    p = np.asarray(gram, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] != p.shape[1]:
        raise ValueError(f"gram must be a square 2-D array, got shape {p.shape}")
    if p.shape[0] == 0:
        raise ValueError("gram is empty (K=0): at least one gradient is needed")
    if not np.all(np.isfinite(p)):
        raise ValueError("gram contains NaN or infinite values")
    k = p.shape[0]
    if k == 1:
        return np.ones(1)
    scale = float(np.max(np.diag(p)))
    if scale <= 0.0:  # every gradient is zero: every λ is optimal
        return np.full(k, 1.0 / k)
    p = (p + p.T) / (2 * scale)  # scale-free: max diagonal 1
    if solver == "cvxpy":
        return _solve_cvxpy(p)
    if k == 2:
        return _two_point(p)
    return _solve_fast(p, tol=tol, max_iter=max_iter)


def _two_point(p: np.ndarray) -> np.ndarray:
    """MGDA's closed form for two gradients, on the Gram matrix."""
    denom = p[0, 0] + p[1, 1] - 2 * p[0, 1]  # ‖g_1 − g_2‖²
    if denom <= _NOISE:  # identical gradients
        return np.array([0.5, 0.5])
    first = float(np.clip((p[1, 1] - p[0, 1]) / denom, 0.0, 1.0))
    return np.array([first, 1.0 - first])


def _project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto the probability simplex (sort-based, exact)."""
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - 1.0
    index = np.arange(1, v.size + 1)
    rho = np.nonzero(u - cumulative / index > 0)[0][-1]
    return np.maximum(v - cumulative[rho] / (rho + 1), 0.0)


def _largest_eigenvalue(p: np.ndarray) -> float:
    if p.shape[0] <= 256:
        return float(np.linalg.eigvalsh(p)[-1])
    from scipy.sparse.linalg import ArpackNoConvergence, eigsh

    try:
        return float(eigsh(p, k=1, which="LA", tol=1e-8, return_eigenvectors=False)[0])
    except ArpackNoConvergence:
        return float(np.linalg.eigvalsh(p)[-1])


def _solve_fast(p: np.ndarray, *, tol: float, max_iter: int) -> np.ndarray:
    """FISTA with active-set finishes; Wolfe's algorithm where FISTA stalls."""
    x, done = _fista(p, tol, min(max_iter, _FISTA_ITERS))
    if done:
        return x
    # Degenerate or ill-conditioned (more columns than the rank allows, nearly parallel
    # columns): Wolfe's min-norm-point algorithm from the shortest column keeps its support
    # affinely independent, hence small, where FISTA's support stays large.
    start = np.zeros_like(x)
    start[np.argmin(np.diag(p))] = 1.0
    wolfe, done = _active_set(p, start, tol, max_cycles=max_iter)
    if done or wolfe @ p @ wolfe <= x @ p @ x:
        return wolfe
    return _fista(p, tol, max_iter, start=x)[0]


def _fista(
    p: np.ndarray, tol: float, max_iter: int, *, start: np.ndarray | None = None
) -> tuple[np.ndarray, bool]:
    """Accelerated projected gradient on the simplex; when its support has settled, an
    active-set finish from there (exact once the support is right)."""
    k = p.shape[0]
    step = 1.0 / (_largest_eigenvalue(p) * (1.0 + 1e-6))
    x = np.full(k, 1.0 / k) if start is None else start
    px = p @ x
    y, py = x, px
    t = 1.0
    support, stable, tried = x > 0, 0, set()
    for _ in range(max_iter):
        x_new = _project_simplex(y - step * py)
        px_new = p @ x_new
        if _converged(x_new, px_new, tol):
            if x_new @ px_new <= _NOISE:  # 0 is in the hull: make it exact on the support
                return _active_set(p, x_new, tol, max_cycles=_CYCLES)[0], True
            return x_new, True
        new_support = x_new > 0
        stable = stable + 1 if np.array_equal(new_support, support) else 0
        support = new_support
        if stable == _SETTLED and support.tobytes() not in tried:
            tried.add(support.tobytes())
            finished, done = _active_set(p, x_new, tol, max_cycles=_CYCLES)
            if done:
                return finished, True
        if (y - x_new) @ (x_new - x) > 0:  # gradient restart (O'Donoghue & Candès, 2015)
            t, y, py = 1.0, x_new, px_new
        else:
            t_new = (1.0 + np.sqrt(1.0 + 4.0 * t * t)) / 2.0
            momentum = (t - 1.0) / t_new
            y = x_new + momentum * (x_new - x)
            py = px_new + momentum * (px_new - px)  # P y by linearity: one product per step
            t = t_new
        x, px = x_new, px_new
    return x, False


def _converged(x: np.ndarray, px: np.ndarray, tol: float) -> bool:
    """Frank–Wolfe gap ``λᵀPλ − min_k (Pλ)_k`` (≥ ``f(λ) − f*``) small, or ``Pλ ≈ 0``."""
    f = x @ px  # 2 f(λ) = ‖u‖²
    return bool(f - px.min() <= tol * f + _GAP_FLOOR or f <= _NOISE)


def _active_set(
    p: np.ndarray, x: np.ndarray, tol: float, *, max_cycles: int
) -> tuple[np.ndarray, bool]:
    """Primal active-set method (Wolfe's min-norm-point cycles) from a feasible ``x``.

    Minor cycle: move towards the minimizer over the affine hull of the support until a
    weight hits 0, and drop it. Major cycle: once at that minimizer, add the most violated
    KKT condition's column. Returns the best point found and whether it is converged.
    """
    x = x.copy()
    f = x @ (p @ x)
    support = x > 0
    for _ in range(max_cycles):
        y = _affine_minimizer(p, support)
        if y is None:
            break
        if y.min() >= 0.0:
            py = p @ y
            f_y = y @ py
            if f_y > f * (1 + 1e-12) + _NOISE:  # rounding noise, not progress
                break
            x, f = y, f_y
            if _converged(x, py, tol):
                return x, True
            enter = int(np.argmin(py))
            if support[enter]:
                break
            support[enter] = True
            continue
        blocking = y < 0
        ratios = x[blocking] / (x[blocking] - y[blocking])
        leave = np.nonzero(blocking)[0][np.argmin(ratios)]
        x = np.maximum(x + ratios.min() * (y - x), 0.0)
        x[leave] = 0.0
        x /= x.sum()
        f = x @ (p @ x)
        support = x > 0
    return x, False


def _affine_minimizer(p: np.ndarray, support: np.ndarray) -> np.ndarray | None:
    """``argmin λᵀ(P + δI)λ`` over ``Σ λ = 1``, zero off ``support`` (its KKT system).

    The ridge ``δ`` makes the system regular when the support is affinely dependent (more
    columns than the rank allows, duplicates): it then picks the smallest ``‖λ‖`` among
    the minimizers. It moves ``min_k (Pλ)_k`` by at most ``δ``, inside the gap floor.
    """
    index = np.nonzero(support)[0]
    n = index.size
    kkt = np.zeros((n + 1, n + 1))
    kkt[:n, :n] = p[np.ix_(index, index)] + _RIDGE * np.eye(n)
    kkt[:n, n] = kkt[n, :n] = 1.0
    rhs = np.zeros(n + 1)
    rhs[n] = 1.0
    try:
        solution = np.linalg.solve(kkt, rhs)[:n]
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(solution)) or abs(solution.sum() - 1.0) > 1e-6:
        return None
    y = np.zeros(p.shape[0])
    y[index] = solution / solution.sum()
    return y


def _solve_cvxpy(p: np.ndarray) -> np.ndarray:
    try:
        import cvxpy as cp
    except ImportError as exc:  # pragma: no cover - cvxpy is a dependency
        raise ImportError("solver='cvxpy' needs cvxpy: pip install cvxpy") from exc
    k = p.shape[0]
    lam = cp.Variable(k)
    problem = cp.Problem(
        cp.Minimize(0.5 * cp.quad_form(lam, cp.psd_wrap(p))), [cp.sum(lam) == 1, lam >= 0]
    )
    if "CLARABEL" in cp.installed_solvers():  # tighter than its defaults (1e-8): a reference
        problem.solve(
            solver="CLARABEL",
            tol_gap_abs=1e-12,
            tol_gap_rel=1e-12,
            tol_feas=1e-12,
            tol_ktratio=1e-10,
        )
    else:
        problem.solve()
    if lam.value is None:
        raise RuntimeError(f"cvxpy could not solve the min-norm QP: status {problem.status}")
    weights = np.maximum(np.asarray(lam.value, dtype=np.float64), 0.0)
    return weights / weights.sum()


# ---------------------------------------------------------------- the fair objective (§2.3)


def fair_objective(losses: np.ndarray) -> float:
    """``F = −(L·1)/(‖L‖ ‖1‖)``, minus the cosine between the losses and ``1`` (§2.3)."""
    losses = _vector("losses", losses)
    return float(-losses.sum() / (np.linalg.norm(losses) * np.sqrt(losses.size)))


def fairness_weights(losses: np.ndarray) -> np.ndarray:
    """``h = ∂F/∂L``, so that ``∇F(ω) = Σ_i h_i g_i`` (§2.3).

    ``h = (1/‖L‖) [ (L·1)/(‖1‖ ‖L‖²) L − 1/‖1‖ ]``. It satisfies ``h·L = 0`` and
    ``h·1 ≤ 0``, and vanishes exactly when all losses are equal. ``L = 0`` gives ``h = 0``.
    """
    losses = _vector("losses", losses)
    norm = float(np.linalg.norm(losses))
    if norm == 0.0:
        return np.zeros_like(losses)
    root = np.sqrt(losses.size)
    return (losses.sum() / (root * norm**2) * losses - 1.0 / root) / norm


# ---------------------------------------------------------------- the common direction (§3.2)


def common_descent_direction(
    grads: np.ndarray,
    *,
    fairness: bool = True,
    losses: np.ndarray | None = None,
    normalize: bool = True,
    rescale: str = "scaled_mean",
    stale_grads: np.ndarray | None = None,
    solver: str = "auto",
    zero_tol: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray]:
    """FedPG's common descent direction, Algorithm 1 lines 5–11 (§3.2).

    1. Drop clients with ``‖g_i‖ ≤ 1e-6`` (§2.4, step 1).
    2. With ``normalize``, rescale each kept gradient to the mean norm:
       ``g̃_i = μ g_i/‖g_i‖``, ``μ = mean_i ‖g_i‖`` (§2.4, step 2).
    3. With ``fairness``, add the fair column ``f = Σ_i (h_i/‖h‖) g̃_i``, ``h = ∂F'/∂L'``
       on the kept clients' losses (§2.3, eq. 7; scale per §9.5). It is left out when the
       losses are equal (``h = 0``, §9.6).
    4. Add ``stale_grads`` (absent clients' last gradients, §2.5), each rescaled to ``μ``
       (§9.8) when ``normalize``; zero ones are dropped. They enter only the QP.
    5. Solve QP (5), ``u = Qλ*``. If ``u ≈ 0`` with the fair column, solve again without
       it (§9.6); if still ``u ≈ 0`` the point is Pareto stationary and ``d = 0``.
    6. Rescale to the FedSGD norm (Algorithm 1 line 11, §2.6): ``d = u ‖d_r‖/‖u‖`` with
       ``d_r`` the mean of the kept ``g̃_i`` (``rescale="scaled_mean"``, §9.7), of the kept
       raw ``g_i`` (``"raw_mean"``), or no rescaling (``"none"``, ``d = u``).

    Parameters
    ----------
    grads : ndarray, shape (K, P)
        The online clients' gradients at the current global model, one per row.
    fairness : bool
        Add the fair column (off: ablation M2).
    losses : ndarray, shape (K,), optional
        The online clients' training losses, aligned with ``grads``; required with
        ``fairness``.
    normalize : bool
        Equalize gradient norms (step 2).
    rescale : {"scaled_mean", "raw_mean", "none"}
        The norm given to ``d`` (step 6).
    stale_grads : ndarray, shape (r, P), optional
        Extra QP columns for recently absent clients (ablation M4: leave out).
    solver : {"auto", "fast", "cvxpy"}
        See :func:`min_norm_weights`.
    zero_tol : float
        ``u`` counts as 0 when ``‖u‖ ≤ zero_tol · max_k ‖q_k‖`` (the QP columns' largest
        norm): a smaller min-norm point is within the solver's floating-point accuracy of
        0, and its sign pattern (eq. 6) cannot be trusted.

    Returns
    -------
    direction : ndarray, shape (P,), float64
        ``d``, to be used as ``θ ← θ − η d``. Unless it is 0, ``⟨d, q_k⟩ ≥ ‖d‖‖u‖ > 0``
        for every QP column ``q_k`` (eq. 6), hence ``⟨d, g_i⟩ > 0`` for every kept client
        and every nonzero stale gradient: ``−d`` decreases all their losses to first order.
        This is ``−d^t`` of docs/papers/fedpg.md §3.2.
    weights : ndarray, shape (K + 1 + r,)
        ``λ*`` in the order of Q in eq. (5): the K clients (0 for dropped ones), the fair
        column (0 when absent), the r stale gradients (0 for zero ones). They weight the
        *scaled* columns, so ``u = Σ_k λ_k q_k``; all zero when every gradient was dropped.
        At a Pareto-stationary point (``d = 0``) they are the weights that put 0 in the
        hull.

    Raises
    ------
    ValueError
        Malformed ``grads``, ``losses`` or ``stale_grads`` (shape, K=0, non-finite), or
        ``fairness`` without ``losses``, or an unknown ``rescale`` / ``solver``.
    """
    grads = _matrix("grads", grads)
    k, dim = grads.shape
    if rescale not in _RESCALES:
        raise ValueError(f"rescale must be one of {_RESCALES}, got {rescale!r}")
    _solver_name(solver)
    if fairness:
        if losses is None:
            raise ValueError("fairness=True needs the clients' losses (losses=None)")
        losses = _vector("losses", losses, size=k)
    if stale_grads is None:
        stale = np.zeros((0, dim))
    else:
        stale = _matrix("stale_grads", stale_grads, allow_empty=True)
        if stale.shape[1] != dim:
            raise ValueError(f"stale_grads has {stale.shape[1]} parameters, grads has {dim}")
    r = stale.shape[0]
    weights = np.zeros(k + 1 + r)

    g = np.asarray(grads, dtype=np.float64)
    norms = np.linalg.norm(g, axis=1)
    kept = np.nonzero(norms > ZERO_GRAD_NORM)[0]
    if kept.size == 0:
        return np.zeros(dim), weights
    mu = float(norms[kept].mean())
    scaled = g[kept] * (mu / norms[kept])[:, None] if normalize else g[kept]

    s = np.asarray(stale, dtype=np.float64)
    stale_norms = np.linalg.norm(s, axis=1)
    stale_kept = np.nonzero(stale_norms > ZERO_GRAD_NORM)[0]
    stale_cols = s[stale_kept]
    if normalize:
        stale_cols = stale_cols * (mu / stale_norms[stale_kept])[:, None]

    fair = None
    if fairness:
        h = fairness_weights(losses[kept])
        h_norm = float(np.linalg.norm(h))
        if h_norm * float(np.linalg.norm(losses[kept])) > _EQUAL_LOSSES:
            fair = (h / h_norm) @ scaled

    def solve(with_fair: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = [scaled, fair[None, :]] if with_fair else [scaled]
        cols = np.concatenate([*parts, stale_cols])
        lam = min_norm_weights(cols, solver=solver)
        return cols, lam, lam @ cols

    cols, lam, u = solve(fair is not None)

    def is_zero(cols: np.ndarray, u: np.ndarray) -> bool:
        return bool(np.linalg.norm(u) <= zero_tol * np.linalg.norm(cols, axis=1).max())

    with_fair = fair is not None
    if with_fair and is_zero(cols, u):
        cols, lam, u = solve(False)
        with_fair = False
    n = kept.size
    weights[kept] = lam[:n]
    weights[k] = lam[n] if with_fair else 0.0
    weights[k + 1 + stale_kept] = lam[n + int(with_fair) :]
    if is_zero(cols, u):  # Pareto stationary
        return np.zeros(dim), weights
    if rescale == "none":
        return u, weights
    mean = (scaled if rescale == "scaled_mean" else g[kept]).mean(axis=0)
    return u * (np.linalg.norm(mean) / np.linalg.norm(u)), weights


# ---------------------------------------------------------------- direction drift (§2.7)


def drifted_direction(g_i: np.ndarray, direction: np.ndarray, gamma: float) -> np.ndarray:
    """Client i's personalized direction ``d_i = (1 − γ) d + γ g_i`` (§2.7).

    The reading's ``d_i = (1 − γ_i) d^t + γ_i (−g_i)`` in this module's sign convention: the
    P-model is ``θ_i = θ − η d_i``.
    """
    g_i = _vector("g_i", g_i)
    direction = _vector("direction", direction, size=g_i.size)
    return (1.0 - gamma) * direction + gamma * g_i


def drift_coefficient(g_i: np.ndarray, direction: np.ndarray, other_grads: np.ndarray) -> float:
    """The largest ``γ ∈ [0, 1]`` keeping ``d_i`` a descent direction for the others (eq. 8).

    Eq. (8) asks ``⟨(1 − γ) d + γ g_i, g_j⟩ ≥ 0`` for every other online client ``j``
    (this module's signs). With ``b_j = d·g_j`` and ``c_j = (g_i − d)·g_j`` that is
    ``b_j + γ c_j ≥ 0``, so (§2.7, closed form)::

        γ = min(1, min_{j: c_j < 0} b_j / (−c_j))

    With ``b_j > 0``, client j can hold ``γ`` below 1 only if ``g_i·g_j < 0``; the bound is
    then ``|d·g_j| / (|d·g_j| + |g_i·g_j|)``.

    Parameters
    ----------
    g_i : ndarray, shape (P,)
        Client i's **raw** gradient (the client drifts with its own gradient, §2.7).
    direction : ndarray, shape (P,)
        The common direction ``d`` after rescaling, as returned by
        :func:`common_descent_direction`.
    other_grads : ndarray, shape (J, P)
        The other online clients' gradients (raw or scaled: only signs matter); ``J = 0``
        gives 1.

    Returns
    -------
    float
        ``γ_i`` in ``[0, 1]``. It is 0 when ``d`` is orthogonal to a ``g_j`` that ``g_i``
        conflicts with, and 0 when no ``γ`` in ``[0, 1]`` satisfies every constraint (``d``
        itself is not a descent direction for some ``g_j``): no drift.
    """
    g_i = _vector("g_i", g_i)
    direction = _vector("direction", direction, size=g_i.size)
    others = _matrix("other_grads", other_grads, allow_empty=True)
    if others.shape[1] != g_i.size:
        raise ValueError(f"other_grads has {others.shape[1]} parameters, g_i has {g_i.size}")
    others = np.asarray(others, dtype=np.float64)
    b = others @ direction
    return _largest_gamma(b, others @ g_i - b)


def drift_coefficients(grads: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """:func:`drift_coefficient` for every row of ``grads`` against all the other rows.

    Uses the Gram matrix, ``O(K² + K·P)``. ``grads`` are the raw online gradients.
    """
    grads = _matrix("grads", grads)
    direction = _vector("direction", direction, size=grads.shape[1])
    gram = gram_matrix(grads)
    b = np.asarray(grads, dtype=np.float64) @ direction
    gammas = np.empty(grads.shape[0])
    for i in range(grads.shape[0]):
        others = np.arange(grads.shape[0]) != i
        gammas[i] = _largest_gamma(b[others], gram[i, others] - b[others])
    return gammas


def _largest_gamma(b: np.ndarray, c: np.ndarray) -> float:
    """Largest ``γ ∈ [0, 1]`` with ``b_j + γ c_j ≥ 0`` for all j; 0 if there is none."""
    with np.errstate(divide="ignore", invalid="ignore"):
        upper = np.min(b[c < 0] / -c[c < 0], initial=1.0)
        lower = np.max(-b[c > 0] / c[c > 0], initial=0.0)
    if upper < lower or np.any(b[c == 0] < 0):
        return 0.0
    return float(upper)
