"""P2-F4: minima selection — sharpness of the point training settles in vs delay τ (P2).

Reads the sweep of ``scenarios/p2_f4.toml`` (run folders only; nothing is re-simulated): for
each point it loads the final parameters (``params.npz``) and measures the top Hessian
eigenvalue λ_max of the mean training loss on the first ``figure.sharpness_samples``
training images (the whole full-batch training set by default) as
:func:`asyncsim.sharpness.sharpness` does (:func:`lambda_max`, its algorithm with a cached
HVP): P2's HVP power iteration (tol 1e-6, ≤ 100 iterations;
column ``sharpness``) and, as a check on slow power-iteration convergence when the top
eigenvalues are close, 40-step Lanczos (``sharpness_lanczos``). Plotted against τ + 1 with
the linear-stability bounds: ``2 sin(π/(4τ+2))/η0`` at constant η0 and ``2/η0`` (the
synchronous edge) with the η_τ = η0 sin(π/(4τ+2)) rule.
"""

from __future__ import annotations

import json
import math
import sys
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import finished_points, save  # noqa: E402  (matplotlib set to Agg there)

NAME = "p2_f4"
RULES = {"constant": ("η = η0 (constant)", "C0", "o"),
         "stability-edge": ("η_τ = η0 sin(π/(4τ+2))", "C1", "D")}


_HVP: dict = {}


def lambda_max(model, params, x, y, *, method: str = "power", tol: float = 1e-6,
               max_iter: int = 100) -> float:
    """:func:`asyncsim.sharpness.sharpness` (same start vector and iteration) with the HVP
    compiled once per model and shapes, not once per call: trajectories measure dozens of
    points of one run."""
    from jax.flatten_util import ravel_pytree

    from asyncsim.sharpness import _top_eig_matvec, hvp

    flat, unravel = ravel_pytree(params)
    key = (id(model), flat.shape, flat.dtype, x.shape, y.shape)
    if key not in _HVP:
        def flat_hvp(f, xx, yy, v):
            return ravel_pytree(hvp(lambda q: model.loss(q, xx, yy), unravel(f), unravel(v)))[0]

        _HVP[key] = (model, jax.jit(flat_hvp))  # keep model alive: its id stays unique
    fn = _HVP[key][1]

    def matvec(v: np.ndarray) -> np.ndarray:
        return np.asarray(fn(flat, x, y, jnp.asarray(v, dtype=flat.dtype)), dtype=np.float64)

    lam, _ = _top_eig_matvec(matvec, flat.size, key=None, tol=tol, max_iter=max_iter,
                             method=method)
    return float(lam)


def eta_of(eta0: float, tau: int, rule: str) -> float:
    """The rate in effect at delay τ (steady state of the round robin)."""
    return eta0 * math.sin(math.pi / (4 * tau + 2)) if rule == "stability-edge" else eta0


def points(sweep_dir: Path, *, measure_sharpness: bool = True) -> pd.DataFrame:
    """One row per complete point: tau, lr_rule, eta0, eta (the rate at delay τ), updates,
    final train loss / test error, diverged, sharpness (power, P2) and sharpness_lanczos (NaN
    if diverged), bound = 2 sin(π/(4τ+2))/eta, sync_bound = 2/eta0, eta_lambda = eta·λ_max,
    edge = 2 sin(π/(4τ+2))."""
    from asyncsim.engine import Numerics
    from asyncsim.online import load_params
    from asyncsim.scenario import load_scenario

    rows = []
    for folder in finished_points(sweep_dir):
        summary = json.loads((folder / "summary.json").read_text())
        scn = load_scenario(tomllib.loads((folder / "scenario.toml").read_text()))
        tau = int(scn.protocol.tau)
        eta0 = scn.optimizer.lr
        rule = scn.optimizer.lr_rule
        eta = eta_of(eta0, tau, rule)
        sh = sh_l = math.nan
        diverged = bool(summary.get("diverged", False))
        if measure_sharpness and not diverged and (folder / "params.npz").exists():
            num = Numerics(scn)
            params = load_params(folder, num.init_params())
            n = int(scn.figure.get("sharpness_samples", 1024))
            x, y = num.x_train[:n], num.y_train[:n]
            sh = lambda_max(num.model, params, x, y)
            sh_l = lambda_max(num.model, params, x, y, method="lanczos", max_iter=40)
        edge = 2 * math.sin(math.pi / (4 * tau + 2))
        rows.append({"tau": tau, "lr_rule": rule, "eta0": eta0, "eta": eta,
                     "updates": summary.get("updates"), "seed": scn.seed,
                     "final_train_loss": summary.get("final_train_loss"),
                     "final_test_error": summary.get("final_test_error"),
                     "diverged": diverged, "diverged_at": summary.get("diverged_at"),
                     "sharpness": sh, "sharpness_lanczos": sh_l,
                     "bound": edge / eta, "sync_bound": 2 / eta0,
                     "eta_lambda": eta * sh, "edge": edge, "folder": str(folder)})
    return pd.DataFrame(rows).sort_values(["lr_rule", "tau"]).reset_index(drop=True)


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    df = points(sweep_dir)
    eta0 = float(df["eta0"].iloc[0])
    fig, ax = plt.subplots(figsize=(5.8, 4.2), dpi=100)
    t = np.arange(0, int(df["tau"].max()) + 1)
    ax.plot(t + 1, 2 * np.sin(np.pi / (4 * t + 2)) / eta0, "--", color="C0", lw=1,
            label="bound at η0: 2 sin(π/(4τ+2))/η0")
    ax.plot(t + 1, np.full(t.shape, 2 / eta0), "--", color="C1", lw=1,
            label="bound with η_τ: 2/η0 (synchronous edge)")
    for rule, (label, color, marker) in RULES.items():
        g = df[df["lr_rule"] == rule]
        if g.empty:
            continue
        ok = g[~g["diverged"]]
        ax.plot(ok["tau"] + 1, ok["sharpness"], marker + "-", color=color, mfc="none",
                label=f"λ_max reached, {label}")
        bad = g[g["diverged"]]
        if not bad.empty:
            ax.plot(bad["tau"] + 1, bad["bound"], "x", color=color, ms=9, mew=2,
                    label=f"diverged ({label}), drawn at its bound")
    ax.set(xscale="log", yscale="log", xlabel="τ + 1 (workers, round robin)",
           ylabel="λ_max of the final parameters")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(f"P2-F4 minima selection (tanh MLP, MSE, full batch, η0 = {eta0:g})",
                 fontsize=9)
    fig.tight_layout()
    return save(fig, df.drop(columns=["folder"]) if "folder" in df else df, out_dir, NAME,
                sources=(sweep_dir,))
