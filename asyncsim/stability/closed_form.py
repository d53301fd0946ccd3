"""Analytic linear-stability edges of delayed SGD with constant delay τ (P2).

Reference: Giladi, Shpigel Nacson, Hoffer, Soudry, "At Stability's Edge: How to Adjust
Hyperparameters to Preserve Minima Selection in Asynchronous Training of Neural Networks?",
ICLR 2020, arXiv 1909.12340 (P2 in ``docs/papers.md``).

Setting. Near a minimum, along a Hessian eigenvector with eigenvalue λ, the loss is
``λ w²/2`` and the gradient is ``λ w``. With ``x = η·λ`` every update below is a linear
recurrence in the scalar ``w``; substituting ``w_t = z^t`` gives its characteristic
polynomial, and the minimum is linearly stable iff every root has ``|z| < 1``.

Derivations (one line each):

* ``"none"`` — ``w_{t+1} = w_t − x w_{t−τ}``. Multiply ``z^{t+1} = z^t − x z^{t−τ}`` by
  ``z^{τ−t}``::

      z^{τ+1} − z^τ + x = 0                                         (P2, plain)

* ``"heavy-ball"`` — ``m_{t+1} = β m_t + λ w_{t−τ}``, ``w_{t+1} = w_t − η m_{t+1}``.
  Eliminating ``m`` (``m_{t+1} = −(w_{t+1} − w_t)/η``) gives
  ``w_{t+1} − w_t = β (w_t − w_{t−1}) − x w_{t−τ}``; multiply by ``z^{τ+1−t}``::

      z^τ (z − 1)(z − β) + x z = 0                                  (P2, heavy ball)

* ``"dampened"`` — ``m_{t+1} = β m_t + (1 − β) λ w_{t−τ}`` (PyTorch's ``dampening=β``),
  i.e. the heavy-ball polynomial with ``x → x (1 − β)``, so its edge is
  ``edge_hb / (1 − β)``. Any dampening ``d`` of heavy ball or shifted momentum
  (``optimizer.momentum.dampening``) likewise scales the fresh step by ``1 − d``: the edge
  is the undampened one ``/ (1 − d)`` (:func:`edge`'s ``dampening``). Nesterov takes none.

Both styles of the update core are these recurrences. At a constant rate the caffe form
(rate inside the buffer, ``m ← βm + ηg``) and the torch form (``m ← βm + g``, step ``ηm``)
are the same dynamics (``m_caffe = η m_torch``), and PyTorch's first step, which copies the
gradient into the buffer undampened, is a transient of the initial condition: neither moves
a root, so every edge here holds for both styles.

* ``"shifted"`` — ``w_{t+1} = w_t − x w_{t−τ} + β (w_{t−τ} − w_{t−τ−1})``; multiply by
  ``z^{τ+1−t}``: ``z^{τ+2} − z^{τ+1} + x z − β z + β = 0``, i.e.::

      (z − 1)(z^{τ+1} − β) + x z = 0                                (P2, shifted)

* ``"nesterov"`` — the core's (PyTorch's) form ``m_{t+1} = β m_t + d_t``,
  ``w_{t+1} = w_t − η (d_t + β m_{t+1})`` with ``d_t = λ w_{t−τ}``. With the shift ``z``,
  ``m = d/(z − β)`` and ``(z − 1) w = −η d (1 + βz/(z − β))``, so::

      z^τ (z − 1)(z − β) + x ((1 + β) z − β) = 0                    (Nesterov; at τ = 0 the
                                                                      classic quadratic)

  Not in P2; its edge is found numerically on the unit circle (:func:`_nesterov_edge`).

The first four agree with docs/papers.md. The extra root ``z = 0`` of the momentum polynomials (for
τ ≥ 1) is harmless. At τ = 0 shifted momentum *is* heavy ball; at β = 0 every kind is plain.

Edge. For ``0 ≤ |β| < 1`` and small ``x > 0`` every root is inside the unit disk (the root at
``z = 1`` moves to ``1 − x/(1 − β)``, the others sit at ``0``, ``β`` or ``β^{1/(τ+1)}``), so the
edge is the smallest ``x > 0`` for which a root lies on ``|z| = 1``. Solving the polynomial
for ``x`` at ``z = e^{iθ}`` and writing ``e^{iu} − β = e^{iu}(1 − β e^{−iu})`` gives, with
``δ(u) = atan2(β sin u, 1 − β cos u)`` (continuous, ``|δ| < π/2``)::

    none        x(θ) = 2 sin(θ/2)                    · exp(i ψ),  ψ = (τ+½)θ − π/2
    heavy-ball  x(θ) = 2 sin(θ/2) |e^{iθ} − β|       · exp(i ψ),  ψ = (τ+½)θ + δ(θ) − π/2
    shifted     x(θ) = 2 sin(θ/2) |e^{i(τ+1)θ} − β|  · exp(i ψ),  ψ = (τ+½)θ + δ((τ+1)θ) − π/2

``x`` is real and positive exactly where ``ψ(θ) = 2πk``. Because ``δ' ≥ −|β|/(1+|β|)``, ψ is
strictly increasing on ``[0, π]`` (``ψ(0) = −π/2``), so each ``k = 0 … ⌊ψ(π)/2π⌋`` gives one
crossing angle, found by vectorised bisection to machine precision; the edge is the smallest
``|x|`` over them. The crossing at ``θ = π`` (``z = −1``) is the τ = 0 case. For heavy ball
with ``β ≥ 0`` the modulus increases with θ, so ``k = 0`` wins; shifted momentum's modulus
oscillates, so later ``k`` are checked until a lower bound rules them out. The plain edge
uses the closed form ``2 sin(π/(4τ+2))`` (the ``k = 0`` crossing, ``θ = π/(2τ+1)``).
Shifted momentum at τ = 1 also has one: ``1 − β²`` (not in the papers; tested).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from asyncsim.config import MOMENTUM_KINDS as CORE_MOMENTUM_KINDS

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MOMENTUM_KINDS",
    "asymptote",
    "char_poly",
    "edge",
    "edge_table",
    "effective_edge",
    "spectral_radius",
]

# The core's momentum kinds: every one has an edge here.
MOMENTUM_KINDS = tuple(CORE_MOMENTUM_KINDS)
# Unit-circle samples per unit of τ + 1 when the edge is found by scanning (nesterov): the
# phase of x(θ) turns about (τ + 1)·θ, so this keeps ~100 samples per turn.
_SCAN_PER_TAU = 600

# Bisection halves a bracket of width π; 60 halvings reach the spacing of doubles near π.
_BISECTION_STEPS = 60


def _check_kind(momentum: str) -> None:
    if momentum not in MOMENTUM_KINDS:
        raise ValueError(f"unknown momentum {momentum!r}; expected one of {MOMENTUM_KINDS}")


def _check_tau_beta(tau: np.ndarray, beta: np.ndarray) -> None:
    if np.any(tau < 0) or np.any(tau != np.floor(tau)):
        raise ValueError("tau must be a non-negative integer")
    # |β| ≥ 1 makes the system unstable (or marginal) already at x → 0+, so no edge exists.
    if np.any(np.abs(beta) >= 1):
        raise ValueError("beta must satisfy |beta| < 1")


def char_poly(tau: int, x: float, momentum: str = "none", beta: float = 0.0) -> np.ndarray:
    """Characteristic polynomial of delayed SGD along one Hessian direction (P2).

    Args:
        tau: constant delay τ ≥ 0 (staleness of every gradient).
        x: ``η·λ``, learning rate times Hessian eigenvalue.
        momentum: one of :data:`MOMENTUM_KINDS` (see the module docstring for recurrences).
        beta: momentum coefficient β (ignored for ``"none"``).

    Returns:
        Coefficients, highest degree first (``np.roots`` order): ``z^{τ+1} − z^τ + x`` for
        ``"none"``, ``z^τ(z−1)(z−β) + xz`` for ``"heavy-ball"`` (``x → x(1−β)`` for
        ``"dampened"``), ``(z−1)(z^{τ+1}−β) + xz`` for ``"shifted"``.
    """
    _check_kind(momentum)
    tau = int(tau)
    if tau < 0:
        raise ValueError("tau must be a non-negative integer")
    x, beta = float(x), float(beta)
    if momentum == "none":
        c = np.zeros(tau + 2)
        c[0] += 1.0
        c[1] -= 1.0
        c[-1] += x  # at τ = 0 this lands on c[1]: z − 1 + x
        return c
    if momentum == "shifted":
        c = np.zeros(tau + 3)
        c[0] += 1.0
        c[1] -= 1.0
        c[-2] += x - beta  # at τ = 0 this shares c[1] with −z^{τ+1}
        c[-1] += beta
        return c
    if momentum == "dampened":
        x *= 1.0 - beta
    c = np.zeros(tau + 3)
    c[:3] = (1.0, -(1.0 + beta), beta)  # (z − 1)(z − β), then τ zero coefficients
    if momentum == "nesterov":
        c[-2] += x * (1.0 + beta)
        c[-1] -= x * beta
        return c
    c[-2] += x
    return c


def _spectral_radius_scalar(tau: int, x: float, momentum: str, beta: float) -> float:
    roots = np.roots(char_poly(tau, x, momentum, beta))
    return float(np.max(np.abs(roots))) if roots.size else 0.0


_spectral_radius_vec = np.vectorize(_spectral_radius_scalar, otypes=[float], excluded={2})


def spectral_radius(tau, x, momentum: str = "none", beta=0.0):
    """Largest root modulus of :func:`char_poly`; < 1 means linearly stable.

    Broadcasts over array ``tau``, ``x`` and ``beta`` (``np.roots`` per element); returns a
    float for scalar inputs.
    """
    _check_kind(momentum)
    out = _spectral_radius_vec(tau, x, momentum, beta)
    return float(out) if np.ndim(out) == 0 else out


def _delta(u: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``arg(1 − β e^{−iu})``: the bounded part of the unwrapped ``arg(e^{iu} − β)``."""
    return np.arctan2(beta * np.sin(u), 1.0 - beta * np.cos(u))


