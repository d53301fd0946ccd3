"""Trace-only throughput vs a bare SimPy loop of the same shape (issue: foundation, speed).

Measures, side by side in one process:
  * asyncsim: lambda = 100 learners, async, exponential compute times, trace recorded;
  * bare: 100 SimPy processes that each loop ``yield env.timeout(rng.exponential())`` and
    count, with no protocol, no trace, no run folder;
and reports gradient events per second and their ratio (target >= 0.5), then times the
lambda = 1000 x 1,000,000-gradient run (target < 60 s on 2 cores), and what loading its saved
trace costs, the hash check that :meth:`asyncsim.trace.Trace.load` makes included.

    python benchmarks/bench_trace.py [--events 200000] [--big 1000000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import simpy

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Report

from asyncsim.api import simulate
from asyncsim.scenario import load_scenario
from asyncsim.trace import Trace


def bare(learners: int, events: int, seed: int = 0) -> float:
    env = simpy.Environment()
    rngs = [np.random.default_rng([seed, i]) for i in range(learners)]
    state = {"n": 0}
    done = env.event()

    def learner(i):
        rng = rngs[i]
        while True:
            yield env.timeout(rng.exponential(1.0))
            state["n"] += 1
            if state["n"] == events and not done.triggered:
                done.succeed()

    for i in range(learners):
        env.process(learner(i))
    t0 = time.perf_counter()
    env.run(until=done)
    return time.perf_counter() - t0


def ours(learners: int, events: int) -> tuple[float, Trace]:
    scn = load_scenario({"cluster": {"learners": learners,
                                     "compute": {"dist": "exponential", "mean": 1.0}},
                         "protocol": {"kind": "async"}, "run": {"gradients": events}})
    t0 = time.perf_counter()
    trace = simulate(scn)
    dt = time.perf_counter() - t0
    assert trace.num_gradients == events
    return dt, trace


def load_cost(trace: Trace, repeat: int) -> tuple[float, float]:
    """Seconds to load ``trace`` saved in a run folder (its hash checked) and to hash it,
    best of ``repeat``."""
    with tempfile.TemporaryDirectory() as d:
        trace.save(d)
        load = min(_timed(lambda: Trace.load(d)) for _ in range(repeat))
    return load, min(_timed(trace.hash) for _ in range(repeat))


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--big", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    report = Report("bench_trace", "Trace-only simulation against a bare SimPy loop of the "
                    "same shape; the 1,000-learner run; loading a saved trace")
    # Side by side, round by round: a slow spell hits both in its round.
    rounds = [(bare(100, a.events), ours(100, a.events)[0]) for _ in range(a.repeat)]
    tb, to = (min(r[i] for r in rounds) for i in (0, 1))
    print(f"lambda=100 async exponential, {a.events:,} gradient events (best of {a.repeat}):")
    print(f"  bare SimPy loop : {a.events / tb:>12,.0f} events/s  ({tb:.2f} s)")
    print(f"  asyncsim trace  : {a.events / to:>12,.0f} events/s  ({to:.2f} s)")
    print(f"  ratio asyncsim/bare = {tb / to:.2f}   (target >= 0.5)")
    report.row(f"trace-only, lambda = 100 async, {a.events:,} events: asyncsim / bare SimPy "
               "events per second", tb / to, target=">= 0.5", repeats=[b / o for b, o in rounds])
    if a.big:
        t, trace = ours(1000, a.big)
        print(f"lambda=1000 x {a.big:,} gradients: {t:.1f} s "
              f"({a.big / t:,.0f} events/s; target < 60 s)")
        report.row(f"trace-only, lambda = 1000 x {a.big:,} gradients", t, unit="s",
                   target="< 60")
        load, digest = load_cost(trace, a.repeat)
        print(f"  Trace.load of its folder: {1e3 * load:.0f} ms, of which the trace_hash "
              f"check {1e3 * digest:.0f} ms ({100 * digest / load:.0f}%)")
        report.row("Trace.load of that trace's folder, the trace_hash check included",
                   load, unit="s", note=f"the check: {1e3 * digest:.0f} ms")
    report.save()


if __name__ == "__main__":
    main()
