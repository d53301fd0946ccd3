"""Online driver and replay: equivalences, hand-checked numerics, determinism, resume."""

from __future__ import annotations

import copy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import Killed
from hypothesis import HealthCheck, given, settings

from asyncsim import testing
from asyncsim.api import replay_folder, run, simulate
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.checkpoint import CKPT, checkpoint_meta, load_params
from asyncsim.drivers.replay import ReplayMemoryError, last_use, replay
from asyncsim.drivers.scan import replay_scan
from asyncsim.drivers.slots import pending_plan, slot_plan
from asyncsim.drivers.vmapped import replay_vmapped
from asyncsim.numerics.core import param_hash
from asyncsim.numerics.data import batch_indices
from asyncsim.scenario import load_scenario
from asyncsim.testing import check_trace
from asyncsim.trace import Trace


@pytest.fixture(scope="module")
def tiny(tiny):
    """This module's tiny scenarios: three learners of unequal speed, 12 updates."""
    return type(tiny)({**tiny.base, "run": {"updates": 12},  # no evaluations in between
                       "cluster": {"learners": 3, "compute": {"dist": "lognormal", "mean": 1.0,
                                                              "cv": 0.5}}})


def test_one_learner_zero_delay_is_plain_sgd(num_cache, tiny):
    scn = tiny(cluster={"learners": 1, "compute": {"dist": "constant", "value": 1.0}})
    res = run(scn, numerics=num_cache(scn))
    num = num_cache(scn)
    # optax.sgd on the same batches (learner 0, batch k), from the same initial params.
    params = num.init_params()
    opt = optax.sgd(0.05)
    state = opt.init(params)
    vg = jax.jit(jax.value_and_grad(num.model.loss))
    for k in range(12):
        idx = batch_indices(scn.seed, 0, k, 8, 256)
        _, g = vg(params, num.x_train[idx], num.y_train[idx])
        upd, state = opt.update(g, state, params)
        params = optax.apply_updates(params, upd)
    assert res.summary["param_hash"] == param_hash(params)
    assert not res.trace.staleness.any()


def test_hardsync_is_sgd_with_batch_mu_lambda(num_cache, tiny):
    scn = tiny(protocol={"kind": "hardsync"}, cluster={"learners": 4})
    res = run(scn, numerics=num_cache(scn))
    num = num_cache(scn)
    params = num.init_params()
    vg = jax.jit(jax.value_and_grad(num.model.loss))
    for k in range(12):
        idx = jnp.concatenate([batch_indices(scn.seed, l, k, 8, 256) for l in range(4)])
        _, g = vg(params, num.x_train[idx], num.y_train[idx])  # one batch of mu * lambda
        params = jax.tree_util.tree_map(lambda p, d: p - 0.05 * d, params, g)
    got = res.params
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(params),
                    strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kind,extra", [
    ("async", {}), ("hardsync", {}), ("softsync", {"n": 1}), ("softsync", {"n": 3}),
    ("ssp", {"s": 1}), ("fixed-delay", {"tau": 2}),
])
@pytest.mark.parametrize("momentum", ["none", "heavy-ball", "nesterov", "shifted"])
def test_replay_equals_online(kind, extra, momentum, num_cache, tiny):
    proto = {"kind": kind, **extra}
    cluster = {} if kind == "fixed-delay" else {"learners": 3}
    scn = tiny(protocol=proto, optimizer={"lr": 0.03, "lr_rule": "inverse-staleness",
                                          "momentum": {"kind": momentum, "beta": 0.8}},
               cluster=cluster)
    if kind == "fixed-delay":
        scn = load_scenario({**_raw(scn), "cluster": {"learners": 3}})
    num = num_cache(scn)
    online = run(scn, numerics=num)
    check_trace(online.trace, scn)
    again = replay(scn, online.trace, numerics=num)
    assert again.summary["param_hash"] == online.summary["param_hash"]


