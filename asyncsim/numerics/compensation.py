"""Delay compensation: gradients corrected with the parameters they were computed on.

``[optimizer] compensation = { kind = "dc-asgd", lambda = 0.04 }``. A stale gradient
``g = grad L(theta_read)`` was computed on the version its learner pulled; the PS applies it
to ``theta_now``. Compensation rewrites each gradient before the update core weights and
aggregates it (so it combines with every lr rule, momentum kind, style and optax transform):

* ``dc-asgd`` -- Zheng, Meng, Wang, Chen, Yu, Ma, Liu, "Asynchronous stochastic gradient
  descent with delay compensation", ICML 2017 (arXiv:1609.08326), the compensated gradient
  of its Sec. 3 (a first-order Taylor step with the diagonal outer-product approximation of
  the Hessian), as MXNet's ``DCASGD`` optimizer applies it::

      g~ = g + lambda * g * g * (theta_now - theta_read)            (element-wise)

  ``lambda`` = 0.04 by default (MXNet's).
* ``dc-asgd-a`` -- the same paper's adaptive variant: ``lambda_t = lambda / sqrt(ms_t +
  eps)`` element-wise, with the mean square ``ms_t = momentum * ms_{t-1} + (1 - momentum) *
  g * g`` of the gradients the PS receives, updated with each gradient before it is used
  (defaults ``lambda = 2``, ``momentum = 0.95``, ``eps = 1e-7``, as public DC-ASGD-a
  implementations set them).
* ``gap-aware`` -- Barkai, Hakimi, Schuster, "Gap-aware mitigation of gradient staleness",
  ICLR 2020 (arXiv:1909.10802): the Gap of each parameter, ``|theta_now - theta_read|``
  normalised by ``C``, the typical distance a parameter moves in one step; the gradient is
  divided element-wise by ``G = 1 + |theta_now - theta_read| / C`` (``G = 1`` for a fresh
  gradient, linear in the gap beyond). ``C`` as the authors' group implements it (FTPipe's
  ``GapAware`` and ``AdamGapAware``, "based on arXiv 1909.10802"):

  - under SGD (no ``optimizer.transform``): ``C = lr_max * (sqrt(v / (1 - gamma^t)) + eps)``,
    ``v`` the exponential moving average (``gamma = 0.999``) of the squared raw gradient,
    updated with each gradient as it arrives, before its penalty, ``t`` the number of
    gradients so far (that one included). With momentum on (``beta != 0``) ``v`` averages
    the square of the momentum buffer as the update finds it instead (FTPipe's
    ``momentum_buffer``, in gradient units: a ``caffe`` buffer, which holds rate-scaled
    steps, divided by ``lr`` -- with a schedule it keeps the schedule's factor, which a
    ``torch`` buffer does not; shifted momentum: the buffer of the gradient's learner, or
    the gradient itself where that buffer has not started, is still 0, which would make
    ``C`` vanish and throw the learner's first stale gradient away). ``lr_max`` is
    ``optimizer.lr``, the rate before any schedule (FTPipe's ``max_lr``, the largest rate
    its schedule reached).
  - under an ``optimizer.transform`` (Adam's steps are not ``lr`` times a gradient):
    ``C = sqrt(v / (1 - gamma^k)) + eps``, ``v`` the moving average of the squared step
    ``(theta_{t+1} - theta_t)^2`` the transform took, updated after each of the ``k``
    updates (FTPipe's ``AdamGapAware`` reads the same average of squared steps,
    ``exp_step_avg_sq``; here bias-corrected as Adam's).

Each kind is one function returning its :class:`_Kind` (``init``, ``correct``, ``after``),
listed in ``_RULES`` with its parameters in :data:`KINDS`: adding a compensation is those
three entries in this file; the core's chain takes it through :func:`compensated` and
:func:`step_statistics` with no other change.

A gradient of staleness 0 (``theta_read = theta_now``) is unchanged by all three (bit for
bit), though ``dc-asgd-a`` and ``gap-aware`` still count it in their statistics. The
statistics are part of the core's state (``CoreState.comp``), one array like each parameter
plus a count: checkpointed and replayed with it. ``dc-asgd-a`` and ``gap-aware`` under SGD
update them gradient by gradient, in slot order; ``gap-aware`` under a transform once per
update, from the step the update took (:attr:`Compensation.after`).

The core stays a pure function: it takes the read versions' parameters as an argument
(``apply(..., read_params=...)``); the drivers keep what it needs (the online driver's and
the replay loop's version store, the scan path's version store, the real PS's versions in
flight).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from asyncsim._checks import choice, nonneg, positive, required, table, unit_interval
from asyncsim._registry import coerce
from asyncsim.errors import ScenarioError, did_you_mean
from asyncsim.numerics.chain import Piece, no_state, zero_padding

KEY = "optimizer.compensation"
# kind -> {parameter: (default, its range's check)}; "lambda" is a Python keyword, so no
# signature.
_UNIT = unit_interval
_POS = functools.partial(positive, finite=True)
_NONNEG = nonneg
KINDS: dict[str, dict[str, tuple[float, Callable[[str, Any], float]]]] = {
    "dc-asgd": {"lambda": (0.04, _NONNEG)},
    "dc-asgd-a": {"lambda": (2.0, _NONNEG), "momentum": (0.95, _UNIT), "eps": (1e-7, _POS)},
    "gap-aware": {"gamma": (0.999, _UNIT), "eps": (1e-8, _POS)},
}

__all__ = ["KINDS", "Compensation", "compensated", "compensation_spec", "make_compensation",
           "step_statistics"]


class Compensation(NamedTuple):
    """``init(params) -> state``; ``apply(state, grads, params_now, read, valid, ref=None,
    lr=None) -> (grads, state)``: the c gradients (leading axis c) rewritten in slot order
    (``ref(k, g_k)``, ``lr``: gap-aware's averaged array for slot k and base rate); ``after(state,
    params_before, params_after) -> state``: the statistics after the update's step."""

    kind: str
    init: Any
    apply: Any
    after: Any


