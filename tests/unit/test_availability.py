"""Learners that come and go (cluster.availability): throughput, hand-worked traces of each
protocol, determinism and draws, the trace invariants that guard the down table, its
persistence, and bad input. Timing only (no numerics)."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from asyncsim.config import ClusterConfig, RunConfig, Scenario, from_dict, to_dict
from asyncsim.drivers.build import simulation_for
from asyncsim.drivers.trace_only import simulate
from asyncsim.errors import ScenarioError
from asyncsim.scenario import check, load_scenario
from asyncsim.testing import TraceInvariantError, check_trace, strategies
from asyncsim.trace import DOWN_FILE, Trace

INF = math.inf


def const(value: float) -> dict:
    return {"dist": "constant", "value": value}


def expo(mean: float) -> dict:
    return {"dist": "exponential", "mean": mean}


ALWAYS_UP = {"up": const(1e9), "down": const(1.0)}


def scenario(cluster: dict, protocol: dict | None = None, seed: int = 0):
    return load_scenario({"seed": seed, "cluster": cluster,
                          "protocol": protocol or {"kind": "async"},
                          "run": {"trace_only": True}})


def run(scn, **limits) -> Trace:
    trace = simulation_for(scn).run(**limits)
    check_trace(trace, scn)
    return trace


def grad_rows(trace: Trace) -> list[tuple]:
    """(learner, batch, read_version, apply_version, t_pull, t_push, t_arrive, t_apply)."""
    g = trace.grads
    cols = ("learner", "batch", "read_version", "apply_version", "t_pull", "t_push",
            "t_arrive", "t_apply")
    return [tuple(g[c][i].item() for c in cols) for i in range(trace.num_gradients)]


def down_rows(trace: Trace) -> list[tuple]:
    """(learner, t_down, t_up, batch, read_version, t_pull) with NaN as None."""
    d = trace.down
    cols = ("learner", "t_down", "t_up", "batch", "read_version", "t_pull")
    rows = []
    for i in range(trace.num_down):
        row = tuple(d[c][i].item() for c in cols)
        rows.append(row[:5] + (None if math.isnan(row[5]) else row[5],))
    return rows


def approx_rows(rows):
    return [pytest.approx(r, abs=1e-9) for r in rows]


def rounds(trace: Trace) -> list[tuple[float, list[int]]]:
    """Per update: its time (to 1e-9) and the learners of the gradients it took, in order."""
    return [(round(t, 9), [r[0] for r in rows]) for _, rows, t in trace.iter_updates()]


# ----------------------------------------------------------------------------- throughput
def test_throughput_is_the_up_fraction_of_each_learners_rate():
    # Exponential compute is memoryless, so with free links a learner's completions while
    # it is up are a Poisson process of rate `speed`: it applies speed x (its up time)
    # gradients on average, and 0.8 x speed per unit time with up/down means 20/5.
    speed = [2.0, 1.0, 1.0, 1.0]
    scn = scenario({"learners": 4, "compute": expo(1.0), "speed": speed,
                    "availability": {"up": expo(20.0), "down": expo(5.0)}}, seed=3)
    T = 20_000.0
    t = run(scn, max_time=T)
    g, d = t.grads, t.down
    # Alternating renewal with exponential periods: the up time A of a learner over T has
    # mean 0.8 T and variance T (mu_d^2 s_u^2 + mu_u^2 s_d^2) / (mu_u + mu_d)^3 = 1.28 T.
    var_a = T * (5.0**2 * 20.0**2 + 20.0**2 * 5.0**2) / 25.0**3
    up_time = []
    for k, r in enumerate(speed):
        n = int(np.count_nonzero(g["learner"] == k))
        mine = d["learner"] == k
        a = T - float(np.sum(np.minimum(d["t_up"][mine], T) - d["t_down"][mine]))
        up_time.append(a)
        # Given its up time, the count is Poisson(r a): 4 standard errors sqrt(r a).
        assert abs(n - r * a) < 4 * math.sqrt(r * a), (k, n, r * a)
        # Unconditionally, Var n = r E[A] + r^2 Var A (about 1.1% of 1.6 for r = 2).
        sd = math.sqrt(r * 0.8 * T + r * r * var_a) / T
        assert abs(n / T - 0.8 * r) < 4 * sd, (k, n / T, 0.8 * r, sd)
    s = t.summary()
    assert s["down_periods"] == t.num_down > 4 * 500  # about T / 25 per learner
    # async with free links: every down period interrupts a computation.
    assert s["lost_gradients"] == t.num_down
    assert s["up_fraction"] == pytest.approx(sum(up_time) / (4 * T), rel=1e-12)
    # Four independent learners: sd of the fraction sqrt(4 Var A) / (4 T) ~ 0.004.
    assert abs(s["up_fraction"] - 0.8) < 4 * math.sqrt(4 * var_a) / (4 * T)


# ----------------------------------------------------------------------------- hand-worked
ONE = {"learners": 1, "compute": const(1.0),
       "availability": {"up": const(2.5), "down": const(1.0)}}


def test_a_learner_going_down_mid_compute_by_hand():
    # Up [0, 2.5), down [2.5, 3.5), up [3.5, 6), down [6, 7), up [7, 9.5). Compute 1:
    # batches 0 and 1 arrive at 1 and 2; batch 2 (pulled at 2, version 2) is lost at 2.5,
    # pulled again at 3.5 and arrives at 4.5; batch 3 at 5.5; batch 4 (pulled at 5.5,
    # version 4) is lost at 6, pulled again at 7 and arrives at 8.
    t = run(scenario(ONE), max_time=8.5)
    assert grad_rows(t) == approx_rows([
        (0, 0, 0, 0, 0.0, 1.0, 1.0, 1.0),
        (0, 1, 1, 1, 1.0, 2.0, 2.0, 2.0),
        (0, 2, 2, 2, 3.5, 4.5, 4.5, 4.5),
        (0, 3, 3, 3, 4.5, 5.5, 5.5, 5.5),
        (0, 4, 4, 4, 7.0, 8.0, 8.0, 8.0)])
    assert down_rows(t) == approx_rows([(0, 2.5, 3.5, 2, 2, 2.0), (0, 6.0, 7.0, 4, 4, 5.5)])
    s = t.summary()
    assert (s["down_periods"], s["lost_gradients"]) == (2, 2)
    assert s["up_fraction"] == pytest.approx(1 - 2.0 / 8.5)
    # Stopped while down: the period is still open (t_up = inf) and counts to the end.
    t = run(scenario(ONE), max_time=6.5)
    assert down_rows(t) == approx_rows([(0, 2.5, 3.5, 2, 2, 2.0), (0, 6.0, INF, 4, 4, 5.5)])
    assert t.summary()["up_fraction"] == pytest.approx(1 - 1.5 / 6.5)


def test_a_learner_going_down_mid_push_by_hand():
    # A private push latency of 0.4: a step takes 1.4. Batch 0 arrives at 1.4; batch 1,
    # pulled at 1.4, is pushed at 2.4 and lost at 2.5 mid-push; pulled again at 3.5 it
    # arrives at 4.9; batch 2, pulled at 4.9, pushed at 5.9, is lost at 6.0; again from 7.
    cluster = {**ONE, "network": {"push": {"latency": const(0.4)}}}
    t = run(scenario(cluster), max_time=8.5)
    assert grad_rows(t) == approx_rows([
        (0, 0, 0, 0, 0.0, 1.0, 1.4, 1.4),
        (0, 1, 1, 1, 3.5, 4.5, 4.9, 4.9),
        (0, 2, 2, 2, 7.0, 8.0, 8.4, 8.4)])
    assert down_rows(t) == approx_rows([(0, 2.5, 3.5, 1, 1, 1.4), (0, 6.0, 7.0, 2, 2, 4.9)])


def test_a_learner_going_down_mid_pull_by_hand():
    # A pull latency of 0.8 (the version is read when the pull is served, at its start):
    # a step takes 1.8. Batch 0 arrives at 1.8; batch 1, read at 1.8, is lost at 2.5 during
    # its compute; from 3.5 it arrives at 5.3; batch 2 is read at 5.3 and lost at 6.0 while
    # its weights are still on the way (5.3 + 0.8 = 6.1).
    cluster = {**ONE, "network": {"pull": {"latency": const(0.8)}}}
    t = run(scenario(cluster), max_time=7.5)
    assert grad_rows(t) == approx_rows([
        (0, 0, 0, 0, 0.0, 1.8, 1.8, 1.8),
        (0, 1, 1, 1, 3.5, 5.3, 5.3, 5.3)])
    assert down_rows(t) == approx_rows([(0, 2.5, 3.5, 1, 1, 1.8), (0, 6.0, 7.0, 2, 2, 5.3)])


HARDSYNC = {"learners": 3, "compute": const(1.0), "speed": [1.0, 1.0, 2.0], "availability": [
    ALWAYS_UP, {"up": const(1.25), "down": const(2.0)}, {"up": const(1.8), "down": const(0.5)}]}


def hardsync_trace(max_time: float = 6.2) -> tuple[object, Trace]:
    scn = scenario(HARDSYNC, {"kind": "hardsync"})
    return scn, run(scn, max_time=max_time)


def test_hardsync_rounds_go_on_with_the_learners_that_are_up():
    # Learner 2 computes in 0.5, learners 0 and 1 in 1.0. Learner 1 is down [1.25, 3.25)
    # and [4.5, 6.5); learner 2 is down [1.8, 2.3) and [4.1, 4.6).
    # Round 0 (v0 -> 1 at t 1): 2, 0, 1.
    # Round 1: 1 goes down mid-compute at 1.25 (batch 1 lost); 2 delivers at 1.5 and goes
    #   down at 1.8 waiting at the barrier (nothing lost): its gradient stays in the round,
    #   which completes when 0 delivers at 2.0, without 1.
    # Round 2: 2 is back at 2.3, mid-round: it rejoins at the next round; 0 alone at 3.0.
    # Round 3: 2 (pulled at 3.0) and 0 at 4.0; 1, back at 3.25, waits for round 4.
    # Round 4: all three pull at 4.0; 2 goes down at 4.1 and 1 at 4.5 mid-compute: 0 alone
    #   at 5.0. Round 5: 2 (back at 4.6) pulls at 5.0, delivers at 5.5; 0 at 6.0.
    _, t = hardsync_trace()
    assert rounds(t) == [(1.0, [2, 0, 1]), (2.0, [2, 0]), (3.0, [0]), (4.0, [2, 0]),
                         (5.0, [0]), (6.0, [2, 0])]
    assert t.updates["n_grads"].tolist() == [3, 2, 1, 2, 1, 2]
    assert down_rows(t) == approx_rows([
        (1, 1.25, 3.25, 1, 1, 1.0),
        (2, 1.8, 2.3, -1, -1, None),  # waiting at the barrier: nothing in flight
        (2, 4.1, 4.6, 3, 4, 4.0),
        (1, 4.5, INF, 1, 4, 4.0)])
    g = t.grads
    # Each learner's batches are still 0, 1, 2, ... and hardsync staleness 0.
    for k in range(3):
        assert g["batch"][g["learner"] == k].tolist() == list(range(np.sum(g["learner"] == k)))
    assert not np.any(g["staleness"])
    # When each learner pulled what it delivered: 2 rejoined at the round after it was
    # back (pulls at 3.0 and 5.0, not at 2.3 or 4.6); 1 at round 4 (its batch 1 pulled at
    # 4.0, lost at 4.5).
    pulls = {k: g["t_pull"][g["learner"] == k].tolist() for k in range(3)}
    assert pulls == {0: [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 1: [0.0], 2: [0.0, 1.0, 3.0, 5.0]}


def test_hardsync_with_every_learner_away_starts_again_with_the_first_back():
    # Two learners; 0 goes down for good at 0.5; 1 goes down at 1.6 (mid-compute of its
    # batch 1) and is back at 1.9: nobody is in the round, so 1 rejoins it at once and
    # recomputes batch 1 from 1.9 (version 1), delivering at 2.9.
    cluster = {"learners": 2, "compute": const(1.0), "availability": [
        {"up": const(0.5), "down": const(1e9)}, {"up": const(1.6), "down": const(0.3)}]}
    t = run(scenario(cluster, {"kind": "hardsync"}), max_time=3.2)
    assert rounds(t) == [(1.0, [1]), (2.9, [1])]
    assert down_rows(t) == approx_rows([(0, 0.5, INF, 0, 0, 0.0), (1, 1.6, 1.9, 1, 1, 1.0)])


def test_hardsync_never_idles_an_up_learner_for_a_down_one():
    # Learner 0 is down [2.5, 3.0), [5.5, 6.0), [8.5, ...); learner 1 [2.8, 7.8). Both lose
    # batch 2 (pulled at 2.0). With 1 away too, 0 back at 3.0 is in nobody's round: it
    # starts round 2 at once (its batch 2 again, from version 2), and rounds 3..5 run on it
    # alone while 1 is down; 1, back at 7.8, joins round 6 (0 is down from 8.5, so 1 alone).
    cluster = {"learners": 2, "compute": const(1.0), "availability": [
        {"up": const(2.5), "down": const(0.5)}, {"up": const(2.8), "down": const(5.0)}]}
    t = run(scenario(cluster, {"kind": "hardsync"}), max_time=9.5)
    assert rounds(t) == [(1.0, [0, 1]), (2.0, [1, 0]), (4.0, [0]), (5.0, [0]), (7.0, [0]),
                         (8.0, [0]), (9.0, [1])]
    g = t.grads
    assert g["t_pull"][g["learner"] == 0].tolist() == [0.0, 1.0, 3.0, 4.0, 6.0, 7.0]


def test_hardsync_a_learner_back_at_the_barrier_starts_a_round_nobody_else_can():
    # Compute 1 (learner 0) and 2 (learner 1). Round 1 starts at 2.0; 0 goes down
    # mid-compute at 2.5 and is back at 2.7, to rejoin at the next round (1 is computing
    # this one); then 1 goes down at 3.0 for long. Nobody is left in round 1, so 0 takes it
    # at once: it pulls at 3.0 and completes rounds 1 and 2 alone (it once idled at the
    # barrier until a learner came back).
    cluster = {"learners": 2, "compute": [const(1.0), const(2.0)], "availability": [
        {"up": const(2.5), "down": const(0.2)}, {"up": const(3.0), "down": const(100.0)}]}
    t = run(scenario(cluster, {"kind": "hardsync"}), max_time=5.1)
    assert rounds(t) == [(2.0, [0, 1]), (4.0, [0]), (5.0, [0])]
    assert t.grads["t_pull"][t.grads["learner"] == 0].tolist() == [0.0, 3.0, 4.0]


def test_downs_that_lose_nothing_do_not_count_as_no_progress(monkeypatch):
    # A straggler (compute 200, always up) holds each hardsync round; ten fast learners
    # (compute 0.1, up and down 0.5) go down about 200 times a round, mostly waiting at the
    # barrier with nothing lost. The guard against up periods too short for a step counts
    # losses only, so the run is not stopped as one that gets nothing through.
    from asyncsim.timing import cluster as cluster_module

    monkeypatch.setattr(cluster_module, "_MAX_IDLE_DOWNS", 1000)
    spec = {"learners": 11, "compute": [const(200.0)] + [const(0.1)] * 10,
            "availability": [ALWAYS_UP] + [{"up": const(0.5), "down": const(0.5)}] * 10}
    t = run(scenario(spec, {"kind": "hardsync"}), max_updates=3)
    assert t.num_updates == 3 and t.num_down > 3 * 1000


def test_a_step_ending_with_its_up_period_is_delivered_in_every_period():
    # Up exactly one step (1.0), down 0.5: each period's step ends at the instant the period
    # does, and the step comes first -- in the first period as in the later ones.
    cluster = {"learners": 1, "compute": const(1.0),
               "availability": {"up": const(1.0), "down": const(0.5)}}
    t = run(scenario(cluster, {"kind": "async"}), max_time=10.0)
    assert t.grads["t_arrive"].tolist() == [1.0, 2.5, 4.0, 5.5, 7.0, 8.5]
    # Each went down just after pulling its next batch: lost, with nothing computed.
    assert t.down["batch"].tolist() == list(range(1, 8))
    assert (t.down["t_pull"] == t.down["t_down"]).all()


# ----------------------------------------------------------------------------- ssp, softsync
def ssp_trace(s: int = 1, availability: bool = True) -> tuple[object, Trace]:
    cluster = {"learners": 2, "compute": const(1.0)}
    if availability:
        cluster["availability"] = [ALWAYS_UP, {"up": const(3.5), "down": const(3.0)}]
    scn = scenario(cluster, {"kind": "ssp", "s": s})
    return scn, run(scn, max_time=11.2)


def test_ssp_a_down_learner_holds_nobody_back_until_it_is_back():
    # s = 1, compute 1. Learner 1 is down [3.5, 6.5) (losing batch 3) and again from 10.0.
    _, t = ssp_trace()
    g = t.grads
    pull0 = g["t_pull"][g["learner"] == 0].tolist()
    arrive1 = g["t_arrive"][g["learner"] == 1].tolist()
    # While 1 is down at clock 3, 0 goes on: its batches 4, 5, 6 are pulled at 4, 5, 6 (with
    # 1 counted, batch 5 would need 1's clock >= 4 and wait).
    assert pull0[:7] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert sum(a <= 6.0 for a in arrive1) == 3
    # Back at 6.5 with clock 3, 1 holds 0 back again: 0's batch 7 (delivered batch 6 at
    # 7.0) needs clock 6 from 1, reached when 1's batch 5 arrives at 9.5.
    assert arrive1 == pytest.approx([1.0, 2.0, 3.0, 7.5, 8.5, 9.5])
    assert pull0[7] == pytest.approx(9.5)
    assert g["t_arrive"][(g["learner"] == 0) & (g["batch"] == 6)] == pytest.approx([7.0])
    assert down_rows(t) == approx_rows([(1, 3.5, 6.5, 3, 6, 3.0), (1, 10.0, INF, 6, 13, 9.5)])
    # Without availability the two run in lock step (0 never leads by more than s).
    _, free = ssp_trace(availability=False)
    fg = free.grads
    assert fg["t_pull"][fg["learner"] == 0].tolist()[:8] == pytest.approx(range(8))


def test_ssp_a_learner_going_down_releases_the_ones_waiting_for_it():
    # s = 0; learner 1 computes in 2 and goes down at 3.5 for good. Learner 0 waits for it
    # from 1.0 to 2.0 (1's batch 0) and from 3.0; 1 going down at 3.5 (losing batch 1)
    # releases it at once, and from then on it runs alone.
    cluster = {"learners": 2, "compute": const(1.0), "speed": [1.0, 0.5],
               "availability": [ALWAYS_UP, {"up": const(3.5), "down": const(1e9)}]}
    t = run(scenario(cluster, {"kind": "ssp", "s": 0}), max_time=8.0)
    g = t.grads
    assert g["t_pull"][g["learner"] == 0].tolist() == pytest.approx(
        [0.0, 2.0, 3.5, 4.5, 5.5, 6.5])
    assert g["t_arrive"][g["learner"] == 1].tolist() == pytest.approx([2.0])
    assert down_rows(t) == approx_rows([(1, 3.5, INF, 1, 2, 2.0)])


@pytest.mark.parametrize("n,up,expect", [
    # c = 2 of 4 learners, only learner 0 up: each update takes two of its gradients.
    (2, 1, [(2.0, [0, 0]), (4.0, [0, 0]), (6.0, [0, 0]), (8.0, [0, 0])]),
    # c = 4, learners 0 and 1 up: each takes two gradients of each.
    (1, 2, [(2.0, [0, 1, 0, 1]), (4.0, [0, 1, 0, 1]), (6.0, [0, 1, 0, 1]),
            (8.0, [0, 1, 0, 1])]),
])
def test_softsync_with_fewer_than_c_learners_up_still_updates(n, up, expect):
    # The other learners go down at 0.5 (mid-compute) for 100: they never deliver.
    avail = [ALWAYS_UP] * up + [{"up": const(0.5), "down": const(100.0)}] * (4 - up)
    t = run(scenario({"learners": 4, "compute": const(1.0), "availability": avail},
                     {"kind": "softsync", "n": n}), max_time=8.5)
    assert rounds(t) == expect
    assert down_rows(t) == approx_rows([(k, 0.5, INF, 0, 0, 0.0) for k in range(up, 4)])


# ----------------------------------------------------------------------------- determinism
RANDOM = {"learners": 4, "compute": expo(1.0), "speed": [1.0, 2.0, 1.0, 0.5],
          "network": {"push": {"latency": expo(0.1)}},
          "availability": {"up": expo(5.0), "down": expo(1.0)}}
KINDS = [{"kind": "async"}, {"kind": "softsync", "n": 2}, {"kind": "hardsync"},
         {"kind": "ssp", "s": 1}, {"kind": "fixed-delay", "tau": 3, "schedule": "race"}]


@pytest.mark.parametrize("protocol", KINDS, ids=lambda p: p["kind"])
def test_availability_is_deterministic_and_a_never_reached_down_changes_nothing(protocol):
    a = run(scenario(RANDOM, protocol, seed=5), max_updates=300)
    b = run(scenario(RANDOM, protocol, seed=5), max_updates=300)
    assert a.num_down > 0 and a.hash() == b.hash()
    assert run(scenario(RANDOM, protocol, seed=6), max_updates=300).hash() != a.hash()
    # Up for 1e12: no learner ever goes down, and the trace is the one without availability
    # (the same draws; the empty down table leaves the hash as it was).
    never = {**RANDOM, "availability": {"up": const(1e12), "down": expo(1.0)}}
    free = {k: v for k, v in RANDOM.items() if k != "availability"}
    t_never = run(scenario(never, protocol, seed=5), max_updates=300)
    t_free = run(scenario(free, protocol, seed=5), max_updates=300)
    assert t_never.num_down == 0 and t_never.hash() == t_free.hash()
    assert "down_periods" not in t_free.summary()
    # With downs, the down table is part of the trace's identity.
    assert dataclasses.replace(a, down=Trace.from_columns(a.grads, a.updates).down).hash() \
        != a.hash()


def test_saving_a_trace_without_downs_removes_another_traces_down_table(tmp_path):
    with_downs = run(scenario(RANDOM, {"kind": "async"}, seed=5), max_updates=300)
    assert with_downs.num_down
    with_downs.save(tmp_path)
    free = {k: v for k, v in RANDOM.items() if k != "availability"}
    without = run(scenario(free, {"kind": "async"}, seed=5), max_updates=300)
    without.save(tmp_path)
    assert Trace.load(tmp_path).num_down == 0
    assert Trace.load(tmp_path).hash() == without.hash()


def periods(t: Trace, k: int) -> tuple[list[float], list[float]]:
    """Learner k's completed up and down period lengths, in order."""
    d = t.down
    mine = d["learner"] == k
    downs, ups = d["t_down"][mine], d["t_up"][mine]
    up = downs - np.concatenate([[0.0], ups[:-1]])
    down = ups - downs
    return up.tolist(), down[np.isfinite(down)].tolist()


