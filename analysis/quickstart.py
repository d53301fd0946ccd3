"""The quickstart figure: test error vs simulated time, and the staleness histogram.

Reads one run folder (``eval.csv``, the trace, ``summary.json``); never reruns anything.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from asyncsim._io import save_figure, write_text
from asyncsim.config import rule_label
from asyncsim.results import RunFolder

from ._common import caption_text, footer_height, protocol_n

NAME = "quickstart"
DRAWS = "run"  # one run folder (the figures of sweeps leave this at its default, "sweep")


WIDTH, HEIGHT = 9.0, 3.4  # inches of the two panels, the footer comes below


def draw(run_dir: Path, out_dir: Path) -> list[Path]:
    fig, evals = figure(run_dir)
    png, csv = out_dir / f"{NAME}.png", out_dir / f"{NAME}.csv"
    save_figure(fig, png, dpi=100)
    plt.close(fig)
    write_text(csv, evals.to_csv(index=False))
    return [png, csv]


def figure(run_dir: Path):
    """The figure of ``run_dir`` (laid out, not drawn) and the eval table it plots."""
    run = RunFolder(run_dir)
    evals, scn = run.evals, run.recorded
    mean, most, epochs = (run.summary_value(k) for k in ("staleness_mean", "staleness_max",
                                                            "epochs"))
    n = protocol_n(run)
    hist = run.trace.staleness_histogram()
    # `asyncsim run` waits for this figure, so it is drawn in one pass (0.10 s, against
    # 0.15 s with tight_layout and bbox_inches="tight": each lays the text out in a pass of
    # its own). Its layout is fixed, in inches: both panels' y axes span [0, 1], so their
    # tick labels are short; the title's lines and the footer's are counted; the footer's
    # room is reserved on the canvas, not found by bbox_inches="tight".
    caption = caption_text(run_dir, width_in=WIDTH)
    foot = footer_height(caption)
    tall = HEIGHT + foot
    fig, (a, b) = plt.subplots(1, 2, figsize=(WIDTH, tall))
    a.plot(evals["sim_time"], evals["test_error"], marker="o", ms=3)
    a.set_xlabel("simulated time")
    a.set_ylabel("test error")
    a.set_ylim(0, 1)
    a.grid(alpha=0.3)
    b.bar(hist["staleness"], hist["freq"])
    b.set_xlabel("staleness τ")
    b.set_ylabel("fraction of gradients")
    b.set_title(f"mean {mean:.2f}, max {most}", fontsize=9)
    title = (f"{scn['name']}: {scn['cluster']['learners']} learners, "
             f"{scn['protocol']['kind']}{'' if n is None else f' n={n}'}, lr rule "
             f"{rule_label(scn['optimizer']['lr_rule'])}, {scn['model']['name']} on "
             f"{scn['data']['name']} ({epochs:.1f} epochs, seed {scn['seed']})")
    # Wrapped to the canvas (8 pt: ~140 characters in 9 inches), which does not grow.
    title = textwrap.fill(title, 140)
    fig.suptitle(title, fontsize=8)
    fig.subplots_adjust(left=0.7 / WIDTH, right=1 - 0.1 / WIDTH, bottom=(foot + 0.55) / tall,
                        top=1 - (0.5 + 0.16 * title.count("\n")) / tall, wspace=0.22)
    if caption:
        fig.text(0.01, (foot - 0.06) / tall, caption, fontsize=7, ha="left",
                 va="top", color="0.3")
    return fig, evals
