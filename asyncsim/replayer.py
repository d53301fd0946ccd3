"""Exact replay: re-execute a recorded trace's numerics with no event loop.

A trace fixes everything about a run except the numbers (DESIGN.md). :func:`replay` walks its
updates in order and executes each with the same :class:`~asyncsim.engine.Numerics` and
:class:`~asyncsim.online.Driver` as the online driver, so replaying an online run's trace with
its scenario gives a bit-identical ``param_hash`` on the same machine.

Parameter versions are kept on the device only while a later gradient reads them: at most
S + 1 versions for a trace of maximum staleness S, usually far fewer (about one per learner
in an async trace, whatever a straggler does to S). :func:`replay_memory` reports that
(versions held × parameter bytes, and the (S + 1) × parameter bytes bound) and
:func:`replay` and :func:`replay_scan` refuse, before allocating anything, a trace that
would need more than ``max_memory`` bytes.

The scan path (:func:`replay_scan`) can keep *pending gradients* instead of versions
(``store="gradients"``, the default for models with a dense input layer such as the MLPs):
each gradient is computed when the version it reads is the current one and waits in a slot
until its update applies it (:func:`pending_plan`), its first kernel kept as the
[batch, out] cotangent (:class:`~asyncsim.models.DenseInput`). The same arithmetic, no
version copies: on 2 CPU cores this brought an MLP's stale replay from ~0.75 to ~0.9 of
plain SGD's throughput (README, Performance).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from asyncsim import runs
from asyncsim.config import Scenario, to_dict
from asyncsim.engine import Numerics
from asyncsim.errors import ScenarioError
from asyncsim.models import num_params
from asyncsim.online import Driver, RunResult
from asyncsim.scenario import load_scenario
from asyncsim.trace import Trace

DEFAULT_MAX_MEMORY = 8 << 30  # bytes of parameter versions replay may hold at once


class ReplayMemoryError(MemoryError):
    """The trace needs more parameter versions in memory than allowed."""


class _Alive:
    """The versions that gradients applied after update ``v`` still read."""

    __slots__ = ("last_use", "v")

    def __init__(self, last_use: np.ndarray):
        self.last_use = last_use
        self.v = -1

    def __contains__(self, r: int) -> bool:
        return r < self.last_use.size and self.last_use[r] > self.v


def last_use(trace: Trace) -> np.ndarray:
    """last_use[r]: the last update version that takes a gradient read at version r."""
    g = trace.grads
    out = np.full(trace.num_updates + 1, -1, np.int64)
    if trace.num_gradients:
        np.maximum.at(out, g["read_version"], g["apply_version"])
    return out


def live_versions(trace: Trace) -> int:
    """The most parameter versions held at once while replaying ``trace`` (≤ S + 1)."""
    lu = last_use(trace)
    m = trace.num_updates
    if m == 0:
        return 1
    # Version r is held from its creation (after update r-1) until update last_use[r].
    delta = np.zeros(m + 2, np.int64)
    r = np.arange(m + 1)
    end = np.maximum(lu, r)  # the newest version is held at least until it is created
    np.add.at(delta, r, 1)
    np.add.at(delta, end + 1, -1)
    return int(np.max(np.cumsum(delta))) + 1


def slot_plan(trace: Trace) -> tuple[np.ndarray, int]:
    """Where the scan path keeps each parameter version: ``(slot[m + 1], K)``.

    Version r occupies a slot from its creation (update r - 1) through update
    ``max(last_use[r], r)``; after that its slot is free for the next version. Slots are
    handed out greedily in update order (interval colouring), which uses the fewest slots
    possible: K equals the most versions alive at once. In an async trace a straggler
    can push the maximum staleness S far above the number of learners while only about
    one version per learner is ever alive, so K is usually much smaller than S + 1 (4 for
    4 async learners whose S is 23): a K-slot buffer instead of the S + 1 ring costs less
    memory and, on CPU, keeps the versions in cache (measured: the MLP scan step 13-25%
    faster).
    """
    m = trace.num_updates
    lu = np.maximum(last_use(trace), np.arange(m + 1))
    order = np.argsort(lu, kind="stable")
    ends = lu[order]
    slot = np.zeros(m + 1, np.int32)
    free: list[int] = []
    n_slots = 1
    k = 0
    for v in range(m):
        # Versions whose last reader is update v are read before v writes version v + 1.
        while k < order.size and ends[k] <= v:
            free.append(int(slot[order[k]]))
            k += 1
        if free:
            slot[v + 1] = free.pop()
        else:
            slot[v + 1] = n_slots
            n_slots += 1
    return slot, n_slots


def pending_plan(trace: Trace) -> tuple[np.ndarray, int]:
    """Where the scan path's gradient store keeps each pending gradient: ``(slot[n], Q)``.

    With ``store="gradients"`` gradient i is computed at the start of update r_i, its read
    version (then the current parameters), and held until update a_i (its apply version)
    takes it: it occupies a slot over [r_i, a_i]. Greedy colouring of these intervals by
    start uses the fewest slots, Q = the most gradients pending at once (about the number
    of learners in an async trace, whatever the maximum staleness).
    """
    g = trace.grads
    r, a = g["read_version"], g["apply_version"]
    slot = np.zeros(r.size, np.int32)
    busy: list[tuple[int, int]] = []  # (last update that needs it, slot)
    free: list[int] = []
    q = 0
    for i in np.lexsort((np.arange(r.size), r)):  # by read version, then trace order
        while busy and busy[0][0] < r[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            slot[i] = heapq.heappop(free)
        else:
            slot[i], q = q, q + 1
        heapq.heappush(busy, (int(a[i]), int(slot[i])))
    return slot, max(q, 1)


def replay_memory(trace: Trace, n_params: int, *, bytes_per_param: int = 4) -> dict[str, int]:
    """Bytes replay needs for parameter versions: live versions × parameter bytes."""
    live = live_versions(trace)
    return {"versions": live, "max_staleness": trace.max_staleness,
            "bytes": live * n_params * bytes_per_param,
            "bound_bytes": (trace.max_staleness + 1) * n_params * bytes_per_param}


def _check_learners(scn: Scenario, trace: Trace) -> None:
    """Refuse a trace with more learners than ``scn`` has: per-learner state (P2's shifted
    momentum keeps one buffer per learner) is indexed by learner id inside jit, where an
    out-of-range index is clamped, not an error, and would silently share a buffer."""
    ids = trace.grads["learner"]
    if ids.size and int(ids.max()) >= scn.cluster.learners:
        raise ScenarioError("cluster.learners", f"the trace has gradients of learner "
                            f"{int(ids.max())}, the scenario only {scn.cluster.learners} "
                            "learners: replay a trace with the scenario that recorded it",
                            file=scn.source)


def _check_memory(held: int, trace: Trace, need: int, max_memory: int, *,
                  points: int = 1, what: str = "parameter versions") -> None:
    """Refuse, before anything is allocated, a replay whose ``held`` versions (or pending
    gradients: ``what``) need more than ``max_memory`` bytes (``points``: a vmapped sweep
    holds them once per sweep point)."""
    if need > max_memory:
        each = f" for each of {points} sweep points" if points > 1 else ""
        raise ReplayMemoryError(
            f"replaying this trace holds {held} {what} at once{each} (max "
            f"staleness {trace.max_staleness}): {need / 2**20:.1f} MiB, more than the "
            f"{max_memory / 2**20:.1f} MiB allowed (max_memory)")


def replay(scn: Scenario, trace: Trace, *, out: str | Path | None = None, force: bool = False,
           numerics: Numerics | None = None, hyper: Mapping[str, float] | None = None,
           max_memory: int = DEFAULT_MAX_MEMORY, progress: bool = False,
           kind: str = "replay", observe=None, observe_every: int = 0) -> RunResult:
    """Execute ``trace``'s numerics under ``scn`` (its optimizer, model, data, seed).

    Args:
        hyper: overrides of the core's ``lr``, ``beta``, ``weight_decay`` for this replay.
        max_memory: bytes of parameter versions allowed; a larger need raises
            :class:`ReplayMemoryError` before anything is allocated.
        observe: ``observe(version, state)`` is called with the core state after every
            ``observe_every`` updates and after the last one (e.g. to log sharpness along
            the way); returning ``False`` stops the replay there.
    """
    num = numerics or Numerics(scn)
    shapes = jax.eval_shape(num.model.init, jax.random.PRNGKey(0))
    need = replay_memory(trace, num_params(shapes))
    _check_learners(scn, trace)
    _check_memory(need["versions"], trace, need["bytes"], max_memory)
    folder = runs.prepare(out, force=force) if out is not None else None
    if folder is not None:
        runs.write_scenario(folder, scn)
        runs.write_provenance(folder, scn, replay_of=trace.meta.get("source"))
    t0 = time.perf_counter()
    driver = Driver(scn, num, folder=folder, hyper=dict(hyper or {}))
    alive = _Alive(last_use(trace))
    g, u = trace.grads, trace.updates
    learner, batch = g["learner"].tolist(), g["batch"].tolist()
    read, stale = g["read_version"].tolist(), g["staleness"].tolist()
    starts, counts, times = u["start"].tolist(), u["n_grads"].tolist(), u["time"].tolist()
    stopped_at = trace.num_updates
    if progress:
        from tqdm.auto import tqdm

        driver.pbar = tqdm(total=trace.num_updates, unit="upd", mininterval=0.5, leave=False,
                           disable=None)
    try:
        for v in range(trace.num_updates):
            s = starts[v]
            rows = [(learner[i], batch[i], read[i], stale[i]) for i in range(s, s + counts[v])]
            alive.v = v
            if driver.on_update(v, rows, alive=alive, now=times[v]) is False:
                stopped_at = v + 1
                break
            if observe is not None and observe_every and (
                    (v + 1) % observe_every == 0 or v + 1 == trace.num_updates):
                if observe(v + 1, driver.state) is False:
                    stopped_at = v + 1
                    break
    finally:
        if driver.pbar is not None:
            driver.pbar.close()
    if stopped_at < trace.num_updates:
        trace = truncate(trace, stopped_at)
    result = driver.finish(trace, t0, kind=kind)
    result.summary["replay_path"] = "loop"
    result.summary["replay_versions_held"] = need["versions"]
    result.summary["replay_version_bytes"] = need["bytes"]
    if folder is not None:
        runs.write_summary(folder, result.summary)
    return result


def truncate(trace: Trace, updates: int) -> Trace:
    """The first ``updates`` updates of a trace (a diverged replay stops early)."""
    n = int(trace.updates["start"][updates]) if updates < trace.num_updates else trace.num_gradients
    return Trace({k: v[:n] for k, v in trace.grads.items()},
                 {k: v[:updates] for k, v in trace.updates.items()},
                 {**trace.meta, "stop_reason": "diverged"})


# What a recorded trace fixes, so a replay may not change it: the cluster, the protocol, the
# sweep grid and the run's length.
TRACE_FIXED = ("cluster", "protocol", "sweep")
TRACE_FIXED_RUN = ("updates", "gradients", "epochs", "sim_time", "trace_only")


def _dotted(d: Any, prefix: str) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"prefix.a.b": 1}`` (leaves keep their values)."""
    if not isinstance(d, Mapping) or not d:
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_dotted(v, f"{prefix}.{k}"))
    return out


