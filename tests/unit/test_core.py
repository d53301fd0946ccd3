"""Tests of the update core (asyncsim.numerics.core): rules table, reference equivalences,
hand examples.

Everything runs on tiny pytrees and diagonal quadratics L(theta) = 1/2 sum h (theta - t*)^2.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncsim.config import MOMENTUM_KINDS, MomentumConfig, OptimizerConfig, ScheduleConfig
from asyncsim.numerics.core import (
    CoreState,
    as_optax,
    available_lr_rules,
    get_lr_rule,
    make_core,
    param_hash,
    register_lr_rule,
)
from asyncsim.numerics.lr_rules import rate_at_delay
from asyncsim.testing import lr_rule_specs

# The tables come from the registries: a new rule or momentum kind is tested with no edit here.
BUILTIN_RULES = available_lr_rules()
# Built-in rules with a parameter that has no default: the table runs them with one.
REQUIRED_PARAMETERS = {"exponential": {"name": "exponential", "a": 0.1}}
KINDS = list(MOMENTUM_KINDS)


# ----------------------------------------------------------------------------- fixtures
def tiny_params():
    return {
        "conv1": {"w": jnp.array([1.0, -2.0, 0.5], jnp.float32), "b": jnp.float32(0.3)},
        "fc": {"w": jnp.array([[1.5, -1.0], [0.25, 2.0]], jnp.float32)},
    }


def curvature(params):
    """Per-element Hessian diagonal in [1, 2] and the minimiser, shaped like params."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    sizes = [int(np.size(x)) for x in leaves]
    h = np.linspace(1.0, 2.0, sum(sizes)).astype(np.float32)
    t = np.linspace(-1.0, 1.0, sum(sizes)).astype(np.float32)
    hs, ts, i = [], [], 0
    for x, n in zip(leaves, sizes, strict=True):
        hs.append(jnp.asarray(h[i : i + n].reshape(np.shape(x))))
        ts.append(jnp.asarray(t[i : i + n].reshape(np.shape(x))))
        i += n
    return treedef.unflatten(hs), treedef.unflatten(ts)


def quad_grad(params, h, target):
    return jax.tree_util.tree_map(lambda p, hh, t: hh * (p - t), params, h, target)


def quad_loss(params, h, target):
    return sum(
        float(jnp.sum(0.5 * hh * (p - t) ** 2))
        for p, hh, t in zip(
            jax.tree_util.tree_leaves(params),
            jax.tree_util.tree_leaves(h),
            jax.tree_util.tree_leaves(target),
            strict=True,
        )
    )


def stack(*trees):
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


def opt(lr=0.1, rule="constant", kind="none", beta=0.9, **kw) -> OptimizerConfig:
    return OptimizerConfig(lr=lr, lr_rule=rule, momentum=MomentumConfig(kind=kind, beta=beta), **kw)


def structure_and_dtypes(state: CoreState):
    leaves, treedef = jax.tree_util.tree_flatten(state)
    return treedef, [(jnp.result_type(x), jnp.shape(x)) for x in leaves]


# ----------------------------------------------------------------------------- rules table
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rule", BUILTIN_RULES)
def test_rules_table(rule, kind):
    """Every LR rule x momentum kind: converges with constant staleness, compiles once, keeps
    the state's structure and dtypes (optax alias_test style)."""
    tau = 2
    n = tau + 1  # round robin: learner t mod n reads version t - tau
    rule = REQUIRED_PARAMETERS.get(rule, rule)
    core = make_core(opt(lr=0.1, rule=rule, kind=kind, beta=0.5), num_learners=n)
    params = tiny_params()
    h, target = curvature(params)
    state = core.init(params)
    shape0 = structure_and_dtypes(state)

    traces = []

    def counted(*args, **kw):
        traces.append(1)
        return core.apply(*args, **kw)

    step = jax.jit(counted)
    grad = jax.jit(lambda p: stack(quad_grad(p, h, target)))
    ring = [params] * (tau + 1)  # versions t - tau .. t (earliest start = version 0)
    loss0 = quad_loss(params, h, target)
    stale = np.array([tau], np.int32)
    ids = [np.array([k], np.int32) for k in range(n)]
    for t in range(200):
        state = step(state, grad(ring[0]), staleness=stale, learner_ids=ids[t % n], step=t)
        ring = ring[1:] + [state.params]
        if t == 1:
            assert step._cache_size() == 1
    assert len(traces) == 1, "apply retraced when only values changed"
    assert step._cache_size() == 1
    assert structure_and_dtypes(state) == shape0
    assert quad_loss(state.params, h, target) < 1e-4 * loss0
    assert float(state.grad_count) == 200.0
    assert float(state.stale_sum) == 200.0 * tau


