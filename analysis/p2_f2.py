"""P2-F2: the stability edge vs delay τ (Giladi et al. 2020), closed form vs measured.

Quadratic points: the trace-only sweep of ``scenarios/p2_f2.toml`` measured each point's
fixed-delay trace for a grid of learning rates (``[measure] edges``; the sweep folder's
``edges.csv``, written by :func:`asyncsim.stability.measure.sweep_edges`: one compiled
program per schedule, the edge refined to 1e-3), and the measured edge ``η·λ`` is plotted
against τ with P2's closed form ``2 sin(π/(4τ+2))`` and the asymptote ``π/(2τ+1)``.

Network points (when P2-F4's sweep exists next to this one, ``figure.network_sweep``):
``η·λ_max`` of the final parameters of every P2-F4 run that did not diverge (η = η0 or
η_τ; what those runs measured, :mod:`analysis.p2_f4`), and, right panel, the sharpness
trajectory of the runs in ``figure.trajectories``, as they measured it along the way
(``measure.sharpness_points``; their ``sharpness.csv``), against the delayed edge
``2 sin(π/(4τ+2))/η``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from asyncsim import _checks
from asyncsim._io import DamagedFile, make_folder, save_figure, write_text
from asyncsim.errors import ScenarioError
from asyncsim.results import SHARPNESS_COLUMNS, RunFolder, SweepFolder
from asyncsim.runs import SHARPNESS_CSV
from asyncsim.stability.closed_form import asymptote, edge

from . import p2_f4
from ._common import add_caption, model_label, read_edges

NAME = "p2_f2"


def measured(sweep_dir: Path) -> pd.DataFrame:
    """tau, schedule, closed_form, measured, rel_error, staleness_mean, staleness_max for
    every point, from the sweep's ``edges.csv``."""
    df = read_edges(sweep_dir)
    df["rel_error"] = df["measured"] / df["closed_form"] - 1
    cols = ["tau", "schedule", "closed_form", "measured", "rel_error", "staleness_mean",
            "staleness_max"]
    return df[cols].sort_values(["schedule", "tau"]).reset_index(drop=True)


def _first_point(sweep_dir: Path) -> RunFolder | None:
    """The first point of the sweep that recorded its scenario (whose ``[figure]`` table is
    the sweep's)."""
    for run in SweepFolder(sweep_dir).points(complete=False):
        if run.file("scenario.toml").exists():
            return run
    return None


def _trajectories(key: str, v) -> list[tuple[int, str]]:
    """``[figure] trajectories``: a list of ``[tau, rule]`` pairs."""
    if not isinstance(v, list) or not all(isinstance(x, list) and len(x) == 2 for x in v):
        raise ScenarioError(key, f"must be a list of [tau, rule] pairs, got {v!r}")
    return [(_checks.integer(key, t, low=0), _checks.string(key, r)) for t, r in v]


def network_dir(sweep_dir: Path) -> Path | None:
    """P2-F4's sweep folder: ``figure.network_sweep``, a folder beside this sweep's
    (``p2_f4`` next to ``p2_f2``, ``p2_f4-smoke`` next to ``p2_f2-smoke``); None if absent."""
    first = _first_point(sweep_dir)
    name = None if first is None else first.value(
        "figure.network_sweep", None, lambda k, v: None if v is None else _checks.string(k, v))
    if not name:
        return None
    net = SweepFolder(sweep_dir).sibling(name, "figure.network_sweep").path
    return net if (net / "index.csv").exists() else None


def network_points(sweep_dir: Path) -> pd.DataFrame:
    """η·λ_max of every P2-F4 run that did not diverge, η the rate in effect at delay τ
    (η0, or η_τ with the stability-edge rule); empty when that sweep was not run (the same
    numbers as ``p2_f4.csv``)."""
    net = network_dir(sweep_dir)
    if net is None:
        return pd.DataFrame()
    df = p2_f4.points(net)
    return df[~df["diverged"]].copy()


def trajectory(folder: Path) -> pd.DataFrame:
    """The sharpness a P2-F4 run measured along the way (its ``sharpness.csv``): update,
    sharpness, train_loss (on the sharpness set), eta, tau, lr_rule, edge
    (2 sin(π/(4τ+2))), bound (edge/η), eta_lambda (η·λ_max)."""
    run = RunFolder(folder)
    if not run.file(SHARPNESS_CSV).exists():
        raise DamagedFile(f"{run.file(SHARPNESS_CSV)}: missing; its scenario measures no "
                          "sharpness along the run (measure.sharpness_points)")
    df = run.table(SHARPNESS_CSV, SHARPNESS_COLUMNS).rename(columns={"lr": "eta"})
    return df[["update", "sharpness", "train_loss", "eta", "tau", "lr_rule", "edge", "bound",
               "eta_lambda"]]


