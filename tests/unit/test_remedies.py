"""The remedies toolbox: optax server transforms (optimizer.transform), parameterised lr rules
(polynomial, hinge, exponential, fedbuff) and delay compensation (dc-asgd, dc-asgd-a,
gap-aware), each checked against an independent re-execution: optax's own trajectory, or the
run's trace replayed by hand in numpy with the formulas of the modules' docstrings.

Every run is a tiny MLP (conftest's TINY) for a dozen updates.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
import pytest
from conftest import TINY, Killed, merged, record_states

from asyncsim.api import replay_folder, run
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.checkpoint import CKPT, load_checkpoint, load_params, save_checkpoint
from asyncsim.drivers.driver import Observer
from asyncsim.drivers.metrics import Recorder
from asyncsim.errors import ScenarioError
from asyncsim.numerics.core import param_hash
from asyncsim.numerics.lr_rules import rate_at_delay
from asyncsim.numerics.numerics import Numerics
from asyncsim.scenario import load_scenario
from asyncsim.sweep import run_sweep
from asyncsim.trace import Trace

# Four learners of unequal speed: staleness 0 to 5 in a dozen async updates (0 to 3 softsync).
UNEQUAL = {"learners": 4, "compute": {"dist": "lognormal", "mean": 1.0, "cv": 0.5}}
BASE = merged(TINY, cluster=UNEQUAL, run={"updates": 12, "eval_every": 0})
ASYNC = {"kind": "async"}
SOFTSYNC = {"kind": "softsync", "n": 2}  # 4 learners, n = 2: c = 2 gradients per update


def scenario(optimizer: dict, protocol: dict = ASYNC, **tables):
    return load_scenario(merged(BASE, optimizer=optimizer, protocol=protocol, **tables))


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def max_abs_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(leaves(a), leaves(b), strict=True))


def assert_leaves_close(a, b, *, rtol, atol):
    for x, y in zip(leaves(a), leaves(b), strict=True):
        assert x.dtype == y.dtype == np.float32
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def assert_leaves_equal(a, b):
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


# ============================================================ 1. transforms == optax
def optax_trajectory(scn, trace: Trace, tx):
    """Step ``tx`` ourselves on the gradients of the trace's (learner, batch) sequence, each
    computed with Numerics.grad at the reference's own parameters (one learner: tau = 0)."""
    num = Numerics(scn.model, scn.data, scn.optimizer, seed=scn.seed,
                   num_learners=scn.cluster.learners, grads_per_update=1)
    params = num.init_params()
    state = tx.init(params)

    @jax.jit
    def step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    for _, rows, _ in trace.iter_updates():
        (learner, batch, _, tau), = rows
        assert tau == 0
        _, g = num.grad(params, num.x_train, num.y_train, np.int32(learner), np.int32(batch))
        params, state = step(params, state, g)
    return params


def one_learner_run(transform: dict, lr: float, updates: int = 10, **optimizer):
    scn = load_scenario(merged(TINY, cluster={"learners": 1}, protocol=ASYNC,
                               optimizer={"lr": lr, "transform": transform, **optimizer},
                               run={"updates": updates, "eval_every": 0}))
    res = run(scn, progress=False)
    assert res.trace.num_updates == updates and res.trace.max_staleness == 0
    return scn, res


@pytest.mark.parametrize("transform,reference", [
    ({"name": "rmsprop", "decay": 0.9, "momentum": 0.5},
     lambda lr: optax.rmsprop(lr, decay=0.9, momentum=0.5)),
    ({"name": "sgd", "momentum": 0.9, "nesterov": True},
     lambda lr: optax.sgd(lr, momentum=0.9, nesterov=True)),
], ids=["rmsprop", "sgd-nesterov"])
def test_transform_at_zero_delay_is_optax_bit_for_bit(transform, reference):
    """One learner, tau = 0: the PS's rmsprop (with momentum) and Nesterov SGD are optax's
    own trajectory, bit for bit (measured exact over 10 and 20 steps at two rates)."""
    scn, res = one_learner_run(transform, 0.01)
    ref = optax_trajectory(scn, res.trace, reference(0.01))
    assert param_hash(ref) == res.summary["param_hash"]
    assert_leaves_equal(ref, res.params)
    # Not vacuous: the run moved the weights by far more than a rounding error.
    assert max_abs_diff(res.params, numerics_for(scn).init_params()) > 0.05


