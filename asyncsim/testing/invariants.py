"""Trace invariants, checked by :func:`check_trace` (re-exported by :mod:`asyncsim.testing`).

Each check raises :class:`TraceInvariantError` with a message that names the invariant and
the first offending row, so a failing property test points at the bug.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from asyncsim.config import Scenario
from asyncsim.timing.protocols import protocol_options
from asyncsim.trace import Trace, away_intervals


class TraceInvariantError(AssertionError):
    """A trace violates an invariant of the simulator or of its protocol."""


def _fail(what: str, trace: Trace, rows) -> None:
    rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows)
    if rows.size:
        i = int(rows[0])
        row = {k: trace.grads[k][i].item() for k in trace.grads} if i < trace.num_gradients else {}
        raise TraceInvariantError(f"{what} (first at gradient row {i}: {row}; "
                                  f"{rows.size} rows in all)")


def check_trace(trace: Trace, scenario: Scenario) -> None:
    """Raise :class:`TraceInvariantError` on any violated invariant.

    Generic: staleness = apply_version − read_version ≥ 0; t_pull ≤ t_push ≤ t_arrive ≤
    t_apply; update versions are 0, 1, 2, …; update times never decrease; each update's rows
    are contiguous and carry its version and time; each learner's gradients appear in program
    order (batch 0, 1, 2, …, pulled at non-decreasing times and versions); a gradient reads a
    version that existed at its pull time.

    Per protocol: ``hardsync`` staleness ≡ 0 and one gradient per learner per update (all
    λ learners; in a real run whose meta has ``short_rounds_allowed`` -- a learner died --
    an update may take 1..λ gradients, still from distinct learners);
    ``softsync`` exactly c = ⌊λ/n⌋ gradients per update; ``async``/``ssp``/``fixed-delay`` one;
    ``fixed-delay`` with the round-robin schedule: staleness = min(version, τ); ``ssp``: at
    every pull the learner's clock leads the slowest learner's by at most s.

    Learners that came and went (the trace's ``down`` table, ``cluster.availability``): down
    periods are disjoint per learner, listed in the order they began, within the run; no
    applied gradient was under way while its learner was down; a lost gradient was pulled
    before its learner went down, reads a version that existed then, and is its learner's
    next batch (the one before it arrived first, and it is recomputed only after the
    learner is back). Hardsync rounds then take 1..λ distinct learners, and a learner a
    round goes without was down between the round before and it; the ssp bound holds over
    the learners that were up from the puller's previous arrival to its pull.
    """
    g, u = trace.grads, trace.updates
    n, m = trace.num_gradients, trace.num_updates
    lam = scenario.cluster.learners

    if not np.array_equal(u["version"], np.arange(m)):
        raise TraceInvariantError("update versions are not 0, 1, 2, ...")
    if m and (u["start"][0] != 0 or not np.array_equal(u["start"][1:],
                                                       np.cumsum(u["n_grads"])[:-1])):
        raise TraceInvariantError("update rows are not contiguous (start/n_grads disagree)")
    if int(np.sum(u["n_grads"])) != n:
        raise TraceInvariantError(f"updates take {int(np.sum(u['n_grads']))} gradients, "
                                  f"the trace has {n}")
    if m and np.any(np.diff(u["time"]) < 0):
        raise TraceInvariantError("update times decrease")
    if trace.num_down:
        _check_down(trace, lam)
    if n == 0:
        return
    owner = np.repeat(np.arange(m), u["n_grads"])
    _fail("a row's apply_version differs from its update's version", trace,
          g["apply_version"] != owner)
    _fail("a row's t_apply differs from its update's time", trace,
          g["t_apply"] != u["time"][owner])
    _fail("staleness != apply_version - read_version", trace,
          g["staleness"] != g["apply_version"] - g["read_version"])
    _fail("negative staleness", trace, g["staleness"] < 0)
    _fail("t_pull > t_push", trace, g["t_pull"] > g["t_push"])
    _fail("t_push > t_arrive", trace, g["t_push"] > g["t_arrive"])
    _fail("t_arrive > t_apply", trace, g["t_arrive"] > g["t_apply"])
    _fail("learner id out of range", trace, (g["learner"] < 0) | (g["learner"] >= lam))
    # A gradient reads a version that existed when it was pulled: version r exists from
    # the time update r - 1 was applied.
    created = np.concatenate([[-np.inf], u["time"]])
    _fail("read a version before it existed", trace, created[g["read_version"]] > g["t_pull"])

    for learner in np.unique(g["learner"]):
        rows = np.flatnonzero(g["learner"] == learner)
        b = g["batch"][rows]
        order = np.argsort(b, kind="stable")
        if not np.array_equal(b[order], np.arange(rows.size)):
            _fail(f"learner {learner}'s batches are not 0..{rows.size - 1}", trace, rows)
        if np.any(np.diff(order) < 0):
            _fail(f"learner {learner}'s gradients are applied out of program order", trace, rows)
        _fail(f"learner {learner} pulls at decreasing times", trace,
              rows[1:][np.diff(g["t_pull"][rows]) < 0])
        _fail(f"learner {learner} reads decreasing versions", trace,
              rows[1:][np.diff(g["read_version"][rows]) < 0])

    if trace.num_down:
        _check_lost(trace)
    _check_protocol(trace, scenario)


def _check_down(trace: Trace, lam: int) -> None:
    """The down table on its own: rows in range, in order, disjoint per learner."""
    d = trace.down
    learner, t_down, t_up = d["learner"], d["t_down"], d["t_up"]
    if np.any((learner < 0) | (learner >= lam)):
        raise TraceInvariantError("a down period's learner id is out of range")
    if np.any(np.isnan(t_up)) or np.any(t_up < t_down) or np.any(t_down < 0):
        raise TraceInvariantError("a down period ends before it begins")
    end = trace.meta.get("sim_time")
    if end is not None and np.any(t_down > end):
        raise TraceInvariantError(f"a down period begins after the run ended ({end})")
    if np.any(np.diff(t_down) < 0):
        raise TraceInvariantError("down periods are not listed in the order they began")
    for k in np.unique(learner):
        rows = np.flatnonzero(learner == k)
        if np.any(t_down[rows[1:]] < t_up[rows[:-1]]):
            raise TraceInvariantError(f"learner {k}'s down periods overlap")
    lost = d["batch"] >= 0
    if np.any(d["read_version"][~lost] != -1) or not np.all(np.isnan(d["t_pull"][~lost])):
        raise TraceInvariantError("a down period without a lost gradient names a read version")
    if np.any(d["t_pull"][lost] > t_down[lost]) or np.any(d["read_version"][lost] < 0):
        raise TraceInvariantError("a lost gradient was pulled after its learner went down")


def _check_lost(trace: Trace) -> None:
    """Down periods against the applied gradients (see check_trace)."""
    g, u, d = trace.grads, trace.updates, trace.down
    created = np.concatenate([[-np.inf], u["time"]])
    lost = np.flatnonzero(d["batch"] >= 0)
    if np.any(d["read_version"][lost] > trace.num_updates) or np.any(
            created[np.minimum(d["read_version"][lost], trace.num_updates)]
            > d["t_pull"][lost]):
        raise TraceInvariantError("a lost gradient read a version before it existed")
    for k in np.unique(d["learner"]):
        rows = np.flatnonzero(g["learner"] == k)
        rows = rows[np.argsort(g["batch"][rows], kind="stable")]  # program order
        arrive, pull = g["t_arrive"][rows], g["t_pull"][rows]
        for j in np.flatnonzero(d["learner"] == k):
            a, b = d["t_down"][j], d["t_up"][j]
            # The first of k's gradients to arrive after it went down must be pulled after
            # it was back.
            i = int(np.searchsorted(arrive, a, side="right"))
            if i < rows.size and pull[i] < b:
                _fail(f"learner {k}'s gradient was under way while it was down ({a}..{b})",
                      trace, [rows[i]])
            batch = int(d["batch"][j])
            # Its next batch: all before it had arrived. Those may be missing from the trace
            # only at its end (arrived, but in a buffer when run.sim_time stopped the run).
            if batch >= 0 and (batch < i or (batch > i and i < rows.size)):
                raise TraceInvariantError(
                    f"learner {k} lost batch {batch} at {a}, but {i} of its gradients had "
                    "arrived by then (a lost gradient is its learner's next batch)")


def _check_protocol(trace: Trace, scenario: Scenario) -> None:
    """The per-protocol invariants of :func:`check_trace`."""
    g, u = trace.grads, trace.updates
    m = trace.num_updates
    lam = scenario.cluster.learners
    kind = scenario.protocol.kind
    proto = protocol_options(scenario.protocol)  # the options, defaults filled in
    if kind == "hardsync":
        _fail("hardsync staleness must be 0", trace, g["staleness"] != 0)
        short_ok = trace.num_down > 0 or (trace.meta.get("kind") == "real"
                                          and bool(trace.meta.get("short_rounds_allowed")))
        if short_ok:
            if np.any((u["n_grads"] < 1) | (u["n_grads"] > lam)):
                raise TraceInvariantError(f"hardsync updates must take 1..{lam} gradients")
        elif np.any(u["n_grads"] != lam):
            raise TraceInvariantError(f"hardsync updates must take {lam} gradients")
        for v in range(m):
            s = trace.update_slice(v)
            if np.unique(g["learner"][s]).size != u["n_grads"][v]:
                raise TraceInvariantError(f"hardsync update {v} takes two gradients of one "
                                          "learner" if short_ok else
                                          f"hardsync update {v} lacks a learner")
        if trace.num_down:
            _check_hardsync_down(trace, lam)
    elif kind == "softsync":
        c = lam // proto["n"]
        if np.any(u["n_grads"] != c):
            bad = int(np.flatnonzero(u["n_grads"] != c)[0])
            raise TraceInvariantError(f"softsync update {bad} took {u['n_grads'][bad]} "
                                      f"gradients, c = {c}")
    elif kind in ("async", "ssp", "fixed-delay"):
        if np.any(u["n_grads"] != 1):
            raise TraceInvariantError(f"{kind} updates must take one gradient each")
    if kind == "fixed-delay" and proto["schedule"] == "round-robin":
        want = np.minimum(g["apply_version"], proto["tau"])
        _fail(f"fixed-delay staleness must be min(version, tau={proto['tau']})", trace,
              g["staleness"] != want)
    if kind == "ssp":
        _check_ssp(trace, lam, proto["s"])


def _check_hardsync_down(trace: Trace, lam: int) -> None:
    """A learner a round goes without was down at some time between the round before and
    it (it is away from going down until the round after it is back)."""
    g, u, d = trace.grads, trace.updates, trace.down
    for v in np.flatnonzero(u["n_grads"] < lam):
        present = set(g["learner"][trace.update_slice(int(v))].tolist())
        before = u["time"][v - 1] if v else -np.inf
        for k in set(range(lam)) - present:
            mine = d["learner"] == k
            if not np.any(mine & (d["t_down"] <= u["time"][v]) & (d["t_up"] >= before)):
                raise TraceInvariantError(f"hardsync update {v} goes without learner {k}, "
                                          "which was not down")


def _check_ssp(trace: Trace, lam: int, s: int) -> None:
    """At each pull, every learner has pushed at least (batch - s) gradients; with learners
    that went away (a simulated trace's down table, a real run's lost learners), every
    learner up from the puller's previous arrival (or its return) to the pull."""
    g = trace.grads
    restarts = trace.meta.get("restarts") if trace.meta.get("kind") == "real" else None
    away = away_intervals(trace, pd.DataFrame(restarts) if restarts else None)
    away = away[away["kind"] == "down"]
    arrive_sorted = [np.sort(g["t_arrive"][g["learner"] == k]) for k in range(lam)]
    downs = [(away["t0"].to_numpy()[away["learner"] == k],
              away["t1"].to_numpy()[away["learner"] == k]) for k in range(lam)]
    for i in range(trace.num_gradients):
        need = int(g["batch"][i]) - s
        if need <= 0:
            continue
        t = g["t_pull"][i]
        me = int(g["learner"][i])
        # The puller asked at its previous arrival, or when it was last back up.
        start = arrive_sorted[me][int(g["batch"][i]) - 1]
        if downs[me][1].size:
            ups = downs[me][1][downs[me][1] <= t]
            start = max(start, ups.max(initial=-np.inf))
        for k in range(lam):
            if np.any((downs[k][0] <= t) & (downs[k][1] >= start)):
                continue  # gone at some time meanwhile: not in the bound then
            # gradients of k that had arrived at the pull (ties: arrival before pull)
            have = int(np.searchsorted(arrive_sorted[k], t, side="right"))
            if have < need:
                _fail(f"ssp: learner {g['learner'][i]} pulled batch {g['batch'][i]} while "
                      f"learner {k} had pushed only {have} (s = {s})", trace, [i])
