"""Exact replay: re-execute a recorded trace's numerics with no event loop.

A trace fixes everything about a run except the numbers (DESIGN.md). :func:`replay` walks its
updates in order and executes each with the same :class:`~asyncsim.engine.Numerics` and
:class:`~asyncsim.online.Driver` as the online driver, so replaying an online run's trace with
its scenario gives a bit-identical ``param_hash`` on the same machine.

Parameter versions are kept on the device only while a later gradient reads them: at most
S + 1 versions for a trace of maximum staleness S. :func:`replay_memory` reports that
((S + 1) × parameter bytes) and :func:`replay` refuses, before allocating anything, a trace
that would need more than ``max_memory`` bytes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from asyncsim import runs
from asyncsim.config import Scenario
from asyncsim.engine import Numerics
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


def replay_memory(trace: Trace, n_params: int, *, bytes_per_param: int = 4) -> dict[str, int]:
    """Bytes replay needs for parameter versions: live versions × parameter bytes."""
    live = live_versions(trace)
    return {"versions": live, "max_staleness": trace.max_staleness,
            "bytes": live * n_params * bytes_per_param,
            "bound_bytes": (trace.max_staleness + 1) * n_params * bytes_per_param}


def replay(scn: Scenario, trace: Trace, *, out: str | Path | None = None, force: bool = False,
           numerics: Numerics | None = None, hyper: Mapping[str, float] | None = None,
           max_memory: int = DEFAULT_MAX_MEMORY, progress: bool = False,
           kind: str = "replay") -> RunResult:
    """Execute ``trace``'s numerics under ``scn`` (its optimizer, model, data, seed).

    Args:
        hyper: overrides of the core's ``lr``, ``beta``, ``weight_decay`` for this replay.
        max_memory: bytes of parameter versions allowed; a larger need raises
            :class:`ReplayMemoryError` before anything is allocated.
    """
    num = numerics or Numerics(scn)
    shapes = jax.eval_shape(num.model.init, jax.random.PRNGKey(0))
    need = replay_memory(trace, num_params(shapes))
    if need["bytes"] > max_memory:
        raise ReplayMemoryError(
            f"replaying this trace holds {need['versions']} parameter versions at once "
            f"(max staleness {need['max_staleness']}): {need['bytes'] / 2**20:.1f} MiB, more "
            f"than the {max_memory / 2**20:.1f} MiB allowed (max_memory)")
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
    finally:
        if driver.pbar is not None:
            driver.pbar.close()
    if stopped_at < trace.num_updates:
        trace = truncate(trace, stopped_at)
    return driver.finish(trace, t0, kind=kind)


def truncate(trace: Trace, updates: int) -> Trace:
    """The first ``updates`` updates of a trace (a diverged replay stops early)."""
    n = int(trace.updates["start"][updates]) if updates < trace.num_updates else trace.num_gradients
    return Trace({k: v[:n] for k, v in trace.grads.items()},
                 {k: v[:updates] for k, v in trace.updates.items()},
                 {**trace.meta, "stop_reason": "diverged"})


def replay_folder(run_dir: str | Path, *, out: str | Path | None = None,
                  overrides: Sequence[str] = (), force: bool = False,
                  progress: bool = False) -> RunResult:
    """``asyncsim replay RUN_DIR``: replay a run folder's trace with its resolved scenario.

    ``overrides`` may change numerics only (``optimizer.*``, ``model.*``, ``data.*``,
    ``run.eval_every``...); the timing is the recorded trace. Without ``out`` the result is
    written to ``RUN_DIR/replay``.
    """
    run_dir = Path(run_dir)
    scn = load_scenario(run_dir / "scenario.toml", overrides=overrides)
    trace = Trace.load(run_dir)
    trace = Trace(trace.grads, trace.updates, {**trace.meta, "source": str(run_dir)})
    return replay(scn, trace, out=out or run_dir / "replay", force=force, progress=progress)


def replay_many(scn: Scenario, trace: Trace, points: Sequence[Mapping[str, Any]],
                **kw: Any) -> list[RunResult]:
    """Replay one trace under several numeric settings, sharing model, data and jit cache."""
    num = Numerics(scn)
    return [replay(scn, trace, numerics=num, hyper=p, **kw) for p in points]