def test_no_retrace_with_mask_and_hyper_values():
    core = make_core(opt(rule="inverse-staleness", kind="shifted"), num_learners=4)
    params = tiny_params()
    traces = []

    def counted(*args, **kw):
        traces.append(1)
        return core.apply(*args, **kw)

    step = jax.jit(counted)
    g = stack(params, params)
    for i, lr in enumerate([0.1, 0.2, 0.3]):
        state = core.init(params, lr=lr, beta=0.5 + 0.1 * i, weight_decay=1e-3 * i)
        step(
            state,
            g,
            staleness=np.array([i, i + 1], np.int32),
            learner_ids=np.array([i, (i + 1) % 4], np.int32),
            step=jnp.int32(i),
            mask=np.array([True, i != 1]),
        )
    assert len(traces) == 1


# ----------------------------------------------------------------------------- equivalences
def _grad_sequence(params, n, seed=0):
    rng = np.random.default_rng(seed)
    return [
        jax.tree_util.tree_map(
            lambda p: jnp.asarray(rng.normal(size=np.shape(p)), jnp.float32), params
        )
        for _ in range(n)
    ]


def _run_core(core, params, grads, jit=True):
    state = core.init(params)
    apply = jax.jit(core.apply) if jit else core.apply
    zero = np.zeros(1, np.int32)
    for t, g in enumerate(grads):
        state = apply(state, stack(g), staleness=zero, learner_ids=zero, step=t)
    return state.params


def _run_optax(tx, params, grads, jit=True):
    def step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    if jit:
        step = jax.jit(step)

    s = tx.init(params)
    for g in grads:
        params, s = step(params, s, g)
    return params


def _assert_trees(a, b, exact=False, rtol=1e-5, atol=1e-6):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        assert jnp.result_type(x) == jnp.result_type(y)
        if exact:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def test_one_learner_zero_delay_is_optax_sgd_exactly():
    params = tiny_params()
    grads = _grad_sequence(params, 25)
    core = make_core(opt(lr=0.1), num_learners=1)
    # The reference runs op by op: under jit XLA fuses optax's p + (-lr) g into an FMA,
    # which rounds once instead of twice. The core (jitted or not) matches plain SGD.
    ref = _run_optax(optax.sgd(0.1), params, grads, jit=False)
    _assert_trees(_run_core(core, params, grads, jit=True), ref, exact=True)
    _assert_trees(_run_core(core, params, grads, jit=False), ref, exact=True)


@pytest.mark.parametrize("kind,nesterov", [("heavy-ball", False), ("nesterov", True)])
def test_momentum_matches_optax(kind, nesterov):
    params = tiny_params()
    grads = _grad_sequence(params, 30, seed=1)
    ours = _run_core(make_core(opt(lr=0.05, kind=kind, beta=0.9), num_learners=1), params, grads)
    ref = _run_optax(optax.sgd(0.05, momentum=0.9, nesterov=nesterov), params, grads)
    _assert_trees(ours, ref)


def test_dampened_is_heavy_ball_with_scaled_rate():
    """P2: dampened momentum is heavy ball with eta -> eta (1 - beta)."""
    params = tiny_params()
    grads = _grad_sequence(params, 20, seed=2)
    a = _run_core(make_core(opt(lr=0.1, kind="dampened", beta=0.8), num_learners=1), params, grads)
    b = _run_core(
        make_core(opt(lr=0.1 * (1 - 0.8), kind="heavy-ball", beta=0.8), num_learners=1),
        params,
        grads,
    )
    _assert_trees(a, b)


def test_hardsync_is_sgd_on_mean_gradient():
    """P1: hardsync theta <- theta - alpha (1/lambda) sum_l Delta theta_l (batch mu lambda)."""
    lam, lr = 4, 0.1
    params = tiny_params()
    core = make_core(opt(lr=lr, rule="inverse-staleness"), num_learners=lam)
    state = core.init(params)
    ref = params
    apply = jax.jit(core.apply)
    for t in range(10):
        gs = _grad_sequence(params, lam, seed=10 + t)
        state = apply(
            state,
            stack(*gs),
            staleness=np.zeros(lam, np.int32),
            learner_ids=np.arange(lam, dtype=np.int32),
            step=t,
        )
        mean = jax.tree_util.tree_map(lambda *xs: sum(xs) / lam, *gs)
        ref = jax.tree_util.tree_map(lambda p, g: p - lr * g, ref, mean)
    _assert_trees(state.params, ref)


def test_as_optax_wrapper():
    params = tiny_params()
    grads = _grad_sequence(params, 10, seed=3)
    core = make_core(opt(lr=0.05, kind="heavy-ball"), num_learners=1)
    got = _run_optax(as_optax(core), params, grads)
    _assert_trees(got, _run_core(core, params, grads))