def test_adam_at_zero_delay_is_optax_adam():
    """One learner, tau = 0, 10 steps of Adam: optax's trajectory to rounding.

    Not bit for bit: the first step is exact, then the update program (compiled with the
    gradient, inside the core) rounds Adam's moment and bias-correction arithmetic one ulp
    away from optax's own jitted step (measured: 7e-9 after one step from the same state),
    and Adam amplifies such differences where a gradient is below eps (its step is then
    ~lr g / eps). Measured 4.8e-8 after 10 steps, so atol 5e-7 (the weights move by up to
    0.09; a wrong rate or bias correction is ~1e-3). Only the rate is injected into the
    alias's state: with every hyperparameter a float32 array (``inject_hyperparams``
    without ``static_args``) 1 - b1 rounds to 0.100000024 and the run sat 4e-6 away.
    """
    scn, res = one_learner_run({"name": "adam"}, 0.01)
    ref = optax_trajectory(scn, res.trace, optax.adam(0.01))
    assert_leaves_close(ref, res.params, rtol=1e-6, atol=5e-7)
    f32 = optax_trajectory(scn, res.trace, optax.inject_hyperparams(
        optax.adam, hyperparam_dtype=jnp.float32)(learning_rate=0.01))
    assert max_abs_diff(f32, res.params) > 1e-6  # the float32-b1 variant: told apart
    wrong_rate = optax_trajectory(scn, res.trace, optax.adam(0.012))
    assert max_abs_diff(wrong_rate, res.params) > 1e-3


def test_adam_with_a_decay_schedule_is_optax_adam_with_a_piecewise_rate():
    """optimizer.schedule moves the alias's rate: x0.1 from update 5 on (256 examples / 8 per
    batch = 32 updates per epoch, decay_epochs = [5/32]) is optax's piecewise-constant
    schedule {5: 0.1}; the same Adam without the decay is far away."""
    sched = {"decay_epochs": [5 / 32], "decay_factor": 0.1}
    scn, res = one_learner_run({"name": "adam"}, 0.01, schedule=sched)
    piecewise = optax.piecewise_constant_schedule(0.01, {5: 0.1})
    ref = optax_trajectory(scn, res.trace, optax.adam(piecewise))
    assert_leaves_close(ref, res.params, rtol=1e-6, atol=5e-7)  # see the test above
    undecayed = optax_trajectory(scn, res.trace, optax.adam(0.01))
    assert max_abs_diff(undecayed, res.params) > 1e-2


# ============================================================ 2./3. hand re-execution
class Hand:
    """The numerics re-executed by hand, float32 numpy: update v with rows (l, b, r, tau),

        g_l = grad at version r (Numerics.grad),  g_l <- compensate(g_l, theta_v, theta_r),
        SGD:  theta_{v+1} = theta_v - sum_l (lr weight(tau_l) / c) g_l;
        with an optax ``tx`` (its own rate): d = sum_l w_l g_l + (sum_l w_l) wd theta_v with
        w_l = weight(tau_l) / c, then theta_{v+1} = theta_v + tx.update(d).
    """

    def __init__(self, scn, weight, compensate=None, *, tx=None, wd: float = 0.0):
        self.num = numerics_for(scn)
        self.p0 = self.num.init_params()
        self.treedef = jax.tree_util.tree_structure(self.p0)
        self.weight, self.compensate, self.tx, self.wd = weight, compensate, tx, wd
        self.lr = 1.0 if tx is not None else float(scn.optimizer.lr)
        if tx is not None:
            self.tx_step = jax.jit(lambda p, s, d: tx.update(d, s, p))

    def tree(self, xs):
        return jax.tree_util.tree_unflatten(self.treedef, xs)

    def update(self, v, rows, versions, stats=None, tx_state=None):
        """(theta_{v+1}, compensation statistics, transform state) from the versions'
        leaves (``versions[v]`` the current one)."""
        now, c = versions[v], len(rows)
        num = self.num
        step = [np.zeros_like(x) for x in now]
        w_total = np.float32(0)
        for learner, batch, r, tau in rows:
            assert tau == v - r
            read = versions[r]
            _, g = num.grad(self.tree(read), num.x_train, num.y_train, np.int32(learner),
                            np.int32(batch))
            g = leaves(g)
            if self.compensate is not None:
                g, stats = self.compensate(g, now, read, stats)
            w = np.float32(self.lr * self.weight(tau) / c)
            w_total += w
            step = [s + w * x for s, x in zip(step, g, strict=True)]
        if self.tx is None:
            new = [x - s for x, s in zip(now, step, strict=True)]
        else:
            d = [s + (w_total * np.float32(self.wd)) * x for s, x in zip(step, now, strict=True)]
            u, tx_state = self.tx_step(self.tree(now), tx_state, self.tree(d))
            new = [x + np.asarray(y) for x, y in zip(now, leaves(u), strict=True)]
        if hasattr(self.compensate, "after"):  # statistics of the step itself (gap-aware)
            stats = self.compensate.after(stats, now, new)
        return new, stats, tx_state

    def trajectory(self, trace: Trace):
        versions = {0: leaves(self.p0)}
        stats, tx_state = None, (self.tx.init(self.p0) if self.tx is not None else None)
        for v, rows, _ in trace.iter_updates():
            versions[v + 1], stats, tx_state = self.update(v, rows, versions, stats, tx_state)
        return self.tree(versions[trace.num_updates])


