"""The PS's shared network interface: ``cluster.network.ps_ingress`` / ``ps_egress``.

Each learner has its own link to the PS (``cluster.network.pull`` / ``push``: latency +
bytes / bandwidth, private). A real PS also has one network interface that every transfer
crosses: with 30 learners pushing 358 kB each, it, not the learners' links, bounds the
update rate (at most ``bandwidth / bytes`` pushes per time unit). A :class:`SharedLink` is
that interface, in one direction:

* ``sharing = "fifo"``: one transfer at a time at the full bandwidth, in arrival order;
* ``sharing = "fair"``: processor sharing -- the n transfers in progress each get
  ``bandwidth / n``; when one starts or ends, the others' rates change.

Determinism: the bytes given to each transfer are advanced in float64 at every start and
end; transfers left with at most 1e-9 of their size at the same instant end together, in
the order they started (so their SimPy events fire, and their learners go on, in that
order). Nothing here draws a random number: adding a shared link changes no compute or link
draw.

A transfer cannot be withdrawn: when its learner goes down (``cluster.availability``), a
message queued at or crossing the interface still takes its share until it would have ended
-- the interface learns of the loss only then.
"""

from __future__ import annotations

import heapq

import simpy

__all__ = ["SharedLink"]

_TOL = 1e-9  # of a transfer's bytes: remaining below this counts as done (float rounding)


class SharedLink:
    """One direction of the PS's interface: ``transfer(nbytes)`` is a SimPy event that
    fires when ``nbytes`` have crossed it.

    Fair sharing keeps a virtual clock, the bytes each transfer in progress has been given,
    ``V(t) = integral of bandwidth / n(t) dt``: a transfer started at ``V0`` with ``b`` bytes
    ends when ``V`` reaches ``V0 + b``, so the transfers form a heap by that target and an
    event costs O(log n), not O(n). One wake-up is pending at a time; a transfer that starts
    meanwhile slows the others, so the pending wake-up may come early and then just
    schedules the next one; a transfer that ends before the others supersedes it."""

    def __init__(self, env: simpy.Environment, bandwidth: float, sharing: str):
        if sharing not in ("fair", "fifo"):
            raise ValueError(f"sharing must be 'fair' or 'fifo', got {sharing!r}")
        self.env = env
        self.bandwidth = float(bandwidth)
        self.sharing = sharing
        self._free_at = 0.0  # fifo: when the interface is free again
        self._heap: list[tuple[float, int, float, simpy.Event]] = []  # (target, seq, b, ev)
        self._seq = 0
        self._v = 0.0  # the virtual clock V, as of time self._t
        self._t = 0.0
        self._pending = False  # a wake-up is scheduled
        self._early = False  # a transfer started since, so it comes early
        self._gen = 0  # the current wake-up (a superseded one is ignored)

    def transfer(self, nbytes: float) -> simpy.Event:
        env = self.env
        if nbytes <= 0:
            return env.timeout(0.0)
        if self.sharing == "fifo":
            # One at a time in arrival order: this transfer starts when the ones before it
            # have ended (a queue with one server, computed without a process).
            start = max(env.now, self._free_at)
            self._free_at = start + nbytes / self.bandwidth
            return env.timeout(self._free_at - env.now)
        self._advance()
        ev = env.event()
        item = (self._v + float(nbytes), self._seq, float(nbytes), ev)
        heapq.heappush(self._heap, item)
        self._seq += 1
        if not self._pending or self._heap[0] is item:
            # Nothing scheduled, or this one ends first (a smaller transfer): wake for it.
            self._schedule()
        else:
            # It slows the others: the pending wake-up now comes early (and reschedules).
            self._early = True
        return ev

    @property
    def in_progress(self) -> int:
        """Transfers under way (fair sharing)."""
        return len(self._heap)

    def _advance(self) -> None:
        now = self.env.now
        if self._heap and now > self._t:
            self._v += (now - self._t) * self.bandwidth / len(self._heap)
        self._t = now

    def _schedule(self) -> None:
        self._gen += 1
        self._early = False
        heap = self._heap
        if not heap:
            self._pending = False
            return
        self._pending = True
        left = heap[0][0] - self._v
        gen = self._gen
        wake = self.env.timeout((left if left > 0.0 else 0.0) * len(heap) / self.bandwidth)
        wake.callbacks.append(lambda _ev: self._wake(gen))

    def _wake(self, gen: int) -> None:
        if gen != self._gen:
            return  # superseded: a transfer that ends sooner started since
        self._advance()
        heap = self._heap
        if not self._early:
            # Nothing started since this wake-up was set for the first transfer to end: it
            # ends now, whatever the last bits of the clocks say (at large times, rounding of
            # the time moves V by more than any byte tolerance; waiting for it never ends).
            self._v = max(self._v, heap[0][0])
        v = self._v
        done = []
        while heap and heap[0][0] - v <= _TOL * heap[0][2]:
            done.append(heapq.heappop(heap))
        if len(done) > 1:
            done.sort(key=lambda d: d[1])  # ending together: in the order they started
        for d in done:
            d[3].succeed()
        self._schedule()
