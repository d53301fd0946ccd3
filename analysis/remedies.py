"""The staleness remedies compared, each at its own best rate (``scenarios/remedies.toml``).

Every remedy runs on its own grid of rates in every setting (4-softsync, 30-softsync,
30-softsync under churn; hardsync on P1's grid is the baseline), over the same seeds. Per
setting and remedy, the best rate is the one of lowest mean final test error over the seeds
(a failed run -- ``summary.json``'s ``diverged`` or ``never_learned`` -- counts at its last
evaluation, so a remedy that fails is not shown better than one that does not). Each remedy
at its best rate is compared with alpha0/tau (P1's rule, ``p1``) at its own best rate,
paired by seed: the seeds of a setting share their simulated trace, initial weights and
batch order, so the paired difference removes what the seed alone explains. Intervals are
95% Student-t intervals over the seeds; a difference is significant when its interval
excludes zero. The best rate is chosen on the same seeds it is reported on, which favours
every remedy alike (no held-out seeds).

Reads ``index.csv`` and each point's ``scenario.toml`` / ``eval.csv`` / ``summary.json``
only. A point's remedy is read from its resolved optimizer (:func:`remedy_of`), never from
its folder name; its setting from its protocol and ``cluster.availability``.

Outputs: ``remedies.png`` (per setting: final test error against the rate, every remedy's
grid; each remedy at its best rate with its interval; test error against simulated time at
the best rates), ``remedies.csv`` (the plotted curves), ``remedies_table.csv`` (per setting
and remedy at its best rate: ``setup, remedy, best_lr, seeds, test_error_mean,
test_error_ci95, train_error_mean, time_to_target_mean``, then the seeds that reached the
target, failures, whether the best rate is at an end of the grid, and the paired difference
to alpha0/tau: mean, interval, significant), ``remedies_grid.csv`` (every setting, remedy
and rate) and ``remedies_runs.csv`` (one row per run, with its initial stability ratio).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from asyncsim.config import rule_label
from asyncsim.stability import closed_form_applies, edge

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

NAME = "remedies"
# The remedies, in the figure's order, by what the optimizer does.
REMEDIES = ("constant", "p1", "p2", "p1-shifted", "p1-no-momentum", "polynomial",
            "dc-asgd-a", "gap-aware", "adam-p1")
LABELS = {"constant": "α0", "p1": "α0/τ (P1)", "p2": "η0·sin(π/(4τ+2)) (P2)",
          "p1-shifted": "α0/τ, shifted mom.", "p1-no-momentum": "α0/τ, no momentum",
          "polynomial": "α0(1+τ)^-0.5 (FedAsync)", "dc-asgd-a": "DC-ASGD-a",
          "gap-aware": "gap-aware", "adam-p1": "Adam, weight 1/τ", "hardsync": "hardsync"}
REFERENCE = "p1"  # what every remedy is compared with, paired by seed
_RULES = {"constant": "constant", "inverse-staleness": "p1", "stability-edge": "p2"}


def remedy_of(scn: dict) -> str:
    """The remedy a resolved scenario runs (a name of :data:`REMEDIES`, ``hardsync``, or a
    description for a setting the scenario file does not have)."""
    if scn.get("protocol", {}).get("kind") == "hardsync":
        return "hardsync"
    opt = scn.get("optimizer", {})
    rule = opt.get("lr_rule", "constant")
    kind = opt.get("momentum", {}).get("kind", "none")
    comp = (opt.get("compensation") or {}).get("kind")
    tx = (opt.get("transform") or {}).get("name")
    if tx == "adam" and rule == "inverse-staleness":
        return "adam-p1"
    if comp is not None:
        return (comp if rule == "constant" and kind == "heavy-ball"
                else f"{comp}+{rule_label(rule)}")
    if isinstance(rule, dict):
        return rule_label(rule).split("(")[0] if kind == "heavy-ball" else \
            f"{rule_label(rule)}+{kind}"
    base = _RULES.get(rule, rule)
    if kind == "shifted":
        return f"{base}-shifted"
    if kind == "none":
        return f"{base}-no-momentum"
    return base


def setting_of(point) -> str:
    """``hardsync``, ``N-softsync``, with ``, churn`` when learners come and go."""
    label = setup_label(point["protocol"], point["n"])
    return label + (", churn" if point["scenario"]["cluster"].get("availability") else "")


def stability_ratio(scn: dict, summary: dict) -> tuple[float, bool]:
    """(initial rate x initial sharpness / delayed edge, whether a closed form exists) of a
    run: the rate its rule gives at its mean staleness (rounded), the edge of its momentum
    kind at that delay (P2's closed forms). NaN when there is no closed form."""
    opt = scn.get("optimizer", {})
    ok, _ = closed_form_applies(opt)
    lam = summary.get("initial_sharpness")
    rate = summary.get("lr_at_mean_tau")
    if not ok or lam is None or rate is None:
        return math.nan, ok
    tau = int(round(float(summary.get("staleness_mean") or 0.0)))
    m = opt.get("momentum", {})
    kind = m.get("kind", "none")
    beta = float(m.get("beta", 0.9)) if kind != "none" else 0.0
    e = float(edge(tau, kind, beta)) if kind != "none" else float(edge(tau))
    return float(rate) * float(lam) / e, ok


def runs_table(points: pd.DataFrame, target: float) -> pd.DataFrame:
    """One row per run: setup, remedy, rate, seed, where it ended
    (:func:`~._common.run_outcome`), its mean staleness and initial stability ratio."""
    rows = []
    for _, p in points.iterrows():
        s = p["summary"]
        ratio, closed = stability_ratio(p["scenario"], s)
        rows.append({"setup": setting_of(p), "remedy": remedy_of(p["scenario"]),
                     "lr": float(p["lr"]), "seed": int(p["seed"]), **run_outcome(p, target),
                     "staleness_mean": s.get("staleness_mean"),
                     "initial_sharpness": s.get("initial_sharpness"),
                     "stability_ratio": ratio, "closed_form": closed})
    return pd.DataFrame(rows)


def grid_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (setup, remedy, rate): seeds, failures, final test error mean and ci95, mean
    final train error."""
    g = runs.groupby(["setup", "remedy", "lr"], sort=False)
    out = g.agg(seeds=("seed", "count"), failed=("failed", "sum"),
                test_error_mean=("final_test_error", "mean"),
                train_error_mean=("final_train_error", "mean")).reset_index()
    out["test_error_ci95"] = [ci95(x) for _, x in g["final_test_error"]]
    return out


def paired(a: pd.Series, b: pd.Series) -> tuple[float, float]:
    """(mean, ci95) of ``a - b`` over the seeds (the index) both have."""
    d = (a - b).dropna()
    return (float(d.mean()) if len(d) else math.nan, ci95(d))


def table(runs: pd.DataFrame, grid: pd.DataFrame) -> pd.DataFrame:
    """Each (setup, remedy) at its best rate (lowest mean final test error of its grid),
    with the paired difference to :data:`REFERENCE` at its own best rate."""
    best = grid.loc[grid.groupby(["setup", "remedy"], sort=False)["test_error_mean"].idxmin()]
    rows = []
    for b in best.itertuples():
        rates = sorted(grid.loc[(grid["setup"] == b.setup) & (grid["remedy"] == b.remedy),
                                "lr"])
        r = runs[(runs["setup"] == b.setup) & (runs["remedy"] == b.remedy)
                 & (runs["lr"] == b.lr)].set_index("seed")
        reached = r["time_to_target"].dropna()
        rows.append({"setup": b.setup, "remedy": b.remedy, "best_lr": b.lr,
                     "seeds": b.seeds, "test_error_mean": b.test_error_mean,
                     "test_error_ci95": b.test_error_ci95,
                     "train_error_mean": b.train_error_mean,
                     "time_to_target_mean": reached.mean() if len(reached) else math.nan,
                     "reached_target": len(reached), "failed": int(b.failed),
                     "best_at_grid_end": len(rates) > 1 and b.lr in (rates[0], rates[-1]),
                     "_errors": r["final_test_error"]})
    tab = pd.DataFrame(rows)
    tab["vs_p1_mean"] = tab["vs_p1_ci95"] = math.nan
    for _, g in tab.groupby("setup", sort=False):
        ref = g[g["remedy"] == REFERENCE]
        for i in g.index:
            m = h = math.nan
            if len(ref) and tab.at[i, "remedy"] != REFERENCE:
                m, h = paired(tab.at[i, "_errors"], ref["_errors"].iloc[0])
            tab.loc[i, ["vs_p1_mean", "vs_p1_ci95"]] = [m, h]
    tab["vs_p1_significant"] = np.abs(tab["vs_p1_mean"]) > tab["vs_p1_ci95"]
    order = {r: i for i, r in enumerate(("hardsync", *REMEDIES))}
    keys = [(setup_order(s), order.get(r, len(order)), r)
            for s, r in zip(tab["setup"], tab["remedy"], strict=True)]
    rank = sorted(range(len(tab)), key=keys.__getitem__)
    return tab.iloc[rank].drop(columns="_errors").reset_index(drop=True)


def _finite(x: float) -> float:
    """An interval's half-width to draw: 0 where there is none (one seed)."""
    return float(x) if math.isfinite(float(x)) else 0.0


def _curves(points: pd.DataFrame, tab: pd.DataFrame) -> pd.DataFrame:
    """Mean test error against simulated time of each (setup, remedy) at its best rate."""
    best = {(r.setup, r.remedy): r.best_lr for r in tab.itertuples()}
    picked = points[[best.get((setting_of(p), remedy_of(p["scenario"]))) == float(p["lr"])
                     for _, p in points.iterrows()]]
    return mean_curves(picked, lambda p: {"setup": setting_of(p),
                                          "remedy": remedy_of(p["scenario"]),
                                          "lr": float(p["lr"])})


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    points = load_points(Path(sweep_dir))
    target = figure_target(points, 0.4)
    runs = runs_table(points, target)
    grid = grid_table(runs)
    tab = table(runs, grid)
    curves = _curves(points, tab)
    setups = sorted(set(runs["setup"]) - {"hardsync"}, key=setup_order)
    remedies = [r for r in REMEDIES if r in set(runs["remedy"])] + sorted(
        set(runs["remedy"]) - set(REMEDIES) - {"hardsync"})
    colors = {r: plt.cm.tab10(i % 10) for i, r in enumerate(remedies)}
    hard = tab[tab["setup"] == "hardsync"]
    fig, axes = plt.subplots(len(setups), 3, figsize=(16, 4.3 * len(setups)), squeeze=False)
    for (a, b, c), setup in zip(axes, setups, strict=True):
        sub, best = grid[grid["setup"] == setup], tab[tab["setup"] == setup]
        for r in remedies:
            q = sub[sub["remedy"] == r]
            if not q.empty:
                a.errorbar(q["lr"], q["test_error_mean"], yerr=q["test_error_ci95"].fillna(0),
                           marker="o", ms=3, capsize=2, color=colors[r], label=LABELS.get(r, r))
        a.set_xscale("log")
        a.set_xlabel("rate (optimizer.lr: α0, η0 or Adam's)")
        a.set_ylabel("final test error (mean, 95% interval)")
        a.set_title(f"{setup}: every remedy on its own grid", fontsize=9)
        a.legend(fontsize=6)
        best = best.set_index("remedy").reindex(remedies)
        x = np.arange(len(remedies))
        if not hard.empty:
            m, h = float(hard["test_error_mean"].iloc[0]), float(hard["test_error_ci95"].iloc[0])
            if math.isfinite(h):
                b.axhspan(m - h, m + h, color="k", alpha=0.1)
            b.axhline(m, color="k", ls="--", lw=1, label="hardsync at its best rate")
        for i, r in enumerate(remedies):
            row = best.loc[r]
            b.errorbar([i], [row["test_error_mean"]], yerr=[_finite(row["test_error_ci95"])],
                       marker="o", capsize=4, color=colors[r])
            mark = " *" if row["vs_p1_significant"] else ""
            b.annotate(f"{row['best_lr']:g}{mark}", (i, row["test_error_mean"]), fontsize=6,
                       ha="left", textcoords="offset points", xytext=(5, 0))
        b.legend(fontsize=7)
        b.set_xticks(x)
        b.set_xticklabels([LABELS.get(r, r) for r in remedies], rotation=40, ha="right",
                          fontsize=7)
        b.set_ylabel("final test error at the best rate (95% interval)")
        b.set_title(f"{setup}: at the best rate (beside; *: differs from α0/τ, paired)",
                    fontsize=9)
        for r in remedies:
            cv = curves[(curves["setup"] == setup) & (curves["remedy"] == r)]
            if not cv.empty:
                c.plot(cv["sim_time"], cv["test_error"], color=colors[r], lw=1.2,
                       label=LABELS.get(r, r))
        hc = curves[curves["setup"] == "hardsync"]
        if not hc.empty:
            c.plot(hc["sim_time"], hc["test_error"], "k--", lw=1.2, label="hardsync")
        c.axhline(target, color="0.6", lw=0.8, ls=":")
        c.set_xlabel("simulated time (one gradient's compute = 1)")
        c.set_ylabel("test error (mean over the seeds still running)")
        c.set_title(f"{setup}: at the best rates; dotted: the target {target:g}", fontsize=9)
        c.legend(fontsize=6)
    fig.tight_layout()
    note = "Each remedy at the best rate of its own grid; intervals are 95% over the seeds."
    if not hard.empty:
        h = hard.iloc[0]
        note = (f"Baseline (hardsync at its best rate {h['best_lr']:g}): final train error "
                f"{100 * h['train_error_mean']:.1f}%, test error "
                f"{100 * h['test_error_mean']:.1f}% ± {100 * _finite(h['test_error_ci95']):.1f} "
                f"({int(h['seeds'])} seeds). " + note
                + " A run that diverged or never learned is a failure and keeps its last"
                " evaluation.")
    return save(fig, curves, out_dir, NAME, sources=(Path(sweep_dir),), note=note,
                tables={"table": tab, "grid": grid, "runs": runs})
