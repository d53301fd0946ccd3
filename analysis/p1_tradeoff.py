"""P1's claim where it lives: accuracy against simulated time (``scenarios/p1_tradeoff.toml``).

P1 (Zhang et al. 2016) claims that alpha0/tau keeps hardsync's accuracy at every n of
n-softsync (lambda = 30) while running nearly lambda times as fast. This figure puts both
halves on one axis, the simulated wall-clock time that the timing model gives every run:
hardsync, alpha0 and alpha0/tau for each n of the sweep, over the seeds present.

Reads ``index.csv`` and each point's ``eval.csv`` / ``summary.json`` / ``scenario.toml``
only. The target test error is ``[figure] target_test_error`` of the runs' scenario; a
run's time to it is the first evaluation at or below it, interpolated in simulated time
(:func:`~._common.time_to_target`, the one P1-F2 uses). A run that diverged or never
learned (``summary.json``'s ``diverged``, ``never_learned``) is a failure: it keeps its
last evaluation in the mean final error and has no time to target. A run that learned and
then fell back towards chance is not a failure; its final error says so.

Intervals are 95% Student-t intervals over the seeds (``ci95`` the half-width; none with
one seed).

Outputs: ``NAME.png`` (left: test error against simulated time, the mean over seeds, for
hardsync and both rules at each n; middle: final test error against n with its interval,
hardsync as a band; right: simulated time to the target against n), ``NAME.csv`` (the
plotted curves) and ``NAME_table.csv`` (per setup and rule: seeds, failures, final test
and train error mean and ci95, time to target mean and ci95 over the seeds that reached
it, how many reached it, and the speedup in time to target over hardsync).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ._common import (
    ci95,
    figure_target,
    load_points,
    mean_curves,
    run_outcome,
    save,
    setup_label,
    setup_order,
)

NAME = "p1_tradeoff"
RULES = {"constant": "α0", "inverse-staleness": "α0/τ"}


def _rule(point) -> str:
    """A point's rule as the figure names it: ``hardsync`` (tau = 0: no rule), α0, α0/τ."""
    return ("hardsync" if point["protocol"] == "hardsync"
            else RULES.get(point["lr_rule"], point["lr_rule"]))


def runs_table(points: pd.DataFrame, target: float) -> pd.DataFrame:
    """One row per run: setup, rule, n, seed and where it ended (:func:`~._common.run_outcome`)."""
    return pd.DataFrame([{"setup": setup_label(p["protocol"], p["n"]), "n": int(p["n"]),
                          "rule": _rule(p), "seed": int(p["seed"]), **run_outcome(p, target)}
                         for _, p in points.iterrows()])


def table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (setup, rule): seeds, failures, final errors and time to target (mean, ci95),
    seeds that reached the target, speedup over hardsync in time to target."""
    out = []
    for (setup, rule, n), g in runs.groupby(["setup", "rule", "n"], sort=False):
        reached = g["time_to_target"].dropna()
        out.append({"setup": setup, "rule": rule, "n": n, "seeds": len(g),
                    "failed": int(g["failed"].sum()),
                    "final_test_error_mean": g["final_test_error"].mean(),
                    "final_test_error_ci95": ci95(g["final_test_error"]),
                    "final_train_error_mean": g["final_train_error"].mean(),
                    "final_train_error_ci95": ci95(g["final_train_error"]),
                    "reached_target": len(reached),
                    "time_to_target": reached.mean() if len(reached) else math.nan,
                    "time_to_target_ci95": ci95(reached)})
    tab = pd.DataFrame(out)
    hard = tab.loc[tab["setup"] == "hardsync", "time_to_target"]
    base = float(hard.iloc[0]) if len(hard) else math.nan
    tab["speedup_vs_hardsync"] = base / tab["time_to_target"]
    order = [setup_order(s) for s in tab["setup"]]
    return tab.iloc[sorted(range(len(tab)), key=lambda i: (order[i], tab["rule"].iloc[i]))
                    ].reset_index(drop=True)


def _curves(points: pd.DataFrame) -> pd.DataFrame:
    """Mean test error against simulated time per (setup, rule)."""
    return mean_curves(points, lambda p: {"setup": setup_label(p["protocol"], p["n"]),
                                          "rule": _rule(p)})


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    points = load_points(Path(sweep_dir))
    target = figure_target(points, 0.4)
    runs = runs_table(points, target)
    tab = table(runs)
    curves = _curves(points)
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.6))
    hard = tab[tab["setup"] == "hardsync"]
    ns = sorted(n for n in tab["n"].unique() if n)
    colors = {n: plt.cm.viridis(i / max(len(ns) - 1, 1)) for i, n in enumerate(ns)}
    for (setup, rule), cv in curves.groupby(["setup", "rule"], sort=False):
        if rule == "hardsync":
            a.plot(cv["sim_time"], cv["test_error"], color="k", lw=2, label="hardsync")
            continue
        n = int(setup.split("-")[0])
        a.plot(cv["sim_time"], cv["test_error"], color=colors[n],
               ls="-" if rule == "α0/τ" else ":", lw=1.2,
               label=f"{setup}, {rule}")
    a.axhline(target, color="0.6", lw=0.8, ls="--")
    a.set_xscale("log")
    a.set_xlabel("simulated time (one gradient's compute = 1)")
    # a run that diverged stops: later points are the mean of the seeds still running
    a.set_ylabel("test error (mean over the seeds still running)")
    a.set_title("test error against simulated time (dotted: α0, solid: α0/τ)", fontsize=9)
    a.legend(fontsize=6, ncol=2)
    panels = ((b, "final_test_error_mean", "final_test_error_ci95", "final test error"),
              (c, "time_to_target", "time_to_target_ci95",
               f"simulated time to test error ≤ {target:g}"))
    for ax, col, ci, label in panels:
        if not hard.empty and hard[col].notna().all():
            m, h = float(hard[col].iloc[0]), float(hard[ci].fillna(0).iloc[0])
            ax.axhspan(m - h, m + h, color="k", alpha=0.12)
            ax.axhline(m, color="k", lw=1.5, label="hardsync")
        for rule, marker in (("α0", "o"), ("α0/τ", "s")):
            d = tab[tab["rule"] == rule]
            ax.errorbar(d["n"], d[col], yerr=d[ci].fillna(0), marker=marker, capsize=3,
                        label=rule)
            for r in d[d["failed"] > 0].itertuples():
                ax.annotate(f"{r.failed}/{r.seeds} failed", (r.n, d[col].loc[r.Index]),
                            fontsize=6, textcoords="offset points", xytext=(4, 4))
        ax.set_xscale("log")
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_xlabel("n (n-softsync, λ = 30)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    b.set_title("final test error, mean and 95% interval over seeds", fontsize=9)
    c.set_title("time to target (seeds that reached it)", fontsize=9)
    note = ""
    if not hard.empty:
        h = hard.iloc[0]
        note = (f"Baseline (hardsync): final train error {100 * h['final_train_error_mean']:.1f}%,"
                f" test error {100 * h['final_test_error_mean']:.1f}% (mean of "
                f"{int(h['seeds'])} seeds). A failure is a run that diverged or never learned.")
    fig.suptitle("P1's trade-off: accuracy against simulated time, hardsync, α0 and α0/τ",
                 fontsize=10)
    fig.tight_layout()
    return save(fig, curves, out_dir, NAME, sources=(sweep_dir,), note=note,
                tables={"table": tab})
