"""Deterministic mini-batch sampling: which train examples a learner's step reads.

Contract (docs/design.md, "Determinism"): :func:`batch_indices` ``(seed, learner, step,
batch_size, n)`` is a pure, jittable function of ``(seed, learner, step)`` (which may be
traced int32 values) giving the train indices of one learner's mini-batch. Results never
depend on event interleaving or call order.

Sampling policy of :func:`batch_indices`: each learner walks through its own random
permutation of the train set, a fresh one per (learner, epoch), where learner ``l``'s epoch
``e`` covers its sample positions ``p = step * batch_size + j`` with ``p // n == e``. So within
one learner no example repeats inside an epoch (sampling without replacement, as in ordinary
data loaders), and a batch that straddles two epochs takes the tail of one permutation and the
head of the next. The permutation is not materialised: index ``p % n`` is mapped through a
keyed bijection of ``[0, 2**k)`` (odd-multiply / add / xor-shift rounds, ``2**k >= n``) with
cycle walking into ``[0, n)``, which costs O(batch_size) instead of sorting ``n`` keys per step
(a sort of 50k keys per gradient would cost a third of a small gradient on CPU). The round keys
come from ``fold_in(fold_in(fold_in(PRNGKey(seed), learner), epoch), 0)``. Positions are
computed in uint32, so a learner may take up to ``2**32 / batch_size`` steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["batch_indices"]

_ROUNDS = 4


def _bits_for(n: int) -> int:
    return max(1, int(n - 1).bit_length())


def _permute(keys: jax.Array, i: jax.Array, n: int) -> jax.Array:
    """Keyed bijection of [0, n) applied to ``i`` (uint32), by cycle walking on [0, 2**k)."""
    k = _bits_for(n)
    mask = jnp.uint32((1 << k) - 1)
    shift = max(1, k // 2)
    mult = keys[:_ROUNDS] | jnp.uint32(1)  # odd multipliers are bijective mod 2**k
    add = keys[_ROUNDS:]

    def bijection(x: jax.Array) -> jax.Array:
        for r in range(_ROUNDS):
            x = (x * mult[r] + add[r]) & mask
            x = x ^ (x >> shift)  # xor with a right shift is invertible
        return x

    def walk(x: jax.Array) -> jax.Array:
        # Iterating a bijection of [0, 2**k) until it lands in [0, n) is a bijection of [0, n);
        # since 2**k < 2n the expected number of extra rounds is below one.
        x = bijection(x)
        return jax.lax.while_loop(lambda v: v >= jnp.uint32(n), bijection, x)

    return walk(i)


def batch_indices(seed, learner, step, batch_size: int, n: int) -> jax.Array:
    """int32[batch_size] train indices of learner ``learner``'s ``step``-th mini-batch.

    Pure and jittable in ``(seed, learner, step)``; ``batch_size`` and ``n`` are static.
    See the module docstring for the sampling policy (a per-(learner, epoch) permutation).
    """
    batch_size = int(batch_size)
    n = int(n)
    if batch_size <= 0 or n <= 0:
        raise ValueError(f"batch_size and n must be positive, got {batch_size}, {n}")
    base = jax.random.fold_in(jax.random.PRNGKey(seed), learner)
    pos = jnp.asarray(step).astype(jnp.uint32) * jnp.uint32(batch_size) + jnp.arange(
        batch_size, dtype=jnp.uint32
    )
    epoch = pos // jnp.uint32(n)
    offset = pos % jnp.uint32(n)

    def one(e: jax.Array, i: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.fold_in(base, e), 0)
        keys = jax.random.bits(key, (2 * _ROUNDS,), jnp.uint32)
        return _permute(keys, i, n)

    return jax.vmap(one)(epoch, offset).astype(jnp.int32)
