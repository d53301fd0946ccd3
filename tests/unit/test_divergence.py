"""One divergence rule for every path (asyncsim.drivers.driver.Driver): a diverging run stops
at the same update -- the same ``diverged_at``, ``updates`` and ``stop_reason`` -- alone,
replayed (loop and scan), as a sweep point (one by one or vmapped) and on Ray
(tests/process/test_real.py), and the diverged update is the last one applied."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncsim.api import replay, run, simulate
from asyncsim.drivers.scan import replay_scan
from asyncsim.drivers.vmapped import replay_vmapped
from asyncsim.numerics.lr_rules import register_lr_rule
from asyncsim.sweep import run_sweep


@pytest.fixture(scope="module")
def scenario(tiny):
    """The case the redesign issue measured: 4 async learners, an MLP, lr 3.0 (diverges)."""
    return tiny.with_defaults(name="div", seed=3, optimizer={"lr": 3.0},
                              cluster={"learners": 4, "compute": {"dist": "exponential",
                                                                  "mean": 1.0}},
                              run={"updates": 60, "eval_every": 20})


def stop(summary):
    return summary["diverged_at"], summary["updates"], summary["stop_reason"]


def last_eval(result):
    """The last evaluation row's (version, gradients, sim_time): the diverged state's."""
    row = result.evals.iloc[-1]
    return int(row["version"]), int(row["gradients"]), float(row["sim_time"])


def same_params(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b),
                               strict=True))


@pytest.fixture(scope="module")
def alone(scenario):
    return run(scenario())


def test_a_diverging_run_stops_at_the_diverged_update(alone, scenario):
    s = alone.summary
    v = s["diverged_at"]
    assert s["diverged"] and v is not None and 0 < v < 59
    # The diverged update is the last one applied: the trace, the metrics and the stop
    # reason end there (the run applied 14 updates after diverged_at 8).
    assert stop(s) == (v, v + 1, "diverged")
    assert alone.trace.num_updates == v + 1 and len(alone.updates) == v + 1
    assert alone.evals["version"].iloc[-1] == v + 1
    assert s["sim_time"] == float(alone.trace.updates["time"][-1])
    # The final evaluation is of the state after update v, with its gradient count and
    # time (not those of the update the divergence was found at).
    assert last_eval(alone) == (v + 1, alone.trace.num_gradients, s["sim_time"])
    assert s["gradients"] == alone.trace.num_gradients
    # ... and the parameters are those right after update v: the first v + 1 updates of
    # the whole timeline replayed give them bit for bit; the first v do not (update v was
    # applied), and nothing after it was.
    full = simulate(scenario())
    assert same_params(replay(scenario(), full.truncate(v + 1)).params, alone.params)
    assert not same_params(replay(scenario(), full.truncate(v)).params, alone.params)


def test_replays_stop_where_the_run_stopped(alone, scenario):
    full = simulate(scenario())  # the whole timeline: the replays find the divergence
    assert full.num_updates == 60
    loop = replay(scenario(), full)
    assert stop(loop.summary) == stop(alone.summary)
    assert loop.summary["param_hash"] == alone.summary["param_hash"]
    scan = replay_scan(scenario(), full)
    assert stop(scan.summary) == stop(alone.summary)
    assert last_eval(loop) == last_eval(scan) == last_eval(alone)


LRS = (0.05, 3.0, 30.0)  # trains, diverges (the scenario's rate), diverges at once


@pytest.fixture(scope="module")
def singles(alone, scenario):
    """Each rate of :data:`LRS` run alone (3.0 is ``alone``)."""
    return {lr: alone if lr == 3.0 else run(scenario(optimizer={"lr": lr})) for lr in LRS}


@pytest.mark.parametrize("path", ["loop", "scan"])
def test_vmapped_points_stop_where_each_runs_alone(path, scenario, singles):
    trace = simulate(scenario())
    res = replay_vmapped(scenario(), trace, [{"lr": lr} for lr in LRS], path=path)
    for lr, r in zip(LRS, res, strict=True):
        single = singles[lr]
        assert stop(r.summary) == stop(single.summary), lr
        assert r.trace.num_updates == single.trace.num_updates
        assert last_eval(r) == last_eval(single), lr
    assert not res[0].summary["diverged"] and res[1].summary["diverged"]


@pytest.mark.parametrize("vmap", ["never", "always"])
def test_sweep_points_stop_where_each_runs_alone(tmp_path, vmap, alone, scenario):
    scn = scenario(sweep={"optimizer.lr": [0.05, 3.0]})
    index = run_sweep(scn, tmp_path / vmap, vmap=vmap).set_index("point")
    assert index.loc["p001", "diverged"] and not index.loc["p000", "diverged"]
    assert index.loc["p001", "diverged_at"] == alone.summary["diverged_at"]
    assert index.loc["p001", "updates"] == alone.summary["updates"]
    assert bool(index.loc["p001", "vmapped"]) == (vmap == "always")


def test_an_exploded_evaluation_is_a_divergence(scenario):
    """The quickstart at lr 1e6 ended with test loss 1e18 and diverged: false, because only
    batch losses (computed on stale reads) were checked: the evaluation after an update
    checks the parameters it produced."""
    scn = scenario(cluster={"learners": 1, "compute": {"dist": "constant", "value": 1.0}},
                   optimizer={"lr": 1e6}, run={"updates": 1, "eval_every": 0})
    s = run(scn).summary
    assert s["final_test_loss"] > 1e6 * 2.3  # the update's own batch loss was fine
    assert stop(s) == (0, 1, "diverged")


def test_nonfinite_parameters_are_a_divergence_at_the_update_that_made_them(fresh_registries,
                                                                            scenario):
    """A rule that makes the parameters NaN at staleness >= 3: with P2's round robin at
    delay 4 (staleness = min(version, 4)) update 3 makes them NaN, while the first batch
    loss that reads a NaN version is update 8's. The stop is update 3, found by the
    rollback window (the losses are fetched only every 16 updates)."""
    register_lr_rule("nan-at-3-test", lambda lr, tau, mean:
                     jnp.where(tau >= 3, jnp.nan, lr))
    scn = scenario(protocol={"kind": "fixed-delay", "tau": 4},
                   cluster={"learners": 5, "compute": {"dist": "constant", "value": 1.0}},
                   optimizer={"lr": 0.05, "lr_rule": "nan-at-3-test"},
                   run={"updates": 30, "eval_every": 0})
    res = run(scn)
    assert stop(res.summary) == (3, 4, "diverged")
    assert not np.isfinite(res.summary["final_test_loss"])
    assert stop(replay_scan(scn, simulate(scn)).summary) == (3, 4, "diverged")


def test_a_run_that_never_learns_says_so(tiny):
    """``never_learned``: a classifier whose lowest test error stays within two binomial
    standard errors of chance (the majority class's error) -- beside ``diverged``."""
    from asyncsim.drivers.metrics import chance_error, never_learned

    labels = np.repeat(np.arange(10), 100)  # ten balanced classes, 1,000 examples
    assert chance_error(labels) == pytest.approx(0.9)
    assert chance_error([0, 0, 0, 1]) == pytest.approx(0.25)
    # two standard errors: 2 sqrt(0.9 * 0.1 / 1000) = 0.01897
    assert never_learned([0.95, 0.8815], labels, 10) is True
    assert never_learned([0.95, 0.8805], labels, 10) is False
    assert never_learned([float("nan")], labels, 10) is None  # no evidence either way
    assert never_learned([0.5], labels, None) is None  # a regression's error is its loss
    # A run at a rate too small to move and the same run at a rate that learns (64 test
    # examples, chance 0.890625: learned means below 0.8125).
    still = run(tiny.with_defaults(optimizer={"lr": 1e-7})())
    moved = run(tiny())
    assert still.summary["never_learned"] is True and not still.summary["diverged"]
    assert moved.summary["never_learned"] is False
    assert moved.evals["test_error"].min() < 0.8125 <= still.evals["test_error"].min()
