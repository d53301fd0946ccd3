"""The remedies study (scenarios/remedies.toml, analysis/remedies.py): its smoke profile
runs every remedy under both softsync protocols and hardsync, and the figure's table holds
what each point's resolved optimizer says it ran."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from figure_inputs import assert_refused

from asyncsim.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("remedies") / "remedies-smoke"
    assert main(["run", str(REPO / "scenarios" / "remedies.toml"), "--profile", "smoke",
                 "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize("damage", ["summary", "scenario", "provenance", "eval",
                                    "protocol.n"])
def test_a_wrong_typed_value_is_one_line_and_nothing_drawn(smoke, tmp_path, capsys, damage):
    assert_refused("remedies", smoke, damage, tmp_path, capsys)


def test_every_remedy_is_run_and_tabled(smoke):
    from analysis.remedies import REMEDIES

    tab = pd.read_csv(smoke / "figures" / "remedies_table.csv")
    soft = tab[tab["setup"] != "hardsync"]
    assert set(soft["setup"]) == {"30-softsync", "4-softsync"}
    assert set(tab["alpha0"]) == {0.001, 0.003}  # the one common grid
    # Every remedy at every rate of the grid under both protocols, read back from the
    # points' own scenario.toml (p1-no-momentum ran at 10 alpha0 and is tabled at alpha0).
    for (setup, alpha), g in soft.groupby(["setup", "alpha0"]):
        assert sorted(g["remedy"]) == sorted(REMEDIES), (setup, alpha)
    runs = pd.read_csv(smoke / "figures" / "remedies_runs.csv")
    nm = runs[runs["remedy"] == "p1-no-momentum"]
    assert (nm["lr"] == 10 * nm["alpha0"]).all()
    # A closed-form stability ratio exactly where one exists (not gap-aware, not Adam).
    for _, r in tab.iterrows():
        assert r["closed_form"] == (r["remedy"] not in ("gap-aware", "adam-p1")), r["remedy"]
        assert math.isfinite(r["stability_ratio"]) == bool(r["closed_form"]), r["remedy"]
    # The ratio scales with the rate: 3x alpha0, 3x the ratio (same sharpness, same tau).
    c = tab[(tab["setup"] == "30-softsync") & (tab["remedy"] == "constant")].set_index(
        "alpha0")["stability_ratio"]
    assert c[0.003] == pytest.approx(3 * c[0.001], rel=1e-6)
    # The gap to hardsync is the difference of the two means at the same alpha0.
    h = tab[tab["setup"] == "hardsync"].set_index("alpha0")["final_test_error_mean"]
    for _, r in soft.iterrows():
        assert r["vs_hardsync"] == pytest.approx(r["final_test_error_mean"] - h[r["alpha0"]])


def test_remedy_of_reads_the_optimizer():
    from analysis.remedies import remedy_of

    soft = {"protocol": {"kind": "softsync", "n": 4}}
    hb = {"kind": "heavy-ball", "beta": 0.9}
    assert remedy_of({"protocol": {"kind": "hardsync"}}) == "hardsync"
    assert remedy_of({**soft, "optimizer": {"momentum": hb}}) == "constant"
    assert remedy_of({**soft, "optimizer": {"lr_rule": "inverse-staleness",
                                            "momentum": {"kind": "shifted"}}}) == "p1-shifted"
    assert remedy_of({**soft, "optimizer": {"lr_rule": {"name": "polynomial", "a": 0.5},
                                            "momentum": hb}}) == "polynomial"
    assert remedy_of({**soft, "optimizer": {"compensation": {"kind": "gap-aware"},
                                            "momentum": hb}}) == "gap-aware"
    assert remedy_of({**soft, "optimizer": {"transform": {"name": "adam"},
                                            "lr_rule": "inverse-staleness"}}) == "adam-p1"


def test_the_caption_says_what_regenerates_it(smoke):
    from analysis._common import describe_runs

    text = describe_runs(smoke)
    assert "synthetic-cifar (240 train / 100 test)" in text and "38 runs" in text
    assert "regenerate: asyncsim run" in text and "--profile smoke" in text
