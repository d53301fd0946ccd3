"""The update core's pieces one by one (asyncsim.numerics.chain and the modules of its pieces),
each on an example small enough to work by hand, and the chain make_core assembles."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from asyncsim.config import MomentumConfig, OptimizerConfig, ScheduleConfig
from asyncsim.errors import ScenarioError
from asyncsim.numerics.aggregation import aggregate, softsync_weights, weighted_sum
from asyncsim.numerics.chain import Piece, chain, read_slots, unless_all_padding
from asyncsim.numerics.compensation import compensated, make_compensation
from asyncsim.numerics.core import CoreState, core_pieces, make_core
from asyncsim.numerics.lr_rules import get_lr_rule
from asyncsim.numerics.momentum import buffer_momentum, descend, shifted_momentum
from asyncsim.numerics.schedule import scheduled
from asyncsim.numerics.transforms import make_transform, server_transform
from asyncsim.numerics.weight_decay import weight_decay
from asyncsim.numerics.weights import nominal_staleness, rule_rates, running_mean_staleness


def f32(*x):
    return jnp.asarray(x, jnp.float32)


def state(params, **kw) -> CoreState:
    fields = {"momentum": (), "stale_sum": jnp.float32(0), "grad_count": jnp.float32(0),
              "hyper": {"lr": jnp.float32(0.5), "beta": jnp.float32(0.5),
                        "weight_decay": jnp.float32(0.0)}}
    fields.update(kw)
    return CoreState(params=params, **fields)


def slots(grads, tau, mask=None, params=None, **kw):
    params = {"w": f32(0.0, 0.0)} if params is None else params
    c = len(tau)
    return read_slots(params, grads, staleness=jnp.asarray(tau), learner_ids=jnp.zeros(c),
                      step=jnp.int32(0), mask=None if mask is None else jnp.asarray(mask), **kw)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_chain_threads_pieces_in_order_and_merges_their_fields():
    def scaled(k):
        return Piece(lambda p: {"stale_sum": k}, lambda u, s: (u._replace(c=u.c * k), s))

    def plus(k):
        return Piece(lambda p: {"grad_count": k}, lambda u, s: (u._replace(c=u.c + k), s))

    u = slots({"w": f32([1.0, 1.0])}, [0])
    assert chain(scaled(3), plus(1)).update(u, None)[0].c == 4  # (1 * 3) + 1
    assert chain(plus(1), scaled(3)).update(u, None)[0].c == 6  # (1 + 1) * 3
    assert chain(scaled(3), plus(1)).init({}) == {"stale_sum": 3, "grad_count": 1}


def test_read_slots_zeroes_and_skips_padding():
    u = slots({"w": f32([1.0, 2.0], [np.nan, np.inf])}, [3, 5], mask=[True, False])
    close(u.grads["w"], [[1.0, 2.0], [0.0, 0.0]])
    assert float(u.n_valid) == 1.0 and float(u.tau_sum) == 3.0 and u.c == 2
    with pytest.raises(ValueError, match="must have shape"):
        slots({"w": f32([1.0, 2.0])}, [3, 5])


def test_running_mean_staleness_and_nominal_delay_by_hand():
    s = state({"w": f32(0.0, 0.0)}, stale_sum=jnp.float32(3), grad_count=jnp.float32(2))
    u = slots({"w": f32([1.0, 1.0], [1.0, 1.0])}, [1, 4], mask=[True, False])
    u2, s2 = running_mean_staleness().update(u, s)
    close(u2.mean_tau, 4.0 / 3.0)  # (3 + 1) / (2 + 1): the padding slot's 4 is not counted
    assert float(s2.stale_sum) == 4.0 and float(s2.grad_count) == 3.0
    u3, _ = nominal_staleness(2.0).update(u2, s2)
    close(u3.tau, [2.0, 2.0])
    close(u3.mean_tau, 2.0)


def test_rule_rates_inside_or_outside_the_buffer():
    s = state({"w": f32(0.0)})
    u = slots({"w": f32([1.0], [1.0], [1.0])}, [1, 2, 4])._replace(mean_tau=jnp.float32(2))
    rule = get_lr_rule("inverse-staleness")
    inside, _ = rule_rates(rule, rate_outside=False).update(u, s)
    close(inside.rates, [0.5, 0.25, 0.125])  # alpha0 / tau at alpha0 = 0.5
    assert inside.eta is None
    outside, _ = rule_rates(rule, rate_outside=True).update(u, s)
    close(outside.rates, [1.0, 0.5, 0.25])
    close(outside.eta, 0.5)
    # the schedule scales the rates under caffe, the outer rate otherwise
    half = scheduled(lambda step: jnp.float32(0.5)).update
    close(half(inside, s)[0].rates, [0.25, 0.125, 0.0625])
    close(half(outside, s)[0].rates, [1.0, 0.5, 0.25])
    close(half(outside, s)[0].eta, 0.25)


def test_softsync_weights_divide_by_the_valid_slots():
    u = slots({"w": f32([1.0], [1.0], [1.0])}, [0, 0, 0])._replace(rates=f32(0.3, 0.6, 0.9))
    close(softsync_weights().update(u, None)[0].weights, [0.1, 0.2, 0.3])
    m = slots({"w": f32([1.0], [1.0], [1.0])}, [0, 0, 0], mask=[True, False, True])
    m = m._replace(rates=f32(0.3, 0.6, 0.9))
    close(softsync_weights().update(m, None)[0].weights, [0.15, 0.0, 0.45])


def test_aggregate_of_two_gradients_by_hand():
    # d = 0.5 g1 + 0.25 g2 + (0.5 + 0.25) (0.1 * 2) theta
    theta = {"w": f32(2.0, 4.0)}
    u = slots({"w": f32([1.0, 2.0], [3.0, -1.0])}, [0, 0], params=theta)
    u = u._replace(weights=f32(0.5, 0.25), wd=jnp.float32(0.1), decay={"w": 2.0})
    close(aggregate().update(u, None)[0].direction["w"], [1.25 + 0.3, 0.75 + 0.6])
    one = slots({"w": f32([1.0, 2.0])}, [0], params=theta)
    one = one._replace(weights=f32(0.5), wd=jnp.float32(0.1), decay={"w": 2.0})
    close(aggregate().update(one, None)[0].direction["w"], [0.5 + 0.2, 1.0 + 0.4])


@pytest.mark.parametrize("c", [2, 7, 30])
def test_weighted_sum_adds_in_slot_order_as_a_scan_does(c):
    """The slots summed from zero in slot order, each step ``acc + w_l g_l``: bit for bit
    what a ``lax.scan`` over the slots computes (the order numerics revision 2 fixed), inside
    a larger program as alone, on the studies' 3072 x 128 layer."""
    import jax

    rng = np.random.default_rng(c)
    grads = {"w": jnp.asarray(rng.standard_normal((c, 3072, 128)), jnp.float32),
             "b": jnp.asarray(rng.standard_normal((c, 128)), jnp.float32)}
    weights = jnp.asarray(rng.random(c), jnp.float32)

    def scanned(weights, grads):
        def add(acc, slot):
            w, g = slot
            return jax.tree_util.tree_map(lambda a, gl: a + w * gl, acc, g), None

        zeros = jax.tree_util.tree_map(lambda g: jnp.zeros(g.shape[1:], g.dtype), grads)
        return jax.lax.scan(add, zeros, (weights, grads))[0]

    def in_update(sum_fn):  # the sum feeding a step, as the update program uses it
        return jax.jit(lambda w, g: jax.tree_util.tree_map(lambda s: 0.5 - 0.1 * s,
                                                           sum_fn(w, g)))

    for wrap in (jax.jit, in_update):
        got, want = wrap(weighted_sum)(weights, grads), wrap(scanned)(weights, grads)
        for k in grads:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
    # and it is the weighted sum: numpy's, in float64, to float32 rounding
    exact = np.einsum("l,lij->ij", np.asarray(weights, np.float64),
                      np.asarray(grads["w"], np.float64))
    got = np.asarray(jax.jit(weighted_sum)(weights, grads)["w"], np.float64)
    assert np.abs(got - exact).max() < 1e-5 * max(1.0, np.abs(exact).max()) * c


