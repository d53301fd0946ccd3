"""The compiled-chunk executor (the scan path): chunks of updates in one compiled loop.

A trace's updates run as chunks of a ``lax.fori_loop`` inside one jitted program, with a
device store that gives each gradient the parameters it read: the parameter versions later
gradients still read (``store="versions"``: :func:`~.slots.slot_plan`) or, for models with a
dense input layer, pending gradients computed when the version they read is current
(``store="gradients"``: :func:`~.slots.pending_plan`,
:class:`~asyncsim.numerics.models.DenseInput`).
The same arithmetic as the loop path, compiled as one program: results agree with it to
floating-point tolerance (1e-5), not bit for bit. It serves replay (:func:`replay_scan`) and
vmapped sweeps (:mod:`asyncsim.drivers.vmapped`); whether it is faster than the loop
depends on the model and backend (README, Performance).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from asyncsim import runs
from asyncsim.config import Scenario
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.driver import Driver, Monitor, RunResult
from asyncsim.drivers.folder_scenario import start_folder
from asyncsim.drivers.replay import (
    DEFAULT_MAX_MEMORY,
    check_learners,
    check_memory,
    source_of,
)
from asyncsim.drivers.slots import pending_inputs, pending_plan, slot_plan, versions_inputs
from asyncsim.numerics.models import num_params, tree_bytes
from asyncsim.numerics.numerics import Numerics
from asyncsim.trace import Trace


def replay_scan(scn: Scenario, trace: Trace, *, numerics: Numerics | None = None,
                hyper: Mapping[str, float] | None = None, out: str | Path | None = None,
                force: bool = False, chunk: int = 512, store: str = "auto",
                max_memory: int = DEFAULT_MAX_MEMORY, kind: str = "replay",
                monitor: Monitor | None = None,
                extra: Mapping[str, Any] | None = None,
                compare: Callable[[dict[str, Any], Any], Mapping[str, Any]] | None = None
                ) -> RunResult:
    """Replay as compiled chunks: a compiled loop over updates with a device store.

    ``store="versions"``: the parameter versions later gradients still read live in one
    stacked device array of K slots (:func:`slot_plan`: K = the most versions alive at
    once, at most S + 1 for a trace of maximum staleness S); update v reads
    ``buf[slot[read]]`` and writes version v + 1 to ``buf[slot[v + 1]]``.
    ``store="gradients"``: each gradient is computed when its read version is current and
    kept pending until its update (:func:`pending_plan`; models with a dense input layer).
    ``"auto"`` chooses (see :func:`scan_setup`). Chunks end at evaluation points, so the
    program leaves jit only to evaluate. Needs the same number of gradients c in every
    update (every built-in protocol's trace has it). It computes the same arithmetic as
    :func:`replay` but XLA compiles it as one program, so results agree to floating-point
    tolerance rather than bit for bit; :func:`replay` stays the exact reference. Which is
    faster depends on the model and backend (docs/design.md): on 2 CPU cores a scan over
    convolutions runs slower than a loop of jitted steps, while small dense models gain
    from losing the per-step dispatch.
    """
    check_chunk_monitor(monitor)
    num = numerics or numerics_for(scn)
    c = trace.uniform_n_grads
    if c is None:
        raise ValueError("replay_scan needs the same number of gradients in every update")
    m = trace.num_updates
    check_learners(scn, trace)
    run_chunk, xs_all, init_buf, fields = scan_setup(num, trace, c, store, max_memory)
    with runs.opened(out, force=force, source=source_of(trace)) as folder:
        start_folder(folder, scn, replay_of=trace.meta.get("source"), path="scan")
        t0 = time.perf_counter()
        driver = Driver(scn, num, folder=folder, hyper=dict(hyper or {}), checkpoints=False,
                        monitor=monitor)
        every = scn.run.eval_every or m
        times = trace.updates["time"]
        first = (driver.state, init_buf(driver.state.params))
        for carry, losses, _, e, redo in run_chunks(run_chunk, first, xs_all,
                                                      chunk_bounds(m, chunk, every), chunk):
            if driver.chunk_applied(e, carry[0], losses, e * c, now=float(times[e - 1]),
                                    state_at=lambda v, redo=redo: redo(v)[0]) is False:
                break
        # Agrees with the loop path to floating-point tolerance, not bit for bit.
        return driver.finish(trace, t0, kind=kind, compare=compare, extra={
            "replay_path": "scan", "exact": False, **fields, **(extra or {})})


def check_chunk_monitor(monitor: Monitor | None) -> None:
    """A compiled chunk leaves jit only at its end: a monitor that observes in between needs
    the loop path."""
    if monitor is not None and monitor.every:
        raise ValueError("a monitor that observes every few updates needs the loop path "
                         "(asyncsim.drivers.replay.replay)")


def scan_setup(num: Numerics, trace: Trace, c: int, store: str, max_memory: int, *,
                points: int = 1,
                vmapped: bool = False) -> tuple[Any, tuple[np.ndarray, ...], Any, dict[str, Any]]:
    """What :func:`replay_scan` and :func:`replay_vmapped` (``path="scan"``) run: the chunk
    program, its per-update inputs, ``init(params) -> carry buffer`` and the summary's
    memory fields, after the memory check. ``store``: "auto" keeps pending gradients when
    something is stale and the model has a dense input layer
    (:class:`~asyncsim.numerics.models.DenseInput`) whose kernel is at least 4x the bytes a pending
    gradient keeps (else copying versions costs less), else parameter versions;
    "versions" | "gradients" force one."""
    if store not in ("auto", "versions", "gradients"):
        raise ValueError(f"store must be auto, versions or gradients, got {store!r}")
    has_parts = hasattr(num.programs, "parts_one")
    if store == "gradients" and not has_parts:
        raise ValueError(f"store='gradients' needs a model with a dense input layer; "
                         f"{num.model.name!r} has none")
    if store == "gradients" and num.compensates:
        raise ValueError("store='gradients' keeps no parameter versions, which delay "
                         "compensation reads: use store='versions' (or 'auto')")
    vslot, K = slot_plan(trace)
    tm = jax.tree_util.tree_map
    shapes = jax.eval_shape(num.model.init, jax.random.PRNGKey(0))
    if has_parts:
        x0 = jax.ShapeDtypeStruct((), jnp.int32)
        out = jax.eval_shape(num.programs.parts_one, shapes, num.x_train, num.y_train, x0, x0)
        slot_bytes = tree_bytes(out)
    if store == "auto":
        # A pending gradient saves copying a version in and out per update (~2 x the first
        # kernel's bytes) for writing and reading its slot, plus a few fixed operations.
        # Measured on 2 CPU cores: MLP [128] at mu = 32 (kernel 74x a slot) 0.91 of plain SGD
        # (median of 8 runs) vs 0.74-0.82 with versions; MLP [32] on full images (115x)
        # 1.6 s vs 2.5 s for a vmapped 16-point sweep; the 4x4-pooled MLP [32] (kernel 1.5x a
        # slot) 0.48 s vs 0.43 s.
        kernel = shapes[num.model.dense_input.name]["w"] if has_parts else None
        big = has_parts and int(np.prod(kernel.shape)) * 4 >= 4 * slot_bytes
        # Delay compensation reads each gradient's version: only the version store has it.
        store = "gradients" if big and K > 1 and not num.compensates else "versions"
    if store == "versions":
        need = K * num_params(shapes) * 4
        check_memory(K, trace, need * points, max_memory, points=points)
        xs_all, reads = versions_inputs(trace, c, vslot), 1

        def init(params):
            return tm(lambda p: jnp.broadcast_to(p, (K, *p.shape)), params)

        fields = {"replay_store": "versions", "replay_versions_held": K,
                  "replay_version_bytes": need}
    else:
        gslot, Q = pending_plan(trace)
        need = (Q + 1) * slot_bytes
        check_memory(Q + 1, trace, need * points, max_memory, points=points,
                      what="pending gradients")
        xs_all, reads = pending_inputs(trace, c, gslot, Q)
        K = Q + 1

        def init(params):
            del params
            return tm(lambda o: jnp.zeros((Q + 1, *o.shape), o.dtype), out)

        fields = {"replay_store": "gradients", "replay_versions_held": 1,
                  "replay_pending_gradients": Q + 1, "replay_version_bytes": need}
    program = _scan_program(num, c, K, vmapped=vmapped, store=store, reads=reads)
    return program, xs_all, init, fields


def chunk_bounds(m: int, chunk: int, every: int) -> list[tuple[int, int]]:
    """[start, end) update ranges of at most ``chunk`` updates that end at every multiple
    of ``every`` (the evaluation points), so the program leaves jit only to evaluate."""
    bounds = sorted({*range(0, m, min(chunk, every)), *range(0, m, every), m})
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _scan_program(num: Numerics, c: int, K: int, *, vmapped: bool, store: str = "versions",
                  reads: int = 1, traces: bool = False,
                  growth: tuple[int, int, int] | None = None):
    """The jitted chunk program ``(state, buf), xs, n -> (state, buf), losses[L, c]``: runs
    the first ``n`` of the L updates in ``xs`` (inputs padded to L; see :func:`run_chunks`).

    ``store="versions"``: update v reads its gradients' versions from ``buf[read slot]`` and
    writes version v + 1 to ``buf[write slot]`` (:func:`slot_plan`, K slots); ``K = 1``:
    nothing stale, no buffer. ``store="gradients"`` (models with a dense input layer): update
    v first computes the gradients that read version v, at the current parameters, into
    ``buf``'s pending slots (:func:`pending_plan`, K slots and a scratch one; up to
    ``reads`` per update), then applies the c pending gradients it takes; no version is
    ever copied (README, Performance).
    ``vmapped``: state and buffer carry a leading axis of sweep points (losses [P, L, c]);
    ``traces`` adds an outer axis of traces (carry [T, P, ...], inputs [T, L, ...]).
    ``growth = (q1, q2, q3)``: instead of losses the program keeps, per lane, the largest
    squared parameter norm over updates [q1, q2) and from q3 on (the carry becomes
    ``((state, buf), (window_a, window_b))``): the measured-edge test of
    :mod:`asyncsim.stability.measured`.
    Compiled once per (Numerics, c, K, vmapped, store, reads, traces, growth) and chunk
    size L."""
    cache = num.__dict__.setdefault("_scan_cache", {})
    key = (c, K, vmapped, store, reads, traces, growth)
    if key in cache:
        return cache[key]
    update = (_pending_update(num, c, reads) if store == "gradients"
              else _versions_update(num, c, K))
    prog = (_growth_loop(update, store, growth) if growth is not None
            else _losses_loop(update, c))
    if vmapped:
        prog = jax.vmap(prog, in_axes=(0, None, None))
    if traces:
        prog = jax.vmap(prog, in_axes=(0, 0, None))
    # The carry is donated: XLA then updates and reads the buffer in place. Without it, reads
    # from the (non-aliased) buffer cost ~40% of an MLP step on CPU (measured, 24 versions).
    cache[key] = jax.jit(prog, donate_argnums=(0,))
    return cache[key]


def _read(buf, i):
    """Slot ``i`` of a buffer of versions or pending gradients (a traced index)."""
    return jax.tree_util.tree_map(lambda a: lax.dynamic_index_in_dim(a, i, keepdims=False), buf)


def _row(xs, i):
    """Row ``i`` of a chunk's per-update inputs (a traced index)."""
    return tuple(lax.dynamic_index_in_dim(a, i, keepdims=False) for a in xs)


