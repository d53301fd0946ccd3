"""P1-F3: train loss and test error vs epoch for hardsync and n-softsync (lambda = 30),
with alpha = alpha0 (top row) and alpha = alpha0/tau (bottom row), as in P1's Fig. 3.

Reads ``index.csv`` and each point's ``eval.csv`` / ``summary.json`` only. Curves are the
mean over the seeds present; a curve with a run that diverged or never learned ends with an
x at its last evaluation.
Hardsync has tau = 0, so both rules are the same run: it is drawn in both rows.

Outputs: ``NAME.png``, ``NAME.csv`` (every plotted point: rule, setup, epoch, mean train
loss, mean test error, seeds) and ``NAME_table.csv`` (final test error per setup and rule,
mean, std and count over seeds, diverged runs (non-finite loss), runs that never learned
(``summary.json``'s ``never_learned``: test error within noise of chance all along), the
failures (either) and the difference to hardsync).
The model records the mean mini-batch training *loss* per update, not a training error, so
the left column is the training loss (P1 plots training error).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ._common import RULE_LABEL, load_points, run_failed, save, setup_label, setup_order

NAME = "p1_f3_lr_modulation"
RULES = ("constant", "inverse-staleness")


def _series(points: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-run evaluation rows (long form) and the final row of every run."""
    curves, finals = [], []
    for _, p in points.iterrows():
        ev = p["run"].evals
        label = setup_label(p["protocol"], p["n"])
        # hardsync: tau = 0, the two rules coincide; draw its one run in both rows.
        rules = RULES if p["protocol"] == "hardsync" else (p["lr_rule"],)
        diverged = bool(p["summary"].get("diverged"))
        for rule in rules:
            c = ev[["epoch", "train_loss", "test_error"]].copy()  # what is plotted
            c["rule"], c["setup"], c["seed"] = rule, label, p["seed"]
            curves.append(c)
            finals.append({"rule": rule, "setup": label, "seed": p["seed"],
                           "n": p["n"],
                           "final_test_error": float(ev["test_error"].iloc[-1]),
                           "final_epoch": float(ev["epoch"].iloc[-1]), "diverged": diverged,
                           # P1's "does not converge": stuck within noise of chance
                           "never_learned": bool(p["summary"].get("never_learned")),
                           "failed": run_failed(p["summary"]),
                           "staleness_mean": p["summary"].get("staleness_mean")})
    return pd.concat(curves, ignore_index=True), pd.DataFrame(finals)


def table(finals: pd.DataFrame) -> pd.DataFrame:
    """Final test error per (rule, setup): mean, std, seeds, diverged count, band vs hardsync.

    A diverged run has no meaningful final error; its last evaluation (~0.9, chance) is kept
    in the mean so that a rule that diverges is not shown as better than one that does not.
    """
    g = finals.groupby(["rule", "setup", "n"], sort=False)
    t = g.agg(final_test_error_mean=("final_test_error", "mean"),
              final_test_error_std=("final_test_error", "std"),
              seeds=("seed", "nunique"), diverged=("diverged", "sum"),
              never_learned=("never_learned", "sum"),
              staleness_mean=("staleness_mean", "mean"),
              failed=("failed", "sum")).reset_index()
    hs = t.loc[t["setup"] == "hardsync", ["rule", "final_test_error_mean"]]
    t = t.merge(hs.rename(columns={"final_test_error_mean": "hardsync"}), on="rule", how="left")
    t["diff_vs_hardsync"] = t["final_test_error_mean"] - t["hardsync"]
    return t.drop(columns="hardsync").sort_values(["rule", "n"]).reset_index(drop=True)


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    points = load_points(Path(sweep_dir))
    curves, finals = _series(points)
    mean = (curves.groupby(["rule", "setup", "epoch"], sort=False)
            .agg(train_loss=("train_loss", "mean"), test_error=("test_error", "mean"),
                 seeds=("seed", "nunique")).reset_index())
    order = sorted(mean["setup"].unique(), key=setup_order)
    colors = dict(zip(order, plt.cm.viridis(np.linspace(0, 0.9, len(order))), strict=True))
    colors["hardsync"] = "black"
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    for i, rule in enumerate(RULES):
        for s in order:
            d = mean[(mean["rule"] == rule) & (mean["setup"] == s)].sort_values("epoch")
            if d.empty:
                continue
            div = finals[(finals["rule"] == rule) & (finals["setup"] == s)]["failed"].any()
            for j, col in enumerate(("train_loss", "test_error")):
                ax = axes[i, j]
                ax.plot(d["epoch"], d[col], color=colors[s], lw=1.4, marker=".", ms=3,
                        ls="--" if s == "hardsync" else "-", label=s)
                if div:
                    ax.plot(d["epoch"].iloc[-1], d[col].iloc[-1], "x", color=colors[s], ms=8)
        axes[i, 0].set_ylabel(f"{RULE_LABEL[rule]}\ntrain loss (mini-batch mean)")
        axes[i, 1].set_ylabel("test error")
        lo = float(np.nanmin(mean["test_error"])) if len(mean) else 0.0
        axes[i, 1].set_ylim(max(0.0, lo - 0.05), 0.95)
        axes[i, 0].set_yscale("log")
    for ax in axes[1]:
        ax.set_xlabel("epoch")
    axes[0, 1].legend(fontsize=8, loc="upper right")
    lam = points["learners"].iloc[0]
    mu = points["batch_size"].iloc[0]
    seeds = sorted(int(x) for x in points["seed"].unique())
    fig.suptitle(f"P1-F3: λ = {lam}, μ = {mu}; top α = α0, bottom α = α0/τ "
                 f"(x = diverged or never learned; seeds: {seeds})", fontsize=10)
    fig.tight_layout()
    return save(fig, mean, out_dir, NAME, sources=(sweep_dir,),
                tables={"table": table(finals)})
