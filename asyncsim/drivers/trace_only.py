"""``asyncsim trace``: the timing-only driver. It simulates a scenario's timeline with no
gradients at all (fast: a million gradients of 1000 learners in seconds) and writes the
trace's run folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncsim import runs
from asyncsim.config import Scenario
from asyncsim.drivers.build import message_bytes, simulation_for
from asyncsim.drivers.folder_scenario import start_folder
from asyncsim.drivers.run_length import run_length
from asyncsim.numerics.data import train_size
from asyncsim.trace import Trace

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class TraceResult:
    """What a trace-only run returns: the trace, its summary and its folder (if written)."""

    trace: Trace
    summary: dict[str, Any]
    out: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gradients(self) -> pd.DataFrame:
        return self.trace.gradients_df()

    @property
    def updates(self) -> pd.DataFrame:
        return self.trace.updates_df()


def simulate(scn: Scenario, *, progress: bool = False) -> Trace:
    """Timing only: the :class:`Trace` of ``scn`` (no gradients, no folder)."""
    n_train = (train_size(scn.data.name, scn.data.options) if scn.run.epochs is not None
               else None)
    sim = simulation_for(scn, msg_bytes=message_bytes(scn))
    return sim.run(progress=progress, **run_length(scn, n_train=n_train))


def trace_run(scn: Scenario, out: str | Path | None = None, *, force: bool = False,
              progress: bool = False,
              measure: Callable[[Trace], dict[str, Any]] | None = None) -> TraceResult:
    """Simulate timing only; with ``out``, write the run folder (summary.json last).

    ``measure(trace)`` (optional) returns extra summary fields computed from the trace
    before the summary is written (a measured stability edge, say:
    :mod:`asyncsim.stability.measure`).
    """
    with runs.opened(out, force=force) as folder:
        t0 = time.perf_counter()
        trace = simulate(scn, progress=progress)  # a bad draw: the new folder is removed
        wall = time.perf_counter() - t0
        summary = {"name": scn.name, "seed": scn.seed, "kind": "trace", **trace.summary(),
                   "wall_time": wall, "stop_reason": trace.meta.get("stop_reason")}
        if measure is not None:
            summary.update(measure(trace))
        if folder is not None:
            start_folder(folder, scn, driver="trace")
            trace.save(folder)
            runs.write_summary(folder, summary)
    return TraceResult(trace, summary, folder)
