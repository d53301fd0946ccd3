"""``asyncsim timeline``: a run's Gantt chart from its trace alone (asyncsim.timeline)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from asyncsim.cli import main
from asyncsim.timeline import intervals, utilisation
from asyncsim.trace import Trace


def hand_trace() -> Trace:
    """Two learners, three gradients, hand-made: learner 0 pulls at 0, pushes at 2, the push
    arrives at 2.5, waits, pulls again at 3.0; learner 1 pulls at 0.5, pushes at 1.5,
    arrives at 2.0. Two updates: (g0 of learner 1, g0 of learner 0) at 2.5, then g1 at 5."""
    grads = {"learner": [1, 0, 0], "batch": [0, 0, 1], "read_version": [0, 0, 1],
             "apply_version": [0, 0, 1], "staleness": [0, 0, 0],
             "t_pull": [0.5, 0.0, 3.0], "t_push": [1.5, 2.0, 4.0],
             "t_arrive": [2.0, 2.5, 4.5], "t_apply": [2.5, 2.5, 5.0]}
    updates = {"version": [0, 1], "time": [2.5, 5.0], "n_grads": [2, 1], "start": [0, 2]}
    return Trace.from_columns(grads, updates)


def test_hand_worked_intervals():
    iv = intervals(hand_trace())
    got = [(int(r.learner), r.kind, r.t0, r.t1) for r in iv.itertuples()]
    assert got == [(0, "compute", 0.0, 2.0), (0, "push", 2.0, 2.5), (0, "wait", 2.5, 3.0),
                   (0, "compute", 3.0, 4.0), (0, "push", 4.0, 4.5),
                   (1, "compute", 0.5, 1.5), (1, "push", 1.5, 2.0)]
    # Windows clip, learner ranges select (B excluded).
    w = intervals(hand_trace(), window=(1.0, 3.5), learners=(0, 1))
    assert [(r.kind, r.t0, r.t1) for r in w.itertuples()] == [
        ("compute", 1.0, 2.0), ("push", 2.0, 2.5), ("wait", 2.5, 3.0), ("compute", 3.0, 3.5)]


def test_a_real_trace_splits_pull_from_compute_and_marks_down_time():
    t = hand_trace()
    grads = {**t.grads, "t_start": np.array([0.7, 0.25, 3.5])}
    real = Trace.from_columns(grads, t.updates)
    restarts = pd.DataFrame([{"event": "lost", "learner": 1, "t": 2.2},
                             {"event": "restarted", "learner": 1, "t": 3.0},
                             {"event": "rejoined", "learner": 1, "t": 3.4}])
    iv = intervals(real, restarts=restarts)
    l0 = iv[iv["learner"] == 0]
    assert [(r.kind, r.t0, r.t1) for r in l0.itertuples()][:2] == [("pull", 0.0, 0.25),
                                                                   ("compute", 0.25, 2.0)]
    down = iv[iv["kind"] == "down"]
    assert [(int(r.learner), r.t0, r.t1) for r in down.itertuples()] == [(1, 2.2, 3.4)]


def test_intervals_tile_each_learners_span(tiny):
    # pull+compute, push and wait follow each other without gap or overlap, so the
    # fractions of each learner's span sum to one -- under a barrier (hardsync: waits) and
    # with network latency (pushes).
    from asyncsim.api import simulate

    scn = tiny(protocol={"kind": "hardsync"}, cluster={
        "learners": 3, "compute": {"dist": "exponential", "mean": 1.0},
        "network": {"push": {"latency": {"dist": "constant", "value": 0.2}}}},
        run={"updates": 40})
    trace = simulate(scn)
    iv = intervals(trace)
    use = utilisation(iv)
    assert np.allclose(use[["compute", "push", "wait"]].sum(axis=1), 1.0)
    assert (use["wait"] > 0.05).all() and (use["push"] > 0.05).all()
    for _, g in iv.groupby("learner"):
        assert np.allclose(g["t0"].to_numpy()[1:], g["t1"].to_numpy()[:-1])


def test_cli_draws_the_chart_and_refuses_bad_ranges(tiny, tmp_path, capsys):
    from asyncsim.runs import scenario_toml

    path = tmp_path / "s.toml"
    path.write_text(scenario_toml(tiny(run={"updates": 20})))
    out = tmp_path / "run"
    assert main(["trace", str(path), "--out", str(out), "--quiet"]) == 0
    assert main(["timeline", str(out), "--learners", "0:2", "--window", ":5"]) == 0
    printed = capsys.readouterr().out
    assert f"timeline: {out / 'timeline.png'}" in printed
    drawn = pd.read_csv(out / "timeline.csv")
    assert set(drawn["learner"]) == {0, 1} and drawn["t1"].max() <= 5.0
    assert (out / "timeline.png").exists()
    for flag, value, key in [("--learners", "2", "--learners"), ("--window", "5:1", "--window"),
                             ("--window", "100000:", "--window")]:
        assert main(["timeline", str(out), flag, value]) == 2
        err = capsys.readouterr().err.strip()
        assert key in err and len(err.splitlines()) == 1, err
    assert main(["timeline", str(tmp_path / "missing")]) == 2
    assert "no such run folder" in capsys.readouterr().err


def test_timeline_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["timeline", "--help"])
    assert e.value.code == 0 and "--window" in capsys.readouterr().out


def test_down_time_is_cut_out_of_waits_and_pulls():
    t = hand_trace()
    grads = {**t.grads, "t_start": np.array([0.7, 0.25, 3.5])}
    real = Trace.from_columns(grads, t.updates)
    # Learner 0 lost at 2.6 (after its first arrival at 2.5), its actor restarted at 2.8
    # and served at once (async: no "rejoined"): down 2.6-2.8, the wait 2.5-3.0 cut around
    # it; shares still sum to one.
    restarts = pd.DataFrame([{"event": "lost", "learner": 0, "t": 2.6},
                             {"event": "restarted", "learner": 0, "t": 2.8}])
    iv = intervals(real, restarts=restarts)
    l0 = [(r.kind, r.t0, r.t1) for r in iv[iv["learner"] == 0].itertuples()]
    assert ("down", 2.6, 2.8) in l0
    assert ("wait", 2.5, 2.6) in l0 and ("wait", 2.8, 3.0) in l0
    use = utilisation(iv)
    assert np.allclose(use.drop(columns="learner").sum(axis=1), 1.0)


def test_the_figure_never_replaces_a_file_of_the_run(tiny, tmp_path, capsys):
    from asyncsim.runs import scenario_toml

    path = tmp_path / "s.toml"
    path.write_text(scenario_toml(tiny(run={"updates": 10})))
    out = tmp_path / "run"
    assert main(["trace", str(path), "--out", str(out), "--quiet"]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    for figure in (out / "trace_meta.png", out / "sub" / "x.png", tmp_path / "x.csv"):
        assert main(["timeline", str(out), "--figure", str(figure)]) == 2
        err = capsys.readouterr().err.strip()
        assert "--figure" in err and len(err.splitlines()) == 1, err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert main(["timeline", str(out), "--figure", str(tmp_path / "elsewhere.png"),
                 "--quiet"]) == 0
    assert (tmp_path / "elsewhere.csv").exists()
    (out / "restarts.csv").write_text("garbage,here\n1,2\n")
    assert main(["timeline", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "restarts.csv" in err and len(err.splitlines()) == 1, err