def test_up_and_down_periods_come_from_their_own_streams():
    base = run(scenario(RANDOM, seed=2), max_time=200.0)
    longer = run(scenario({**RANDOM, "availability": {"up": expo(5.0), "down": expo(3.0)}},
                          seed=2), max_time=200.0)
    gamma_up = run(scenario({**RANDOM, "availability": {
        "up": {"dist": "gamma", "mean": 5.0, "cv": 0.5}, "down": expo(1.0)}}, seed=2),
        max_time=200.0)
    for k in range(4):
        up_a, down_a = periods(base, k)
        up_b, down_b = periods(longer, k)
        up_c, down_c = periods(gamma_up, k)
        assert len(up_b) >= 10 and len(down_c) >= 10
        # Another down spec leaves every up period as it was (and the first t_down).
        n = min(len(up_a), len(up_b))
        np.testing.assert_allclose(up_b[:n], up_a[:n], rtol=1e-9, atol=1e-9)
        # Exponential means 1 and 3 from one stream: the same uniforms, scaled by 3.
        n = min(len(down_a), len(down_b))
        np.testing.assert_allclose(down_b[:n], 3.0 * np.asarray(down_a[:n]), rtol=1e-9,
                                   atol=1e-9)
        # Another up spec leaves every down period as it was.
        n = min(len(down_a), len(down_c))
        np.testing.assert_allclose(down_c[:n], down_a[:n], rtol=1e-9, atol=1e-9)
        assert not np.allclose(up_c[:5], up_a[:5])