def test_weight_decay_multipliers_and_scope():
    params = {"fc": {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}, "conv": {"w": jnp.ones((2, 2))}}
    s = state(params, hyper={"lr": 1.0, "beta": 0.0, "weight_decay": jnp.float32(0.01)})
    u = slots({"w": f32([0.0])}, [0], params=params)
    u2, _ = weight_decay({"fc": 3.0, "fc/w": 5.0}, "all").update(u, s)
    assert u2.decay == {"fc": {"w": 5.0, "b": 3.0}, "conv": {"w": 1.0}}  # longest prefix
    close(u2.wd, 0.01)
    u3, _ = weight_decay({"fc": 3.0}, "weights").update(u, s)
    assert u3.decay == {"fc": {"w": 3.0, "b": 0.0}, "conv": {"w": 1.0}}  # rank < 2: none
    with pytest.raises(ScenarioError, match="weight_decay_mult.fc2"):
        weight_decay({"fc2": 3.0}, "all").init(params)


@pytest.mark.parametrize("nesterov,torch,dampening,m,step", [
    (False, False, None, 2.5, 2.5),      # m = 0.5 * 1 + 2
    (True, False, None, 2.5, 3.25),      # step = 2 + 0.5 * 2.5
    (False, False, 0.3, 1.9, 1.9),       # m = 0.5 * 1 + 0.7 * 2
    (False, False, "beta", 1.5, 1.5),    # dampened: m = 0.5 * 1 + 0.5 * 2
    (False, True, None, 2.0, 2.0),       # torch: the first step is a copy, m = d
])
def test_buffer_momentum_by_hand(nesterov, torch, dampening, m, step):
    params = {"w": f32(0.0)}
    s = state(params, momentum={"w": f32(1.0)},
              started=jnp.zeros((), bool) if torch else ())
    u = slots({"w": f32([0.0])}, [0], params=params)._replace(direction={"w": f32(2.0)})
    u2, s2 = buffer_momentum(nesterov=nesterov, torch=torch, dampening=dampening).update(u, s)
    close(s2.momentum["w"], [m])
    close(u2.direction["w"], [step])
    if torch:
        assert bool(s2.started)


