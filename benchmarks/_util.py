"""Shared helpers for the side-by-side benchmarks."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

import asyncsim  # noqa: F401  (first: it fixes XLA's thread count)

# isort: split
import jax
import jax.numpy as jnp
import optax

from asyncsim.numerics.data import batch_indices


def best(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best wall time of ``repeat`` calls (seconds); results are blocked on."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def interleaved(fns: dict[str, Callable[[], object]], repeat: int = 3) -> dict[str, list[float]]:
    """Wall times of each function over ``repeat`` rounds that call them in turn, so the
    ratios between them are measured side by side: a slow spell on a shared machine hits
    every candidate rather than only the one that happened to run then (its per-round
    ratios are the spread a benchmark reports: ``_report.ratios``)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[k].append(time.perf_counter() - t0)
    return times


def best_interleaved(fns: dict[str, Callable[[], object]], repeat: int = 3) -> dict[str, float]:
    """The best of each function's :func:`interleaved` times."""
    return {k: min(v) for k, v in interleaved(fns, repeat).items()}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plain_sgd_loop(num, lr: float, batches: list[tuple[int, int]], batch_size: int):
    """The reference: a Python loop over ONE jitted SGD step (gradient + update fused),
    on the same samples (learner, batch) -> batch_indices as asyncsim uses."""
    model = num.model
    opt = optax.sgd(lr)
    x_all, y_all = num.x_train, num.y_train
    seed, n = num.seed, num.n_train

    @jax.jit
    def step(params, opt_state, learner, batch):
        idx = batch_indices(seed, learner, batch, batch_size, n)
        loss, g = jax.value_and_grad(model.loss)(params, x_all[idx], y_all[idx])
        upd, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, loss

    params = num.init_params()
    state = opt.init(params)
    step(params, state, jnp.int32(0), jnp.int32(0))  # compile

    def run():
        p, s = params, state
        for learner, b in batches:
            p, s, _ = step(p, s, jnp.int32(learner), jnp.int32(b))
        return p

    return run


def plain_sgd_scan(num, lr: float, batches: list[tuple[int, int]], batch_size: int):
    """The same SGD as a lax.scan over the batches (one compiled program)."""
    model = num.model
    opt = optax.sgd(lr)
    x_all, y_all = num.x_train, num.y_train
    seed, n = num.seed, num.n_train
    ls = jnp.asarray([b[0] for b in batches], jnp.int32)
    bs = jnp.asarray([b[1] for b in batches], jnp.int32)

    @jax.jit
    def run_all(params, state):
        def body(carry, xs):
            p, s = carry
            idx = batch_indices(seed, xs[0], xs[1], batch_size, n)
            _, g = jax.value_and_grad(model.loss)(p, x_all[idx], y_all[idx])
            upd, s = opt.update(g, s, p)
            return (optax.apply_updates(p, upd), s), None

        (p, _), _ = jax.lax.scan(body, (params, state), (ls, bs))
        return p

    params = num.init_params()
    state = opt.init(params)
    run_all(params, state)
    return lambda: run_all(params, state)