def _phase(theta, tau, beta, shifted: bool):
    u = (tau + 1.0) * theta if shifted else theta
    return (tau + 0.5) * theta + _delta(u, beta) - 0.5 * np.pi


def _modulus(theta, tau, beta, shifted: bool):
    u = (tau + 1.0) * theta if shifted else theta
    # |e^{iu} − β| written without cancellation for u → 0 and β → 1.
    dist = np.sqrt((1.0 - beta) ** 2 + 4.0 * beta * np.sin(0.5 * u) ** 2)
    return 2.0 * np.sin(0.5 * theta) * dist


def _solve_crossing(tau, beta, k, shifted: bool):
    """Angle θ_k in [0, π] with ψ(θ_k) = 2πk, and whether that crossing exists.

    Since ``|δ| ≤ a = arcsin|β|``, ``θ_k ∈ [(2πk + π/2 − a)/(τ+½), (2πk + π/2 + a)/(τ+½)]``,
    a bracket of width ``≤ π/(τ+½)`` that bisection then shrinks to machine precision.
    """
    a = np.arcsin(np.abs(beta))
    target = 2 * np.pi * k
    lo = np.clip((target + 0.5 * np.pi - a) / (tau + 0.5), 0.0, np.pi)
    hi = np.clip((target + 0.5 * np.pi + a) / (tau + 0.5), 0.0, np.pi)
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        below = _phase(mid, tau, beta, shifted) < target
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    theta = 0.5 * (lo + hi)
    # A clipped bracket can end at θ = π without a crossing (ψ(π) < 2πk); ψ(π) = 0 at τ = 0
    # holds only up to rounding, hence the tolerance.
    exists = np.abs(_phase(theta, tau, beta, shifted) - target) < 1e-9 * (1.0 + target)
    return theta, exists


