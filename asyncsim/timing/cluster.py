"""The timing layer: SimPy processes for learners, links and the parameter server.

A learner loops (P1's system model): pull the weights (the PS reads its version *when it
serves the pull*; that is the gradient's ``read_version``), wait for the pull link, compute
for a sampled time, push through the push link (a blocking send, like P1's MPI calls), then
pull again. The protocol (:mod:`asyncsim.timing.protocols`) decides when the PS updates and which
gradients each update takes. Nothing here looks at gradient values: the same run with or
without numerics has the same timeline.

Determinism (docs/design.md): every random stream is a ``numpy.random.Generator`` built from
``SeedSequence(seed, spawn_key=(stream, learner))`` — one stream per learner and per link
direction — so adding learner 31 leaves learners 0–30's draws unchanged. The global
``random`` and ``np.random`` state are never used.

Tie-break: events at the same simulated instant run in SimPy's (time, priority, insertion)
order. Learners start in id order at t = 0, so two gradients that arrive at the same instant
are taken by the PS in the order their final timeouts were scheduled, which for equal
durations is the order in which their learners started that step (ties at t = 0: lower id
first). ``tests/unit/test_cluster.py`` asserts an exact log of this.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from asyncsim.config import ClusterConfig, ProtocolConfig
from asyncsim.errors import ScenarioError
from asyncsim.timing import delays
from asyncsim.timing.links import SharedLink
from asyncsim.timing.protocols import Protocol, make_protocol, timing_revision
from asyncsim.trace import DOWN_COLUMNS, GRAD_COLUMNS, UPDATE_COLUMNS, Trace

# Stream ids of SeedSequence spawn keys (never reorder: that would change every trace).
(STREAM_COMPUTE, STREAM_PULL, STREAM_PUSH, STREAM_SERVICE, STREAM_SCHEDULE, STREAM_UP,
 STREAM_DOWN) = range(7)
_PS = 1 << 30  # the "learner" index of the PS's own streams
# Draws per refill of a learner's stream. Fixed (never derived from the cluster size), so
# adding learners cannot change another learner's draws.
_BLOCK = 512
# A run whose learners lose this many gradients in a row (going down) without an update
# taking one is stopped with an error: its up periods are too short for anything to get
# through.
_MAX_IDLE_DOWNS = 100_000
# A run that only simulated time can end (run.sim_time) is stopped with an error when this
# many updates, plus 10 per learner, happen at one instant: its time stands still (zero
# compute and link times), so it would never end. Checked every 256 updates, with the
# progress bar. With positive step times a learner delivers at most one gradient per
# instant, so an honest run has at most `learners` updates at one instant.
_MAX_STILL_UPDATES = 10_000

OnUpdate = Callable[[int, Sequence[tuple]], bool | None]


def stream_rng(seed: int, stream: int, learner: int) -> np.random.Generator:
    """The Generator of one (stream, learner) pair: independent of every other pair."""
    return np.random.Generator(np.random.PCG64(
        np.random.SeedSequence(seed, spawn_key=(stream, learner))))


class _Zero:
    """A link that costs nothing (the common case); lets the hot loop skip a timeout."""

    @staticmethod
    def next(now: float) -> float:  # pragma: no cover - never called, checked by identity
        return 0.0


class _Link:
    """Latency sample + bytes / bandwidth."""

    __slots__ = ("stream", "fixed")

    def __init__(self, stream: delays.DelayStream, fixed: float):
        self.stream = stream
        self.fixed = fixed

    def next(self, now: float) -> float:
        return self.stream.next(now) + self.fixed


class Simulation:
    """One run of the timing layer: the learners' processes (:meth:`learner_loop`), the
    links, the PS and the protocol on one ``simpy.Environment``; :meth:`run` returns the
    :class:`Trace`.

    The timing layer takes its part of a scenario only: the ``[cluster]`` and
    ``[protocol]`` tables, the timing seed and the folder relative files are read from
    (``asyncsim.drivers.build.simulation_for`` picks them out of a scenario).

    Args:
        cluster: a validated ``[cluster]`` table (:class:`ClusterConfig`).
        protocol: a validated ``[protocol]`` table (:class:`ProtocolConfig`).
        seed: the seed of the timing streams (:attr:`Scenario.timing_seed`).
        base_dir: the folder an empirical delay's CSV path is relative to.
        msg_bytes: bytes of one message (weights or gradient) when the links have a finite
            bandwidth and give no ``bytes``; the engine passes 4 × the model's parameters.
        on_update: ``on_update(version, grads)`` is called after the PS applies update
            ``version``; ``grads`` are the pending-gradient tuples it took. Returning ``False``
            stops the run at that update (the online driver does this on divergence).
        track_reads: keep ``read_refs`` — how many outstanding gradients read each version —
            so a driver can free parameter versions nobody will read again.
    """

    def __init__(self, cluster: ClusterConfig, protocol: ProtocolConfig, *, seed: int,
                 base_dir: Path | None = None, msg_bytes: int | None = None,
                 on_update: OnUpdate | None = None, track_reads: bool = False):
        self.protocol = protocol
        self.seed = seed
        self.env = simpy.Environment()
        c = cluster
        self.learners = c.learners
        self.proto: Protocol = make_protocol(protocol, c.learners)
        self.on_update = on_update
        self.track_reads = track_reads
        self.read_refs: dict[int, int] = {}

        speed = c.speed or (1.0,) * c.learners
        each = isinstance(c.compute, tuple)
        self.compute = self._streams(
            [(c.compute[i] if each else c.compute,
              f"cluster.compute[{i}]" if each else "cluster.compute") for i in range(c.learners)],
            STREAM_COMPUTE, base_dir, scale=[1.0 / v for v in speed])
        self.pull = [self._link(c.network.pull, "pull", STREAM_PULL, i, msg_bytes, base_dir)
                     for i in range(c.learners)]
        self.push = [self._link(c.network.push, "push", STREAM_PUSH, i, msg_bytes, base_dir)
                     for i in range(c.learners)]
        # The PS's shared interface (timing/links.py), None when it costs nothing.
        self.egress, self.pull_bytes = self._shared(c.network.ps_egress, c.network.pull,
                                                    msg_bytes, "ps_egress")
        self.ingress, self.push_bytes = self._shared(c.network.ps_ingress, c.network.push,
                                                     msg_bytes, "ps_ingress")
        if c.ps_service is not None:
            self.service = delays.DelayStream(
                delays.make_delay(c.ps_service, key="cluster.ps_service", base_dir=base_dir),
                stream_rng(self.seed, STREAM_SERVICE, _PS), _PS, key="cluster.ps_service")
            self.ps = simpy.Resource(self.env, capacity=1)
        else:
            self.service = None
            self.ps = None

        self.version = 0
        self.n_applied = 0
        self.stopped = False
        self.stop_reason = ""
        self._stop = self.env.event()
        # Trace columns as typed ``array.array`` buffers (GRAD_COLUMNS / UPDATE_COLUMNS order),
        # appended through bound methods. Not tuples per row: millions of small tuples make
        # the cyclic garbage collector rescan them, which once made this 2x slower. Not lists
        # of Python numbers either: converting 200k scattered float objects to numpy took a
        # third of a trace-only run; a typed buffer becomes an ndarray with one memcpy.
        self._gcols: list[array] = [_column(t) for t in GRAD_COLUMNS.values()]
        self._ucols: list[array] = [_column(t) for t in UPDATE_COLUMNS.values()]
        self._gapp = tuple(c.append for c in self._gcols)
        self._uapp = tuple(c.append for c in self._ucols)
        self._max_updates: int | None = None
        self._max_gradients: int | None = None
        self._max_time: float | None = None
        self._max_still: int | None = None
        # env.now at the last check, and the version it has stood at since
        self._still_at, self._still_from = math.nan, 0
        self._progress = None
        # cluster.availability: per learner its (up, down) streams, its process (to
        # interrupt), the event "it is up again" while it is down, and its open down row.
        self.avail = self._availability(c.availability, base_dir)
        self._procs: list[Any] = [None] * c.learners
        self._back: list[simpy.Event | None] = [None] * c.learners
        self._open = [-1] * c.learners
        self._idle_downs = 0  # losses in a row with no gradient applied in between
        self._applied_mark = -1
        self._dcols: list[array] = [_column(t) for t in DOWN_COLUMNS.values()]

    def _link(self, cfg, direction, stream, learner, msg_bytes, base_dir):
        key = f"cluster.network.{direction}.latency"
        model = delays.make_delay(cfg.latency, key=key, base_dir=base_dir)
        nbytes = cfg.bytes if cfg.bytes is not None else (msg_bytes or 0)
        fixed = 0.0 if math.isinf(cfg.bandwidth) else _transfer_time(
            nbytes, cfg.bandwidth, f"cluster.network.{direction}")
        if isinstance(model, delays.Constant) and getattr(model, "value", None) == 0.0:
            return _Zero if fixed == 0.0 else _Const(fixed)
        return _Link(delays.DelayStream(model, stream_rng(self.seed, stream, learner), learner,
                                        block=_BLOCK, key=key),
                     fixed)

    def _streams(self, items, stream: int, base_dir, *, scale=None) -> list[delays.DelayStream]:
        """One DelayStream per learner, ``items[i] = (spec, scenario key)``, each drawing from
        its own ``(stream, learner)`` Generator; one model object per distinct spec (a spec
        given for all learners is built once: an empirical one reads its file once)."""
        models: dict[int, delays.DelayModel] = {}
        out = []
        for i, (spec, key) in enumerate(items):
            if id(spec) not in models:
                models[id(spec)] = delays.make_delay(spec, key=key, base_dir=base_dir)
            out.append(delays.DelayStream(models[id(spec)], stream_rng(self.seed, stream, i), i,
                                          scale=1.0 if scale is None else scale[i],
                                          block=_BLOCK, key=key))
        return out

    def _availability(self, cfg, base_dir) -> list[tuple[delays.DelayStream, ...]] | None:
        """Per learner, its (up, down) streams; None without ``cluster.availability``."""
        if cfg is None:
            return None
        each = isinstance(cfg, tuple)
        tables = [(cfg[i], f"cluster.availability[{i}]") if each else (cfg, "cluster.availability")
                  for i in range(self.learners)]
        up = self._streams([(a.up, f"{key}.up") for a, key in tables], STREAM_UP, base_dir)
        down = self._streams([(a.down, f"{key}.down") for a, key in tables], STREAM_DOWN,
                             base_dir)
        return list(zip(up, down, strict=True))

    def _shared(self, cfg, link, msg_bytes, direction) -> tuple[SharedLink | None, float]:
        nbytes = link.bytes if link.bytes is not None else (msg_bytes or 0)
        if cfg is None or math.isinf(cfg.bandwidth) or nbytes == 0:
            return None, 0.0
        _transfer_time(nbytes, cfg.bandwidth, f"cluster.network.{direction}")
        return SharedLink(self.env, cfg.bandwidth, cfg.sharing), float(nbytes)

    # ------------------------------------------------------------------ hooks for protocols
    def compute_time(self, learner: int) -> float:
        return self.compute[learner].next(self.env.now)

    def schedule_rng(self) -> np.random.Generator:
        return stream_rng(self.seed, STREAM_SCHEDULE, _PS)

    def normal_steps(self, learner: int):
        """fixed-delay ``normal`` schedule: normal step times, mean 1, cv ``protocol.cv``."""
        cv = self.proto.cv
        return delays.DelayStream(delays.make_delay({"dist": "normal", "mean": 1.0, "std": cv}),
                                  stream_rng(self.seed, STREAM_SCHEDULE, learner), learner,
                                  key="protocol.cv")

    def note_pull(self, learner: int, version: int) -> None:
        if self.track_reads:
            self.read_refs[version] = self.read_refs.get(version, 0) + 1

    def learner_loop(self, learner: int, compute: delays.DelayStream | None = None):
        """The SimPy process of one learner: pull, compute, push, forever.

        A step's parts, each timed here with its own event: the protocol's pull gate
        (:meth:`Protocol.may_pull`), the PS serving the pull (``cluster.ps_service``), the
        weights' way out (the PS's shared egress, then the learner's pull link: store and
        forward), the computation, the gradient's way in (the learner's push link, then the
        PS's shared ingress), the PS serving the push; then the protocol takes the gradient
        (:meth:`Protocol.on_arrival`). A link's time is drawn when the message reaches it.
        Going down (``cluster.availability`` interrupts this process) loses the step under
        way (:meth:`_down`)."""
        env = self.env
        timeout = env.timeout
        proto = self.proto
        # Protocols without a pull gate (async, softsync) skip the call on the hot path.
        gate = proto.may_pull if type(proto).may_pull is not Protocol.may_pull else None
        arrive = proto.on_arrival
        comp = (compute or self.compute[learner]).next
        pull, push = self.pull[learner], self.push[learner]
        egress, ingress = self.egress, self.ingress
        pull_bytes, push_bytes = self.pull_bytes, self.push_bytes
        serve = self._serve if self.ps is not None else None
        track = self.track_reads
        self._procs[learner] = env.active_process  # cluster.availability interrupts it
        batch = 0
        t_pull = math.nan
        while True:
            read = -1  # not pulled yet
            try:
                if gate is not None:
                    ev = gate(self, learner, batch)
                    if ev is not None:
                        yield ev
                if serve is not None:
                    yield from serve()
                read = self.version
                t_pull = env.now
                if track:
                    self.note_pull(learner, read)
                if egress is not None:
                    yield egress.transfer(pull_bytes)
                if pull is not _Zero:
                    yield timeout(pull.next(t_pull))
                yield timeout(comp(env.now))
                t_push = env.now
                if push is not _Zero:
                    yield timeout(push.next(t_push))
                if ingress is not None:
                    yield ingress.transfer(push_bytes)
                if serve is not None:
                    yield from serve()
            except simpy.Interrupt:
                # Down: the gradient under way is lost; back up, the learner pulls afresh
                # and computes the same batch again.
                yield from self._down(learner, batch, read, t_pull)
                continue
            arrive(self, (learner, batch, read, t_pull, t_push, env.now))
            batch += 1

    def _serve(self):
        """The PS serving one message (``cluster.ps_service``): one at a time, in order."""
        with self.ps.request() as req:
            yield req
            yield self.env.timeout(self.service.next(self.env.now))

    def _down(self, learner: int, batch: int, read: int, t_pull: float):
        """Learner ``learner`` went down with ``batch`` pulled at version ``read`` (-1: none
        pulled): record the loss, let the protocol go on without it, wait until it is up."""
        lost = read >= 0
        self._open[learner] = len(self._dcols[0])
        # Only losses count: a learner that goes down waiting (at a barrier) is not a sign
        # that nothing gets through.
        if lost and self.n_applied != self._applied_mark:
            self._applied_mark, self._idle_downs = self.n_applied, 0
        elif lost:
            self._idle_downs += 1
            if self._idle_downs > _MAX_IDLE_DOWNS:
                raise ScenarioError("cluster.availability", f"{_MAX_IDLE_DOWNS} gradients "
                                    f"lost in a row, none applied (t = {self.env.now:.6g})"
                                    ": the up periods are too short for a step's compute and "
                                    "network time")
        for col, value in zip(self._dcols, (learner, self.env.now, math.inf,
                                            batch if lost else -1, read,
                                            t_pull if lost else math.nan), strict=True):
            col.append(value)
        if lost and self.track_reads:
            left = self.read_refs[read] - 1
            if left:
                self.read_refs[read] = left
            else:
                del self.read_refs[read]
        away = self.proto.on_lost(self, learner)
        back = self._back[learner] = self.env.event()
        yield back
        if away:
            self.proto.on_back(self, learner)

    def _availability_loop(self, learner: int):
        """The SimPy process of one learner's availability: up, down, up, ... from t = 0."""
        env = self.env
        up, down = self.avail[learner]
        while True:
            yield env.timeout(up.next(env.now))
            proc = self._procs[learner]
            if proc is None:
                raise ScenarioError("cluster.availability", f"protocol "
                                    f"{self.protocol.kind!r} runs no learner loops "
                                    "(Simulation.learner_loop) to take down")
            # The learner's process records the period (it knows what it loses); an
            # interruption is urgent, so that happens before this process goes on.
            proc.interrupt("down")
            yield env.timeout(down.next(env.now))
            self._dcols[2][self._open[learner]] = env.now
            back, self._back[learner] = self._back[learner], None
            back.succeed()
            # Go on after the learner (it waits on this event first), so that, as from t = 0,
            # its next step is scheduled before this up period's end: at a tie, the step
            # happens first.
            yield back

    # ------------------------------------------------------------------ the PS update
    def apply_update(self, grads: Iterable[tuple]) -> None:
        """Record one update taking ``grads`` (at least one: ScenarioError under
        ``protocol.kind`` for none) at the current version, then bump the version."""
        if self.stopped:
            return
        v = self.version
        now = self.env.now
        cols = self._gcols
        start = len(cols[0])
        (a_learner, a_batch, a_read, a_apply, a_stale, a_pull, a_push, a_arrive,
         a_tapply) = self._gapp
        for learner, batch, read, t_pull, t_push, t_arrive in grads:
            a_learner(learner)
            a_batch(batch)
            a_read(read)
            a_apply(v)
            a_stale(v - read)
            a_pull(t_pull)
            a_push(t_push)
            a_arrive(t_arrive)
            a_tapply(now)
        n = len(cols[0]) - start
        if not n:
            # Every update takes a gradient (the trace's n_grads >= 1; the core steps by
            # their sum): a plug-in's empty update is refused here, in trace-only and full
            # runs alike, not as a stacking error inside the update core.
            raise ScenarioError("protocol.kind", f"protocol {self.protocol.kind!r} applied "
                                "an update without gradients; sim.apply_update takes the "
                                "update's gradients, at least one")
        u = self._uapp
        u[0](v)
        u[1](now)
        u[2](n)
        u[3](start)
        self.version = v + 1
        self.n_applied += n
        if self.track_reads:
            refs = self.read_refs
            for read in cols[2][start:]:
                left = refs[read] - 1
                if left:
                    refs[read] = left
                else:
                    del refs[read]
        if self.on_update is not None:
            taken = list(zip(cols[0][start:], cols[1][start:], cols[2][start:], cols[4][start:],
                             strict=True))
            if self.on_update(v, taken) is False:
                self._finish("stopped by the driver")
                return
        if not (self.version & 255):
            self._every_256()
        if self._max_updates is not None and self.version >= self._max_updates:
            self._finish("updates")
        elif self._max_gradients is not None and self.n_applied >= self._max_gradients:
            self._finish("gradients")

    def _every_256(self) -> None:
        """Every 256 updates: the progress bar, and the checks that cost nothing per event
        (time that overflowed or stands still)."""
        if self._progress is not None:
            self._progress.update(256)
        now = self.env.now
        if now != self._still_at:
            self._still_at, self._still_from = now, self.version
            if now == math.inf:
                self._not_finite()
        elif self._max_still is not None and self.version - self._still_from > self._max_still:
            raise ScenarioError("cluster.compute", f"simulated time stands still at t = "
                                f"{now:.6g}: {self.version - self._still_from} updates at "
                                f"one instant, so run.sim_time = {self._max_time:g} is never "
                                "reached; compute and link times must take time (a "
                                "positive mean)")

    def _not_finite(self) -> None:
        raise ScenarioError("cluster.compute", f"simulated time overflowed (t = inf by update "
                            f"{self.version}): the compute, link and PS service times add up "
                            "beyond the largest float (1.8e308); give times that sum to a "
                            "finite run")

    def _finish(self, reason: str) -> None:
        self.stopped = True
        self.stop_reason = reason
        if not self._stop.triggered:
            self._stop.succeed()

    # ------------------------------------------------------------------ running
    def run(self, *, max_updates: int | None = None, max_gradients: int | None = None,
            max_time: float | None = None, progress: bool = False) -> Trace:
        """Simulate until a limit is reached and return the trace.

        With ``max_time`` the run ends at that simulated time; gradients still in flight or
        waiting in a softsync/hardsync buffer then are not in the trace (never applied).
        """
        if max_updates is None and max_gradients is None and max_time is None:
            raise ValueError("give max_updates, max_gradients or max_time")
        self._max_updates = max_updates
        self._max_gradients = max_gradients
        self._max_time = max_time
        # Only a run that simulated time alone ends can hang on time that stands still.
        self._max_still = (_MAX_STILL_UPDATES + 10 * self.learners
                           if max_updates is None and max_gradients is None else None)
        if progress:
            from tqdm.auto import tqdm

            self._progress = tqdm(total=max_updates, unit="upd", mininterval=0.5,
                                  leave=False, disable=None)
        self.proto.start(self)
        if self.avail is not None:
            for learner in range(self.learners):
                self.env.process(self._availability_loop(learner))
        until: Any = self._stop
        if max_time is not None:
            timer = self.env.timeout(max_time)
            timer.callbacks.append(lambda _: self._finish("sim_time"))
        try:
            self.env.run(until=until)
        finally:
            if self._progress is not None:
                self._progress.close()
        if not math.isfinite(self.env.now):
            self._not_finite()
        return self.trace()

    def trace(self) -> Trace:
        meta = {"stop_reason": self.stop_reason, "sim_time": float(self.env.now),
                "learners": self.learners, "protocol": self.protocol.kind,
                "seed": self.seed}
        revision = timing_revision(self.protocol)
        if revision is not None:
            meta["timing_revision"] = revision
        g = {k: _to_numpy(c) for k, c in zip(GRAD_COLUMNS, self._gcols, strict=True)}
        u = {k: _to_numpy(c) for k, c in zip(UPDATE_COLUMNS, self._ucols, strict=True)}
        d = {k: _to_numpy(c) for k, c in zip(DOWN_COLUMNS, self._dcols, strict=True)}
        return Trace.from_columns(g, u, meta, d)


def _transfer_time(nbytes: float, bandwidth: float, key: str) -> float:
    """Seconds for ``nbytes`` at ``bandwidth``; a ScenarioError under ``key.bandwidth``
    where that is not a finite time (a bandwidth of 1e-320 bytes/s)."""
    t = nbytes / bandwidth
    if not math.isfinite(t):
        raise ScenarioError(f"{key}.bandwidth", f"{nbytes:g} bytes at {bandwidth!r} bytes/s "
                            f"take longer than any finite time; allowed: a bandwidth of at "
                            f"least {nbytes / 1e300:.3g} bytes/s (inf = free)")
    return t


class _Const:
    __slots__ = ("value",)

    def __init__(self, value: float):
        self.value = value

    def next(self, now: float) -> float:
        return self.value


def _column(dtype) -> array:
    """An empty typed buffer for a trace column: float64 or int64 (narrowed in Trace)."""
    return array("d" if np.issubdtype(dtype, np.floating) else "q")


def _to_numpy(col: array) -> np.ndarray:
    """A copy of a typed column (a copy, so the simulation may keep appending to it)."""
    return np.frombuffer(col, dtype=np.float64 if col.typecode == "d" else np.int64).copy()
