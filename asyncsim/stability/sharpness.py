"""Sharpness: the top Hessian eigenvalue λ_max of a loss, from Hessian-vector products.

P2 (Giladi et al., ICLR 2020, arXiv 1909.12340) measures sharpness as the top Hessian
eigenvalue by HVP power iteration on one batch (tolerance 1e-6, at most 100 iterations) and
compares it with the stability edge ``η λ_max < 2 sin(π/(4τ+2))`` (see
:mod:`asyncsim.stability`).

Contract shared by every function here: the answer is the *algebraically largest*
eigenvalue λ_max, not the largest in magnitude. At a minimum the Hessian is (nearly) positive
semi-definite and the two coincide, but away from one (e.g. at initialisation) a negative
eigenvalue can dominate in magnitude, and plain power iteration would return it. Power
iteration therefore runs in two phases: the first finds the dominant eigenvalue μ; if μ < 0,
the second runs on ``H − μI`` (whose spectrum ``λ − μ ≥ 0`` is dominated by ``λ_max − μ``)
and adds μ back. Lanczos returns both ends of the spectrum anyway and takes the top Ritz
value.

Krylov vectors live on the host in float64 on the flattened parameter vector; each HVP runs
in the parameters' dtype through one jitted function, compiled once per model loss (and
batch shape) and reused across calls: a sharpness trajectory measures many parameter points
with one compiled HVP.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

__all__ = ["hvp", "sharpness", "top_eigenvalue"]

METHODS = ("power", "lanczos")


def hvp(loss_fn: Callable, params, v):
    """Hessian-vector product ``∇²L(params) · v`` by forward-over-reverse differentiation.

    Args:
        loss_fn: ``params -> scalar``.
        params: the point at which the Hessian is taken (any pytree).
        v: a pytree with the structure of ``params``.

    Returns:
        ``H v`` with the structure of ``params``; costs about two gradient evaluations and
        never forms H.
    """
    return jax.jvp(jax.grad(loss_fn), (params,), (v,))[1]


def _norm(v: np.ndarray) -> float:
    return float(np.linalg.norm(v))


def _power(matvec, v0: np.ndarray, tol: float, max_iter: int, shift: float = 0.0):
    """Power iteration on ``H − shift·I`` with the Rayleigh quotient; returns (μ + shift, iters).

    Stops when the Rayleigh quotient changes by at most ``tol`` relative between iterations.
    """
    v = v0 / _norm(v0)
    lam = None
    for i in range(1, max_iter + 1):
        w = matvec(v) - shift * v
        lam_new = float(v @ w)
        nrm = _norm(w)
        if nrm == 0.0:  # v is in the null space of H − shift·I
            return shift, i
        v = w / nrm
        if lam is not None and abs(lam_new - lam) <= tol * abs(lam_new):
            return lam_new + shift, i
        lam = lam_new
    return lam_new + shift, max_iter


def _lanczos(matvec, v0: np.ndarray, tol: float, k: int):
    """k-step Lanczos with full reorthogonalisation; returns (largest Ritz value, steps).

    Stops early when the Ritz residual ``‖H y − θ y‖ = β_j |s_j|`` of the top pair is at most
    ``tol·|θ|``, or when the Krylov space becomes invariant (β_j ≈ 0, then θ is exact).
    """
    n = v0.size
    k = max(1, min(k, n))
    basis = np.zeros((k + 1, n))
    basis[0] = v0 / _norm(v0)
    alphas, betas = [], []
    theta = 0.0
    for j in range(k):
        w = matvec(basis[j])
        alphas.append(float(basis[j] @ w))
        # Full reorthogonalisation against every previous vector, twice ("twice is enough"):
        # float32 HVPs lose orthogonality fast, which would create spurious copies of λ_max.
        q = basis[: j + 1]
        w = w - q.T @ (q @ w)
        w = w - q.T @ (q @ w)
        beta = _norm(w)
        t = np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1)
        ritz, vecs = np.linalg.eigh(t)
        theta = float(ritz[-1])
        if beta <= 1e-12 * max(abs(theta), 1.0) or beta * abs(vecs[-1, -1]) <= tol * abs(theta):
            return theta, j + 1
        betas.append(beta)
        basis[j + 1] = w / beta
    return theta, k


def _top_eig_matvec(matvec, n: int, *, key, tol: float, max_iter: int, method: str):
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    if key is None:
        # Deterministic default so repeated measurements of one point agree.
        key = jax.random.PRNGKey(0)
    k_first, k_second = jax.random.split(key)
    v0 = np.asarray(jax.random.normal(k_first, (n,)), dtype=np.float64)
    if method == "lanczos":
        return _lanczos(matvec, v0, tol, max_iter)
    mu, it = _power(matvec, v0, tol, max_iter)
    if mu >= 0:
        return mu, it
    # The dominant eigenvalue is negative: shift so that λ_max − μ dominates (module doc).
    v1 = np.asarray(jax.random.normal(k_second, (n,)), dtype=np.float64)
    lam, it2 = _power(matvec, v1, tol, max_iter, shift=mu)
    return lam, it + it2


def top_eigenvalue(loss_fn: Callable, params, *, key=None, tol: float = 1e-6,
                   max_iter: int = 100, method: str = "power") -> tuple[float, int]:
    """Largest (algebraic) Hessian eigenvalue of ``loss_fn`` at ``params``.

    Args:
        loss_fn: ``params -> scalar``, e.g. a closure over one batch (P2 uses one batch).
        params: pytree of parameters.
        key: PRNG key for the start vector (``PRNGKey(0)`` when None).
        tol: relative tolerance: change of the Rayleigh quotient (power) or Ritz residual
            relative to the Ritz value (Lanczos). P2: 1e-6. In float32 the HVP noise is about
            1e-7·‖H‖, so tighter values just run to ``max_iter``.
        max_iter: power: at most this many iterations per phase (P2: 100); Lanczos: the
            number of steps k.
        method: ``"power"`` (P2's method, with the negative-eigenvalue shift of the module
            docstring) or ``"lanczos"`` (full reorthogonalisation, top Ritz value).

    Returns:
        ``(λ_max, iterations)``, iterations counting HVPs.
    """
    flat, unravel = ravel_pytree(params)

    @jax.jit
    def flat_hvp(p, v):
        return ravel_pytree(hvp(loss_fn, p, unravel(v)))[0]

    def matvec(v: np.ndarray) -> np.ndarray:
        return np.asarray(flat_hvp(params, jnp.asarray(v, dtype=flat.dtype)), dtype=np.float64)

    lam, it = _top_eig_matvec(matvec, flat.size, key=key, tol=tol, max_iter=max_iter,
                              method=method)
    return float(lam), int(it)


_BATCH_HVP: dict[Callable, Callable] = {}  # loss -> jitted HVP, most recently used last
_BATCH_HVP_MAX = 8


def _batch_hvp(loss: Callable):
    """``(params, x, y, v_flat) -> (H v)_flat`` for ``loss(params, x, y)``, jitted once per
    loss function (data are arguments, not constants, so new batches do not recompile)."""
    fn = _BATCH_HVP.pop(loss, None)
    if fn is None:
        @jax.jit
        def fn(p, xb, yb, v):
            unravel = ravel_pytree(p)[1]
            return ravel_pytree(hvp(lambda q: loss(q, xb, yb), p, unravel(v)))[0]
    _BATCH_HVP[loss] = fn
    while len(_BATCH_HVP) > _BATCH_HVP_MAX:  # bounded: each entry holds a compiled HVP
        del _BATCH_HVP[next(iter(_BATCH_HVP))]
    return fn


def sharpness(model, params, x, y, *, batch_size: int | None = None, method: str = "power",
              tol: float = 1e-6, max_iter: int = 100, key=None) -> float:
    """Top Hessian eigenvalue of ``model.loss(params, x, y)`` on the whole set ``(x, y)``.

    Args:
        model: object with ``loss(params, x, y) -> scalar``, assumed to be the *mean* loss
            over the samples given.
        params, x, y: parameters and data; P2 passes a single batch.
        batch_size: None: one HVP on all of ``(x, y)``. Otherwise the HVP is accumulated over
            consecutive batches weighted by ``n_b/N``; because the Hessian of the mean loss is
            the weighted mean of the batch Hessians, this is the exact full-set HVP with
            bounded memory. (The last, shorter batch costs one extra trace.)
        method, tol, max_iter, key: as in :func:`top_eigenvalue`.

    Returns:
        λ_max as a float.
    """
    n_samples = int(np.shape(x)[0])
    if batch_size is not None and batch_size < 1:
        raise ValueError("batch_size must be positive")
    if batch_size is None or batch_size >= n_samples:
        batch_size = n_samples
    flat = ravel_pytree(params)[0]
    flat_hvp = _batch_hvp(model.loss)
    batches = [(x[i:i + batch_size], y[i:i + batch_size])
               for i in range(0, n_samples, batch_size)]

    def matvec(v: np.ndarray) -> np.ndarray:
        vj = jnp.asarray(v, dtype=flat.dtype)
        acc = np.zeros(v.shape)
        for xb, yb in batches:
            acc += (np.shape(xb)[0] / n_samples) * np.asarray(flat_hvp(params, xb, yb, vj),
                                                                dtype=np.float64)
        return acc

    lam, _ = _top_eig_matvec(matvec, flat.size, key=key, tol=tol, max_iter=max_iter,
                             method=method)
    return float(lam)
