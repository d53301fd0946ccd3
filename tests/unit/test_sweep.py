"""Sweeps: shared traces, vmapped points equal single replays, resumable index."""

from __future__ import annotations

import jax
import numpy as np
import pandas as pd
import pytest

from asyncsim.api import simulate
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.replay import replay
from asyncsim.drivers.vmapped import replay_vmapped
from asyncsim.scenario import load_scenario
from asyncsim.sweep import plan, run_sweep

BASE = {"seed": 2, "model": {"name": "mlp", "hidden": [8]},
        "data": {"name": "synthetic-cifar", "batch_size": 8, "n_train": 128, "n_test": 32},
        "cluster": {"learners": 3, "compute": {"dist": "exponential", "mean": 1.0}},
        "protocol": {"kind": "softsync", "n": 3},
        "optimizer": {"lr": 0.02, "lr_rule": "inverse-staleness",
                      "momentum": {"kind": "heavy-ball", "beta": 0.9}},
        "run": {"updates": 20, "eval_every": 10}}


@pytest.mark.parametrize("path,proto", [
    ("loop", {"kind": "softsync", "n": 1}),
    ("scan", {"kind": "softsync", "n": 1}),  # c = 3 gradients per update
    ("scan", {"kind": "async"}),
    ("scan", {"kind": "softsync", "n": 3, "momentum": "shifted"}),
])
def test_vmapped_member_equals_single_replay(path, proto):
    proto = dict(proto)
    opt = dict(BASE["optimizer"])
    if proto.pop("momentum", None):
        opt["momentum"] = {"kind": "shifted", "beta": 0.8}
    scn = load_scenario({**BASE, "protocol": proto, "optimizer": opt})
    trace = simulate(scn)
    num = numerics_for(scn)
    # Stable settings: in a diverging run any roundoff difference grows without bound.
    hypers = [{"lr": 0.01}, {"lr": 0.05, "beta": 0.5}, {"lr": 0.03, "weight_decay": 1e-3}]
    vm = replay_vmapped(scn, trace, hypers, numerics=num, path=path)
    for h, res in zip(hypers, vm, strict=True):
        assert res.summary["replay_path"] == path and res.summary["vmapped_points"] == 3
        single = replay(scn, trace, numerics=num, hyper=h)
        for a, b in zip(jax.tree_util.tree_leaves(single.params),
                        jax.tree_util.tree_leaves(res.params), strict=True):
            # vmap may reassociate floating-point sums: agreement to a stated tolerance.
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        assert res.summary["final_test_error"] == pytest.approx(
            single.summary["final_test_error"], abs=1 / 32 + 1e-9)
        assert list(res.evals["version"]) == list(single.evals["version"])
        np.testing.assert_allclose(res.evals["train_loss"], single.evals["train_loss"],
                                   rtol=1e-4)
        assert res.summary["gradients"] == single.summary["gradients"]


def test_the_sweep_path_is_the_fastest_predicted():
    """One by one counts P times a single point's prediction; the least total wins."""
    from asyncsim.drivers.choose import fastest, sweep_path

    predicted = {("single", "loop"): 1.0, ("single", "scan"): 0.4,
                 ("vmapped", "loop"): 1.5, ("vmapped", "scan"): 1.0}
    assert fastest(predicted, 2) == ("single", "scan")  # 0.8 beats 1.0
    assert fastest(predicted, 3) == ("vmapped", "scan")  # 1.2 does not
    scn = load_scenario({**BASE, "run": {"updates": 100, "eval_every": 0}})
    trace = simulate(scn)
    assert sweep_path(scn, trace, [{"lr": 0.01}]) == ("single", "loop")  # nothing to vmap
    # Too short to probe (< 8 probes): no measurement, the exact loop.
    assert sweep_path(scn, trace.truncate(90), [{"lr": 0.01}, {"lr": 0.02}]) == (
        "single", "loop")


def test_predict_times_separates_fixed_and_per_update_costs():
    # Two fake candidates on a fake clock: A costs 30 ms per call whatever the length, B
    # 1 ms per update (and 5 ms more on its first, warm-up, call). On 1,000 updates A must
    # be predicted 0.03 s and B 1 s, although B is the faster one on the 12-update probe.
    from asyncsim.drivers.choose import predict_times

    scn = load_scenario({**BASE, "run": {"updates": 1000}})
    trace = simulate(scn)
    now = [0.0]
    calls = {"A": 0, "B": 0}

    def cost(key, seconds):
        calls[key] += 1
        now[0] += seconds + (0.005 if calls[key] <= 2 else 0.0)

    fns = {"A": lambda probe: cost("A", 0.03),
           "B": lambda probe: cost("B", 0.001 * probe.num_updates)}
    t = predict_times(trace, fns, probe_updates=12, rounds=2, clock=lambda: now[0])
    assert t["A"] == pytest.approx(0.03, abs=1e-12)
    assert t["B"] == pytest.approx(1.0, abs=1e-12)