def hand_sgd(scn, trace: Trace, weight, compensate=None, *, tx=None, wd: float = 0.0):
    """The trace's final parameters re-executed by hand (:class:`Hand`)."""
    return Hand(scn, weight, compensate, tx=tx, wd=wd).trajectory(trace)


def polynomial(a):
    return lambda tau: (1.0 + tau) ** -a


def hinge(a, b):
    return lambda tau: 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)


def exponential(a):
    return lambda tau: math.exp(-a * tau)


def fedbuff(tau):
    return 1.0 / math.sqrt(1.0 + tau)


def constant(tau):
    return 1.0


# Hand re-execution vs the run: the rates differ in their last bits (numpy float64 powers
# vs jnp float32 ones), which a dozen updates carry to <= 1.2e-7 (measured); a rule's or
# a compensation's effect is 4e-3 to 0.14.
HAND = {"rtol": 1e-5, "atol": 1e-6}


@pytest.mark.parametrize("protocol", [ASYNC, SOFTSYNC], ids=["async", "softsync-c2"])
@pytest.mark.parametrize("rule,weight,other", [
    ({"name": "polynomial", "a": 0.5}, polynomial(0.5), polynomial(1.0)),
    ({"name": "hinge", "a": 10.0, "b": 1.0}, hinge(10.0, 1.0), hinge(10.0, 2.0)),
    ({"name": "exponential", "a": 0.3}, exponential(0.3), exponential(0.6)),
    ({"name": "fedbuff"}, fedbuff, polynomial(1.0)),
], ids=["polynomial", "hinge", "exponential", "fedbuff"])
def test_parameterised_rule_equals_hand_re_execution(rule, weight, other, protocol, tmp_path):
    scn = scenario({"lr": 0.05, "lr_rule": rule}, protocol)
    res = run(scn, out=tmp_path / "run", progress=False)
    trace = res.trace
    assert trace.max_staleness >= 3  # the rule weights something
    hand = hand_sgd(scn, trace, weight)
    assert_leaves_close(hand, res.params, **HAND)
    # The run's params.npz holds the same final parameters.
    assert param_hash(load_params(res.out, res.params)) == res.summary["param_hash"]
    # Not vacuous: the same trace with every weight 1, or with another parameter, is far
    # from the run (measured 4e-3 to 0.14; the hand re-execution is within 1.2e-7).
    for wrong in (constant, other):
        assert max_abs_diff(hand_sgd(scn, trace, wrong), res.params) > 100 * HAND["atol"]


def test_rule_formula_values():
    assert rate_at_delay({"name": "hinge", "a": 10, "b": 4}, 1.0, 6) == pytest.approx(1 / 21)
    assert rate_at_delay({"name": "hinge", "a": 10, "b": 4}, 1.0, 4) == 1.0
    assert rate_at_delay({"name": "hinge"}, 1.0, 5) == pytest.approx(1 / 11)  # a=10, b=4
    assert rate_at_delay({"name": "polynomial", "a": 0.5}, 2.0, 3) == pytest.approx(1.0)
    assert rate_at_delay("polynomial", 1.0, 8) == pytest.approx(1 / 3)  # default a = 0.5
    assert rate_at_delay({"name": "polynomial", "a": 2}, 1.0, 1) == pytest.approx(0.25)
    assert rate_at_delay({"name": "exponential", "a": math.log(2)}, 0.1, 3) == \
        pytest.approx(0.0125)
    assert rate_at_delay("fedbuff", 1.0, 3) == pytest.approx(0.5)
    assert rate_at_delay("fedbuff", 1.0, 0) == 1.0
    got = rate_at_delay({"name": "polynomial", "a": 1.5}, 0.5, np.array([0, 1, 3]))
    np.testing.assert_allclose(got, 0.5 * np.array([1.0, 2 ** -1.5, 4 ** -1.5]), rtol=1e-12)


