"""Momentum and the descent step of the update core (pieces of the chain,
:mod:`asyncsim.numerics.chain`).

beta is ``hyper["beta"]``; the dampening ``dmp`` is ``momentum.dampening`` (PyTorch's: the
buffer takes ``(1 - dmp)`` of each step; none by default, beta for kind ``"dampened"``, its
shorthand). P2 Sec. 4 states the delayed variants. Two styles:

* ``caffe`` (the default; P1's framework): the rate is inside the buffer; the step ``d`` is
  the softsync aggregate of rate-weighted gradients (:mod:`asyncsim.numerics.aggregation`):

  - ``heavy-ball``: m <- beta m + (1 - dmp) d;  theta <- theta - m
  - ``dampened``:   m <- beta m + (1 - beta) d; theta <- theta - m
  - ``nesterov``:   m <- beta m + (1 - dmp) d;  theta <- theta - (d + beta m)

* ``torch`` (PyTorch's ``torch.optim.SGD``, which P2's official code steps): the rate
  ``eta_t`` is outside the buffer, ``d`` is the weighted mean gradient, and a buffer starts
  as a copy of its first step (``CoreState.started`` says whether it has taken it):
  ``m <- d`` first, then as above; theta <- theta - eta_t m (``d + beta m`` for nesterov).

and :func:`shifted_momentum`, P2's per-learner buffers. Kind ``"none"`` has no piece: the
descent steps the aggregate itself. With a constant rate and no dampening the two styles are
the same dynamics (m_caffe = eta m_torch): they differ in rounding, in the first step of a
dampened buffer, and once the rate changes (a decay moves the whole buffer under caffe, only
new steps under torch).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from asyncsim.numerics.chain import Piece, cast_like, no_state

__all__ = ["Damp", "buffer_momentum", "descend", "shifted_momentum"]


class Damp:
    """The fresh part of a buffer's step: x without dampening, (1 - d) x with it (d static
    or the traced beta). Without dampening the step is x itself, so the arithmetic, and
    every hash, is the one before dampening existed."""

    def __init__(self, d):
        self.d = d

    def __call__(self, x):
        return x if self.d is None else (1.0 - self.d) * x


def _fresh(dampening, beta) -> Damp:
    # "beta": kind "dampened", the dampening is the (traced) momentum coefficient.
    return Damp(beta if dampening == "beta" else dampening)


def buffer_momentum(*, nesterov: bool, torch: bool, dampening) -> Piece:
    """One buffer shaped like the parameters (kinds ``heavy-ball``, ``dampened``,
    ``nesterov``; the module docstring gives the recurrences): it takes the aggregate
    ``Update.direction`` and returns the step to descend by. Owns ``CoreState.momentum``
    (and ``started``, a bool scalar, under style torch)."""
    tm = jax.tree_util.tree_map

    def init(params):
        fields = {"momentum": tm(jnp.zeros_like, params)}
        if torch:
            fields["started"] = jnp.zeros((), bool)
        return fields

    def update(u, state):
        beta = state.hyper["beta"]
        fresh = _fresh(dampening, beta)
        d = u.direction
        if torch:  # the buffer starts as a copy of its first step
            momentum = tm(lambda m, x: cast_like(jnp.where(state.started, beta * m + fresh(x), x),
                                             m), state.momentum, d)
        else:
            momentum = tm(lambda m, x: cast_like(beta * m + fresh(x), m), state.momentum, d)
        step = (tm(lambda x, m: cast_like(x + beta * m, m), d, momentum) if nesterov
                else momentum)
        started = jnp.ones((), bool) if torch else state.started
        return u._replace(direction=step), state._replace(momentum=momentum, started=started)

    return Piece(init, update)


def shifted_momentum(num_learners: int, *, torch: bool, dampening) -> Piece:
    """P2's shifted momentum: one buffer per learner, the gradients applied in slot order.

    Per gradient l, in slot order, ``m_{k_l} <- beta m_{k_l} + (1 - dmp) d_l`` with ``d_l =
    w_l (g_l + wd_p theta)`` (``w_l`` the softsync weight, theta the fresh weights); the
    step to descend by is ``sum_l m_{k_l}``, each slot contributing its learner's buffer as
    it stood after that slot. With P2's round robin (N = tau + 1 workers, c = 1) this is
    P2's shifted momentum ``w_{t+1} = w_t - eta grad L(w_{t-tau}) + beta (w_{t-tau} -
    w_{t-tau-1})``. Slots run sequentially, so a learner appearing twice in one update sees
    its first gradient in its buffer before the second, as two single updates would. Under
    style torch each learner's buffer starts as a copy of its own first step (as the
    official MSGD server's per-worker buffers do), ``started`` [num_learners] saying which
    have. Owns ``CoreState.momentum`` (every leaf with a leading axis ``num_learners``).
    """
    tm = jax.tree_util.tree_map

    def init(params):
        fields = {"momentum": tm(
            lambda p: jnp.zeros((num_learners, *jnp.shape(p)), jnp.result_type(p)), params)}
        if torch:
            fields["started"] = jnp.zeros((num_learners,), bool)
        return fields

    def update(u, state):
        # The decay term wd_p * theta uses the fresh theta at the start of the update (P1/P2).
        decay = tm(lambda p, k: (u.wd * k) * p, u.params, u.decay)
        valid = jnp.ones((u.c,), bool) if u.valid is None else u.valid
        slot = _shifted_slot(state.hyper["beta"], _fresh(dampening, state.hyper["beta"]),
                             decay, torch)
        carry = (state.momentum, tm(jnp.zeros_like, u.params), state.started)
        if u.c == 1:
            # No loop for plain async (the common case): same arithmetic as one scan step.
            (bufs, acc, started), _ = slot(
                carry, (u.weights[0], u.learner_ids[0], valid[0], tm(lambda g: g[0], u.grads)))
        else:
            (bufs, acc, started), _ = jax.lax.scan(
                slot, carry, (u.weights, u.learner_ids, valid, u.grads))
        return u._replace(direction=acc), state._replace(momentum=bufs, started=started)

    return Piece(init, update)


def _shifted_slot(beta, fresh, decay, torch):
    """The scan body of :func:`shifted_momentum`: one slot's buffer step, ``(bufs, acc,
    started)`` -> the same after slot ``(w_l, k_l, ok, g_l)`` (a padding slot, ``ok``
    False, changes nothing)."""
    tm = jax.tree_util.tree_map

    def slot(carry, xs):
        bufs, acc, on = carry
        w_l, k_l, ok, g_l = xs
        old = tm(lambda b: b[k_l], bufs)
        if torch:
            was = on[k_l]

            def step_of(b, x):
                return jnp.where(was, beta * b + fresh(x), x)

            on = on.at[k_l].set(was | ok)
        else:
            def step_of(b, x):
                return beta * b + fresh(x)

        new = tm(
            lambda b, g, dc: jnp.where(ok, step_of(b, w_l * (g + dc)).astype(b.dtype), b),
            old,
            g_l,
            decay,
        )
        bufs = tm(lambda b, n: b.at[k_l].set(n), bufs, new)
        # The step adds the row as stored: reading ``new`` instead lets XLA recompute it
        # from the buffer the row overwrites, which then has to be copied whole first.
        acc = tm(lambda a, b: a + jnp.where(ok, b[k_l], jnp.zeros((), b.dtype)), acc, bufs)
        return (bufs, acc, on), None

    return slot


def descend() -> Piece:
    """``theta <- theta - s`` (style caffe: the rates are in the step) or ``theta <- theta -
    eta s`` (style torch), ``s = Update.direction``, each leaf in its parameter's dtype;
    writes ``CoreState.params``."""

    def update(u, state):
        eta = u.eta
        if eta is not None:
            new = jax.tree_util.tree_map(lambda p, s: cast_like(p - eta * s, p), u.params,
                                         u.direction)
        else:
            new = jax.tree_util.tree_map(lambda p, s: cast_like(p - s, p), u.params, u.direction)
        return u, state._replace(params=new)

    return Piece(no_state, update)