def test_availability_changes_no_compute_draw():
    # Free links: each pull starts a compute at once, so a learner's compute draws are
    # consumed in the order of its pulls, applied or lost. Merged in that order, they are
    # exactly the draws of the run without availability.
    cluster = {"learners": 3, "compute": expo(1.0), "speed": [1.0, 2.0, 0.5],
               "availability": {"up": expo(4.0), "down": expo(1.0)}}
    t = run(scenario(cluster, seed=9), max_time=300.0)
    free = run(scenario({k: v for k, v in cluster.items() if k != "availability"}, seed=9),
               max_time=600.0)
    g, d, fg = t.grads, t.down, free.grads
    for k in range(3):
        mine = g["learner"] == k
        lost = (d["learner"] == k) & (d["batch"] >= 0)
        applied = (g["t_push"] - g["t_pull"])[mine]
        pulls = np.concatenate([g["t_pull"][mine], d["t_pull"][lost]])
        is_applied = np.concatenate([np.ones(mine.sum(), bool), np.zeros(lost.sum(), bool)])
        order = np.argsort(pulls, kind="stable")
        draw_index = np.flatnonzero(is_applied[order])  # the draw each applied gradient used
        want = (fg["t_push"] - fg["t_pull"])[fg["learner"] == k]
        assert lost.sum() > 10 and draw_index[-1] < want.size
        np.testing.assert_allclose(applied[np.argsort(g["batch"][mine])],
                                   want[draw_index], rtol=1e-9)


