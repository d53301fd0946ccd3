"""Small helpers shared by the figure scripts: read a sweep's run folders, label points,
caption a figure with what it was made from, write it and its data. They read run folders
only, and only through :mod:`asyncsim.results` (every value checked as it is read);
nothing here runs a simulation."""

from __future__ import annotations

import copy
import math
import os
import textwrap
import tomllib
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from asyncsim import _checks
from asyncsim._io import make_folder, save_figure, write_text
from asyncsim.config import rule_label
from asyncsim.results import RunFolder, SweepFolder, run_folders
from asyncsim.runs import scenario_toml
from asyncsim.scenario import load_scenario, point_scenarios
from asyncsim.timing.protocols import drop_defaults

# The repository when this package runs from a checkout (analysis/ beside scenarios/); from
# an installed wheel the scenario files are not there, and captions say so.
REPO = Path(__file__).resolve().parent.parent
RULE_LABEL = {"constant": "α = α0", "inverse-staleness": "α = α0/τ",
              "inverse-mean-staleness": "α = α0/⟨τ⟩", "stability-edge": "stability edge"}


def finished_points(sweep_dir: Path) -> list[RunFolder]:
    """The run folders of a sweep's complete points (``summary.json`` written), in
    ``index.csv`` order; a sweep may still be running. Each is read through
    :class:`asyncsim.results.RunFolder`, which checks every value as it is read."""
    return list(SweepFolder(sweep_dir).points())


def warmup_updates(run: RunFolder) -> int:
    """The updates a staleness figure skips: the run's ``[figure] warmup_updates`` (100)."""
    return run.value("figure.warmup_updates", 100,
                     lambda k, v: _checks.integer(k, v, low=0))


def trace_points(sweep_dir: Path):
    """``(run folder, scenario dict, trace, warm-up updates)`` of each complete point of a
    timing-only sweep (:func:`warmup_updates`): what the staleness figures read."""
    for run in finished_points(sweep_dir):
        yield run, run.recorded, run.trace, warmup_updates(run)


def read_edges(sweep_dir: Path) -> pd.DataFrame:
    """The stability edges a sweep measured (its ``edges.csv``: point, tau, schedule,
    momentum, beta, measured, closed_form, staleness_mean, staleness_max)."""
    return SweepFolder(sweep_dir).edges()


def protocol_n(run: RunFolder) -> int | None:
    """The run's ``protocol.n`` (n-softsync's n), None where its protocol has none."""
    return run.value("protocol.n", None,
                     lambda k, v: None if v is None else _checks.integer(k, v))


def load_points(sweep_dir: Path, *, trace_only_ok: bool = False) -> pd.DataFrame:
    """One row per complete point of the sweep (a sweep may still be running), in index
    order: its :class:`~asyncsim.results.RunFolder` (``run``) and folder, its resolved
    scenario values and summary. Trace-only points (no ``eval.csv``) are kept only with
    ``trace_only_ok`` (column ``has_eval`` says which). No such point: FileNotFoundError
    (a figure has nothing to draw)."""
    rows = []
    for run in finished_points(sweep_dir):
        if not (run.has_evals or trace_only_ok):
            continue  # a trace-only point (no numerics to draw)
        scn = run.recorded
        opt = scn["optimizer"]
        rows.append({
            "point": run.path.name, "run": run, "folder": run.path, "seed": scn["seed"],
            # n-softsync's n; 0 where the protocol has none (hardsync, async)
            "protocol": scn["protocol"]["kind"], "n": protocol_n(run) or 0,
            "learners": scn["cluster"]["learners"], "batch_size": scn["data"]["batch_size"],
            "lr": opt["lr"], "lr_rule": rule_label(opt["lr_rule"]),
            "warmup_updates": opt["schedule"]["warmup_updates"],
            "scenario": scn, "summary": run.summary, "has_eval": run.has_evals,
        })
    if not rows:
        raise FileNotFoundError(f"{sweep_dir}: no complete runs")
    return pd.DataFrame(rows)


def figure_target(points: pd.DataFrame, default: float) -> float:
    """The sweep's ``[figure] target_test_error`` (its first point's, ``default`` where the
    scenario sets none): the test error a time-to-target is measured to."""
    return points["run"].iloc[0].value("figure.target_test_error", default,
                                       _checks.unit_interval)


