"""The churn figure (scenarios/churn_staleness.toml, analysis/churn_staleness.py): staleness
vs learners when learners come and go, against Little's law."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from figure_inputs import assert_refused

from asyncsim.cli import main
from asyncsim.figures import draw_figure

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def churn_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("churn")
    assert main(["run", str(REPO / "scenarios" / "churn_staleness.toml"), "--profile",
                 "smoke", "--out", str(out / "runs"), "--quiet", "--no-figure"]) == 0
    return out / "runs"


@pytest.fixture(scope="module")
def drawn(churn_runs):
    draw_figure("churn_staleness", churn_runs, churn_runs.parent / "figures")
    return pd.read_csv(churn_runs.parent / "figures" / "churn_staleness.csv")


@pytest.mark.parametrize("damage", ["summary", "scenario", "provenance", "compute.mean"])
def test_a_wrong_typed_value_is_one_line_and_nothing_drawn(churn_runs, tmp_path, capsys,
                                                           damage):
    assert_refused("churn_staleness", churn_runs, damage, tmp_path, capsys)


def test_every_point_is_drawn(drawn):
    assert len(drawn) == 21
    assert sorted(drawn["learners"].unique()) == [1, 2, 4, 8, 16, 30, 64]
    assert drawn["availability"].nunique() == 3


def test_staleness_follows_littles_law_under_churn(drawn):
    # Mean staleness = (lambda - 1) x the others' applied gradients per compute time.
    big = drawn[drawn["learners"] >= 4]
    assert (big["staleness_mean"] / big["littles_law"]).between(0.95, 1.05).all()
    up = drawn[drawn["availability"] == "always up"]
    assert (up["staleness_mean"] - (up["learners"] - 1)).abs().max() < 0.02
    assert (up["lost_gradients"] == 0).all()
    # Down half the time: about half the staleness of always up at 64 learners.
    half = drawn[drawn["availability"].str.contains("50% down")].set_index("learners")
    assert half.loc[64, "staleness_mean"] / up.set_index("learners").loc[64, "staleness_mean"] \
        == pytest.approx(0.5, abs=0.05)
    assert half["up_fraction"].between(0.4, 0.6).all()


def test_each_up_period_loses_about_one_gradient(drawn):
    # Up periods of mean 10 compute times hold about 10 gradients, the last one lost.
    half = drawn[drawn["availability"].str.contains("50% down") & (drawn["learners"] >= 8)]
    assert half["lost_share"].between(0.06, 0.13).all()
    rare = drawn[drawn["availability"].str.contains("17% down") & (drawn["learners"] >= 8)]
    assert rare["lost_share"].between(0.01, 0.03).all()
