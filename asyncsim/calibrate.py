"""``asyncsim calibrate`` and ``asyncsim compare``: a real run's timing fitted as a
scenario, and two runs' staleness distributions side by side. Both read run folders only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from asyncsim import runs
from asyncsim.config import to_dict
from asyncsim.scenario import load_run_scenario, load_scenario
from asyncsim.trace import Trace


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


def calibrate(run_dir: str | Path, *, out: str | Path | None = None,
              kind: str = "empirical") -> Path:
    """Fit the timing of a real run and write a scenario that simulates it.

    ``empirical``: the measured durations go to ``calib_*.csv`` next to the scenario and the
    scenario resamples them (``dist = "empirical"``), per learner for compute, shared for
    the pull and push links. ``parametric``: lognormal by measured mean and cv. The scenario
    is the run's own (model, data, protocol, optimizer, seed) with the same number of
    updates; returns its path.
    """
    run_dir = runs.require_run_folder(run_dir)
    scn = load_run_scenario(run_dir)
    trace = Trace.load(run_dir)
    out = Path(out) if out else run_dir / "calibrated.toml"
    # Written beside the run's files (by default into the run folder): as its one writer.
    with runs.locked(out.parent):
        return _write_calibrated(scn, trace, run_dir, out, kind)


def _write_calibrated(scn, trace, run_dir: Path, out: Path, kind: str) -> Path:
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


def compare(run_a: str | Path, run_b: str | Path, *, figure: str | Path | None = None,
            skip: int = 0) -> dict[str, Any]:
    """Two runs' staleness distributions side by side.

    Returns ``tv_distance`` (½ Σ|p_a − p_b|, in [0, 1]), per run mean, p99, max and count,
    and ``table`` (staleness, freq_a, freq_b). With ``figure`` draws both as bars (Agg).
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
        Path(figure).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(figure, dpi=120)
        plt.close(fig)
        res["figure"] = str(figure)
    return res
