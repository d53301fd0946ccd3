"""``asyncsim stability``: P2's stability edges as a table (and optionally a figure).

Without ``--measure`` it prints the closed forms of :mod:`asyncsim.stability` (raw and
effective edge, large-τ asymptote). With ``--measure`` each (τ, momentum, β) is also measured
by simulation on a quadratic (:func:`asyncsim.stability.measured.find_edges`: fixed-delay
timing, the shared update core, a vmapped grid of learning rates) and the relative error is
printed. ``--sharpness S`` (a loss's λ_max) adds each edge as a learning rate, edge / S.
``--trace RUN_DIR`` measures the edge of that run's own staleness, which is random, where
the closed forms hold for a constant delay (:func:`asyncsim.stability.measured.run_edges`).
``--figure PNG`` draws edge vs τ on log-log axes with the 1/τ asymptote.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from asyncsim import runs
from asyncsim._checks import choice, integer, positive
from asyncsim._io import save_figure
from asyncsim.errors import ScenarioError
from asyncsim.stability.closed_form import MOMENTUM_KINDS, asymptote, edge_table
from asyncsim.trace import MAX_LEARNERS

# What the columns are (printed under the table).
LEGEND = ("closed_form: the largest stable eta*lambda at constant delay tau (P2); "
          "effective_edge: the same on the effective rate eta/(1-beta) of heavy-ball, shifted "
          "and nesterov momentum, the scale P2 compares kinds on; asymptote: the large-tau "
          "form of closed_form (pi/(2tau+1) plain, (1-beta)pi/(2tau) heavy-ball and nesterov, "
          "pi/(2tau) dampened, sqrt(1-beta^2)arccos(beta)/(tau+1) shifted), not defined "
          "(NaN) at tau = 0 for momentum")


def _check(args):
    """Refuse bad arguments in one line; the ``--trace`` run folder, once it is usable."""
    try:
        for t in args.tau:
            integer("--tau", t, low=0)
            if args.measure and t >= MAX_LEARNERS:  # P2's tau + 1 workers, simulated
                raise ScenarioError("--tau", f"--measure simulates tau + 1 workers: at most "
                                    f"{MAX_LEARNERS - 1}, got {t}")
        for m in args.momentum:
            choice("--momentum", m, MOMENTUM_KINDS, what="kind")
    except ScenarioError as e:
        raise e.with_file("asyncsim stability") from None
    for b in args.beta:
        if not abs(b) < 1:
            raise ScenarioError("--beta", f"must satisfy |beta| < 1, got {b}",
                                file="asyncsim stability")
    if args.sharpness is not None:
        try:
            positive("--sharpness", args.sharpness, finite=True)
        except ScenarioError as e:
            raise e.with_file("asyncsim stability") from None
    if args.figure:
        runs.output_file(args.figure, flag="--figure", verb="stability")
    return _run_trace(args.trace) if args.trace else None  # before any table is printed


def _run_trace(path):
    """The run folder of ``--trace``, once :func:`check_run_trace` takes its trace (a
    damaged or edited trace is the reader's own one-line error)."""
    from asyncsim.results import open_run
    from asyncsim.stability.measured import check_run_trace

    run = open_run(path)
    trace = run.trace
    try:
        check_run_trace(trace)
    except ValueError as e:
        raise ScenarioError("--trace", f"{path}: {e}", file="asyncsim stability") from None
    return run


def stability_table(taus, momenta, betas, *, measure: bool = False) -> pd.DataFrame:
    """Closed-form edges (and measured ones with ``measure``), one row per (τ, kind, β)."""
    table = edge_table(taus, momenta, betas).rename(columns={"edge": "closed_form"})
    if not measure:
        return table
    # Imported only with --measure: the measured edges run JAX programs, which the
    # closed-form table should not wait ~1.5 s to import.
    from asyncsim.stability.measured import edge_comparison

    meas = edge_comparison(list(taus), momenta, betas)
    table = table.merge(meas[["tau", "momentum", "beta", "measured", "rel_error"]],
                        on=["tau", "momentum", "beta"], how="left")
    return table


def draw_edges(table: pd.DataFrame, path: str | Path) -> Path:
    """Edge vs τ (log-log), one line per (kind, β), measured points as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4), dpi=110)
    for (kind, beta), g in table.groupby(["momentum", "beta"], sort=False):
        g = g.sort_values("tau")
        x = g["tau"].to_numpy() + 1  # τ + 1 so τ = 0 fits on a log axis
        label = kind if kind == "none" else f"{kind} β={beta:g}"
        (line,) = ax.plot(x, g["closed_form"], label=label)
        if "measured" in g:
            ax.plot(x, g["measured"], "o", color=line.get_color(), mfc="none")
    t = np.geomspace(1, max(table["tau"].max(), 1), 100)
    ax.plot(t + 1, asymptote(t), "k:", lw=1, label="π/(2τ+1)")
    ax.set(xscale="log", yscale="log", xlabel="τ + 1", ylabel="edge η·λ_max")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = save_figure(fig, path)
    plt.close(fig)
    return path


def stability_command(args) -> int:
    """Entry point of the CLI verb (args: tau, momentum, beta, measure, figure)."""
    run = _check(args)
    table = stability_table(args.tau, args.momentum, args.beta, measure=args.measure)
    cols = ["tau", "momentum", "beta", "closed_form", "effective_edge", "asymptote"]
    if args.measure:
        cols += ["measured", "rel_error"]
    if args.sharpness is not None:
        table["lr_edge"] = table["measured" if args.measure else "closed_form"] / args.sharpness
        cols.append("lr_edge")
    _print(table[cols])
    print(textwrap.fill(LEGEND + ("; lr_edge: the largest stable learning rate at that "
                                  f"delay for lambda_max = {args.sharpness:g}, "
                                  f"{'measured' if args.measure else 'closed_form'} / "
                                  "lambda_max" if args.sharpness is not None else ""),
                        width=100))
    if run is not None:
        print()
        _run_edges(args, run)
    if args.figure:
        print(f"figure: {draw_edges(table, args.figure)}")
    return 0


def _print(table: pd.DataFrame) -> None:
    with pd.option_context("display.width", 120, "display.max_rows", 10_000):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.6g}"))


def _run_edges(args, run) -> None:
    """The ``--trace RUN_DIR`` table: the edge measured on the run's own trace."""
    from asyncsim.stability.measured import run_edges

    table = run_edges(run.scenario, run.trace, args.momentum, args.beta)
    cols = ["momentum", "beta", "measured", "closed_form_at_mean", "closed_form_at_max",
            "measured_over_mean"]
    if args.sharpness is not None:
        table["lr_edge"] = table["measured"] / args.sharpness
        cols.append("lr_edge")
    first = table.iloc[0]
    print(textwrap.fill(f"{args.trace}: staleness mean {first['staleness_mean']:.3g}, max "
                        f"{first['staleness_max']}; the edge of this staleness, measured on "
                        f"the run's own trace ({run.trace.num_updates} updates of delayed GD "
                        "on a quadratic):", width=100))
    _print(table[cols])
    print(textwrap.fill(
        "Its staleness is random, and P2's closed forms hold for a constant delay: "
        "closed_form_at_mean and closed_form_at_max are the edges of constant delays at its "
        "mean (rounded) and its largest staleness; measured is the edge that applies to this "
        "run's timing (docs/p2.md)", width=100))