def _crossing_edge(tau: np.ndarray, beta: np.ndarray, shifted: bool) -> np.ndarray:
    """Smallest positive real ``x(θ)`` on the unit circle (1-D float arrays in, same out).

    Crossing k = 0 always exists (ψ(π) ≥ 0). Later crossings are visited only while they can
    still beat the best so far: ``|x(θ_k)| ≥ 2 sin(θ_lb(k)/2)(1 − |β|)`` with θ_lb the lower
    bracket end, and that bound grows with k. In practice k = 0 wins and k = 1 is pruned,
    which keeps the 257 × 10 table at a few thousand bisections.
    """
    theta, _ = _solve_crossing(tau, beta, 0, shifted)
    best = _modulus(theta, tau, beta, shifted)
    a = np.arcsin(np.abs(beta))
    k = 1
    while True:
        theta_lb = (2 * np.pi * k + 0.5 * np.pi - a) / (tau + 0.5)
        active = (theta_lb <= np.pi) & (2 * np.sin(0.5 * theta_lb) * (1 - np.abs(beta)) < best)
        if not active.any():
            return best
        idx = np.flatnonzero(active)
        theta, exists = _solve_crossing(tau[idx], beta[idx], k, shifted)
        x = np.where(exists, _modulus(theta, tau[idx], beta[idx], shifted), np.inf)
        best[idx] = np.minimum(best[idx], x)
        k += 1


