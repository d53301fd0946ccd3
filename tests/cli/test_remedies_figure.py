"""The remedies study (scenarios/remedies.toml, analysis/remedies.py): its smoke profile
runs every remedy on two rates of its grid, two of them under churn, and hardsync; the
figure's table holds each remedy at its best rate with the statistics it claims, read back
from the points' own files and recomputed here; the paired comparison is checked by hand."""

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


COLUMNS = ["setup", "remedy", "best_lr", "seeds", "test_error_mean", "test_error_ci95",
           "train_error_mean", "time_to_target_mean"]


def test_every_remedy_is_tabled_at_the_best_rate_of_its_grid(smoke):
    from analysis.remedies import REMEDIES

    tab = pd.read_csv(smoke / "figures" / "remedies_table.csv")
    grid = pd.read_csv(smoke / "figures" / "remedies_grid.csv")
    runs = pd.read_csv(smoke / "figures" / "remedies_runs.csv")
    assert list(tab.columns[:len(COLUMNS)]) == COLUMNS
    assert set(tab["setup"]) == {"hardsync", "30-softsync", "30-softsync, churn"}
    assert set(tab.loc[tab["setup"] == "30-softsync", "remedy"]) == set(REMEDIES)
    assert set(tab.loc[tab["setup"] == "30-softsync, churn", "remedy"]) == {"constant", "p1"}
    # Read back from the points' own scenario.toml: two rates per remedy and setting.
    assert (grid[grid["setup"] != "hardsync"].groupby(["setup", "remedy"]).size() == 2).all()
    for r in tab.itertuples():
        g = grid[(grid["setup"] == r.setup) & (grid["remedy"] == r.remedy)]
        assert r.best_lr == g.loc[g["test_error_mean"].idxmin(), "lr"]
        assert r.best_at_grid_end == (len(g) > 1)  # two rates: both are ends
        seeds = runs[(runs["setup"] == r.setup) & (runs["remedy"] == r.remedy)
                     & (runs["lr"] == r.best_lr)]
        assert r.seeds == len(seeds) == 2
        a, b = seeds["final_test_error"]
        # two seeds: the interval is t(0.975, 1) x |a - b| / 2
        assert r.test_error_mean == pytest.approx((a + b) / 2)
        assert r.test_error_ci95 == pytest.approx(12.706 * abs(a - b) / 2)
        assert r.train_error_mean == pytest.approx(seeds["final_train_error"].mean())
        reached = seeds.loc[~seeds["failed"], "time_to_target"].dropna()
        if len(reached):
            assert r.time_to_target_mean == pytest.approx(reached.mean())
        else:
            assert math.isnan(r.time_to_target_mean)
    # A closed-form stability ratio exactly where one exists (not gap-aware, not Adam).
    soft = runs[runs["setup"] != "hardsync"]
    for _, r in soft.iterrows():
        assert r["closed_form"] == (r["remedy"] not in ("gap-aware", "adam-p1")), r["remedy"]
        assert math.isfinite(r["stability_ratio"]) == bool(r["closed_form"]), r["remedy"]


def test_the_comparison_with_p1_is_paired_by_seed():
    # Hand-made runs: remedy "constant" on two rates, p1 on two, three seeds each.
    from analysis.remedies import grid_table, table

    errors = {("constant", 0.001): [0.50, 0.60, 0.70], ("constant", 0.01): [0.40, 0.45, 0.65],
              ("p1", 0.02): [0.30, 0.36, 0.60], ("p1", 0.2): [0.90, 0.90, 0.90]}
    rows = [{"setup": "4-softsync", "remedy": rem, "lr": lr, "seed": s,
             "final_test_error": e, "final_train_error": e / 10, "failed": e > 0.85,
             "time_to_target": math.nan if e > 0.85 else 100.0 * (s + 1)}
            for (rem, lr), errs in errors.items() for s, e in enumerate(errs)]
    runs = pd.DataFrame(rows)
    tab = table(runs, grid_table(runs)).set_index("remedy")
    assert tab.loc["constant", "best_lr"] == 0.01 and tab.loc["p1", "best_lr"] == 0.02
    assert tab.loc["p1", "failed"] == 0 and tab.loc["p1", "time_to_target_mean"] == 200.0
    # Differences per seed: 0.10, 0.09, 0.05 -> mean 0.08, sd 0.0264575, t(0.975, 2) 4.303.
    d = [0.10, 0.09, 0.05]
    assert tab.loc["constant", "vs_p1_mean"] == pytest.approx(0.08)
    half = 4.303 * pd.Series(d).std() / math.sqrt(3)
    assert tab.loc["constant", "vs_p1_ci95"] == pytest.approx(half)
    assert bool(tab.loc["constant", "vs_p1_significant"]) == (0.08 > half)
    # Unpaired, the seeds' own spread (sd 0.13 for constant) would hide the difference.
    assert 4.303 * pd.Series(errors[("constant", 0.01)]).std() / math.sqrt(3) > 0.08
    assert math.isnan(tab.loc["p1", "vs_p1_mean"])


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
    assert "synthetic-cifar (240 train / 100 test)" in text and "46 runs" in text
    assert "regenerate: asyncsim run" in text and "--profile smoke" in text


def test_the_default_study_tunes_every_remedy_on_four_rates_a_setting():
    """The tuning budget is the same for every remedy: in each setting four rates half a
    decade apart, five seeds each (the study's figures are drawn from this profile)."""
    from analysis.remedies import REMEDIES, remedy_of
    from asyncsim.config import to_dict
    from asyncsim.scenario import load_scenario, point_scenarios

    grids: dict[tuple[str, str], dict[float, set[int]]] = {}
    for _, _, scn in point_scenarios(load_scenario(REPO / "scenarios" / "remedies.toml")):
        d = to_dict(scn)
        setting = (f"{scn.protocol.kind}-{scn.protocol.options.get('n', '')}"
                   f"{'-churn' if d['cluster'].get('availability') else ''}")
        rates = grids.setdefault((setting, remedy_of(d)), {})
        rates.setdefault(scn.optimizer.lr, set()).add(scn.seed)
    settings = {s for s, _ in grids}
    assert settings == {"hardsync-", "softsync-4", "softsync-30", "softsync-30-churn"}
    for s in settings - {"hardsync-"}:
        assert {r for t, r in grids if t == s} == set(REMEDIES)
    for key, rates in grids.items():
        lrs = sorted(rates)
        assert len(lrs) == 4, key
        assert all(3.0 < b / a < 3.3 for a, b in zip(lrs[:-1], lrs[1:], strict=True)), (key, lrs)
        assert all(seeds == {0, 1, 2, 3, 4} for seeds in rates.values()), key
