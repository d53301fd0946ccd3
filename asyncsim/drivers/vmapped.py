"""Vmapped sweeps: one trace replayed under P hyperparameter settings as one program.

The core state carries its hyperparameters (``CoreState.hyper``), so P settings of
``lr``, momentum ``beta`` and ``weight_decay`` are a leading axis of the state and each
update is one vmapped call for all of them (loop path), or chunks of updates for all of them
run as one compiled loop (the scan path of :mod:`asyncsim.drivers.scan`). Each point's
result equals its own replay up to floating-point reassociation under vmap (1e-5).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from asyncsim import runs
from asyncsim.config import Scenario
from asyncsim.drivers.driver import Driver, EvalRecord, Recorder, RunResult, first_bad, numerics_for
from asyncsim.drivers.replay import (
    DEFAULT_MAX_MEMORY,
    _Alive,
    check_learners,
    check_memory,
    last_use,
    replay_memory,
)
from asyncsim.drivers.scan import _chunks, _iter_chunks, _scan_setup
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
            "apply": jax.jit(jax.vmap(num.stack_apply_fn, in_axes=(0, 0, None, None, None))),
            "eval": jax.jit(jax.vmap(num.programs.eval_batch_raw, in_axes=(0, None, None))),
        }
    return cache


def replay_vmapped(scn: Scenario, trace: Trace, hypers: Sequence[Mapping[str, float]], *,
                   numerics: Numerics | None = None, outs: Sequence[Path | None] | None = None,
                   max_memory: int = DEFAULT_MAX_MEMORY, path: str = "loop",
                   chunk: int = 512, store: str = "auto") -> list[RunResult]:
    """Replay one trace under several (lr, beta, weight_decay) settings in one program.

    The core state carries its hyperparameters (``CoreState.hyper``), so the P settings are
    a leading axis of the state and each update is one vmapped call for all of them: on a
    small model this removes P−1 of every P dispatches. ``path="scan"`` (traces with the
    same number of gradients in every update) runs chunks of updates for all P points as
    one compiled ``lax.scan`` over a buffer of the live versions (as :func:`replay_scan`),
    which also removes the per-update dispatch. Each point's result equals its own
    :func:`replay` up to floating-point reassociation under vmap (tested to 1e-5).
    """
    if path not in ("loop", "scan"):
        raise ValueError(f"path must be loop or scan, got {path!r}")
    num = numerics or numerics_for(scn)
    P = len(hypers)
    check_learners(scn, trace)
    if path == "loop":  # the scan path's store is checked by _scan_setup
        shapes = jax.eval_shape(num.model.init, jax.random.PRNGKey(0))
        need = replay_memory(trace, num_params(shapes) * P)
        check_memory(need["versions"], trace, need["bytes"], max_memory, points=P)
    t0 = time.perf_counter()
    tm = jax.tree_util.tree_map
    p0 = num.init_params()
    states = [num.core.init(p0, **dict(h)) for h in hypers]
    state = tm(lambda *a: jax.numpy.stack(a), *states)
    progs = _vmapped_programs(num)
    f1, grad_v, apply_v, eval_v = progs["f1"], progs["grad"], progs["apply"], progs["eval"]
    x, y = num.x_train, num.y_train
    r = scn.run
    versions = {0: state.params}
    alive = _Alive(last_use(trace))
    g, u = trace.grads, trace.updates
    learner, batch = g["learner"].tolist(), g["batch"].tolist()
    read, stale = g["read_version"].tolist(), g["staleness"].tolist()
    starts, counts, times = u["start"].tolist(), u["n_grads"].tolist(), u["time"].tolist()
    pending: list[jax.Array] = []
    evals: list[list] = [[] for _ in range(P)]
    applied = 0

    def evaluate(version: int, now: float) -> None:
        n = num.x_test.shape[0] if r.eval_samples is None else min(r.eval_samples,
                                                                   num.x_test.shape[0])
        tot_l = np.zeros(P)
        tot_e = np.zeros(P)
        for s0 in range(0, n, 1000):
            e = min(s0 + 1000, n)
            loss, err = eval_v(state.params, num.x_test[s0:e], num.y_test[s0:e])
            tot_l += np.asarray(loss, np.float64) * (e - s0)
            tot_e += np.asarray(err, np.float64) * (e - s0)
        for k in range(P):
            evals[k].append((version, applied, now, tot_l[k] / max(n, 1), tot_e[k] / max(n, 1)))

    evaluate(0, 0.0)
    if path == "scan":
        m = trace.num_updates
        c = int(counts[0]) if m else 1
        if m == 0 or np.any(trace.updates["n_grads"] != c):
            raise ValueError("path='scan' needs the same number of gradients in every update")
        run_chunk, xs_all, init_buf, fields = _scan_setup(num, trace, c, store, max_memory,
                                                      points=P, vmapped=True)
        buf = jax.vmap(init_buf)(state.params)
        every = r.eval_every or m
        for carry, losses, e in _iter_chunks(run_chunk, (state, buf), xs_all,
                                             _chunks(m, chunk, every), chunk):
            pending.append(losses.reshape(P, -1))
            applied = e * c
            state = carry[0]
            if r.eval_every and e % every == 0:
                evaluate(e, times[e - 1])
    for v in range(trace.num_updates) if path == "loop" else ():
        s0, c = starts[v], counts[v]
        alive.v = v
        if c == 1:
            state, losses = f1(state, versions[read[s0]], x, y, np.int32(learner[s0]),
                               np.int32(batch[s0]), np.int32(stale[s0]), np.int32(v))
        else:
            outs_ = [grad_v(versions[read[i]], x, y, np.int32(learner[i]), np.int32(batch[i]))
                     for i in range(s0, s0 + c)]
            state = apply_v(state, tuple(o[1] for o in outs_),
                            np.asarray(stale[s0:s0 + c], np.int32),
                            np.asarray(learner[s0:s0 + c], np.int32), np.int32(v))
            losses = jax.numpy.stack([o[0] for o in outs_], axis=1)
        applied += c
        pending.append(losses)
        versions[v + 1] = state.params
        for k in [k for k in versions if k != v + 1 and k not in alive]:
            del versions[k]
        if r.eval_every and (v + 1) % r.eval_every == 0:
            evaluate(v + 1, times[v])
    losses_all = np.asarray(jax.device_get(jax.numpy.concatenate(
        [lo.reshape(P, -1) for lo in pending], axis=1))) if pending else np.zeros((P, 0))
    wall = time.perf_counter() - t0
    results = []
    for k in range(P):
        st_k = tm(lambda a, k=k: a[k], state)
        rec = _recorder_from(losses_all[k], counts, evals[k], num, r.eval_every)
        out = outs[k] if outs is not None else None
        folder = runs.prepare(out, force=True) if out is not None else None
        if folder is not None:
            scn_k = _with_hyper(scn, hypers[k])
            runs.write_scenario(folder, scn_k)
            runs.write_provenance(folder, scn_k, replay_of=trace.meta.get("source"),
                                  vmapped_points=P)
        else:
            scn_k = scn
        d = Driver(scn_k, num, folder=folder, start=(0, st_k, {}, rec, {"grads_applied":
                                                                          trace.num_gradients}))
        bad = rec.flush()
        d.diverged_at = bad if bad is not None else first_bad(rec.losses)
        res = d.finish(trace, t0, kind="run")
        res.summary["wall_time"] = wall / P
        res.summary["vmapped_points"] = P
        res.summary["replay_path"] = path
        if path == "scan":
            res.summary.update(fields)
        if folder is not None:
            runs.write_summary(folder, res.summary)
        results.append(res)
    return results


def _recorder_from(flat_losses: np.ndarray, counts: Sequence[int], evals, num: Numerics,
                   eval_every: int):
    rec = Recorder()
    pos = 0
    for c in counts:
        rec.losses.append(flat_losses[pos:pos + c])
        pos += c
    rec.pending_base = len(rec.losses)
    eval_every = max(eval_every, 1)
    for version, applied, now, loss, err in evals:
        recent = rec.losses[max(version - eval_every, 0):version]
        train = float(np.mean(np.concatenate(recent))) if recent else float("nan")
        rec.evals.append(EvalRecord(version, applied, now, num.epoch_of(applied), train,
                                    float(loss), float(err)))
    return rec


def _with_hyper(scn: Scenario, hyper: Mapping[str, float]) -> Scenario:
    o = scn.optimizer
    o = dataclasses.replace(
        o, lr=hyper.get("lr", o.lr), weight_decay=hyper.get("weight_decay", o.weight_decay),
        momentum=dataclasses.replace(o.momentum, beta=hyper.get("beta", o.momentum.beta)))
    return dataclasses.replace(scn, optimizer=o)