def test_vmap_over_hyperparameters():
    """A learning-rate sweep is a vmap over the state's hyper scalars."""
    params = tiny_params()
    core = make_core(opt(kind="heavy-ball"), num_learners=1)
    lrs = jnp.array([0.01, 0.1], jnp.float32)
    states = jax.vmap(lambda lr: core.init(params, lr=lr))(lrs)
    g = stack(_grad_sequence(params, 1)[0])
    zero = np.zeros(1, np.int32)

    def one(s):
        return core.apply(s, g, staleness=zero, learner_ids=zero, step=0)

    out = jax.jit(jax.vmap(one))(states)
    for i, lr in enumerate([0.01, 0.1]):
        single = one(core.init(params, lr=lr))
        _assert_trees(jax.tree_util.tree_map(lambda x, i=i: x[i], out.params), single.params)


# ----------------------------------------------------------------------------- hand examples
def _scalar_updates(core, updates, theta0=1.0):
    state = core.init({"w": jnp.array([theta0], jnp.float32)})
    thetas = []
    for step, (g, tau) in enumerate(updates):
        state = core.apply(
            state,
            {"w": jnp.asarray(g, jnp.float32)[:, None]},
            staleness=np.asarray(tau, np.int32),
            learner_ids=np.zeros(len(tau), np.int32),
            step=step,
        )
        thetas.append(float(state.params["w"][0]))
    return state, thetas


UPDATES = [  # (gradients of the c = 2 learners, their staleness)
    ([1.0, 2.0], [0, 0]),
    ([4.0, -2.0], [1, 2]),
    ([3.0, 6.0], [4, 2]),
]


def test_three_updates_by_hand_inverse_staleness():
    """P1: g = (1/c) sum_l alpha(tau_l) Delta theta_l, alpha(tau) = alpha0/tau (alpha0 at 0).

    alpha0 = 0.1, c = 2, theta0 = 1:
      1: alpha = (0.1, 0.1):    g = (0.1*1 + 0.1*2)/2      = 0.15    theta = 0.85
      2: alpha = (0.1, 0.05):   g = (0.1*4 - 0.05*2)/2     = 0.15    theta = 0.70
      3: alpha = (0.025, 0.05): g = (0.025*3 + 0.05*6)/2   = 0.1875  theta = 0.5125
    """
    core = make_core(opt(lr=0.1, rule="inverse-staleness"), num_learners=2)
    state, thetas = _scalar_updates(core, UPDATES)
    np.testing.assert_allclose(thetas, [0.85, 0.70, 0.5125], rtol=1e-6)
    assert float(state.stale_sum) == 9.0 and float(state.grad_count) == 6.0


def test_three_updates_by_hand_inverse_mean_staleness():
    """1509.04210: alpha = alpha0 / max(<tau>, 1), <tau> over all gradients so far incl. now.

    1: <tau> = 0/2 = 0   -> alpha = 0.1;     g = 0.1*(1+2)/2        = 0.15  theta = 0.85
    2: <tau> = 3/4       -> alpha = 0.1;     g = 0.1*(4-2)/2        = 0.1   theta = 0.75
    3: <tau> = 9/6 = 1.5 -> alpha = 0.1/1.5; g = (0.1/1.5)*(3+6)/2  = 0.3   theta = 0.45
    """
    core = make_core(opt(lr=0.1, rule="inverse-mean-staleness"), num_learners=2)
    _, thetas = _scalar_updates(core, UPDATES)
    np.testing.assert_allclose(thetas, [0.85, 0.75, 0.45], rtol=1e-6)


def test_heavy_ball_rate_inside_momentum_by_hand():
    """Caffe/P1 style m <- beta m + d with d already rate-scaled (beta = 0.5, constant 0.1):
    1: d = 0.15,  m = 0.15,            theta = 0.85
    2: d = 0.1,   m = 0.075 + 0.1,     theta = 0.675
    3: d = 0.45,  m = 0.0875 + 0.45,   theta = 0.1375
    """
    core = make_core(opt(lr=0.1, kind="heavy-ball", beta=0.5), num_learners=2)
    _, thetas = _scalar_updates(core, UPDATES)
    np.testing.assert_allclose(thetas, [0.85, 0.675, 0.1375], rtol=1e-6)


