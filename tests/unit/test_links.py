"""The PS's shared network interface (cluster.network.ps_ingress / ps_egress,
asyncsim.timing.links): hand-worked transfers, saturation at bandwidth / bytes, and
determinism."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import simpy

from asyncsim.drivers.trace_only import simulate
from asyncsim.errors import ScenarioError
from asyncsim.scenario import load_scenario
from asyncsim.timing.cluster import Simulation
from asyncsim.timing.links import Environment, FairLink, SharedLink


def finish_times(sharing: str, starts: list[tuple[float, float]], bandwidth: float = 1.0):
    """When each transfer (start time, bytes) ends, and the order the events fired."""
    env = Environment()
    link = SharedLink(env, bandwidth, sharing)
    ends: dict[int, float] = {}
    order: list[int] = []

    def one(i, t0, nbytes):
        yield env.timeout(t0)
        yield link.transfer(nbytes)
        ends[i] = env.now
        order.append(i)

    for i, (t0, nbytes) in enumerate(starts):
        env.process(one(i, t0, nbytes))
    env.run()
    return [ends[i] for i in range(len(starts))], order


def test_two_transfers_sharing_the_link_by_hand():
    # One byte each at one byte per second, the second starting at 0.5. Fair: the first is
    # alone for 0.5 s (0.5 B left), then both move at 0.5 B/s: it ends at 1.5; the second
    # has 0.5 B left then and ends alone at 2.0. FIFO: 1.0, then 1.0 + 1.0 = 2.0.
    assert finish_times("fair", [(0.0, 1.0), (0.5, 1.0)])[0] == pytest.approx([1.5, 2.0])
    assert finish_times("fifo", [(0.0, 1.0), (0.5, 1.0)])[0] == pytest.approx([1.0, 2.0])
    # Three at once, sizes 1, 2, 3 (fair): all at 1/3 B/s until the first ends at 3.0; then
    # 1 B left of the second at 1/2 B/s: 5.0; then 1 B of the third alone: 6.0.
    assert finish_times("fair", [(0, 1.0), (0, 2.0), (0, 3.0)])[0] == pytest.approx(
        [3.0, 5.0, 6.0])


def test_transfers_that_end_together_end_in_the_order_they_started():
    ends, order = finish_times("fair", [(0.0, 2.0), (0.0, 2.0), (1.0, 1.0)])
    # Fair, 2 B each from 0 and 1 B from 1.0: two at 1/2 B/s to t = 1 (1.5 B left each),
    # then three at 1/3 B/s: the third's 1 B ends at 4.0 with the others (1.5 - 1 = 0.5 B
    # left each), which then end together at 4.0 + 0.5 * 2 = 5.0, first-started first.
    assert ends == pytest.approx([5.0, 5.0, 4.0])
    assert order == [2, 0, 1]


def scenario(sharing=None, *, kind="async", learners=30, nbytes=1000, bandwidth=10_000.0,
             direction="ps_ingress", updates=3000, seed=0):
    link = "push" if direction == "ps_ingress" else "pull"
    net = {link: {"bytes": nbytes}}
    if sharing is not None:
        net[direction] = {"bandwidth": bandwidth, "sharing": sharing}
    return load_scenario({"seed": seed, "cluster": {
        "learners": learners, "compute": {"dist": "exponential", "mean": 1.0},
        "network": net}, "protocol": {"kind": kind},
        "run": {"updates": updates, "trace_only": True}})


@pytest.mark.parametrize("sharing", ["fair", "fifo"])
def test_updates_saturate_at_bandwidth_over_bytes(sharing):
    # 30 learners each computing at rate 1 would push 30 per time unit; a PS ingress of
    # 10,000 B/s for 1,000 B pushes lets 10 through.
    t = simulate(scenario(sharing))
    ts = t.updates["time"]
    rate = (len(ts) - 1001) / (ts[-1] - ts[1000])
    assert rate == pytest.approx(10.0, rel=0.01)
    free = simulate(scenario(None)).updates["time"]
    assert (len(free) - 1001) / (free[-1] - free[1000]) > 25.0


def test_a_shared_egress_spreads_a_hardsync_round_of_pulls():
    # Hardsync: after each update every learner pulls at once; fair sharing delivers all
    # 4 pulls of 1,000 B over a 1,000 B/s egress together, 4 s later.
    t = simulate(scenario("fair", kind="hardsync", learners=4, bandwidth=1000.0,
                          direction="ps_egress", updates=20))
    g = t.grads
    first = g["t_push"][g["read_version"] == 0] - g["t_pull"][g["read_version"] == 0]
    compute = simulate(scenario(None, kind="hardsync", learners=4, direction="ps_egress",
                                updates=20)).grads
    c0 = compute["t_push"][compute["read_version"] == 0] - compute["t_pull"][
        compute["read_version"] == 0]
    assert first - c0 == pytest.approx(np.full(4, 4.0))


def test_the_shared_link_changes_no_draw_and_is_deterministic():
    a, b = simulate(scenario("fair")), simulate(scenario("fair"))
    assert a.hash() == b.hash()
    free = simulate(scenario(None))
    # The same compute draws (an ingress delays pushes, not computing): each learner's
    # compute times, pull to push, are the private-link run's.
    for k in range(3):
        da = (a.grads["t_push"] - a.grads["t_pull"])[a.grads["learner"] == k]
        df = (free.grads["t_push"] - free.grads["t_pull"])[free.grads["learner"] == k]
        n = min(len(da), len(df))
        np.testing.assert_allclose(np.sort(da[:n]), np.sort(df[:n]))
        np.testing.assert_allclose(da[:50], df[:50])


@pytest.mark.parametrize("table,key,fragment", [
    ({"ps_ingress": {"bandwidth": 0.0}}, "cluster.network.ps_ingress.bandwidth", "positive"),
    ({"ps_egress": {"bandwidth": 1e6, "sharing": "fiar"}}, "cluster.network.ps_egress.sharing",
     "did you mean 'fair'"),
    ({"ps_ingress": {"bandwith": 1e6}}, "cluster.network.ps_ingress.bandwith", "unknown key"),
])
def test_bad_shared_links_are_one_line_errors(table, key, fragment):
    with pytest.raises(ScenarioError) as e:
        load_scenario({"cluster": {"learners": 2, "network": table}})
    assert key in str(e.value) and fragment in str(e.value) and "\n" not in str(e.value)


def exact_fair(starts: list[tuple[float, float]], bandwidth: float) -> list[float]:
    """Processor sharing by brute force (an independent reference): step from event to
    event with every transfer's remaining bytes."""
    pending = sorted(range(len(starts)), key=lambda i: starts[i][0])
    left: dict[int, float] = {}
    ends = [0.0] * len(starts)
    t = 0.0
    while pending or left:
        nxt_start = starts[pending[0]][0] if pending else float("inf")
        nxt_end = (t + min(left.values()) * len(left) / bandwidth) if left else float("inf")
        t_new = min(nxt_start, nxt_end)
        if left:
            for i in left:
                left[i] -= (t_new - t) * bandwidth / len(left)
        t = t_new
        for i in [i for i, b in left.items() if b <= 1e-12 * starts[i][1]]:
            ends[i] = t
            del left[i]
        while pending and starts[pending[0]][0] <= t:
            i = pending.pop(0)
            left[i] = starts[i][1]
    return ends