# ----------------------------------------------------------------------------- properties
@hst.composite
def _race_with_availability(draw) -> Scenario:
    # strategies.scenarios keeps fixed-delay's availability only under the race schedule,
    # one draw in eight (filtering for it is slow): compose those from the same parts, the
    # periods sized to race's steps (normal, mean 1), not to cluster.compute, which race
    # ignores (test_the_race_schedule_ignores_cluster_compute).
    cluster = draw(strategies.clusters(max_learners=8))
    protocol = draw(strategies.protocols(cluster.learners, kinds=["fixed-delay"]))
    d = to_dict(cluster)
    steps = {k: v for k, v in d.items() if k != "speed"}
    d["availability"] = draw(strategies._availability({**steps, "compute": const(1.0)}))
    return Scenario(name="hypothesis", seed=draw(hst.integers(0, 2**32 - 1)),
                    cluster=from_dict(ClusterConfig, d, prefix="cluster"),
                    protocol=dataclasses.replace(protocol, options={**protocol.options,
                                                                    "schedule": "race"}),
                    run=RunConfig(updates=draw(hst.integers(1, 200)), trace_only=True))


def _with_availability(kind: str):
    if kind == "fixed-delay":
        return _race_with_availability()
    return strategies.scenarios(kinds=[kind], max_learners=8).filter(
        lambda s: s.cluster.availability is not None)


