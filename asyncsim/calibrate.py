"""``asyncsim calibrate`` and ``asyncsim compare``: a real run's timing fitted as a
scenario, and two runs' staleness distributions side by side. Both read run folders only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from asyncsim import runs
from asyncsim._io import save_figure
from asyncsim.config import to_dict
from asyncsim.drivers.build import message_bytes
from asyncsim.machine import fact_changes
from asyncsim.results import read_summary
from asyncsim.scenario import load_run_scenario, load_scenario
from asyncsim.trace import Trace, away_intervals, read_restarts


def measured_durations(trace) -> dict[str, Any]:
    """Per-learner compute times and the pull/push link times of a real trace (seconds).

    compute = t_push - t_start; pull = t_start - t_pull (weights reach the learner);
    push = t_arrive - t_push (the gradient reaches the PS and is picked up).
    """
    g = trace.grads
    t_start = g["t_start"] if "t_start" in g else g["t_pull"]
    lam = int(trace.meta.get("learners", int(g["learner"].max()) + 1))
    comp = np.maximum(g["t_push"] - t_start, 0.0)
    return {"compute": [comp[g["learner"] == k] for k in range(lam)],
            "pull": np.maximum(t_start - g["t_pull"], 0.0),
            "push": np.maximum(g["t_arrive"] - g["t_push"], 0.0)}


# What a cluster fit needs before it is made (fewer: calibrate says it cannot, and why).
MIN_DOWN_PERIODS = 5  # availability: completed down periods, all learners together
MIN_TRANSFERS = 30  # a PS interface: transfers timed
MIN_T = 5.0  # a PS interface: its slope (seconds per transfer in progress) / standard error


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """``a · b`` as numpy's fixed-order sum of correctly rounded products (BLAS's dot picks
    its kernel per CPU), so a calibrated scenario has the same bits on every machine."""
    return float(np.sum(a * b))


def shared_link_fit(t0: np.ndarray, t1: np.ndarray) -> dict[str, float]:
    """How a direction's transfer times grow with the transfers in progress: the least-squares
    line ``t1 - t0 = latency + per_transfer * n`` over the transfers ``[t0, t1]``, where n is
    the time average, over a transfer, of the number in progress (itself included). Under
    fair sharing of an interface of bandwidth B by transfers of b bytes, a transfer lasts
    ``b / B`` times that average, exactly (the bandwidth it gets is B / n at each instant).
    Returns ``latency``, ``per_transfer``, ``se`` (its standard error) and ``spread`` (the
    standard deviation of n: without it the slope is not identified)."""
    ok = np.isfinite(t0) & np.isfinite(t1) & (t1 > t0)
    t0, t1 = t0[ok], t1[ok]
    if t0.size < 3:
        return {"latency": float("nan"), "per_transfer": float("nan"), "se": float("inf"),
                "spread": 0.0, "transfers": int(t0.size)}
    s, e = np.sort(t0), np.sort(t1)
    cs, ce = np.concatenate([[0.0], np.cumsum(s)]), np.concatenate([[0.0], np.cumsum(e)])

    def busy(t):  # integral from 0 to t of the number of transfers in progress
        ks, ke = np.searchsorted(s, t, side="right"), np.searchsorted(e, t, side="right")
        return ks * t - cs[ks] - (ke * t - ce[ke])

    dur = t1 - t0
    n = (busy(t1) - busy(t0)) / dur
    x = n - n.mean()
    sxx = _dot(x, x)
    if sxx <= 0.0:
        return {"latency": float(dur.mean()), "per_transfer": float("nan"), "se": float("inf"),
                "spread": 0.0, "transfers": int(t0.size)}
    slope = _dot(x, dur - dur.mean()) / sxx
    latency = float(dur.mean() - slope * n.mean())
    resid = dur - latency - slope * n
    se = float(np.sqrt(_dot(resid, resid) / max(dur.size - 2, 1) / sxx))
    return {"latency": latency, "per_transfer": slope, "se": se, "spread": float(n.std()),
            "transfers": int(t0.size)}


def fit_cluster(trace: Trace, restarts, *, push_bytes: float | None,
                pull_bytes: float | None) -> tuple[dict[str, Any], list[str]]:
    """The PS's shared interfaces and the learners' availability a trace supports:
    ``({"ps_ingress": ..., "ps_egress": ..., "push": ..., "pull": ..., "availability": ...}
    (those fitted; a fitted interface comes with its direction's link),
    [one line per fit made or refused, saying why])``.

    * ``ps_ingress`` / ``ps_egress``: :func:`shared_link_fit` of the pushes ``[t_push,
      t_arrive]`` / the pulls ``[t_pull, t_start]`` (only real traces time pulls); fitted as
      fair sharing of bandwidth ``bytes / per_transfer`` when the slope is positive at
      ``MIN_T`` standard errors over at least ``MIN_TRANSFERS`` transfers.
    * ``availability``: the learners' down periods (a simulated trace's down table, a real
      run's lost-to-back intervals, :func:`asyncsim.trace.away_intervals`) and the up
      periods between them (from t = 0), pooled over the learners: exponential, by maximum
      likelihood with the periods the run's end cuts short counted as censored, once there
      are ``MIN_DOWN_PERIODS`` completed down periods.
    """
    fits: dict[str, Any] = {}
    notes: list[str] = []
    g = trace.grads
    sides = [("ps_ingress", g["t_push"], g["t_arrive"], push_bytes, "pushes")]
    if "t_start" in g:
        sides.append(("ps_egress", g["t_pull"], g["t_start"], pull_bytes, "pulls"))
    else:
        notes.append("ps_egress: not fitted: a simulated trace does not time its pulls "
                     "(no t_start)")
    lost = trace.down_stats()["lost_gradients"] if trace.num_down else 0
    for key, t0, t1, nbytes, what in sides:
        f = shared_link_fit(np.asarray(t0, float), np.asarray(t1, float))
        why = None
        if f["transfers"] < MIN_TRANSFERS:
            why = f"{f['transfers']} {what} timed (needs {MIN_TRANSFERS})"
        elif not f["per_transfer"] > MIN_T * f["se"]:
            why = (f"{what} do not take longer with more in progress (slope "
                   f"{f['per_transfer']:.3g} ± {f['se']:.2g} s per transfer)")
        elif not nbytes:
            why = "the message size is unknown"
        if why is not None:
            notes.append(f"{key}: not fitted: {why}")
            continue
        fits[key] = {"bandwidth": float(nbytes / f["per_transfer"]), "sharing": "fair"}
        caveat = (f"; {lost} gradients were lost with learners going down, and transfers "
                  "they left on the interface are not in the trace: the fit may be off by "
                  "their share of the load" if lost else "")
        # The learner's own link keeps what the line does not put on the interface: its
        # intercept, as a constant latency, with the message size the bandwidth assumed.
        fits["push" if key == "ps_ingress" else "pull"] = {
            "latency": {"dist": "constant", "value": max(f["latency"], 0.0)},
            "bytes": int(nbytes)}
        notes.append(f"{key}: fitted fair sharing of {fits[key]['bandwidth']:.4g} bytes/s "
                     f"({nbytes:.0f}-byte messages, {f['per_transfer']:.3g} ± {f['se']:.2g} s "
                     f"per transfer in progress, over {f['transfers']} {what}){caveat}")
    away = away_intervals(trace, restarts)
    down = away[away["kind"] == "down"].sort_values(["learner", "t0"], kind="stable")
    end = float(trace.meta.get("sim_time", 0.0))
    lam = int(trace.meta.get("learners", int(g["learner"].max(initial=0)) + 1))
    # Exponential periods by maximum likelihood with the run's end censoring them: a mean
    # is the time spent in that state (the periods cut by the end included) over the
    # periods that ended. Every down period ends an up period.
    down_time = float(np.sum(np.minimum(down["t1"], end) - np.minimum(down["t0"], end)))
    closed = int(np.count_nonzero(np.isfinite(down["t1"]) & (down["t1"] < end)))
    if closed < MIN_DOWN_PERIODS:
        notes.append(f"availability: not fitted: {closed} completed down periods "
                     f"(needs {MIN_DOWN_PERIODS})")
    else:
        up_mean = (lam * end - down_time) / len(down)
        down_mean = down_time / closed
        fits["availability"] = {"up": {"dist": "exponential", "mean": up_mean},
                                "down": {"dist": "exponential", "mean": down_mean}}
        notes.append(f"availability: fitted exponential up periods of mean {up_mean:.4g} "
                     f"and down periods of mean {down_mean:.4g} (maximum likelihood, the "
                     f"run's end censoring: {len(down)} up and {closed} down periods ended, "
                     f"{lam} learners pooled)")
    return fits, notes


def calibrate(run_dir: str | Path, *, out: str | Path | None = None,
              kind: str = "empirical", notes: list[str] | None = None) -> Path:
    """Fit the timing of a real run and write a scenario that simulates it.

    ``empirical``: the measured durations go to ``calib_*.csv`` next to the scenario and the
    scenario resamples them (``dist = "empirical"``), per learner for compute, shared for
    the pull and push links. ``parametric``: lognormal by measured mean and cv. The PS's
    shared interfaces and the learners' availability are fitted where the trace supports
    them (:func:`fit_cluster`); ``notes``, if given, gets one line per such fit, made or
    refused. The scenario is the run's own (model, data, protocol, optimizer, seed) with
    the same number of updates; returns its path.
    """
    run_dir = runs.require_run_folder(run_dir)
    # By default into the run folder (its one calibrated.toml, the calib_*.csv beside it);
    # elsewhere, never into another run's folder, nor over a folder or a device.
    own = run_dir / "calibrated.toml"
    out = runs.output_file(out or own, flag="--out", verb="calibrate", suffixes=(".toml",),
                           own=own)
    scn = load_run_scenario(run_dir)
    # Its learners are the scenario's: the calibrated scenario has one compute spec each.
    trace = Trace.load(run_dir, learners=scn.cluster.learners)
    restarts = read_restarts(run_dir)
    # Written beside the run's files (by default into the run folder): as its one writer.
    with runs.locked(out.parent):
        return _write_calibrated(scn, trace, restarts, run_dir, out, kind,
                                 [] if notes is None else notes)


def _write_calibrated(scn, trace, restarts, run_dir: Path, out: Path, kind: str,
                      notes: list[str]) -> Path:
    """:func:`calibrate` holding the lock of ``out``'s folder."""
    m = measured_durations(trace)

    def spec(values: np.ndarray, name: str) -> dict[str, Any]:
        values = values[np.isfinite(values)]
        if values.size == 0:
            return {"dist": "constant", "value": 0.0}
        if kind == "parametric":
            mean = float(values.mean())
            if mean <= 0:
                return {"dist": "constant", "value": 0.0}
            return {"dist": "lognormal", "mean": mean, "cv": float(values.std() / mean)}
        path = out.parent / f"calib_{name}.csv"
        runs.atomic_write_text(path, "seconds\n" + "".join(f"{float(x)!r}\n" for x in values))
        return {"dist": "empirical", "path": path.name, "column": "seconds"}

    d = to_dict(scn)
    for k in ("source", "sweep"):
        d.pop(k, None)
    d["name"] = f"{scn.name}-calibrated"
    d["description"] = f"timing calibrated ({kind}) from the real run {run_dir}"
    cl = d.setdefault("cluster", {})
    cl["compute"] = [spec(c, f"compute_{k}") for k, c in enumerate(m["compute"])]
    cl.pop("speed", None)
    cl.pop("ps_service", None)
    cl["network"] = {"pull": {"latency": spec(m["pull"], "pull")},
                     "push": {"latency": spec(m["push"], "push")}}
    net = scn.cluster.network
    nbytes = message_bytes(scn, always=True)
    fits, lines = fit_cluster(trace, restarts, push_bytes=net.push.bytes or nbytes,
                              pull_bytes=net.pull.bytes or nbytes)
    notes.extend(lines)
    cl.pop("availability", None)
    for key in fits:
        if key == "availability":
            cl[key] = fits[key]
        else:  # a direction's link and the PS's interface it crosses
            cl["network"][key] = fits[key]
    run = {k: v for k, v in d.get("run", {}).items()
           if k not in ("updates", "gradients", "epochs", "sim_time")}
    run["updates"] = trace.num_updates
    d["run"] = run
    runs.atomic_write_text(out, runs.dump_toml(d))
    load_scenario(out)  # validate what we wrote (names the key if something is off)
    return out


def staleness_distribution(trace, *, skip: int = 0) -> np.ndarray:
    """Frequencies of staleness 0, 1, 2, ... (after ``skip`` warm-up updates)."""
    return trace.staleness_histogram(skip=skip)["freq"].to_numpy()


def _parameters(a: Path, b: Path) -> dict[str, Any]:
    """``param_hash_a``, ``param_hash_b`` (None for a run without parameters: a timing-only
    trace, an unfinished run) and, when both are there and differ, ``environment_changes``:
    what the last bits depend on that differs between A's machine and B's
    (:func:`asyncsim.runs.bit_facts`)."""
    summaries = [read_summary(f) if runs.is_complete(f) else {} for f in (a, b)]
    out = {f"param_hash_{t}": s.get("param_hash") for t, s in zip("ab", summaries, strict=True)}
    if None not in out.values() and out["param_hash_a"] != out["param_hash_b"]:
        facts = [runs.bit_facts(runs.read_provenance(f), s)
                 for f, s in zip((a, b), summaries, strict=True)]
        out["environment_changes"] = fact_changes(*facts)
    return out


def compare(run_a: str | Path, run_b: str | Path, *, figure: str | Path | None = None,
            skip: int = 0) -> dict[str, Any]:
    """Two runs' staleness distributions side by side, and whether their parameters agree.

    Returns ``tv_distance`` (½ Σ|p_a − p_b|, in [0, 1]), per run mean, p99, max and count,
    ``table`` (staleness, freq_a, freq_b) and :func:`_parameters`' fields. With ``figure``
    draws both as bars (Agg).
    """
    ta = Trace.load(runs.require_run_folder(run_a, scenario=False))
    tb = Trace.load(runs.require_run_folder(run_b, scenario=False))
    pa, pb = staleness_distribution(ta, skip=skip), staleness_distribution(tb, skip=skip)
    n = max(pa.size, pb.size)
    pa, pb = np.pad(pa, (0, n - pa.size)), np.pad(pb, (0, n - pb.size))
    tvd = 0.5 * float(np.abs(pa - pb).sum())
    res: dict[str, Any] = {"tv_distance": tvd}
    for tag, t in (("a", ta), ("b", tb)):
        s = t.staleness_stats(skip=skip)
        res[f"mean_{tag}"] = s["staleness_mean"]
        res[f"p99_{tag}"] = s["staleness_p99"]
        res[f"max_{tag}"] = s["staleness_max"]
        res[f"gradients_{tag}"] = t.num_gradients
    res["table"] = [{"staleness": i, "freq_a": float(pa[i]), "freq_b": float(pb[i])}
                    for i in range(n)]
    res.update(_parameters(Path(run_a), Path(run_b)))
    if figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        x = np.arange(n)
        ax.bar(x - 0.2, pa, 0.4, label=f"A: {Path(run_a).name} (mean {res['mean_a']:.2f})")
        ax.bar(x + 0.2, pb, 0.4, label=f"B: {Path(run_b).name} (mean {res['mean_b']:.2f})")
        ax.set_xlabel("staleness τ")
        ax.set_ylabel("frequency")
        ax.set_title(f"staleness distributions, TV distance {tvd:.3f}")
        ax.legend()
        fig.tight_layout()
        save_figure(fig, figure, dpi=120)
        plt.close(fig)
        res["figure"] = str(figure)
    return res
