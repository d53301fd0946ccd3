"""The paper profiles' mechanics at paper model scale, on the built-in synthetic data.

The paper profiles need real CIFAR10 and 140-200 epochs, which CI cannot run. What it can
run is everything else they set: the paper's model and init (ResNet-44 with batch norm for
P2-F1; Caffe's init for P1), batch size, optimizer, epoch-based decay schedule and the
heaviest sweep point's cluster. Each test swaps only the data set for the synthetic one of
the same shape (32 x 32 x 3, 10 classes), runs 3 updates online and replays them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import asyncsim
from asyncsim.scenario import apply_point, read_raw, resolve_raw, sweep_points

REPO = Path(__file__).resolve().parents[2]


def paper_point(name: str) -> asyncsim.Scenario:
    """The paper profile of scenarios/NAME.toml at its sweep point with the most learners,
    with CIFAR10 swapped for synthetic-cifar and the run cut to 3 updates."""
    raw, _ = read_raw(REPO / "scenarios" / f"{name}.toml")
    raw = resolve_raw(raw, profile="paper")
    assert raw["data"]["name"] == "cifar10"
    raw["data"] = {"name": "synthetic-cifar", "batch_size": raw["data"]["batch_size"],
                   "n_train": 1024, "n_test": 128}
    raw["run"] = {"updates": 3, "eval_every": 3, "eval_samples": 128}
    # The run is cut to 3 updates: a point's own run length (P2-F1's regimes) goes too.
    raw["sweep"] = {axis: [{k: v for k, v in p.items() if k != "run.epochs"}
                           if isinstance(p, dict) else p for p in values]
                    for axis, values in raw.get("sweep", {}).items()}
    scn = asyncsim.load_scenario(raw)
    point = max(sweep_points(scn), key=lambda p: apply_point(scn, p).cluster.learners)
    return apply_point(scn, point)


def check_runs_and_replays(scn: asyncsim.Scenario) -> None:
    res = asyncsim.run(scn)
    s = res.summary
    assert s["updates"] == 3 and not s["diverged"]
    assert np.isfinite(s["final_train_loss"]) and 0.0 <= s["final_test_error"] <= 1.0
    again = asyncsim.replay(scn, res.trace)
    assert again.summary["param_hash"] == s["param_hash"]


@pytest.mark.parametrize("name", [
    pytest.param("p1_f2_speedup", marks=pytest.mark.slow),  # 30 x 3 gradients: ~16 s
    "p1_f3_lr_modulation", pytest.param("p1_tradeoff", marks=pytest.mark.slow),
    pytest.param("remedies", marks=pytest.mark.slow)])
def test_p1_paper_profile_mechanics(name):
    scn = paper_point(name)
    assert scn.model.name == "cifar10-full" and scn.model.options.get("init") == "caffe"
    assert scn.cluster.learners == 30 and scn.data.batch_size == 4
    check_runs_and_replays(scn)


@pytest.mark.slow
def test_p2_f1_paper_profile_mechanics():
    """ResNet-44 with batch norm at batch 128, the tau = 32 point (33 workers): ~40 s."""
    scn = paper_point("p2_f1")
    assert scn.model.name == "resnet44" and scn.model.options.get("norm") == "batch"
    assert scn.protocol.options["tau"] == 32 and scn.data.batch_size == 128
    assert scn.optimizer.momentum.style == "torch" and scn.optimizer.lr_staleness == "nominal"
    check_runs_and_replays(scn)