def test_shifted_momentum_steps_each_learners_buffer_by_hand():
    params = {"w": f32(0.0)}
    s = state(params, momentum={"w": f32([1.0], [0.0], [0.0])}, started=())
    u = read_slots(params, {"w": f32([2.0], [4.0])}, staleness=jnp.zeros(2),
                   learner_ids=jnp.asarray([0, 2]), step=0)
    u = u._replace(weights=f32(0.5, 0.5), wd=jnp.float32(0.0), decay={"w": 1.0})
    u2, s2 = shifted_momentum(3, torch=False, dampening=None).update(u, s)
    close(s2.momentum["w"], [[1.5], [0.0], [2.0]])  # 0.5 * 1 + 1; learner 1 untouched; 2
    close(u2.direction["w"], [3.5])


def test_descend_with_the_rate_inside_or_outside():
    params = {"w": f32(1.0, 2.0)}
    u = slots({"w": f32([0.0, 0.0])}, [0], params=params)._replace(direction={"w": f32(1.0, 4.0)})
    close(descend().update(u, state(params))[1].params["w"], [0.0, -2.0])
    u = u._replace(eta=jnp.float32(0.25))
    close(descend().update(u, state(params))[1].params["w"], [0.75, 1.0])


def test_server_transform_sgd_is_theta_minus_eta_d():
    params = {"w": f32(1.0, 2.0)}
    tx = make_transform({"name": "sgd"})
    piece = server_transform(tx)
    s = state(params, **piece.init(params))
    u = slots({"w": f32([0.0, 0.0])}, [0], params=params)
    u = u._replace(direction={"w": f32(1.0, 4.0)}, eta=jnp.float32(0.25))
    close(piece.update(u, s)[1].params["w"], [0.75, 1.0])


