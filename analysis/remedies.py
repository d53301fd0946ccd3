"""The staleness remedies compared (``scenarios/remedies.toml``): P1's setup at CPU scale,
lambda = 30, mu = 4, 4- and 30-softsync against hardsync, every remedy on one common grid of
base rates alpha0.

Reads ``index.csv`` and each point's ``scenario.toml`` / ``eval.csv`` / ``summary.json``
only. A point's remedy is read from its resolved optimizer (:func:`remedy_of`), never from
its folder name.

Per protocol the figure shows (left) the final test error, mean ± std over seeds, of every
remedy at every alpha0 of the grid, hardsync's as lines; (middle) the train loss against
epochs of each remedy at its best alpha0 of the grid; (right) the stability picture: each
run's initial per-gradient rate x initial sharpness lambda_max / the delayed edge of its
momentum kind at its mean staleness (P2's closed forms, ``asyncsim.stability.edge``),
against its final test error -- for the remedies that have a closed-form edge
(``asyncsim.stability.closed_form_applies``); a ratio above 1 predicts divergence from the
start.

Outputs: ``remedies.png``, ``remedies.csv`` (the plotted curves), ``remedies_table.csv``
(setup, remedy, alpha0: final test error mean, std, seeds, diverged runs, the gap to
hardsync at the same alpha0, the stability ratio and whether it has a closed form) and
``remedies_runs.csv`` (one row per run).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from asyncsim.config import rule_label
from asyncsim.stability import closed_form_applies, edge

from ._common import load_points, save, setup_label

NAME = "remedies"
# The remedies of the scenario, in its order, by what the optimizer does.
REMEDIES = ("constant", "p1", "p2", "p1-shifted", "p1-no-momentum", "polynomial",
            "dc-asgd-a", "gap-aware", "adam-p1")
LABELS = {"constant": "α0", "p1": "α0/τ (P1)", "p2": "η0·sin(π/(4τ+2)) (P2)",
          "p1-shifted": "α0/τ, shifted mom.", "p1-no-momentum": "α0/τ, no mom. (10 α0)",
          "polynomial": "(1+τ)^-0.5 (FedAsync)", "dc-asgd-a": "DC-ASGD-a",
          "gap-aware": "gap-aware", "adam-p1": "Adam, weight 1/τ"}
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


def _alpha0(remedy: str, lr: float) -> float:
    """The grid value of a point: p1-no-momentum runs at alpha0 / (1 - beta) = 10 alpha0."""
    return lr / 10.0 if remedy == "p1-no-momentum" else lr


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


def runs_table(points: pd.DataFrame) -> pd.DataFrame:
    """One row per run: setup, remedy, alpha0, seed, final test error, diverged, ratio."""
    rows = []
    for _, p in points.iterrows():
        remedy = remedy_of(p["scenario"])
        s = p["summary"]
        ev = p["run"].evals
        ratio, closed = stability_ratio(p["scenario"], s)
        rows.append({"setup": setup_label(p["protocol"], p["n"]), "remedy": remedy,
                     "alpha0": _alpha0(remedy, float(p["lr"])), "lr": float(p["lr"]),
                     "seed": int(p["seed"]),
                     "final_test_error": float(ev["test_error"].iloc[-1]),
                     "diverged": bool(s.get("diverged")),
                     "staleness_mean": s.get("staleness_mean"),
                     "initial_sharpness": s.get("initial_sharpness"),
                     "rate_at_mean_tau": s.get("lr_at_mean_tau"),
                     "stability_ratio": ratio, "closed_form": closed})
    return pd.DataFrame(rows)


def table(runs: pd.DataFrame) -> pd.DataFrame:
    """Final test error per (setup, remedy, alpha0): mean, std, seeds, diverged runs, the
    gap to hardsync at the same alpha0 (positive: worse), the mean stability ratio.
    A diverged run keeps its last evaluation (chance) in the mean, so a remedy that
    diverges is not shown better than one that does not."""
    g = runs.groupby(["setup", "remedy", "alpha0"], sort=False)
    out = g.agg(final_test_error_mean=("final_test_error", "mean"),
                final_test_error_std=("final_test_error", "std"),
                seeds=("seed", "count"), diverged=("diverged", "sum"),
                stability_ratio=("stability_ratio", "mean"),
                closed_form=("closed_form", "first")).reset_index()
    hard = out[out["setup"] == "hardsync"].set_index("alpha0")["final_test_error_mean"]
    out["vs_hardsync"] = [m - hard.get(a, math.nan) for a, m in
                          zip(out["alpha0"], out["final_test_error_mean"], strict=True)]
    return out


def best(tab: pd.DataFrame) -> pd.DataFrame:
    """Each (setup, remedy) at the alpha0 of the grid with its lowest mean final error."""
    idx = tab.groupby(["setup", "remedy"], sort=False)["final_test_error_mean"].idxmin()
    return tab.loc[idx].reset_index(drop=True)


def _curves(points: pd.DataFrame, picks: pd.DataFrame) -> pd.DataFrame:
    want = {(r.setup, r.remedy, r.alpha0) for r in picks.itertuples()}
    frames = []
    for _, p in points.iterrows():
        remedy = remedy_of(p["scenario"])
        key = (setup_label(p["protocol"], p["n"]), remedy, _alpha0(remedy, float(p["lr"])))
        if key not in want:
            continue
        ev = p["run"].evals[["epoch", "train_loss", "test_error"]].copy()
        ev["setup"], ev["remedy"], ev["alpha0"], ev["seed"] = (*key, int(p["seed"]))
        frames.append(ev)
    if not frames:
        return pd.DataFrame(columns=["setup", "remedy", "alpha0", "epoch", "train_loss",
                                     "test_error", "seeds"])
    c = pd.concat(frames, ignore_index=True)
    return (c.groupby(["setup", "remedy", "alpha0", "epoch"], sort=False)
            .agg(train_loss=("train_loss", "mean"), test_error=("test_error", "mean"),
                 seeds=("seed", "count")).reset_index())


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    points = load_points(Path(sweep_dir))
    if points.empty:
        raise FileNotFoundError(f"{sweep_dir}: no complete points to draw")
    runs = runs_table(points)
    tab = table(runs)
    picks = best(tab)
    curves = _curves(points, picks)
    setups = [s for s in ("30-softsync", "4-softsync") if s in set(runs["setup"])]
    setups = setups or sorted(set(runs["setup"]) - {"hardsync"})
    alphas = sorted(set(runs["alpha0"]))
    remedies = [r for r in REMEDIES if r in set(runs["remedy"])] + sorted(
        set(runs["remedy"]) - set(REMEDIES) - {"hardsync"})
    colors = {r: plt.cm.tab10(i % 10) for i, r in enumerate(remedies)}
    hard = tab[tab["setup"] == "hardsync"].set_index("alpha0")
    fig, axes = plt.subplots(len(setups), 3, figsize=(15, 4.2 * len(setups)), squeeze=False)
    for row, setup in zip(axes, setups, strict=True):
        a, b, c = row
        sub = tab[tab["setup"] == setup]
        width = 0.8 / max(len(alphas), 1)
        for j, alpha in enumerate(alphas):
            s = sub[sub["alpha0"] == alpha].set_index("remedy").reindex(remedies)
            a.bar(np.arange(len(remedies)) + (j - (len(alphas) - 1) / 2) * width,
                  s["final_test_error_mean"], width, yerr=s["final_test_error_std"],
                  label=f"α0 = {alpha:g}", alpha=0.85, capsize=2)
            if alpha in hard.index:
                a.axhline(hard.loc[alpha, "final_test_error_mean"], ls="--", lw=1,
                          color=f"C{j}", label=f"hardsync, α0 = {alpha:g}")
        a.set_xticks(np.arange(len(remedies)))
        a.set_xticklabels([LABELS.get(r, r) for r in remedies], rotation=40, ha="right",
                          fontsize=7)
        a.set_ylabel("final test error")
        a.set_title(f"{setup}: final test error, mean ± std over seeds", fontsize=9)
        a.legend(fontsize=7)
        for r in remedies:
            cv = curves[(curves["setup"] == setup) & (curves["remedy"] == r)]
            if not cv.empty:
                b.plot(cv["epoch"], cv["train_loss"], color=colors[r],
                       label=f"{LABELS.get(r, r)} (α0 = {cv['alpha0'].iloc[0]:g})")
        hc = curves[curves["setup"] == "hardsync"]
        if not hc.empty:
            b.plot(hc["epoch"], hc["train_loss"], "k--",
                   label=f"hardsync (α0 = {hc['alpha0'].iloc[0]:g})")
        b.set_yscale("log")
        b.set_xlabel("epoch")
        b.set_ylabel("train loss (mini-batch, mean over seeds)")
        b.set_title(f"{setup}: train loss, each remedy at its best α0", fontsize=9)
        b.legend(fontsize=6)
        rs = runs[(runs["setup"] == setup) & runs["closed_form"]
                  & np.isfinite(runs["stability_ratio"])]
        for r in remedies:
            q = rs[rs["remedy"] == r]
            if not q.empty:
                c.scatter(q["stability_ratio"], q["final_test_error"], color=colors[r], s=18,
                          label=LABELS.get(r, r))
        c.axvline(1.0, color="k", lw=0.8, ls=":")
        c.set_xscale("log")
        c.set_xlabel("initial rate × λ_max / delayed edge (closed form)")
        c.set_ylabel("final test error (per run)")
        c.set_title(f"{setup}: stability ratio (> 1: unstable at the start)", fontsize=9)
        c.legend(fontsize=6)
    fig.tight_layout()
    note = ("Staleness remedies on P1's setup at CPU scale (λ = 30, μ = 4, P1's network on "
            "the synthetic CIFAR-shaped set): each remedy on one common grid of α0, no other "
            "tuning; gap-aware and Adam have no closed-form edge (not in the right column).")
    data = curves.assign(kind="train curve")
    return save(fig, data, out_dir, NAME, sources=(Path(sweep_dir),), note=note,
                tables={"table": tab, "runs": runs})
