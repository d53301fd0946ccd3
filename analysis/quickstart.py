"""The quickstart figure: test error vs simulated time, and the staleness histogram.

Reads one run folder (``eval.csv``, the trace, ``summary.json``); never reruns anything.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from asyncsim._io import read_csv, read_json, read_toml
from asyncsim.config import rule_label
from asyncsim.trace import Trace

from ._common import add_caption

NAME = "quickstart"
DRAWS = "run"  # one run folder (the figures of sweeps leave this at its default, "sweep")


def draw(run_dir: Path, out_dir: Path) -> list[Path]:
    evals = read_csv(run_dir / "eval.csv")
    trace = Trace.load(run_dir)
    summary = read_json(run_dir / "summary.json")
    scn = read_toml(run_dir / "scenario.toml")
    hist = trace.staleness_histogram()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    a.plot(evals["sim_time"], evals["test_error"], marker="o", ms=3)
    a.set_xlabel("simulated time")
    a.set_ylabel("test error")
    a.set_ylim(0, 1)
    a.grid(alpha=0.3)
    b.bar(hist["staleness"], hist["freq"])
    b.set_xlabel("staleness τ")
    b.set_ylabel("fraction of gradients")
    b.set_title(f"mean {summary['staleness_mean']:.2f}, max {summary['staleness_max']}",
                fontsize=9)
    proto = scn["protocol"]
    fig.suptitle(
        f"{scn['name']}: {scn['cluster']['learners']} learners, {proto['kind']}"
        f"{' n=' + str(proto['n']) if 'n' in proto else ''}, lr rule "
        f"{rule_label(scn['optimizer']['lr_rule'])}, {scn['model']['name']} on "
        f"{scn['data']['name']} "
        f"({summary['epochs']:.1f} epochs, seed {scn['seed']})", fontsize=8)
    fig.tight_layout()
    add_caption(fig, run_dir)
    png, csv = out_dir / f"{NAME}.png", out_dir / f"{NAME}.csv"
    fig.savefig(png, dpi=100, bbox_inches="tight")
    plt.close(fig)
    evals.to_csv(csv, index=False)
    return [png, csv]