def _versions_update(num: Numerics, c: int, K: int):
    """One update of the version store: ``(state, buf), (l, b, r, t, v, w) -> (state, buf),
    losses[c]``. The update's c gradients read their versions from ``buf[r]`` (the current
    parameters when ``K == 1``: nothing is stale), the core applies them, and the new
    version is written to ``buf[w]`` (:func:`slot_plan`)."""
    tm = jax.tree_util.tree_map
    one, core_apply = num.programs.one, num.core.apply
    x_all, y_all = num.x_train, num.y_train

    def body(carry, xs):
        st, buf = carry
        l, b, r, t, v, w = xs
        if c <= 4:
            # K == 1 (no staleness): every gradient reads the current parameters, no copy.
            read_c = [st.params if K == 1 else _read(buf, r[i]) for i in range(c)]
            outs = [one(p_i, x_all, y_all, l[i], b[i]) for i, p_i in enumerate(read_c)]
            losses = jnp.stack([o[0] for o in outs])
            grads = tm(lambda *a: jnp.stack(a), *[o[1] for o in outs])
            params_c = tm(lambda *a: jnp.stack(a), *read_c) if num.compensates else None
        elif K == 1:
            losses, grads = jax.vmap(one, in_axes=(None, None, None, 0, 0))(
                st.params, x_all, y_all, l, b)
            params_c = (tm(lambda p: jnp.broadcast_to(p, (c, *p.shape)), st.params)
                        if num.compensates else None)
        else:
            params_c = tm(lambda a: a[r], buf)
            losses, grads = jax.vmap(one, in_axes=(0, None, None, 0, 0))(
                params_c, x_all, y_all, l, b)
        # Delay compensation reads the versions the gradients were computed on.
        st = core_apply(st, grads, staleness=t, learner_ids=l, step=v,
                        read_params=params_c if num.compensates else None)
        if K > 1:
            # The reads cost a copy of a version each, the write one more. Measured on 2 CPU
            # cores for a 1.6 MB weight: the dynamic write costs ~0.12 ms per update, the read
            # ~0.03 ms; an extra fused elementwise output (a static destination) would cost
            # ~0.05 ms, but static destinations need the body unrolled over a ring of S + 1.
            buf = tm(lambda a, p: lax.dynamic_update_index_in_dim(a, p, w, 0), buf, st.params)
        return (st, buf), losses

    return body


