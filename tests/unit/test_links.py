"""The PS's shared network interface (cluster.network.ps_ingress / ps_egress,
asyncsim.timing.links): hand-worked transfers, saturation at bandwidth / bytes, and
determinism. Grids where the links' events meet other events at one instant, under churn
too, are in the golden trace table (tests/unit/test_golden_traces.py)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from asyncsim.drivers.trace_only import simulate
from asyncsim.errors import ScenarioError
from asyncsim.scenario import load_scenario
from asyncsim.timing.links import SharedLink


def finish_times(sharing: str, starts: list[tuple[float, float]], bandwidth: float = 1.0):
    """When each transfer (start time, bytes) ends, and the order the events fired."""
    env = simpy.Environment()
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
    env = simpy.Environment(initial_time=8000.0)
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
    env = simpy.Environment()
    link = SharedLink(env, 1.0, "fair")
    ends = {}

    def pull():
        yield link.transfer(1.0)
        yield env.timeout(0.25)
        ends["B"] = env.now

    def push():
        yield env.timeout(0.5)
        yield link.transfer(1.0)
        ends["A"] = env.now

    env.process(pull())
    env.process(push())
    env.run()
    assert ends == pytest.approx({"B": 1.75, "A": 2.0})


def test_a_step_through_both_fair_interfaces_by_hand():
    # One learner: its pull, 1 B over a 1 B/s fair egress then its own link (0.25 s);
    # compute 1 s; its push link 0.5 s, then 1 B over a 1 B/s fair ingress. Alone
    # throughout: out of the egress at 1.0, weights in at 1.25, computed at 2.25 (t_push),
    # off its link at 2.75, in at 3.75; the next step pulls then.
    def lat(value):
        return {"bytes": 1, "latency": {"dist": "constant", "value": value}}

    t = simulate(load_scenario({"cluster": {
        "learners": 1, "compute": {"dist": "constant", "value": 1.0},
        "network": {"pull": lat(0.25), "push": lat(0.5),
                    "ps_egress": {"bandwidth": 1.0, "sharing": "fair"},
                    "ps_ingress": {"bandwidth": 1.0, "sharing": "fair"}}},
        "run": {"gradients": 2, "trace_only": True}}))
    g = t.grads
    assert g["t_pull"].tolist() == [0.0, 3.75]
    assert g["t_push"].tolist() == [2.25, 6.0]
    assert g["t_arrive"].tolist() == [3.75, 7.5]
    # Zero bytes cross at once.
    env = simpy.Environment()
    ev = SharedLink(env, 1.0, "fair").transfer(0)
    env.run()
    assert ev.processed and env.now == 0.0


def _one_goes_down(down_at: float, before: float | None):
    """Two 1 B transfers over a 1 B/s fair link from t = 0; the first's learner goes down at
    ``down_at`` (its process interrupted). Returns the second's end and whether the first
    was still crossing when the second ended."""
    env = simpy.Environment()
    link = SharedLink(env, 1.0, "fair")
    out = {}

    def first():
        try:
            if before is not None:
                yield env.timeout(before)  # the learner's own link
            yield link.transfer(1.0)
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


def test_a_transfer_ends_in_its_turn_among_the_events_of_its_instant():
    # A fair link's wake-up is a timeout, set when the transfer starts; the transfer's event
    # then succeeds in the wake-up's turn (and is processed after the events already due at
    # that instant). 1 B at 1 B/s from 0: ends at 1.0, between a timeout to 1.0 set before
    # the transfer started and one set after it, and its event comes after both.
    env = simpy.Environment()
    link = SharedLink(env, 1.0, "fair")
    order = []

    def mark(name):
        return lambda _: order.append((name, env.now))

    env.timeout(1.0).callbacks.append(mark("timeout before"))
    ev = link.transfer(1.0)
    ev.callbacks.append(mark("transfer"))
    env.timeout(1.0).callbacks.append(mark("timeout after"))
    env.timeout(0.5).callbacks.append(mark("timeout 0.5"))
    env.run()
    assert order == [("timeout 0.5", 0.5), ("timeout before", 1.0), ("timeout after", 1.0),
                     ("transfer", 1.0)]


def test_shared_links_run_on_simpys_environment():
    env = simpy.Environment()
    assert SharedLink(env, 1.0, "fair").sharing == "fair"
    assert SharedLink(env, 1.0, "fifo").sharing == "fifo"
    with pytest.raises(ValueError, match="sharing"):
        SharedLink(env, 1.0, "lifo")


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
    env = simpy.Environment()
    link = SharedLink(env, 1.0, "fair")
    leg = _Counted(0.25)
    ends = []

    def learner():  # as Simulation.learner_loop times a pull
        try:
            yield link.transfer(1.0)
            yield env.timeout(leg.next(0.0))
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
