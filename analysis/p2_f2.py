"""P2-F2: the stability edge vs delay τ (Giladi et al. 2020), closed form vs measured.

Reads the trace-only sweep of ``scenarios/p2_f2.toml``: each point's saved fixed-delay trace
(no timing is re-simulated) is executed for a grid of learning rates by the vmapped scan
executor of :mod:`asyncsim.edges` (one compiled program per schedule, refined to 1e-3), and
the measured edge ``η·λ`` is plotted against τ with P2's closed form ``2 sin(π/(4τ+2))``
and the asymptote ``π/(2τ+1)``. Network points: when the P2-F4 sweep exists
(``figure.network_sweep``), ``η·λ_max`` of the minimum the MLP reached at constant η, for
runs that did not diverge (linear stability bounds it by the edge).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

NAME = "p2_f2"


def _sweep_scenarios(sweep_dir: Path):
    from asyncsim.scenario import load_scenario
    from asyncsim.trace import Trace

    index = pd.read_csv(Path(sweep_dir) / "index.csv")
    out = []
    for _, r in index.iterrows():
        folder = Path(sweep_dir) / r["point"]
        if not (folder / "summary.json").exists():
            continue
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


def network_points(sweep_dir: Path) -> pd.DataFrame:
    """η·λ_max of P2-F4's constant-η minima (empty when that sweep was not run)."""
    cfg = tomllib.loads((Path(__file__).resolve().parent.parent / "scenarios" /
                         f"{NAME}.toml").read_text()).get("figure", {})
    net = Path(cfg.get("network_sweep", "runs/p2_f4"))
    if not (net / "index.csv").exists():
        return pd.DataFrame()
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "p2_f4", Path(__file__).resolve().parent / "p2_f4.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    df = mod.points(net)
    df = df[(df["lr_rule"] == "constant") & ~df["diverged"]].copy()
    df["eta_lambda"] = df["eta"] * df["sharpness"]
    return df


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    from asyncsim.stability import asymptote, edge

    df = measured(sweep_dir)
    net = network_points(sweep_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = df.assign(source="quadratic")
    if not net.empty:
        table = pd.concat([table, pd.DataFrame({
            "tau": net["tau"], "schedule": "round-robin", "source": "mlp (P2-F4, constant η)",
            "closed_form": [float(edge(t)) for t in net["tau"]],
            "measured": net["eta_lambda"]})], ignore_index=True)
    csv = out_dir / f"{NAME}.csv"
    table.to_csv(csv, index=False)
    fig, ax = plt.subplots(figsize=(5.5, 4), dpi=100)
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
        ax.plot(net["tau"] + 1, net["eta_lambda"], "*", color="C3", ms=9,
                label="MLP: η·λ_max reached (constant η)")
    ax.set(xscale="log", yscale="log", xlabel="τ + 1 (workers N)",
           ylabel="largest stable η·λ_max")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("P2-F2 stability edge vs delay", fontsize=9)
    fig.tight_layout()
    png = out_dir / f"{NAME}.png"
    fig.savefig(png)
    plt.close(fig)
    return [png, csv]
