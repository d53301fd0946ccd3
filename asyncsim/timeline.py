"""``asyncsim timeline RUN_DIR``: a Gantt chart of a run, from its trace alone.

Per learner, the intervals its gradients spent (read from the trace's gradient rows, which
every run folder holds -- simulated, replayed or real):

* ``pull``    -- ``t_pull`` (the PS served the pull: the version was read) to ``t_start``
  (the learner started computing); only real runs record ``t_start``. A simulated trace
  records no compute start, so there its pull latency is inside ``compute``
  (``pull+compute``).
* ``compute`` -- ``t_start`` (or ``t_pull``) to ``t_push`` (computing done, the push began).
* ``push``    -- ``t_push`` to ``t_arrive`` (the PS has the gradient).
* ``wait``    -- ``t_arrive`` of one gradient to ``t_pull`` of the learner's next one: a
  barrier (hardsync, SSP), a queue at the PS, or a pull that had to wait.
* ``down``    -- a learner that was down: a simulated one (``cluster.availability``: the
  trace's down table) from going down to coming back, a real one from its loss to its
  rejoining (``restarts.csv``).
* ``lost``    -- a simulated learner's work that its going down lost: the pull of a gradient
  never applied to the moment it went down.

The PS's updates are ticks on a row of their own, labelled with the number of gradients c
they took; each compute bar is coloured by its gradient's staleness. Only applied gradients
and a simulated run's lost ones are in a trace, so work in flight at the end (and a real
run's lost gradients) has no bar.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from asyncsim._io import SCENARIO_TOML, read_toml, save_figure, write_text
from asyncsim.errors import ScenarioError
from asyncsim.trace import Trace, away_intervals, read_restarts

KINDS = ("pull", "compute", "push", "wait", "down", "lost")
COLORS = {"pull": "#9ecae1", "push": "#fdae6b", "wait": "#d9d9d9", "down": "#de2d26",
          "lost": "#000000"}

__all__ = ["KINDS", "draw_timeline", "intervals", "parse_range", "utilisation"]


def parse_range(text: str | None, what: str, *, integer: bool) -> tuple[float, float] | None:
    """``"A:B"`` as ``(A, B)`` (either side may be empty: open); None for None. A learner
    range is ``A:B`` with B excluded, as in Python."""
    if text is None:
        return None
    lo, sep, hi = text.partition(":")

    def conv(x: str, empty: float) -> float:  # a float, which numpy takes (10**30 too)
        return float(int(x) if integer else x) if x.strip() else empty

    try:
        if not sep:
            raise ValueError
        a, b = conv(lo, -np.inf), conv(hi, np.inf)
    except (ValueError, OverflowError):  # 10**400 is beyond a float
        kind = "integers" if integer else "numbers"
        raise ScenarioError(what, f"must be A:B with {kind} A < B (either may be left "
                            f"out), got {text!r}", file="asyncsim timeline") from None
    if not a < b:
        raise ScenarioError(what, f"must have A < B, got {text!r}", file="asyncsim timeline")
    return a, b


def intervals(trace: Trace, *, restarts: pd.DataFrame | None = None,
              learners: tuple[float, float] | None = None,
              window: tuple[float, float] | None = None) -> pd.DataFrame:
    """One row per interval: ``learner``, ``kind`` (:data:`KINDS`), ``t0``, ``t1``,
    ``staleness`` and ``batch`` (of the gradient; -1 for wait and down), clipped to
    ``window`` and restricted to the learners in ``[A, B)``."""
    g = pd.DataFrame({k: np.asarray(trace.grads[k]) for k in
                      ("learner", "batch", "staleness", "t_pull", "t_push", "t_arrive")})
    start = (np.asarray(trace.grads["t_start"]) if "t_start" in trace.grads
             else np.asarray(trace.grads["t_pull"]))
    g["t_start"] = start
    g = g.sort_values(["learner", "batch"], kind="stable").reset_index(drop=True)
    parts = []
    if "t_start" in trace.grads:
        parts.append(_rows(g, "pull", g["t_pull"], g["t_start"]))
    parts.append(_rows(g, "compute", g["t_start"], g["t_push"]))
    parts.append(_rows(g, "push", g["t_push"], g["t_arrive"]))
    same = g["learner"].to_numpy()[1:] == g["learner"].to_numpy()[:-1]
    nxt = g.iloc[1:][same]
    prev = g.iloc[:-1][same]
    parts.append(pd.DataFrame({"learner": nxt["learner"].to_numpy(), "kind": "wait",
                               "t0": prev["t_arrive"].to_numpy(),
                               "t1": nxt["t_pull"].to_numpy(), "staleness": -1,
                               "batch": -1}))
    out = pd.concat(parts, ignore_index=True)
    cut = away_intervals(trace, restarts)
    if len(cut):
        out = pd.concat([_without(out, cut), cut], ignore_index=True)
    out = out[out["t1"] > out["t0"]]
    if learners is not None:
        out = out[(out["learner"] >= learners[0]) & (out["learner"] < learners[1])]
    if window is not None:
        out = out[(out["t1"] > window[0]) & (out["t0"] < window[1])].copy()
        out["t0"] = out["t0"].clip(lower=window[0])
        out["t1"] = out["t1"].clip(upper=window[1])
    return out.sort_values(["learner", "t0", "kind"], kind="stable").reset_index(drop=True)


def _without(iv: pd.DataFrame, down: pd.DataFrame) -> pd.DataFrame:
    """``iv`` with each learner's down (and lost) intervals cut out of its wait and pull
    intervals (a lost learner is down, not waiting; a restarted actor's first pull spans its
    restart)."""
    out = []
    by_learner = {k: list(d.itertuples(index=False)) for k, d in down.groupby("learner")}
    for r in iv.itertuples(index=False):
        pieces = [(r.t0, r.t1)]
        if r.kind in ("wait", "pull"):
            for d in by_learner.get(r.learner, ()):
                pieces = [p for a, b in pieces for p in ((a, min(b, d.t0)), (max(a, d.t1), b))
                          if p[1] > p[0]]
        out.extend({**r._asdict(), "t0": a, "t1": b} for a, b in pieces)
    return pd.DataFrame(out, columns=iv.columns)


def _rows(g: pd.DataFrame, kind: str, t0, t1) -> pd.DataFrame:
    return pd.DataFrame({"learner": g["learner"].to_numpy(), "kind": kind,
                         "t0": np.asarray(t0, float), "t1": np.asarray(t1, float),
                         "staleness": g["staleness"].to_numpy(),
                         "batch": g["batch"].to_numpy()})


def _caption(run_dir: Path, scn: dict, trace: Trace, learners, window) -> str:
    """What the chart shows, from the run folder: its scenario (``scn``, its scenario.toml),
    protocol and cluster, the trace's size and the selection, and the command that redraws
    it."""
    proto = scn.get("protocol", {})
    kind = " ".join([proto.get("kind", "?"), *(f"{k} = {proto[k]}" for k in
                                                ("n", "tau", "s", "schedule") if k in proto)])
    cluster = scn.get("cluster", {})
    seed = cluster.get("seed", scn.get("seed", 0))
    sel = "".join([f" --learners {_txt(learners)}" if learners else "",
                   f" --window {_txt(window)}" if window else ""])
    serial = (proto.get("kind") == "fixed-delay" and proto.get("schedule", "round-robin")
              != "race")
    note = (" A serial fixed-delay schedule steps one worker at a time: a bar spans a "
            "worker's step from the version it read to its push, not its compute alone."
            if serial else "")
    if trace.num_down:
        stats = trace.down_stats()
        note += (f" Learners came and went (cluster.availability): {stats['down_periods']} "
                 f"down periods, {stats['lost_gradients']} gradients lost, up "
                 f"{100 * stats['up_fraction']:.0f}% of the time.")
    return (f"Scenario {scn.get('name', '?')} (timing seed {seed}): {kind}, "
            f"{cluster.get('learners', '?')} learners; the trace's {trace.num_gradients} "
            f"gradients and {trace.num_updates} updates.{note} Redraw: asyncsim timeline "
            f"{run_dir}{sel}")


def _txt(r) -> str:
    return ":".join("" if not np.isfinite(x) else f"{x:g}" for x in r)


def utilisation(iv: pd.DataFrame) -> pd.DataFrame:
    """Per learner, the fraction of its charted span (first to last interval) in each kind."""
    span = iv.groupby("learner").agg(t0=("t0", "min"), t1=("t1", "max"))
    tot = (span["t1"] - span["t0"]).replace(0.0, np.nan)
    dur = (iv.assign(d=iv["t1"] - iv["t0"]).pivot_table(index="learner", columns="kind",
                                                        values="d", aggfunc="sum")
           .reindex(columns=[k for k in KINDS if k in set(iv["kind"])]).fillna(0.0))
    return dur.div(tot, axis=0).reset_index()


def draw_timeline(run_dir: str | Path, png: str | Path, *, learners: str | None = None,
                  window: str | None = None) -> tuple[Path, pd.DataFrame]:
    """Draw the timeline of the run folder ``run_dir`` into ``png`` (and ``png`` with
    ``.csv``: the intervals drawn); returns the PNG's path and :func:`utilisation`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    trace = Trace.load(run_dir)
    scn = read_toml(run_dir / SCENARIO_TOML) if (run_dir / SCENARIO_TOML).exists() else {}
    restarts = read_restarts(run_dir)
    lr = parse_range(learners, "--learners", integer=True)
    wr = parse_range(window, "--window", integer=False)
    iv = intervals(trace, restarts=restarts, learners=lr, window=wr)
    if iv.empty:
        flags = " and ".join(f for f, v in (("--learners", lr), ("--window", wr)) if v)
        raise ScenarioError(flags or "trace", "selects no interval of "
                            f"this run (its trace spans t = 0 .. "
                            f"{float(np.max(trace.grads['t_arrive'], initial=0)):.4g}, "
                            f"learners 0 .. {int(np.max(trace.grads['learner'], initial=0))})",
                            file=str(run_dir))
    shown = sorted(set(iv["learner"]))
    row = {k: i + 1 for i, k in enumerate(shown)}
    t_lo, t_hi = float(iv["t0"].min()), float(iv["t1"].max())
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.28 * (len(shown) + 1)))
    smax = max(1, int(iv["staleness"].max()))
    cmap = plt.get_cmap("viridis")
    for kind in KINDS:
        sub = iv[iv["kind"] == kind]
        if sub.empty:
            continue
        y = [row[k] for k in sub["learner"]]
        widths = (sub["t1"] - sub["t0"]).to_numpy()
        if kind == "compute":
            colors = cmap(sub["staleness"].to_numpy() / smax)
            label = "compute" if "t_start" in trace.grads else "pull + compute"
        else:
            colors, label = COLORS[kind], kind
        ax.barh(y, widths, left=sub["t0"].to_numpy(), height=0.7, color=colors, lw=0.3,
                edgecolor="white",
                label=label)
    upd = pd.DataFrame({"time": np.asarray(trace.updates["time"], float),
                        "c": np.asarray(trace.updates["n_grads"])})
    upd = upd[(upd["time"] >= t_lo) & (upd["time"] <= t_hi)]
    ax.vlines(upd["time"], -0.35, 0.35, color="k", lw=0.6, label="PS update")
    if len(upd) <= 60:
        for t, c in zip(upd["time"], upd["c"], strict=True):
            ax.text(t, 0.45, str(c), fontsize=6, ha="center", va="bottom")
    ax.set_yticks([0, *row.values()])
    ax.set_yticklabels(["PS (c)", *[f"learner {k}" for k in shown]], fontsize=7)
    ax.set_ylim(-0.6, len(shown) + 0.6)
    ax.invert_yaxis()
    ax.set_xlim(t_lo, t_hi)
    ax.set_xlabel("simulated time" if "t_start" not in trace.grads else "wall time (s)")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, smax))
    fig.colorbar(sm, ax=ax, pad=0.01, label="staleness τ of the gradient")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.08, 1.0))
    what = "real" if "t_start" in trace.grads else "simulated"
    ax.set_title(f"{scn.get('name', run_dir.name)}: {len(trace.grads['learner'])} gradients, "
                 f"{trace.num_updates} updates ({what} trace)", fontsize=9)
    fig.text(0.01, -0.02, _caption(run_dir, scn, trace, lr, wr), fontsize=7, ha="left", va="top",
             color="0.3")
    fig.tight_layout()
    png = save_figure(fig, png, dpi=100, bbox_inches="tight")
    plt.close(fig)
    write_text(png.with_suffix(".csv"), iv.to_csv(index=False))
    return png, utilisation(iv)