def test_sweep_groups_by_timing_and_resumes(tmp_path):
    raw = {**BASE, "sweep": {"protocol.n": [1, 3], "optimizer.lr": [0.01, 0.03]}}
    scn = load_scenario(raw)
    items = plan(scn)
    groups = {it["point"]: it["group"] for it in items}
    assert len(set(groups.values())) == 2  # protocol.n changes timing, lr does not
    index = run_sweep(scn, tmp_path / "sw", vmap="always")
    assert (index["status"] == "complete").all()
    assert index["shared_trace"].all() and index["vmapped"].all()
    assert set(index["replay_path"]) <= {"loop", "scan"}  # the probe's choice, recorded
    assert (tmp_path / "sw" / "index.csv").exists()
    # Same group => same trace; an lr change leaves the timing alone.
    for _, g in index.groupby("trace_group"):
        assert g["trace_hash"].nunique() == 1
    # A second call runs nothing and keeps the results.
    again = run_sweep(scn, tmp_path / "sw", vmap="always")
    pd.testing.assert_series_equal(again["param_hash"], index["param_hash"])


def test_sweep_points_one_by_one_equal_independent_runs(tmp_path):
    scn = load_scenario({**BASE, "sweep": {"optimizer.lr": [0.01, 0.03]}})
    index = run_sweep(scn, tmp_path / "sw", vmap="never")
    assert not index["vmapped"].any() and (index["replay_path"] == "loop").all()
    from asyncsim.api import run

    for _, row in index.iterrows():
        single = load_scenario({**BASE, "optimizer": {**BASE["optimizer"],
                                                      "lr": row["optimizer.lr"]}})
        assert run(single).summary["param_hash"] == row["param_hash"]


def test_a_seed_sweep_over_a_fixed_timing_seed_shares_one_trace(tmp_path):
    # cluster.seed fixes the timeline; `seed` then varies only the numerics (data, init,
    # batch order): one trace, and each point equals its own independent online run.
    from asyncsim.api import run

    fixed = {**BASE, "cluster": {**BASE["cluster"], "seed": 5}}
    scn = load_scenario({**fixed, "sweep": {"seed": [0, 1]}})
    assert [it["group"] for it in plan(scn)] == [0, 0]
    index = run_sweep(scn, tmp_path / "sw")
    assert index["shared_trace"].all() and not index["vmapped"].any()
    assert index["trace_hash"].nunique() == 1 and index["param_hash"].nunique() == 2
    for it, (_, row) in zip(plan(scn), index.iterrows(), strict=True):
        assert run(it["scenario"]).summary["param_hash"] == row["param_hash"]
    # The timeline is the one `seed = 5` gives; without cluster.seed each seed has its own.
    assert simulate(load_scenario(fixed)).hash() == simulate(
        load_scenario({**BASE, "seed": 5})).hash()
    free = load_scenario({**BASE, "sweep": {"seed": [0, 1]}})
    assert [it["group"] for it in plan(free)] == [0, 1]
    assert len({simulate(it["scenario"]).hash() for it in plan(free)}) == 2


def test_a_tau_sweep_moves_the_fixed_delay_worker_count():
    scn = load_scenario({"protocol": {"kind": "fixed-delay", "tau": 1},
                         "sweep": {"protocol.tau": [0, 3, 8]}, "run": {"updates": 30}})
    items = plan(scn)
    assert [it["scenario"].cluster.learners for it in items] == [1, 4, 9]
    for it in items:
        tr = simulate(it["scenario"])
        tau = it["scenario"].protocol.options["tau"]
        assert (tr.staleness[tau:] == tau).all()