def _pending_update(num: Numerics, c: int, reads: int):
    """One update of the gradient store: ``(state, buf), (n, cl, cb, cs, l, a, t, v) ->
    (state, buf), losses[c]``. First the ``n`` gradients that read this version are computed
    at the current parameters into their pending slots ``cs`` (:func:`pending_plan`; up to
    ``reads``), then the c pending gradients in slots ``a`` are expanded and applied."""
    tm = jax.tree_util.tree_map
    core_apply = num.core.apply
    x_all, y_all = num.x_train, num.y_train
    parts_one, expand_one = num.programs.parts_one, num.programs.expand_one

    def pending_body(carry, xs):
        st, buf = carry
        n, cl, cb, cs, l, a, t, v = xs

        def compute(j, buf):
            out = parts_one(st.params, x_all, y_all, cl[j], cb[j])
            return tm(lambda p, o: lax.dynamic_update_index_in_dim(p, o, cs[j], 0), buf, out)

        # The first read is unconditional (an update without reads computes into the scratch
        # slot) and only further reads loop: measured on the MLP row, a loop over all reads
        # cost ~0.05 ms per update more, far more than the rare wasted gradient.
        buf = compute(0, buf)
        if reads > 1:
            buf = lax.fori_loop(1, n, compute, buf)
        losses = buf[0][a]
        if c <= 4:
            grads = tm(lambda *g: jnp.stack(g), *[
                expand_one(_read(buf[1], a[i]), x_all) for i in range(c)])
        else:
            grads = jax.vmap(expand_one, in_axes=(0, None))(tm(lambda p: p[a], buf[1]), x_all)
        st = core_apply(st, grads, staleness=t, learner_ids=l, step=v)
        return (st, buf), losses

    return pending_body