# ----------------------------------------------------------------------------- shifted momentum
@pytest.mark.parametrize("tau", [1, 2, 5])
def test_shifted_round_robin_matches_closed_recurrence(tau):
    """P2: with N = tau + 1 round-robin workers, per-worker momentum buffers give
    w_{t+1} = w_t - eta grad L(w_{t-tau}) + beta (w_{t-tau} - w_{t-tau-1}), w_{<0} = w_0."""
    eta, beta, steps = 0.05, 0.9, 30
    h = np.array([0.3, 1.0, 2.0])
    target = np.array([1.0, -0.5, 0.25])
    w0 = np.array([0.0, 1.0, -1.0])
    n = tau + 1
    core = make_core(opt(lr=eta, kind="shifted", beta=beta), num_learners=n)
    state = core.init({"w": jnp.asarray(w0, jnp.float32)})
    apply = jax.jit(core.apply)
    hist = [state.params["w"]]  # ring of past versions
    for t in range(steps):
        read = hist[max(t - tau, 0)]
        g = jnp.asarray(h, jnp.float32) * (read - jnp.asarray(target, jnp.float32))
        state = apply(
            state,
            {"w": g[None]},
            staleness=np.array([tau], np.int32),
            learner_ids=np.array([t % n], np.int32),
            step=t,
        )
        hist.append(state.params["w"])

    ws = [w0.copy()]  # the closed recurrence in float64

    def w(i):
        return ws[max(i, 0)]

    for t in range(steps):
        ws.append(w(t) - eta * h * (w(t - tau) - target) + beta * (w(t - tau) - w(t - tau - 1)))
    np.testing.assert_allclose(np.stack([np.asarray(x) for x in hist]), np.stack(ws), atol=1e-6)


def test_shifted_same_learner_twice_applies_in_order():
    """Learner 0 twice in one update: its buffer takes both gradients in slot order and the
    step sums the buffer after each slot: m1 = beta m + d1, m2 = beta m1 + d2, theta -= m1+m2."""
    beta, lr = 0.5, 0.2
    core = make_core(opt(lr=lr, kind="shifted", beta=beta), num_learners=2)
    state = core.init({"w": jnp.zeros(1, jnp.float32)})
    one = np.zeros(1, np.int32)
    state = core.apply(state, {"w": jnp.ones((1, 1))}, staleness=one, learner_ids=one, step=0)
    m = 0.2  # learner 0's buffer; theta = -0.2
    state = core.apply(
        state,
        {"w": jnp.array([[1.0], [3.0]])},
        staleness=np.zeros(2, np.int32),
        learner_ids=np.array([0, 0], np.int32),
        step=1,
    )
    m1 = beta * m + lr * 1.0 / 2
    m2 = beta * m1 + lr * 3.0 / 2
    np.testing.assert_allclose(float(state.params["w"][0]), -0.2 - m1 - m2, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state.momentum["w"][:, 0]), [m2, 0.0], rtol=1e-6)


# ----------------------------------------------------------------------------- weight decay
def test_weight_decay_mult_longest_prefix_wins():
    params = {
        "conv1": {"w": jnp.ones(2), "b": jnp.ones(())},
        "fc": {"w": jnp.ones(2), "b": jnp.ones(())},
        "fc2": {"w": jnp.ones(2)},
    }
    lr, wd = 0.1, 0.01
    core = make_core(
        opt(lr=lr, weight_decay=wd, weight_decay_mult={"fc": 250.0, "fc/b": 0.0}),
        num_learners=1,
    )
    state = core.init(params)
    zeros = jax.tree_util.tree_map(lambda p: jnp.zeros((1, *p.shape)), params)
    z = np.zeros(1, np.int32)
    out = core.apply(state, zeros, staleness=z, learner_ids=z, step=0).params
    expect = {"conv1/w": 1.0, "conv1/b": 1.0, "fc/w": 250.0, "fc/b": 0.0, "fc2/w": 1.0}
    for key, mult in expect.items():
        a, b = key.split("/")
        np.testing.assert_allclose(np.asarray(out[a][b]), 1.0 - lr * wd * mult, rtol=1e-6)


def test_weight_decay_uses_fresh_master_weights_and_rates():
    """d = (1/c) sum_l alpha_l (g_l + wd theta): decay is scaled by each gradient's rate."""
    core = make_core(opt(lr=0.1, rule="inverse-staleness", weight_decay=0.5), num_learners=2)
    state = core.init({"w": jnp.array([2.0])})
    out = core.apply(
        state,
        {"w": jnp.array([[1.0], [1.0]])},
        staleness=np.array([0, 2], np.int32),
        learner_ids=np.array([0, 1], np.int32),
        step=0,
    )
    # alpha = (0.1, 0.05); d = (0.1*(1 + 1) + 0.05*(1 + 1)) / 2 = 0.15
    np.testing.assert_allclose(float(out.params["w"][0]), 2.0 - 0.15, rtol=1e-6)


def test_weight_decay_mult_unknown_prefix_is_an_error():
    core = make_core(opt(weight_decay=1e-3, weight_decay_mult={"fc1": 2.0}), num_learners=1)
    with pytest.raises(ValueError, match="fc1"):
        core.init(tiny_params())


# ----------------------------------------------------------------------------- schedule
def _rate_at(core, step):
    state = core.init({"w": jnp.zeros(1, jnp.float32)})
    z = np.zeros(1, np.int32)
    out = core.apply(state, {"w": jnp.ones((1, 1))}, staleness=z, learner_ids=z, step=step)
    return -float(out.params["w"][0])


