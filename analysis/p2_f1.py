"""P2-F1 as P2's official code ran it (Giladi et al. 2020): train error, test error and the
generalization gap against the delay τ, at a constant rate η0 and at P2's
``η_τ = η0 sin(π/(4τ+2))`` trained for the official ``long`` regime, per momentum kind.

Reads the sweep of ``scenarios/p2_f1.toml`` (index.csv and each point's summary.json and
scenario.toml; nothing is re-simulated). One panel per momentum kind; solid: final test
error, dashed: final train error (``run.eval_train``), mean ± std over the seeds that did
not diverge; ×: a (τ, rule) whose every seed diverged, drawn at 90% (chance for 10
classes). The CSV holds one row per run and the table (:func:`table`) one per (momentum,
rule, τ).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from asyncsim import _checks
from asyncsim.config import rule_label

from ._common import finished_points, save

NAME = "p2_f1"
RULES = {"constant": ("η0, normal regime", "C0"),
         "stability-edge": ("η_τ = η0 sin(π/(4τ+2)), long regime", "C1")}
MOMENTA = {"none": "momentum off", "heavy-ball": "heavy ball", "shifted": "shifted momentum"}


def points(sweep_dir: Path) -> pd.DataFrame:
    """One row per complete run: tau, momentum, lr_rule, seed, eta0, eta (the rate at
    delay τ), epochs, final train and test error, their gap, diverged."""
    rows = []
    for run in finished_points(sweep_dir):
        s, scn = run.summary, run.recorded
        opt = scn["optimizer"]
        train, test = s.get("final_train_error"), s.get("final_test_error")
        diverged = bool(s.get("diverged", False))
        rows.append({
            "tau": run.value("protocol.tau", None, lambda k, v: _checks.integer(k, v, low=0)),
            "momentum": opt["momentum"]["kind"],
            "lr_rule": rule_label(opt["lr_rule"]), "seed": scn["seed"],
            "eta0": opt["lr"], "eta": run.summary_value("lr_at_tau"),
            "epochs": run.summary_value("epochs"), "final_train_error": train,
            "final_test_error": test,
            "gap": None if diverged or train is None else test - train,
            "diverged": diverged})
    return (pd.DataFrame(rows).sort_values(["momentum", "lr_rule", "tau", "seed"])
            .reset_index(drop=True))


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (momentum, lr_rule, tau): seeds, diverged seeds, and the mean and std (over the
    seeds that did not diverge) of the train error, test error and gap, in percent."""
    rows = []
    for (kind, rule, tau), g in df.groupby(["momentum", "lr_rule", "tau"], sort=False):
        ok = g[~g["diverged"]]
        row = {"momentum": kind, "lr_rule": rule, "tau": int(tau), "eta": g["eta"].iloc[0],
               "epochs": g["epochs"].max(), "seeds": len(g), "diverged": int(g["diverged"].sum())}
        for col in ("final_train_error", "final_test_error", "gap"):
            vals = 100 * ok[col].astype(float)
            row[f"{col}_mean"] = vals.mean() if len(vals) else float("nan")
            row[f"{col}_std"] = vals.std(ddof=0) if len(vals) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    df = points(sweep_dir)
    tab = table(df)
    kinds = [k for k in MOMENTA if k in set(df["momentum"])]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 4), dpi=100,
                             sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for rule, (label, color) in RULES.items():
            g = tab[(tab["momentum"] == kind) & (tab["lr_rule"] == rule)]
            if g.empty:
                continue
            ok = g[g["diverged"] < g["seeds"]]
            x = ok["tau"] + 1
            ax.errorbar(x, ok["final_test_error_mean"], ok["final_test_error_std"], fmt="o-",
                        color=color, capsize=3, label=f"test, {label}")
            ax.errorbar(x, ok["final_train_error_mean"], ok["final_train_error_std"],
                        fmt="s--", color=color, capsize=3, mfc="none", label=f"train, {label}")
            for r in ok[ok["diverged"] > 0].itertuples():  # some seeds diverged
                ax.annotate(f"{r.diverged}/{r.seeds} diverged", (r.tau + 1,
                            r.final_test_error_mean), textcoords="offset points",
                            xytext=(-8, 8), ha="right", fontsize=7, color=color)
            bad = g[g["diverged"] == g["seeds"]]
            if not bad.empty:
                ax.plot(bad["tau"] + 1, [90] * len(bad), "x", ms=10, color=color,
                        label=f"every seed diverged, {label}")
        ax.set(xscale="log", xlabel="τ + 1", title=MOMENTA[kind])
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("final error (%)")
    handles = {h.get_label(): h for a in axes[0] for h in a.get_legend_handles_labels()[0]}
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize=7)
    fig.suptitle("P2-F1 with the official regime: train and test error vs delay", fontsize=10)
    fig.tight_layout()
    return save(fig, df, out_dir, NAME, sources=(sweep_dir,), tables={"table": tab})
