"""P2-F4: minima selection — sharpness of the point training settles in vs delay τ (P2).

Reads the sweep of ``scenarios/p2_f4.toml`` (run folders only; nothing is re-simulated or
recomputed): each run measured the top Hessian eigenvalue λ_max of the mean training loss of
its final parameters on the first ``measure.sharpness_samples`` training images (the whole
full-batch training set by default; :mod:`asyncsim.stability.measure`): P2's HVP power
iteration (tol 1e-6, ≤ 100 iterations; ``summary.json`` ``final_sharpness``, column
``sharpness``) and, as a check on slow power-iteration convergence when the top eigenvalues
are close, 40-step Lanczos (``sharpness_lanczos``). Plotted against τ + 1 with the
linear-stability bounds: ``2 sin(π/(4τ+2))/η0`` at constant η0 and ``2/η0`` (the synchronous
edge) with the η_τ = η0 sin(π/(4τ+2)) rule (the rate in effect, ``lr_at_tau``, as each run
recorded it).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from asyncsim import _checks
from asyncsim.config import rule_label
from asyncsim.stability.closed_form import edge as closed_edge

from ._common import finished_points, save

NAME = "p2_f4"
RULES = {"constant": ("η = η0 (constant)", "C0", "o"),
         "stability-edge": ("η_τ = η0 sin(π/(4τ+2))", "C1", "D")}


def _nan(x) -> float:
    return math.nan if x is None else float(x)


def points(sweep_dir: Path) -> pd.DataFrame:
    """One row per complete point: tau, lr_rule, eta0, eta (the rate at delay τ), updates,
    final train loss / test error, diverged, sharpness (power, P2) and sharpness_lanczos (NaN
    if diverged), bound = 2 sin(π/(4τ+2))/eta, sync_bound = 2/eta0, eta_lambda = eta·λ_max,
    edge = 2 sin(π/(4τ+2)), folder."""
    rows = []
    for run in finished_points(sweep_dir):
        summary, scn = run.summary, run.recorded
        tau = run.value("protocol.tau", None, lambda k, v: _checks.integer(k, v, low=0))
        eta0 = scn["optimizer"]["lr"]
        eta = run.summary_value("lr_at_tau")
        sh = _nan(summary.get("final_sharpness"))
        e = float(closed_edge(tau))
        rows.append({"tau": tau, "lr_rule": rule_label(scn["optimizer"]["lr_rule"]),
                     "eta0": eta0, "eta": eta,
                     "updates": summary.get("updates"), "seed": scn["seed"],
                     "final_train_loss": summary.get("final_train_loss"),
                     "final_test_error": summary.get("final_test_error"),
                     "diverged": bool(summary.get("diverged", False)),
                     "diverged_at": summary.get("diverged_at"),
                     "sharpness": sh,
                     "sharpness_lanczos": _nan(summary.get("final_sharpness_lanczos")),
                     "bound": e / eta, "sync_bound": 2 / eta0,
                     "eta_lambda": eta * sh, "edge": e, "folder": str(run.path)})
    return pd.DataFrame(rows).sort_values(["lr_rule", "tau"]).reset_index(drop=True)


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    df = points(sweep_dir)
    eta0 = float(df["eta0"].iloc[0])
    fig, ax = plt.subplots(figsize=(5.8, 4.2), dpi=100)
    t = np.arange(0, int(df["tau"].max()) + 1)
    ax.plot(t + 1, 2 * np.sin(np.pi / (4 * t + 2)) / eta0, "--", color="C0", lw=1,
            label="bound at η0: 2 sin(π/(4τ+2))/η0")
    ax.plot(t + 1, np.full(t.shape, 2 / eta0), "--", color="C1", lw=1,
            label="bound with η_τ: 2/η0 (synchronous edge)")
    for rule, (label, color, marker) in RULES.items():
        g = df[df["lr_rule"] == rule]
        if g.empty:
            continue
        ok = g[~g["diverged"]]
        ax.plot(ok["tau"] + 1, ok["sharpness"], marker + "-", color=color, mfc="none",
                label=f"λ_max reached, {label}")
        bad = g[g["diverged"]]
        if not bad.empty:
            ax.plot(bad["tau"] + 1, bad["bound"], "x", color=color, ms=9, mew=2,
                    label=f"diverged ({label}), drawn at its bound")
    ax.set(xscale="log", yscale="log", xlabel="τ + 1 (workers, round robin)",
           ylabel="λ_max of the final parameters")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(f"P2-F4 minima selection (tanh MLP, MSE, full batch, η0 = {eta0:g})",
                 fontsize=9)
    fig.tight_layout()
    return save(fig, df.drop(columns=["folder"]) if "folder" in df else df, out_dir, NAME,
                sources=(sweep_dir,))