def test_fair_sharing_of_transfers_of_different_sizes_is_exact():
    # A small transfer started with a big one ends first: 10 B and 1 B at 1 B/s share until
    # the 1 B ends at 2.0 (0.5 B/s each), then the 10 B one has 9 B left alone: 11.0.
    assert finish_times("fair", [(0.0, 10.0), (0.0, 1.0)])[0] == pytest.approx([11.0, 2.0])
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 8))
        starts = [(float(rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 3)])),
                   float(rng.choice([1.0, 2.0, rng.uniform(0.1, 4)]))) for _ in range(n)]
        got = finish_times("fair", starts, bandwidth=2.0)[0]
        np.testing.assert_allclose(got, exact_fair(starts, 2.0), rtol=1e-9, atol=1e-9)


def test_fair_sharing_ends_at_large_simulated_times():
    # At t ~ 1e4 the rounding of the time moves the virtual clock by more than a byte
    # tolerance: the transfer that a wake-up was set for must end then, not wait forever.
    env = Environment(initial_time=8000.0)
    link = SharedLink(env, 1.25e9, "fair")
    done = []

    def learner(k):
        rng = np.random.default_rng(k)
        while True:
            yield env.timeout(float(rng.exponential(1e-3)))
            yield link.transfer(358_312.0)
            done.append(env.now)

    for k in range(30):
        env.process(learner(k))
    steps = 0
    while env.peek() < 8000.5:
        env.step()
        steps += 1
        assert steps < 2_000_000, "the shared link stopped advancing time"
    assert len(done) > 1000 and done == sorted(done)