# Independent float32 numpy implementations of the compensation module's docstring.
def dc_asgd(lam):
    lam = np.float32(lam)

    def compensate(g, now, read, stats):
        return [x + lam * x * x * (a - b) for x, a, b in zip(g, now, read, strict=True)], stats

    return compensate


def dc_asgd_a(lam=2.0, momentum=0.95, eps=1e-7):
    lam, m, eps = np.float32(lam), np.float32(momentum), np.float32(eps)

    def compensate(g, now, read, ms):
        ms = [np.zeros_like(x) for x in g] if ms is None else ms
        ms = [m * s + (np.float32(1) - m) * x * x for s, x in zip(ms, g, strict=True)]
        out = [x + (lam / np.sqrt(s + eps)) * x * x * (a - b)
               for x, s, a, b in zip(g, ms, now, read, strict=True)]
        return out, ms

    return compensate


def gap_aware(lr, gamma=0.999, eps=1e-8):
    """Gap-aware under SGD, as FTPipe's GapAware: v <- gamma v + (1 - gamma) g^2 with the raw
    gradient, t <- t + 1, then C = lr (sqrt(v / (1 - gamma^t)) + eps), each gradient in turn."""
    gm, eps, lr = np.float32(gamma), np.float32(eps), np.float32(lr)

    def compensate(g, now, read, stats):
        v, t = stats if stats is not None else ([np.zeros_like(x) for x in g], 0)
        v = [gm * s + (np.float32(1) - gm) * x * x for s, x in zip(v, g, strict=True)]
        corr = np.float32(1) - np.float32(float(gm) ** (t + 1))
        out = [x / (np.float32(1) + np.abs(a - b) / (lr * (np.sqrt(s / corr) + eps)))
               for x, s, a, b in zip(g, v, now, read, strict=True)]
        return out, (v, t + 1)

    return compensate


def gap_aware_steps(gamma=0.999, eps=1e-8):
    """Gap-aware under a transform, as FTPipe's AdamGapAware: C = sqrt(v_hat) + eps with v
    the moving average of the squared steps, updated after each update."""
    gm, eps = np.float32(gamma), np.float32(eps)

    def compensate(g, now, read, stats):
        v, k = stats if stats is not None else ([np.zeros_like(x) for x in g], 0)
        # Adam's bias correction after k updates, in float32 as the core rounds it: 1 - gamma^k
        # cancels (gamma = 0.999), so its float32 rounding is ~1e-5 relative, which Adam's
        # normalisation downstream (a transform) carries to ~1e-5 in the weights.
        corr = np.float32(1) - np.float32(float(gm) ** k)
        c = [(np.sqrt(s / corr) if k else np.zeros_like(s)) + eps for s in v]
        out = [x / (np.float32(1) + np.abs(a - b) / ci)
               for x, ci, a, b in zip(g, c, now, read, strict=True)]
        return out, (v, k)

    def after(stats, before, new):
        """C's statistics: the EMA of the squared step each update took."""
        v, k = stats if stats is not None else ([np.zeros_like(x) for x in before], 0)
        v = [gm * s + (np.float32(1) - gm) * (a - b) * (a - b)
             for s, a, b in zip(v, new, before, strict=True)]
        return v, k + 1

    compensate.after = after
    return compensate


LR = 0.05
COMPENSATIONS = {
    # MXNet's lambda = 0.04 moves a dozen tiny updates by ~1e-9: a larger one, to be seen.
    "dc-asgd": ({"kind": "dc-asgd", "lambda": 50.0}, dc_asgd(50.0), (ASYNC, SOFTSYNC)),
    "dc-asgd-a": ({"kind": "dc-asgd-a"}, dc_asgd_a(), (ASYNC, SOFTSYNC)),
    "dc-asgd-a-options": ({"kind": "dc-asgd-a", "lambda": 1.0, "momentum": 0.5, "eps": 1e-6},
                          dc_asgd_a(1.0, 0.5, 1e-6), (SOFTSYNC,)),
    "gap-aware": ({"kind": "gap-aware"}, gap_aware(LR), (ASYNC, SOFTSYNC)),
    "gap-aware-options": ({"kind": "gap-aware", "gamma": 0.9, "eps": 1e-6},
                          gap_aware(LR, 0.9, 1e-6), (ASYNC,)),
}
COMP_CASES = [pytest.param(spec, comp, proto, id=f"{name}-{proto['kind']}")
              for name, (spec, comp, protos) in COMPENSATIONS.items() for proto in protos]