def test_schedule_decay_at_epoch_boundaries():
    sched = ScheduleConfig(decay_epochs=(2.0, 3.0), decay_factor=0.1)
    core = make_core(opt(lr=1.0, schedule=sched), num_learners=1, updates_per_epoch=10)
    got = [_rate_at(core, s) for s in (0, 19, 20, 29, 30, 1000)]
    np.testing.assert_allclose(got, [1.0, 1.0, 0.1, 0.1, 0.01, 0.01], rtol=1e-6)


def test_schedule_fractional_updates_per_epoch():
    # epoch 0.1 * 30 must be update 3, not 4 (float64 0.1 * 30 = 3.0000000000000004)
    sched = ScheduleConfig(decay_epochs=(0.1,), decay_factor=0.5)
    core = make_core(opt(lr=1.0, schedule=sched), num_learners=1, updates_per_epoch=30)
    assert [_rate_at(core, s) for s in (2, 3)] == [1.0, 0.5]


@pytest.mark.parametrize(
    "sched,upe",
    [(ScheduleConfig(warmup_updates=4), None), (ScheduleConfig(warmup_epochs=0.5), 8)],
)
def test_schedule_linear_warmup(sched, upe):
    core = make_core(opt(lr=1.0, schedule=sched), num_learners=1, updates_per_epoch=upe)
    got = [_rate_at(core, s) for s in (0, 1, 2, 3, 4, 100)]
    np.testing.assert_allclose(got, [0.25, 0.5, 0.75, 1.0, 1.0, 1.0], rtol=1e-6)


@pytest.mark.parametrize(
    "sched",
    [ScheduleConfig(decay_epochs=(1.0,)), ScheduleConfig(warmup_epochs=1.0)],
)
def test_epoch_schedule_needs_updates_per_epoch(sched):
    with pytest.raises(ValueError, match="updates_per_epoch"):
        make_core(opt(schedule=sched), num_learners=1)


def test_config_errors():
    with pytest.raises(ValueError, match="warmup"):
        make_core(
            opt(schedule=ScheduleConfig(warmup_epochs=1.0, warmup_updates=3)),
            num_learners=1,
            updates_per_epoch=10,
        )
    with pytest.raises(ValueError, match="inverse-staleness"):  # lists the known rules
        make_core(opt(rule="no-such-rule"), num_learners=1)
    with pytest.raises(ValueError, match="shifted"):
        make_core(opt(kind="adam"), num_learners=1)


# ----------------------------------------------------------------------------- mask
@pytest.mark.parametrize("kind", KINDS)
def test_mask_ignores_padding_slots(kind):
    core = make_core(opt(lr=0.1, rule="inverse-staleness", kind=kind, beta=0.5), num_learners=3)
    params = {"w": jnp.array([1.0, 2.0])}
    s0 = core.init(params)
    real = core.apply(
        s0,
        {"w": jnp.array([[1.0, 2.0], [3.0, -1.0]])},
        staleness=np.array([1, 2], np.int32),
        learner_ids=np.array([0, 1], np.int32),
        step=0,
    )
    padded = core.apply(
        s0,
        {"w": jnp.array([[1.0, 2.0], [jnp.nan, jnp.inf], [3.0, -1.0]])},
        staleness=np.array([1, 99, 2], np.int32),
        learner_ids=np.array([0, 2, 1], np.int32),
        step=0,
        mask=np.array([True, False, True]),
    )
    _assert_trees(padded.params, real.params)
    _assert_trees(padded.momentum, real.momentum)
    assert float(padded.stale_sum) == 3.0 and float(padded.grad_count) == 2.0
    empty = core.apply(
        real,
        {"w": jnp.full((3, 2), jnp.nan)},
        staleness=np.zeros(3, np.int32),
        learner_ids=np.zeros(3, np.int32),
        step=1,
        mask=np.zeros(3, bool),
    )
    _assert_trees(empty, real, exact=True)


