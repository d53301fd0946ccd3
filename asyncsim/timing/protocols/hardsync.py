"""``hardsync``: a barrier. The PS waits for one gradient from every learner that is up,
averages them and updates; learners wait for the new version before pulling (SGD with batch
mu lambda)."""

from __future__ import annotations

from asyncsim.timing.protocols.base import Protocol, register_protocol


@register_protocol("hardsync")
class Hardsync(Protocol):
    def __init__(self, learners: int):
        super().__init__(learners)
        self.buffer: list[tuple] = []
        self.barrier = None  # the event "the PS broadcast a new version"
        # Real runs (on_lost/on_back): learners that are dead or restarting (rounds go on
        # without them), those of them restarted (they rejoin at the next round), and per
        # learner the rounds it sat out (its round is batch + missed). Empty/0 in simulations.
        self.away: set[int] = set()
        self.back: set[int] = set()
        self.missed = [0] * learners

    def updates_per_gradient(self):
        return 1.0 / self.learners

    def nominal_staleness(self):
        return 0.0

    def may_pull(self, sim, learner, batch):
        # A learner's batch-th pull needs the version produced by the (batch-1)-th round
        # (counting the rounds it sat out); a learner that is away joins the next round.
        if learner in self.away or sim.version < batch + self.missed[learner]:
            if self.barrier is None:
                self.barrier = sim.env.event()
            return self.barrier
        return None

    def on_arrival(self, sim, grad):
        self.buffer.append(grad)
        self._complete(sim)

    def on_lost(self, sim, learner):
        """A learner is gone (a real actor died, a simulated one went down): this round and
        the next ones complete with the live learners' gradients until it is back
        (:meth:`on_back`). If it had delivered this round's gradient, that gradient stays
        in the round."""
        if learner in self.back:  # gone again before it rejoined
            self.back.discard(learner)
            return True
        if learner in self.away:
            return False
        self.away.add(learner)
        if self.buffer:
            self._complete(sim)
        self._start_if_nobody_in_round()
        return True

    def on_back(self, sim, learner):
        """A learner that is back rejoins at the next round -- a round under way does not
        wait for its compute -- or at once if no learner is in this round (all were away:
        nobody would complete it)."""
        if learner not in self.away:
            return
        self.back.add(learner)
        self._start_if_nobody_in_round()

    def _start_if_nobody_in_round(self):
        """Every learner away and nothing delivered: no round can complete, so those back
        (waiting at the barrier for the next round) take this one."""
        if self.back and len(self.away) == self.learners and not self.buffer:
            self.away -= self.back
            self.back.clear()
            if self.barrier is not None:
                barrier, self.barrier = self.barrier, None
                barrier.succeed()

    def _complete(self, sim):
        buf = self.buffer
        # The learners this round goes without: those away, less any that went away after
        # delivering this round's gradient.
        sat_out = self.away - {g[0] for g in buf} if self.away else ()
        if buf and len(buf) + len(sat_out) == self.learners:
            self.buffer = []
            for k in sat_out:
                self.missed[k] += 1
            self.away -= self.back
            self.back.clear()
            sim.apply_update(buf)
            if self.barrier is not None:
                barrier, self.barrier = self.barrier, None
                barrier.succeed()
