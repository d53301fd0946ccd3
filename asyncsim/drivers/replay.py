"""Exact replay: re-execute a recorded trace's numerics with no event loop (the loop path).

A trace fixes everything about a run except the numbers (docs/design.md). :func:`replay`
walks its updates in order (:meth:`~asyncsim.trace.Trace.iter_updates`) and hands each to the
same :class:`~asyncsim.drivers.driver.Driver` as the online driver, so replaying an online
run's trace with its scenario gives a bit-identical ``param_hash`` on the same machine. The
compiled-chunk path is :mod:`asyncsim.drivers.scan`.

Parameter versions are kept on the device only while a later gradient reads them: at most
S + 1 versions for a trace of maximum staleness S, usually far fewer (about one per learner
in an async trace, whatever a straggler does to S). :func:`replay_memory` reports that
(versions held × parameter bytes, and the (S + 1) × parameter bytes bound) and the replays
refuse, before allocating anything, a trace that would need more than ``max_memory`` bytes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from asyncsim import _checks, runs
from asyncsim.config import Scenario
from asyncsim.drivers.batched import Batched
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.driver import Driver, Monitor, RunResult
from asyncsim.drivers.folder_scenario import start_folder
from asyncsim.errors import ScenarioError
from asyncsim.numerics.models import num_params
from asyncsim.numerics.numerics import Numerics
from asyncsim.trace import Trace

DEFAULT_MAX_MEMORY = 8 << 30  # bytes of parameter versions replay may hold at once


class ReplayMemoryError(MemoryError):
    """The trace needs more parameter versions in memory than allowed."""


class Alive:
    """The versions that gradients applied after update ``v`` still read."""

    __slots__ = ("last_use", "v")

    def __init__(self, last_use: np.ndarray):
        # Python ints: the driver asks about every held version after every update, and a
        # list answers in less than half the time of numpy's scalar indexing (82 vs 196 ns).
        self.last_use = last_use.tolist()
        self.v = -1

    def __contains__(self, r: int) -> bool:
        return r < len(self.last_use) and self.last_use[r] > self.v


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


def replay_memory(trace: Trace, n_params: int, *, bytes_per_param: int = 4) -> dict[str, int]:
    """Bytes replay needs for parameter versions: live versions × parameter bytes."""
    live = live_versions(trace)
    return {"versions": live, "max_staleness": trace.max_staleness,
            "bytes": live * n_params * bytes_per_param,
            "bound_bytes": (trace.max_staleness + 1) * n_params * bytes_per_param}


def source_of(trace: Trace) -> str | os.PathLike | None:
    """The run folder ``trace`` is replayed from (``meta["source"]``, which
    :func:`asyncsim.api.replay_folder` sets, else where :meth:`Trace.load` read it): the
    replay may write inside it, never at or around it (:func:`asyncsim.runs.prepare`)."""
    return trace.meta.get("source") or trace.folder


def check_learners(scn: Scenario, trace: Trace) -> None:
    """Refuse a trace with more learners than ``scn`` has: per-learner state (P2's shifted
    momentum keeps one buffer per learner) is indexed by learner id inside jit, where an
    out-of-range index is clamped, not an error, and would silently share a buffer."""
    ids = trace.grads["learner"]
    if ids.size and int(ids.max()) >= scn.cluster.learners:
        raise ScenarioError("cluster.learners", f"the trace has gradients of learner "
                            f"{int(ids.max())}, the scenario only {scn.cluster.learners} "
                            "learners: replay a trace with the scenario that recorded it",
                            file=scn.source)


def check_memory(held: int, trace: Trace, need: int, max_memory: int, *,
                  points: int = 1, what: str = "parameter versions") -> None:
    """Refuse, before anything is allocated, a replay whose ``held`` versions (or pending
    gradients: ``what``) need more than ``max_memory`` bytes (``points``: a vmapped sweep
    holds them once per sweep point)."""
    each = f" for each of {points} sweep points" if points > 1 else ""
    try:
        _checks.memory("max_memory", need, f"replaying this trace holds {held} {what} at "
                       f"once{each} (max staleness {trace.max_staleness}):",
                       allowed=max_memory)
    except ScenarioError as e:  # the caller's limit, not a scenario key
        raise ReplayMemoryError(e.message) from None


def replay(scn: Scenario, trace: Trace, *, out: str | Path | None = None, force: bool = False,
           numerics: Numerics | None = None, hyper: Mapping[str, float] | None = None,
           max_memory: int = DEFAULT_MAX_MEMORY, progress: bool = False,
           kind: str = "replay", monitor: Monitor | None = None,
           extra: Mapping[str, Any] | None = None,
           compare: Callable[[dict[str, Any], Any], Mapping[str, Any]] | None = None,
           batch: int | None = None) -> RunResult:
    """Execute ``trace``'s numerics under ``scn`` (its optimizer, model, data, seed).

    Args:
        hyper: overrides of the core's ``lr``, ``beta``, ``weight_decay`` for this replay.
        max_memory: bytes of parameter versions allowed (and of the batched path's gradient
            pool); a larger need raises :class:`ReplayMemoryError` before anything is
            allocated.
        batch: None (the exact loop path), or the batched path's gradients per call
            (:mod:`asyncsim.drivers.batched`: many updates' gradients in one call, equal to
            the loop's to rounding, not bit for bit).
        monitor: what the replay measures along the way (a
            :class:`~asyncsim.drivers.driver.Monitor`; e.g. sharpness).
        extra: more ``summary.json`` fields, written with the summary (which comes last);
            ``compare(summary, final params)`` returns more (a comparison with a source).
    """
    num = numerics or numerics_for(scn)
    shapes = jax.eval_shape(num.model.init, jax.random.PRNGKey(0))
    need = replay_memory(trace, num_params(shapes))
    batched = None if batch is None else Batched(num, trace, batch)
    check_learners(scn, trace)
    check_memory(need["versions"], trace, need["bytes"] + (batched.bytes if batched else 0),
                 max_memory)
    with runs.opened(out, force=force, source=source_of(trace)) as folder:
        start_folder(folder, scn, replay_of=trace.meta.get("source"))
        t0 = time.perf_counter()
        driver = Driver(scn, num, folder=folder, hyper=dict(hyper or {}), monitor=monitor,
                        checkpoints=False)
        alive = Alive(last_use(trace))
        if progress:
            driver.show_progress(trace.num_updates)
        try:
            for v, rows, now in trace.iter_updates():
                alive.v = v
                if batched is None:
                    if driver.on_update(v, rows, alive=alive, now=now) is False:
                        break
                    continue
                state, losses = batched.update(driver, v, rows)
                if driver.applied(v, len(rows), state, losses, alive=alive,
                                  now=now) is False:
                    break
        finally:
            driver.close_progress()
        return driver.finish(trace, t0, kind=kind, extra={
            **({"replay_path": "loop"} if batched is None else batched.fields()),
            "replay_versions_held": need["versions"], "replay_version_bytes": need["bytes"],
            **(extra or {})}, compare=compare)