def trace_fixed_changes(before: Scenario, after: Scenario) -> list[str]:
    """The dotted keys whose resolved values differ between two scenarios in what a trace
    fixes (:data:`TRACE_FIXED`, ``run.`` + :data:`TRACE_FIXED_RUN`), however they were set
    (``--set protocol.n=1`` or a whole table such as ``--set run={updates=5}``)."""
    b, a = to_dict(before), to_dict(after)
    flat_b, flat_a = {}, {}
    for section in TRACE_FIXED:
        flat_b.update(_dotted(b.get(section, {}), section))
        flat_a.update(_dotted(a.get(section, {}), section))
    for k in TRACE_FIXED_RUN:
        flat_b[f"run.{k}"], flat_a[f"run.{k}"] = b["run"].get(k), a["run"].get(k)
    return sorted(k for k in flat_b.keys() | flat_a.keys() if flat_b.get(k) != flat_a.get(k))


def replay_folder(run_dir: str | Path, *, out: str | Path | None = None,
                  overrides: Sequence[str] = (), force: bool = False,
                  progress: bool = False, path: str = "loop") -> RunResult:
    """``asyncsim replay RUN_DIR``: replay a run folder's trace with its resolved scenario.

    ``overrides`` may change numerics only (``optimizer.*``, ``model.*``, ``data.*``,
    ``seed``, ``run.eval_every``...); the timing is the recorded trace, so a timing key
    (``cluster.*``, ``protocol.*``, the run's length) raises :class:`ScenarioError` before
    anything is written. Without ``out`` the result is written to ``RUN_DIR/replay``.
    """
    run_dir = runs.require_run_folder(run_dir)
    scn = load_scenario(run_dir / "scenario.toml", overrides=overrides)
    changed = trace_fixed_changes(load_scenario(run_dir / "scenario.toml"), scn)
    if changed and changed[0].split(".")[0] == "sweep":
        raise ScenarioError("sweep", "a replay re-executes one run's trace; a sweep grid "
                            "belongs in a scenario for asyncsim run (whose points replay "
                            "a shared trace where only numerics vary)", file="asyncsim replay")
    if changed:
        # Accepting these would write a replay folder whose scenario.toml disagrees with the
        # trace it actually executed.
        sets = " ".join(f"--set {o if isinstance(o, str) else '='.join(map(str, o))}"
                        for o in overrides)
        raise ScenarioError(changed[0], "is timing, which the recorded trace fixes; a replay "
                            "changes numerics only (optimizer.*, model.*, data.*, seed, "
                            "run.eval_every, run.eval_samples); to change timing, rerun: "
                            f"asyncsim run {run_dir / 'scenario.toml'} {sets}",
                            file="asyncsim replay")
    trace = Trace.load(run_dir)
    trace = Trace(trace.grads, trace.updates, {**trace.meta, "source": str(run_dir)})
    out = out or run_dir / "replay"
    if path == "auto":
        path = choose_path(scn, trace)
    counts = trace.updates["n_grads"]
    if path == "scan" and trace.num_updates == 0:
        path = "loop"  # nothing to execute: the loop path writes the same (empty) replay
    elif path == "scan" and np.any(counts != counts[0]):
        raise ScenarioError("--path", "scan needs the same number of gradients in every "
                            f"update; this trace's updates take {counts.min()} to "
                            f"{counts.max()}: use --path loop (or auto)", file="asyncsim replay")
    if path == "scan":
        result = replay_scan(scn, trace, out=out, force=force)
    elif path == "loop":
        result = replay(scn, trace, out=out, force=force, progress=progress)
    else:
        raise ValueError(f"path must be loop, scan or auto, got {path!r}")
    result.summary.update(compare_with_source(run_dir, result))
    runs.write_summary(Path(out), result.summary)
    return result