def compensation_spec(spec: Mapping[str, Any], key: str = KEY) -> tuple[str, dict[str, float]]:
    """``(kind, parameters with defaults)`` of a ``compensation`` table, checked; a
    one-line ScenarioError under ``key`` otherwise."""
    table(key, spec, '{ kind = "dc-asgd", ... }')
    kind = required(f"{key}.kind", spec, "kind", tuple(KINDS))
    choice(f"{key}.kind", kind, tuple(KINDS), what="compensation")
    allowed = KINDS[kind]
    out = {k: d for k, (d, _) in allowed.items()}
    for k, v in spec.items():
        if k == "kind":
            continue
        if k not in allowed:
            raise ScenarioError(f"{key}.{k}", f"unknown option for compensation {kind!r}; "
                                f"allowed: kind, {', '.join(allowed)}"
                                f"{did_you_mean(k, list(allowed))}")
        coerce(float, v, f"{key}.{k}")  # a float parameter's check: an int or float, finite
        out[k] = allowed[k][1](f"{key}.{k}", v)
    return kind, out


class _Kind(NamedTuple):
    """One compensation's rule: ``init(params) -> stats``; ``correct(stats, g, gap, ok, ref,
    lr) -> (g~, stats)`` for one gradient ``g`` with ``gap = theta_now - theta_read`` (``ok``
    False on a padding slot, whose statistics must not change; ``ref`` the array whose
    square gap-aware averages, ``lr`` the base rate); ``after(stats, before, now) ->
    stats``, the statistics after the update's step."""

    init: Callable[[Any], Any]
    correct: Callable[..., tuple[Any, Any]]
    after: Callable[[Any, Any, Any], Any]


def _no_stats(params):
    return ()


def _second_moments(params):
    """One array like each parameter and a float32 count, all zero."""
    return (jax.tree_util.tree_map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))


def _unchanged(stats, before, now):
    return stats


def _dc_asgd(p: dict[str, float]) -> _Kind:
    """DC-ASGD (Zheng et al. 2017, Sec. 3; MXNet's ``DCASGD``): ``g~ = g + lambda g g
    (theta_now - theta_read)``, element-wise; no statistics."""

    def correct(stats, g, gap, ok, ref, lr):
        lam = jnp.float32(p["lambda"])
        return jax.tree_util.tree_map(lambda x, d: x + lam * x * x * d, g, gap), stats

    return _Kind(_no_stats, correct, _unchanged)


