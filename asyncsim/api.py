"""The Python API behind the CLI: trace-only runs and their run folders.

>>> import asyncsim
>>> scn = asyncsim.load_scenario("scenarios/p1_f1_staleness.toml", profile="smoke")
>>> trace = asyncsim.simulate(scn)          # timing only, no folder
>>> trace.staleness_stats()["staleness_mean"]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from asyncsim import runs
from asyncsim.cluster import Simulation, run_length
from asyncsim.config import Scenario
from asyncsim.scenario import base_dir
from asyncsim.trace import Trace


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


def train_size(scn: Scenario) -> int:
    """The train-set size of ``scn.data`` without building the data set (for run.epochs)."""
    from asyncsim.scenario import declared_train_size

    if "n_train" in scn.data.options:
        return int(scn.data.options["n_train"])
    n = declared_train_size(scn.data.name, {})
    return 50_000 if n is None else n


def message_bytes(scn: Scenario) -> int | None:
    """4 bytes per model parameter, when a link has a finite bandwidth and no ``bytes``."""
    net = scn.cluster.network
    if all(math.isinf(link.bandwidth) or link.bytes is not None for link in (net.pull, net.push)):
        return None
    import jax

    from asyncsim.engine import build_model
    from asyncsim.models import num_params

    model = build_model(scn)  # a ScenarioError under `model` for an option it refuses
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    return 4 * num_params(shapes)


def simulate(scn: Scenario, *, progress: bool = False) -> Trace:
    """Timing only: the :class:`Trace` of ``scn`` (no gradients, no folder)."""
    n_train = train_size(scn) if scn.run.epochs is not None else None
    sim = Simulation(scn, msg_bytes=message_bytes(scn), base_dir=base_dir(scn))
    return sim.run(progress=progress, **run_length(scn, n_train=n_train))


def trace_summary(trace: Trace) -> dict[str, Any]:
    return {
        "gradients": trace.num_gradients,
        "updates": trace.num_updates,
        "sim_time": float(trace.meta.get("sim_time", 0.0)),
        **trace.staleness_stats(),
        "trace_hash": trace.hash(),
    }


def trace_run(scn: Scenario, out: str | Path | None = None, *, force: bool = False,
              progress: bool = False) -> TraceResult:
    """Simulate timing only; with ``out``, write the run folder (summary.json last)."""
    folder = runs.prepare(out, force=force) if out is not None else None
    t0 = time.perf_counter()
    with runs.removed_on_scenario_error(folder):  # e.g. a delay model's non-finite draw
        trace = simulate(scn, progress=progress)
    wall = time.perf_counter() - t0
    summary = {"name": scn.name, "seed": scn.seed, "kind": "trace", **trace_summary(trace),
               "wall_time": wall, "stop_reason": trace.meta.get("stop_reason")}
    if folder is not None:
        runs.write_scenario(folder, scn)
        runs.write_provenance(folder, scn, driver="trace")
        trace.save(folder)
        runs.write_summary(folder, summary)
    return TraceResult(trace, summary, folder)
