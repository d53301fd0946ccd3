"""P2-F3: momentum under delay (Giladi et al. 2020) — edge vs τ per momentum kind.

Reads the trace-only sweep of ``scenarios/p2_f3.toml``: its ``[measure] edges`` measured
every saved round-robin trace under each momentum kind of ``measure.edge_momenta`` at the
scenario's β (the sweep folder's ``edges.csv``, :func:`asyncsim.stability.measure.sweep_edges`)
and the figure draws the measured edges as points over the closed forms of
:mod:`asyncsim.stability.closed_form`. Left: the raw edge η·λ. Right: the effective edge
(η/(1−β) for heavy ball and shifted; dampened is already effective), P2's scale for
comparing the kinds.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from asyncsim.stability.closed_form import edge, effective_edge

from ._common import model_label, read_edges, save

NAME = "p2_f3"


def measured(sweep_dir: Path) -> pd.DataFrame:
    """tau, momentum, beta, closed_form, measured, rel_error, effective_closed_form,
    effective_measured per (trace, momentum kind), from the sweep's ``edges.csv``."""
    rows = []
    for r in read_edges(sweep_dir).itertuples():
        tau, kind, b = int(r.tau), r.momentum, float(r.beta)
        cf = float(edge(tau, kind, b))
        scale = cf / float(effective_edge(tau, kind, b))
        rows.append({"tau": tau, "momentum": kind, "beta": b, "closed_form": cf,
                     "measured": float(r.measured), "rel_error": float(r.measured / cf - 1),
                     "effective_closed_form": cf / scale,
                     "effective_measured": float(r.measured) / scale})
    return pd.DataFrame(rows)


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    df = measured(sweep_dir)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), dpi=90)
    t = np.arange(0, int(df["tau"].max()) + 1)
    for i, (kind, g) in enumerate(df.groupby("momentum", sort=False)):
        b = float(g["beta"].iloc[0])
        label = kind if kind == "none" else f"{kind} β={b:g}"
        c = f"C{i}"
        axes[0].plot(t + 1, edge(t, kind, b), "-", color=c, label=label)
        axes[0].plot(g["tau"] + 1, g["measured"], "o", color=c, mfc="none")
        axes[1].plot(t + 1, effective_edge(t, kind, b), "-", color=c, label=label)
        axes[1].plot(g["tau"] + 1, g["effective_measured"], "o", color=c, mfc="none")
    for ax, yl in zip(axes, ("raw edge η·λ", "effective edge η_eff·λ"), strict=True):
        ax.set(xscale="log", yscale="log", xlabel="τ + 1", ylabel=yl)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, title="lines: closed form; o: measured", title_fontsize=7)
    fig.suptitle("P2-F3 momentum under delay (quadratic, round robin)", fontsize=9)
    fig.tight_layout()
    return save(fig, df, out_dir, NAME, sources=(sweep_dir,),
                note=f"Measured: each run's trace executed by asyncsim.stability.measured "
                     f"(delayed GD, "
                     f"momentum β = {df['beta'].max():g}) on the {model_label(sweep_dir)} "
                     "model, edge bisected.")
