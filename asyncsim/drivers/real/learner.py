"""The learner actor of a real run: gradients of the scenario's own gradient program.

A learner is a Ray actor holding its own :class:`~asyncsim.numerics.numerics.Numerics` (same
model, same data set, same jitted gradient program); for its ``batch``-th gradient it
computes ``num.grad(params, x_train, y_train, learner, batch)`` on the parameters the PS sent
(:mod:`.ps`). Ray's learner processes import this module only.
"""

from __future__ import annotations

import os
import time

import jax
import numpy as np

from asyncsim.drivers.build import numerics_for, simulation_for
from asyncsim.drivers.plugins import install_plugins
from asyncsim.machine import thread_counts

__all__ = ["LearnerImpl"]


class LearnerImpl:
    """One learner process: computes gradients with the scenario's Numerics.

    Reusable across runs (a test session or a benchmark keeps the actors, and the jitted
    gradient compiled once): every call names its job, ``(job_id, scenario, learner,
    emulate, plug-ins)`` (an object-store reference resolved by Ray), and the actor (re)builds its
    Numerics when the job changes; a restarted actor rebuilds lazily on its first call.

    ``compute`` returns ``(loss, grads, t_start, t_push, pid)`` with numpy leaves and
    ``time.time()`` stamps; the gradient is ``Numerics.grad`` exactly. The pid lets the
    PS notice a restarted actor.
    """

    def __init__(self):
        self.job_id = None

    def _setup(self, job) -> None:
        job_id, scn, learner, emulate, plugins = job
        install_plugins(plugins)  # the driver's Python-registered plug-ins
        self.learner = learner
        self.num = numerics_for(scn, grouping="none")
        self.sleep = None
        if emulate:
            # The simulator's own compute stream for this learner (same seed, same draws).
            self.sleep = simulation_for(scn).compute[learner]
        self.job_id = job_id

    def ready(self, job) -> int:
        """Set up and warm up (compile) the gradient function; returns the process id."""

        self._setup(job)
        p = self.num.init_params()
        jax.block_until_ready(self.num.grad(p, self.num.x_train, self.num.y_train,
                                            np.int32(self.learner), np.int32(0)))
        return os.getpid()

    def thread_counts(self) -> dict[str, int]:
        """:func:`thread_counts` as this actor's process has them."""
        return thread_counts()

    def compute(self, job, params, batch: int, die: bool = False):
        if self.job_id != job[0]:
            self._setup(job)
        t_start = time.time()
        loss, g = self.num.grad(params, self.num.x_train, self.num.y_train,
                                np.int32(self.learner), np.int32(batch))
        loss, g = jax.device_get((loss, g))
        if die:
            # Fault injection: the process dies with this gradient computed but not sent,
            # so the loss always falls on this task (a kill from outside could land after
            # a fast gradient was already returned, or while the learner waits idle).
            os._exit(1)
        if self.sleep is not None:
            time.sleep(self.sleep.next(0.0))
        return np.asarray(loss), g, t_start, time.time(), os.getpid()