@pytest.mark.parametrize("kind", strategies.PROTOCOL_KINDS)
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=hst.data())
def test_generated_scenarios_with_availability_give_valid_traces(kind, data):
    scn = data.draw(_with_availability(kind))
    check(scn)
    t = simulate(scn)
    check_trace(t, scn)
    assert simulate(scn).hash() == t.hash()
    if t.num_down:
        s = t.summary()
        assert 0.0 <= s["up_fraction"] <= 1.0 and s["down_periods"] == t.num_down


def test_the_race_schedule_ignores_cluster_compute():
    # Its steps are normal with mean 1 and spread protocol.cv, whatever cluster.compute says
    # (async's steps are cluster.compute's).
    def traced(compute, protocol):
        return run(scenario({"learners": 3, "compute": compute, "availability": {
            "up": expo(5.0), "down": expo(1.0)}}, protocol), max_updates=100)

    race = {"kind": "fixed-delay", "tau": 2, "schedule": "race"}
    a, b = traced(const(0.01), race), traced(expo(5.0), race)
    assert a.num_down > 0 and a.hash() == b.hash()
    assert traced(const(0.01), {"kind": "async"}).hash() != traced(
        expo(5.0), {"kind": "async"}).hash()


# ----------------------------------------------------------------------------- invariants
def with_down(t: Trace, **changes) -> Trace:
    """``t`` with columns of its down table replaced (``rows=`` keeps those rows only)."""
    down = {k: np.array(v, copy=True) for k, v in t.down.items()}
    rows = changes.pop("rows", None)
    if rows is not None:
        down = {k: v[rows] for k, v in down.items()}
    for k, fn in changes.items():
        down[k] = fn(down[k])
    return dataclasses.replace(t, down=down)


