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
the interface, then the learner's link (store and forward). :meth:`FairLink.transfer`
(and :meth:`FairLink.puller`, a learner's pulls bound once) takes the learner's link with
it, so a message is one event its learner waits on, not two;
:meth:`FairLink.sender`'s pushes take the computation before them too, and a pull's ``go_on``
carries its event on to that push: with both directions fair, a learner's whole step is
one event. The parts are wake-ups here, each in the turn the learner's own timeout would
have had, so the traces are those of a learner timing each part itself, to the bit
(``Simulation.one_event_steps``; tests/test_links.py). A fair interface is the costly
discipline; the one-event step took 10-16% off its cost (benchmarks/bench_links.py, README).

Determinism: the bytes given to each transfer are advanced in float64 at every start and
end; transfers left with at most 1e-9 of their size at the same instant end together, in
the order they started (so their SimPy events fire, and their learners go on, in that
order). Nothing here draws a random number, and a learner's link draws its time when the
message reaches it, as if the learner timed it: adding a shared link changes no compute or
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
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import NORMAL, Event, EventPriority

__all__ = ["Environment", "FairLink", "FifoLink", "SharedLink"]

_TOL = 1e-9  # of a transfer's bytes: remaining below this counts as done (float rounding)


class Environment(simpy.Environment):
    """A SimPy environment with a second queue for the shared links' wake-ups.

    A fair link wakes up when its first transfer would end, and a pushed message reaches the
    interface when it is off its learner's link; a transfer that starts meanwhile postpones
    the first end, so many wake-ups come early. As SimPy timeouts, nobody waiting on them,
    each cost an event object and its callbacks (benchmarks/bench_links.py); here they are
    plain tuples ``(time, NORMAL, eid, call, arg)`` numbered from the environment's own event
    counter, so they take their turn among the events exactly as timeouts scheduled then
    would (the same traces, to the bit). Without them it steps as SimPy does.

    Rare events (``cluster.availability``'s up and down periods) wait in a third heap,
    :meth:`rare_timeout`: only the first of them stands in the wake-up queue.
    """

    def __init__(self, initial_time: float = 0):
        super().__init__(initial_time)
        self._wakes: list[tuple] = []
        self._rare: list[tuple] = []  # (time, NORMAL, eid, event): see rare_timeout

    def call_at(self, delay: float, call, arg) -> None:
        """``call(arg)`` in ``delay``, in its turn among the events (a timeout without an
        event: nothing can wait on it). The hot paths of :class:`FairLink` push this entry
        themselves (a learner's step is three of them; the calls were ~2% of a run's
        instructions under cachegrind)."""
        heappush(self._wakes, (self._now + delay, NORMAL, next(self._eid), call, arg))

    def rare_timeout(self, delay: float) -> Event:
        """A timeout for events that come seldom and wait long (a learner's next up or down,
        one per learner always pending): ``env.timeout(delay)``, taking the same turn.

        Why: as timeouts, 30 learners' 30 pending periods would sit in SimPy's queue, so
        every push and pop there would go deeper, and every step would compare the heads
        of both queues (with fair links, SimPy's queue is otherwise nearly empty). Here they
        wait in a heap of their own; the first of them stands in the wake-up queue under its
        own key ``(time, NORMAL, eid)``, so it is taken when the timeout would have been.
        Under cachegrind (benchmarks/bench_links.py's cluster, fair links and availability)
        that was 1-3% of a run's instructions, about the run-to-run noise of that count."""
        ev = Event(self)
        ev._ok, ev._value = True, None
        item = (self._now + delay, NORMAL, next(self._eid), ev)
        rare = self._rare
        heappush(rare, item)
        if rare[0] is item:  # the first now: it stands in the wake-up queue
            heappush(self._wakes, (*item[:3], self._rare_due, item))
        return ev

    def _rare_due(self, item: tuple) -> None:
        rare = self._rare
        # A stand-in whose event came first already (it stood in twice: when it was first,
        # and again when one scheduled later but due sooner had been taken) does nothing.
        if not rare or rare[0] is not item:
            return
        heappop(rare)
        if rare:
            head = rare[0]
            heappush(self._wakes, (*head[:3], self._rare_due, head))
        # What the step of SimPy's queue does for a timeout (one never fails).
        ev = item[3]
        callbacks, ev.callbacks = ev.callbacks, None
        for callback in callbacks:
            callback(ev)

    def peek(self) -> float:
        t = super().peek()
        return min(t, self._wakes[0][0]) if self._wakes else t

    def step(self) -> None:
        self._steps(once=True)

    def run(self, until=None):
        """:meth:`simpy.Environment.run`, stepping without a call per event (the loop below:
        a trace-only run is this loop; the call to ``step`` it saves per event was 2.6%
        (private links) to 4% (fair sharing with availability) of the instructions per
        gradient, benchmarks/bench_links.py under callgrind). A time ``until`` goes to
        SimPy's own ``run``, which steps with :meth:`step`."""
        if until is not None and not isinstance(until, simpy.Event):
            return super().run(until)
        if until is not None:
            if until.callbacks is None:
                return until.value  # processed already
            until.callbacks.append(StopSimulation.callback)
        try:
            self._steps(once=False)
        except StopSimulation as exc:
            return exc.args[0]  # == until.value
        except EmptySchedule:
            if until is not None:
                assert not until.triggered
                raise RuntimeError(
                    f'No scheduled events left but "until" event was not triggered: {until}'
                ) from None
        return None

    def _steps(self, once: bool) -> None:
        w = self._wakes
        queue = self._queue
        while True:
            if w and (not queue or w[0] < queue[0]):  # eids differ: never a tie
                self._now, _, _, call, arg = heappop(w)
                call(arg)
            else:
                # simpy.Environment.step (4.1), inline.
                try:
                    self._now, _, _, event = heappop(queue)
                except IndexError:
                    raise EmptySchedule from None
                callbacks, event.callbacks = event.callbacks, None
                try:
                    for callback in callbacks:
                        callback(event)
                except StopSimulation:
                    event.callbacks = callbacks[callbacks.index(callback) + 1:]
                    self.schedule(event, EventPriority(-1))
                    raise
                if not event._ok and not hasattr(event, "_defused"):
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    raise exc
            if once:
                return


class SharedLink:
    """One direction of the PS's interface. ``SharedLink(env, bandwidth, sharing)`` is a
    :class:`FifoLink` or a :class:`FairLink`; ``transfer(nbytes)`` is a SimPy event that
    fires when ``nbytes`` have crossed it.

    Args:
        env: the simulation's :class:`Environment` (fair sharing needs its wake-up queue).
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
        start = max(env._now, self._free_at)
        self._free_at = start + nbytes / self.bandwidth
        return env.timeout(self._free_at - env._now)


class FairLink(SharedLink):
    """``sharing = "fair"``: processor sharing.

    It keeps a virtual clock, the bytes each transfer in progress has been given,
    ``V(t) = integral of bandwidth / n(t) dt``: a transfer started at ``V0`` with ``b`` bytes
    ends when ``V`` reaches ``V0 + b``, so the transfers form a heap by that target and an
    event costs O(log n), not O(n). One wake-up is pending while a transfer is under way (in
    the :class:`Environment`'s wake-up queue); a transfer that starts meanwhile slows the
    others, so the pending wake-up may come early and then just schedules the next one; a
    transfer that ends before the others supersedes it.
    """

    sharing = "fair"
    # A transfer that ends alone at an instant goes on at once, not through the queue (see
    # _wake); False takes the trip, which tests/test_links.py checks gives the same traces.
    shortcut = True

    def __init__(self, env: Environment, bandwidth: float, sharing: str | None = None):
        if not isinstance(env, Environment):
            raise TypeError("fair sharing needs an asyncsim.timing.links.Environment")
        super().__init__(env, bandwidth)
        # (target, seq, bytes, (event, the learner's link after the interface, its t0,
        # go_on)): see _start
        self._heap: list[tuple] = []
        self._seq = count()  # the order transfers started in (ties: see _wake)
        self._v = 0.0  # the virtual clock V, as of time self._t
        self._t = 0.0
        self._early = False  # a transfer started since, so it comes early
        self._gen = 0  # the current wake-up (a superseded one is ignored)
        # Bound once: they go into the wake-up queue for every transfer.
        self._wake_cb = self._wake
        self._hop_cb = self._hop
        self._leg_cb = self._leg

    @property
    def in_progress(self) -> int:
        """Transfers under way."""
        return len(self._heap)

    def transfer(self, nbytes: float, then=None, t0: float = 0.0, *,
                 before: float | None = None, go_on=None) -> simpy.Event:
        """The event "``nbytes`` have crossed": first ``before`` time units on the learner's
        own link (a push), then the interface, then ``then.next(t0)`` on the learner's
        link (a pull; drawn when the message leaves the interface, if its learner still
        waits: as the learner would have drawn it). With ``go_on``, the event does not
        fire when the message is in: ``go_on(event)`` is called then, in the turn the event
        would have had, and carries it on (:meth:`sender`: the learner's whole step is one
        event)."""
        env = self.env
        ev = Event(env)
        nbytes = float(nbytes)
        rest = (ev, then, t0, go_on)
        if before is not None:
            # The learner's link first: the transfer starts then.
            env.call_at(before, self._hop_cb, (nbytes, rest))
        elif nbytes > 0:
            self._start(nbytes, rest)
        else:
            self._leave(rest)
        return ev

    def puller(self, then, nbytes: float, go_on=None):
        """``pull(t0)``: :meth:`transfer` ``(nbytes, then, t0, go_on=go_on)``, bound once
        (a learner's pulls: one call a step, not two)."""
        env = self.env
        nbytes = float(nbytes)
        if nbytes <= 0:
            return lambda t0: self.transfer(nbytes, then, t0, go_on=go_on)
        start = self._start

        def pull(t0: float) -> Event:
            ev = Event(env)
            start(nbytes, (ev, then, t0, go_on))
            return ev

        return pull

    def sender(self, link, nbytes: float, compute):
        """``send(ev=None)``: the event "a gradient computed for ``compute(now)`` time units
        from now, then sent over ``link`` (the learner's push link, drawn when the
        computation ends: None when it costs nothing), ``nbytes`` of it, has crossed the
        interface"; its ``t_push`` is when the computation ended. ``ev``: the event to fire
        (a pull's, carried on: ``send`` is then the pull's ``go_on``, and does nothing if
        its learner went down meanwhile), else a new one. One event its learner waits on
        for the whole step, not three: the end of the computation and of the learner's link
        are wake-ups here, in the turns the learner's timeouts would have had (the same
        traces, to the bit). One sender per learner, bound once; its three steps are
        closures over it, so a wake-up carries only the event."""
        env = self.env
        wakes, eid = env._wakes, env._eid
        nbytes = float(nbytes)
        start = self._start if nbytes > 0 else (lambda _, rest: self._leave(rest))

        def hop(ev: Event) -> None:
            # Off the learner's link; one that went down meanwhile sends nothing.
            if ev.callbacks:
                start(nbytes, (ev, None, 0.0, None))

        def computed(ev: Event) -> None:
            # The computation ended; a learner that went down meanwhile sends nothing (and
            # draws no link time, as it would not have).
            if ev.callbacks:
                now = ev.t_push = env._now
                if link is None:
                    start(nbytes, (ev, None, 0.0, None))  # off a link that costs nothing
                else:  # env.call_at, written out
                    heappush(wakes, (now + link.next(now), NORMAL, next(eid), hop, ev))

        def send(ev: Event | None = None) -> Event:
            if ev is None:
                ev = Event(env)
            elif not ev.callbacks:
                return ev  # the pull's learner went down meanwhile: it computes nothing
            now = env._now
            heappush(wakes, (now + compute(now), NORMAL, next(eid), computed, ev))
            return ev

        return send

    def _hop(self, args: tuple) -> None:
        # Off the learner's link; one that went down meanwhile sends nothing.
        nbytes, rest = args
        if rest[0].callbacks:
            if nbytes > 0:
                self._start(nbytes, rest)
            else:
                self._leave(rest)

    def _start(self, nbytes: float, rest: tuple) -> None:
        """The transfer of ``nbytes`` starts now; ``rest``: ``(event, the learner's link
        after the interface or None, its t0, go_on or None)``."""
        env = self.env
        now = env._now
        heap = self._heap
        v = self._v
        if heap and now > self._t:  # the virtual clock, advanced to now
            self._v = v = v + (now - self._t) * self.bandwidth / len(heap)
        self._t = now
        item = (v + nbytes, next(self._seq), nbytes, rest)
        heappush(heap, item)
        if heap[0] is not item:
            # Others are under way, so a wake-up is pending; this one slows them: the
            # wake-up now comes early (and reschedules).
            self._early = True
        else:
            # The only one, or it ends first (a smaller transfer): wake for it.
            self._schedule(env, heap, v)

    def _leave(self, rest: tuple) -> None:
        """The message has crossed the interface now: its event fires, or it goes on to the
        learner's link -- at the turn the event would have had, so that an interruption
        at this instant (a learner going down) comes first, as it would for the event."""
        if rest[1] is None:
            self._arrived(rest[0], 0.0, rest[3])
        else:
            self.env.call_at(0.0, self._leg_cb, rest)

    def _leg(self, rest: tuple) -> None:
        """On the learner's link after the interface: drawn, as the learner would, only if
        it still waits (one that went down sends nothing further)."""
        ev, then, t0, go_on = rest
        if ev.callbacks:
            self._arrived(ev, then.next(t0), go_on)

    def _arrived(self, ev: Event, delay: float, go_on) -> None:
        """The message is in, ``delay`` from now: its event fires then, or ``go_on(ev)`` is
        called then, in the same turn."""
        env = self.env
        if go_on is None:
            _fire(env, ev, delay)
        else:  # env.call_at, written out
            heappush(env._wakes, (env._now + delay, NORMAL, next(env._eid), go_on, ev))

    def _schedule(self, env: Environment, heap: list, v: float) -> None:
        """The wake-up for the first transfer to end, if nothing starts meantime (pending
        while a transfer is under way; a former one is superseded). ``v``: the virtual clock
        now."""
        self._gen = gen = self._gen + 1
        self._early = False
        if heap:
            left = heap[0][0] - v
            heappush(env._wakes, (env._now + (left if left > 0.0 else 0.0) * len(heap)
                                  / self.bandwidth, NORMAL, next(env._eid), self._wake_cb, gen))

    def _wake(self, gen: int) -> None:
        if gen != self._gen:
            return  # superseded: a transfer that ends sooner started since
        env = self.env
        now = env._now
        heap = self._heap  # not empty: a wake-up is pending only while a transfer is under way
        v = self._v
        if now > self._t:  # the virtual clock, advanced to now
            v += (now - self._t) * self.bandwidth / len(heap)
        self._t = now
        head = heap[0]
        if self._early:
            left = head[0] - v
            if left > _TOL * head[2]:
                # Early (a transfer started since it was set, slowing the first): none
                # ends; the next wake-up (_schedule, written out, as below).
                self._v = v
                self._gen = gen = gen + 1
                self._early = False
                heappush(env._wakes, (now + left * len(heap) / self.bandwidth, NORMAL,
                                      next(env._eid), self._wake_cb, gen))
                return
        elif v < head[0]:
            # Nothing started since this wake-up was set for the first transfer to end: it
            # ends now, whatever the last bits of the clocks say (at large times, rounding
            # of the time moves V by more than any byte tolerance; waiting for it never
            # ends).
            v = head[0]
        heappop(heap)
        wakes = env._wakes
        if heap and heap[0][0] - v <= _TOL * heap[0][2]:
            alone = False
            done = [head]
            while heap and heap[0][0] - v <= _TOL * heap[0][2]:
                done.append(heappop(heap))
            done.sort(key=lambda d: d[1])  # ending together: in the order they started
            for d in done:
                self._leave(d[3])
        else:
            # Nothing else happens at this instant (checked before the next wake-up is
            # set): the turn of its event (or of its leg) would come right after this
            # wake-up, and the next wake-up after that; so it is taken here, then, without
            # a trip through the queue (the traces are those of the trip, to the bit).
            queue = env._queue
            alone = self.shortcut and (not queue or queue[0][0] > now) and (
                not wakes or wakes[0][0] > now)
            if not alone:
                self._leave(head[3])
        # The next wake-up (_schedule, written out: every wake-up sets one).
        self._v = v
        self._gen = gen = gen + 1
        self._early = False
        if heap:
            left = heap[0][0] - v
            heappush(wakes, (now + (left if left > 0.0 else 0.0) * len(heap) / self.bandwidth,
                             NORMAL, next(env._eid), self._wake_cb, gen))
        if alone:
            ev, then, t0, go_on = head[3]
            if then is not None:
                # _leg and _arrived, written out (two calls less on every pull; with the
                # early return above, 2-4% of a run, benchmarks/bench_links.py): on the
                # learner's link, drawn only if it still waits.
                if ev.callbacks:
                    if go_on is None:
                        _fire(env, ev, then.next(t0))
                    else:  # _arrived, written out
                        heappush(wakes, (now + then.next(t0), NORMAL, next(env._eid), go_on,
                                         ev))
            elif go_on is not None:
                go_on(ev)  # what the event's turn would have called
            else:
                # Its event succeeds and its callbacks run now, as Environment.step would
                # run them (its learner goes on; none if the learner went down meanwhile).
                ev._ok, ev._value = True, None
                callbacks, ev.callbacks = ev.callbacks, None
                for callback in callbacks:
                    callback(ev)


def _fire(env: Environment, ev: Event, delay: float) -> None:
    """``ev`` succeeds in ``delay`` (``ev.succeed()`` with a delay, without its checks: a
    transfer's event fires once), as a timeout created now would."""
    ev._ok, ev._value = True, None
    env.schedule(ev, NORMAL, delay)


_SHARING = {"fifo": FifoLink, "fair": FairLink}