# ----------------------------------------------------------------------------- rule properties
# Fixed length: one compilation of the rule for all examples.
staleness_vectors = st.lists(st.integers(0, 10_000), min_size=16, max_size=16)
base_rates = st.floats(2.0**-20, 10.0, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(taus=staleness_vectors, lr=base_rates)
def test_inverse_staleness_property(taus, lr):
    tau = np.asarray(taus, np.float32)
    rates = np.asarray(get_lr_rule("inverse-staleness")(jnp.float32(lr), jnp.asarray(tau), 0.0))
    a0 = np.float32(lr)
    assert np.all(rates <= a0)
    np.testing.assert_array_equal(rates[tau <= 1], a0)
    np.testing.assert_allclose(rates[tau > 1], a0 / tau[tau > 1], rtol=1e-6)


@settings(max_examples=60, deadline=None)
@given(taus=staleness_vectors, lr=base_rates)
def test_stability_edge_property(taus, lr):
    tau = np.sort(np.asarray(taus, np.float32))
    rates = np.asarray(get_lr_rule("stability-edge")(jnp.float32(lr), jnp.asarray(tau), 0.0))
    assert np.all(np.diff(rates) <= 0)  # non-increasing in tau (float32 may tie)
    assert np.all(rates <= np.float32(lr) * (1 + 1e-6))
    big = tau >= 50
    np.testing.assert_allclose(rates[big], lr * np.pi / (4 * tau[big] + 2), rtol=1e-3)


def test_stability_edge_values():
    tau = jnp.arange(0, 64, dtype=jnp.float32)
    rates = np.asarray(get_lr_rule("stability-edge")(jnp.float32(1.0), tau, 0.0))
    assert rates[0] == 1.0 and np.all(np.diff(rates) < 0)  # strictly decreasing
    np.testing.assert_allclose(rates[1], math.sin(math.pi / 6), rtol=1e-6)  # P2: 1/2 of 2 sin


# ----------------------------------------------------------------------------- registry
def test_user_rule_registration(fresh_registries):
    @register_lr_rule("test-halved")
    def halved(lr, staleness, mean_staleness):
        return 0.5 * lr  # a scalar is broadcast to [c]

    assert set(BUILTIN_RULES) <= set(available_lr_rules())
    assert "test-halved" in available_lr_rules()
    # The one registration rule of every plug-in kind: another rule under a taken name is
    # refused, naming both; the same definition again (a re-run cell) is not.
    def doubled(lr, staleness, mean_staleness):
        return 2.0 * lr

    with pytest.raises(ValueError, match="already registered to .*halved; cannot register "
                                         ".*doubled"):
        register_lr_rule("test-halved", doubled)
    register_lr_rule("test-halved", halved)
    core = make_core(opt(lr=1.0, rule="test-halved"), num_learners=1)
    assert _rate_at(core, 0) == 0.5


@settings(max_examples=60, deadline=None)
@given(rule=lr_rule_specs(), lr=st.floats(1e-4, 1.0), tau=st.integers(0, 200))
def test_a_staler_gradient_never_gets_a_larger_rate(rule, lr, tau):
    """The staleness-aware invariant every built-in rule keeps, at any of its parameters:
    the rate at delay tau is in [0, lr] and does not grow with tau (float64, as the
    stability analysis evaluates rules)."""
    now, later = rate_at_delay(rule, lr, tau), rate_at_delay(rule, lr, tau + 1)
    assert 0.0 <= later <= now <= lr


def test_lr_rule_specs_draw_a_plugin_rules_parameters(fresh_registries):
    """`lr_rule_specs` draws a plug-in rule's parameters from its signature (a required
    float: always given; a flag: sometimes), keeping only what make_lr_rule accepts; a rule
    can declare its own strategy; an unknown name is refused."""
    from hypothesis.errors import InvalidArgument

    @register_lr_rule("test-floored")
    def floored(lr, staleness, mean_staleness, *, floor: float, hard: bool = False):
        if not 0 < floor <= 1:
            raise ValueError(f"floor: must be in (0, 1], got {floor!r}")
        return jnp.maximum(lr / jnp.maximum(staleness, 1.0), floor * lr)

    @register_lr_rule("test-own")
    def own(lr, staleness, mean_staleness, *, k: float = 1.0):
        return lr / (1.0 + k * staleness)

    own.params_strategy = lambda: st.fixed_dictionaries({"k": st.sampled_from([2.0, 4.0])})
    drawn = []

    @settings(max_examples=40, deadline=None)
    @given(lr_rule_specs(["test-floored", "test-own"], max_param=3.0))
    def draw(spec):
        drawn.append(spec)

    draw()
    floors = [d for d in drawn if isinstance(d, dict) and d["name"] == "test-floored"]
    assert floors and all(0 < d["floor"] <= 1 and set(d) <= {"name", "floor", "hard"}
                          for d in floors)
    owns = [d for d in drawn if isinstance(d, dict) and d["name"] == "test-own"]
    assert owns and all(d["k"] in (2.0, 4.0) for d in owns)
    assert "test-floored" not in drawn  # its floor has no default: never by name alone
    with pytest.raises(InvalidArgument, match="names=.*allowed values"):
        lr_rule_specs(["no-such-rule"]).example()


# ----------------------------------------------------------------------------- param_hash
def test_param_hash():
    p = tiny_params()
    q = jax.tree_util.tree_map(lambda x: jnp.array(np.asarray(x)), p)
    assert param_hash(p) == param_hash(q)
    assert len(param_hash(p)) == 64
    w = np.asarray(p["fc"]["w"]).copy()
    w[1, 0] = np.nextafter(w[1, 0], np.float32(np.inf))
    r = {**p, "fc": {"w": jnp.asarray(w)}}
    assert param_hash(r) != param_hash(p)
    s = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), p)
    assert param_hash(s) != param_hash(p)


