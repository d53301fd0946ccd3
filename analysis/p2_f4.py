"""P2-F4: minima selection — sharpness of the minimum reached vs delay τ (Giladi et al. 2020).

Reads the sweep of ``scenarios/p2_f4.toml`` (run folders only; nothing is re-simulated): for
each point it loads the final parameters (``params.npz``) and measures the top Hessian
eigenvalue of the mean training loss on the first ``figure.sharpness_samples`` training
images with :func:`asyncsim.sharpness.sharpness` (P2's HVP power iteration, tol 1e-6, at
most 100 iterations). Plotted against τ with the linear-stability bound the rate allows:
``2 sin(π/(4τ+2))/η`` (P2); with the η_τ rule that bound is ``2/η0`` at every τ.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

NAME = "p2_f4"
RULES = {"constant": "η = η0 (constant)", "stability-edge": "η_τ = η0 sin(π/(4τ+2))"}


def points(sweep_dir: Path, *, measure_sharpness: bool = True) -> pd.DataFrame:
    """One row per complete point: tau, lr_rule, lr, eta (the rate at delay τ), final test
    error, diverged, sharpness (NaN if diverged), bound (2 sin(π/(4τ+2))/eta)."""
    from asyncsim.engine import Numerics
    from asyncsim.online import load_params
    from asyncsim.scenario import load_scenario
    from asyncsim.sharpness import sharpness

    index = pd.read_csv(Path(sweep_dir) / "index.csv")
    rows = []
    for _, r in index.iterrows():
        folder = Path(sweep_dir) / r["point"]
        if not (folder / "summary.json").exists():
            continue
        summary = json.loads((folder / "summary.json").read_text())
        raw = tomllib.loads((folder / "scenario.toml").read_text())
        scn = load_scenario(raw)
        tau = int(scn.protocol.tau)
        eta0 = scn.optimizer.lr
        rule = scn.optimizer.lr_rule
        eta = eta0 * math.sin(math.pi / (4 * tau + 2)) if rule == "stability-edge" else eta0
        sh = math.nan
        diverged = bool(summary.get("diverged", False))
        if measure_sharpness and not diverged and (folder / "params.npz").exists():
            num = Numerics(scn)
            params = load_params(folder, num.init_params())
            n = int(scn.figure.get("sharpness_samples", 1024))
            sh = sharpness(num.model, params, num.x_train[:n], num.y_train[:n])
        rows.append({"tau": tau, "lr_rule": rule, "eta0": eta0, "eta": eta,
                     "seed": scn.seed, "final_test_error": summary.get("final_test_error"),
                     "final_train_loss": summary.get("final_train_loss"),
                     "diverged": diverged, "sharpness": sh,
                     "bound": 2 * math.sin(math.pi / (4 * tau + 2)) / eta,
                     "sync_bound": 2 / eta0})
    return pd.DataFrame(rows).sort_values(["lr_rule", "tau"]).reset_index(drop=True)


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    df = points(sweep_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv = out_dir / f"{NAME}.csv"
    df.to_csv(csv, index=False)
    fig, ax = plt.subplots(figsize=(5.5, 4), dpi=100)
    for rule, label in RULES.items():
        g = df[df["lr_rule"] == rule]
        if g.empty:
            continue
        x = g["tau"] + 1
        (line,) = ax.plot(x, g["sharpness"], "o-", label=f"sharpness, {label}")
        ax.plot(x, g["bound"], "--", color=line.get_color(), lw=1,
                label=f"bound 2 sin(π/(4τ+2))/η, {rule}")
        bad = g[g["diverged"]]
        if not bad.empty:
            ax.plot(bad["tau"] + 1, np.full(len(bad), np.nanmax(df["bound"])), "x",
                    color=line.get_color(), label=f"diverged, {rule}")
    ax.set(xscale="log", yscale="log", xlabel="τ + 1",
           ylabel="λ_max of the minimum reached")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("P2-F4 minima selection (MLP, synthetic CIFAR)", fontsize=9)
    fig.tight_layout()
    png = out_dir / f"{NAME}.png"
    fig.savefig(png)
    plt.close(fig)
    return [png, csv]