def network_trajectories(sweep_dir: Path) -> pd.DataFrame:
    """Trajectories of the P2-F4 runs listed in ``figure.trajectories`` (``[[tau, rule]]``)."""
    net = network_dir(sweep_dir)
    first = _first_point(sweep_dir)
    wanted = [] if first is None else first.value("figure.trajectories", [], _trajectories)
    if net is None or not wanted:
        return pd.DataFrame()
    f4 = p2_f4.points(net)
    frames = []
    for tau, rule in wanted:
        hit = f4[(f4["tau"] == tau) & (f4["lr_rule"] == rule) & ~f4["diverged"]]
        if not hit.empty:
            frames.append(trajectory(Path(hit["folder"].iloc[0])))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def edge_table(df: pd.DataFrame, net: pd.DataFrame, traj: pd.DataFrame) -> pd.DataFrame:
    """The figure's CSV: the quadratic points (:func:`measured`), then the network's final
    parameters (:func:`network_points`) and the second half of its trajectories
    (:func:`network_trajectories`: mean, min and max of η·λ_max), each beside the closed
    form at its delay."""
    table = df.assign(source="quadratic")
    if not net.empty:
        table = pd.concat([table, pd.DataFrame({
            "tau": net["tau"], "schedule": "round-robin",
            "source": "mlp final params, " + net["lr_rule"],
            "closed_form": [float(edge(t)) for t in net["tau"]],
            "measured": net["eta_lambda"],
            "rel_error": net["eta_lambda"] / net["edge"] - 1})], ignore_index=True)
    if not traj.empty:
        last = traj.groupby(["tau", "lr_rule"])["update"].transform("max")
        tail = traj[traj["update"] >= 0.5 * last]
        agg = tail.groupby(["tau", "lr_rule"])["eta_lambda"].agg(
            ["mean", "min", "max"]).reset_index()
        table = pd.concat([table, pd.DataFrame({
            "tau": agg["tau"], "schedule": "round-robin",
            "source": "mlp trajectory 2nd half, " + agg["lr_rule"],
            "closed_form": [float(edge(t)) for t in agg["tau"]],
            "measured": agg["mean"], "measured_min": agg["min"], "measured_max": agg["max"],
            "rel_error": agg["mean"] / [float(edge(t)) for t in agg["tau"]] - 1})],
            ignore_index=True)
    return table


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    df = measured(sweep_dir)
    net = network_points(sweep_dir)
    traj = network_trajectories(sweep_dir)
    out_dir = make_folder(out_dir)
    table = edge_table(df, net, traj)
    ncols = 2 if not traj.empty else 1
    fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 4.2), dpi=100, squeeze=False)
    ax = axes[0, 0]
    t = np.arange(0, int(df["tau"].max()) + 1)
    ax.plot(t + 1, edge(t), "k-", lw=1.5, label="closed form 2 sin(π/(4τ+2))")
    tt = t[t >= 1]
    ax.plot(tt + 1, asymptote(tt), "k:", lw=1, label="asymptote π/(2τ+1)")
    style = {"round-robin": ("o", "C0", "round robin"), "random": ("s", "C1", "random"),
             "normal": ("^", "C2", "normal (official Φ draw)"),
             "race": ("v", "C5", "race (not P2's: normal step times)")}
    for sched, g in df.groupby("schedule", sort=False):
        m, c, lab = style.get(sched, ("d", "C3", sched))
        ax.plot(g["tau"] + 1, g["measured"], m, color=c, mfc="none",
                label=f"measured, quadratic, {lab}")
    if not net.empty:
        for rule, m, c, ms, lab in (
                ("stability-edge", "s", "C4", 10, "MLP: η_τ·λ_max of final params"),
                ("constant", "*", "C3", 8, "MLP: η0·λ_max of final params (η0 = const)")):
            g = net[net["lr_rule"] == rule]
            if not g.empty:
                ax.plot(g["tau"] + 1, g["eta_lambda"], m, color=c, ms=ms, label=lab,
                        mfc="none" if rule == "stability-edge" else c, zorder=3)
    ax.set(xscale="log", yscale="log", xlabel="τ + 1 (workers N)",
           ylabel="largest stable η·λ_max")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("P2-F2 stability edge vs delay", fontsize=9)
    if not traj.empty:
        ax2 = axes[0, 1]
        for i, ((tau, rule), g) in enumerate(traj.groupby(["tau", "lr_rule"], sort=True)):
            c = f"C{i}"
            eta = float(g["eta"].iloc[0])
            lab = f"τ = {tau}, η = {eta:.3g}" + (" (η_τ)" if rule == "stability-edge" else "")
            ax2.plot(g["update"], g["sharpness"], "-", color=c, lw=1.2, label=lab)
            ax2.axhline(float(g["bound"].iloc[0]), color=c, ls="--", lw=1)
        ax2.set(xlabel="update", ylabel="λ_max (full training set)", yscale="log")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=7, title="dashed: 2 sin(π/(4τ+2))/η", title_fontsize=7)
        ax2.set_title("MLP sharpness during training (P2-F4 runs, replayed)", fontsize=9)
    fig.tight_layout()
    net_dir = network_dir(sweep_dir) if not net.empty else None
    add_caption(fig, sweep_dir, *([net_dir] if net_dir is not None else []),
                note="Quadratic points: each run's trace executed by "
                     "asyncsim.stability.measured (delayed GD on the "
                     f"{model_label(sweep_dir)} model, edge bisected)."
                     + (" MLP points: the P2-F4 runs (after |)." if net_dir
                        else ""))
    # Written once everything it reads has been read (the caption too): a damaged run
    # folder leaves no half of the figure's files.
    png, csv = out_dir / f"{NAME}.png", out_dir / f"{NAME}.csv"
    save_figure(fig, png, bbox_inches="tight")
    plt.close(fig)
    write_text(csv, table.to_csv(index=False))
    written = [png, csv]
    if not traj.empty:
        written.append(out_dir / f"{NAME}_trajectories.csv")
        write_text(written[-1], traj.to_csv(index=False))
    return written
