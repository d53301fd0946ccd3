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
    schedules the next one."""

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
        heapq.heappush(self._heap, (self._v + float(nbytes), self._seq, float(nbytes), ev))
        self._seq += 1
        if not self._pending:
            self._schedule()
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
        heap = self._heap
        if not heap:
            self._pending = False
            return
        self._pending = True
        left = heap[0][0] - self._v
        wake = self.env.timeout((left if left > 0.0 else 0.0) * len(heap) / self.bandwidth)
        wake.callbacks.append(self._wake)

    def _wake(self, _ev) -> None:
        # _advance, inlined: this runs once or twice per transfer.
        now, heap = self.env.now, self._heap
        if now > self._t:
            self._v += (now - self._t) * self.bandwidth / len(heap)
        self._t = now
        v = self._v
        top = heap[0]
        if top[0] - v <= _TOL * top[2]:
            first = heapq.heappop(heap)
            if heap and heap[0][0] - v <= _TOL * heap[0][2]:
                done = [first]
                while heap and heap[0][0] - v <= _TOL * heap[0][2]:
                    done.append(heapq.heappop(heap))
                for d in sorted(done, key=lambda d: d[1]):  # in the order they started
                    d[3].succeed()
            else:
                first[3].succeed()
        self._schedule()