@pytest.mark.parametrize("proto,learners", [
    ({"kind": "async"}, 3), ({"kind": "softsync", "n": 1}, 3),
    ({"kind": "fixed-delay", "tau": 2}, 3),
    ({"kind": "softsync", "n": 1}, 6),  # c = 6: gradients vmapped inside the scan body
    ({"kind": "hardsync"}, 6),  # nothing stale: no version buffer, c = 6
])
def test_scan_path_agrees_with_the_loop(proto, learners, num_cache, tiny):
    from asyncsim.drivers.choose import choose_path

    cluster = {"learners": learners}
    scn = tiny(protocol=proto, cluster=cluster, run={"updates": 30, "eval_every": 10},
               optimizer={"lr": 0.03, "lr_rule": "inverse-staleness",
                          "momentum": {"kind": "shifted", "beta": 0.8}})
    num = num_cache(scn)
    res = run(scn, numerics=num)
    for store in ("versions", "gradients"):
        if store == "gradients" and proto["kind"] == "hardsync":
            continue  # nothing stale: the gradient store would hold what it reads now
        scanned = replay_scan(scn, res.trace, numerics=num, store=store)
        assert scanned.summary["replay_store"] == store
        for a, b in zip(jax.tree_util.tree_leaves(res.params),
                        jax.tree_util.tree_leaves(scanned.params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        assert list(scanned.evals["version"]) == list(res.evals["version"])
        np.testing.assert_allclose(scanned.evals["train_loss"], res.evals["train_loss"],
                                   rtol=1e-5)
    assert choose_path(scn, res.trace, numerics=num) in ("loop", "scan")


def test_gradient_store_with_unread_and_shared_versions_agrees_with_the_loop(num_cache, tiny):
    """Pull latency under ssp: some versions are read by no gradient (the update computes
    into the scratch slot) and others by several (the extra reads loop)."""
    scn = tiny(protocol={"kind": "ssp", "s": 1}, run={"updates": 40},
               cluster={"learners": 4, "network": {
                   "pull": {"latency": {"dist": "exponential", "mean": 0.5}}}},
               optimizer={"lr": 0.03, "momentum": {"kind": "heavy-ball", "beta": 0.9}})
    num = num_cache(scn)
    res = run(scn, numerics=num)
    reads = np.bincount(res.trace.grads["read_version"],
                        minlength=res.trace.num_updates)[:res.trace.num_updates]
    assert (reads == 0).any() and (reads[1:] >= 2).any()
    scanned = replay_scan(scn, res.trace, numerics=num, store="gradients")
    for a, b in zip(jax.tree_util.tree_leaves(res.params),
                    jax.tree_util.tree_leaves(scanned.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_one_scan_program_serves_every_chunk_length(tiny):
    """Chunks of any length (evaluation spacing, a trace's tail, the path probes' 12 and 48
    updates) run the same compiled program: its inputs are padded to the chunk size and
    the loop's trip count is an argument."""
    scn = tiny(run={"updates": 40, "eval_every": 7})  # chunks of 7 and a tail of 5
    num = numerics_for(scn)  # its own program cache, whatever other tests compiled
    trace = simulate(scn)
    full = replay_scan(scn, trace, numerics=num)
    short = replay_scan(scn, trace.truncate(12), numerics=num, chunk=512)
    programs = {k: v for k, v in num._scan_cache.items() if not k[2]}  # single-point ones
    assert len(programs) == 1 and next(iter(programs.values()))._cache_size() == 1
    # Padding rows never run: the 12-update replay equals the first 12 updates of the loop.
    loop12 = replay(scn, trace.truncate(12), numerics=num)
    for a, b in zip(jax.tree_util.tree_leaves(loop12.params),
                    jax.tree_util.tree_leaves(short.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert list(full.evals["version"]) == [0, 7, 14, 21, 28, 35, 40]


def _raw(scn):
    from asyncsim.config import to_dict

    d = to_dict(scn)
    d.pop("source", None)
    return d


def test_replay_of_a_hand_written_trace_on_a_quadratic():
    # Quadratic L(w) = 0.5 * sum_i h_i w_i^2, w0 = 1, gradient h * w (data ignored).
    # Four updates by hand (async, alpha0/tau rule, lr 0.1), staleness 0, 1, 2, 1:
    h = np.array([1.0, 4.0], np.float32)
    scn = load_scenario({
        "seed": 0, "model": {"name": "quadratic", "eigenvalues": [1.0, 4.0]},
        "data": {"name": "gaussian", "dim": 2, "n_train": 16, "n_test": 4, "batch_size": 2},
        "cluster": {"learners": 3}, "optimizer": {"lr": 0.1, "lr_rule": "inverse-staleness"},
        "run": {"updates": 4}})
    trace = Trace.from_columns(
        {"learner": [0, 1, 2, 0], "batch": [0, 0, 0, 1], "read_version": [0, 0, 0, 2],
         "apply_version": [0, 1, 2, 3], "staleness": [0, 1, 2, 1],
         "t_pull": [0, 0, 0, 1], "t_push": [1, 1.5, 2, 3], "t_arrive": [1, 1.5, 2, 3],
         "t_apply": [1, 1.5, 2, 3]},
        {"version": [0, 1, 2, 3], "time": [1, 1.5, 2, 3], "n_grads": [1, 1, 1, 1],
         "start": [0, 1, 2, 3]})
    res = replay(scn, trace)
    w = [np.ones(2, np.float32)]
    w.append(w[0] - 0.1 * h * w[0])          # tau 0: alpha0
    w.append(w[1] - 0.1 / 1 * h * w[0])      # tau 1: read v0
    w.append(w[2] - 0.1 / 2 * h * w[0])      # tau 2: read v0
    w.append(w[3] - 0.1 / 1 * h * w[2])      # tau 1: read v2
    np.testing.assert_allclose(np.asarray(res.params["w"]), w[4], rtol=1e-6)
    # 1 - 0.1 - 0.1 - 0.05 = 0.75; then - 0.1 * 0.8 = 0.67   (h = 1)
    assert float(res.params["w"][0]) == pytest.approx(0.67, rel=1e-6)
    # The scan path keeps v0 (read until update 2) and v2 (read at update 3): v1 is never
    # read, so it and v3 reuse slots; 2 slots instead of the S + 1 = 3 ring.
    slot, k = slot_plan(trace)
    assert k == 2 and slot[0] != slot[2]
    scanned = replay_scan(scn, trace)
    np.testing.assert_allclose(np.asarray(scanned.params["w"]), w[4], rtol=1e-6)
    assert scanned.summary["replay_versions_held"] == 2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(testing.scenarios(max_learners=24, max_updates=120))
def test_slot_plan_never_overwrites_a_version_still_read(scn):
    # Version r must stay in its slot from its creation (after update r - 1) until its last
    # reader; the plan must use no more slots than versions alive at once (<= S + 1).
    tr = simulate(scn)
    slot, k = slot_plan(tr)
    m = tr.num_updates
    lu = np.maximum(last_use(tr), np.arange(m + 1))
    owner = {}
    for v in range(m + 1):  # v: the version written after update v - 1
        if v:
            for r in tr.grads["read_version"][tr.updates["start"][v - 1]:][
                    :tr.updates["n_grads"][v - 1]]:
                assert owner[slot[r]] == r  # every read finds its version in place
        owner[slot[v]] = v
    alive = max(int(np.sum((np.arange(m + 1) <= v) & (lu >= v))) for v in range(m + 1))
    assert k == alive <= tr.max_staleness + 1
    assert 0 <= slot.min() and slot.max() < k


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(testing.scenarios(max_learners=24, max_updates=120))
def test_pending_plan_never_overwrites_a_gradient_before_it_is_applied(scn):
    # Gradient i is computed at the start of update r_i and taken by update a_i: no other
    # gradient computed in between may land in its slot, and Q is the most pending at once.
    tr = simulate(scn)
    slot, q = pending_plan(tr)
    r, a = tr.grads["read_version"], tr.grads["apply_version"]
    for i in range(r.size):
        clash = (slot == slot[i]) & (r >= r[i]) & (r <= a[i])
        clash[i] = False
        assert not clash.any()
    most = max((int(np.sum((r <= v) & (a >= v))) for v in range(tr.num_updates)), default=0)
    assert q == max(most, 1) and (slot.size == 0 or slot.max() < q)


def test_scan_keeps_only_the_live_versions_of_a_straggler_trace(num_cache, tiny):
    # One learner 20x slower: the staleness reaches ~20 x 3 but only ~4 versions are alive.
    scn = tiny(cluster={"learners": 4, "compute": {"dist": "constant", "value": 1.0},
                        "speed": [1, 0.9, 0.8, 0.05]},
               run={"updates": 120, "eval_every": 40})
    num = num_cache(scn)
    res = run(scn, numerics=num)
    _, k = slot_plan(res.trace)
    assert res.trace.max_staleness >= 40 and k <= 5
    scanned = replay_scan(scn, res.trace, numerics=num, store="versions")
    assert scanned.summary["replay_versions_held"] == k
    # The gradient store holds about one pending gradient per learner, and no version.
    pending = replay_scan(scn, res.trace, numerics=num)
    assert pending.summary["replay_store"] == "gradients"
    assert pending.summary["replay_versions_held"] == 1
    assert pending.summary["replay_pending_gradients"] <= 4 + 1 + 1  # and the scratch slot
    for other in (scanned, pending):
        for a, b in zip(jax.tree_util.tree_leaves(res.params),
                        jax.tree_util.tree_leaves(other.params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_same_scenario_same_param_hash(num_cache, tiny):
    scn = tiny(protocol={"kind": "softsync", "n": 3})
    a = run(scn, numerics=num_cache(scn))
    b = run(scn, numerics=numerics_for(scn))  # fresh jit caches too
    assert a.summary["param_hash"] == b.summary["param_hash"]
    assert a.summary["trace_hash"] == b.summary["trace_hash"]


@pytest.mark.parametrize("momentum", ["none", "shifted"])
def test_divergence_is_recorded_not_a_crash(momentum, tmp_path, tiny):
    # With momentum, the rollback window holds states whose buffers later updates took over.
    scn = tiny(optimizer={"lr": 1e4, "momentum": {"kind": momentum, "beta": 0.9}},
               run={"updates": 60})
    res = run(scn, out=tmp_path / "div")
    s = res.summary
    assert s["diverged"] is True
    assert 0 <= s["diverged_at"] < 60
    assert (tmp_path / "div" / "summary.json").exists()
    assert res.trace.num_updates < 60


@pytest.mark.parametrize("momentum", ["heavy-ball", "shifted"])
def test_the_update_program_takes_over_the_momentum_and_computes_the_same(momentum, num_cache,
                                                                          tiny):
    """The update programs donate the state's momentum buffers (written in place: P2's
    per-learner buffers would otherwise be copied whole at every update) and nothing else,
    and compute bit for bit what the same program without donation computes."""
    scn = tiny(optimizer={"lr": 0.03, "momentum": {"kind": momentum, "beta": 0.8}})
    num = num_cache(scn)
    trace = run(scn, numerics=num).trace
    plain = jax.jit(num.fused1_fn)  # the c = 1 update program, nothing donated
    state = num.init_state()
    ref = jax.tree_util.tree_map(jnp.copy, state)
    versions = {0: state.params}
    for v, rows, _ in trace.iter_updates():
        (l, b, r, tau), = rows
        ref, _ = plain(ref, versions[r], num.x_train, num.y_train, np.int32(l), np.int32(b),
                       np.int32(tau), np.int32(v))
        old, (state, _) = state, num.update(state, versions, v, rows)
        assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(old.momentum))
        assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(old.params))
        versions[v + 1] = state.params
        assert param_hash(state) == param_hash(ref)
    assert param_hash(state.params) == run(scn, numerics=num).summary["param_hash"]


@pytest.mark.parametrize("optimizer, hidden", [
    ({"lr": 0.03, "momentum": {"kind": "shifted", "beta": 0.8}}, 16),
    ({"lr": 0.03, "momentum": {"kind": "heavy-ball", "beta": 0.9},
      "compensation": {"kind": "gap-aware"}}, 16),
    ({"lr": 0.01, "transform": {"name": "adam"}, "lr_rule": "inverse-staleness",
      "compensation": {"kind": "dc-asgd-a"}}, 16),
    # the studies' MLP, whose 3072 x 128 layer XLA could have fused differently
    ({"lr": 0.01, "momentum": {"kind": "heavy-ball", "beta": 0.9}}, 128),
], ids=["shifted", "heavy-ball-gap-aware", "adam-dc-asgd-a", "mlp128-heavy-ball"])
def test_an_update_in_one_program_is_its_gradient_calls_and_update_program(optimizer, hidden,
                                                                             num_cache, tiny):
    """An update of c gradients runs as one program while c <= ``fused_rows``, else as
    programs of ``fused_rows`` gradients and the update program; both give, bit for bit,
    what the real PS computes: each gradient from ``grad`` at the version it read, applied
    by ``apply_given``, and the gradients' batch losses."""
    scn = tiny(optimizer=optimizer, cluster={"learners": 5}, model={"hidden": [hidden]},
               protocol={"kind": "softsync", "n": 1}, run={"updates": 10})
    num = num_cache(scn)
    chunked = copy.copy(num)
    chunked.fused_rows = 2  # the same programs, c = 5 above the bound: chunks of 2, 2, 1
    trace = run(scn, numerics=num).trace
    assert num.fused_rows >= 5 and {len(rows) for _, rows, _ in trace.iter_updates()} == {5}
    states = {k: num.init_state() for k in ("fused", "chunked", "ps")}
    versions = {k: {0: s.params} for k, s in states.items()}
    for v, rows, _ in trace.iter_updates():
        read = versions["ps"]
        outs = [num.grad(read[r], num.x_train, num.y_train, np.int32(l), np.int32(b))
                for l, b, r, _ in rows]
        for k, n in (("fused", num), ("chunked", chunked)):
            old = states[k]
            states[k], losses = n.update(old, versions[k], v, rows)
            assert np.asarray(losses).tobytes() == np.stack([o[0] for o in outs]).tobytes()
            # The momentum given up, the parameters (which reads may hold) kept.
            assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(old.momentum))
            assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(old.params))
        states["ps"] = num.apply_given(states["ps"], v, rows, [o[1] for o in outs], read)
        for k, s in states.items():
            versions[k][v + 1] = s.params
        assert param_hash(states["fused"]) == param_hash(states["chunked"]) == param_hash(
            states["ps"])
    assert trace.grads["staleness"].max() > 0  # versions read apart, compensated
    assert param_hash(states["fused"].params) == run(scn, numerics=num).summary["param_hash"]


def test_an_update_fuses_only_as_many_rows_as_their_temporaries_allow(tiny):
    """``fused_rows`` weighs a row by XLA's memory analysis of the one-row gradients
    program: P1's network at mu = 128 holds ~136 MiB of temporaries a row, so none of its
    updates is fused (by its gradient's 0.36 MiB alone it would fuse 16 rows: 2 GiB); the
    studies' MLP [128] fuses 10 (1.6 MiB a row, within 16 MiB)."""
    big = load_scenario({
        "seed": 0, "model": {"name": "cifar10-full"},
        "data": {"name": "synthetic-cifar", "batch_size": 128, "n_train": 256, "n_test": 64},
        "cluster": {"learners": 4}, "protocol": {"kind": "hardsync"}, "run": {"updates": 2}})
    assert numerics_for(big).fused_rows == 1
    assert numerics_for(tiny(model={"hidden": [128]}, data={"batch_size": 4})).fused_rows == 10


def test_update_programs_are_shared_across_hyperparameters_and_give_their_own_numbers(tiny):
    """Numerics whose optimizers differ only in lr, momentum beta and weight decay share one
    set of update programs (the hyperparameters are traced); each run ends where it ends
    with programs of its own. Another momentum kind gets other programs."""
    softsync = {"protocol": {"kind": "softsync", "n": 1}, "run": {"updates": 8}}
    first = tiny(optimizer={"lr": 0.03, "momentum": {"kind": "heavy-ball", "beta": 0.9}},
                 **softsync)
    other = tiny(optimizer={"lr": 0.01, "momentum": {"kind": "heavy-ball", "beta": 0.5},
                            "weight_decay": 1e-3}, **softsync)
    a, b = numerics_for(first), numerics_for(other)
    assert b._fused is a._fused and b.apply is a.apply
    run(first, numerics=a)  # the shared programs compiled by the first
    shared = run(other, numerics=b).summary["param_hash"]
    b.programs.updates.clear()
    alone = numerics_for(other)
    assert alone._fused is not a._fused
    assert run(other, numerics=alone).summary["param_hash"] == shared
    nesterov = numerics_for(tiny(optimizer={"lr": 0.03, "momentum": {"kind": "nesterov"}},
                                 **softsync))
    assert nesterov._fused is not alone._fused


def test_replay_memory_bound_is_checked_before_allocating(num_cache, tiny):
    scn = tiny(cluster={"learners": 3}, run={"updates": 30})
    res = run(scn, numerics=num_cache(scn))
    with pytest.raises(ReplayMemoryError, match="parameter versions"):
        replay(scn, res.trace, numerics=num_cache(scn), max_memory=1000)
    with pytest.raises(ReplayMemoryError, match="parameter versions"):
        replay_scan(scn, res.trace, numerics=num_cache(scn), max_memory=1000,
                    store="versions")
    # The scan's default store for an MLP keeps pending gradients: checked the same way.
    with pytest.raises(ReplayMemoryError, match=r"holds \d+ pending gradients at once"):
        replay_scan(scn, res.trace, numerics=num_cache(scn), max_memory=1000)
    for path, what in (("loop", "parameter versions"), ("scan", "pending gradients")):
        with pytest.raises(ReplayMemoryError, match=f"{what} at once for each of 2 sweep"):
            replay_vmapped(scn, res.trace, [{"lr": 0.01}, {"lr": 0.02}],
                           numerics=num_cache(scn), max_memory=1000, path=path)


def test_replay_refuses_a_trace_with_more_learners_than_the_scenario(num_cache, tiny):
    """Shifted momentum indexes its per-learner buffers inside jit, where an out-of-range
    learner id would be clamped onto another learner's buffer rather than raise."""
    from asyncsim.errors import ScenarioError

    scn = tiny(cluster={"learners": 3}, run={"updates": 10})
    trace = simulate(scn)
    assert int(trace.grads["learner"].max()) == 2
    fewer = tiny(cluster={"learners": 2}, run={"updates": 10},
                 optimizer={"lr": 0.05, "momentum": {"kind": "shifted", "beta": 0.5}})
    for fn in (replay, replay_scan):
        with pytest.raises(ScenarioError, match="cluster.learners: the trace has gradients of "
                                                "learner 2, the scenario only 2 learners"):
            fn(fewer, trace)
    with pytest.raises(ScenarioError, match="learner 2"):
        replay_vmapped(fewer, trace, [{"lr": 0.01}, {"lr": 0.02}])


def test_run_folder_and_replay_folder(tmp_path, tiny):
    scn = tiny(run={"updates": 10, "eval_every": 5})
    out = tmp_path / "run"
    res = run(scn, out=out)
    for f in ("scenario.toml", "trace_grads.parquet", "trace_updates.parquet", "eval.csv",
              "updates.parquet", "summary.json", "provenance.json", "params.npz"):
        assert (out / f).exists(), f
    assert list(res.evals["version"]) == [0, 5, 10]
    again = replay_folder(out)
    assert again.summary["param_hash"] == res.summary["param_hash"]
    p = load_params(out, res.params)
    assert param_hash(p) == res.summary["param_hash"]


def _ckpt_version(folder) -> int:
    """The version of ``folder``'s checkpoint (written atomically), -1 while it has none."""
    return checkpoint_meta(folder)["version"] if (folder / CKPT).exists() else -1


class _KillAt:
    """The scenario's monitor, dying at update ``at``: a run killed after its checkpoints
    before ``at`` (in process, so the point is exact)."""

    def __init__(self, inner, at):
        self.inner, self.at, self.every = inner, at, inner.every

    def observe(self, driver, version):
        if version >= self.at:
            raise Killed(version)
        self.inner.observe(driver, version)

    def state(self):
        return self.inner.state()

    def restore(self, state):
        self.inner.restore(state)

    def finish(self, driver):
        return self.inner.finish(driver)


def test_resumed_run_writes_what_the_uninterrupted_one_does(tmp_path, tiny):
    """Resumed from a checkpoint, a run's evaluations (gradients and times included: those
    before the checkpoint are not counted twice) and what its monitor measured before the
    checkpoint are those of the run that was never stopped."""
    import pandas as pd

    from asyncsim.api import run
    from asyncsim.stability.measure import monitor_for

    scn = tiny(run={"updates": 40, "eval_every": 5, "checkpoint_every": 10},
               measure={"sharpness_points": 8, "sharpness_samples": 32})
    ref = run(scn, out=tmp_path / "full")
    killed = tmp_path / "killed"
    with pytest.raises(Killed):
        run(scn, out=killed, monitor=_KillAt(monitor_for(scn), at=25))
    assert not (killed / "summary.json").exists() and _ckpt_version(killed) == 20
    resumed = run(scn, out=killed, resume=True)
    assert resumed.summary["param_hash"] == ref.summary["param_hash"]
    for name in ("eval.csv", "sharpness.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(killed / name),
                                      pd.read_csv(tmp_path / "full" / name), check_exact=True)
    ev = pd.read_csv(killed / "eval.csv")
    assert ev["gradients"].iloc[-1] == resumed.trace.num_gradients
    assert len(pd.read_csv(killed / "sharpness.csv")) == 9  # versions 0, 5, ..., 40


def test_unfinished_folder_needs_resume(tmp_path, tiny):
    from asyncsim.runs import RunFolderError

    out = tmp_path / "x"
    out.mkdir()
    (out / "scenario.toml").write_text("name = 'x'\n")
    with pytest.raises(RunFolderError, match="--resume"):
        run(tiny(), out=out)
    assert Path(out / "scenario.toml").exists()


def test_the_first_evaluation_computes_while_the_run_goes_on_and_is_the_same(tiny):
    """The driver dispatches the evaluation of the initial parameters and fetches it at the
    next evaluation (asyncsim.drivers.metrics.Recorder.evaluate_later): its row is the
    one an evaluation waited for gives, to the bit, and comes first; so are the chunked
    evaluation's, dispatched whole and summed later."""
    scn = tiny(run={"updates": 6, "eval_every": 3, "eval_samples": 150})
    res = run(scn)
    assert list(res.evals["version"]) == [0, 3, 6]
    num = numerics_for(scn)
    params = num.init_params()
    loss, err = num.evaluate(params, samples=150)
    row = res.evals.iloc[0]
    assert (row["test_loss"], row["test_error"]) == (float(loss), float(err))
    for batch in (40, 1000):  # four chunks (the last one short), one
        later = num.evaluate(params, samples=150, batch=batch, wait=False)
        now = num.evaluate(params, samples=150, batch=batch)
        assert later() == now and later() == now  # the same pair, as often as it is read


def test_a_recorder_adds_an_evaluation_computing_before_any_later_one():
    from asyncsim.drivers.metrics import Recorder
    from asyncsim.numerics.numerics import EvalRecord

    def rec(v):
        return EvalRecord(v, v, float(v), 0.0, float("nan"), 1.0, 0.5)

    calls = []
    r = Recorder()
    r.evaluate_later(lambda: calls.append(0) or rec(0))
    assert calls == []  # not fetched until read
    r.evals.append(rec(3))  # reading the list adds it first
    assert [e.version for e in r.evals] == [0, 3] and calls == [0]
    r.evaluate_later(lambda: calls.append(6) or rec(6))
    r.evaluate_later(lambda: calls.append(9) or rec(9))  # the one before is added first
    assert calls == [0, 6] and [e.version for e in r.evals] == [0, 3, 6, 9]
    r.evaluate_later(lambda: calls.append(12) or rec(12))
    r.evals = [rec(0)]  # replaced: the one computing with the rest
    assert [e.version for e in r.evals] == [0] and calls == [0, 6, 9]
