"""Measured stability edges (asyncsim.stability.measured) against P2's closed forms
(asyncsim.stability.closed_form).

The edges are measured by the real simulator: fixed-delay timing from the protocol code, the
shared update core executed by replay's compiled-chunk executor, a one-dimensional
quadratic. Table-driven (as optax tests its optimizers): every momentum kind × τ against
:func:`asyncsim.stability.edge` within 1%.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from asyncsim.api import simulate
from asyncsim.cli import main
from asyncsim.drivers.driver import Observer
from asyncsim.drivers.replay import replay
from asyncsim.drivers.scan import replay_scan
from asyncsim.stability import edge
from asyncsim.stability.measure import sharpness_trajectory
from asyncsim.stability.measured import (
    find_edge,
    find_edges,
    growth,
    quadratic_scenario,
    stable_mask,
)

TAUS = [0, 1, 2, 4, 8, 16, 32]
KINDS = [("none", 0.0), ("heavy-ball", 0.9), ("dampened", 0.9), ("shifted", 0.9),
         ("nesterov", 0.9), ("heavy-ball", 0.5), ("dampened", 0.5), ("shifted", 0.5),
         ("nesterov", 0.5)]


# Nesterov's edge is found numerically on the unit circle (stability.closed_form); the
# simulation of the core's Nesterov update checks it like the others.
@pytest.mark.parametrize(("kind", "beta"), KINDS[:5])
def test_measured_edge_matches_closed_form(kind, beta):
    """Default suite: τ ∈ {0, 1, 4, 16} for each kind at β = 0.9, one vmapped program each."""
    taus = [0, 1, 4, 16]
    measured = find_edges(taus, kind, beta)
    closed = np.asarray([edge(t, kind, beta) for t in taus])
    np.testing.assert_allclose(measured, closed, rtol=0.01)
    # The measurement is the last stable point of a 1e-3 bracket below the true edge.
    assert np.all(measured <= closed * (1 + 1e-4))


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "beta"), KINDS)
def test_measured_edge_full_table(kind, beta):
    measured = find_edges(TAUS, kind, beta)
    closed = np.asarray([edge(t, kind, beta) for t in TAUS])
    np.testing.assert_allclose(measured, closed, rtol=0.01)


def test_find_edge_scalar_and_eigenvalue_scaling():
    """The edge is in η·λ units: a stiffer quadratic gives the same x (P2's ηλ_max)."""
    a = find_edge(2)
    b = find_edge(2, eigenvalue=5.0)
    assert a == pytest.approx(edge(2), rel=2e-3)
    assert b == pytest.approx(edge(2), rel=2e-3)


def test_replay_converges_below_and_diverges_above_edge():
    """Through the Python-loop replay (the real replay path), not the scan executor.

    τ = 1 (edge 1): ρ(0.99) = 0.995 and ρ(1.01) = 1.005, so 2000 updates separate the two
    runs by about e^20 while keeping the Python loop short.
    """
    tau = 1
    e = edge(tau)
    scn = quadratic_scenario(tau, steps=2000)
    trace = simulate(scn)
    below = replay(scn, trace, hyper={"lr": 0.99 * e})
    above = replay(scn, trace, hyper={"lr": 1.01 * e})
    w_below = float(np.abs(np.asarray(below.params["w"])).max())
    w_above = float(np.abs(np.asarray(above.params["w"])).max())
    assert w_below < 1e-2  # started at |w| = 1
    assert not np.isfinite(w_above) or w_above > 1e2


def _windows_by_loop(scn, trace, lr):
    """Windows A and B (the edge test) computed from the loop replay's parameters after
    every update: the exact reference of the compiled executor's running maxima."""
    norms = {}
    res = replay(scn, trace, hyper={"lr": lr}, monitor=Observer(
        lambda v, st: norms.__setitem__(v, float(np.sum(np.square(
            np.asarray(st.params["w"], np.float64)))))))
    assert not res.summary["diverged"]
    m = trace.num_updates
    sq = np.asarray([norms[v + 1] for v in range(m)])  # after update v
    v = np.arange(m)
    return sq[(v >= m // 4) & (v < m // 2)].max(), sq[v >= (3 * m) // 4].max()


@pytest.mark.parametrize(("kind", "schedule", "noise"), [
    ("none", "round-robin", 0.0),
    ("shifted", "random", 0.5),
    ("heavy-ball", "normal", 0.0),
])
def test_the_edge_executor_is_replays_compiled_executor(kind, schedule, noise):
    """The measured edge runs on replay's compiled-chunk executor: its final parameters equal
    the loop replay's, and its growth windows equal the running maxima of the loop
    replay's parameter norms."""
    beta = 0.0 if kind == "none" else 0.9
    scn = quadratic_scenario(3, kind, beta, schedule=schedule, noise=noise, steps=80,
                             eigenvalue=2.0, lr=0.05, batch_size=4)
    trace = simulate(scn)
    ref = replay(scn, trace, hyper={"lr": 0.02}).params
    got = replay_scan(scn, trace, hyper={"lr": 0.02}).params
    np.testing.assert_allclose(np.asarray(got["w"]), np.asarray(ref["w"]), rtol=1e-5, atol=1e-7)
    wa, wb = growth([trace], scn, np.asarray([[0.02, 0.005]]))
    for k, lr in enumerate((0.02, 0.005)):
        a, b = _windows_by_loop(scn, trace, lr)
        assert wa[0, k] == pytest.approx(a, rel=1e-5) and wb[0, k] == pytest.approx(b, rel=1e-5)


def test_vmapped_lane_equals_single_run():
    """Lane (trace j, rate k) of one program over rates × traces equals that trace under
    that rate alone (shifted momentum sized for the most workers, here 5)."""
    scns = [quadratic_scenario(t, "shifted", 0.5, steps=300) for t in (1, 4)]
    traces = [simulate(s) for s in scns]
    lrs = np.asarray([0.05, 0.2, 0.31, 0.6], np.float32)
    wa, wb = growth(traces, scns[1], np.tile(lrs, (2, 1)))
    for j, (s, tr) in enumerate(zip(scns, traces, strict=True)):
        for k, lr in enumerate(lrs):
            a1, b1 = growth([tr], s, np.asarray([[lr]]))
            assert wa[j, k] == pytest.approx(float(a1[0, 0]), rel=1e-6)
            assert wb[j, k] == pytest.approx(float(b1[0, 0]), rel=1e-6)


def test_stable_mask():
    a = np.array([1.0, 1.0, 1.0, np.inf, 1.0, 0.0])
    b = np.array([0.5, 1.5, 0.0, np.inf, np.nan, 0.0])
    assert stable_mask(a, b).tolist() == [True, False, True, False, False, True]
    # Noisy runs tolerate a stationary noise floor (|w|² within a factor 2).
    assert stable_mask(np.array([1.0]), np.array([1.5]), noise=True).tolist() == [True]


def test_random_schedule_is_far_more_stable():
    """docs/papers.md: uniform random worker per step at N = 32 has edge ≈ 0.33 vs 0.050."""
    rr = find_edge(31, rel_tol=1e-2)
    rnd = find_edge(31, schedule="random", rel_tol=1e-2)
    assert rr == pytest.approx(edge(31), rel=0.011)
    assert 0.28 < rnd < 0.38


def test_sharpness_trajectory_logs_every_k():
    scn = quadratic_scenario(2, steps=40, eigenvalue=3.0, lr=0.1)
    df = sharpness_trajectory(scn, every=10, samples=8)
    assert df["update"].tolist() == [0, 10, 20, 30, 40]
    np.testing.assert_allclose(df["sharpness"], 3.0, rtol=1e-5)  # the quadratic's λ
    assert df["bound"].iloc[0] == pytest.approx(edge(2) / 0.1)
    assert df["sync_bound"].iloc[0] == pytest.approx(2 / 0.1)


def test_cli_stability_measure(capsys):
    assert main(["stability", "--tau", "0", "1", "4", "--momentum", "none", "--measure"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    legend = next(i for i, line in enumerate(lines) if line.startswith("closed_form: "))
    header, *rows = lines[:legend]
    assert "asymptote: the large-tau form" in " ".join(lines[legend:])  # the columns, said
    cols = header.split()
    assert len(rows) == 3
    for tau, line in zip((0, 1, 4), rows, strict=True):
        row = dict(zip(cols, line.split(), strict=True))
        assert int(row["tau"]) == tau and float(row["closed_form"]) == pytest.approx(
            edge(tau), rel=1e-5)
        # the measured edge: the last stable point of a 1e-3 bracket just below the edge
        assert -1e-3 < float(row["rel_error"]) <= 0.0
        assert float(row["measured"]) == pytest.approx(edge(tau), rel=1e-3)


def test_cli_stability_figure(tmp_path):
    png = tmp_path / "edges.png"
    assert main(["stability", "--tau", "0", "1", "2", "--momentum", "none", "shifted",
                 "--figure", str(png)]) == 0
    assert plt.imread(png).shape[:2] == (440, 605)  # 5.5 x 4 inches at 110 dpi


@pytest.mark.parametrize(("kind", "tau"), [("heavy-ball", 1), ("heavy-ball", 4), ("shifted", 4)])
def test_torch_style_with_dampening_has_the_dampened_edge(kind, tau):
    """PyTorch's SGD (style torch: rate outside the buffer, first step copied) with dampening
    d = 0.5 is stable up to the undampened edge / (1 - d): the first-step copy is a transient
    and moves no root (stability.closed_form)."""
    import dataclasses

    from asyncsim.stability.measured import edges_of_traces

    scn = quadratic_scenario(tau, kind, 0.9)
    mom = dataclasses.replace(scn.optimizer.momentum, style="torch", dampening=0.5)
    scn = dataclasses.replace(scn, optimizer=dataclasses.replace(scn.optimizer, momentum=mom))
    measured = float(edges_of_traces(scn, [simulate(scn)])[0])
    assert measured == pytest.approx(edge(tau, kind, 0.9, dampening=0.5), rel=2e-3)
    assert measured > 1.9 * edge(tau, kind, 0.9)  # not the undampened edge


@pytest.mark.parametrize(("protocol", "learners", "kind", "beta", "tau"), [
    ({"kind": "fixed-delay", "tau": 4}, 5, "none", 0.0, 4),
    ({"kind": "fixed-delay", "tau": 4}, 5, "heavy-ball", 0.9, 4),
    # hardsync: every update averages the 3 learners' gradients of one version (c = 3):
    # plain gradient descent, the edge of tau = 0.
    ({"kind": "hardsync"}, 3, "none", 0.0, 0),
])
def test_the_edge_of_a_runs_own_trace_is_the_closed_form_where_its_delay_is_constant(
        tmp_path, protocol, learners, kind, beta, tau):
    """run_edges drives the quadratic with a recorded run's trace: a constant delay's trace
    has exactly P2's edge (one gradient per update, and c = 3 gradients per update)."""
    from asyncsim._io import dump_toml
    from asyncsim.results import open_run
    from asyncsim.stability.measured import default_steps, run_edges

    path = tmp_path / "s.toml"
    path.write_text(dump_toml({"protocol": protocol, "cluster": {"learners": learners},
                               "run": {"updates": default_steps(tau)}}))
    assert main(["trace", str(path), "--out", str(tmp_path / "t"), "--quiet"]) == 0
    run = open_run(tmp_path / "t")
    row = run_edges(run.scenario, run.trace, [kind], [beta]).iloc[0]
    # The first updates of a fixed delay see less (nothing older exists yet).
    assert row["staleness_max"] == tau and round(row["staleness_mean"]) == tau
    assert row["measured"] == pytest.approx(edge(tau, kind, beta), rel=2e-3)
    assert row["closed_form_at_mean"] == row["closed_form_at_max"] == pytest.approx(
        float(edge(tau, kind, beta)))


def test_cli_stability_as_rates_and_on_a_runs_trace(tmp_path, capsys):
    from asyncsim._io import dump_toml

    path = tmp_path / "s.toml"
    path.write_text(dump_toml({"cluster": {"learners": 6, "compute": {
        "dist": "lognormal", "mean": 1.0, "cv": 0.5}}, "protocol": {"kind": "async"},
        "run": {"updates": 600}}))
    assert main(["trace", str(path), "--out", str(tmp_path / "t"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["stability", "--tau", "4", "--momentum", "none", "--sharpness", "10",
                 "--trace", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out.splitlines()
    header = out[0].split()
    row = dict(zip(header, out[1].split(), strict=True))
    assert float(row["lr_edge"]) == pytest.approx(float(edge(4)) / 10, rel=1e-5)
    i = next(i for i, line in enumerate(out) if line.startswith(str(tmp_path / "t")))
    head = next(j for j in range(i, len(out)) if out[j].split()[:1] == ["momentum"])
    row = dict(zip(out[head].split(), out[head + 1].split(), strict=True))
    assert float(row["lr_edge"]) == pytest.approx(float(row["measured"]) / 10, rel=1e-4)
    from asyncsim.results import open_run

    most = open_run(tmp_path / "t").trace.max_staleness
    assert float(row["closed_form_at_max"]) == pytest.approx(float(edge(most)), rel=1e-4)
    for bad in ("0", "-1", "nan"):
        assert main(["stability", "--sharpness", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--sharpness: must be a positive finite number" in err


@pytest.mark.parametrize(("table", "why"), [
    ({"run": {"updates": 30}}, "it has 30 updates, and measuring the edge of its staleness"),
    # Hardsync rounds under churn take 1..3 gradients: no constant c for the program.
    ({"protocol": {"kind": "hardsync"}, "run": {"updates": 400},
      "cluster": {"learners": 3, "availability": {
          "up": {"dist": "exponential", "mean": 3.0},
          "down": {"dist": "exponential", "mean": 1.5}}}},
     "its updates take different numbers of gradients"),
])
def test_cli_stability_refuses_a_trace_it_cannot_measure_before_printing(
        tmp_path, capsys, table, why):
    from asyncsim._io import dump_toml

    path = tmp_path / "s.toml"
    path.write_text(dump_toml(table))
    assert main(["trace", str(path), "--out", str(tmp_path / "t"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["stability", "--tau", "1", "--trace", str(tmp_path / "t")]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # refused before the closed-form table
    assert err.startswith(f"asyncsim: error: asyncsim stability: --trace: {tmp_path / 't'}: "
                          f"{why}")


def test_cli_stability_names_an_edited_trace_as_the_reader_does(tmp_path, capsys):
    """A trace edited after the run (one learner id changed) is the reader's one line, not
    re-labelled as a trace the edge search cannot measure."""
    import pandas as pd

    from asyncsim._io import dump_toml

    path = tmp_path / "s.toml"
    path.write_text(dump_toml({"run": {"updates": 300}}))
    assert main(["trace", str(path), "--out", str(tmp_path / "t"), "--quiet"]) == 0
    grads = pd.read_parquet(tmp_path / "t" / "trace_grads.parquet")
    grads.loc[0, "learner"] = (grads.loc[0, "learner"] + 1) % grads["learner"].max()
    grads.to_parquet(tmp_path / "t" / "trace_grads.parquet", index=False)
    capsys.readouterr()
    assert main(["stability", "--tau", "1", "--trace", str(tmp_path / "t")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "does not match its recorded trace_hash" in err
    assert "--trace:" not in err and err.count("\n") == 1
