"""Learner availability (cluster.availability) at the numerics level: lost gradients are never
applied, so the online run, its replays (loop and scan), its run folders, a diverging run
and a sweep's shared trace all agree on the numbers, and availability that never takes a
learner down changes nothing."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from asyncsim.api import replay, run, simulate, trace_run
from asyncsim.cli import main
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.replay import replay as loop_replay
from asyncsim.drivers.scan import replay_scan
from asyncsim.scenario import load_scenario
from asyncsim.sweep import plan, run_sweep
from asyncsim.testing import check_trace
from asyncsim.trace import DOWN_FILE, Trace

# Up ~3 compute times, then down ~1.5: a third of the learners' time or so is lost.
CHURN = {"up": {"dist": "exponential", "mean": 3.0},
         "down": {"dist": "exponential", "mean": 1.5}}
NEVER_DOWN = {"up": {"dist": "constant", "value": 1e12},
              "down": {"dist": "constant", "value": 1.0}}


@pytest.fixture(scope="module")
def tiny(tiny):
    """Three learners of unequal speed that come and go, 20 updates."""
    return tiny.with_defaults(run={"updates": 20, "eval_every": 10},
                              cluster={"learners": 3,
                                       "compute": {"dist": "lognormal", "mean": 1.0,
                                                   "cv": 0.5},
                                       "availability": CHURN})


def same_params(a, b, **tol):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        if tol:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)
        else:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def same_down(a: Trace, b: Trace) -> None:
    assert sorted(a.down) == sorted(b.down)
    for k in a.down:
        np.testing.assert_array_equal(a.down[k], b.down[k], err_msg=k)


def assert_lost(trace: Trace) -> None:
    """Several gradients were lost, and none of them was applied: each learner's applied
    batches are still 0, 1, 2, ... (a lost batch is recomputed, not skipped)."""
    assert trace.num_down > 0 and trace.down_stats()["lost_gradients"] >= 2
    g = trace.grads
    for k in np.unique(g["learner"]):
        batches = g["batch"][g["learner"] == k]
        assert sorted(batches.tolist()) == list(range(batches.size))
    # A lost gradient's batch that is in the trace was pulled again after its learner was
    # back: the applied row is the recomputation, not the lost one.
    d = trace.down
    for j in np.flatnonzero(d["batch"] >= 0):
        hit = np.flatnonzero((g["learner"] == d["learner"][j]) & (g["batch"] == d["batch"][j]))
        if hit.size:
            assert g["t_pull"][hit[0]] >= d["t_up"][j]
            assert g["t_pull"][hit[0]] > d["t_pull"][j]


PROTOCOLS = [
    ({"kind": "async"}, "heavy-ball"),
    ({"kind": "hardsync"}, "heavy-ball"),
    ({"kind": "softsync", "n": 1}, "heavy-ball"),
    ({"kind": "softsync", "n": 3}, "shifted"),
    ({"kind": "ssp", "s": 1}, "nesterov"),
    ({"kind": "fixed-delay", "tau": 2, "schedule": "race"}, "heavy-ball"),
]


@pytest.mark.parametrize("proto,momentum", PROTOCOLS,
                         ids=[p["kind"] + str(p.get("n", "")) for p, _ in PROTOCOLS])
def test_replay_equals_online_under_churn(proto, momentum, num_cache, tiny):
    scn = tiny(protocol=proto, optimizer={"lr": 0.03, "lr_rule": "inverse-staleness",
                                          "momentum": {"kind": momentum, "beta": 0.8}})
    num = num_cache(scn)
    online = run(scn, numerics=num)
    trace = online.trace
    check_trace(trace, scn)
    assert_lost(trace)
    assert online.summary["lost_gradients"] == trace.down_stats()["lost_gradients"]
    assert online.summary["down_periods"] == trace.num_down
    assert trace.num_updates == 20 and not online.summary["diverged"]
    # The trace of the timing alone is the online run's, down table included.
    alone = simulate(scn)
    assert alone.hash() == trace.hash() == online.summary["trace_hash"]
    same_down(alone, trace)

    again = replay(scn, trace, numerics=num)
    assert again.summary["param_hash"] == online.summary["param_hash"]
    assert again.summary["trace_hash"] == online.summary["trace_hash"]
    # The down table carries no numerics: without it the replay is the same, bit for bit.
    bare = dataclasses.replace(trace, down=Trace.from_columns(trace.grads, trace.updates).down)
    assert bare.num_down == 0 and bare.hash() != trace.hash()  # the hash sees the table
    assert loop_replay(scn, bare, numerics=num).summary["param_hash"] == \
        online.summary["param_hash"]

    if trace.uniform_n_grads is None:
        # Hardsync rounds under churn take 1..3 gradients: the scan refuses them cleanly.
        assert proto["kind"] == "hardsync"
        assert len(set(trace.updates["n_grads"].tolist())) > 1
        with pytest.raises(ValueError, match="same number of gradients in every update"):
            replay_scan(scn, trace, numerics=num)
    else:
        scanned = replay_scan(scn, trace, numerics=num)
        assert scanned.summary["replay_path"] == "scan"
        assert scanned.summary["updates"] == online.summary["updates"]
        assert scanned.summary["trace_hash"] == online.summary["trace_hash"]
        same_params(scanned.params, online.params, rtol=1e-5, atol=1e-6)


def test_online_through_a_fair_interface_under_churn_replays_bit_for_bit(num_cache, tiny):
    # Both PS directions fair, learners going down mid-transfer. The online driver frees a
    # version once no gradient out reads it (Simulation.read_refs): that count must follow
    # every step and every loss, or a freed version is read, or the replay differs.
    link = {"bytes": 1000, "bandwidth": 8000.0}
    scn = tiny(cluster={"network": {"pull": link, "push": link,
                                    "ps_egress": {"bandwidth": 3000.0, "sharing": "fair"},
                                    "ps_ingress": {"bandwidth": 3000.0, "sharing": "fair"}}},
               optimizer={"lr": 0.03, "momentum": {"kind": "heavy-ball", "beta": 0.8}})
    num = num_cache(scn)
    online = run(scn, numerics=num)
    trace = online.trace
    check_trace(trace, scn)
    assert_lost(trace)
    assert trace.num_updates == 20 and not online.summary["diverged"]
    assert simulate(scn).hash() == trace.hash() == online.summary["trace_hash"]
    again = replay(scn, trace, numerics=num)
    assert again.summary["param_hash"] == online.summary["param_hash"]


def test_hardsync_under_churn_has_uneven_rounds(tiny):
    # What makes the case above exercise the refusal (a trace with even rounds would
    # silently skip it).
    trace = simulate(tiny(protocol={"kind": "hardsync"}))
    assert trace.uniform_n_grads is None and trace.num_down > 0
    assert set(trace.updates["n_grads"].tolist()) <= {1, 2, 3}


def test_two_online_runs_under_churn_are_identical(num_cache, tiny):
    scn = tiny(protocol={"kind": "ssp", "s": 1},
               optimizer={"lr": 0.03, "momentum": {"kind": "heavy-ball", "beta": 0.9}})
    a = run(scn, numerics=num_cache(scn))
    b = run(scn, numerics=numerics_for(scn))  # fresh jit caches too
    assert a.trace.num_down > 0
    assert a.summary["trace_hash"] == b.summary["trace_hash"] == b.trace.hash()
    assert a.summary["param_hash"] == b.summary["param_hash"]
    same_down(a.trace, b.trace)
    # ... and another timing seed gives another down table (the hash sees it).
    other = simulate(tiny(protocol={"kind": "ssp", "s": 1}, cluster={"seed": 99}))
    assert other.hash() != a.trace.hash()


SCENARIO = """
name = "churn"
seed = 4
[model]
name = "mlp"
hidden = [8]
[data]
name = "synthetic-cifar"
batch_size = 4
n_train = 64
n_test = 32
[cluster]
learners = 3
compute = { dist = "lognormal", mean = 1.0, cv = 0.5 }
availability = [
  { up = { dist = "constant", value = 1e12 }, down = { dist = "constant", value = 1.0 } },
  { up = { dist = "exponential", mean = 2.0 }, down = { dist = "exponential", mean = 1.0 } },
  { up = { dist = "exponential", mean = 3.0 }, down = { dist = "constant", value = 2.0 } },
]
[protocol]
kind = "softsync"
n = 1
[optimizer]
lr = 0.03
lr_rule = "inverse-staleness"
momentum = { kind = "heavy-ball", beta = 0.8 }
[run]
updates = 15
eval_every = 5
"""


def read_summary(folder):
    return json.loads((folder / "summary.json").read_text())


def test_run_folders_keep_the_down_table(tmp_path, capsys):
    path = tmp_path / "churn.toml"
    path.write_text(SCENARIO)
    src = tmp_path / "run"
    assert main(["run", str(path), "--out", str(src), "--quiet"]) == 0
    assert (src / DOWN_FILE).exists()
    s = read_summary(src)
    trace = Trace.load(src)
    assert trace.hash() == s["trace_hash"]
    d = trace.down
    assert trace.num_down > 0 and s["down_periods"] == trace.num_down
    assert s["lost_gradients"] == int(np.count_nonzero(d["batch"] >= 0)) >= 2
    # Learner 0 is never down; the others are (the per-learner list went through the
    # folder's scenario.toml).
    assert 0 not in set(d["learner"].tolist()) and {1, 2} <= set(d["learner"].tolist())
    end = s["sim_time"]
    assert end == trace.meta["sim_time"] and np.all(d["t_down"] <= end)
    down_time = np.sum(np.minimum(d["t_up"], end) - d["t_down"])
    assert s["up_fraction"] == pytest.approx(1.0 - down_time / (3 * end), rel=1e-12)
    assert 0.0 < s["up_fraction"] < 1.0
    check_trace(trace, load_scenario(src / "scenario.toml"))

    # `asyncsim replay RUN_DIR` reproduces the run, and its folder keeps the down table.
    capsys.readouterr()
    assert main(["replay", str(src), "--quiet"]) == 0
    r = read_summary(src / "replay")
    assert r["param_hash"] == s["param_hash"] and r["matches_source"] is True
    assert r["trace_hash"] == s["trace_hash"]
    assert r["down_periods"] == s["down_periods"]
    assert r["lost_gradients"] == s["lost_gradients"]
    assert r["up_fraction"] == s["up_fraction"]
    rt = Trace.load(src / "replay")
    assert (src / "replay" / DOWN_FILE).exists() and rt.hash() == s["trace_hash"]
    same_down(rt, trace)
    # The scan path (softsync keeps c = 3 per update) agrees to tolerance.
    assert main(["replay", str(src), "--out", str(tmp_path / "scan"), "--path", "scan",
                 "--quiet"]) == 0
    sc = read_summary(tmp_path / "scan")
    assert sc["replay_path"] == "scan" and sc["max_abs_diff_to_source"] < 1e-5
    assert sc["trace_hash"] == s["trace_hash"]

    # `asyncsim trace`: the timing alone is the online run's trace, down table included.
    tr = tmp_path / "trace"
    assert main(["trace", str(path), "--out", str(tr), "--quiet"]) == 0
    t = read_summary(tr)
    assert t["trace_hash"] == s["trace_hash"] and (tr / DOWN_FILE).exists()
    for k in ("down_periods", "lost_gradients", "up_fraction", "updates", "gradients"):
        assert t[k] == s[k], k
    same_down(Trace.load(tr), trace)
    # ... and replaying that timing-only folder gives the online run's numbers.
    assert main(["replay", str(tr), "--quiet"]) == 0
    assert read_summary(tr / "replay")["param_hash"] == s["param_hash"]


HARDSYNC = SCENARIO.replace('kind = "softsync"\nn = 1', 'kind = "hardsync"')


def test_replay_of_uneven_hardsync_rounds_refuses_scan_in_one_line(tmp_path, capsys):
    path = tmp_path / "hs.toml"
    path.write_text(HARDSYNC)
    src = tmp_path / "run"
    assert main(["run", str(path), "--out", str(src), "--quiet"]) == 0
    trace = Trace.load(src)
    assert trace.num_down > 0 and trace.uniform_n_grads is None
    capsys.readouterr()
    assert main(["replay", str(src), "--path", "scan", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "scan needs the same number of gradients" in err
    assert not (src / "replay").exists()
    assert main(["replay", str(src), "--path", "auto", "--quiet"]) == 0
    r = read_summary(src / "replay")
    assert r["matches_source"] is True and r["replay_path"] == "loop"


def stop(summary):
    return summary["diverged_at"], summary["updates"], summary["stop_reason"]


@pytest.fixture(scope="module")
def diverging(tiny):
    """tests/unit/test_divergence.py's case (4 async learners, lr 3.0) with learners that come
    and go: it diverges after a few updates while the timeline goes on."""
    return tiny(name="div", seed=3, optimizer={"lr": 3.0},
                cluster={"learners": 4, "compute": {"dist": "exponential", "mean": 1.0},
                         "availability": CHURN},
                run={"updates": 60, "eval_every": 20})


def test_a_diverging_run_under_churn_stops_with_its_down_table(tmp_path, diverging):
    scn = diverging
    alone = run(scn, out=tmp_path / "div")
    s = alone.summary
    v = s["diverged_at"]
    assert s["diverged"] and v is not None and stop(s) == (v, v + 1, "diverged")
    tr = alone.trace
    end = s["sim_time"]
    assert tr.num_updates == v + 1 and end == float(tr.updates["time"][-1])
    assert tr.meta["sim_time"] == end
    # The down table ends where the run ended: nothing began after, and a period still
    # open then has no end.
    assert np.all(tr.down["t_down"] <= end)
    assert np.all(np.isinf(tr.down["t_up"]) | (tr.down["t_up"] <= end))
    full = simulate(scn)
    assert full.num_updates == 60
    assert np.any(full.down["t_down"] > end)  # the timeline had more down periods after
    cut = full.truncate(v + 1)
    same_down(tr, cut)
    assert tr.hash() == cut.hash()
    check_trace(tr, scn)
    # Its summary's down figures are those of the truncated table.
    if tr.num_down:
        assert s["down_periods"] == tr.num_down
        assert s["lost_gradients"] == tr.down_stats()["lost_gradients"]
        assert s["up_fraction"] == tr.down_stats()["up_fraction"]
    else:
        assert "down_periods" not in s
    # The saved folder holds the truncated trace.
    saved = Trace.load(tmp_path / "div")
    assert saved.hash() == s["trace_hash"] == tr.hash()
    assert (tmp_path / "div" / DOWN_FILE).exists() == (tr.num_down > 0)

    # Replaying the whole timeline stops at the same update, with the same trace.
    loop = replay(scn, full)
    assert stop(loop.summary) == stop(s)
    assert loop.summary["param_hash"] == s["param_hash"]
    assert loop.summary["trace_hash"] == s["trace_hash"]
    same_down(loop.trace, tr)
    scan = replay_scan(scn, full)
    assert stop(scan.summary) == stop(s)
    assert scan.summary["trace_hash"] == s["trace_hash"]


def test_a_diverging_run_under_churn_has_a_down_period_before_it_stops(diverging):
    # What makes the truncation above non-trivial: a down period inside the kept part.
    full = simulate(diverging)
    s = run(diverging).summary
    assert np.any(full.down["t_down"] <= s["sim_time"])
    assert s["down_periods"] >= 1


def test_a_sweep_over_lr_shares_one_churn_trace(tmp_path, num_cache, tiny):
    scn = tiny(protocol={"kind": "softsync", "n": 1},
               optimizer={"lr": 0.03, "momentum": {"kind": "heavy-ball", "beta": 0.8}},
               sweep={"optimizer.lr": [0.01, 0.04]})
    items = plan(scn)
    assert [it["group"] for it in items] == [0, 0]  # lr changes no timing
    index = run_sweep(scn, tmp_path / "sw", vmap="never")
    assert (index["status"] == "complete").all()
    assert index["shared_trace"].all() and not index["vmapped"].any()
    assert (index["replay_path"] == "loop").all() and index["exact"].all()
    expected = simulate(items[0]["scenario"])
    assert expected.num_down > 0
    assert index["trace_hash"].nunique() == 1 and index["trace_hash"].iloc[0] == expected.hash()
    shared = Trace.load(tmp_path / "sw" / "trace_g00")
    assert (tmp_path / "sw" / "trace_g00" / DOWN_FILE).exists()
    assert shared.hash() == expected.hash()
    assert index["param_hash"].nunique() == 2
    for it, (_, row) in zip(items, index.iterrows(), strict=True):
        folder = tmp_path / "sw" / it["point"]
        assert (folder / DOWN_FILE).exists()
        same_down(Trace.load(folder), expected)
        single = run(it["scenario"], numerics=num_cache(it["scenario"]))
        assert single.summary["trace_hash"] == row["trace_hash"]
        assert single.summary["param_hash"] == row["param_hash"]


def test_availability_that_never_takes_a_learner_down_changes_nothing(tmp_path, num_cache,
                                                                       tiny):
    for proto in ({"kind": "async"}, {"kind": "hardsync"}, {"kind": "ssp", "s": 1}):
        plain = tiny(protocol=proto, cluster={"availability": None})
        never = tiny(protocol=proto, cluster={"availability": NEVER_DOWN})
        assert plain.cluster.availability is None and never.cluster.availability is not None
        a, b = simulate(plain), simulate(never)
        assert b.num_down == 0 and a.hash() == b.hash()
        assert a.summary() == b.summary()
        assert "down_periods" not in b.summary()
    proto = {"kind": "softsync", "n": 1}
    plain = tiny(protocol=proto, cluster={"availability": None})
    never = tiny(protocol=proto, cluster={"availability": NEVER_DOWN})
    ra = run(plain, out=tmp_path / "plain", numerics=num_cache(plain))
    rb = run(never, out=tmp_path / "never", numerics=num_cache(never))
    assert ra.summary["trace_hash"] == rb.summary["trace_hash"]
    assert ra.summary["param_hash"] == rb.summary["param_hash"]
    assert "lost_gradients" not in rb.summary and "up_fraction" not in rb.summary
    for folder in ("plain", "never"):
        assert (tmp_path / folder / "trace_grads.parquet").exists()
        assert not (tmp_path / folder / DOWN_FILE).exists()
    assert Trace.load(tmp_path / "never").hash() == ra.summary["trace_hash"]
    t = trace_run(never, tmp_path / "trace")
    assert t.summary["trace_hash"] == ra.summary["trace_hash"]
    assert not (tmp_path / "trace" / DOWN_FILE).exists()
    # Sanity: real churn does change the trace.
    assert simulate(tiny(protocol=proto)).hash() != ra.summary["trace_hash"]


def require(cond: bool) -> None:
    """A precondition of a test: not an AssertionError, so a case that no longer sets up
    what it is about is reported as such."""
    if not cond:
        raise RuntimeError("the case no longer sets up what the test is about")


def test_an_empirical_availability_file_travels_with_the_run_folder(tmp_path, capsys):
    """A file an availability spec reads is copied into the run folder, so the folder
    replays anywhere (it once kept the relative path, which replay resolved against it)."""
    (tmp_path / "ups.csv").write_text("up\n2.0\n3.0\n5.0\n")
    path = tmp_path / "emp.toml"
    never = ('  { up = { dist = "constant", value = 1e12 }, '
             'down = { dist = "constant", value = 1.0 } },\n')
    require(never in SCENARIO)
    path.write_text(SCENARIO.replace(never, '  { up = { dist = "empirical", path = "ups.csv" '
                                     '}, down = { dist = "constant", value = 1.0 } },\n')
                    .replace("updates = 15", "updates = 4"))
    src = tmp_path / "run"
    require(main(["run", str(path), "--out", str(src), "--quiet"]) == 0)
    require(Trace.load(src).num_down > 0)
    capsys.readouterr()
    assert main(["replay", str(src), "--quiet"]) == 0, capsys.readouterr().err
    assert read_summary(src / "replay")["matches_source"] is True


def test_check_trace_accepts_a_softsync_churn_trace_cut_by_sim_time(tiny):
    """A run cut by run.sim_time drops a gradient that arrived and waited in a softsync
    buffer, so the learner's next lost batch is one further on: not a violation (it once
    was reported as one)."""
    from asyncsim.testing.invariants import TraceInvariantError

    scn = load_scenario({**tiny.base, "seed": 1, "run": {"sim_time": 30.0},
                         "protocol": {"kind": "softsync", "n": 1}})
    trace = simulate(scn)
    g, d = trace.grads, trace.down
    # Learner 0 delivered batch 20 (it waited in the buffer when the run ended, so it is
    # not in the trace), then pulled batch 21 and went down with it.
    require(trace.meta["stop_reason"] == "sim_time")
    require(g["batch"][g["learner"] == 0].max() == 19)
    require(d["batch"][-1] == 21 and d["learner"][-1] == 0)
    try:
        check_trace(trace, scn)
    except TraceInvariantError as e:
        raise AssertionError(str(e)) from None