def test_compensated_dc_asgd_by_hand():
    # g~ = g + lambda g g (theta_now - theta_read) = 2 + 0.5 * 4 * (1 - 0.5)
    params = {"w": f32(1.0)}
    piece = compensated(make_compensation({"kind": "dc-asgd", "lambda": 0.5}))
    u = slots({"w": f32([2.0])}, [1], params=params, read_params={"w": f32([0.5])})
    close(piece.update(u, state(params, comp=()))[0].grads["w"], [[3.0]])
    with pytest.raises(ValueError, match="needs read_params"):
        piece.update(slots({"w": f32([2.0])}, [1], params=params), state(params, comp=()))


def test_all_padding_update_keeps_the_step_but_not_the_clock():
    params = {"w": f32(1.0)}
    core = make_core(OptimizerConfig(momentum=MomentumConfig(kind="heavy-ball")),
                     num_learners=1)
    s = core.init(params)
    s = core.apply(s, {"w": f32([1.0])}, staleness=[0], learner_ids=[0], step=0)
    empty = core.apply(s, {"w": f32([np.nan])}, staleness=[3], learner_ids=[0], step=1,
                       mask=[False])
    close(empty.params["w"], s.params["w"])
    close(empty.momentum["w"], s.momentum["w"])
    assert float(empty.grad_count) == 1.0
    guard = unless_all_padding(Piece(lambda p: {}, lambda u, st: (u, st)))
    assert guard.init(params) == {}


def _names(opt, **kw):
    return [p.update.__qualname__.split(".")[0] for p in core_pieces(opt, num_learners=2, **kw)]


def test_core_pieces_is_the_documented_chain():
    sched = ScheduleConfig(warmup_updates=3)
    hb = OptimizerConfig(momentum=MomentumConfig(kind="heavy-ball"), schedule=sched,
                         compensation={"kind": "gap-aware"})
    assert _names(hb) == ["running_mean_staleness", "compensated", "rule_rates", "scheduled",
                          "softsync_weights", "weight_decay", "aggregate", "buffer_momentum",
                          "descend", "step_statistics"]
    shifted = OptimizerConfig(momentum=MomentumConfig(kind="shifted"), lr_staleness="nominal")
    assert _names(shifted, nominal_staleness=1.0) == [
        "running_mean_staleness", "nominal_staleness", "rule_rates", "softsync_weights",
        "weight_decay", "shifted_momentum", "descend"]
    adam = OptimizerConfig(transform={"name": "adam"})
    assert _names(adam) == ["running_mean_staleness", "rule_rates", "softsync_weights",
                            "weight_decay", "aggregate", "server_transform"]
    assert _names(OptimizerConfig())[-2:] == ["aggregate", "descend"]


def test_compensated_gap_aware_with_per_learner_buffers_by_hand():
    """Shifted momentum: gap-aware averages the square of the gradient's learner's buffer
    (caffe: divided by lr), or of the gradient itself where that buffer has not started --
    a zero reference would make C vanish and crush the learner's first stale gradient."""
    params = {"w": f32(1.0)}
    comp = make_compensation({"kind": "gap-aware"})
    piece = compensated(comp, buffer="per-learner", caffe=True)
    bufs = {"w": f32([0.25], [0.0])}  # learner 0: 0.25 (caffe units, lr 0.5); 1: none yet
    u = slots({"w": f32([2.0], [2.0])}, [1, 1], params=params,
              read_params={"w": f32([0.5], [0.5])})
    u = u._replace(learner_ids=jnp.asarray([0, 1], jnp.int32))
    got = piece.update(u, state(params, momentum=bufs, comp=comp.init(params)))[0].grads["w"]
    gm, lr, gap = 0.999, 0.5, 0.5
    v1 = (1 - gm) * 0.5**2  # slot 0: learner 0's buffer / lr = 0.5
    c1 = lr * (np.sqrt(v1 / (1 - gm)) + 1e-8)
    v2 = gm * v1 + (1 - gm) * 2.0**2  # slot 1: learner 1 has no buffer yet: its gradient
    c2 = lr * (np.sqrt(v2 / (1 - gm**2)) + 1e-8)
    # float32's 1 - 0.999 is 1.3e-5 off: a few 1e-6 here
    np.testing.assert_allclose(got[:, 0], [2.0 / (1 + gap / c1), 2.0 / (1 + gap / c2)],
                               rtol=1e-5)
    assert float(got[1, 0]) > 1.0  # not crushed to ~1e-8
