"""P1-F2: speedup vs number of learners at constant mu*lambda.

For each run, the simulated wall-clock time to reach the target test error
(``[figure] target_test_error`` of the run's scenario) is read off its ``eval.csv``: the first
evaluation at or below the target, linearly interpolated in simulated time from the one
before it. Speedup = that time at lambda = 1 (hardsync, the one-learner baseline) divided by
the time at lambda. A run that never reaches the target has no speedup (NaN, reported).

Link models: each run's PS interface (``cluster.network.ps_ingress`` / ``ps_egress`` of its
resolved scenario) names its link model, ``private links`` (none, or both unlimited: the
learners' own links only) or ``shared PS interface X Gb/s, SHARING``; each link model is
one panel and its own baseline (its lambda = 1 hardsync run).

Outputs: ``NAME.png`` (one panel per link model: speedup vs lambda, with the ideal line and
P1's 22-28x at 30), ``NAME.csv`` (every plotted point: link model, PS bandwidth, protocol,
lambda, mu, compute mean, time to target, epochs to target, simulated time per epoch,
speedup, seeds).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from asyncsim import _checks
from asyncsim.errors import ScenarioError

from ._common import data_size, figure_target, load_points, save, time_to_target

NAME = "p1_f2_speedup"


def _span_of_two(key: str, v) -> list[float]:
    """``[low, high]``: the range P1 reports (``[figure] paper_speedup_at_30``)."""
    if not (isinstance(v, list) and len(v) == 2):
        raise ScenarioError(key, f"must be a list of two numbers [low, high], got {v!r}")
    return [_checks.finite(key, x) for x in v]


def _optional_mean(key: str, v) -> float | None:
    return None if v is None else _checks.positive(key, v, finite=True)


def link_model(scn: dict) -> tuple[float, str]:
    """``(PS bandwidth in bytes/s, label)`` of a run's PS interface, from its resolved
    scenario: ``(inf, "private links")`` when neither direction is limited; otherwise the
    narrower direction's bandwidth and e.g. ``"shared PS interface 10 Gb/s, fair"`` (both
    directions named when they differ)."""
    net = scn.get("cluster", {}).get("network", {})
    sides = [net.get(k) or {} for k in ("ps_ingress", "ps_egress")]
    bws = [float(side.get("bandwidth", math.inf)) for side in sides]
    if all(math.isinf(b) for b in bws):
        return math.inf, "private links"

    def rate(side: dict, b: float) -> str:
        if math.isinf(b):
            return "unlimited"
        return f"{b * 8 / 1e9:g} Gb/s, {side.get('sharing', 'fair')}"

    (ing, eg), (b_in, b_out) = sides, bws
    text = (rate(ing, b_in) if (b_in, ing.get("sharing")) == (b_out, eg.get("sharing"))
            else f"in {rate(ing, b_in)} / out {rate(eg, b_out)}")
    return min(bws), f"shared PS interface {text}"


def draw(sweep_dir: Path, out_dir: Path) -> list[Path]:
    # Trace-only points (`asyncsim trace` of this scenario) still give the time per epoch.
    points = load_points(Path(sweep_dir), trace_only_ok=True)
    first = points["run"].iloc[0]
    target = figure_target(points, 0.5)
    paper = first.value("figure.paper_speedup_at_30", [22, 28], _span_of_two)
    rows = []
    for _, p in points.iterrows():
        s, run = p["summary"], p["run"]
        t, ep = (time_to_target(run.evals, target) if p["has_eval"]
                 else (float("nan"), float("nan")))
        n_train = data_size(run, "n_train")
        samples = s.get("gradients", 0) * int(p["batch_size"])
        label = "hardsync" if p["protocol"] == "hardsync" else "λ-softsync, α0/τ"
        ps_bw, link = link_model(p["scenario"])
        rows.append({"link": link, "ps_bandwidth": ps_bw, "protocol": label,
                     "learners": int(p["learners"]),
                     "batch_size": int(p["batch_size"]), "seed": p["seed"],
                     "compute_mean_s": run.value("cluster.compute.mean", None, _optional_mean),
                     "time_to_target": t, "epochs_to_target": ep,
                     # per epoch = per n_train samples actually applied (a trace-only point
                     # has no epoch count in its summary)
                     "sim_time_per_epoch": run.summary_value("sim_time") / samples * n_train
                     if samples and n_train else float("nan"),
                     "final_test_error": s.get("final_test_error"),
                     "diverged": bool(s.get("diverged")),
                     "staleness_mean": s.get("staleness_mean")})
    keys = ["link", "protocol", "learners"]
    df = pd.DataFrame(rows)
    df = (df.groupby(keys, sort=True)
          .agg(ps_bandwidth=("ps_bandwidth", "first"), batch_size=("batch_size", "first"),
               compute_mean_s=("compute_mean_s", "first"),
               time_to_target=("time_to_target", "mean"),
               epochs_to_target=("epochs_to_target", "mean"),
               sim_time_per_epoch=("sim_time_per_epoch", "mean"),
               final_test_error=("final_test_error", "mean"),
               staleness_mean=("staleness_mean", "mean"),
               diverged=("diverged", "sum"), seeds=("seed", "nunique")).reset_index())
    # Each link model's baseline: its own lambda = 1 hardsync run (NaN where it has none).
    base = df[(df["learners"] == 1) & (df["protocol"] == "hardsync")].set_index("link")
    df["speedup"] = df["link"].map(base["time_to_target"]) / df["time_to_target"]
    # Throughput-only speedup (time per epoch): what the timing model alone gives.
    df["speedup_per_epoch"] = (df["link"].map(base["sim_time_per_epoch"])
                               / df["sim_time_per_epoch"])
    df["target_test_error"] = target
    # lambda = 1 softsync is hardsync (c = 1, tau = 0): draw the baseline on both curves.
    soft1 = df[(df["learners"] == 1) & (df["protocol"] == "hardsync")].assign(
        protocol="λ-softsync, α0/τ")
    # Link models in order of PS bandwidth, private (inf) first.
    df = (pd.concat([df, soft1], ignore_index=True).drop_duplicates(keys)
          .sort_values(["ps_bandwidth", "protocol", "learners"],
                       ascending=[False, True, True]).reset_index(drop=True))

    links = list(dict.fromkeys(df["link"]))
    fig, axes = plt.subplots(1, len(links), figsize=(5.5 * len(links), 4.5), sharey=True,
                             squeeze=False)
    lams = np.array(sorted(df["learners"].unique()))
    styles = {"hardsync": ("C0", "o"), "λ-softsync, α0/τ": ("C1", "s")}
    for ax, link in zip(axes[0], links, strict=True):
        ax.plot(lams, lams, color="0.7", ls=":", label="ideal (λ×)")
        for proto, d in df[df["link"] == link].groupby("protocol"):
            color, m = styles.get(proto, (None, "^"))
            ax.plot(d["learners"], d["speedup"], marker=m, color=color,
                    label=f"{proto}: time to target")
            ax.plot(d["learners"], d["speedup_per_epoch"], marker=m, color=color, ls="--",
                    alpha=0.5, label=f"{proto}: time per epoch")
        ax.errorbar([30], [np.mean(paper)], yerr=[[np.mean(paper) - paper[0]],
                    [paper[1] - np.mean(paper)]], fmt="k*", ms=9, capsize=4,
                    label="P1: 22–28× at 30")
        ax.set_xlabel("learners λ (μ = 128/λ)")
        ax.set_title(link, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("speedup over λ = 1 (same link model)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"P1-F2: simulated time to test error ≤ {target:.2f}", fontsize=10)
    fig.tight_layout()
    return save(fig, df, out_dir, NAME, sources=(sweep_dir,))