@pytest.mark.parametrize("spec,compensate,protocol", COMP_CASES)
def test_compensation_equals_hand_re_execution(spec, compensate, protocol):
    scn = scenario({"lr": LR, "compensation": spec}, protocol)
    res = run(scn, progress=False)
    trace = res.trace
    assert trace.max_staleness >= 3 and (trace.staleness == 0).any()
    hand = hand_sgd(scn, trace, constant, compensate)
    assert_leaves_close(hand, res.params, **HAND)
    # Not vacuous: the same trace without compensation is far from the run.
    assert max_abs_diff(hand_sgd(scn, trace, constant), res.params) > 100 * HAND["atol"]


@pytest.mark.parametrize("spec", [
    {"kind": "dc-asgd", "lambda": 50.0}, {"kind": "dc-asgd-a"},
    {"kind": "gap-aware"}, {"kind": "gap-aware", "gamma": 0.5, "eps": 1e-3},
], ids=["dc-asgd", "dc-asgd-a", "gap-aware", "gap-aware-options"])
def test_compensation_at_zero_staleness_is_plain_sgd_bit_for_bit(spec):
    one = {"cluster": {"learners": 1}, "run": {"updates": 12, "eval_every": 0}}
    plain = run(load_scenario(merged(TINY, optimizer={"lr": LR}, **one)), progress=False)
    comp = run(load_scenario(merged(TINY, optimizer={"lr": LR, "compensation": spec}, **one)),
               progress=False)
    assert comp.trace.max_staleness == 0
    assert comp.summary["param_hash"] == plain.summary["param_hash"]


def inverse_staleness(tau):
    return 1.0 / max(tau, 1)


# Under a transform the rule is a per-gradient weight at rate 1, the rate the alias's.
TX_CASES = {
    "adam+polynomial+wd": ({"lr": 0.01, "transform": {"name": "adam"}, "weight_decay": 0.01,
                            "lr_rule": {"name": "polynomial", "a": 0.5}},
                           ASYNC, polynomial(0.5), None,
                           optax.adam(0.01), 0.01),
    "sgd-momentum+hinge": ({"lr": 0.05, "transform": {"name": "sgd", "momentum": 0.9},
                            "lr_rule": {"name": "hinge", "a": 10.0, "b": 1.0}},
                           SOFTSYNC, hinge(10.0, 1.0), None,
                           optax.sgd(0.05, momentum=0.9), 0.0),
    "adam+inverse-staleness+gap-aware": (
        {"lr": 0.01, "transform": {"name": "adam"}, "lr_rule": "inverse-staleness",
         "compensation": {"kind": "gap-aware"}},
        SOFTSYNC, inverse_staleness, gap_aware_steps(), optax.adam(0.01), 0.0),
}


@pytest.mark.parametrize("name", list(TX_CASES))
def test_transform_with_rule_and_compensation_equals_hand_re_execution(name):
    """Stale gradients through a transform: d = (1/c) sum_l s_l g~_l (+ weight decay), then
    optax's own step on d (the float32-hyperparameter alias, as in
    test_adam_at_zero_delay_is_optax_adam).

    Each update re-executed by hand from the run's own state (its parameters, read versions,
    transform state and compensation statistics) is the run's next state to a few ulps
    (measured <= 3e-8). The whole trajectory is compared too; Adam with gap-aware amplifies
    those ulps (gap-aware divides by lr (sqrt(v_hat) + eps), tiny where the gradients are,
    and Adam normalises the result) to 8.5e-6 in 12 updates, so there the bound is 1e-4;
    leaving out the rule, the weight decay or the compensation moves the weights by > 4e-3.
    """
    optimizer, protocol, weight, compensate, tx, wd = TX_CASES[name]
    scn = scenario(optimizer, protocol)
    states: dict[int, object] = {}
    res = run(scn, monitor=record_states(states), progress=False)
    trace = res.trace
    assert trace.max_staleness >= 3
    assert param_hash(states[trace.num_updates].params) == res.summary["param_hash"]
    hand = Hand(scn, weight, compensate, tx=tx, wd=wd)
    for v, rows, _ in trace.iter_updates():
        st = states[v]
        versions = {r: leaves(states[r].params) for _, _, r, _ in rows} | {v: leaves(st.params)}
        stats = (leaves(st.comp[0]), int(st.comp[1])) if compensate is not None else None
        # The run's optax state holds the alias's own state (its rate injected around it).
        tx_state = st.opt_state.inner_state
        new, _, _ = hand.update(v, rows, versions, stats, tx_state)
        assert_leaves_close(hand.tree(new), states[v + 1].params, rtol=1e-6, atol=1e-7)
    atol = 1e-4 if compensate is not None else 1e-6
    assert_leaves_close(hand.trajectory(trace), res.params, rtol=1e-5, atol=atol)
    # Not vacuous: the rule's weights (and the weight decay, the compensation) matter.
    assert max_abs_diff(hand_sgd(scn, trace, constant, compensate, tx=tx, wd=wd),
                        res.params) > 40 * atol
    if wd:
        assert max_abs_diff(hand_sgd(scn, trace, weight, compensate, tx=tx),
                            res.params) > 40 * atol
    if compensate is not None:
        assert max_abs_diff(hand_sgd(scn, trace, weight, tx=tx, wd=wd), res.params) > 40 * atol