def setting(i: int, value):
    def fn(col):
        col[i] = value
        return col
    return fn


def async_trace() -> tuple[object, Trace]:
    scn = scenario(ONE)
    return scn, run(scn, max_time=8.5)


@pytest.mark.parametrize("corrupt,match", [
    # Learner 0's second period starts at 3.0, before its first ended (3.5).
    (dict(t_down=setting(1, 3.0), t_pull=setting(1, 2.0)), "down periods overlap"),
    # Listed out of the order they began.
    (dict(rows=[1, 0]), "not listed in the order they began"),
    # The lost batch 2 pulled at 2.7, after the learner went down at 2.5.
    (dict(t_pull=setting(0, 2.7)), "pulled after its learner went down"),
    # Losing batch 3 at 2.5, when only batches 0 and 1 had arrived.
    (dict(batch=setting(0, 3)), "lost batch 3 at 2.5"),
    # The lost gradient read version 3, which was created at 5.5, after its pull at 2.0.
    (dict(read_version=setting(0, 3)), "read a version before it existed"),
    # A period that begins after the run ended (8.5).
    (dict(t_down=setting(1, 9.0), t_up=setting(1, INF)), "begins after the run ended"),
    # Ending before it began.
    (dict(t_up=setting(0, 2.0)), "ends before it begins"),
    # A period with nothing lost that names a read version.
    (dict(batch=setting(0, -1), t_pull=setting(0, np.nan)), "names a read version"),
])
def test_check_trace_catches_corrupt_down_tables(corrupt, match):
    scn, t = async_trace()
    check_trace(t, scn)
    with pytest.raises(TraceInvariantError, match=match):
        check_trace(with_down(t, **corrupt), scn)


