"""P1-F1: staleness histograms of n-softsync, lambda = 30 (reads run folders only)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from asyncsim import _checks
from asyncsim._io import save_figure, write_text

from ._common import add_caption, trace_points

NAME = "p1_f1_staleness"


def _label(compute: str) -> str:
    d = json.loads(compute.replace("'", '"')) if compute.startswith("{") else {"dist": compute}
    if d.get("dist") == "lognormal":
        return f"near-identical learners (lognormal, cv {d.get('cv')})"
    return f"{d.get('dist')} compute times"


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    rows = []
    for run, s, trace, skip in trace_points(sweep_dir):
        lam = s["cluster"]["learners"]
        n = run.value("protocol.n", None, _checks.integer)  # softsync's, required here
        compute = json.dumps(s["cluster"]["compute"])
        hist = trace.staleness_histogram(skip=skip)
        stats = trace.staleness_stats(skip=skip)
        tau = trace.staleness[trace.grads["apply_version"] >= skip]
        p_over = float((tau > 2 * n).mean()) if tau.size else 0.0
        for _, h in hist.iterrows():
            rows.append({"compute": compute, "learners": lam, "n": n, "c": lam // n,
                         "staleness": int(h["staleness"]), "count": int(h["count"]),
                         "freq": float(h["freq"]), "mean": stats["staleness_mean"],
                         "p_over_2n": p_over, "gradients": int(tau.size)})
    df = pd.DataFrame(rows)
    computes = list(dict.fromkeys(df["compute"]))
    fig, axes = plt.subplots(1, len(computes), figsize=(5.2 * len(computes), 3.6), sharey=True,
                             squeeze=False)
    for ax, comp in zip(axes[0], computes, strict=True):
        sub = df[df["compute"] == comp]
        for n, g in sub.groupby("n"):
            c = int(g["c"].iloc[0])
            lam = int(g["learners"].iloc[0])
            ax.step(g["staleness"], g["freq"], where="mid",
                    label=f"n={n}: mean {g['mean'].iloc[0]:.2f} "
                          f"((λ-1)/c = {(lam - 1) / c:.2f}), P(τ>2n) {g['p_over_2n'].iloc[0]:.3f}")
        ax.set_yscale("log")
        ax.set_ylim(1e-5, 1.2)
        ax.set_xlabel("staleness τ")
        ax.set_title(_label(comp), fontsize=9)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("fraction of gradients")
    total = int(df.groupby(["compute", "n"])["gradients"].first().iloc[0])
    fig.suptitle(f"P1-F1 n-softsync staleness, λ = 30, timing only, {total:,} gradients per "
                 "curve after warm-up, seed 0", fontsize=9)
    fig.tight_layout()
    add_caption(fig, sweep_dir)
    png = out_dir / f"{NAME}.png"
    csv = out_dir / f"{NAME}.csv"
    save_figure(fig, png, dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_text(csv, df.to_csv(index=False))
    return [png, csv]