def test_a_sweep_over_whole_tables_replaces_the_table_at_each_point(tmp_path):
    """``[sweep] protocol = [{...}, {...}]``: each point's protocol is the listed table (keys
    it leaves out at their defaults, none of the base table's kept); the same for a nested
    table (optimizer.momentum) and a delay spec; the index names each point's table."""
    scn = load_scenario({**BASE, "sweep": {
        "protocol": [{"kind": "async"}, {"kind": "softsync", "n": 1}],
        "optimizer.momentum": [{"kind": "none"}, {"kind": "nesterov", "beta": 0.5}]}})
    items = plan(scn)
    got = [(it["scenario"].protocol.kind, dict(it["scenario"].protocol.options),
            it["scenario"].optimizer.momentum.kind, it["scenario"].optimizer.momentum.beta)
           for it in items]
    assert got == [("async", {}, "none", 0.9), ("softsync", {"n": 1}, "none", 0.9),
                   ("async", {}, "nesterov", 0.5), ("softsync", {"n": 1}, "nesterov", 0.5)]
    index = run_sweep(scn, tmp_path / "w")
    assert index["protocol"].tolist() == ['{ kind = "async" }', '{ kind = "softsync", n = 1 }'] * 2
    # A fixed-delay table with its tau moves the worker count as protocol.tau does.
    fixed = load_scenario({"protocol": {"kind": "fixed-delay", "tau": 1}, "run": {"updates": 10},
                           "sweep": {"protocol": [{"kind": "fixed-delay", "tau": 3}]}})
    assert plan(fixed)[0]["scenario"].cluster.learners == 4


def test_a_table_of_keys_that_vary_together_says_what_it_takes():
    """A zipped entry (a label, not a table's name) maps dotted keys: an undotted key in it
    is named, with the way to replace a whole table."""
    from asyncsim.errors import ScenarioError

    with pytest.raises(ScenarioError, match=r"sweep.setup: sets 'kind': a table of keys that "
                                            r"vary together maps dotted keys .* \[sweep\] "
                                            r"protocol ="):
        load_scenario({**BASE, "sweep": {"setup": [{"kind": "async"}]}})
    with pytest.raises(ScenarioError, match=r"sweep.foo: must be a dotted key such as "
                                            r"optimizer.lr, or a table's name \(cluster, "):
        load_scenario({**BASE, "sweep": {"foo": [1, 2]}})


def test_a_point_made_by_other_numerics_is_run_again(tmp_path):
    # A complete point whose summary names another revision of the update core's numerics
    # (or none, as before revisions were recorded) is rerun; the others are kept as they are.
    import json

    from asyncsim.numerics.core import NUMERICS_REVISION

    scn = load_scenario({**BASE, "sweep": {"optimizer.lr": [0.01, 0.03, 0.1]}})
    index = run_sweep(scn, tmp_path / "sw")
    assert (index["numerics_revision"] == NUMERICS_REVISION).all()
    folders = [tmp_path / "sw" / p for p in index["point"]]
    stamps = [(f / "summary.json").stat().st_mtime_ns for f in folders]
    for f, edit in ((folders[0], NUMERICS_REVISION - 1), (folders[1], None)):
        s = json.loads((f / "summary.json").read_text())
        if edit is None:
            del s["numerics_revision"]
        else:
            s["numerics_revision"] = edit
        (f / "summary.json").write_text(json.dumps(s))
    again = run_sweep(scn, tmp_path / "sw")
    assert (again["numerics_revision"] == NUMERICS_REVISION).all()
    assert (folders[2] / "summary.json").stat().st_mtime_ns == stamps[2]
    pd.testing.assert_series_equal(again["param_hash"], index["param_hash"])


@pytest.mark.parametrize("refresh,seen", [(0.0, "complete"), (3600.0, "missing")])
def test_the_index_is_refreshed_between_points_at_most_so_often_and_when_a_point_fails(
        tmp_path, monkeypatch, refresh, seen):
    # While the second point runs, the index shows the first as complete only once the
    # refresh interval has passed; a Ctrl-C in the second point still leaves an index of
    # what finished.
    import asyncsim.sweep as sweep

    scn = load_scenario({**BASE, "sweep": {"optimizer.lr": [0.01, 0.03, 0.1]}})
    index_csv = tmp_path / "sw" / "index.csv"
    during = {}
    run_point = sweep._run_point

    def interrupted_second(item, folder, trace, *, progress):
        if item["point"] == "p001":
            during.update(pd.read_csv(index_csv).set_index("point")["status"])
            raise KeyboardInterrupt
        return run_point(item, folder, trace, progress=progress)

    monkeypatch.setattr(sweep, "INDEX_REFRESH_SECONDS", refresh)
    monkeypatch.setattr(sweep, "_run_point", interrupted_second)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(scn, tmp_path / "sw", vmap="never")
    assert during["p000"] == seen
    after = pd.read_csv(index_csv).set_index("point")["status"].to_dict()
    assert after == {"p000": "complete", "p001": "missing", "p002": "missing"}