# ----------------------------------------------------------------------------- torch style
def torch_opt(lr=0.1, kind="heavy-ball", beta=0.9, dampening=None, **kw) -> OptimizerConfig:
    return OptimizerConfig(lr=lr, momentum=MomentumConfig(kind=kind, beta=beta, style="torch",
                                                          dampening=dampening), **kw)


def _scalar_run(o: OptimizerConfig, grads, learners=None, num_learners=1):
    """theta after each update of a scalar parameter starting at 0 (one gradient each)."""
    core = make_core(o, num_learners=num_learners)
    state = core.init({"w": jnp.zeros(1, jnp.float32)})
    out = []
    for t, g in enumerate(grads):
        k = 0 if learners is None else learners[t]
        state = core.apply(state, {"w": jnp.full((1, 1), g, jnp.float32)},
                           staleness=np.zeros(1, np.int32),
                           learner_ids=np.array([k], np.int32), step=t)
        out.append(float(state.params["w"][0]))
    return out, state


def test_dampening_first_step_by_hand():
    """Gradient 1, lr 0.1, beta = d = 0.9 (issue's numbers): caffe's `dampened` dampens from
    the first step, m = 0.1, 0.19, 0.271 times (1 - d): -0.01, -0.029, -0.0561; PyTorch
    copies the first gradient into the buffer, m = 1, 1, 1: -0.1, -0.2, -0.3."""
    caffe, _ = _scalar_run(opt(lr=0.1, kind="dampened", beta=0.9), [1.0] * 3)
    np.testing.assert_allclose(caffe, [-0.01, -0.029, -0.0561], rtol=1e-6)
    for o in (torch_opt(kind="dampened"), torch_opt(kind="heavy-ball", dampening=0.9)):
        torch, _ = _scalar_run(o, [1.0] * 3)
        np.testing.assert_allclose(torch, [-0.1, -0.2, -0.3], rtol=1e-6)


def test_torch_heavy_ball_by_hand():
    """No dampening: m = g1 = 2, then 0.5*2 + 1 = 2, then 0.5*2 + 4 = 5; theta -= 0.1 m."""
    out, state = _scalar_run(torch_opt(beta=0.5), [2.0, 1.0, 4.0])
    np.testing.assert_allclose(out, [-0.2, -0.4, -0.9], rtol=1e-6)
    assert float(state.momentum["w"][0]) == 5.0 and bool(state.started)


def test_torch_shifted_each_buffer_starts_as_a_copy():
    """Learners 0, 1, 0 with d = 0.5: each learner's own first step is copied (1, then 2),
    learner 0's second is dampened (0.5*1 + 0.5*3 = 2); theta -= 0.1 * buffer each time."""
    out, state = _scalar_run(torch_opt(kind="shifted", beta=0.5, dampening=0.5),
                             [1.0, 2.0, 3.0], learners=[0, 1, 0], num_learners=3)
    np.testing.assert_allclose(out, [-0.1, -0.3, -0.5], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state.momentum["w"][:, 0]), [2.0, 2.0, 0.0])
    assert np.asarray(state.started).tolist() == [True, True, False]


@pytest.mark.parametrize("nesterov", [False, True])
def test_torch_style_with_decay_is_optax_sgd(nesterov):
    """Style torch is PyTorch's SGD: with a x0.1 decay at update 10 it follows optax.sgd
    (rate outside the trace, buffer started at the first gradient) with the same piecewise
    schedule; caffe style (rate inside) parts from it at the decay."""
    params = tiny_params()
    grads = _grad_sequence(params, 25, seed=3)
    sched = ScheduleConfig(decay_epochs=(1.0,), decay_factor=0.1)
    kind = "nesterov" if nesterov else "heavy-ball"
    core = make_core(torch_opt(lr=0.05, kind=kind, schedule=sched), num_learners=1,
                     updates_per_epoch=10)
    ref = _run_optax(optax.sgd(optax.piecewise_constant_schedule(0.05, {10: 0.1}),
                               momentum=0.9, nesterov=nesterov), params, grads)
    _assert_trees(_run_core(core, params, grads), ref)
    caffe = make_core(opt(lr=0.05, kind=kind, schedule=sched), num_learners=1,
                      updates_per_epoch=10)
    early = _run_core(caffe, params, grads[:10])
    _assert_trees(early, _run_optax(optax.sgd(0.05, momentum=0.9, nesterov=nesterov), params,
                                    grads[:10]))
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
        jax.tree_util.tree_leaves(_run_core(caffe, params, grads)),
        jax.tree_util.tree_leaves(ref), strict=True))
    assert diff > 1e-3


