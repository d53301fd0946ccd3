"""How long a run is: the :meth:`Simulation.run <asyncsim.timing.cluster.Simulation.run>`
limits a scenario's ``[run]`` table gives (one of updates, gradients, epochs, simulated
time; 100 updates by default), refused before the run starts where its trace alone could
not fit in memory (:func:`asyncsim.trace.check_fits`)."""

from __future__ import annotations

import math
from typing import Any

from asyncsim.config import Scenario
from asyncsim.timing.protocols import make_protocol
from asyncsim.trace import check_fits

__all__ = ["gradients_of", "run_length"]


def run_length(scenario: Scenario, *, n_train: int | None = None) -> dict[str, Any]:
    """The Simulation.run limits for ``scenario.run`` (epochs need the train-set size).

    A run whose trace could not fit in memory is refused here, before it starts, with one
    line naming the key and the estimate (gradients: the protocol's updates per gradient
    turn a length in updates into one)."""
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
    check_fits(key, gradients_of(scenario, limits))
    return limits


def gradients_of(scenario: Scenario, limits: dict[str, Any]) -> float:
    """The gradients a run of ``limits`` (:func:`run_length`'s, not ``max_time``) computes:
    a length in updates through the protocol's updates per gradient."""
    grads = limits.get("max_gradients")
    if grads is None:
        proto = make_protocol(scenario.protocol, scenario.cluster.learners)
        grads = limits["max_updates"] / max(proto.updates_per_gradient(), 1e-12)
    return grads