def test_a_shared_link_sizes_its_messages_from_the_model_when_bytes_is_not_given():
    # The links themselves free (no bytes, infinite bandwidth): the interface's transfers
    # are still 4 x the model's parameters (here an MLP's), not free.
    def hashed(net):
        return simulate(load_scenario({"cluster": {"learners": 8, "network": net},
                                       "run": {"updates": 50, "trace_only": True}}))
    free = hashed({})
    shared = hashed({"ps_ingress": {"bandwidth": 1e6}})
    assert shared.hash() != free.hash()
    assert shared.updates["time"][-1] > 2 * free.updates["time"][-1]


def test_shared_links_are_refused_where_nothing_models_them():
    with pytest.raises(ScenarioError) as e:
        load_scenario({"cluster": {"learners": 4, "network": {"ps_ingress": {
            "bandwidth": 1e6}}}, "protocol": {"kind": "fixed-delay", "tau": 3}})
    assert "cluster.network.ps_ingress" in str(e.value) and "race" in str(e.value)
    ray = pytest.importorskip("ray")
    del ray
    from asyncsim.drivers.real.run import check_supported

    with pytest.raises(ScenarioError) as e:
        check_supported(load_scenario({"cluster": {"learners": 2, "network": {
            "ps_egress": {"bandwidth": 1e6}}}}))
    assert "cluster.network.ps_egress" in str(e.value) and "real network" in str(e.value)


class _Const:
    """A learner's link of fixed time (timing.cluster's links have this ``next``)."""

    def __init__(self, value):
        self.value = value

    def next(self, now):
        return self.value


def test_a_message_crosses_the_learners_link_and_the_interface_in_order():
    # 1 B/s, fair. B pulls 1 B at 0: the interface, then B's own link (0.25 s). A pushes
    # 1 B at 0: its own link first (0.5 s), then the interface. B is alone until 0.5 (0.5 B
    # left), then both move at 0.5 B/s: B leaves the interface at 1.5 and reaches its
    # learner at 1.75; A has 0.5 B left at 1.5, alone: 2.0.
    env = Environment()
    link = SharedLink(env, 1.0, "fair")
    ends = {}

    def pull():
        yield link.transfer(1.0, _Const(0.25), 0.0)
        ends["B"] = env.now

    def push():
        yield link.transfer(1.0, before=0.5)
        ends["A"] = env.now

    env.process(pull())
    env.process(push())
    env.run()
    assert ends == pytest.approx({"B": 1.75, "A": 2.0})