def compare_with_source(run_dir: str | Path, result: RunResult) -> dict[str, Any]:
    """How a replay's final parameters compare with those of the run it replayed.

    Returns the ``summary.json`` fields ``source_param_hash`` (None when the source folder
    has no ``summary.json``, i.e. the run did not finish, or is a timing-only trace from
    ``asyncsim trace``, which has no parameters), ``matches_source`` (the two
    ``param_hash`` values are equal: bit-identical parameters) and ``max_abs_diff_to_source``
    (the largest absolute difference over all parameters; None when the source has no
    ``params.npz`` of the same structure, e.g. after ``--set model.*``, or when either
    side's parameters are not finite, i.e. a diverged run).
    """
    from asyncsim.online import load_params

    run_dir = Path(run_dir)
    src_hash = runs.read_summary(run_dir).get("param_hash") if runs.is_complete(run_dir) else None
    if src_hash is None:
        return {"source_param_hash": None, "matches_source": None,
                "max_abs_diff_to_source": None}
    try:
        src = load_params(run_dir, result.params)
        diffs = jax.tree_util.tree_map(
            lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64)
                                             - np.asarray(b, np.float64)), initial=0.0)),
            result.params, src)
        diff = max(jax.tree_util.tree_leaves(diffs), default=0.0)
        if not np.isfinite(diff):  # a diverged source (or replay): no meaningful distance
            diff = None
    except (OSError, KeyError, ValueError, TypeError):
        diff = None
    return {"source_param_hash": src_hash,
            "matches_source": src_hash == result.summary.get("param_hash"),
            "max_abs_diff_to_source": diff}


