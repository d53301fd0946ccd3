"""The update core's chain: small pure pieces composed in order, as optax composes transforms.

optax builds an optimizer as ``chain(scale_by_adam(), scale_by_learning_rate())``: each
transform is a pair ``init(params) -> state``, ``update(updates, state, params) -> (updates,
state)``, and ``chain`` threads the updates through them in order. One PS update carries more
than gradients -- their staleness, who sent them, padding, the rates the lr rule gives them --
so here the value that flows along the chain is an :class:`Update` (the in-flight values of one
PS update) and the state is the core's :class:`~asyncsim.numerics.core.CoreState`, of which
each piece owns named fields. A :class:`Piece` is the pair:

* ``init(params) -> dict``: the initial values of the ``CoreState`` fields the piece owns
  (``{}`` if it owns none); it may also check the configuration against the parameters.
* ``update(u, state) -> (u, state)``: one PS update's work; it reads what earlier pieces put
  in ``u`` and ``state``, replaces fields of ``u`` (``u._replace``) and its own fields of
  ``state``, and nothing else.

:func:`read_slots` turns ``apply``'s arguments into the first :class:`Update`; :func:`chain`
composes pieces; :func:`unless_all_padding` wraps a chain so that an update whose slots are
all padding leaves the state's step unchanged. The pieces live with their concepts: the
staleness the lr rule sees and the rule's per-gradient rates (:mod:`~asyncsim.numerics.weights`),
the schedule (:mod:`~asyncsim.numerics.schedule`), delay compensation
(:mod:`~asyncsim.numerics.compensation`), weight decay
(:mod:`~asyncsim.numerics.weight_decay`), the softsync weights and the aggregate
(:mod:`~asyncsim.numerics.aggregation`),
momentum and the descent step (:mod:`~asyncsim.numerics.momentum`) and the optax server
transform (:mod:`~asyncsim.numerics.transforms`); :func:`~asyncsim.numerics.core.make_core`
assembles them.

Pieces run in the order of the chain and every piece keeps the arithmetic (and so the
float32 rounding) of the step it performs: a reordering of the chain is a change of numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any

__all__ = ["Piece", "Update", "bcast", "cast_like", "chain", "no_state", "read_slots",
           "unless_all_padding", "zero_padding"]


class Update(NamedTuple):
    """The in-flight values of one PS update, as they pass along the chain.

    Attributes:
        params: theta, the master weights at the start of the update (the fresh weights that
            weight decay and compensation read); pieces never replace it.
        grads: the c gradients, leading axis c (padding slots zeroed; compensated once the
            compensation piece has run).
        c: the static number of slots (the leading axis of ``grads``).
        tau: float32 ``[c]``, the staleness the lr rule sees for each gradient.
        tau_sum: float32, the sum of the valid slots' staleness.
        valid: bool ``[c]``, False on a padding slot; None when ``apply`` had no mask.
        n_valid: float32, the number of valid slots (``c`` without a mask).
        learner_ids: int32 ``[c]``, who computed each gradient.
        step: the PS version at which the update is applied (may be traced).
        read_params: the parameters each gradient was computed on (leading axis c), or None.
        mean_tau: float32, the mean staleness the lr rule sees.
        rates: float32 ``[c]``, each gradient's rate (style caffe) or weight at rate 1.
        eta: the rate outside the buffer (style torch, optax transforms); None under caffe.
        weights: float32 ``[c]``, w_l = rates_l / c, 0 on padding slots.
        wd: float32, the weight decay (``hyper["weight_decay"]``).
        decay: a pytree of Python floats like ``params``, each leaf's weight-decay multiplier.
        direction: the step the descent subtracts (after aggregation and momentum).
    """

    params: PyTree
    grads: PyTree
    c: int
    tau: jax.Array
    tau_sum: jax.Array
    valid: jax.Array | None
    n_valid: Any
    learner_ids: jax.Array
    step: Any
    read_params: PyTree | None = None
    mean_tau: Any = None
    rates: jax.Array | None = None
    eta: Any = None
    weights: jax.Array | None = None
    wd: Any = None
    decay: PyTree | None = None
    direction: PyTree | None = None


State = Any  # a CoreState (asyncsim.numerics.core); pieces only ``_replace`` its fields


class Piece(NamedTuple):
    """One link of the chain: ``init(params) -> {CoreState field: initial value}`` and
    ``update(u, state) -> (u, state)`` (see the module docstring)."""

    init: Callable[[PyTree], dict[str, Any]]
    update: Callable[[Update, State], tuple[Update, State]]


def no_state(params: PyTree) -> dict[str, Any]:
    """The ``init`` of a piece that owns no state."""
    return {}


def chain(*pieces: Piece) -> Piece:
    """The pieces run in order: ``init`` merges their fields, ``update`` threads ``(u,
    state)`` through each (optax's ``chain``)."""

    def init(params):
        fields: dict[str, Any] = {}
        for p in pieces:
            fields.update(p.init(params))
        return fields

    def update(u, state):
        for p in pieces:
            u, state = p.update(u, state)
        return u, state

    return Piece(init, update)


# The fields an update's step changes, which an all-padding update keeps.
_STEPPED = ("params", "momentum", "started", "opt_state", "comp")


def unless_all_padding(inner: Piece) -> Piece:
    """``inner``, except that an update whose slots are all padding (``mask`` all False)
    leaves params, momentum, ``started``, the transform's and the compensation's state as
    they were: momentum must not decay on an empty update. The staleness statistics take
    the update as ``inner`` left them (an empty update adds nothing to them)."""

    def update(u, before):
        u, after = inner.update(u, before)
        if u.valid is None:
            return u, after
        any_valid = u.n_valid > 0
        kept = jax.tree_util.tree_map(
            lambda n, o: jnp.where(any_valid, n, o),
            tuple(getattr(after, f) for f in _STEPPED),
            tuple(getattr(before, f) for f in _STEPPED))
        return u, after._replace(**dict(zip(_STEPPED, kept, strict=True)))

    return Piece(inner.init, update)


def bcast(v: jax.Array, like: jax.Array) -> jax.Array:
    """Reshape a ``[c]`` vector to broadcast against a ``[c, ...]`` leaf."""
    return v.reshape(v.shape + (1,) * (like.ndim - 1))


def cast_like(x: jax.Array, p: jax.Array) -> jax.Array:
    """``x`` in ``p``'s dtype: every step keeps its parameter's (or buffer's) dtype."""
    return x.astype(jnp.result_type(p))


def zero_padding(grads: PyTree, valid: jax.Array) -> PyTree:
    """``grads`` with the padding slots' values set to 0. Padding slots may hold anything
    (even NaN), and 0 * NaN is NaN, so they are replaced, not weighted by 0."""
    return jax.tree_util.tree_map(
        lambda g: jnp.where(bcast(valid, g), g, jnp.zeros((), g.dtype)), grads)


def read_slots(params, grads, *, staleness, learner_ids, step, mask=None,
               read_params=None) -> Update:
    """The first :class:`Update` of the chain, from ``apply``'s arguments (see
    :func:`~asyncsim.numerics.core.make_core`): staleness and learner ids as int32 ``[c]``,
    the valid slots counted, the padding slots' gradients zeroed.

    Raises:
        ValueError: ``staleness``, ``learner_ids`` or ``mask`` not of shape ``(c,)``.
    """
    c = jax.tree_util.tree_leaves(grads)[0].shape[0]
    staleness = jnp.asarray(staleness, jnp.int32)
    learner_ids = jnp.asarray(learner_ids, jnp.int32)
    if staleness.shape != (c,) or learner_ids.shape != (c,):
        raise ValueError(
            f"staleness {staleness.shape} and learner_ids {learner_ids.shape} must have "
            f"shape ({c},), the leading axis of grads"
        )
    tau = staleness.astype(jnp.float32)
    if mask is None:
        valid = None
        n_valid = jnp.float32(c)
        tau_sum = jnp.sum(tau)
    else:
        valid = jnp.asarray(mask, bool)
        if valid.shape != (c,):
            raise ValueError(f"mask {valid.shape} must have shape ({c},)")
        n_valid = jnp.sum(valid, dtype=jnp.float32)
        tau_sum = jnp.sum(jnp.where(valid, tau, 0.0))
        grads = zero_padding(grads, valid)
    return Update(params=params, grads=grads, c=c, tau=tau, tau_sum=tau_sum, valid=valid,
                  n_valid=n_valid, learner_ids=learner_ids, step=step,
                  read_params=read_params)