def test_a_step_as_one_event_by_hand():
    # A learner's pull, 1 B over a 1 B/s fair egress then its own link (0.25 s), carried on
    # by its sender (go_on): compute 1 s, its push link 0.5 s, then 1 B over a 1 B/s fair
    # ingress. Alone throughout: out of the egress at 1.0, weights in at 1.25, computed at
    # 2.25 (t_push), off its link at 2.75, in at 3.75 -- one event. Zero bytes skip the
    # interface: a pull is its link alone (0.25), a push its computation alone (1.0).
    env = Environment()
    egress, ingress = SharedLink(env, 1.0, "fair"), SharedLink(env, 1.0, "fair")
    send = ingress.sender(_Const(0.5), 1.0, lambda now: 1.0)
    pull = egress.puller(_Const(0.25), 1.0, go_on=send)
    out = {}

    def learner():
        ev = pull(0.0)
        yield ev
        out["step"] = (env.now, ev.t_push)

    def zero_bytes():
        yield egress.puller(_Const(0.25), 0)(0.0)
        out["pull"] = env.now
        ev = ingress.sender(None, 0, lambda now: 1.0)()
        yield ev
        out["push"] = (env.now, ev.t_push)

    env.process(learner())
    env.process(zero_bytes())
    env.run()
    assert out == {"step": (3.75, 2.25), "pull": 0.25, "push": (1.25, 1.25)}


def _one_goes_down(down_at: float, before: float | None):
    """Two 1 B transfers over a 1 B/s fair link from t = 0; the first's learner goes down at
    ``down_at`` (its process interrupted). Returns the second's end and whether the first
    was still crossing when the second ended."""
    env = Environment()
    link = SharedLink(env, 1.0, "fair")
    out = {}

    def first():
        try:
            yield link.transfer(1.0, before=before)
            out["first"] = env.now
        except simpy.Interrupt:
            pass

    def second():
        yield link.transfer(1.0)
        out["second"] = env.now
        out["crossing"] = link.in_progress

    p = env.process(first())
    env.process(second())

    def down():
        yield env.timeout(down_at)
        p.interrupt("down")

    env.process(down())
    env.run()
    return out


def test_a_learner_down_on_its_own_link_sends_nothing_one_down_while_crossing_keeps_its_share():
    # Down at 0.25 while its message is still on its own link (0.5 s): the message never
    # reaches the interface, so the other one crosses alone: 1.0.
    out = _one_goes_down(0.25, before=0.5)
    assert out == {"second": pytest.approx(1.0), "crossing": 0}
    # Down at 0.25 while its message crosses the interface: it keeps its share (the
    # interface learns of the loss only when it would have ended): both end at 2.0, and
    # nobody is told of the first.
    out = _one_goes_down(0.25, before=None)
    assert out == {"second": pytest.approx(2.0), "crossing": 0}
    # Pushed at 0.5 after its own link, then down at 0.75 while crossing: the other has
    # 0.5 B left at 0.5, shares until it ends at 1.5, the first still crossing then.
    out = _one_goes_down(0.75, before=0.5)
    assert out == {"second": pytest.approx(1.5), "crossing": 1}


def test_wake_ups_take_their_turn_among_the_events_as_timeouts_would():
    # The environment's second queue (the links' wake-ups) and its events interleave by
    # (time, order of scheduling), as if every wake-up were a timeout.
    env = Environment()
    order = []

    def mark(name):
        return lambda _: order.append((name, env.now))

    env.timeout(1.0).callbacks.append(mark("timeout 1"))
    env.call_at(1.0, lambda arg: order.append((arg, env.now)), "call 1")
    env.timeout(1.0).callbacks.append(mark("timeout 2"))
    env.call_at(0.5, lambda arg: order.append((arg, env.now)), "call 0")
    assert env.peek() == 0.5
    env.run()
    assert order == [("call 0", 0.5), ("timeout 1", 1.0), ("call 1", 1.0), ("timeout 2", 1.0)]