# ============================================================ 4. online == replay
ONLINE_REPLAY = {
    "adam": {"lr": 0.01, "transform": {"name": "adam"}},
    "polynomial": {"lr": 0.05, "lr_rule": {"name": "polynomial", "a": 0.5}},
    "dc-asgd": {"lr": 0.05, "compensation": {"kind": "dc-asgd", "lambda": 50.0}},
    "dc-asgd-a": {"lr": 0.05, "compensation": {"kind": "dc-asgd-a"}},
    "gap-aware": {"lr": 0.05, "compensation": {"kind": "gap-aware"}},
    "adam+inverse-staleness+gap-aware": {
        "lr": 0.01, "transform": {"name": "adam", "b1": 0.8},
        "lr_rule": "inverse-staleness", "compensation": {"kind": "gap-aware"}},
}


@pytest.mark.parametrize("name", list(ONLINE_REPLAY))
def test_online_equals_replay_loop_and_scan(name, tmp_path):
    scn = scenario(ONLINE_REPLAY[name], SOFTSYNC)
    res = run(scn, out=tmp_path / "run", progress=False)
    trace = Trace.load(tmp_path / "run")
    assert trace.uniform_n_grads == 2 and trace.max_staleness >= 2
    for path in ("loop", "scan"):
        rep = replay_folder(tmp_path / "run", out=tmp_path / path, path=path)
        assert rep.summary["param_hash"] == res.summary["param_hash"], path
        assert rep.summary["matches_source"], path


# ============================================================ 5. one-line errors
BAD = [
    ({"transform": {"name": "addam"}}, "optimizer.transform.name", "(did you mean 'adam'?)"),
    ({"transform": {"name": "rmsprob"}}, "optimizer.transform.name", "did you mean 'rmsprop'"),
    ({"transform": {"name": "adam", "beta1": 0.9}}, "optimizer.transform.beta1", "b1"),
    ({"transform": {"name": "adam", "learning_rate": 0.1}},
     "optimizer.transform.learning_rate", "optimizer.lr"),
    ({"transform": {"name": "adam", "b1": [0.9]}}, "optimizer.transform.b1", "[0.9]"),
    ({"transform": {"name": "adam", "b1": math.nan}}, "optimizer.transform.b1", "finite"),
    ({"transform": "adam"}, "optimizer.transform", "table"),
    ({"transform": {"name": "adam"}, "momentum": {"kind": "heavy-ball", "beta": 0.9}},
     "optimizer.momentum.kind", "none"),
    ({"compensation": {"kind": "dcasgd"}}, "optimizer.compensation.kind",
     "did you mean 'dc-asgd'"),
    ({"compensation": {"lambda": 0.1}}, "optimizer.compensation.kind",
     "missing; allowed: dc-asgd, dc-asgd-a, gap-aware"),
    ({"compensation": {"kind": "dc-asgd", "lamda": 0.1}}, "optimizer.compensation.lamda",
     "did you mean 'lambda'"),
    ({"compensation": {"kind": "dc-asgd", "lambda": -1.0}}, "optimizer.compensation.lambda",
     ">= 0"),
    ({"compensation": {"kind": "dc-asgd-a", "momentum": 1.0}},
     "optimizer.compensation.momentum", "[0, 1)"),
    ({"compensation": {"kind": "gap-aware", "eps": 0.0}}, "optimizer.compensation.eps",
     "positive finite"),
    ({"compensation": {"kind": "gap-aware", "gamma": "0.9"}}, "optimizer.compensation.gamma",
     "number"),
    ({"compensation": {"kind": "gap-aware", "lambda": 1.0}}, "optimizer.compensation.lambda",
     "gamma"),
    ({"lr_rule": {"a": 0.5}}, "optimizer.lr_rule.name", "missing"),
    ({"lr_rule": {"name": "polynomial", "b": 0.5}}, "optimizer.lr_rule.b", "unknown"),
    ({"lr_rule": {"name": "exponential"}}, "optimizer.lr_rule.a", "requires"),
    ({"lr_rule": {"name": "polynomial", "a": "half"}}, "optimizer.lr_rule.a", "number"),
    ({"lr_rule": {"name": "hinge", "b": [4]}}, "optimizer.lr_rule.b", "number"),
    ({"lr_rule": {"name": "polynomial", "a": math.inf}}, "optimizer.lr_rule.a", "finite"),
    ({"lr_rule": {"name": "fedbuff", "a": 1.0}}, "optimizer.lr_rule.a", "unknown"),
    ({"lr_rule": {"name": "polynomal", "a": 0.5}}, "optimizer.lr_rule.name",
     "did you mean 'polynomial'"),
    # (a review found these)
    ({"transform": {"name": "noisy_sgd"}}, "optimizer.transform.name", "unknown"),
    ({"transform": {"name": "adam", "b1": "x"}}, "optimizer.transform.b1", "number"),
    ({"transform": {"name": "sgd", "momentum": True}}, "optimizer.transform.momentum",
     "number"),
    ({"transform": {"name": "adamw", "mask": "x"}}, "optimizer.transform.mask", "function"),
    ({"transform": {}}, "optimizer.transform.name", "missing"),
    ({"compensation": {"kind": "dc-asgd", "lambda": 10 ** 400}},
     "optimizer.compensation.lambda", "finite"),
    ({"lr_rule": {"name": "polynomial", "a": 10 ** 400}}, "optimizer.lr_rule.a", "finite"),
    ({"lr_rule": {"name": "hinge", "a": -1.0}}, "optimizer.lr_rule.a", ">= 0"),
]