def _losses_loop(update, c: int):
    """The chunk program ``carry, xs, n -> carry, losses[L, c]``: ``update`` over the first
    ``n`` rows of ``xs``, keeping each update's batch losses."""

    def chunk_fn(carry, xs, n):
        # A loop with a traced trip count over inputs padded to a fixed length: one compiled
        # program serves every chunk length (probes, the trace's tail, evaluation spacing),
        # where a scan over each length's inputs compiled anew (~1.7 s each for a small MLP).
        L = xs[0].shape[0]
        losses = jnp.zeros((L, c), jnp.float32)

        def step(i, val):
            carry, losses = val
            carry, lo = update(carry, _row(xs, i))
            return carry, lax.dynamic_update_index_in_dim(losses, lo.astype(jnp.float32), i, 0)

        return lax.fori_loop(0, n, step, (carry, losses))

    return chunk_fn


def _growth_loop(update, store: str, growth: tuple[int, int, int]):
    """The measured-edge chunk program ``(carry, (window_a, window_b)), xs, n -> ..., None``:
    ``update`` over the first ``n`` rows, keeping the largest squared parameter norm over
    updates [q1, q2) and from q3 on (``growth = (q1, q2, q3)``)."""
    q1, q2, q3 = growth

    def growth_fn(carry, xs, n):
        v_col = xs[-2] if store == "versions" else xs[-1]  # the update index of each row

        def step(i, val):
            inner, (wa, wb) = val
            inner, _ = update(inner, _row(xs, i))
            v = v_col[i]
            sq = sum(jnp.sum(jnp.square(p)) for p in jax.tree_util.tree_leaves(inner[0].params))
            # NaN must win the max (a diverged lane), hence jnp.maximum, not fmax.
            wa = jnp.where((v >= q1) & (v < q2), jnp.maximum(wa, sq), wa)
            wb = jnp.where(v >= q3, jnp.maximum(wb, sq), wb)
            return inner, (wa, wb)

        return lax.fori_loop(0, n, step, carry), None

    return growth_fn