@pytest.mark.parametrize("until", ["none", "event", "processed", "time", "never"])
def test_the_environment_runs_as_simpy_does(until):
    # Environment.run steps in a loop of its own: the same log, return value, end time and
    # error as simpy.Environment.run, for each kind of ``until``; a failed event that
    # nobody defused raises out of run in both.
    def script(env):
        log = []

        def proc(name, delays, fail=False):
            for d in delays:
                yield env.timeout(d)
                log.append((name, env.now))
            if fail:
                raise KeyError(name)
            return name

        a = env.process(proc("a", [1.0, 0.5, 2.0]))
        env.process(proc("b", [0.5, 0.5, 0.5, 3.0]))
        stop = env.event()
        if until == "never":
            arg = stop
        elif until == "event":
            arg = a
        elif until == "processed":
            env.run(until=a)
            arg = a
        elif until == "time":
            arg = 2.25
        else:
            arg = None
        try:
            value = env.run(until=arg)
        except RuntimeError as e:
            value = ("RuntimeError", str(e).split(":")[0])
        log.append(("end", env.now, value))
        env.process(proc("c", [0.25], fail=True))
        with pytest.raises(KeyError, match="c"):
            env.run()
        return log

    ours = script(Environment())
    assert ours == script(simpy.Environment())
    # By hand: a logs at 1, 1.5, 3.5 and returns "a"; b at 0.5, 1, 1.5, 4.5; c fails at +0.25.
    end = {"none": (4.5, None), "event": (3.5, "a"), "processed": (3.5, "a"),
           "time": (2.25, None),
           "never": (4.5, ("RuntimeError", 'No scheduled events left but "until" event was '
                           "not triggered"))}[until]
    assert [e for e in ours if e[0] == "end"] == [("end", *end)]
    assert ours[-1] == ("c", end[0] + 0.25)


def test_fair_sharing_needs_the_environment_with_the_wake_up_queue():
    with pytest.raises(TypeError, match="Environment"):
        SharedLink(simpy.Environment(), 1.0, "fair")
    assert SharedLink(simpy.Environment(), 1.0, "fifo").sharing == "fifo"


class _Counted(_Const):
    """A learner's link that counts its draws."""

    draws = 0

    def next(self, now):
        self.draws += 1
        return self.value


@pytest.mark.parametrize("down", [True, False])
def test_a_learner_down_as_its_pull_leaves_the_interface_draws_no_link_time(down):
    # The pull crosses a 1 B/s interface from 0 to 1.0; at 1.0 exactly the learner goes
    # down (an interruption, which SimPy runs before the other events of that instant). As
    # if the learner timed its own link after the interface, its link is then not drawn:
    # a draw here would shift every later pull time of that learner.
    env = Environment()
    link = SharedLink(env, 1.0, "fair")
    leg = _Counted(0.25)
    ends = []

    def learner():
        try:
            yield link.transfer(1.0, leg, 0.0)
            ends.append(env.now)
        except simpy.Interrupt:
            pass

    p = env.process(learner())

    def goes_down():
        yield env.timeout(1.0)
        if down:
            p.interrupt("down")

    env.process(goes_down())
    env.run()
    assert (leg.draws, ends) == ((0, []) if down else (1, [1.25]))


def _tie_grid():
    """Tie-heavy clusters: constant compute (in half of them every other learner 1.5x as
    fast), constant link latencies and a fair interface whose lone transfers take whole
    time units, so events meet at the same instants."""
    for learners, latency, egress, ingress, kind, speed in itertools.product(
            (2, 3), (0.0, 1.0), (None, 50.0, 100.0), (None, 50.0, 100.0),
            ("async", "softsync"), (1.0, 1.5)):
        link = {"bytes": 100, "latency": {"dist": "constant", "value": latency}}
        net = {"pull": link, "push": link}
        for key, bw in (("ps_egress", egress), ("ps_ingress", ingress)):
            if bw is not None:
                net[key] = {"bandwidth": bw, "sharing": "fair"}
        yield {"seed": 0, "cluster": {"learners": learners, "network": net,
                                      "compute": {"dist": "constant", "value": 2.0},
                                      "speed": [1.0 + (speed - 1.0) * (i % 2)
                                                for i in range(learners)]},
               "protocol": {"kind": kind} | ({"n": 1} if kind == "softsync" else {}),
               "run": {"gradients": 60, "trace_only": True}}


