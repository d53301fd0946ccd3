"""The batched path: the gradients of many updates in one call, for accelerators.

A GPU given P1's network at its per-learner batch (μ = 4) is idle most of one gradient
call: the cost is the call, not the arithmetic. A replay knows the whole trace, and a
gradient's inputs are fixed when it is pulled (the version it read and its mini-batch), so a
gradient can be computed as soon as the version it read exists, long before the update that
applies it: in an async trace of λ learners, the next ~λ updates' gradients read versions
that already exist. :func:`replay_batched` walks the updates in order like the loop path;
when an update needs a gradient not yet computed, it computes that one and the next
uncomputed gradients whose read versions exist (looking up to ``2 * batch`` gradients
ahead), up to ``batch`` of them, in one program vmapped over their read versions
(:meth:`~asyncsim.numerics.numerics.Numerics.grads_into`), into a pool of gradients on the
device; each update then takes its gradients from the pool through the update core
(:meth:`~asyncsim.numerics.numerics.Numerics.apply_pooled`). The Driver records, checks,
evaluates and stops as for every path.

The arithmetic is the loop path's, batched: results agree with it to floating-point
tolerance, not bit for bit (``exact: false`` in ``summary.json``), so it is never chosen by
default and the loop stays the exact reference on every backend. ``benchmarks/bench_gpu.py``
measures it against one call per gradient for several ``batch`` sizes (where it pays off).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from asyncsim import runs
from asyncsim.config import Scenario
from asyncsim.drivers.driver import Driver, Monitor, RunResult, numerics_for
from asyncsim.drivers.record import start_folder
from asyncsim.drivers.replay import (
    DEFAULT_MAX_MEMORY,
    Alive,
    check_learners,
    check_memory,
    last_use,
    replay_memory,
)
from asyncsim.numerics.models import num_params
from asyncsim.numerics.numerics import Numerics
from asyncsim.trace import Trace

DEFAULT_BATCH = 64  # gradients per call


def pool_slots(trace: Trace, batch: int) -> int:
    """Gradients the pool holds: those computed ahead and not yet applied lie within
    ``2 * batch`` gradients of the update being applied, and a call adds at most
    ``max(batch, c)``; one more slot takes a call's padding."""
    c = int(trace.updates["n_grads"].max()) if trace.num_updates else 1
    return 2 * batch + max(batch, c) + 1


def call_sizes(batch: int) -> list[int]:
    """The sizes a call is padded to (powers of two up to ``batch``, then ``batch``): a few
    compiled programs, not one per size, and at most half of a call wasted on padding."""
    sizes, k = [], 1
    while k < batch:
        sizes.append(k)
        k *= 2
    return [*sizes, batch]


def replay_batched(scn: Scenario, trace: Trace, *, batch: int = DEFAULT_BATCH,
                   out: str | Path | None = None, force: bool = False,
                   numerics: Numerics | None = None, hyper: Mapping[str, float] | None = None,
                   max_memory: int = DEFAULT_MAX_MEMORY, progress: bool = False,
                   kind: str = "replay", monitor: Monitor | None = None,
                   extra: Mapping[str, Any] | None = None,
                   compare: Callable[[dict[str, Any], Any], Mapping[str, Any]] | None = None
                   ) -> RunResult:
    """Execute ``trace``'s numerics under ``scn`` with up to ``batch`` gradients per call
    (the module docstring); the other arguments are :func:`~asyncsim.drivers.replay.replay`'s.
    ``max_memory`` covers the parameter versions held and the gradient pool."""
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    num = numerics or numerics_for(scn)
    n_params = num_params(jax.eval_shape(num.model.init, jax.random.PRNGKey(0)))
    need = replay_memory(trace, n_params)
    slots = pool_slots(trace, batch)
    pool_bytes = slots * n_params * 4
    check_learners(scn, trace)
    # The pool, and a call's stacked read versions (batch of them), beside the versions.
    check_memory(need["versions"], trace, need["bytes"] + pool_bytes + batch * n_params * 4,
                 max_memory)
    g = trace.grads
    learner, bidx, read = (np.asarray(g[k]) for k in ("learner", "batch", "read_version"))
    n = trace.num_gradients
    sizes = call_sizes(batch)
    with runs.opened(out, force=force) as folder:
        start_folder(folder, scn, replay_of=trace.meta.get("source"))
        t0 = time.perf_counter()
        driver = Driver(scn, num, folder=folder, hyper=dict(hyper or {}), monitor=monitor,
                        checkpoints=False)
        alive = Alive(last_use(trace))
        pool = num.gradient_pool(slots)
        scratch = slots - 1  # where a call's padding goes
        slot_of = np.full(n, -1, np.int64)  # pool slot of gradient i; -1: not computed yet
        free = list(range(scratch - 1, -1, -1))
        calls = 0
        if progress:
            driver.show_progress(trace.num_updates)
        try:
            s = 0
            for v, rows, now in trace.iter_updates():
                alive.v = v
                mine = range(s, s + len(rows))
                if any(slot_of[i] < 0 for i in mine):
                    # This update's missing gradients first, then the next ones whose read
                    # version exists now (versions 0..v do), in the order they are applied.
                    pick = [i for i in mine if slot_of[i] < 0]
                    j, end = mine.stop, min(n, s + 2 * batch)
                    while len(pick) < batch and j < end:
                        if slot_of[j] < 0 and read[j] <= v:
                            pick.append(j)
                        j += 1
                    for i in pick:
                        slot_of[i] = free.pop()
                    size = next((k for k in sizes if k >= len(pick)), len(pick))
                    pad = size - len(pick)
                    versions = driver.versions
                    pool = num.grads_into(
                        pool, [versions[read[i]] for i in pick] + [versions[read[pick[-1]]]] * pad,
                        np.r_[learner[pick], np.full(pad, learner[pick[-1]])],
                        np.r_[bidx[pick], np.full(pad, bidx[pick[-1]])],
                        np.r_[slot_of[pick], np.full(pad, scratch)])
                    calls += 1
                taken = slot_of[mine.start:mine.stop]
                state, losses = num.apply_pooled(driver.state, pool, v, rows, taken,
                                                 driver.versions)
                free.extend(taken.tolist())
                s = mine.stop
                if driver.applied(v, len(rows), state, losses, alive=alive, now=now) is False:
                    break
        finally:
            driver.close_progress()
        return driver.finish(trace, t0, kind=kind, extra={
            "replay_path": "batched", "exact": False, "replay_batch": batch,
            "replay_gradient_calls": calls, "replay_versions_held": need["versions"],
            "replay_version_bytes": need["bytes"], "replay_pool_bytes": pool_bytes,
            **(extra or {})}, compare=compare)