def run_chunks(run_chunk, carry, xs_all: tuple[np.ndarray, ...],
                 bounds: Sequence[tuple[int, int]], length: int):
    """Run ``run_chunk`` (:func:`_scan_program`) over the update ranges ``bounds`` (each at
    most ``length`` long), yielding ``(carry, losses, start, end, redo)`` after each; losses
    are [n, c] ([P, n, c] for the vmapped program), fetched. Each range's inputs are padded
    to ``length``, so every call has the same shapes and one compiled program serves them
    all. ``redo(v)`` recomputes the carry after update ``v`` of the chunk (the same program
    on a copy of the chunk's first carry, which the call itself donates): a divergence found
    at the chunk's end rolls back with it."""
    for s, e in bounds:
        n = e - s
        xs = tuple(np.concatenate([a[s:e], np.zeros((length - n, *a.shape[1:]), a.dtype)])
                   for a in xs_all)
        start = jax.tree_util.tree_map(jnp.copy, carry)
        carry, losses = run_chunk(carry, xs, np.int32(n))
        yield carry, np.asarray(losses[..., :n, :]), s, e, _redo(run_chunk, start, xs, s)


def _redo(run_chunk, start, xs, s: int):
    done: dict[int, Any] = {}

    def redo(v: int):
        if v not in done:
            copy = jax.tree_util.tree_map(jnp.copy, start)  # the program donates its carry
            done[v] = run_chunk(copy, xs, np.int32(v + 1 - s))[0]
        return done[v]

    return redo


def growth_inputs(traces: Sequence[Trace]) -> tuple[tuple[np.ndarray, ...], int, int]:
    """The per-update inputs of :func:`growth_windows` for ``traces`` (equal lengths, the
    same number c of gradients in every update: P2's fixed delay takes one, n-softsync
    λ/n), stacked on a leading trace axis, the slots K of the versions store they need (each
    trace keeps its own :func:`slot_plan`) and c. Computed once and reused by every call
    over the same traces (an edge search makes ten)."""
    m = {t.num_updates for t in traces}
    if len(m) != 1:
        raise ValueError(f"traces must have equal numbers of updates, got {sorted(m)}")
    cs = {t.uniform_n_grads for t in traces}
    if len(cs) != 1 or None in cs:
        raise ValueError("growth_windows needs traces whose updates all take the same number "
                         f"of gradients, got {sorted(cs, key=str)}")
    c = cs.pop()
    plans = [slot_plan(t) for t in traces]
    per_trace = [versions_inputs(t, c, slot) for t, (slot, _) in zip(traces, plans, strict=True)]
    return (tuple(np.stack(cols) for cols in zip(*per_trace, strict=True)),
            max(k for _, k in plans), c)


def growth_windows(num: Numerics, inputs: tuple[tuple[np.ndarray, ...], int, int],
                   lrs: np.ndarray, *, growth: tuple[int, int, int]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The traces of ``inputs`` (:func:`growth_inputs`) executed under every learning rate of
    ``lrs`` ([T, K]: a grid per trace) as one compiled program, vmapped over traces and
    rates: per (trace, rate) the largest squared parameter norm over the updates [q1, q2)
    and from q3 on (``growth``). The state of each lane is ``num``'s core with that rate
    (``hyper["lr"]``)."""
    xs, K, c = inputs
    m = xs[0].shape[1]
    lrs = np.asarray(lrs, np.float32)
    program = _scan_program(num, c, K, vmapped=True, traces=True, growth=growth)
    (_, (wa, wb)), _ = program(_growth_start(num, K)(lrs), xs, np.int32(m))
    return np.asarray(wa), np.asarray(wb)


def _growth_start(num: Numerics, K: int):
    """The compiled first carry of :func:`growth_windows` for a [T, K] grid of rates: every
    lane's core state, its versions buffer and the two windows. (Built eagerly, these ~30
    vmapped ops cost ~1 ms per call, 4x the program itself for a one-point call.)"""
    cache = num.__dict__.setdefault("_scan_cache", {})
    key = ("growth_start", K)
    if key not in cache:
        p0 = num.init_params()
        tm = jax.tree_util.tree_map

        def start(lrs):
            state = jax.vmap(jax.vmap(lambda lr: num.core.init(p0, lr=lr)))(lrs)
            buf = tm(lambda p: jnp.broadcast_to(p[:, :, None], (*lrs.shape, K, *p.shape[2:])),
                     state.params)
            return (state, buf), (jnp.zeros(lrs.shape, jnp.float32),
                                   jnp.zeros(lrs.shape, jnp.float32))

        cache[key] = jax.jit(start)
    return cache[key]