# Student's t at 0.975 for 1..30 degrees of freedom (the standard table, to 3 decimals).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """Student's t quantile at 0.975 with ``df`` degrees of freedom: the table to 30, the
    Cornish-Fisher expansion in 1/df beyond (within 2e-6 there)."""
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def ci95(values) -> float:
    """The half-width of the 95% Student-t interval of the mean of ``values`` (NaN for
    fewer than two finite values)."""
    v = np.asarray([x for x in values if x == x], float)
    if v.size < 2:
        return math.nan
    return float(t975(v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))


def time_to_target(ev: pd.DataFrame, target: float) -> tuple[float, float]:
    """(simulated time, epoch) at which test error first reaches ``target``; NaN if never."""
    err, t, ep = (ev[c].to_numpy(float) for c in ("test_error", "sim_time", "epoch"))
    # The evaluation before any update (epoch 0) does not count: a target met by the initial
    # weights measures nothing.
    hit = np.flatnonzero((err <= target) & (ep > 0))
    if hit.size == 0:
        return float("nan"), float("nan")
    i = int(hit[0])
    if i == 0 or err[i - 1] <= target:
        # Only the (excluded) initial evaluation can be at/below the target before i: no
        # crossing to interpolate, take the first counted evaluation.
        return float(t[i]), float(ep[i])
    # Interpolate between the last evaluation above the target and the first at/below it.
    f = (err[i - 1] - target) / (err[i - 1] - err[i])
    return float(t[i - 1] + f * (t[i] - t[i - 1])), float(ep[i - 1] + f * (ep[i] - ep[i - 1]))


def run_failed(summary) -> bool:
    """Whether a run failed: ``summary.json`` says it diverged or never learned (P1's "does
    not converge"). The studies count such a run at its last evaluation."""
    return bool(summary.get("diverged")) or bool(summary.get("never_learned"))


def run_outcome(point, target: float) -> dict:
    """Where a run (a row of :func:`load_points`) ended: its final test and train error,
    whether it failed (:func:`run_failed`: a failed run keeps its last evaluation as its
    final error and has no time to the target), and its simulated time to test error
    ``target`` (:func:`time_to_target`)."""
    s, ev = point["summary"], point["run"].evals
    failed = run_failed(s)
    t, _ = time_to_target(ev, target)
    return {"final_test_error": float(ev["test_error"].iloc[-1]),
            "final_train_error": s.get("final_train_error", math.nan),
            "failed": failed, "time_to_target": math.nan if failed else t,
            "sim_time": s.get("sim_time")}


def mean_curves(points: pd.DataFrame, label) -> pd.DataFrame:
    """Mean test error against simulated time per ``label(point)`` (a dict of key columns),
    taken per evaluation index: the seeds of one setup share the number of updates between
    evaluations, not the times; a run that stopped early (diverged) leaves the mean to the
    seeds still running (column ``seeds``)."""
    frames, keys = [], {}
    for _, p in points.iterrows():
        ev = p["run"].evals[["sim_time", "epoch", "test_error"]].copy()
        keys = label(p)
        for k, v in keys.items():
            ev[k] = v
        ev["step"] = range(len(ev))
        ev["seed"] = int(p["seed"])
        frames.append(ev)
    if not frames:
        return pd.DataFrame(columns=["sim_time", "epoch", "test_error", "seeds"])
    c = pd.concat(frames, ignore_index=True)
    return (c.groupby([*keys, "step"], sort=False)
            .agg(sim_time=("sim_time", "mean"), epoch=("epoch", "mean"),
                 test_error=("test_error", "mean"), seeds=("seed", "count"))
            .reset_index().drop(columns="step"))


def setup_label(protocol: str, n) -> str:
    """``hardsync`` or ``N-softsync`` (P1's names)."""
    if protocol == "softsync" and n:
        return f"{int(n)}-softsync"
    return str(protocol)


def setup_order(label: str) -> tuple:
    """Sort key of :func:`setup_label`'s labels: hardsync, then n-softsync by n, then the
    rest by name."""
    n = label.split("-")[0]
    return (label != "hardsync", int(n) if n.isdigit() else math.inf, label)


def _isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _num(x) -> str:
    """4000 -> "4,000"; 10838.4 -> "10,838"; 2.02 -> "2.02"; 0.1 -> "0.1"."""
    return f"{x:,.0f}" if abs(x) >= 100 or float(x).is_integer() else f"{x:.3g}"


def _span(values) -> str:
    """``"4,000"`` or ``"2,000–4,000"`` for the distinct values (ignoring missing ones)."""
    vals = sorted({v for v in values if v is not None and not _isnan(v)})
    if not vals:
        return "?"
    lo, hi = _num(vals[0]), _num(vals[-1])
    return lo if lo == hi else f"{lo}–{hi}"


def _model_label(model: dict) -> str:
    opts = " ".join(f"{k}={v}".replace(" ", "") for k, v in model.items() if k != "name")
    return f"{model.get('name', '?')}{' ' + opts if opts else ''}"


def data_size(run: RunFolder, key: str) -> int | None:
    """``data.n_train`` / ``data.n_test`` as the run set them (a data set's options: checked
    here, since the schema leaves them to the data set)."""
    return run.value(f"data.{key}", None,
                     lambda k, v: None if v is None else _checks.integer(k, v))


def regenerate(scenario_file: str, runs: list[RunFolder], scns: list[dict]) -> str:
    """``"regenerate: asyncsim run FILE [--profile P]"`` when that command resolves to
    exactly the scenarios the runs recorded (every point of the sweep, compared key by key
    with each folder's ``scenario.toml``); otherwise ``"scenario: FILE (modified: ...)"``,
    e.g. when the runs used ``--set`` or the file was edited after them. So a caption never
    claims that a committed scenario regenerates a figure unless it does."""
    path = Path(scenario_file)
    # os.path, not Path.exists: a name too long or behind a folder without permission is
    # "not found", not an OSError (Path.exists raises there on Python 3.11).
    if not os.path.exists(path) and not path.is_absolute():
        path = REPO / scenario_file
    if not os.path.exists(path):
        return f"scenario: {scenario_file} (not found here)"
    # Only a regular file is read: the name comes from a run folder, and a pipe the run was
    # read from (asyncsim run /dev/stdin, a FIFO) would block the drawing forever, a device
    # (/dev/zero) never end.
    if not os.path.isfile(path):
        return (f"scenario: {scenario_file} (not a scenario file here; each run folder's "
                "scenario.toml reruns it)")
    # As this asyncsim records them (older folders spell out fixed-delay-only defaults).
    recorded = {r.path.name: drop_defaults(copy.deepcopy(sc))
                for r, sc in zip(runs, scns, strict=True)}
    for profile in ("default", "smoke", "paper"):
        try:
            planned = point_scenarios(load_scenario(path, profile=profile, validate=False))
        except (ValueError, OSError):  # ScenarioError: an edited file no longer loads
            continue
        # Each point as its folder records it, read back like the recorded ones. (A scenario
        # that reads files records them copied or made absolute, asyncsim.drivers.folder_scenario,
        # which this JAX-free code does not redo: such runs caption as "modified". No figure
        # scenario reads a file.)
        resolved = {name: drop_defaults(tomllib.loads(scenario_toml(s)))
                    for name, _, s in planned}
        if len(recorded) == 1 and len(resolved) == 1:  # a single run: any folder name
            resolved = dict(zip(recorded, resolved.values(), strict=True))
        if all(resolved.get(k) == v for k, v in recorded.items()):
            flag = "" if profile == "default" else f" --profile {profile}"
            return f"regenerate: asyncsim run {scenario_file}{flag}"
    return (f"scenario: {scenario_file} (modified: --set, --seed or an edit since; each run "
            "folder's scenario.toml reruns it)")


def describe_runs(*sources: Path) -> str:
    """What a figure was made from, read from its run folders (``scenario.toml``,
    ``summary.json``, ``params.npz``, ``provenance.json``): the data set and its size, the
    model and its parameter count, the scale of each run (epochs, updates), the number of
    runs and their seeds, and the scenario file and profile that regenerate them. Nothing is
    typed in by hand, so the caption cannot drift from the runs it describes."""
    parts = []
    for source in sources:
        runs = run_folders(source)
        if not runs:
            continue
        scns = [r.recorded for r in runs]
        sums = [r.summary for r in runs]
        numeric = [i for i, sc in enumerate(scns) if not sc["run"]["trace_only"]]
        if numeric:
            data = sorted({(scns[i]["data"]["name"], data_size(runs[i], "n_train"),
                            data_size(runs[i], "n_test")) for i in numeric}, key=str)
            data_txt = "; ".join(
                f"{name}" + (f" ({n:,} train / {t:,} test)" if n and t else "")
                for name, n, t in data)
            mus = _span([scns[i]["data"]["batch_size"] for i in numeric])
            models = sorted({_model_label(scns[i]["model"]) for i in numeric})
            n_params = _span([runs[i].num_params() for i in numeric])
            what = (f"data {data_txt}, μ = {mus}; model {', '.join(models)}"
                    + (f" ({n_params} parameters)" if n_params != "?" else ""))
            scale = (f"{_span([sums[i].get('epochs') for i in numeric])} epochs "
                     f"({_span([sums[i].get('updates') for i in numeric])} updates) per run")
        else:
            what = "timing only (the runs record traces, no gradients)"
            scale = f"{_span([s.get('gradients') for s in sums])} gradients per run"
        files = sorted({f for r in runs if (f := r.provenance.get("scenario_file"))})
        seeds = sorted({sc["seed"] for sc in scns})
        backends = sorted({s.get("backend") for s in sums if s.get("backend")})
        parts.append(f"{what}; {scale}; {len(runs)} run{'s' * (len(runs) != 1)}, "
                     f"seed{'s' * (len(seeds) != 1)} {', '.join(map(str, seeds))}"
                     + (f", {'/'.join(backends)}" if backends else "")
                     + (f"; {regenerate(files[0], runs, scns)}" if len(files) == 1 else ""))
    return " | ".join(parts)


def model_label(source: Path) -> str:
    """The model of a sweep's runs as a caption names it (``quadratic eigenvalues=[1.0]``)."""
    return ", ".join(sorted({_model_label(r.recorded["model"])
                             for r in run_folders(source)})) or "?"


def caption_text(*sources: Path, note: str = "", width_in: float) -> str:
    """The footer :func:`add_caption` writes, wrapped for a figure ``width_in`` inches wide
    (fontsize 7): what the figure was made from (:func:`describe_runs`) after ``note``; ""
    when there is nothing to say."""
    text = describe_runs(*sources)
    if note:
        text = f"{note} Runs: {text}" if text else note
    elif text:
        text = f"Runs: {text}"
    if not text:
        return ""
    return textwrap.fill(text, max(60, int(width_in * 17)))  # characters per line at 7 pt


def add_caption(fig, *sources: Path, note: str = "") -> None:
    """A small footer under the figure saying what it was made from
    (:func:`describe_runs`), so that a PNG copied out of ``figures/`` still says which data,
    model and scale it shows; ``note`` adds figure-specific context. It hangs below the
    figure's canvas: save with ``bbox_inches="tight"`` (:func:`save`)."""
    text = caption_text(*sources, note=note, width_in=fig.get_figwidth())
    if text:
        fig.text(0.01, 0.0, text, fontsize=7, ha="left", va="top", color="0.3")


def footer_height(text: str) -> float:
    """Inches a :func:`caption_text` footer takes at the bottom of a figure's canvas (its
    lines at 7 pt with matplotlib's 1.2 line spacing, and a margin), for a figure that
    reserves room for it and is saved in one pass, without ``bbox_inches="tight"``."""
    return (text.count("\n") + 1) * 7 * 1.2 / 72 + 0.12 if text else 0.0


def save(fig, data: pd.DataFrame, out_dir: Path, name: str, *,
         sources: tuple[Path, ...] = (), note: str = "",
         tables: dict[str, pd.DataFrame] | None = None) -> list[Path]:
    """Write ``NAME.png`` (small: 100 dpi; with :func:`add_caption`'s footer for
    ``sources``), ``NAME.csv`` (every plotted series) and ``NAME_KEY.csv`` for each of
    ``tables``."""
    out_dir = make_folder(out_dir)
    if sources or note:
        add_caption(fig, *sources, note=note)
    png, csv = out_dir / f"{name}.png", out_dir / f"{name}.csv"
    save_figure(fig, png, dpi=100, bbox_inches="tight")
    plt.close(fig)
    write_text(csv, data.to_csv(index=False))
    written = [png, csv]
    for key, frame in (tables or {}).items():
        written.append(out_dir / f"{name}_{key}.csv")
        write_text(written[-1], frame.to_csv(index=False))
    return written
