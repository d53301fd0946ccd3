"""How long a run is: the :meth:`Simulation.run <asyncsim.timing.cluster.Simulation.run>`
limits a scenario's ``[run]`` table gives, and the refusal, before it starts, of a run whose
trace alone could not fit in memory."""

from __future__ import annotations

import math
from typing import Any

from asyncsim.config import Scenario, check_memory
from asyncsim.timing.protocols import make_protocol

__all__ = ["TRACE_ROW_BYTES", "check_trace_fits", "run_length"]


def run_length(scenario: Scenario, *, n_train: int | None = None) -> dict[str, Any]:
    """The Simulation.run limits for ``scenario.run`` (epochs need the train-set size).

    A run whose trace could not fit in memory is refused here, before it starts, with one
    line naming the key and the estimate (:func:`check_trace_fits`)."""
    r = scenario.run
    if r.updates is not None:
        limits, key = {"max_updates": r.updates}, "run.updates"
    elif r.gradients is not None:
        limits, key = {"max_gradients": r.gradients}, "run.gradients"
    elif r.sim_time is not None:
        return {"max_time": r.sim_time}  # its length is known only as the run goes
    elif r.epochs is not None:
        if n_train is None:
            raise ValueError("run.epochs needs the data set's size")
        limits = {"max_gradients": math.ceil(r.epochs * n_train / scenario.data.batch_size)}
        key = "run.epochs"
    else:
        limits, key = {"max_updates": 100}, "run.updates"
    check_trace_fits(scenario, limits, key)
    return limits


# Bytes of one gradient's trace row (9 columns of 8 bytes) plus its share of an update row,
# the Python-side buffers while the simulation grows them, and the saved copy.
TRACE_ROW_BYTES = 2 * (9 * 8 + 4 * 8)


def check_trace_fits(scenario: Scenario, limits: dict[str, Any], key: str) -> None:
    """Refuse a run whose trace alone would need more than the machine's memory
    (``run.updates = 1e18`` would otherwise grow without end)."""
    proto = make_protocol(scenario.protocol, scenario.cluster.learners)
    grads = limits.get("max_gradients")
    if grads is None:
        grads = limits["max_updates"] / max(proto.updates_per_gradient(), 1e-12)
    check_memory(key, grads * TRACE_ROW_BYTES, f"a trace of {grads:.3g} gradients needs",
                 f" ({TRACE_ROW_BYTES} bytes each)")