def _nesterov_x(theta, tau, beta):
    """``x`` that puts a root of the Nesterov polynomial at ``z = e^{iθ}``."""
    z = np.exp(1j * theta)
    return -z**tau * (z - 1.0) * (z - beta) / ((1.0 + beta) * z - beta)


def _nesterov_edge(tau: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Smallest positive real ``x(θ)`` over ``θ ∈ (0, π]`` (1-D arrays in, same out).

    ``x(θ)`` is real where its imaginary part changes sign on a grid of
    ``_SCAN_PER_TAU·(τ+1)`` angles (and at ``θ = π``, where it is real); each sign change is
    bisected to machine precision. Checked against the spectral radius of
    :func:`char_poly` just below and above the edge (tests/unit/test_stability.py).
    """
    out = np.empty(tau.shape)
    for i, (t, b) in enumerate(zip(tau, beta, strict=True)):
        theta = np.linspace(0.0, np.pi, int(_SCAN_PER_TAU * (t + 1)) + 1)[1:]
        im = _nesterov_x(theta, t, b).imag
        j = np.flatnonzero(np.sign(im[:-1]) != np.sign(im[1:]))
        lo, hi, sign = theta[j], theta[j + 1], np.sign(im[j])
        for _ in range(_BISECTION_STEPS):  # every sign change at once
            mid = 0.5 * (lo + hi)
            same = np.sign(_nesterov_x(mid, t, b).imag) == sign
            lo, hi = np.where(same, mid, lo), np.where(same, hi, mid)
        cand = np.append(_nesterov_x(0.5 * (lo + hi), t, b).real,
                         _nesterov_x(np.pi, t, b).real)
        pos = cand[cand > 0]
        out[i] = pos.min() if pos.size else np.inf
    return out


def edge(tau: int | np.ndarray, momentum: str = "none", beta: float | np.ndarray = 0.0, *,
         dampening: float = 0.0) -> float | np.ndarray:
    """Largest stable ``η·λ`` at constant delay τ: sup of ``x`` with spectral radius < 1 on (0, x).

    Args:
        tau: delay(s) τ ≥ 0, integer scalar or array.
        momentum: one of :data:`MOMENTUM_KINDS`.
        beta: momentum coefficient(s), ``|β| < 1``; broadcast against ``tau``.
        dampening: PyTorch's dampening ``d`` in [0, 1) of heavy ball or shifted momentum
            (``optimizer.momentum.dampening``): the edge ``/ (1 − d)``. ``"dampened"`` is
            ``d = β`` already; Nesterov and plain SGD take none.

    Returns:
        The edge in units of the raw rate ``η`` times λ (float for scalar inputs, else an
            array of the broadcast shape). ``"none"``: ``2 sin(π/(4τ+2))`` (P2).
            ``"heavy-ball"`` and ``"shifted"``: smallest unit-circle crossing (module
            docstring), exact to ~1e-13 relative. ``"dampened"``: heavy-ball edge
            ``/(1 − β)``. ``"nesterov"``: the same crossing, found by scanning the circle.
    """
    _check_kind(momentum)
    tau_b, beta_b = np.broadcast_arrays(np.asarray(tau, dtype=float),
                                        np.asarray(beta, dtype=float))
    _check_tau_beta(tau_b, beta_b)
    if dampening:
        if momentum not in ("heavy-ball", "shifted") or not 0.0 < dampening < 1.0:
            raise ValueError(f"dampening must be in [0, 1), of heavy-ball or shifted momentum; "
                             f"got {dampening!r} with {momentum!r}")
        return edge(tau, momentum, beta) / (1.0 - dampening)
    if momentum == "none":
        out = 2.0 * np.sin(np.pi / (4.0 * tau_b + 2.0))
    elif momentum == "nesterov":
        out = _nesterov_edge(tau_b.ravel(), beta_b.ravel()).reshape(tau_b.shape)
    else:
        flat_t, flat_b = tau_b.ravel(), beta_b.ravel()
        out = _crossing_edge(flat_t, flat_b, shifted=momentum == "shifted")
        if momentum == "dampened":
            out = out / (1.0 - flat_b)
        out = out.reshape(tau_b.shape)
    return float(out) if out.ndim == 0 else out


# The kinds whose steady-state step per unit gradient is η/(1 − β).
_EFFECTIVE_SCALED = ("heavy-ball", "shifted", "nesterov")


def effective_edge(tau, momentum: str = "none", beta=0.0):
    """Edge on the *effective* rate: the steady-state step per unit gradient.

    Heavy ball, shifted and Nesterov momentum move ``η/(1 − β)`` per unit of a constant
    gradient, so their effective edge is ``edge/(1 − β)``. Dampened momentum moves ``η``:
    its ``edge`` is already effective (and equals the heavy-ball effective edge). Plain
    SGD: ``edge``.
    P2 compares momentum kinds at equal effective rate.
    """
    e = edge(tau, momentum, beta)
    if momentum in _EFFECTIVE_SCALED:
        e = e / (1.0 - np.asarray(beta, dtype=float))
    return float(e) if np.ndim(e) == 0 else e


def asymptote(tau, momentum: str = "none", beta=0.0):
    """Large-τ approximation of :func:`edge` (raw ``η·λ`` units; P2 / docs/papers.md).

    ``"none"``: ``π/(2τ+1)``; ``"heavy-ball"``: ``(1−β)π/(2τ)``; ``"dampened"``: ``π/(2τ)``;
    ``"shifted"``: ``√(1−β²)·arccos(β)/(τ+1)``. The heavy-ball form needs
    ``τ ≫ β/(1−β)`` (the momentum's memory): edge/asymptote is 0.966 at β = 0.9 and 0.868 at
    β = 0.98 for τ = 256. Keeping the next order, the crossing sits at
    ``θ ≈ (π/2)/(τ + ½ + β/(1−β))`` and the edge is ``≈ θ·√((1−β)² + βθ²)`` (within 1% at
    β = 0.9, τ = 256). ``"nesterov"``: near ``z = 1`` its polynomial is heavy ball's
    (``(1+β)z − β → 1``), so the same ``(1−β)π/(2τ)``.

    A large-τ form says nothing at τ = 0, where the momentum's memory is everything: there
    every momentum kind gives NaN (heavy ball's ``1/τ`` would say ``inf``, shifted's
    ``1/(τ+1)`` a finite number unrelated to the edge). Plain SGD keeps P2's ``π/(2τ+1)``.
    """
    _check_kind(momentum)
    t = np.asarray(tau, dtype=float)
    b = np.asarray(beta, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        if momentum == "none":
            out = np.pi / (2 * t + 1) + 0 * b
        elif momentum in ("heavy-ball", "nesterov"):
            out = (1 - b) * np.pi / (2 * t)
        elif momentum == "dampened":
            out = np.pi / (2 * t) + 0 * b
        else:
            out = np.sqrt(1 - b**2) * np.arccos(b) / (t + 1)
        if momentum != "none":
            out = np.where(t == 0, np.nan, out)
    return float(out) if np.ndim(out) == 0 else out


def edge_table(taus, momenta=MOMENTUM_KINDS, betas=(0.0,)) -> pd.DataFrame:
    """Edges for every (τ, momentum, β), one row each.

    ``"none"`` does not depend on β, so it gets one row per τ with ``beta = 0.0`` (filter on
    ``beta`` only for the momentum kinds).

    Columns:
        tau, momentum, beta;
        edge: largest stable ``η·λ`` (:func:`edge`);
        effective_edge: the same on the effective rate (:func:`effective_edge`), the scale on
            which P2 compares momentum kinds;
        asymptote: large-τ approximation of ``edge`` (:func:`asymptote`).
    """
    import pandas as pd  # here: a run never imports pandas (docs/design.md)

    taus = np.asarray(taus, dtype=float).ravel()
    frames = []
    for kind in momenta:
        kind_betas = (0.0,) if kind == "none" else tuple(betas)
        bb, tt = np.meshgrid(np.asarray(kind_betas, dtype=float), taus, indexing="ij")
        bb, tt = bb.ravel(), tt.ravel()
        e = np.atleast_1d(edge(tt, kind, bb))
        eff = e / (1.0 - bb) if kind in _EFFECTIVE_SCALED else e
        frames.append(pd.DataFrame({
            "tau": tt.astype(int),
            "momentum": kind,
            "beta": bb,
            "edge": e,
            "effective_edge": eff,
            "asymptote": np.atleast_1d(asymptote(tt, kind, bb)),
        }))
    return pd.concat(frames, ignore_index=True)