def test_the_lone_transfer_shortcut_gives_the_traces_of_the_trip_through_the_queue(
        monkeypatch):
    # A transfer that ends alone at an instant goes on at once (its learner resumes, or its
    # leg is drawn) instead of being scheduled behind the wake-up: the same order, so the
    # same traces, over a grid where events meet (taking the shortcut while another event
    # is due at that instant changes two of these 144 traces).
    scenarios = [load_scenario(d) for d in _tie_grid()]
    with_shortcut = [simulate(s).hash() for s in scenarios]
    monkeypatch.setattr(FairLink, "shortcut", False)
    assert [simulate(s).hash() for s in scenarios] == with_shortcut


def _churn_grid():
    """Fair interfaces (one direction or both) under churn, every protocol that runs
    learner loops, ties included (constant compute in half of them)."""
    for kind, directions, compute, seed in itertools.product(
            ("async", "softsync", "hardsync", "ssp"),
            (("ps_ingress",), ("ps_ingress", "ps_egress")),
            ({"dist": "exponential", "mean": 1.0}, {"dist": "constant", "value": 1.0}),
            (0, 1)):
        link = {"bytes": 1000, "bandwidth": 5000.0,
                "latency": {"dist": "exponential", "mean": 0.1}}
        net = {"pull": link, "push": link}
        for key in directions:
            net[key] = {"bandwidth": 3000.0, "sharing": "fair"}
        proto = {"kind": kind} | {"softsync": {"n": 2}, "ssp": {"s": 2}}.get(kind, {})
        yield {"seed": seed, "protocol": proto,
               "cluster": {"learners": 5, "network": net, "compute": compute,
                           "availability": {"up": {"dist": "exponential", "mean": 15.0},
                                            "down": {"dist": "exponential", "mean": 3.0}}},
               "run": {"gradients": 300, "trace_only": True}}


def test_a_step_as_one_event_gives_the_traces_of_the_learner_timing_each_part(monkeypatch):
    # With a fair ingress the learner waits on one event from its computation to the end
    # of its push (and from its pull, both directions fair): the computation's end and the
    # learner's links become wake-ups in the turns the learner's own timeouts would have
    # had, so every trace is the one of the learner timing each part itself -- ties,
    # learners going down mid-step and the shortcut of a lone transfer included.
    scenarios = [load_scenario(d) for d in (*_tie_grid(), *_churn_grid())]
    one_event = [simulate(s).hash() for s in scenarios]
    monkeypatch.setattr(Simulation, "one_event_steps", False)
    assert [simulate(s).hash() for s in scenarios] == one_event
    monkeypatch.setattr(FairLink, "shortcut", False)
    assert [simulate(s).hash() for s in scenarios] == one_event


@pytest.mark.parametrize("kind,chained", [("async", True), ("softsync", True),
                                           ("hardsync", False), ("ssp", False)])
def test_steps_with_nothing_between_them_go_on_without_resuming_the_learners(
        monkeypatch, kind, chained):
    # Both directions fair and no pull gate: a step's event hands the gradient to the
    # protocol and pulls again itself (Simulation._chained), so a learner's process resumes
    # once, to start; hardsync and SSP gate the pulls, so theirs resume every step. Both
    # give the traces of the learner timing each part (the grid test above); this checks
    # which path ran.
    resumes = []
    resume = simpy.events.Process._resume

    def counted(self, event):
        resumes.append(self)
        return resume(self, event)

    monkeypatch.setattr(simpy.events.Process, "_resume", counted)
    link = {"bytes": 100, "latency": {"dist": "exponential", "mean": 0.1}}
    proto = {"kind": kind} | {"softsync": {"n": 2}, "ssp": {"s": 1}}.get(kind, {})
    trace = simulate(load_scenario({
        "seed": 0, "protocol": proto, "run": {"gradients": 200, "trace_only": True},
        "cluster": {"learners": 3, "compute": {"dist": "exponential", "mean": 1.0},
                    "network": {"pull": link, "push": link,
                                "ps_egress": {"bandwidth": 150.0, "sharing": "fair"},
                                "ps_ingress": {"bandwidth": 150.0, "sharing": "fair"}}}}))
    assert trace.num_gradients >= 200
    if chained:
        assert len(resumes) == 3  # each learner's process, started
    else:
        assert len(resumes) >= 200


def _as_timeout(env, delay):
    return simpy.Environment.timeout(env, delay)


