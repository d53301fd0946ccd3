"""P2-F3: momentum under delay (Giladi et al. 2020) — edge vs τ per momentum kind.

Reads the trace-only sweep of ``scenarios/p2_f3.toml`` (saved round-robin traces, nothing
re-simulated). For each momentum kind of ``figure.momenta`` at ``figure.beta`` the traces are
executed by the vmapped scan executor of :mod:`asyncsim.edges` with that optimizer and the
measured edges are drawn as points over the closed forms of :mod:`asyncsim.stability`.
Left: the raw edge η·λ. Right: the effective edge (η/(1−β) for heavy ball and shifted;
dampened is already effective), P2's scale for comparing the kinds.
"""

from __future__ import annotations

import dataclasses
import sys
import tomllib
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import finished_points, model_label, save  # noqa: E402  (matplotlib set to Agg there)

NAME = "p2_f3"


def measured(sweep_dir: Path) -> pd.DataFrame:
    from asyncsim.config import MomentumConfig
    from asyncsim.edges import edges_of_traces
    from asyncsim.scenario import load_scenario
    from asyncsim.stability import edge, effective_edge
    from asyncsim.trace import Trace

    items = []
    for folder in finished_points(sweep_dir):
        scn = load_scenario(tomllib.loads((folder / "scenario.toml").read_text()))
        items.append((scn, Trace.load(folder)))
    items.sort(key=lambda st: st[0].protocol.tau)
    big = items[-1][0]
    momenta = big.figure.get("momenta", ["none", "heavy-ball", "dampened", "shifted"])
    beta = float(big.figure.get("beta", 0.9))
    rows = []
    for kind in momenta:
        b = 0.0 if kind == "none" else beta
        opt = dataclasses.replace(big.optimizer, momentum=MomentumConfig(kind=kind, beta=b))
        meas = edges_of_traces(dataclasses.replace(big, optimizer=opt), [t for _, t in items])
        for (s, _), m in zip(items, meas, strict=True):
            tau = int(s.protocol.tau)
            cf = float(edge(tau, kind, b))
            scale = cf / float(effective_edge(tau, kind, b))
            rows.append({"tau": tau, "momentum": kind, "beta": b, "closed_form": cf,
                         "measured": float(m), "rel_error": float(m / cf - 1),
                         "effective_closed_form": cf / scale,
                         "effective_measured": float(m) / scale})
    return pd.DataFrame(rows)


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    from asyncsim.stability import edge, effective_edge

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
                note=f"Measured: each run's trace executed by asyncsim.edges (delayed GD, "
                     f"momentum β = {df['beta'].max():g}) on the {model_label(sweep_dir)} "
                     "model, edge bisected.")
