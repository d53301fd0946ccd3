"""Vmapped sweeps: one trace replayed under P hyperparameter settings as one program.

The core state carries its hyperparameters (``CoreState.hyper``), so P settings of
``lr``, momentum ``beta`` and ``weight_decay`` are a leading axis of the state and each
update is one vmapped call for all of them (loop path), or chunks of updates for all of them
run as one compiled loop (the scan path of :mod:`asyncsim.drivers.scan`). Each point's
result equals its own replay up to floating-point reassociation under vmap (1e-5).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from asyncsim import runs
from asyncsim.config import Scenario
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.driver import Driver, Monitor, RunResult
from asyncsim.drivers.folder_scenario import start_folder
from asyncsim.drivers.replay import (
    DEFAULT_MAX_MEMORY,
    Alive,
    check_learners,
    check_memory,
    last_use,
    replay_memory,
)
from asyncsim.drivers.scan import check_chunk_monitor, chunk_bounds, run_chunks, scan_setup
from asyncsim.numerics.models import num_params
from asyncsim.numerics.numerics import Numerics
from asyncsim.trace import Trace

VMAP_KEYS = ("optimizer.lr", "optimizer.momentum.beta", "optimizer.weight_decay")
_HYPER = {"optimizer.lr": "lr", "optimizer.momentum.beta": "beta",
          "optimizer.weight_decay": "weight_decay"}


def hyper_of(point: Mapping[str, Any]) -> dict[str, float] | None:
    """The core hyperparameters a sweep point sets, or None if it varies anything else."""
    if not all(k in _HYPER for k in point):
        return None
    return {_HYPER[k]: float(v) for k, v in point.items()}


def _vmapped_programs(num: Numerics) -> dict[str, Any]:
    """The vmapped (over the sweep points' core states) jitted functions, compiled once per
    :class:`Numerics` rather than once per call."""
    cache = num.__dict__.get("_vmap_programs")
    if cache is None:
        cache = num.__dict__["_vmap_programs"] = {
            "f1": jax.jit(jax.vmap(num.fused1_fn,
                                   in_axes=(0, 0, None, None, None, None, None, None))),
            "grad": jax.jit(jax.vmap(num.programs.one, in_axes=(0, None, None, None, None))),
            # The last argument: the read versions under delay compensation (else ()).
            "apply": jax.jit(jax.vmap(num.apply_fn, in_axes=(0, 0, None, None, None, 0))),
            "eval": jax.jit(jax.vmap(num.programs.eval_batch_raw, in_axes=(0, None, None))),
        }
    return cache


def replay_vmapped(scn: Scenario, trace: Trace, hypers: Sequence[Mapping[str, float]], *,
                   numerics: Numerics | None = None, outs: Sequence[Path | None] | None = None,
                   max_memory: int = DEFAULT_MAX_MEMORY, path: str = "loop",
                   chunk: int = 512, store: str = "auto",
                   monitors: Sequence[Monitor | None] | None = None,
                   extra: Mapping[str, Any] | None = None) -> list[RunResult]:
    """Replay one trace under several (lr, beta, weight_decay) settings in one program.

    The core state carries its hyperparameters (``CoreState.hyper``), so the P settings are
    a leading axis of the state and each update is one vmapped call for all of them: on a
    small model this removes P−1 of every P dispatches. ``path="scan"`` (traces with the
    same number of gradients in every update) runs chunks of updates for all P points as
    one compiled loop (:mod:`asyncsim.drivers.scan`), which also removes the per-update
    dispatch. Each point has its own :class:`~asyncsim.drivers.driver.Driver`, fed a
    stretch of updates at a time: evaluations, divergence (a diverged point stops at its
    own update, rolled back exactly) and output files are those of a replay of that point
    alone (``monitors``: one per point, observing at the start and end only). Each point's
    numbers equal its own :func:`~asyncsim.drivers.replay.replay` up to floating-point
    reassociation under vmap (tested to 1e-5).
    """
    monitors = list(monitors) if monitors is not None else [None] * len(hypers)
    for mon in monitors:
        check_chunk_monitor(mon)
    if path not in ("loop", "scan"):
        raise ValueError(f"path must be loop or scan, got {path!r}")
    num = numerics or numerics_for(scn)
    P = len(hypers)
    check_learners(scn, trace)
    if path == "loop":  # the scan path's store is checked by scan_setup
        shapes = jax.eval_shape(num.model.init, jax.random.PRNGKey(0))
        need = replay_memory(trace, num_params(shapes) * P)
        check_memory(need["versions"], trace, need["bytes"], max_memory, points=P)
    elif trace.uniform_n_grads is None:
        raise ValueError("path='scan' needs the same number of gradients in every update")
    with contextlib.ExitStack() as held:
        t0 = time.perf_counter()
        drivers = []
        for k, h in enumerate(hypers):
            scn_k = _with_hyper(scn, h)
            out = outs[k] if outs is not None else None
            folder = held.enter_context(runs.opened(out, force=True))
            start_folder(folder, scn_k, replay_of=trace.meta.get("source"), vmapped_points=P)
            drivers.append(Driver(scn_k, num, folder=folder, hyper=dict(h), evaluate=False,
                                  checkpoints=False, monitor=monitors[k]))
        fields = _execute(num, trace, scn, drivers, path, chunk, store, max_memory)
        wall = time.perf_counter() - t0
        # vmap reassociates the arithmetic: each point agrees with its own replay to 1e-5.
        return [d.finish(trace, t0, kind="run", extra={
            "wall_time": wall / P, "vmapped_points": P, "replay_path": path, "exact": False,
            **fields, **(extra or {})}) for d in drivers]


def _execute(num, trace, scn, drivers, path, chunk, store, max_memory) -> dict[str, Any]:
    """Run the stacked points' updates, feeding each point's Driver; the scan store's
    summary fields."""
    P, m = len(drivers), trace.num_updates
    state = _stack([d.state for d in drivers])
    lanes = _Lanes(num, drivers, scn.run)
    lanes.evaluate(0, state)
    if path == "scan":
        c = trace.uniform_n_grads
        run_chunk, xs_all, init_buf, fields = scan_setup(num, trace, c, store, max_memory,
                                                          points=P, vmapped=True)
        times = trace.updates["time"]
        first = (state, jax.vmap(init_buf)(state.params))
        bounds = chunk_bounds(m, chunk, scn.run.eval_every or m)
        for carry, losses, _, e, redo in run_chunks(run_chunk, first, xs_all, bounds, chunk):
            if not lanes.feed(e, carry[0], losses, e * c, float(times[e - 1]),
                              lambda v, redo=redo: redo(v)[0]):
                break
        return fields
    _loop(num, trace, state, lanes)
    return {}


def _stack(trees):
    return jax.tree_util.tree_map(lambda *a: jax.numpy.stack(a), *trees)


def _lane(tree, k: int):
    return jax.tree_util.tree_map(lambda a: a[k], tree)


@jax.jit
def _unstack(tree):
    """Every point's slice of a stacked tree, in one dispatch (slicing leaf by leaf, point by
    point, cost ~80 us an op: more than the updates of a small model)."""
    n = jax.tree_util.tree_leaves(tree)[0].shape[0]
    return tuple(jax.tree_util.tree_map(lambda a, k=k: a[k], tree) for k in range(n))


class _Lanes:
    """The P points' Drivers, fed together: each stretch of updates once for all points,
    each point's slice of the losses and of the (lazily sliced) states."""

    def __init__(self, num: Numerics, drivers: list[Driver], run):
        self.num, self.drivers, self.run = num, drivers, run
        self.active = list(range(len(drivers)))
        self.eval_v = _vmapped_programs(num)["eval"]

    def evaluate(self, version: int, state) -> dict[int, tuple[float, float]]:
        """Every point's (test loss, test error) at ``version`` by the vmapped program; at
        version 0 recorded at once (the drivers were made without their first evaluation)."""
        loss, err = self.num.evaluate(state.params, samples=self.run.eval_samples,
                                      program=self.eval_v)
        results = {k: (loss[k], err[k]) for k in self.active}
        if version == 0:
            for k, res in results.items():
                self.drivers[k].evaluate(0, res)
        return results

    def feed(self, end: int, state, losses, grads: int, now: float, state_at) -> bool:
        """Hand the updates before ``end`` to every active point (losses [P, n, c],
        fetched); returns whether any point is still running."""
        evals = (self.evaluate(end, state) if self.run.eval_every
                 and end % self.run.eval_every == 0 else {})
        states = _unstack(state)
        for k in list(self.active):
            ok = self.drivers[k].chunk_applied(
                end, states[k], losses[k], grads, now=now,
                state_at=lambda v, k=k: _lane(state_at(v), k), evaluation=evals.get(k))
            if ok is False:
                self.active.remove(k)
        return bool(self.active)