@pytest.mark.parametrize("optimizer,key,fragment", BAD, ids=[b[1] + "-" + str(i)
                                                            for i, b in enumerate(BAD)])
def test_bad_remedy_options_are_one_line_errors_naming_the_key(optimizer, key, fragment):
    with pytest.raises(ScenarioError) as e:
        load_scenario(merged(TINY, optimizer={"lr": 0.05, **optimizer}))
    msg = str(e.value)
    assert f"{key}:" in msg and fragment in msg
    assert "\n" not in msg


# ============================================================ 6. checkpoints
def test_resume_keeps_the_transform_and_compensation_state(tmp_path):
    """A run killed after its checkpoint at update 10 resumes to the uninterrupted run's
    hash: the checkpoint holds Adam's moments and gap-aware's statistics (equal leaf by leaf
    to the uninterrupted run's state at update 10; restarting them from zero would not)."""
    scn = scenario({"lr": 0.01, "transform": {"name": "adam"},
                    "lr_rule": {"name": "polynomial", "a": 0.5},
                    "compensation": {"kind": "gap-aware"}},
                   run={"updates": 20, "eval_every": 0, "checkpoint_every": 5})
    states: dict[int, object] = {}
    full = run(scn, out=tmp_path / "full", monitor=record_states(states), progress=False)

    def die(version, state):
        if version >= 13:
            raise Killed(version)

    killed = tmp_path / "killed"
    with pytest.raises(Killed):
        run(scn, out=killed, monitor=Observer(die), progress=False)
    assert not (killed / "summary.json").exists()
    template = numerics_for(scn).init_state()
    version, state, _, _, _ = load_checkpoint(killed, template, template.params)
    assert version == 10
    assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(template)
    assert_leaves_equal(state, states[10])
    assert max(float(np.max(np.abs(x))) for x in leaves(state.opt_state.inner_state)) > 0
    assert float(state.comp[1]) == 10.0  # gap-aware's gradient count
    resumed = run(scn, out=killed, resume=True, progress=False)
    assert resumed.summary["param_hash"] == full.summary["param_hash"]
    assert not (killed / CKPT).exists()


