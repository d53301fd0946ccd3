"""Beyond P1: each run's outcome against (per-gradient rate x initial sharpness) / the delayed
heavy-ball edge, for alpha0 and alpha0/tau; and the start-up burst of alpha0/tau with and
without a warm-up. Reads run folders only.

x = a * lambda_max(theta_0) / edge(tau, "heavy-ball", beta) with a = alpha0 (constant rule) or
alpha0 / tau (inverse-staleness), tau = round(mean staleness of the run) and
edge(0) = 2 (1 + beta) for hardsync. lambda_max is the top Hessian eigenvalue of the training
loss (without weight decay) at the run's initial weights on the first
``measure.sharpness_samples`` training samples (power iteration), as each run measured it
(``[measure] initial_sharpness``: ``summary.json`` ``initial_sharpness``). Linear theory says
x < 1 is stable at the initial weights.

Outputs: ``NAME.png`` (left: final test error vs x, diverged runs drawn at 1.0 with x
markers; right: start-up, peak mini-batch loss over the first 2 lambda updates and final test
error vs alpha0 for alpha0/tau with warm-up 0 / lambda / 10 lambda updates), ``NAME.csv``
(one row per run with every plotted value).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from asyncsim.stability.closed_form import edge

from ._common import load_points, save

NAME = "p1_beyond"


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    points = load_points(Path(sweep_dir))
    rows = []
    for _, p in points.iterrows():
        scn, s, run = p["scenario"], p["summary"], p["run"]
        lam_max = run.summary_value("initial_sharpness")  # measured by the run ([measure])
        beta = scn["optimizer"]["momentum"]["beta"]
        kind = scn["optimizer"]["momentum"]["kind"]
        tau = (0 if p["protocol"] == "hardsync"
               else int(round(run.summary_value("staleness_mean"))))
        rate = run.summary_value("lr_at_mean_tau")  # the rule's rate at the mean staleness
        e = edge(tau, kind if kind != "none" else "none", beta if kind != "none" else 0.0)
        upd = run.updates
        lam = int(p["learners"])
        warm = int(p["warmup_updates"] or 0)
        label = ("hardsync" if p["protocol"] == "hardsync" else
                 f"{int(p['n'])}-softsync, " + ("α0/τ" if p["lr_rule"] == "inverse-staleness"
                                                else "α0")
                 + (f", warm-up {warm}" if warm else ""))
        rows.append({"run": label, "protocol": p["protocol"], "lr_rule": p["lr_rule"],
                     "alpha0": p["lr"], "warmup_updates": warm, "seed": p["seed"],
                     "tau": tau, "rate": rate, "sharpness0": lam_max, "edge": e,
                     "x": rate * lam_max / e,
                     "diverged": bool(s.get("diverged")),
                     "final_test_error": s.get("final_test_error"),
                     "startup_peak_loss": float(np.nanmax(upd["train_loss"].iloc[:2 * lam]))
                     if len(upd) else float("nan")})
    df = pd.DataFrame(rows).sort_values(["run", "alpha0"]).reset_index(drop=True)
    df["plotted_error"] = np.where(df["diverged"], 1.0, df["final_test_error"])

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.3))
    base = df[df["warmup_updates"] == 0]
    for (run, d), m in zip(base.groupby("run"), ("o", "s", "^", "D"), strict=False):
        ok, bad = d[~d["diverged"]], d[d["diverged"]]
        line = a1.plot(ok["x"], ok["plotted_error"], m, label=run, alpha=0.8)[0]
        a1.plot(bad["x"], bad["plotted_error"], "x", color=line.get_color(), ms=9)
    a1.axvline(1.0, color="k", ls=":", lw=1)
    a1.set_xscale("log")
    a1.set_xlabel("rate × λmax(θ0) / delayed heavy-ball edge  (x; diverged = ×)")
    a1.set_ylabel("final test error")
    a1.set_ylim(0, 1.05)
    a1.legend(fontsize=8)
    a1.set_title(f"outcome vs edge (λmax(θ0) = {df['sharpness0'].iloc[0]:.3g})", fontsize=10)
    inv = df[(df["lr_rule"] == "inverse-staleness") & (df["protocol"] != "hardsync")]
    for w, d in inv.groupby("warmup_updates"):
        d = d.sort_values("alpha0")
        lab = f"α0/τ, warm-up {w} updates" if w else "α0/τ, no warm-up"
        line = a2.plot(d["alpha0"], d["plotted_error"], "-o", label=lab)[0]
        a2.plot(d["alpha0"], np.minimum(d["startup_peak_loss"] / 10, 1.05), "--",
                color=line.get_color(), alpha=0.6)
    hs = df[df["protocol"] == "hardsync"].sort_values("alpha0")
    a2.plot(hs["alpha0"], hs["plotted_error"], "k-s", label="hardsync")
    a2.set_xscale("log")
    a2.set_xlabel("α0")
    a2.set_ylabel("final test error (solid); start-up peak loss / 10 (dashed)")
    a2.set_ylim(0, 1.05)
    a2.legend(fontsize=8)
    a2.set_title("start-up: first λ gradients all read version 0", fontsize=10)
    fig.tight_layout()
    return save(fig, df, out_dir, NAME, sources=(sweep_dir,))