def _loop(num: Numerics, trace: Trace, state, lanes: _Lanes) -> None:
    """The loop path: one vmapped call per update; the points' drivers are fed every
    ``check_every`` updates (16, fewer for big states) and at evaluation points (the
    rollback window is the stacked states of the updates in between)."""
    progs = _vmapped_programs(num)
    f1, grad_v, apply_v = progs["f1"], progs["grad"], progs["apply"]
    x, y = num.x_train, num.y_train
    every = lanes.run.eval_every
    # The drivers' rollback window: at most CHECK_EVERY updates, fewer for big states.
    window_len = min(d.check_every for d in lanes.drivers)
    versions = {0: state.params}
    alive = Alive(last_use(trace))
    window: list = []
    losses: list = []
    start, applied = 0, 0
    for v, rows, now in trace.iter_updates():
        alive.v = v
        if len(rows) == 1:
            (l, b, r, tau), = rows
            state, lo = f1(state, versions[r], x, y, np.int32(l), np.int32(b), np.int32(tau),
                           np.int32(v))
        else:
            outs = [grad_v(versions[r], x, y, np.int32(l), np.int32(b)) for l, b, r, _ in rows]
            state = apply_v(state, tuple(o[1] for o in outs),
                            np.asarray([row[3] for row in rows], np.int32),
                            np.asarray([row[0] for row in rows], np.int32), np.int32(v),
                            num.reads(versions, rows))
            lo = jax.numpy.stack([o[0] for o in outs], axis=1)
        applied += len(rows)
        versions[v + 1] = state.params
        for k in [k for k in versions if k != v + 1 and k not in alive]:
            del versions[k]
        window.append(state)
        losses.append(lo)
        done = v + 1
        if (len(window) >= window_len or (every and done % every == 0)
                or done == trace.num_updates):
            fetched = np.stack([np.asarray(a) for a in jax.device_get(losses)], axis=1)
            if not lanes.feed(done, state, fetched, applied, now,
                              lambda u, w=window, s=start: w[u - s]):
                return
            window, losses, start = [], [], done


def _with_hyper(scn: Scenario, hyper: Mapping[str, float]) -> Scenario:
    o = scn.optimizer
    o = dataclasses.replace(
        o, lr=hyper.get("lr", o.lr), weight_decay=hyper.get("weight_decay", o.weight_decay),
        momentum=dataclasses.replace(o.momentum, beta=hyper.get("beta", o.momentum.beta)))
    return dataclasses.replace(scn, optimizer=o)

