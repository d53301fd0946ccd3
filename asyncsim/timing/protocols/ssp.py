"""``ssp``: stale synchronous parallel (Ho et al., NIPS 2013): each gradient is applied on
arrival, but a learner whose clock leads the slowest live learner's by more than ``s`` waits
before pulling."""

from __future__ import annotations

from asyncsim import _checks
from asyncsim.timing.protocols.base import Protocol, register_protocol


@register_protocol("ssp")
class SSP(Protocol):
    def __init__(self, learners: int, *, s: int):
        """Args:
            s: a learner may lead the slowest by at most s clocks
        """
        super().__init__(learners)
        self.s = _checks.integer("s", s, low=0)
        self.clock = [0] * learners  # gradients pushed (arrived) per learner
        self.at = {0: learners}  # how many learners sit at each clock value
        self.min_clock = 0  # the slowest live learner's
        self.waiting: dict[int, list] = {}  # min clock needed -> events
        self.gone: set[int] = set()  # learners not counted (on_lost)

    @classmethod
    def options_strategy(cls, learners):
        from hypothesis import strategies as st

        return st.fixed_dictionaries({"s": st.integers(0, 5)})

    def may_pull(self, sim, learner, batch):
        need = batch - self.s  # the slowest learner must have pushed >= batch - s gradients
        if self.min_clock >= need:
            return None
        ev = sim.env.event()
        self.waiting.setdefault(need, []).append(ev)
        return ev

    def on_arrival(self, sim, grad):
        learner = grad[0]
        c = self.clock[learner]
        self.clock[learner] = c + 1
        self.at[c] -= 1
        self.at[c + 1] = self.at.get(c + 1, 0) + 1
        sim.apply_update((grad,))
        if self.at[c] == 0:
            del self.at[c]
            if c == self.min_clock:
                self._raise_min()

    def on_lost(self, sim, learner):
        """The bound holds over the live learners: a gone learner holds nobody back."""
        if learner in self.gone:
            return False
        self.gone.add(learner)
        c = self.clock[learner]
        self.at[c] -= 1
        if self.at[c] == 0:
            del self.at[c]
            if c == self.min_clock and self.at:
                self._raise_min()
        return True

    def on_back(self, sim, learner):
        """Back, it counts again with its own clock (so the others may wait for it)."""
        self.gone.discard(learner)
        c = self.clock[learner]
        self.at[c] = self.at.get(c, 0) + 1
        self.min_clock = min(self.at)

    def _raise_min(self):
        self.min_clock = min(self.at)
        ready = [k for k in self.waiting if k <= self.min_clock]
        for k in sorted(ready):
            for ev in self.waiting.pop(k):
                if not ev.triggered:
                    ev.succeed()
