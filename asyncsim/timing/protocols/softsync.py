"""P1's n-softsync (Zhang et al. 2016, Sec. 3): the PS updates after any c = floor(lambda / n)
gradients; ``async`` is lambda-softsync, one update per gradient."""

from __future__ import annotations

from asyncsim import _checks
from asyncsim.timing.protocols.base import Protocol, register_protocol


@register_protocol("async")
class Async(Protocol):
    def nominal_staleness(self):
        # Little's law: with every learner always computing, a gradient's staleness is the
        # number of the other learners' gradients applied meanwhile, lambda - 1 on average.
        return float(self.learners - 1)

    def on_arrival(self, sim, grad):
        sim.apply_update((grad,))


@register_protocol("softsync")
class Softsync(Protocol):
    def __init__(self, learners: int, *, n: int):
        """Args:
            n: the PS updates after c = floor(learners / n) gradients (P1)
        """
        super().__init__(learners)
        self.n = _checks.integer("n", n, low=1, high=learners, bound="cluster.learners")
        self.c = learners // n  # P1: c = floor(lambda / n)
        self.buffer: list[tuple] = []

    @classmethod
    def options_strategy(cls, learners):
        from hypothesis import strategies as st

        return st.fixed_dictionaries({"n": st.integers(1, learners)})

    def updates_per_gradient(self):
        return 1.0 / self.c

    def on_arrival(self, sim, grad):
        buf = self.buffer
        buf.append(grad)
        if len(buf) == self.c:
            self.buffer = []
            sim.apply_update(buf)
