"""The n-softsync mean over an update's c gradients (P1 Sec. 3), as two pieces of the update
core's chain (:mod:`asyncsim.numerics.chain`):

* :func:`softsync_weights` -- ``w_l = alpha_l / c``, c the number of valid slots;
* :func:`aggregate` -- the one step of the update, ``d = sum_l w_l (g_l + wd_p theta)``.

P1's n-softsync protocol applies, at each update, the mean of the ``c = floor(lambda / n)``
gradients it collected, each at its own staleness-dependent rate:
``theta <- theta - (1/c) sum_l alpha(tau_l) Delta theta_l`` (``c = 1``: plain async; ``c =
lambda``: hardsync). Shifted momentum uses the weights but not the aggregate (it steps each
gradient's buffer, :mod:`asyncsim.numerics.momentum`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from asyncsim.numerics.chain import Piece, cast_like, no_state

__all__ = ["aggregate", "aggregated", "softsync_weights", "weighted_sum"]


def softsync_weights() -> Piece:
    """``w_l = rates_l / c`` (``Update.weights``), 0 on padding slots.

    Without a mask ``c`` is the static number of slots, and for ``c = 1`` the division is
    exact, which makes one learner at tau = 0 bit-identical to ``optax.sgd``; with a mask
    ``c`` is the number of valid slots (at least 1)."""

    def update(u, state):
        weights = u.rates / (u.c if u.valid is None else jnp.maximum(u.n_valid, 1.0))
        if u.valid is not None:
            weights = jnp.where(u.valid, weights, 0.0)
        return u._replace(weights=weights), state

    return Piece(no_state, update)


def aggregated(params, grads, weights, decay, wd):
    """``d = sum_l w_l g_l + (sum_l w_l) wd_p theta``, ``wd_p = wd * decay_p``: the
    weighted sum of ``sum_l w_l (g_l + wd_p theta)`` with the decay term (on the fresh
    ``theta``) factored out, each leaf in its parameter's dtype."""
    tm = jax.tree_util.tree_map
    w_total = jnp.sum(weights)
    if weights.shape[0] == 1:
        # One gradient (async, fixed delay, lambda-softsync): the same value without a
        # reduction over a length-1 axis, which XLA's CPU backend materialises as a separate
        # pass over the parameters (measured ~25% of a small MLP step).
        return tm(lambda g, p, k: cast_like(weights[0] * g[0] + (w_total * (wd * k)) * p, p),
                  grads, params, decay)
    return tm(lambda s, p, k: cast_like(s + (w_total * (wd * k)) * p, p),
              weighted_sum(weights, grads), params, decay)


def weighted_sum(weights, grads):
    """``sum_l w_l g_l`` over the leading (slot) axis of every leaf of ``grads``, added in
    slot order from zero, one step ``acc + w_l g_l`` per slot.

    An unrolled loop over the (static) slots, each partial sum and the zero start
    materialised (``optimization_barrier``), so that the order and the rounding are this
    function's, not a fusion decision: left to fuse the chain, XLA contracts other products
    into its multiply-adds and rounds differently. Each step compiles as one step of a
    ``lax.scan`` over the slots does, the same numbers bit for bit
    (tests/unit/test_core_pieces.py), without the scan's copy of the c gradients into one
    array (c = 30 on a 3072 x 128 layer: 2.7 ms an update, 39 ms as a scan); XLA's fused
    ``jnp.sum(w * g, axis=0)`` is slower still (c = 7: 71 ms)."""
    tm = jax.tree_util.tree_map
    barrier = jax.lax.optimization_barrier
    acc = barrier(tm(lambda g: jnp.zeros(g.shape[1:], jnp.result_type(weights, g)), grads))
    for k in range(weights.shape[0]):
        acc = barrier(tm(lambda a, g, k=k: a + weights[k] * g[k], acc, grads))
    return acc


def aggregate() -> Piece:
    """The update's one step ``d`` (:func:`aggregated`) as ``Update.direction``, from the
    weights, the weight decay's multipliers and the fresh weights ``Update.params``."""

    def update(u, state):
        return u._replace(direction=aggregated(u.params, u.grads, u.weights, u.decay,
                                               u.wd)), state

    return Piece(no_state, update)