def choose_path(scn: Scenario, trace: Trace, *, numerics: Numerics | None = None,
                probe_updates: int = 12) -> str:
    """"loop" or "scan", whichever :func:`predict_times` expects to replay the whole trace
    faster here (both compiled first). Traces with a varying number of gradients per
    update, or too short to probe: "loop"."""
    counts = trace.updates["n_grads"]
    if trace.num_updates < 8 * probe_updates or np.any(counts != counts[0]):
        return "loop"
    import dataclasses

    quiet = dataclasses.replace(scn, run=dataclasses.replace(scn.run, eval_every=0,
                                                             eval_samples=1))
    num = numerics or Numerics(quiet)
    fns = {"loop": replay, "scan": replay_scan}
    predicted = predict_times(
        trace, {p: (lambda probe, fn=fn: fn(quiet, probe, numerics=num)) for p, fn in fns.items()},
        probe_updates=probe_updates)
    return min(predicted, key=predicted.get)


def predict_times(trace: Trace, candidates: Mapping[Any, Any], *, probe_updates: int = 12,
                  rounds: int = 3) -> dict[Any, float]:
    """Predicted wall time of each candidate ``fn(probe_trace)`` on the whole ``trace``.

    Each candidate is compiled and warmed up, then timed on the first ``probe_updates`` and
    ``4 * probe_updates`` updates, in ``rounds`` round-robin rounds (best time of each: a
    slow spell of the machine hits every candidate, not only the one it happened to run).
    The two timings give a fixed cost per call and a cost per update, extrapolated to the
    trace's length: a single short probe would favour whichever candidate has the lower
    per-call cost, however much slower its updates are.
    """
    m = trace.num_updates
    short, long = probe_updates, 4 * probe_updates
    probes = {n: truncate(trace, n) for n in (short, long)}
    best = {(key, n): float("inf") for key in candidates for n in probes}
    for fn in candidates.values():
        for probe in probes.values():
            fn(probe)  # compile (once per program) and warm up
    for _ in range(rounds):
        for key, fn in candidates.items():
            for n, probe in probes.items():
                t0 = time.perf_counter()
                fn(probe)
                best[key, n] = min(best[key, n], time.perf_counter() - t0)
    predicted = {}
    for key in candidates:
        per_update = max(best[key, long] - best[key, short], 0.0) / (long - short)
        fixed = max(best[key, short] - per_update * short, 0.0)
        predicted[key] = fixed + per_update * m
    return predicted