def test_rare_timeouts_take_the_turns_of_timeouts(monkeypatch):
    # Environment.rare_timeout keeps its events in a heap of its own, the first standing in
    # the wake-up queue: processes waiting on them, on timeouts and on wake-ups, meeting at
    # the same instants, go on in the order they would with every one a timeout. "a"'s
    # later periods are due before "b"'s first, scheduled earlier, so "b"'s stands in again
    # and again; "d"'s timeout, scheduled after "b"'s period began but before "b"'s stood
    # in first, ends with it and comes after it.
    def script():
        env = Environment()
        log = []

        def proc(name, delays, wait):
            for d in delays:
                yield wait(d)
                log.append((name, env.now))

        env.process(proc("a", [1.0, 1.0, 0.5, 0.5], env.rare_timeout))
        env.process(proc("b", [3.0, 1.0, 2.0], env.rare_timeout))
        env.process(proc("c", [1.0, 0.5, 1.5, 0.5, 1.5], env.timeout))
        env.process(proc("d", [0.5, 2.5], env.timeout))
        for t in (1.0, 2.0, 3.0, 4.0):
            env.call_at(t, lambda arg: log.append((arg, env.now)), f"call {t}")
        env.run()
        return log

    log = script()
    # By hand: at an instant, in the order of scheduling (the calls, scheduled first; then
    # what each process scheduled when it last went on).
    assert log == [("d", 0.5), ("call 1.0", 1.0), ("a", 1.0), ("c", 1.0), ("c", 1.5),
                   ("call 2.0", 2.0), ("a", 2.0), ("a", 2.5),
                   ("call 3.0", 3.0), ("b", 3.0), ("d", 3.0), ("c", 3.0), ("a", 3.0),
                   ("c", 3.5),
                   ("call 4.0", 4.0), ("b", 4.0), ("c", 5.0), ("b", 6.0)]
    monkeypatch.setattr(Environment, "rare_timeout", _as_timeout)
    assert script() == log


def _availability_grid():
    """Learners that come and go at the instants their steps end (constant compute, link
    latencies and periods: every learner's up period ends with its 4th step), and not
    (exponential periods), under each protocol with a learner loop and each kind of link."""
    const = [(latency, {"up": {"dist": "constant", "value": up},
                        "down": {"dist": "constant", "value": 1.0}})
             for latency, up in ((0.0, 4.0), (0.25, 6.0))]
    expo = (0.25, {"up": {"dist": "exponential", "mean": 6.0},
                   "down": {"dist": "exponential", "mean": 1.0}})
    for kind, sharing, (latency, avail) in itertools.product(
            ("async", "softsync", "hardsync", "ssp"), (None, "fifo", "fair"), (*const, expo)):
        link = {"bytes": 100, "latency": {"dist": "constant", "value": latency}}
        net = {"pull": link, "push": link}
        if sharing is not None:
            for key in ("ps_egress", "ps_ingress"):
                net[key] = {"bandwidth": 600.0, "sharing": sharing}
        proto = {"kind": kind} | {"softsync": {"n": 2}, "ssp": {"s": 1}}.get(kind, {})
        yield {"seed": 0, "protocol": proto,
               "cluster": {"learners": 3, "network": net, "availability": avail,
                           "compute": {"dist": "constant", "value": 1.0}},
               "run": {"gradients": 120, "trace_only": True}}


def test_availability_periods_as_rare_timeouts_give_the_traces_of_timeouts(monkeypatch):
    # A learner's up and down periods wait in the environment's heap of rare events: the
    # traces are those of periods timed by SimPy timeouts, to the bit, where a period
    # ends as a step does.
    scenarios = [load_scenario(d) for d in _availability_grid()]
    rare = [simulate(s) for s in scenarios]
    assert sum(r.num_down for r in rare) > 36 * 20  # periods end, over and over
    monkeypatch.setattr(Environment, "rare_timeout", _as_timeout)
    assert [simulate(s).hash() for s in scenarios] == [r.hash() for r in rare]
