"""``asyncsim calibrate`` of the cluster: the PS's shared interface and the learners'
availability, fitted from a trace where it supports them, refused with a reason where not."""

from __future__ import annotations

import numpy as np
import pytest

from asyncsim.calibrate import MIN_DOWN_PERIODS, calibrate, fit_cluster, shared_link_fit
from asyncsim.cli import main
from asyncsim.drivers.build import simulation_for
from asyncsim.scenario import load_scenario
from asyncsim.trace import Trace
from tests.conftest import TINY

BASE = {**TINY, "seed": 3}


def test_the_line_through_transfer_times_by_hand():
    # One transfer alone ([0, 1]: n = 1) and two together ([2, 4] each: n = 2): durations
    # 1, 2, 2 against 1, 2, 2 transfers in progress: 1 s per transfer, no latency.
    f = shared_link_fit(np.array([0.0, 2.0, 2.0]), np.array([1.0, 4.0, 4.0]))
    assert f["per_transfer"] == pytest.approx(1.0, abs=1e-12)
    assert f["latency"] == pytest.approx(0.0, abs=1e-12)
    assert f["se"] == pytest.approx(0.0, abs=1e-12)
    # Overlapping by half: [0, 2] and [1, 3] each average 1.5 in progress -- no spread,
    # so no slope can be fitted.
    f = shared_link_fit(np.array([0.0, 1.0]), np.array([2.0, 3.0]))
    assert f["spread"] == 0.0 and not np.isfinite(f["se"])


def _trace(**cluster):
    scn = load_scenario({**BASE, "cluster": {"learners": 8, "compute": {
        "dist": "lognormal", "mean": 1.0, "cv": 0.3}, **cluster}})
    return scn, simulation_for(scn).run(max_updates=3000)


def test_a_fair_interface_and_exponential_availability_are_recovered():
    scn, trace = _trace(network={"push": {"bytes": 1000},
                                 "ps_ingress": {"bandwidth": 4000.0, "sharing": "fair"}},
                        availability={"up": {"dist": "exponential", "mean": 20.0},
                                      "down": {"dist": "exponential", "mean": 5.0}})
    fits, notes = fit_cluster(trace, None, push_bytes=1000, pull_bytes=1000)
    # Lost pushes keep crossing the interface but are not in the trace: a few % high.
    assert fits["ps_ingress"]["bandwidth"] == pytest.approx(4000.0, rel=0.1)
    assert fits["push"]["bytes"] == 1000
    assert fits["push"]["latency"]["value"] == pytest.approx(0.0, abs=0.05)
    up, down = fits["availability"]["up"], fits["availability"]["down"]
    n_down = trace.num_down
    # Means of about 280 exponential draws each: within 4 standard errors.
    assert up["mean"] == pytest.approx(20.0, rel=4 / np.sqrt(n_down))
    assert down["mean"] == pytest.approx(5.0, rel=4 / np.sqrt(n_down))
    assert "ps_egress" not in fits
    assert any(n.startswith("ps_egress: not fitted: a simulated trace") for n in notes)


def test_periods_cut_by_the_run_s_end_count_as_censored():
    # A run of 300 time units with up periods of mean 100: most up periods are cut by the
    # end. Averaging only the completed ones gave about 72; the censored maximum-likelihood
    # mean is the time up over the up periods that ended.
    scn = load_scenario({**BASE, "cluster": {"learners": 200, "availability": {
        "up": {"dist": "exponential", "mean": 100.0},
        "down": {"dist": "exponential", "mean": 10.0}}}})
    trace = simulation_for(scn).run(max_time=300.0)
    fits, _ = fit_cluster(trace, None, push_bytes=None, pull_bytes=None)
    n = trace.num_down  # about 200 x 300 / 110 = 545: a standard error of ~4.3%
    assert fits["availability"]["up"]["mean"] == pytest.approx(100.0, rel=4 / np.sqrt(n))
    assert fits["availability"]["down"]["mean"] == pytest.approx(10.0, rel=4 / np.sqrt(n))


def test_a_cluster_without_them_is_refused_with_reasons():
    _, trace = _trace()  # private links that cost nothing, always up
    fits, notes = fit_cluster(trace, None, push_bytes=1000, pull_bytes=1000)
    assert fits == {}
    assert any(n.startswith("ps_ingress: not fitted") for n in notes)
    assert (f"availability: not fitted: 0 completed down periods (needs "
            f"{MIN_DOWN_PERIODS})") in notes
    # Private links with random latency: transfer times do not grow with the number in
    # progress, so no interface is invented.
    _, trace = _trace(network={"push": {"latency": {"dist": "exponential", "mean": 0.3}}})
    fits, notes = fit_cluster(trace, None, push_bytes=1000, pull_bytes=1000)
    assert "ps_ingress" not in fits
    assert any("do not take longer with more in progress" in n for n in notes)


def test_calibrate_writes_the_fits_into_a_scenario_that_simulates_them(tmp_path, capsys):
    raw = {**BASE, "name": "churny", "cluster": {
        "learners": 6, "compute": {"dist": "exponential", "mean": 1.0},
        "network": {"push": {"bytes": 500}, "ps_ingress": {"bandwidth": 1500.0}},
        "availability": {"up": {"dist": "exponential", "mean": 15.0},
                         "down": {"dist": "exponential", "mean": 5.0}}},
        "run": {"updates": 2000}}
    (tmp_path / "s.toml").write_text(_toml(raw))
    assert main(["trace", str(tmp_path / "s.toml"), "--out", str(tmp_path / "a"),
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "ps_ingress: fitted fair sharing" in out and "availability: fitted" in out
    scn = load_scenario(tmp_path / "a" / "calibrated.toml")
    assert scn.cluster.network.ps_ingress.bandwidth == pytest.approx(1500.0, rel=0.15)
    assert scn.cluster.availability.down["mean"] == pytest.approx(5.0, rel=0.3)
    # The calibrated cluster loses gradients at about the rate the source did.
    src = Trace.load(tmp_path / "a")
    sim = simulation_for(scn).run(max_updates=2000)
    assert sim.down_stats()["up_fraction"] == pytest.approx(src.down_stats()["up_fraction"],
                                                            abs=0.05)
    notes: list[str] = []
    calibrate(tmp_path / "a", out=tmp_path / "b.toml", kind="parametric", notes=notes)
    assert len(notes) == 3  # ingress, egress, availability: each fitted or refused


def _toml(d) -> str:
    from asyncsim.runs import dump_toml

    return dump_toml(d)