def test_checkpoint_round_trip_of_a_state_with_opt_state_and_comp(tmp_path):
    scn = scenario({"lr": 0.01, "transform": {"name": "rmsprop", "momentum": 0.5},
                    "compensation": {"kind": "dc-asgd-a"}}, SOFTSYNC)
    num = numerics_for(scn)
    state = num.init_state()
    versions = {0: state.params}
    trace = run(scn, progress=False).trace
    for v, rows, _ in list(trace.iter_updates())[:4]:
        state, _ = num.update(state, versions, v, rows)
        versions[v + 1] = state.params
    assert leaves(state.opt_state) and leaves(state.comp)
    rec = Recorder()
    rec.losses = [np.zeros(2, np.float32)] * 4  # one entry per update, as a run records
    save_checkpoint(tmp_path, 4, state, {3: versions[3], 4: versions[4]}, rec,
                    {"note": "x"})
    template = num.init_state()
    version, back, kept, _, extra = load_checkpoint(tmp_path, template, template.params)
    assert version == 4 and extra == {"note": "x"} and sorted(kept) == [3, 4]
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(state)
    assert_leaves_equal(back, state)
    assert_leaves_equal(kept[3], versions[3])
    # And the template really differs: the moments and statistics are not zero any more.
    assert max_abs_diff(template.comp, state.comp) > 0
    assert max_abs_diff(template.opt_state.inner_state, state.opt_state.inner_state) > 0


# ============================================================ 7. sweep over a rule parameter
def test_a_sweep_over_a_rule_parameter_shares_one_trace(tmp_path):
    raw = merged(BASE, optimizer={"lr": 0.05, "lr_rule": {"name": "polynomial", "a": 0.5}},
                 protocol=ASYNC)
    raw["sweep"] = {"optimizer.lr_rule.a": [0.25, 1.0]}
    index = run_sweep(load_scenario(raw), tmp_path / "sw", vmap="always")
    assert (index["status"] == "complete").all() and len(index) == 2
    assert index["trace_group"].nunique() == 1 and index["shared_trace"].all()
    assert index["trace_hash"].nunique() == 1
    assert index["param_hash"].nunique() == 2
    assert not index["vmapped"].any()  # a rule parameter is no core hyperparameter
    on_disk = pd.read_csv(tmp_path / "sw" / "index.csv")
    assert on_disk["trace_group"].nunique() == 1
    # Each point is its scenario run alone.
    for _, row in index.iterrows():
        alone = load_scenario(merged(BASE, protocol=ASYNC, optimizer={
            "lr": 0.05, "lr_rule": {"name": "polynomial", "a": float(row["optimizer.lr_rule.a"])}}))
        assert run(alone, progress=False).summary["param_hash"] == row["param_hash"]


def test_a_rule_registered_again_takes_effect(fresh_registries):
    # The bound rules are cached by function, not by name: replace=True (or a Ray worker's
    # registration) is the rule the scenario means.
    from asyncsim.numerics.lr_rules import rate_at_delay, register_lr_rule

    register_lr_rule("mine", lambda lr, tau, mean: lr * jnp.ones_like(tau))
    assert rate_at_delay("mine", 1.0, 3) == 1.0
    register_lr_rule("mine", lambda lr, tau, mean: 0.5 * lr * jnp.ones_like(tau),
                     replace=True)
    assert rate_at_delay("mine", 1.0, 3) == 0.5


@pytest.mark.parametrize("optimizer", [
    {"transform": {"name": "adam"}},
    {"compensation": {"kind": "dc-asgd-a"}, "lr_rule": {"name": "polynomial", "a": 0.5}},
], ids=["adam", "dc-asgd-a+polynomial"])
def test_a_vmapped_lr_sweep_of_a_remedy_agrees_with_its_points(optimizer):
    # The transform's state and the compensation's statistics vmap with the core state:
    # one program for two rates, each lane within rounding of its own exact run.
    from asyncsim.drivers.vmapped import replay_vmapped

    scn = scenario({"lr": 0.01, **optimizer}, SOFTSYNC)
    trace = run(scn, progress=False).trace
    lanes = replay_vmapped(scn, trace, [{"lr": 0.01}, {"lr": 0.02}])
    for res, lr in zip(lanes, (0.01, 0.02), strict=True):
        alone = run(scenario({**optimizer, "lr": lr}, SOFTSYNC), progress=False)
        # Within a thousandth of one step (lr): Adam divides by the gradient's own rms, so a
        # parameter whose gradient terms nearly cancel turns the vmapped program's one-ulp
        # differences into a visible fraction of its step (measured on an AVX-512 CPU: at
        # most 2.3e-6 at lr 0.01 and 4.5e-6 at lr 0.02, each the one parameter of 49,338
        # off by more than 1e-6). A lane run with another lane's rate or state is off by
        # whole steps: the lanes differ by 0.17.
        assert_leaves_close(res.params, alone.params, rtol=1e-5, atol=max(2e-6, 1e-3 * lr))
    assert max_abs_diff(lanes[0].params, lanes[1].params) > 1e-3  # the rates differ
