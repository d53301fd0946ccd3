"""The batched path (asyncsim.drivers.batched): the gradients of many updates in one call.

It must execute the loop path's arithmetic: the same updates, the same stop, parameters equal
to rounding; and it must batch what the trace allows -- every gradient whose read version
exists -- which a round-robin fixed delay makes exact: tau + 1 gradients per call."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from asyncsim.api import replay_folder, run, simulate
from asyncsim.drivers.batched import call_sizes, pool_slots
from asyncsim.drivers.replay import ReplayMemoryError, replay, replay_memory
from asyncsim.scenario import load_scenario


def scenario(protocol, *, learners=6, updates=90, optimizer=None, compute=None):
    return load_scenario({
        "seed": 1, "model": {"name": "mlp", "hidden": [16]},
        "data": {"name": "synthetic-cifar", "batch_size": 4, "n_train": 512, "n_test": 100},
        "cluster": {"learners": learners,
                    "compute": compute or {"dist": "exponential", "mean": 1.0}},
        "protocol": protocol,
        "optimizer": optimizer or {"lr": 0.01, "momentum": {"kind": "heavy-ball", "beta": 0.9}},
        "run": {"updates": updates, "eval_every": 30, "eval_samples": 100}})


def flat(params):
    return np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(params)])


@pytest.mark.parametrize("protocol,learners,optimizer", [
    ({"kind": "async"}, 6, None),
    ({"kind": "softsync", "n": 3}, 6, None),
    ({"kind": "hardsync"}, 6, None),  # c = 6 gradients per update, more than batch = 2
    ({"kind": "ssp", "s": 2}, 5, None),
    ({"kind": "fixed-delay", "tau": 3, "schedule": "random"}, 4, None),
    ({"kind": "async"}, 6, {"lr": 0.01, "lr_rule": "inverse-staleness",
                            "compensation": {"kind": "dc-asgd-a"}}),
])
@pytest.mark.parametrize("batch", [2, 64])
def test_the_batched_path_executes_the_loops_updates(protocol, learners, optimizer, batch):
    scn = scenario(protocol, learners=learners, optimizer=optimizer)
    trace = simulate(scn)
    loop = replay(scn, trace)
    got = replay(scn, trace, batch=batch)
    s = got.summary
    assert s["replay_path"] == "batched" and s["exact"] is False and s["replay_batch"] == batch
    assert s["updates"] == loop.summary["updates"] == trace.num_updates
    np.testing.assert_allclose(flat(got.params), flat(loop.params), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got.evals["test_loss"].to_numpy(),
                               loop.evals["test_loss"].to_numpy(), rtol=1e-5)
    # Each call takes at least the gradients an update was missing: no more calls than
    # updates, and with room for more than an update's, fewer.
    assert s["replay_gradient_calls"] <= trace.num_updates
    if protocol["kind"] == "hardsync":  # every gradient reads the version just before its
        assert s["replay_gradient_calls"] == trace.num_updates  # update: nothing ahead
    elif batch > trace.updates["n_grads"].max():
        assert s["replay_gradient_calls"] < trace.num_updates


@pytest.mark.parametrize("tau,batch", [(3, 64), (3, 2), (5, 4)])
def test_a_round_robin_delay_batches_every_gradient_whose_version_exists(tau, batch):
    # Round-robin, staleness exactly tau: update v takes the gradient read at v - tau (the
    # first tau + 1 read version 0). At update v the gradients of v .. v + tau read versions
    # that exist, v + tau + 1 reads v + 1: each call takes min(tau + 1, batch) gradients.
    scn = scenario({"kind": "fixed-delay", "tau": tau}, learners=tau + 1, updates=61)
    trace = simulate(scn)
    assert (trace.grads["staleness"][tau:] == tau).all()
    got = replay(scn, trace, batch=batch)
    assert got.summary["replay_gradient_calls"] == math.ceil(61 / min(tau + 1, batch))
    np.testing.assert_allclose(flat(got.params), flat(replay(scn, trace).params), atol=1e-6)


def test_a_diverging_run_stops_where_the_loop_stops():
    scn = scenario({"kind": "async"}, learners=4, updates=200,
                   optimizer={"lr": 3.0, "momentum": {"kind": "heavy-ball", "beta": 0.9}})
    trace = simulate(scn)
    loop, got = replay(scn, trace), replay(scn, trace, batch=16)
    assert loop.summary["diverged"] and got.summary["diverged"]
    assert got.summary["diverged_at"] == loop.summary["diverged_at"] < 150
    assert got.summary["updates"] == loop.summary["updates"]
    # It stopped there (losses are checked every 16 updates: it ran at most that far
    # beyond, computing none of the rest of the trace), in the state the loop stopped in.
    calm = scenario({"kind": "async"}, learners=4, updates=200)
    full = replay(calm, trace, batch=16).summary["replay_gradient_calls"]
    assert got.summary["replay_gradient_calls"] < full / 2
    np.testing.assert_allclose(flat(got.params), flat(loop.params), atol=1e-5,
                               equal_nan=True)


def test_the_pool_and_the_call_sizes():
    assert call_sizes(1) == [1] and call_sizes(6) == [1, 2, 4, 6] and call_sizes(8) == [1, 2, 4, 8]
    hard = simulate(scenario({"kind": "hardsync"}, learners=6, updates=5))
    assert pool_slots(hard, 2) == 6 + 1  # an update takes 6: more than a call looks ahead
    assert pool_slots(hard, 4) == 2 * 4 + 1
    assert pool_slots(hard, 64) == hard.num_gradients + 1  # no more than the trace has
    with pytest.raises(ValueError, match="batch"):
        replay(scenario({"kind": "async"}), hard, batch=0)


def test_the_pool_counts_against_max_memory():
    scn = scenario({"kind": "async"}, updates=200)
    trace = simulate(scn)
    n_params = flat(replay(scn, trace.truncate(1)).params).size
    # Room for the versions the loop holds and a little more, not for a pool of 64.
    room = replay_memory(trace, n_params)["bytes"] + 8 * n_params * 4
    assert replay(scn, trace, max_memory=room).summary["updates"] == 200
    with pytest.raises(ReplayMemoryError, match="MiB"):
        replay(scn, trace, batch=64, max_memory=room)
    assert replay(scn, trace, batch=1, max_memory=room).summary["updates"] == 200


def test_asyncsim_replay_path_batched(tmp_path):
    scn = scenario({"kind": "async"}, updates=40)
    src = tmp_path / "src"
    source = run(scn, out=src)
    got = replay_folder(src, path="batched")
    assert got.summary["replay_path"] == "batched"
    assert (src / "replay" / "summary.json").exists()
    np.testing.assert_allclose(flat(got.params), flat(source.params), atol=1e-6)
