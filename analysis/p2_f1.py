"""P2-F1: generalization gap vs delay τ (Giladi et al. 2020) — test error, η0 vs η_τ.

Reads the sweep of ``scenarios/p2_f1.toml`` (index.csv and each point's summary.json and
eval.csv; nothing is re-simulated) and plots the final test error against τ for the
constant rate and for P2's rule ``η_τ = η0 sin(π/(4τ+2))``. Diverged runs are marked at
90% error (chance level for 10 classes).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from asyncsim._io import read_csv, read_json, read_toml

from ._common import finished_points, save

NAME = "p2_f1"
RULES = {"constant": "η = η0 (constant)", "stability-edge": "η_τ = η0 sin(π/(4τ+2))"}


def points(sweep_dir: Path) -> pd.DataFrame:
    rows = []
    for folder in finished_points(sweep_dir):
        s = read_json(folder / "summary.json")
        scn = read_toml(folder / "scenario.toml")
        tau = int(scn["protocol"]["tau"])
        opt = scn.get("optimizer", {})
        rule = opt.get("lr_rule", "constant")
        eta0 = float(opt.get("lr", 0.01))
        evals = read_csv(folder / "eval.csv") if (folder / "eval.csv").exists() else None
        best = float(evals["test_error"].min()) if evals is not None else math.nan
        rows.append({"tau": tau, "lr_rule": rule, "eta0": eta0,
                     "eta": float(s["lr_at_tau"]),  # the rate the run used at delay τ
                     "seed": scn.get("seed", 0),
                     "final_test_error": s.get("final_test_error"),
                     "best_test_error": best,
                     "final_train_loss": s.get("final_train_loss"),
                     "diverged": bool(s.get("diverged", False))})
    return pd.DataFrame(rows).sort_values(["lr_rule", "tau"]).reset_index(drop=True)


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    df = points(sweep_dir)
    fig, ax = plt.subplots(figsize=(5.5, 4), dpi=100)
    for rule, label in RULES.items():
        g = df[df["lr_rule"] == rule]
        if g.empty:
            continue
        err = g["final_test_error"].where(~g["diverged"], 0.9)
        (line,) = ax.plot(g["tau"] + 1, 100 * err, "o-", label=label)
        bad = g[g["diverged"]]
        if not bad.empty:
            ax.plot(bad["tau"] + 1, [90] * len(bad), "x", ms=10, color=line.get_color(),
                    label=f"diverged ({rule})")
    ax.set(xscale="log", xlabel="τ + 1", ylabel="final test error (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("P2-F1 test error vs delay (MLP, synthetic CIFAR)", fontsize=9)
    fig.tight_layout()
    return save(fig, df, out_dir, NAME, sources=(sweep_dir,))
