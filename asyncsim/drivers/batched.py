"""The batched path: the gradients of many updates in one call, for accelerators.

A GPU given P1's network at its per-learner batch (μ = 4) is idle most of one gradient
call: the cost is the call, not the arithmetic. A replay knows the whole trace, and a
gradient's inputs are fixed when it is pulled (the version it read and its mini-batch), so a
gradient can be computed as soon as the version it read exists, long before the update that
applies it: in an async trace of λ learners, the next ~λ updates' gradients read versions
that already exist. The replay walks the updates in order like the loop path;
when an update needs a gradient not yet computed, it computes that one and the next
uncomputed gradients whose read versions exist (looking up to ``2 * batch`` gradients
ahead), up to ``batch`` of them, in one program vmapped over their read versions
(:meth:`~asyncsim.numerics.numerics.Numerics.grads_into`), into a pool of gradients on the
device; each update then takes its gradients from the pool through the update core
(:meth:`~asyncsim.numerics.numerics.Numerics.apply_pooled`). It is the loop replay
(:func:`asyncsim.drivers.replay.replay` with ``batch=K``; ``asyncsim replay --path
batched``) with :class:`Batched` executing its updates: the Driver records, checks,
evaluates and stops as for every path.

The arithmetic is the loop path's, batched: results agree with it to floating-point
tolerance, not bit for bit (``exact: false`` in ``summary.json``), so it is never chosen by
default and the loop stays the exact reference on every backend. ``benchmarks/bench_gpu.py``
measures it against one call per gradient for several ``batch`` sizes (where it pays off).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from asyncsim.drivers.driver import Driver
from asyncsim.numerics.models import num_params
from asyncsim.numerics.numerics import Numerics
from asyncsim.trace import Trace

DEFAULT_BATCH = 64  # gradients per call


def pool_slots(trace: Trace, batch: int) -> int:
    """Gradients the pool holds, plus one slot for a call's padding. Those computed and not
    yet applied lie within ``2 * batch`` gradients of the update being applied (a call
    looks no further), or within that update's own ``c``: at most ``max(2 * batch, c)``,
    and never more than the trace has."""
    return min(trace.num_gradients, max(2 * batch, _max_c(trace))) + 1


def _max_c(trace: Trace) -> int:
    """The most gradients one update of ``trace`` takes."""
    return int(trace.updates["n_grads"].max()) if trace.num_updates else 1


def call_sizes(batch: int) -> list[int]:
    """The sizes a call is padded to (powers of two up to ``batch``, then ``batch``): a few
    compiled programs, not one per size, and at most half of a call wasted on padding."""
    sizes, k = [], 1
    while k < batch:
        sizes.append(k)
        k *= 2
    return [*sizes, batch]


class Batched:
    """How a loop replay executes updates on the batched path (``replay(..., batch=K)``):
    the device pool, which gradient sits in which slot, and the calls made."""

    def __init__(self, num: Numerics, trace: Trace, batch: int = DEFAULT_BATCH):
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        self.num, self.batch = num, batch
        n_params = num_params(jax.eval_shape(num.model.init, jax.random.PRNGKey(0)))
        self.slots = pool_slots(trace, batch)
        # Counted by the replay's memory check beside the versions it holds: the pool (twice
        # where it is not updated in place: on CPU a call writes a new one), and a call's
        # stacked read versions and its gradients (an update's c when more than batch).
        c = _max_c(trace)
        self.pool_bytes = self.slots * n_params * 4
        self.bytes = (self.pool_bytes * (2 if jax.default_backend() == "cpu" else 1)
                      + 2 * max(batch, c) * n_params * 4)
        g = trace.grads
        self.learner, self.bidx, self.read = (np.asarray(g[k]) for k in
                                              ("learner", "batch", "read_version"))
        self.n = trace.num_gradients
        self.sizes = call_sizes(batch)
        self.pool = None  # allocated when the replay starts (after the memory check)
        self.scratch = self.slots - 1  # where a call's padding goes
        self.slot_of = np.full(self.n, -1, np.int64)  # gradient i's slot; -1: not computed
        self.free = list(range(self.scratch - 1, -1, -1))
        self.calls = 0
        self.next = 0  # the first gradient of the next update

    def update(self, driver: Driver, v: int, rows) -> tuple[Any, Any]:
        """Execute update ``v`` (its ``rows``, the next in the trace) for ``driver``:
        compute what it misses, and what can be computed with it, then apply it from the
        pool. Returns the new state and the rows' batch losses."""
        num, slot_of, read = self.num, self.slot_of, self.read
        if self.pool is None:
            self.pool = num.gradient_pool(self.slots)
        s = self.next
        mine = range(s, s + len(rows))
        if any(slot_of[i] < 0 for i in mine):
            # This update's missing gradients first, then the next ones whose read version
            # exists now (versions 0..v do), in the order they are applied.
            pick = [i for i in mine if slot_of[i] < 0]
            j, end = mine.stop, min(self.n, s + 2 * self.batch)
            while len(pick) < self.batch and j < end:
                if slot_of[j] < 0 and read[j] <= v:
                    pick.append(j)
                j += 1
            for i in pick:
                slot_of[i] = self.free.pop()
            size = next((k for k in self.sizes if k >= len(pick)), len(pick))
            pad = size - len(pick)
            last = pick[-1]
            versions = driver.versions
            self.pool = num.grads_into(
                self.pool, [versions[read[i]] for i in pick] + [versions[read[last]]] * pad,
                np.r_[self.learner[pick], np.full(pad, self.learner[last])],
                np.r_[self.bidx[pick], np.full(pad, self.bidx[last])],
                np.r_[slot_of[pick], np.full(pad, self.scratch)])
            self.calls += 1
        taken = slot_of[mine.start:mine.stop]
        out = num.apply_pooled(driver.state, self.pool, v, rows, taken, driver.versions)
        self.free.extend(taken.tolist())
        self.next = mine.stop
        return out

    def fields(self) -> dict[str, Any]:
        """What ``summary.json`` says of the path."""
        return {"replay_path": "batched", "exact": False, "replay_batch": self.batch,
                "replay_gradient_calls": self.calls, "replay_pool_bytes": self.pool_bytes}
