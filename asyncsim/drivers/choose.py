"""Choosing how to execute a replay or a sweep's points by measuring the candidates here.

:func:`predict_times` times each candidate on short probes of the trace and extrapolates;
:func:`choose_path` picks ``loop`` or ``scan`` for ``asyncsim replay --path auto``,
:func:`sweep_path` one by one or vmapped, loop or scan, for a sweep's hyperparameter points.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asyncsim.config import Scenario
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.replay import replay
from asyncsim.drivers.scan import replay_scan
from asyncsim.drivers.vmapped import replay_vmapped
from asyncsim.numerics.numerics import Numerics
from asyncsim.trace import Trace


def choose_path(scn: Scenario, trace: Trace, *, numerics: Numerics | None = None,
                probe_updates: int = 12) -> str:
    """"loop" or "scan", whichever :func:`predict_times` expects to replay the whole trace
    faster here (both compiled first). Traces with a varying number of gradients per
    update, or too short to probe: "loop"."""
    if trace.num_updates < 8 * probe_updates or trace.uniform_n_grads is None:
        return "loop"
    quiet = _quiet(scn)
    num = numerics or numerics_for(quiet)
    fns = {"loop": replay, "scan": replay_scan}
    predicted = predict_times(
        trace, {p: (lambda probe, fn=fn: fn(quiet, probe, numerics=num)) for p, fn in fns.items()},
        probe_updates=probe_updates)
    return min(predicted, key=predicted.get)


def _quiet(scn: Scenario) -> Scenario:
    """``scn`` evaluating nothing but the end, on one sample: what a timing probe runs (the
    candidates are timed on their updates, not on evaluations)."""
    return dataclasses.replace(scn, run=dataclasses.replace(scn.run, eval_every=0,
                                                            eval_samples=1))


def predict_times(trace: Trace, candidates: Mapping[Any, Any], *, probe_updates: int = 12,
                  rounds: int = 3,
                  clock: Callable[[], float] = time.perf_counter) -> dict[Any, float]:
    """Predicted wall time of each candidate ``fn(probe_trace)`` on the whole ``trace``
    (``clock``: the timer, seconds).

    Each candidate is compiled and warmed up, then timed on the first ``probe_updates`` and
    ``4 * probe_updates`` updates, in ``rounds`` round-robin rounds (best time of each: a
    slow spell of the machine hits every candidate, not only the one it happened to run).
    The two timings give a fixed cost per call and a cost per update, extrapolated to the
    trace's length: a single short probe would favour whichever candidate has the lower
    per-call cost, however much slower its updates are.
    """
    m = trace.num_updates
    short, long = probe_updates, 4 * probe_updates
    probes = {n: trace.truncate(n) for n in (short, long)}
    best = {(key, n): float("inf") for key in candidates for n in probes}
    for fn in candidates.values():
        for probe in probes.values():
            fn(probe)  # compile (once per program) and warm up
    for _ in range(rounds):
        for key, fn in candidates.items():
            for n, probe in probes.items():
                t0 = clock()
                fn(probe)
                best[key, n] = min(best[key, n], clock() - t0)
    predicted = {}
    for key in candidates:
        per_update = max(best[key, long] - best[key, short], 0.0) / (long - short)
        fixed = max(best[key, short] - per_update * short, 0.0)
        predicted[key] = fixed + per_update * m
    return predicted


def sweep_path(scn: Scenario, trace: Trace, hypers: Sequence[Mapping[str, float]], *,
               numerics: Numerics | None = None,
               probe_updates: int = 12) -> tuple[str, str]:
    """How to replay P hyperparameter points over one trace fastest on this machine:
    ``("vmapped" | "single", "loop" | "scan")``.

    Each candidate (the P points one by one with the loop, :func:`replay`, or the scan,
    :func:`replay_scan`; all P at once with :func:`replay_vmapped` on either path) gets a
    predicted time for the whole trace from :func:`predict_times` (one by one: P times one
    point's), and the least wins (a single short probe would charge the one-by-one
    candidates P times for per-call costs that a long trace amortises). The scan
    is a candidate only when every update takes the same number of gradients. So the choice
    is made for this model, batch and backend, as docs/design.md asks (vmapping saves
    dispatches, not FLOPs: it wins clearly on small models and is about even when the FLOPs
    dominate).
    """
    if len(hypers) < 2 or trace.num_updates < 8 * probe_updates:
        return ("single", "loop")
    num = numerics or numerics_for(scn)
    quiet = _quiet(scn)
    paths = ["loop", "scan"] if trace.uniform_n_grads is not None else ["loop"]
    P = len(hypers)

    def call(mode: str, path: str, probe: Trace):
        if mode == "vmapped":
            return replay_vmapped(quiet, probe, hypers, numerics=num, path=path)
        fn = replay if path == "loop" else replay_scan
        return fn(quiet, probe, numerics=num, hyper=hypers[0])

    fns = {(mode, path): (lambda probe, mode=mode, path=path: call(mode, path, probe))
           for path in paths for mode in ("single", "vmapped")}
    return fastest(predict_times(trace, fns, probe_updates=probe_updates), P)


def fastest(predicted: Mapping[tuple[str, str], float], points: int) -> tuple[str, str]:
    """The ``(mode, path)`` of least predicted time for ``points`` points: one by one runs
    them in turn, so its prediction (one point's) counts ``points`` times."""
    total = {k: t * (points if k[0] == "single" else 1) for k, t in predicted.items()}
    return min(total, key=total.get)