def test_check_trace_catches_a_gradient_under_way_while_its_learner_was_down():
    scn, t = async_trace()
    # A down period [4.0, 4.2) that lost nothing, while batch 2 (pulled 3.5, arriving 4.5)
    # was being computed.
    d = {k: np.insert(v, 1, x) for (k, v), x in zip(t.down.items(), (0, 4.0, 4.2, -1, -1, np.nan),
                                                    strict=True)}
    bad = dataclasses.replace(t, down=d)
    with pytest.raises(TraceInvariantError, match="under way while it was down"):
        check_trace(bad, scn)
    # The second period made to end at 7.5: batch 4, pulled again at 7.0, would have been
    # computed while its learner was down.
    with pytest.raises(TraceInvariantError, match="under way while it was down"):
        check_trace(with_down(t, t_up=setting(1, 7.5)), scn)


def test_check_trace_catches_a_hardsync_round_without_a_learner_that_was_up():
    scn, t = hardsync_trace()
    check_trace(t, scn)
    # Forget learner 1's first period: round 1 (at 2.0) went without it for no reason.
    with pytest.raises(TraceInvariantError, match="update 1 goes without learner 1"):
        check_trace(with_down(t, rows=[1, 2, 3]), scn)
    # Forget learner 2's down at the barrier: round 2 (at 3.0) went without it.
    with pytest.raises(TraceInvariantError, match="update 2 goes without learner 2"):
        check_trace(with_down(t, rows=[0, 2, 3]), scn)


def test_check_trace_catches_ssp_waits_skipped_for_a_learner_that_was_up():
    scn, t = ssp_trace()
    check_trace(t, scn)
    # Without its first down period, learner 1 held everyone back at clock 3.
    with pytest.raises(TraceInvariantError, match="ssp: learner 0 pulled batch 5 while "
                                                  "learner 1 had pushed only 3"):
        check_trace(with_down(t, rows=[1]), scn)


# ----------------------------------------------------------------------------- persistence
def test_the_down_table_is_saved_and_loaded(tmp_path):
    _, t = hardsync_trace()
    t.save(tmp_path / "a")
    assert (tmp_path / "a" / DOWN_FILE).exists()
    back = Trace.load(tmp_path / "a")
    assert back.num_down == 4 and back.hash() == t.hash()
    assert down_rows(back) == down_rows(t)
    assert back.summary() == t.summary()
    free = run(scenario({"learners": 2}), max_updates=10)
    free.save(tmp_path / "b")
    assert not (tmp_path / "b" / DOWN_FILE).exists()
    assert Trace.load(tmp_path / "b").hash() == free.hash()


def test_truncate_drops_later_down_periods_and_reopens_one_in_progress():
    scn, t = hardsync_trace()
    # Updates at 1, 2, 3, 4, 5, 6. The first two end at 2.0: learner 1 (down 1.25..3.25)
    # and learner 2 (down 1.8..2.3) were down then; the downs at 4.1 and 4.5 never began.
    cut = t.truncate(2)
    assert cut.meta["sim_time"] == 2.0
    assert down_rows(cut) == approx_rows([(1, 1.25, INF, 1, 1, 1.0), (2, 1.8, INF, -1, -1, None)])
    check_trace(cut, scn)
    # Four end at 4.0: both first periods are over, and the later ones had not begun.
    cut = t.truncate(4)
    assert down_rows(cut) == approx_rows([(1, 1.25, 3.25, 1, 1, 1.0), (2, 1.8, 2.3, -1, -1, None)])
    check_trace(cut, scn)
    # Five end at 5.0: learner 2 (down 4.1..4.6) is back, learner 1 (from 4.5) still down.
    cut = t.truncate(5)
    assert down_rows(cut)[2:] == approx_rows([(2, 4.1, 4.6, 3, 4, 4.0), (1, 4.5, INF, 1, 4, 4.0)])
    assert cut.summary()["up_fraction"] == pytest.approx(
        1 - (2.0 + 0.5 + 0.5 + 0.5) / (3 * 5.0))
    assert t.truncate(10).hash() == t.hash()


