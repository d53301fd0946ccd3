"""``fixed-delay``: P2's simulation of delay (Giladi et al. 2020) with N = tau + 1 workers on
one device; each step one worker applies the gradient it computed on the copy it last pulled,
then pulls the new version. Its schedules pick that worker: ``round-robin``, ``random``, P2's
official ``normal`` draw, or ``race`` (the workers race with normal step times)."""

from __future__ import annotations

import bisect
import itertools
import math

from asyncsim import _checks
from asyncsim.timing.protocols.base import Protocol, register_protocol

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
