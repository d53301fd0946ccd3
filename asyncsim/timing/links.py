"""The PS's shared network interface: ``cluster.network.ps_ingress`` / ``ps_egress``.

Each learner has its own link to the PS (``cluster.network.pull`` / ``push``: latency +
bytes / bandwidth, private). A real PS also has one network interface that every transfer
crosses: with 30 learners pushing 358 kB each, it, not the learners' links, bounds the
update rate (at most ``bandwidth / bytes`` pushes per time unit). A :class:`SharedLink` is
that interface, in one direction:

* ``sharing = "fifo"``: one transfer at a time at the full bandwidth, in arrival order;
* ``sharing = "fair"``: processor sharing -- the n transfers in progress each get
  ``bandwidth / n``; when one starts or ends, the others' rates change.

A pushed gradient crosses the learner's own link, then the interface; pulled weights cross
the interface, then the learner's link (store and forward): the learner times its own link
and waits on :meth:`SharedLink.transfer`'s event for the interface
(:meth:`asyncsim.timing.cluster.Simulation.learner_loop`). Both links run on a plain
``simpy.Environment``: a transfer is a SimPy event, and a fair link's wake-ups are SimPy
timeouts.

Determinism: the bytes given to each transfer are advanced in float64 at every start and
end; transfers left with at most 1e-9 of their size at the same instant end together, in
the order they started (so their SimPy events fire, and their learners go on, in that
order). Nothing here draws a random number, so adding a shared link changes no compute or
link draw.

A transfer cannot be withdrawn: when its learner goes down (``cluster.availability``), a
message queued at or crossing the interface still takes its share until it would have ended
-- the interface learns of the loss only then; one still on the learner's link before the
interface never reaches it.
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import count

import simpy

__all__ = ["FairLink", "FifoLink", "SharedLink"]

_TOL = 1e-9  # of a transfer's bytes: remaining below this counts as done (float rounding)


class SharedLink:
    """One direction of the PS's interface. ``SharedLink(env, bandwidth, sharing)`` is a
    :class:`FifoLink` or a :class:`FairLink`; ``transfer(nbytes)`` is a SimPy event that
    fires when ``nbytes`` have crossed it.

    Args:
        env: the simulation's ``simpy.Environment``.
        bandwidth: bytes per time unit.
        sharing: ``"fair"`` | ``"fifo"``.
    """

    sharing = ""

    def __new__(cls, env: simpy.Environment, bandwidth: float, sharing: str | None = None):
        if cls is SharedLink:
            if sharing not in _SHARING:
                raise ValueError(f"sharing must be 'fair' or 'fifo', got {sharing!r}")
            cls = _SHARING[sharing]
        return super().__new__(cls)

    def __init__(self, env: simpy.Environment, bandwidth: float, sharing: str | None = None):
        self.env = env
        self.bandwidth = float(bandwidth)


class FifoLink(SharedLink):
    """``sharing = "fifo"``: one transfer at a time at the full bandwidth, in arrival order
    (a queue with one server, computed without a process: a transfer is one timeout)."""

    sharing = "fifo"

    def __init__(self, env: simpy.Environment, bandwidth: float, sharing: str | None = None):
        super().__init__(env, bandwidth)
        self._free_at = 0.0  # when the interface is free again

    def transfer(self, nbytes: float) -> simpy.Event:
        env = self.env
        if nbytes <= 0:
            return env.timeout(0.0)
        # This transfer starts when the ones before it have ended.
        start = max(env.now, self._free_at)
        self._free_at = start + nbytes / self.bandwidth
        return env.timeout(self._free_at - env.now)


class FairLink(SharedLink):
    """``sharing = "fair"``: processor sharing.

    It keeps a virtual clock, the bytes each transfer in progress has been given,
    ``V(t) = integral of bandwidth / n(t) dt``: a transfer started at ``V0`` with ``b`` bytes
    ends when ``V`` reaches ``V0 + b``, so the transfers form a heap by that target and an
    event costs O(log n), not O(n). One wake-up (a SimPy timeout whose callback is
    :meth:`_wake`) is pending while a transfer is under way, set for when the first would
    end; a transfer that starts meanwhile slows the others, so the pending wake-up may come
    early and then just sets the next one; a transfer that ends before the others
    supersedes it (the superseded timeout still fires, and does nothing).
    """

    sharing = "fair"

    def __init__(self, env: simpy.Environment, bandwidth: float, sharing: str | None = None):
        super().__init__(env, bandwidth)
        self._heap: list[tuple] = []  # (target, seq, bytes, event): see transfer
        self._seq = count()  # the order transfers started in (ties: see _wake)
        self._v = 0.0  # the virtual clock V, as of time self._t
        self._t = 0.0
        self._early = False  # a transfer started since the pending wake-up was set
        self._gen = 0  # the current wake-up (a superseded one is ignored)

    @property
    def in_progress(self) -> int:
        """Transfers under way."""
        return len(self._heap)

    def transfer(self, nbytes: float) -> simpy.Event:
        """The event "``nbytes``, starting now, have crossed the interface"."""
        ev = self.env.event()
        nbytes = float(nbytes)
        if nbytes <= 0:
            ev.succeed()
            return ev
        v = self._clock()
        item = (v + nbytes, next(self._seq), nbytes, ev)
        heap = self._heap
        heappush(heap, item)
        if heap[0] is not item:
            # Others are under way, so a wake-up is pending; this one slows them: the
            # wake-up now comes early (and sets the next one).
            self._early = True
        else:
            # The only one, or it ends first (a smaller transfer): wake for it.
            self._schedule(v)
        return ev

    def _clock(self) -> float:
        """The virtual clock, advanced to now (it stands still while nothing is under way)."""
        now = self.env.now
        v = self._v
        if self._heap and now > self._t:
            v += (now - self._t) * self.bandwidth / len(self._heap)
        self._v, self._t = v, now
        return v

    def _schedule(self, v: float) -> None:
        """The wake-up for the first transfer to end, if nothing starts meantime (pending
        while a transfer is under way; a former one is superseded). ``v``: the virtual clock
        now."""
        self._gen += 1
        self._early = False
        heap = self._heap
        if heap:
            left = heap[0][0] - v
            wake = self.env.timeout((left if left > 0.0 else 0.0) * len(heap) / self.bandwidth,
                                    value=self._gen)
            wake.callbacks.append(self._wake)

    def _wake(self, wake: simpy.Event) -> None:
        """A wake-up's turn: the transfers that have crossed end, in the order they started
        (their events succeed, so their learners go on in that order), and the next
        wake-up is set."""
        if wake.value != self._gen:
            return  # superseded: a transfer that ends sooner started since
        heap = self._heap  # not empty: a wake-up is pending only while a transfer is under way
        v = self._clock()
        head = heap[0]
        if self._early:
            if head[0] - v > _TOL * head[2]:
                # Early (a transfer started since it was set, slowing the first): none ends.
                self._schedule(v)
                return
        elif v < head[0]:
            # Nothing started since this wake-up was set for the first transfer to end: it
            # ends now, whatever the last bits of the clocks say (at large times, rounding
            # of the time moves V by more than any byte tolerance; waiting for it never
            # ends).
            self._v = v = head[0]
        done = [heappop(heap)]
        while heap and heap[0][0] - v <= _TOL * heap[0][2]:
            done.append(heappop(heap))
        done.sort(key=lambda d: d[1])  # ending together: in the order they started
        for d in done:
            d[3].succeed()
        self._schedule(v)


_SHARING = {"fifo": FifoLink, "fair": FairLink}
