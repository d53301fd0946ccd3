"""Smoke-profile tests of the P2-F4 and P2-F2 figure scenarios: each runs its sweep end to
end (P2-F4: a tiny full-batch tanh MLP with MSE; P2-F2: quadratic traces plus P2-F4's runs
as network points and replayed sharpness trajectories), draws its figure under pytest's
tmp_path and redraws it from the run folders only. Outputs never go to figures/.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from figure_inputs import assert_refused

from asyncsim.cli import main
from asyncsim.figures import draw_figure

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    runs = tmp_path_factory.mktemp("p2") / "runs"
    for name in ("p2_f4", "p2_f2"):  # P2-F2 reads P2-F4's sweep (its network points)
        rc = main(["run", str(REPO / "scenarios" / f"{name}.toml"), "--profile", "smoke",
                   "--out", str(runs / f"{name}-smoke"), "--quiet"])
        assert rc == 0
    return runs


@pytest.mark.parametrize("damage", ["summary", "scenario", "provenance", "protocol.tau"])
def test_p2_f4_refuses_a_wrong_typed_value(smoke_runs, tmp_path, capsys, damage):
    assert_refused("p2_f4", smoke_runs / "p2_f4-smoke", damage, tmp_path, capsys)


@pytest.mark.parametrize("damage", ["summary", "scenario", "provenance", "edges"])
def test_p2_f2_refuses_a_wrong_typed_value(smoke_runs, tmp_path, capsys, damage):
    assert_refused("p2_f2", smoke_runs / "p2_f2-smoke", damage, tmp_path, capsys,
                   also={"p2_f4-smoke": smoke_runs / "p2_f4-smoke"})


def test_p2_f4_smoke(smoke_runs, tmp_path):
    out = smoke_runs / "p2_f4-smoke"
    index = pd.read_csv(out / "index.csv")
    assert len(index) == 4 and (index["status"] == "complete").all()
    # budget: updates scale as 1/sin(pi/(4 tau + 2)) for both rules
    assert dict(zip(index["protocol.tau"], index["updates"], strict=False)) == {0: 20, 2: 65}
    data = pd.read_csv(out / "figures" / "p2_f4.csv")
    assert set(data["lr_rule"]) == {"constant", "stability-edge"}
    ok = data[~data["diverged"]]
    assert (ok["sharpness"] > 0).all()
    assert (abs(ok["sharpness"] / ok["sharpness_lanczos"] - 1) < 0.05).all()
    edge = data.loc[data["lr_rule"] == "stability-edge"]
    for _, r in edge.iterrows():
        assert math.isclose(r["eta"], r["eta0"] * math.sin(math.pi / (4 * r["tau"] + 2)))
        assert math.isclose(r["bound"], 2 / r["eta0"])
    # The plotted sharpness is what each run measured and stored.
    for _, r in data.iterrows():
        point = index[(index["protocol.tau"] == r["tau"])
                      & (index["optimizer.lr_rule"] == r["lr_rule"])]["point"].iloc[0]
        s = json.loads((out / point / "summary.json").read_text())
        assert r["eta"] == s["lr_at_tau"] and r["diverged"] == s["diverged"]
        if not r["diverged"]:
            assert r["sharpness"] == s["final_sharpness"]
    again = draw_figure("p2_f4", out, tmp_path / "redraw")
    pd.testing.assert_frame_equal(pd.read_csv(again[1]), data)


def test_p2_f2_smoke_has_network_points_and_trajectories(smoke_runs):
    out = smoke_runs / "p2_f2-smoke"
    figs = out / "figures"
    assert (figs / "p2_f2.png").exists()
    data = pd.read_csv(figs / "p2_f2.csv")
    quad = data[data["source"] == "quadratic"]
    rr = quad[quad["schedule"] == "round-robin"]
    assert (abs(rr["rel_error"]) < 1e-2).all()
    net = data[data["source"].str.startswith("mlp final")]
    assert len(net) >= 2 and (net["measured"] > 0).all()
    traj = pd.read_csv(figs / "p2_f2_trajectories.csv")
    assert set(zip(traj["tau"], traj["lr_rule"], strict=True)) == {
        (0, "constant"), (2, "stability-edge")}
    assert (traj.groupby("tau")["update"].max() == pd.Series({0: 20, 2: 65})).all()
    assert traj["sharpness"].notna().all()
    # ... as the P2-F4 runs measured them along the way (their sharpness.csv)
    f4 = smoke_runs / "p2_f4-smoke"
    index = pd.read_csv(f4 / "index.csv")
    for (tau, rule), g in traj.groupby(["tau", "lr_rule"]):
        point = index[(index["protocol.tau"] == tau)
                      & (index["optimizer.lr_rule"] == rule)]["point"].iloc[0]
        stored = pd.read_csv(f4 / point / "sharpness.csv")
        assert g["sharpness"].tolist() == stored["sharpness"].tolist()
        assert g["update"].tolist() == stored["update"].tolist()