def replay_many(scn: Scenario, trace: Trace, points: Sequence[Mapping[str, Any]],
                **kw: Any) -> list[RunResult]:
    """Replay one trace under several numeric settings, sharing model, data and jit cache."""
    num = Numerics(scn)
    return [replay(scn, trace, numerics=num, hyper=p, **kw) for p in points]


# ----------------------------------------------------------------------------- vmapped sweeps
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
            "f1": jax.jit(jax.vmap(num._fused1_raw,
                                   in_axes=(0, 0, None, None, None, None, None, None))),
            "grad": jax.jit(jax.vmap(num._shared.one, in_axes=(0, None, None, None, None))),
            "apply": jax.jit(jax.vmap(num._stack_apply_raw, in_axes=(0, 0, None, None, None))),
            "eval": jax.jit(jax.vmap(num._shared.eval_batch_raw, in_axes=(0, None, None))),
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
    num = numerics or Numerics(scn)
    P = len(hypers)
    _check_learners(scn, trace)
    if path == "loop":  # the scan path's store is checked by _scan_setup
        shapes = jax.eval_shape(num.model.init, jax.random.PRNGKey(0))
        need = replay_memory(trace, num_params(shapes) * P)
        _check_memory(need["versions"], trace, need["bytes"], max_memory, points=P)
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
        d.diverged_at = bad if bad is not None else _first_bad(rec.losses)
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


def _first_bad(losses: list[np.ndarray]) -> int | None:
    from asyncsim.online import first_diverged

    if not losses:
        return None
    return first_diverged(losses, 0, float(np.mean(np.abs(losses[0]))))


def _recorder_from(flat_losses: np.ndarray, counts: Sequence[int], evals, num: Numerics,
                   eval_every: int):
    from asyncsim.engine import EvalRecord
    from asyncsim.online import _Recorder

    rec = _Recorder()
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
    import dataclasses

    o = scn.optimizer
    o = dataclasses.replace(
        o, lr=hyper.get("lr", o.lr), weight_decay=hyper.get("weight_decay", o.weight_decay),
        momentum=dataclasses.replace(o.momentum, beta=hyper.get("beta", o.momentum.beta)))
    return dataclasses.replace(scn, optimizer=o)


def sweep_path(scn: Scenario, trace: Trace, hypers: Sequence[Mapping[str, float]], *,
               numerics: Numerics | None = None,
               probe_updates: int = 12) -> tuple[str, str]:
    """How to replay P hyperparameter points over one trace fastest on this machine:
    ``("vmapped" | "single", "loop" | "scan")``.

    Each candidate (the P points one by one with the loop, :func:`replay`, or the scan,
    :func:`replay_scan`; all P at once with :func:`replay_vmapped` on either path) gets a
    predicted time for the whole trace from :func:`predict_times` (one by one: P times one
    point's), and the least wins (a single short probe would charge the one-by-one
    candidates P times for per-call costs that a long trace amortises). The scan
    is a candidate only when every update takes the same number of gradients. So the choice
    is made for this model, batch and backend, as DESIGN.md asks (vmapping saves
    dispatches, not FLOPs: it wins clearly on small models and is about even when the FLOPs
    dominate).
    """
    import dataclasses

    if len(hypers) < 2 or trace.num_updates < 8 * probe_updates:
        return ("single", "loop")
    num = numerics or Numerics(scn)
    quiet = dataclasses.replace(scn, run=dataclasses.replace(scn.run, eval_every=0,
                                                             eval_samples=1))
    counts = trace.updates["n_grads"]
    paths = ["loop", "scan"] if np.all(counts == counts[0]) else ["loop"]
    P = len(hypers)

    def call(mode: str, path: str, probe: Trace):
        if mode == "vmapped":
            return replay_vmapped(quiet, probe, hypers, numerics=num, path=path)
        fn = replay if path == "loop" else replay_scan
        return fn(quiet, probe, numerics=num, hyper=hypers[0])

    fns = {(mode, path): (lambda probe, mode=mode, path=path: call(mode, path, probe))
           for path in paths for mode in ("single", "vmapped")}
    predicted = predict_times(trace, fns, probe_updates=probe_updates)
    # One by one runs the P points in turn: P times the single-point prediction.
    predicted = {k: t * (P if k[0] == "single" else 1) for k, t in predicted.items()}
    return min(predicted, key=predicted.get)