def _dc_asgd_adaptive(p: dict[str, float]) -> _Kind:
    """DC-ASGD-a (the same paper's adaptive variant): ``lambda_t = lambda / sqrt(ms_t +
    eps)`` with ``ms_t = momentum ms_{t-1} + (1 - momentum) g g``, updated with each
    gradient before it is used."""
    tm = jax.tree_util.tree_map

    def correct(stats, g, gap, ok, ref, lr):
        sq, count = stats
        m = jnp.float32(p["momentum"])
        sq_new = tm(lambda s, x: m * s + (1.0 - m) * x * x, sq, g)
        lam = jnp.float32(p["lambda"])
        eps = jnp.float32(p["eps"])
        out = tm(lambda x, s, d: x + (lam / jnp.sqrt(s + eps)) * x * x * d, g, sq_new, gap)
        # A padding slot changes nothing: its statistics stay (its gradient is dropped later).
        sq_kept = tm(lambda n, o: jnp.where(ok, n, o), sq_new, sq)
        return out, (sq_kept, jnp.where(ok, count + 1.0, count))

    return _Kind(_second_moments, correct, _unchanged)


def _penalised(g, gap, c):
    """Gap-aware's penalty: ``g / (1 + |gap| / C)``, element-wise."""
    return g / (1.0 + jnp.abs(gap) / c)


def _gap_aware(p: dict[str, float]) -> _Kind:
    """Gap-aware under SGD (Barkai et al. 2020; FTPipe's ``GapAware``): ``g~ = g / (1 +
    |theta_now - theta_read| / C)``, ``C = lr (sqrt(v / (1 - gamma^t)) + eps)``, ``v`` the
    moving average of ``ref^2`` (the raw gradient, or the momentum buffer), updated with
    each gradient before its penalty."""
    tm = jax.tree_util.tree_map

    def correct(stats, g, gap, ok, ref, lr):
        sq, count = stats
        gm = jnp.float32(p["gamma"])
        eps = jnp.float32(p["eps"])
        sq_new = tm(lambda s, r: gm * s + (1.0 - gm) * r * r, sq, ref)
        corr = 1.0 - jnp.power(gm, count + 1.0)
        out = tm(lambda x, s, d: _penalised(x, d, lr * (jnp.sqrt(s / corr) + eps)),
                 g, sq_new, gap)
        # A padding slot changes nothing: its statistics stay (its gradient is dropped later).
        sq_kept = tm(lambda n, o: jnp.where(ok, n, o), sq_new, sq)
        return out, (sq_kept, jnp.where(ok, count + 1.0, count))

    return _Kind(_second_moments, correct, _unchanged)


def _gap_aware_steps(p: dict[str, float]) -> _Kind:
    """Gap-aware under an optax transform (FTPipe's ``AdamGapAware``): ``C = sqrt(v_hat) +
    eps`` from the bias-corrected moving average ``v`` of the squared steps, which
    :attr:`_Kind.after` updates once per update."""
    tm = jax.tree_util.tree_map

    def correct(stats, g, gap, ok, ref, lr):
        sq, count = stats
        # C from the steps so far (none yet: every gap is 0, G = 1)
        corr = 1.0 - jnp.power(jnp.float32(p["gamma"]), count)
        eps = jnp.float32(p["eps"])
        out = tm(lambda x, s, d: _penalised(x, d, jnp.sqrt(jnp.where(count > 0, s / corr, 0.0))
                                            + eps), g, sq, gap)
        return out, stats

    def after(stats, before, now):
        sq, count = stats
        gm = jnp.float32(p["gamma"])
        sq = tm(lambda s, a, b: gm * s + (1.0 - gm) * (a - b) * (a - b), sq, now, before)
        return sq, count + 1.0

    return _Kind(_second_moments, correct, after)


# kind -> its rule, from the checked parameters (KINDS lists the parameters).
_RULES: dict[str, Callable[[dict[str, float]], _Kind]] = {
    "dc-asgd": _dc_asgd, "dc-asgd-a": _dc_asgd_adaptive, "gap-aware": _gap_aware}


