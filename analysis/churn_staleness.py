"""Staleness vs learners under churn (``scenarios/churn_staleness.toml``; reads run folders
only).

Left: the mean staleness of the applied gradients (after ``[figure] warmup_updates``) against
λ, one curve per availability level, with Little's-law estimate (λ − 1) · r · T beside each:
r = the measured applied gradients per learner per unit time, T = the mean compute time (a
gradient's staleness counts the other learners' gradients applied while it was computed).
Right: the share of pulled gradients a learner's going down lost. The CSV has one row per
point.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from asyncsim import _checks
from asyncsim.errors import ScenarioError
from asyncsim.timing.delays import make_delay

from ._common import save, trace_points

NAME = "churn_staleness"


def _mean(run, key: str) -> float:
    """The mean of the delay spec at ``key``: its delay model's (:func:`asyncsim.make_delay`,
    which checks the spec as a scenario's; an ``empirical`` one's samples read from the run
    folder), a positive number (RunFolder.value)."""
    def mean(key: str, spec) -> float:
        m = make_delay(spec, key=key, base_dir=run.path).mean
        if m is None:
            raise ScenarioError(key, "its delay model has no mean to estimate Little's law with")
        return _checks.positive(f"{key} (its mean)", m, finite=True)
    return run.value(key, None, mean)


def _level(run) -> str:
    """The availability setting of a point, as its legend names it."""
    up, down = _mean(run, "cluster.availability.up"), _mean(run, "cluster.availability.down")
    if run.recorded["cluster"]["availability"]["up"].get("dist") == "constant" and up >= 1e9:
        return "always up"
    share = down / (up + down)
    return f"up {up:g} / down {down:g} ({100 * share:.0f}% down)"


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    rows = []
    for run, s, trace, skip in trace_points(sweep_dir):
        lam = s["cluster"]["learners"]
        end = float(trace.meta["sim_time"])
        stats = trace.staleness_stats(skip=skip)
        down = trace.down_stats() if trace.num_down else {"lost_gradients": 0,
                                                            "up_fraction": 1.0}
        lost = int(down["lost_gradients"])
        rate = trace.num_gradients / (lam * end)  # applied per learner per unit time
        t_mean = _mean(run, "cluster.compute")
        rows.append({"availability": _level(run), "learners": lam,
                     "staleness_mean": stats["staleness_mean"],
                     "staleness_p99": stats["staleness_p99"],
                     "littles_law": (lam - 1) * rate * t_mean,
                     "up_fraction": float(down["up_fraction"]),
                     "gradients": trace.num_gradients, "lost_gradients": lost,
                     "lost_share": lost / (lost + trace.num_gradients),
                     "sim_time": end})
    df = pd.DataFrame(rows).sort_values(["availability", "learners"], kind="stable")
    levels = sorted(df["availability"].unique(), key=lambda x: (x != "always up", x))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    for level, marker in zip(levels, ("o", "s", "^", "D"), strict=False):
        d = df[df["availability"] == level]
        (line,) = ax.plot(d["learners"], d["staleness_mean"], marker=marker, label=level)
        ax.plot(d["learners"], d["littles_law"], ls=":", color=line.get_color())
        if level != "always up":
            bx.plot(d["learners"], 100 * d["lost_share"], marker=marker,
                    color=line.get_color(), label=level)
    ax.plot([], [], ls=":", color="0.4", label="(λ − 1) · r · T (Little's law)")
    ax.set_xlabel("learners λ")
    ax.set_ylabel("mean staleness τ")
    ax.set_title("async (c = 1): mean staleness of applied gradients", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    bx.set_xlabel("learners λ")
    bx.set_ylabel("% of pulled gradients lost")
    bx.set_title("gradients lost to a learner going down", fontsize=9)
    bx.set_ylim(bottom=0)
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3)
    span = f"{df['sim_time'].min():g}" if np.ptp(df["sim_time"]) == 0 else "varying"
    fig.suptitle(f"Staleness under churn: timing only, lognormal compute (mean 1, cv 0.1), "
                 f"{span} time units per point, seed 0", fontsize=9)
    fig.tight_layout()
    return save(fig, df, out_dir, NAME, sources=(Path(sweep_dir),))