# ----------------------------------------------------------------------------- bad input
def bad(availability, *, learners: int = 2, protocol: dict | None = None) -> str:
    with pytest.raises(ScenarioError) as e:
        load_scenario({"cluster": {"learners": learners, "availability": availability},
                       "protocol": protocol or {"kind": "async"}})
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_bad_availability_is_a_one_line_error():
    msg = bad({"up": const(10.0)})
    assert "cluster.availability.down" in msg and "required" in msg
    msg = bad({"down": const(10.0)})
    assert "cluster.availability.up" in msg and "required" in msg
    msg = bad([{"up": const(1.0), "down": const(1.0)}] * 3)
    assert "cluster.availability" in msg and "needs 2 entries" in msg and "got 3" in msg
    msg = bad({"up": const(0.0), "down": const(1.0)})
    assert "cluster.availability.up" in msg and "positive mean" in msg
    msg = bad([{"up": const(1.0), "down": const(1.0)}, {"up": const(0.0), "down": const(1.0)}])
    assert "cluster.availability[1].up" in msg and "positive mean" in msg
    msg = bad({"up": const(1.0), "down": {"dist": "exponental", "mean": 1.0}})
    assert "cluster.availability.down.dist" in msg and "did you mean 'exponential'" in msg
    msg = bad({"up": const(1.0), "down": const(1.0)}, learners=3,
              protocol={"kind": "fixed-delay", "tau": 2})
    assert "cluster.availability" in msg and "round-robin" in msg and "race" in msg
    # The race schedule runs learner loops: accepted.
    load_scenario({"cluster": {"learners": 3, "availability": {
        "up": const(1.0), "down": const(1.0)}}, "protocol": {
        "kind": "fixed-delay", "tau": 2, "schedule": "race"}})


@pytest.mark.parametrize("availability,key", [
    ({"up": const(1.0), "down": const(1.0), "upp": const(1.0)}, "cluster.availability.upp"),
    ([{"up": const(1.0), "down": const(1.0)}, {"up": const(1.0), "dwon": const(1.0)}],
     "cluster.availability[1].dwon"),
])
def test_an_unknown_key_in_availability_is_named(availability, key):
    # A table (or a list) is reported as such, not as "must be a table or a list".
    msg = bad(availability)
    assert key in msg and "unknown key" in msg, msg
    msg = bad([{"up": const(1.0), "down": const(1.0)}, 5])
    assert "cluster.availability[1]" in msg and "must be a table" in msg


def test_a_real_run_refuses_availability():
    pytest.importorskip("ray")
    from asyncsim.drivers.real.run import check_supported

    with pytest.raises(ScenarioError) as e:
        check_supported(load_scenario({"cluster": {"learners": 2, "availability": {
            "up": const(1.0), "down": const(1.0)}}}))
    assert "cluster.availability" in str(e.value) and "\n" not in str(e.value)


def test_up_periods_too_short_for_a_step_are_an_error_not_a_hang():
    # Up 0.5 < compute 1.0: no gradient ever gets through.
    scn = scenario({"learners": 1, "compute": const(1.0),
                    "availability": {"up": const(0.5), "down": const(0.1)}})
    t0 = time.perf_counter()
    with pytest.raises(ScenarioError, match="cluster.availability: 100000 gradients lost in "
                                            "a row, none applied") as e:
        simulation_for(scn).run(max_updates=10)
    assert "\n" not in str(e.value) and time.perf_counter() - t0 < 10.0
    # A time limit reached first ends the run normally, with nothing applied: downs at
    # 0.5, 1.1, ..., 99.5, each losing batch 0.
    t = run(scn, max_time=100.0)
    assert t.num_updates == 0 and t.num_down == 166 and t.summary()["lost_gradients"] == 166


def test_a_plug_in_delay_model_sets_the_periods(fresh_registries):
    # Any delay model, plug-ins included: a duck-typed one registered from Python gives the
    # trace its built-in equivalent gives.
    from asyncsim.timing import delays

    class Every:
        def __init__(self, value: float = 1.0):
            self.value = value

        def sample(self, rng, learner, now):
            return self.value

    delays.register_delay("test-every")(Every)
    plug = {"learners": 2, "compute": const(1.0),
            "availability": {"up": {"dist": "test-every", "value": 2.5},
                             "down": {"dist": "test-every", "value": 0.7}}}
    built_in = {**plug, "availability": {"up": const(2.5), "down": const(0.7)}}
    a = run(scenario(plug, {"kind": "async"}), max_time=20.0)
    b = run(scenario(built_in, {"kind": "async"}), max_time=20.0)
    assert a.num_down > 5 and a.hash() == b.hash()