def make_compensation(spec: Mapping[str, Any], key: str = KEY, *,
                      transform: bool = False) -> Compensation:
    """The pure functions of a checked ``compensation`` table (see the module docstring):
    the kind's rule applied gradient by gradient, in slot order; ``transform``: the update
    core has an ``optimizer.transform`` (gap-aware's ``C`` is then the rms step)."""
    kind, p = compensation_spec(spec, key)
    rule = (_gap_aware_steps if kind == "gap-aware" and transform else _RULES[kind])(p)
    tm = jax.tree_util.tree_map

    def one(stats, g, now, read, ok, ref, lr):
        """One gradient: (its compensated value, the statistics after it)."""
        return rule.correct(stats, g, tm(lambda a, b: a - b, now, read), ok, ref, lr)

    def apply(state, grads, params_now, read, valid, ref=None, lr=None):
        """``ref(k, g_k)``: gap-aware's averaged array for slot ``k``, whose gradient is
        ``g_k`` (None: the gradient itself); ``lr``: the base rate."""
        c = jax.tree_util.tree_leaves(grads)[0].shape[0]
        valid = jnp.ones((c,), bool) if valid is None else valid
        out = []
        for k in range(c):  # c is static: the slots one after the other, in slot order
            g_k = tm(lambda x, k=k: x[k], grads)
            r_k = tm(lambda x, k=k: x[k], read)
            g, state = one(state, g_k, params_now, r_k, valid[k],
                           g_k if ref is None else ref(k, g_k), lr)
            # Each slot's result is materialised: fused into the next slot's, XLA's CPU
            # backend recomputes the running statistics once per later slot. (Unrolled, the
            # program takes longer to compile as c grows: c = 30, ~4 s for the remedies'
            # MLP; a scan compiled in under 1 s but ran 8x slower at c = 7.)
            out.append(jax.lax.optimization_barrier((g, state)))
            state = out[-1][1]
        return tm(lambda *xs: jnp.stack(xs), *(g for g, _ in out)), state

    return Compensation(kind, rule.init, apply, rule.after)


def compensated(comp: Compensation, *, buffer: str = "none", caffe: bool = False) -> Piece:
    """The chain's piece of a compensation: each gradient rewritten from its read version
    (``Update.read_params``) and the fresh weights, in slot order, before the rule weights
    it; padding slots stay 0. Owns ``CoreState.comp``. ``buffer`` says where the update
    core keeps momentum (``"none"``, ``"one"`` buffer, or ``"per-learner"`` for shifted
    momentum) and ``caffe`` whether it holds rate-scaled steps: gap-aware under SGD averages
    the buffer's square, in gradient units, while ``beta != 0``.

    Raises:
        ValueError: ``apply`` was given no ``read_params``.
    """
    tm = jax.tree_util.tree_map

    def init(params):
        return {"comp": comp.init(params)}

    def ref(u, state):
        """(slot k, its gradient) -> the array gap-aware averages the square of (module
        docstring)."""
        if buffer == "none":
            return None
        lr = state.hyper["lr"]
        unit = (lambda b: b / lr) if caffe else (lambda b: b)
        on = state.hyper["beta"] != 0  # FTPipe: momentum_buffer only while momentum != 0

        def of(k, g_k):
            if buffer == "one":
                b_k = tm(lambda b, g: unit(b).astype(g.dtype), state.momentum, g_k)
            else:  # per learner: the buffer of the learner that computed the slot's
                # gradient, the gradient where that buffer has not started (docstring)
                lid = u.learner_ids[k]
                b_k = tm(lambda b, g: jnp.where(b[lid] == 0, g, unit(b[lid]).astype(g.dtype)),
                         state.momentum, g_k)
            return tm(lambda b, g: jnp.where(on, b, g), b_k, g_k)

        return of

    def update(u, state):
        if u.read_params is None:
            raise ValueError("optimizer.compensation needs read_params, the parameters each "
                             "gradient was computed on")
        grads, stats = comp.apply(state.comp, u.grads, u.params, u.read_params, u.valid,
                                  ref(u, state), state.hyper["lr"])
        if u.valid is not None:  # a padding slot's rewritten value is dropped as before
            grads = zero_padding(grads, u.valid)
        return u._replace(grads=grads), state._replace(comp=stats)

    return Piece(init, update)


def step_statistics(comp: Compensation) -> Piece:
    """The chain's piece after the descent: the compensation's statistics of the step the
    update took (:attr:`Compensation.after`; gap-aware's ``v`` under a transform), from the
    fresh weights ``Update.params`` and the new ``CoreState.params``."""

    def update(u, state):
        return u, state._replace(comp=comp.after(state.comp, u.params, state.params))

    return Piece(no_state, update)