def test_torch_style_without_momentum_and_weight_decay_is_pytorch_sgd():
    """PyTorch: d_p = g + wd p; p -= lr d_p (to rounding)."""
    params = tiny_params()
    grads = _grad_sequence(params, 15, seed=4)
    core = make_core(torch_opt(kind="none", weight_decay=0.01), num_learners=1)
    ref = _run_optax(optax.chain(optax.add_decayed_weights(0.01), optax.sgd(0.1)), params, grads)
    _assert_trees(_run_core(core, params, grads), ref)


def test_weight_decay_scope_weights_skips_rank_below_two():
    """scope "weights": conv/dense kernels decay, biases and vectors do not (P2's official
    ResNet decays conv and linear weights only)."""
    params = tiny_params()  # conv1/w rank 1, conv1/b rank 0, fc/w rank 2
    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    core = make_core(opt(lr=0.1, weight_decay=0.5, weight_decay_scope="weights"),
                     num_learners=1)
    state = core.apply(core.init(params), stack(zero), staleness=np.zeros(1, np.int32),
                       learner_ids=np.zeros(1, np.int32), step=0)
    _assert_trees(state.params["conv1"], params["conv1"], exact=True)
    _assert_trees(state.params["fc"]["w"], params["fc"]["w"] * (1 - 0.05))


def test_nominal_staleness_fixes_the_rate_from_the_first_update():
    """lr_staleness "nominal": every gradient's rate is the rule at the protocol's delay
    (P2's official eta_tau, set by hand), whatever its own staleness; "actual" uses each."""
    o = OptimizerConfig(lr=0.2, lr_rule="stability-edge", lr_staleness="nominal")
    core = make_core(o, num_learners=5, nominal_staleness=4)
    state = core.init({"w": jnp.zeros(1, jnp.float32)})
    for t, tau in enumerate([0, 1, 4]):
        state = core.apply(state, {"w": jnp.ones((1, 1))}, staleness=np.array([tau], np.int32),
                           learner_ids=np.array([t], np.int32), step=t)
    eta4 = 0.2 * math.sin(math.pi / 18)
    np.testing.assert_allclose(float(state.params["w"][0]), -3 * eta4, rtol=1e-6)
    with pytest.raises(ValueError, match="nominal"):
        make_core(o, num_learners=5)


def test_torch_style_config_errors():
    with pytest.raises(ValueError, match="shorthand"):
        make_core(torch_opt(kind="dampened", dampening=0.5), num_learners=1)
    with pytest.raises(ValueError, match="buffer"):
        make_core(torch_opt(kind="none", dampening=0.5), num_learners=1)
    with pytest.raises(ValueError, match="caffe, torch"):
        make_core(OptimizerConfig(momentum=MomentumConfig(style="pytorch")), num_learners=1)


def test_torch_style_with_several_gradients_and_padding_is_pytorch_on_their_mean():
    """c = 3 slots, one of them padding: PyTorch's step on the mean of the valid gradients
    plus wd theta (a float64 reference); an all-padding first update leaves the buffer
    unstarted, so the next real step is still copied undampened."""
    o = torch_opt(lr=0.1, beta=0.8, dampening=0.3, weight_decay=0.05)
    core = make_core(o, num_learners=3)
    theta = np.array([1.0, -2.0])
    state = core.init({"w": jnp.asarray(theta, jnp.float32)})
    empty = core.apply(state, {"w": jnp.full((3, 2), jnp.nan)}, staleness=np.zeros(3, np.int32),
                       learner_ids=np.arange(3, dtype=np.int32), step=0,
                       mask=np.zeros(3, bool))
    assert not bool(empty.started)
    rng = np.random.default_rng(5)
    buf = None
    state = empty
    for t in range(4):
        g = rng.normal(size=(3, 2))
        mask = np.array([True, t % 2 == 0, True])
        state = core.apply(state, {"w": jnp.asarray(g, jnp.float32)},
                           staleness=np.zeros(3, np.int32),
                           learner_ids=np.arange(3, dtype=np.int32), step=t + 1, mask=mask)
        d_p = g[mask].mean(axis=0) + 0.05 * theta  # torch: grad + wd * p
        buf = d_p if buf is None else 0.8 * buf + (1 - 0.3) * d_p
        theta = theta - 0.1 * buf
        np.testing.assert_allclose(np.asarray(state.params["w"]), theta, rtol=2e-6)


def test_a_weight_decay_mult_on_what_the_scope_leaves_out_is_an_error():
    """Under scope "weights" a multiplier for a bias alone would do nothing: one line."""
    o = opt(weight_decay=0.1, weight_decay_scope="weights", weight_decay_mult={"conv1/b": 2.0})
    with pytest.raises(ValueError, match="conv1/b: matches no parameter of rank >= 2"):
        make_core(o, num_learners=1).init(tiny_params())
    make_core(opt(weight_decay=0.1, weight_decay_mult={"conv1/b": 2.0}),
              num_learners=1).init(tiny_params())
