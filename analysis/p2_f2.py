"""P2-F2: the stability edge vs delay τ (Giladi et al. 2020), closed form vs measured.

Quadratic points: reads the trace-only sweep of ``scenarios/p2_f2.toml``: each point's saved
fixed-delay trace (no timing is re-simulated) is executed for a grid of learning rates by
the vmapped scan executor of :mod:`asyncsim.edges` (one compiled program per schedule,
refined to 1e-3), and the measured edge ``η·λ`` is plotted against τ with P2's closed form
``2 sin(π/(4τ+2))`` and the asymptote ``π/(2τ+1)``.

Network points (when P2-F4's sweep exists next to this one, ``figure.network_sweep``):
``η·λ_max`` of the final parameters of every P2-F4 run that did not diverge (η = η0 or
η_τ), and, right panel, the sharpness trajectory of the runs in ``figure.trajectories``:
each run's saved trace is replayed through the shared update core (bit-identical to the
run, checked by ``param_hash``) with λ_max measured every ``updates / trajectory_points``
updates, against its delayed edge ``2 sin(π/(4τ+2))/η``.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_caption, finished_points, model_label  # noqa: E402

NAME = "p2_f2"


def _sweep_scenarios(sweep_dir: Path):
    from asyncsim.scenario import load_scenario
    from asyncsim.trace import Trace

    out = []
    for folder in finished_points(sweep_dir):
        scn = load_scenario(tomllib.loads((folder / "scenario.toml").read_text()))
        out.append((scn, Trace.load(folder)))
    return out


def measured(sweep_dir: Path) -> pd.DataFrame:
    """tau, schedule, closed_form, measured, rel_error, staleness_mean for every point."""
    from asyncsim.edges import edges_of_traces
    from asyncsim.stability import edge

    items = _sweep_scenarios(sweep_dir)
    rows = []
    for sched in dict.fromkeys(s.protocol.schedule for s, _ in items):
        group = [(s, t) for s, t in items if s.protocol.schedule == sched]
        big = max(group, key=lambda st: st[0].protocol.tau)[0]
        meas = edges_of_traces(big, [t for _, t in group])
        for (s, t), m in zip(group, meas, strict=True):
            tau = int(s.protocol.tau)
            cf = float(edge(tau))
            rows.append({"tau": tau, "schedule": sched, "closed_form": cf,
                         "measured": float(m), "rel_error": float(m / cf - 1),
                         "staleness_mean": float(t.staleness.mean()),
                         "staleness_max": int(t.staleness.max())})
    return pd.DataFrame(rows).sort_values(["schedule", "tau"]).reset_index(drop=True)


def _figure_cfg(sweep_dir: Path) -> dict:
    """The ``[figure]`` table the sweep ran with (its first point's scenario.toml)."""
    index = pd.read_csv(Path(sweep_dir) / "index.csv")
    for point in index["point"]:
        f = Path(sweep_dir) / point / "scenario.toml"
        if f.exists():
            return dict(tomllib.loads(f.read_text()).get("figure", {}))
    return {}


def network_dir(sweep_dir: Path) -> Path | None:
    """P2-F4's sweep folder: ``figure.network_sweep`` relative to this sweep's parent folder
    (``p2_f4`` next to ``p2_f2``, ``p2_f4-smoke`` next to ``p2_f2-smoke``); None if absent."""
    name = _figure_cfg(sweep_dir).get("network_sweep")
    if not name:
        return None
    net = Path(sweep_dir).parent / name
    return net if (net / "index.csv").exists() else None


@functools.cache
def _load_f4():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "asyncsim_analysis_p2_f4_for_f2", Path(__file__).resolve().parent / "p2_f4.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def network_points(sweep_dir: Path) -> pd.DataFrame:
    """η·λ_max of every P2-F4 run that did not diverge, η the rate in effect at delay τ
    (η0, or η_τ with the stability-edge rule); empty when that sweep was not run. Measured
    by ``analysis/p2_f4.py``'s :func:`points` (the same numbers as ``p2_f4.csv``)."""
    net = network_dir(sweep_dir)
    if net is None:
        return pd.DataFrame()
    df = _load_f4().points(net)
    return df[~df["diverged"]].copy()


def trajectory(folder: Path, *, n_points: int = 40, samples: int | None = None,
               lanczos_steps: int = 30) -> pd.DataFrame:
    """Sharpness along a finished run: replays its saved trace through the shared core.

    Loads the run folder's scenario and trace, executes every update with
    :meth:`asyncsim.engine.Numerics.update` (the call the online driver and replay make,
    so the parameters are bit-identical to the run's: the final ``param_hash`` is checked
    against ``summary.json``), and every ``updates / n_points`` updates measures λ_max of the
    mean loss on the first ``samples`` training examples (default: the figure's
    ``sharpness_samples``) by ``lanczos_steps``-step Lanczos (residual tol 1e-4;
    :func:`asyncsim.sharpness.sharpness`'s algorithm with a cached HVP).

    Returns:
        DataFrame: update, sharpness, train_loss (on the sharpness set), eta, tau, lr_rule,
        edge (2 sin(π/(4τ+2))), bound (edge/η), eta_lambda (η·λ_max).
    """
    from asyncsim.engine import Numerics
    from asyncsim.replayer import replay
    from asyncsim.scenario import load_scenario
    from asyncsim.trace import Trace

    f4 = _load_f4()
    folder = Path(folder)
    scn = load_scenario(tomllib.loads((folder / "scenario.toml").read_text()))
    summary = json.loads((folder / "summary.json").read_text())
    trace = Trace.load(folder)
    num = Numerics(scn)
    n = int(samples or scn.figure.get("sharpness_samples", 1024))
    xs, ys = num.x_train[:n], num.y_train[:n]
    tau, rule = int(scn.protocol.tau), scn.optimizer.lr_rule
    eta = float(f4.eta_of(scn.optimizer.lr, tau, rule))
    edge = 2 * math.sin(math.pi / (4 * tau + 2))
    every = max(1, trace.num_updates // n_points)
    rows = []

    def log(v, params):
        loss = float(num.model.loss(params, xs, ys))
        sh = (f4.lambda_max(num.model, params, xs, ys, method="lanczos",
                            max_iter=lanczos_steps, tol=1e-4)
              if math.isfinite(loss) else math.nan)
        rows.append({"update": v, "sharpness": sh, "train_loss": loss, "eta": eta, "tau": tau,
                     "lr_rule": rule, "edge": edge, "bound": edge / eta,
                     "eta_lambda": eta * sh})

    log(0, num.init_params())
    # The run's own trace through the shared replay: bit-identical to the run.
    res = replay(scn, trace, numerics=num, observe=lambda v, st: log(v, st.params),
                 observe_every=every)
    if not summary.get("diverged") and res.summary["param_hash"] != summary.get("param_hash"):
        raise RuntimeError(f"{folder}: replayed parameters differ from the run's param_hash")
    return pd.DataFrame(rows)


def network_trajectories(sweep_dir: Path) -> pd.DataFrame:
    """Trajectories of the P2-F4 runs listed in ``figure.trajectories`` (``[[tau, rule]]``)."""
    net = network_dir(sweep_dir)
    cfg = _figure_cfg(sweep_dir)
    if net is None or not cfg.get("trajectories"):
        return pd.DataFrame()
    f4 = _load_f4().points(net, measure_sharpness=False)
    frames = []
    for tau, rule in cfg["trajectories"]:
        hit = f4[(f4["tau"] == int(tau)) & (f4["lr_rule"] == rule) & ~f4["diverged"]]
        if hit.empty:
            continue
        frames.append(trajectory(Path(hit["folder"].iloc[0]),
                                 n_points=int(cfg.get("trajectory_points", 40))))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    from asyncsim.stability import asymptote, edge

    df = measured(sweep_dir)
    net = network_points(sweep_dir)
    traj = network_trajectories(sweep_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
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
        traj.to_csv(out_dir / f"{NAME}_trajectories.csv", index=False)
    csv = out_dir / f"{NAME}.csv"
    table.to_csv(csv, index=False)
    ncols = 2 if not traj.empty else 1
    fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 4.2), dpi=100, squeeze=False)
    ax = axes[0, 0]
    t = np.arange(0, int(df["tau"].max()) + 1)
    ax.plot(t + 1, edge(t), "k-", lw=1.5, label="closed form 2 sin(π/(4τ+2))")
    tt = t[t >= 1]
    ax.plot(tt + 1, asymptote(tt), "k:", lw=1, label="asymptote π/(2τ+1)")
    style = {"round-robin": ("o", "C0"), "random": ("s", "C1"), "normal": ("^", "C2")}
    for sched, g in df.groupby("schedule", sort=False):
        m, c = style.get(sched, ("d", "C3"))
        ax.plot(g["tau"] + 1, g["measured"], m, color=c, mfc="none",
                label=f"measured, quadratic, {sched}")
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
                note=f"Quadratic points: each run's trace executed by asyncsim.edges (delayed GD "
                     f"on the {model_label(sweep_dir)} model, edge bisected)."
                     + (" MLP points: the P2-F4 runs (after |)." if net_dir
                        else ""))
    png = out_dir / f"{NAME}.png"
    fig.savefig(png, bbox_inches="tight")
    plt.close(fig)
    return [png, csv]
