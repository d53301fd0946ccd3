"""Real (Ray) runs vs the online simulator doing the same gradient work, side by side.

    python benchmarks/bench_real.py [--updates 300] [--learners 3] [--out runs/bench-real]

Reports, for the tiny model (MLP [16], synthetic CIFAR, μ = 8):

* Ray start-up and actor start-up (import + build + compile), which a real run pays once;
* the PS's sustained updates/s in an async real run (``updates_per_s``: updates applied
  per wall second between the first pull and the last update), with the default intra-op
  thread count and with one thread per actor;
* the online simulator's wall time for the same scenario (same number of updates, same
  gradient function and update core), and the ratio real / online;
* the real run's calibrated simulation (empirical compute and link times) and the total
  variation distance between the two staleness distributions (``asyncsim compare``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--learners", type=int, default=3)
    ap.add_argument("--out", default="runs/bench-real")
    args = ap.parse_args()
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(args.out) / "xla-cache"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

    import ray

    from asyncsim.api import run, trace_run
    from asyncsim.calibrate import calibrate, compare
    from asyncsim.drivers.real import RealCluster, real_run
    from asyncsim.scenario import load_scenario

    out = Path(args.out)
    scn = load_scenario({
        "name": "bench-real", "seed": 7, "model": {"name": "mlp", "hidden": [16]},
        "data": {"name": "synthetic-cifar", "batch_size": 8, "n_train": 256, "n_test": 64},
        "cluster": {"learners": args.learners}, "protocol": {"kind": "async"},
        "optimizer": {"lr": 0.05}, "run": {"updates": args.updates}})
    res: dict = {"updates": args.updates, "learners": args.learners, "cpus": os.cpu_count()}

    t = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    res["ray_init_s"] = time.perf_counter() - t

    for threads in (None, 1):
        tag = "default" if threads is None else "one"
        t = time.perf_counter()
        cluster = RealCluster(args.learners, threads=threads)
        s0 = real_run(scn, out=out / f"warm-{tag}", force=True, cluster=cluster)
        res[f"startup_s_{tag}"] = time.perf_counter() - t
        del s0
        best = None
        for rep in range(2):
            s = real_run(scn, out=out / f"real-{tag}-{rep}", force=True, cluster=cluster)
            if best is None or s["updates_per_s"] > best["updates_per_s"]:
                best = s
        res[f"real_updates_per_s_{tag}"] = best["updates_per_s"]
        res[f"real_wall_s_{tag}"] = best["real_wall_time"]
        res[f"threads_{tag}"] = best["threads"]
        res[f"staleness_mean_{tag}"] = best["staleness_mean"]
        cluster.close()

    # The online simulator, same scenario and gradient work, in this process (warm once).
    run(scn)
    walls = []
    for _ in range(2):
        t = time.perf_counter()
        run(scn)
        walls.append(time.perf_counter() - t)
    res["online_wall_s"] = min(walls)
    res["online_updates_per_s"] = args.updates / res["online_wall_s"]
    res["real_over_online"] = res["real_wall_s_default"] / res["online_wall_s"]

    # Calibrate the real run's timing, simulate it, compare staleness distributions.
    real_dir = out / "real-default-0"
    for kind in ("empirical", "parametric"):
        path = calibrate(real_dir, out=out / f"calib-{kind}" / "calibrated.toml", kind=kind)
        trace_run(load_scenario(path), out / f"calib-{kind}" / "sim", force=True)
        cmp = compare(real_dir, out / f"calib-{kind}" / "sim",
                      figure=out / f"calib-{kind}" / "staleness.png")
        res[f"calib_{kind}"] = {k: cmp[k] for k in ("tv_distance", "mean_a", "mean_b",
                                                    "p99_a", "p99_b", "max_a", "max_b")}
    ray.shutdown()
    print(json.dumps(res, indent=1))
    report = Report("bench_real", f"A real run on a local Ray instance ({args.learners} "
                    f"learners, {args.updates} async updates of the tiny MLP) against the "
                    "online simulator doing the same gradient work")
    report.row("real wall time / online wall time", res["real_over_online"])
    for tag, threads in (("default", "the default intra-op threads"),
                         ("one", "one intra-op thread per actor")):
        report.row(f"real run, {threads}: updates per second", res[f"real_updates_per_s_"
                                                                      f"{tag}"], unit="1/s")
        report.row(f"real run, {threads}: Ray actors' start-up", res[f"startup_s_{tag}"],
                   unit="s")
    for kind in ("empirical", "parametric"):
        report.row(f"total variation distance of the staleness, real vs its {kind} "
                   "calibration", res[f"calib_{kind}"]["tv_distance"], unit="distance")
    report.save()


if __name__ == "__main__":
    main()