# ----------------------------------------------------------------------------- scan path
def replay_scan(scn: Scenario, trace: Trace, *, numerics: Numerics | None = None,
                hyper: Mapping[str, float] | None = None, out: str | Path | None = None,
                force: bool = False, chunk: int = 512, store: str = "auto",
                max_memory: int = DEFAULT_MAX_MEMORY, kind: str = "replay") -> RunResult:
    """Replay as compiled chunks: a compiled loop over updates with a device store.

    ``store="versions"``: the parameter versions later gradients still read live in one
    stacked device array of K slots (:func:`slot_plan`: K = the most versions alive at
    once, at most S + 1 for a trace of maximum staleness S); update v reads
    ``buf[slot[read]]`` and writes version v + 1 to ``buf[slot[v + 1]]``.
    ``store="gradients"``: each gradient is computed when its read version is current and
    kept pending until its update (:func:`pending_plan`; models with a dense input layer).
    ``"auto"`` chooses (see :func:`_scan_setup`). Chunks end at evaluation points, so the
    program leaves jit only to evaluate. Needs the same number of gradients c in every
    update (every built-in protocol's trace has it). It computes the same arithmetic as
    :func:`replay` but XLA compiles it as one program, so results agree to floating-point
    tolerance rather than bit for bit; :func:`replay` stays the exact reference. Which is
    faster depends on the model and backend (DESIGN.md): on 2 CPU cores a scan over
    convolutions runs slower than a loop of jitted steps, while small dense models gain
    from losing the per-step dispatch.
    """
    import dataclasses

    from asyncsim.online import Driver

    num = numerics or Numerics(scn)
    counts = trace.updates["n_grads"]
    m = trace.num_updates
    if m == 0 or np.any(counts != counts[0]):
        raise ValueError("replay_scan needs the same number of gradients in every update")
    c = int(counts[0])
    _check_learners(scn, trace)
    run_chunk, xs_all, init_buf, fields = _scan_setup(num, trace, c, store, max_memory)
    folder = runs.prepare(out, force=force) if out is not None else None
    if folder is not None:
        runs.write_scenario(folder, scn)
        runs.write_provenance(folder, scn, replay_of=trace.meta.get("source"), path="scan")
    t0 = time.perf_counter()
    driver = Driver(dataclasses.replace(scn, run=dataclasses.replace(
        scn.run, checkpoint_every=0)), num, folder=None, hyper=dict(hyper or {}))
    driver.folder = folder
    state = driver.state
    buf = init_buf(state.params)
    every = scn.run.eval_every or m
    times = trace.updates["time"]
    losses_all = []
    for carry, losses, e in _iter_chunks(run_chunk, (state, buf), xs_all,
                                         _chunks(m, chunk, every), chunk):
        losses_all.append(losses)
        driver.grads_applied = e * c
        if scn.run.eval_every and e % every == 0:
            driver.state = carry[0]
            driver.rec.losses.extend(np.asarray(x) for x in np.concatenate(
                [np.asarray(x) for x in losses_all]))
            losses_all = []
            driver.now = float(times[e - 1])
            driver.evaluate(e)
    driver.state = carry[0]
    if losses_all:
        driver.rec.losses.extend(np.asarray(x) for x in np.concatenate(
            [np.asarray(x) for x in losses_all]))
    driver.rec.pending_base = len(driver.rec.losses)
    driver.diverged_at = _first_bad(driver.rec.losses)
    driver.now = float(times[-1])
    result = driver.finish(trace, t0, kind=kind)
    result.summary["replay_path"] = "scan"
    result.summary.update(fields)
    if folder is not None:
        runs.write_summary(folder, result.summary)
    return result


