"""Parameter-server protocols: when an update happens and which gradients it takes.

A protocol sees only timing (which learner pushed what, when) — never gradient values — so
it runs unchanged in trace-only, online and real (Ray) runs. Built-ins (P1, P2, Ho et al.):

``hardsync``
    The PS waits for one gradient from every learner, averages them and updates; learners
    wait for the new version before pulling (a barrier). τ ≡ 0; SGD with batch μλ.
``softsync`` (``n``)
    P1's n-softsync: the PS updates after any c = ⌊λ/n⌋ gradients arrive (a fast learner may
    contribute twice); no barrier. n = 1 is close to synchronous, n = λ is async.
``async``
    One update per gradient (= λ-softsync), Downpour-style.
``fixed-delay`` (``tau``, ``schedule``)
    P2's simulation of delay with N = τ+1 workers on one device: each step one worker applies
    the gradient it computed on the copy it last pulled, then pulls the new version.
    ``round-robin`` gives staleness exactly τ after the first τ updates; ``random`` picks a
    uniformly random worker each step (geometric staleness); ``normal`` is P2's official
    draw, worker k with probability ∝ Φ((s_k − loc)/scale) (``loc``, ``scale``: N and N/4);
    ``race`` (not P2's) lets the workers race with normal step times (mean 1, coefficient of
    variation ``cv``), which concentrates the delays near N − 1.
``ssp`` (``s``)
    Stale synchronous parallel (Ho et al., NIPS 2013): each gradient is applied on arrival,
    but a learner whose clock (its number of pushed gradients) leads the slowest learner's by
    more than ``s`` waits before pulling. The bound is on clocks, as SSP defines it; the PS
    staleness of a gradient is not bounded by s (it still grows with λ).

Learners that come and go (``cluster.availability``, and a real run's lost learners) reach
a protocol through :meth:`Protocol.on_lost` / :meth:`Protocol.on_back`: ``hardsync`` rounds
complete with the learners that are up (a learner that went down after delivering its
gradient counts in that round, not the next ones, until it is back; back, it rejoins at the
next round, or at once when no learner is left in this one); ``ssp`` bounds clocks
over the live learners, and one that is back rejoins the bound with its own clock (its
gradients count, so the others wait for it to catch up to within s, as for any slow
learner); ``softsync`` keeps c: with fewer than c learners up, the live ones fill each update
(one may contribute several gradients), and with none up no update happens; ``async`` and
``fixed-delay`` (``race``) just see fewer arrivals.

Plug-ins: subclass :class:`Protocol`, decorate with :func:`register_protocol` or expose it
through the entry-point group ``asyncsim.protocols``. A protocol's options are the keyword
parameters of its ``__init__(self, learners, *, ...)``, the built-ins' as a plug-in's:
``protocol = { kind = "softsync", n = 4 }`` builds ``Softsync(learners, n=4)``, checked by
the one option checker of every plug-in kind (:func:`make_protocol`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from asyncsim import _checks
from asyncsim._registry import (
    PluginRegistry,
    build,
    check_options,
    option_defaults,
    signature_options,
)
from asyncsim.config import ProtocolConfig
from asyncsim.errors import ScenarioError

if TYPE_CHECKING:  # pragma: no cover
    from asyncsim.timing.cluster import Simulation


def _adapt(obj: object, name: str) -> type[Protocol]:
    if not (isinstance(obj, type) and issubclass(obj, Protocol)):
        raise TypeError(f"a protocol must be a subclass of asyncsim.protocols.Protocol, "
                        f"got {obj!r}")
    obj.name = name
    return obj


_registry: PluginRegistry[type[Protocol]] = PluginRegistry(
    "asyncsim.protocols", "protocol", "protocol.kind", adapt=_adapt)


def register_protocol(name: str, *, replace: bool = False
                      ) -> Callable[[type[Protocol]], type[Protocol]]:
    """Class decorator: make a :class:`Protocol` usable as ``protocol.kind = name``.

    Installed packages can also expose a Protocol subclass under the entry-point group
    ``asyncsim.protocols`` (docs/plugins.md); a name registered here wins over it. A name
    taken by another class is a ValueError naming both unless ``replace``
    (:meth:`asyncsim._registry.PluginRegistry.register`, the rule of every plug-in kind).
    """
    return _registry.decorator(name, replace=replace)


def available_protocols() -> list[str]:
    """Names of all protocols: built-ins, registered classes and entry points, sorted."""
    return _registry.names()


def get_protocol_class(kind: str) -> type[Protocol]:
    """The protocol class of ``protocol.kind``; ScenarioError for an unknown name."""
    return _registry.get(kind)


def make_protocol(cfg: ProtocolConfig, learners: int) -> Protocol:
    """The protocol ``[protocol]`` describes, for ``learners`` learners (``cluster.learners``).

    The options (every key of the table but ``kind``) are checked against the class's
    ``__init__(self, learners, *, ...)`` signature by the one option checker of every
    plug-in kind (:func:`asyncsim._registry.build`: unknown keys listed, annotated types
    checked); ``__init__`` refuses values with ``ValueError("<option>: ...")``, reported as
    ``protocol.<option>``, and a cluster size it cannot run with as
    ``ValueError("learners: ...")``, reported as ``cluster.learners``.

    Raises:
        ScenarioError: an unknown kind, an unknown, missing or wrong-typed option, a value
            the protocol refuses; one line naming the key.
    """
    cls = get_protocol_class(cfg.kind)
    try:
        return build(cls, cfg.options, key="protocol", what="protocol", name=cfg.kind,
                     noun="option", fixed={"learners": learners})
    except ScenarioError as e:
        if e.key == "protocol.learners":
            raise ScenarioError("cluster.learners", e.message, file=e.file) from None
        raise


def protocol_options(cfg: ProtocolConfig) -> dict[str, Any]:
    """The options of ``cfg`` with the defaults of its protocol's signature filled in
    (fixed-delay's ``schedule = "round-robin"`` where the file gives none), checked."""
    cls = get_protocol_class(cfg.kind)
    given = check_options(cls, cfg.options, key="protocol", what="protocol", name=cfg.kind,
                          noun="option", exclude=("learners",))
    return {**option_defaults(cls), **given}


class Protocol:
    """Base class. The simulation calls the hooks; a protocol calls ``sim.apply_update``.

    A pending gradient is a tuple ``(learner, batch, read_version, t_pull, t_push, t_arrive)``.

    A protocol may declare ``options_strategy(learners)``, a classmethod returning a
    hypothesis strategy of option tables valid for ``learners`` learners, or None where it
    cannot run on that many; :func:`asyncsim.testing.protocols` draws from it (without it,
    from strategies derived from the ``__init__`` signature).
    """

    name: ClassVar[str] = "base"

    def __init__(self, learners: int):
        """Options of a protocol are the keyword-only parameters of its ``__init__``, after
        ``learners`` (``cluster.learners``): ``protocol = { kind = "every-k", k = 3 }`` calls
        ``EveryK(learners, k=3)`` (:func:`make_protocol` checks the table against the
        signature first). Refuse a value with ``ValueError("<option>: ...")``."""
        self.learners = learners

    def updates_per_gradient(self) -> float:
        """Expected updates per gradient (used to convert run lengths and epochs)."""
        return 1.0

    def nominal_staleness(self) -> float | None:
        """The delay this protocol is named for, or None where it has none: the staleness
        ``optimizer.lr_staleness = "nominal"`` gives every gradient's rate (P2's official
        regimes set eta_tau from the nominal delay, by hand)."""
        return None

    def start(self, sim: Simulation) -> None:
        """Start the SimPy processes. Default: every learner runs the pull/compute/push loop."""
        for learner in range(self.learners):
            sim.env.process(sim.learner_loop(learner))

    def may_pull(self, sim: Simulation, learner: int, batch: int):
        """An event to wait for before learner's ``batch``-th pull, or None to go ahead."""
        return None

    def on_arrival(self, sim: Simulation, grad: tuple) -> None:
        """A gradient reached the PS; call ``sim.apply_update([...])`` when an update is due.

        Called from the learner's SimPy process (``sim.env.active_process`` is that
        learner's); an exception raised here fails that process, and SimPy re-raises it
        out of ``sim.run`` (a copy of it, with the original as its ``__cause__``)."""
        raise NotImplementedError

    def on_lost(self, sim: Simulation, learner: int) -> bool:
        """``learner`` is gone: a real run's actor died, or a simulated learner went down
        (``cluster.availability``). The gradient it had pulled, if any, is lost; it may
        also be waiting to pull (its last gradient already delivered).

        Return True if the protocol goes on without that learner until :meth:`on_back`
        (called once the restarted actor answers, or the learner is up again; it then pulls
        through :meth:`may_pull`), False (default) if it still expects the learner's next
        gradient (a real PS re-sends the same batch to the restarting actor at once).
        """
        return False

    def on_back(self, sim: Simulation, learner: int) -> None:
        """``learner``, gone (``on_lost`` returned True), is back."""


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


# fixed-delay's "normal" schedule: loc and scale in staleness units. Far outside these the
# draw is round-robin's (the stalest worker: loc far above every staleness, a tiny scale) or
# random's (loc far below, a huge scale), and (s - loc) / scale or its square overflows.
_NORMAL_RANGE = {"loc": (-1e6, 1e6), "scale": (1e-6, 1e6)}
_NORMAL_DEFAULT = {"loc": "N = tau + 1", "scale": "N / 4"}
_RACE_CV = 0.1  # fixed-delay "race" schedule: the spread of the workers' step times


@register_protocol("fixed-delay")
class FixedDelay(Protocol):
    """P2's one-device simulation of delay (``trainer.py`` of P2's official code,
    ``_schedule_worker``): N = tau + 1 workers, one step at a time; each step the scheduled
    worker applies the gradient it computed on the copy it pulled after its own last push.

    Schedules: ``round-robin`` (worker ``step % N``: staleness exactly tau after the first
    tau steps); ``random`` (a uniformly random worker); ``normal`` (P2's official draw:
    worker k with probability proportional to ``Phi((s_k - loc) / scale)``, s_k the updates
    since k last pushed, ``loc = N`` and ``scale = N / 4`` by default, as
    ``norm.cdf(staleness, loc=W, scale=W/4)``); ``race`` (not P2's: the workers race with
    normal step times, mean 1 and spread ``cv``, i.e. plain async timing, which
    concentrates the delays near N - 1).
    """

    SCHEDULES = ("round-robin", "random", "normal", "race")
    # Generated traces (asyncsim.testing) keep tau small: P2's delays go up to 32, but the
    # properties tested hold at any tau.
    MAX_TAU = 16

    def __init__(self, learners: int, *, tau: int, schedule: str = "round-robin",
                 cv: float = _RACE_CV, loc: float | None = None, scale: float | None = None):
        """Args:
            tau: the delay; uses tau + 1 workers (cluster.learners)
            schedule: the worker schedule: round-robin / random / normal (P2's official
                draw) / race
            cv: "race" schedule: spread of the workers' step times
            loc: "normal" schedule: worker k is drawn with probability proportional to
                Phi((staleness_k - loc) / scale); None: P2's official loc = tau + 1
            scale: "normal" schedule: see loc; None: P2's official (tau + 1) / 4
        """
        super().__init__(learners)
        self.tau = _checks.integer("tau", tau, low=0)
        if learners != tau + 1:
            raise ValueError(f"learners: fixed-delay runs tau + 1 = {tau + 1} workers; leave "
                             f"cluster.learners out or set it to {tau + 1}")
        self.schedule = _checks.choice("schedule", schedule, self.SCHEDULES, what="schedule")
        self.cv = _checks.nonneg("cv", cv)
        if cv != _RACE_CV and schedule != "race":
            raise ValueError(f"cv: is read by the \"race\" schedule only; this schedule is "
                             f"{schedule!r}")
        for key, value in (("loc", loc), ("scale", scale)):
            if value is None:
                continue
            if schedule != "normal":
                raise ValueError(f"{key}: is read by the \"normal\" schedule only; this "
                                 f"schedule is {schedule!r}")
            low, high = _NORMAL_RANGE[key]
            if not low <= value <= high:
                raise ValueError(f"{key}: must be a finite number"
                                 + (" > 0" if key == "scale" else "") + f", in {low:g}.."
                                 f"{high:g} (staleness units, P2's default "
                                 f"{_NORMAL_DEFAULT[key]}; beyond, the draw is "
                                 "round-robin's or random's and Phi((s - loc) / scale) "
                                 f"overflows), got {value}")
        self.loc, self.scale = loc, scale

    @classmethod
    def options_strategy(cls, learners):
        from hypothesis import strategies as st

        if not 1 <= learners <= cls.MAX_TAU + 1:
            return None  # tau + 1 workers, tau in 0..MAX_TAU

        def table(schedule):
            if schedule != "race":
                return st.just({"tau": learners - 1, "schedule": schedule})
            return st.floats(0.01, 0.5, allow_nan=False).map(
                lambda cv: {"tau": learners - 1, "schedule": "race", "cv": cv})

        return st.sampled_from(cls.SCHEDULES).flatmap(table)

    def nominal_staleness(self):
        return float(self.tau)

    def start(self, sim):
        if self.schedule == "race":
            for learner in range(self.learners):
                sim.env.process(sim.learner_loop(learner, compute=sim.normal_steps(learner)))
        else:
            sim.env.process(self._serial(sim))

    def on_arrival(self, sim, grad):
        sim.apply_update((grad,))

    def _serial(self, sim):
        """P2's one-device simulation: one worker steps at a time."""
        n = self.learners
        env = sim.env
        reads = [0] * n
        pulled = [0.0] * n
        batches = [0] * n
        for k in range(n):
            sim.note_pull(k, 0)
        rng = sim.schedule_rng()
        schedule = self.schedule
        pick = self._normal_draw(n) if schedule == "normal" else None
        step = 0
        while True:
            if schedule == "round-robin":
                k = step % n
            elif pick is None:
                k = int(rng.integers(n))
            else:
                k = pick(rng, [sim.version - r for r in reads])
            yield env.timeout(sim.compute_time(k))
            now = env.now
            sim.apply_update(((k, batches[k], reads[k], pulled[k], now, now),))
            batches[k] += 1
            reads[k] = sim.version
            pulled[k] = now
            sim.note_pull(k, sim.version)
            step += 1

    def _normal_draw(self, n):
        """P2's ``normal`` draw: ``pick(rng, staleness) -> worker`` with probability
        proportional to Phi((s_k - loc) / scale), by one uniform draw against the cumulative
        weights (float64, in worker order). The weights are Phi / max Phi, computed from log
        Phi, so a far tail (loc many scales above every staleness) still favours the
        stalest workers instead of underflowing to zero."""
        loc = float(n) if self.loc is None else float(self.loc)
        scale = n / 4.0 if self.scale is None else float(self.scale)

        def pick(rng, staleness):
            logs = [_log_phi((s - loc) / scale) for s in staleness]
            top = max(logs)
            weights = [math.exp(v - top) for v in logs]
            cum = list(itertools.accumulate(weights))
            k = bisect.bisect_right(cum, rng.random() * cum[-1])
            # u * total may round up to total: the last worker with a weight, never one
            # with none.
            return k if k < n else max(i for i, w in enumerate(weights) if w > 0)

        return pick


def _log_phi(x: float) -> float:
    """log Phi(x), the log of the standard normal CDF, accurate in both tails: erfc down
    to x = -30 (Phi(-30) ~ 5e-198), below that the Mills-ratio series
    Phi(x) ~ phi(x) / |x| (1 - 1/x^2 + 3/x^4), whose next term is 15/x^6 < 2e-8."""
    if x > -30.0:
        return math.log(0.5 * math.erfc(-x / math.sqrt(2.0)))
    return (-0.5 * x * x - math.log(-x) - 0.5 * math.log(2.0 * math.pi)
            + math.log1p(-1.0 / x**2 + 3.0 / x**4))


def drop_defaults(d: dict[str, Any]) -> dict[str, Any]:
    """``d``, a scenario as a nested dict (a run folder's scenario.toml), without the
    ``[protocol]`` options at their defaults, so a record that spells out a default equals
    one that leaves it out: the protocol's own defaults, and fixed-delay's ``schedule`` and
    ``cv`` defaults under a protocol that takes neither (run folders of asyncsim <= 0.3
    record them). A kind not installed here keeps its table as written. Changes ``d``."""
    proto = d.get("protocol")
    if not isinstance(proto, dict):
        return d
    try:
        cls = get_protocol_class(proto.get("kind", ProtocolConfig.kind))
    except ScenarioError:
        return d
    own, legacy = option_defaults(cls), option_defaults(FixedDelay)
    params = signature_options(cls)[0]
    for k in [k for k in proto if k != "kind"]:
        default = own.get(k, _NONE) if k in params else legacy.get(k, _NONE)
        if default is not None and proto[k] == default:
            del proto[k]
    return d


_NONE = object()


def timing_revision(cfg: ProtocolConfig) -> str | None:
    """A mark for timing whose meaning changed between asyncsim versions, so a sweep's
    shared trace or a checkpoint made before is not reused under the new meaning: fixed-delay
    ``schedule = "normal"`` is P2's Phi draw since asyncsim 0.3 (before, the racing model now
    called ``race``). None where nothing changed."""
    if cfg.kind == "fixed-delay" and cfg.options.get("schedule") == "normal":
        return "normal=phi-draw"
    return None