def _scan_inputs(trace: Trace, c: int, slot: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-update scan inputs: learner, batch, slot read, staleness [m, c]; v and the slot
    version v + 1 is written to [m] (``slot`` from :func:`slot_plan`)."""
    m, g = trace.num_updates, trace.grads
    return (g["learner"].reshape(m, c).astype(np.int32),
            g["batch"].reshape(m, c).astype(np.int32),
            slot[g["read_version"]].reshape(m, c).astype(np.int32),
            g["staleness"].reshape(m, c).astype(np.int32),
            np.arange(m, dtype=np.int32),
            slot[1:].astype(np.int32))


def _pending_inputs(trace: Trace, c: int, slot: np.ndarray,
                    scratch: int) -> tuple[tuple[np.ndarray, ...], int]:
    """Per-update inputs of the gradient store (``store="gradients"``) and R, the most
    gradients that read one version: the number of gradients that read version v, their
    learners, batches and pending slots [m, R] (an update without reads computes into slot
    ``scratch``); learner, pending slot and staleness of the c gradients update v takes
    [m, c] (its batch travels in the slot); v [m]."""
    m, g = trace.num_updates, trace.grads
    r = g["read_version"]
    reads = np.bincount(r, minlength=m)[:m].astype(np.int32)  # every read is < m
    R = max(int(reads.max(initial=0)), 1)
    order = np.lexsort((np.arange(r.size), r))
    first = np.concatenate([[0], np.cumsum(reads)[:-1]])
    rank = np.arange(r.size) - first[r[order]]
    cl, cb = np.zeros((m, R), np.int32), np.zeros((m, R), np.int32)
    cs = np.full((m, R), scratch, np.int32)
    cl[r[order], rank] = g["learner"][order]
    cb[r[order], rank] = g["batch"][order]
    cs[r[order], rank] = slot[order]
    return (reads, cl, cb, cs,
            g["learner"].reshape(m, c).astype(np.int32),
            slot.reshape(m, c).astype(np.int32),
            g["staleness"].reshape(m, c).astype(np.int32),
            np.arange(m, dtype=np.int32)), R


def _scan_setup(num: Numerics, trace: Trace, c: int, store: str, max_memory: int, *,
                points: int = 1,
                vmapped: bool = False) -> tuple[Any, tuple[np.ndarray, ...], Any, dict[str, Any]]:
    """What :func:`replay_scan` and :func:`replay_vmapped` (``path="scan"``) run: the chunk
    program, its per-update inputs, ``init(params) -> carry buffer`` and the summary's
    memory fields, after the memory check. ``store``: "auto" keeps pending gradients when
    something is stale and the model has a dense input layer
    (:class:`~asyncsim.models.DenseInput`) whose kernel is at least 4x the bytes a pending
    gradient keeps (else copying versions costs less), else parameter versions;
    "versions" | "gradients" force one."""
    import jax.numpy as jnp

    if store not in ("auto", "versions", "gradients"):
        raise ValueError(f"store must be auto, versions or gradients, got {store!r}")
    has_parts = hasattr(num._shared, "parts_one")
    if store == "gradients" and not has_parts:
        raise ValueError(f"store='gradients' needs a model with a dense input layer; "
                         f"{num.model.name!r} has none")
    vslot, K = slot_plan(trace)
    tm = jax.tree_util.tree_map
    shapes = jax.eval_shape(num.model.init, jax.random.PRNGKey(0))
    if has_parts:
        x0 = jax.ShapeDtypeStruct((), jnp.int32)
        out = jax.eval_shape(num._shared.parts_one, shapes, num.x_train, num.y_train, x0, x0)
        slot_bytes = sum(int(np.prod(o.shape)) * o.dtype.itemsize
                         for o in jax.tree_util.tree_leaves(out))
    if store == "auto":
        # A pending gradient saves copying a version in and out per update (~2 x the first
        # kernel's bytes) for writing and reading its slot, plus a few fixed operations.
        # Measured on 2 CPU cores: MLP [128] at mu = 32 (kernel 74x a slot) 0.91 of plain SGD
        # (median of 8 runs) vs 0.74-0.82 with versions; MLP [32] on full images (115x)
        # 1.6 s vs 2.5 s for a vmapped 16-point sweep; the 4x4-pooled MLP [32] (kernel 1.5x a
        # slot) 0.48 s vs 0.43 s.
        kernel = shapes[num.model.dense_input.name]["w"] if has_parts else None
        big = has_parts and int(np.prod(kernel.shape)) * 4 >= 4 * slot_bytes
        store = "gradients" if big and K > 1 else "versions"
    if store == "versions":
        need = K * num_params(shapes) * 4
        _check_memory(K, trace, need * points, max_memory, points=points)
        xs_all, reads = _scan_inputs(trace, c, vslot), 1

        def init(params):
            return tm(lambda p: jnp.broadcast_to(p, (K, *p.shape)), params)

        fields = {"replay_store": "versions", "replay_versions_held": K,
                  "replay_version_bytes": need}
    else:
        gslot, Q = pending_plan(trace)
        need = (Q + 1) * slot_bytes
        _check_memory(Q + 1, trace, need * points, max_memory, points=points,
                      what="pending gradients")
        xs_all, reads = _pending_inputs(trace, c, gslot, Q)
        K = Q + 1

        def init(params):
            del params
            return tm(lambda o: jnp.zeros((Q + 1, *o.shape), o.dtype), out)

        fields = {"replay_store": "gradients", "replay_versions_held": 1,
                  "replay_pending_gradients": Q + 1, "replay_version_bytes": need}
    program = _scan_program(num, c, K, vmapped=vmapped, store=store, reads=reads)
    return program, xs_all, init, fields


def _chunks(m: int, chunk: int, every: int) -> list[tuple[int, int]]:
    """[start, end) update ranges of at most ``chunk`` updates that end at every multiple
    of ``every`` (the evaluation points), so the program leaves jit only to evaluate."""
    bounds = sorted({*range(0, m, min(chunk, every)), *range(0, m, every), m})
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _scan_program(num: Numerics, c: int, K: int, *, vmapped: bool, store: str = "versions",
                  reads: int = 1):
    """The jitted chunk program ``(state, buf), xs, n -> (state, buf), losses[L, c]``: runs
    the first ``n`` of the L updates in ``xs`` (inputs padded to L; see :func:`_iter_chunks`).

    ``store="versions"``: update v reads its gradients' versions from ``buf[read slot]`` and
    writes version v + 1 to ``buf[write slot]`` (:func:`slot_plan`, K slots); ``K = 1``:
    nothing stale, no buffer. ``store="gradients"`` (models with a dense input layer): update
    v first computes the gradients that read version v, at the current parameters, into
    ``buf``'s pending slots (:func:`pending_plan`, K slots and a scratch one; up to
    ``reads`` per update), then applies the c pending gradients it takes; no version is
    ever copied (README, Performance).
    ``vmapped``: state and buffer carry a leading axis of sweep points (losses [P, L, c]).
    Compiled once per (Numerics, c, K, vmapped, store, reads) and chunk size L."""
    import jax.numpy as jnp
    from jax import lax

    cache = num.__dict__.setdefault("_scan_cache", {})
    key = (c, K, vmapped, store, reads)
    if key in cache:
        return cache[key]
    tm = jax.tree_util.tree_map
    one = num._shared.one
    core_apply = num.core.apply
    x_all, y_all = num.x_train, num.y_train

    def read(buf, i):
        return tm(lambda a: lax.dynamic_index_in_dim(a, i, keepdims=False), buf)

    def pending_body(carry, xs):
        st, buf = carry
        n, cl, cb, cs, l, a, t, v = xs
        parts_one, expand_one = num._shared.parts_one, num._shared.expand_one

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
                expand_one(read(buf[1], a[i]), x_all) for i in range(c)])
        else:
            grads = jax.vmap(expand_one, in_axes=(0, None))(tm(lambda p: p[a], buf[1]), x_all)
        st = core_apply(st, grads, staleness=t, learner_ids=l, step=v)
        return (st, buf), losses

    def body(carry, xs):
        st, buf = carry
        l, b, r, t, v, w = xs
        if c <= 4:
            # K == 1 (no staleness): every gradient reads the current parameters, no copy.
            outs = [one(st.params if K == 1 else read(buf, r[i]), x_all, y_all, l[i], b[i])
                    for i in range(c)]
            losses = jnp.stack([o[0] for o in outs])
            grads = tm(lambda *a: jnp.stack(a), *[o[1] for o in outs])
        elif K == 1:
            losses, grads = jax.vmap(one, in_axes=(None, None, None, 0, 0))(
                st.params, x_all, y_all, l, b)
        else:
            params_c = tm(lambda a: a[r], buf)
            losses, grads = jax.vmap(one, in_axes=(0, None, None, 0, 0))(
                params_c, x_all, y_all, l, b)
        st = core_apply(st, grads, staleness=t, learner_ids=l, step=v)
        if K > 1:
            # The reads cost a copy of a version each, the write one more. Measured on 2 CPU
            # cores for a 1.6 MB weight: the dynamic write costs ~0.12 ms per update, the read
            # ~0.03 ms; an extra fused elementwise output (a static destination) would cost
            # ~0.05 ms, but static destinations need the body unrolled over a ring of S + 1.
            buf = tm(lambda a, p: lax.dynamic_update_index_in_dim(a, p, w, 0), buf, st.params)
        return (st, buf), losses

    def chunk_fn(carry, xs, n):
        # A loop with a traced trip count over inputs padded to a fixed length: one compiled
        # program serves every chunk length (probes, the trace's tail, evaluation spacing),
        # where a scan over each length's inputs compiled anew (~1.7 s each for a small MLP).
        L = xs[0].shape[0]
        losses = jnp.zeros((L, c), jnp.float32)
        fn = pending_body if store == "gradients" else body

        def step(i, val):
            carry, losses = val
            carry, lo = fn(carry, tuple(lax.dynamic_index_in_dim(a, i, keepdims=False)
                                        for a in xs))
            return carry, lax.dynamic_update_index_in_dim(losses, lo.astype(jnp.float32), i, 0)

        return lax.fori_loop(0, n, step, (carry, losses))

    # The carry is donated: XLA then updates and reads the buffer in place. Without it, reads
    # from the (non-aliased) buffer cost ~40% of an MLP step on CPU (measured, 24 versions).
    cache[key] = jax.jit(jax.vmap(chunk_fn, in_axes=(0, None, None)) if vmapped else chunk_fn,
                         donate_argnums=(0,))
    return cache[key]


def _iter_chunks(run_chunk, carry, xs_all: tuple[np.ndarray, ...],
                 bounds: Sequence[tuple[int, int]], length: int):
    """Run ``run_chunk`` (:func:`_scan_program`) over the update ranges ``bounds`` (each at
    most ``length`` long), yielding ``(carry, losses, end)`` after each; losses are [n, c]
    ([P, n, c] for the vmapped program). Each range's inputs are padded to ``length``, so
    every call has the same shapes and one compiled program serves them all."""
    for s, e in bounds:
        n = e - s
        xs = tuple(np.concatenate([a[s:e], np.zeros((length - n, *a.shape[1:]), a.dtype)])
                   for a in xs_all)
        carry, losses = run_chunk(carry, xs, np.int32(n))
        yield carry, losses[..., :n, :], e
