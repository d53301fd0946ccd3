"""The GPU path, measured: P1's network at P1's per-learner batch, and a projection of every
study's paper profile wall time from what is measured here.

One script, one table (at most ~5 minutes on one GPU; ``--tiny``: the same rows at toy size on
the CPU in well under two minutes, tested in tests/cli/test_bench_gpu.py):

1. gradients/s at mu = 4 of P1's network (``cifar10-full``): one jitted call per gradient;
   one vmapped call per read version for lambda = 30 learners (``grouping = "version"``, what
   hardsync's updates share); one vmapped call over K distinct versions (K gradients whose
   read versions already exist, as a replay's version store holds them);
2. an online run (30-softsync, lambda = 30, mu = 4) / the plain jitted mu = 4 SGD loop over
   the same samples;
3. replay of that run's trace: the loop path, the compiled-scan path, and the batched path
   (``drivers/batched.py``: the gradients of many updates per call, vmapped over the
   versions they read) at several gradients per call, as a fraction of the loop's time --
   where it drops below 1 is the crossover;
4. a 16-point learning-rate sweep over the trace in one vmapped program / 16 loop replays;
5. peak memory: the device's peak bytes in use where the backend reports it (GPU), else the
   process's max RSS;
6. the projections: every scenario's ``paper`` profile (its points, epochs, train-set size
   and mu, read from the file) needs ``points x epochs x n_train / mu`` gradients (a row
   each); for the profiles that train P1's network at mu = 4, at row 2's online rate that
   is the wall time below (other models and batches need their own rate); P1-F3's also
   at the best batched replay's rate (a sweep's points replay one shared trace) and at row
   1's fastest rate, a lower bound for a driver that batched every gradient that way.
   Evaluations and compilation are not included.

    python benchmarks/bench_gpu.py [--tiny]

Nothing here changes a number asyncsim computes: the rows time the existing programs.
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncsim  # noqa: E402, F401  (first: it fixes XLA's thread count)

# isort: split
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _report import Report  # noqa: E402
from _util import best, best_interleaved, peak_rss_mib, plain_sgd_loop  # noqa: E402

from asyncsim.api import run, simulate  # noqa: E402
from asyncsim.drivers.build import numerics_for  # noqa: E402
from asyncsim.drivers.replay import replay  # noqa: E402
from asyncsim.drivers.run_length import gradients_of, run_length  # noqa: E402
from asyncsim.drivers.scan import replay_scan  # noqa: E402
from asyncsim.drivers.vmapped import replay_vmapped  # noqa: E402
from asyncsim.errors import ScenarioError  # noqa: E402
from asyncsim.numerics.numerics import Numerics  # noqa: E402
from asyncsim.scenario import load_scenario, point_scenarios  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# (model, learners, samples of the online epoch, gradients timed one by one, K versions,
#  the batched replay's gradients per call)
SIZES = {
    "full": ({"name": "cifar10-full"}, 30, 12_800, 2_000, 64, (8, 32, 64)),
    "tiny": ({"name": "mlp", "hidden": [16], "input_pool": 4}, 6, 480, 200, 8, (2, 8)),
}
MU = 4


def scenario(model, learners, samples, protocol, n_train):
    return load_scenario({
        "seed": 0, "model": model,
        "data": {"name": "synthetic-cifar", "batch_size": MU, "n_train": n_train,
                 "n_test": 100},
        "cluster": {"learners": learners, "compute": {"dist": "lognormal", "mean": 1.0,
                                                      "cv": 0.1}},
        "protocol": protocol, "optimizer": {"lr": 0.001},
        "run": {"gradients": samples // MU, "eval_samples": 100}})


def gradient_rates(num: Numerics, learners: int, grads: int, k: int, repeat: int):
    """Row 1: gradients/s one by one, grouped by one version, vmapped over K versions."""
    params = num.init_params()
    x, y = num.x_train, num.y_train
    pairs = [(i % learners, i // learners) for i in range(grads)]

    def one_by_one():
        return [num.grad(params, x, y, np.int32(l), np.int32(b))[0] for l, b in pairs]

    ls = np.asarray([l for l, _ in pairs[:learners]], np.int32)
    bs = np.asarray([b for _, b in pairs[:learners]], np.int32)
    rounds = max(1, grads // learners)

    def grouped():
        return [num._grad_group(params, x, y, ls, bs + r)[0] for r in range(rounds)]

    versions = jax.tree_util.tree_map(
        lambda p: jnp.stack([p * (1.0 + 1e-3 * i) for i in range(k)]), params)
    over_versions = jax.jit(jax.vmap(num.programs.one, in_axes=(0, None, None, 0, 0)))
    kl = np.arange(k, dtype=np.int32) % learners
    per = max(1, grads // k)

    def vmapped():
        return [over_versions(versions, x, y, kl, np.full(k, r, np.int32))[0]
                for r in range(per)]

    fns = {"one by one": one_by_one, "grouped by version": grouped,
           f"vmapped over {k} versions": vmapped}
    counts = {"one by one": grads, "grouped by version": rounds * learners,
              f"vmapped over {k} versions": per * k}
    for fn in fns.values():
        jax.block_until_ready(fn())  # compile
    t = best_interleaved(fns, repeat)
    return {name: counts[name] / t[name] for name in fns}


def device_peak() -> str:
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return f"{stats['peak_bytes_in_use'] / 2**20:.0f} MiB on {jax.devices()[0].device_kind}"
    return f"{peak_rss_mib():.0f} MiB (max RSS; the {jax.default_backend()} backend reports " \
           f"no device peak)"


def paper_gradients(points) -> int:
    """The gradients of a paper profile's ``points``: each point's run length as its run
    computes it (epochs x train-set size / mu; updates through its protocol)."""
    total = 0
    for p in points:
        n_train = int(p.data.options.get("n_train", 50_000))
        total += int(round(gradients_of(p, run_length(p, n_train=n_train))))
    return total


def paper_profiles() -> dict[str, list]:
    """The points of every scenario in scenarios/ that has a ``paper`` profile on a data set
    asyncsim builds, by scenario name (P1-F4's ImageNet is not one: its size is not known
    here)."""
    out = {}
    for file in sorted((REPO / "scenarios").glob("*.toml")):
        with open(file, "rb") as f:
            if "paper" not in tomllib.load(f).get("profiles", {}):
                continue
        try:
            scn = load_scenario(file, profile="paper")
        except ScenarioError:
            continue
        out[file.stem] = [p for _, _, p in point_scenarios(scn)]
    return out


def at_p1_scale(points) -> bool:
    """Whether every one of a paper profile's ``points`` trains P1's network at mu = MU,
    the gradients this script times (P2's ResNet-44 at batch 128 costs other time)."""
    return all((p.model.name, p.data.batch_size) == ("cifar10-full", MU) for p in points)


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="toy size, on whatever JAX runs on")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    model, lam, samples, grads, k, batches = SIZES["tiny" if a.tiny else "full"]
    t_start = time.perf_counter()
    print(f"backend: {jax.default_backend()} ({jax.devices()[0].device_kind}); model "
          f"{model['name']}, mu = {MU}, lambda = {lam}")
    rows: dict[str, float] = {}
    width = 60
    print(f"{'measure':<{width}}  value")

    def report(name: str, value: float) -> None:
        rows[name] = value  # printed as soon as it is measured: a long run shows progress
        print(f"{name:<{width}}  {value:,.3f}", flush=True)

    num = numerics_for(scenario(model, lam, samples, {"kind": "async"}, max(samples, 1024)))
    for name, rate in gradient_rates(num, lam, grads, k, a.repeat).items():
        report(f"gradients/s, {name}", rate)

    scn = scenario(model, lam, samples, {"kind": "softsync", "n": lam}, max(samples, 1024))
    snum = numerics_for(scn)
    res = run(scn, numerics=snum)  # compiles
    g = res.trace.grads
    plain = plain_sgd_loop(snum, 0.001, list(zip(g["learner"].tolist(), g["batch"].tolist(),
                                                 strict=True)), MU)
    t = best_interleaved({"online": lambda: run(scn, numerics=snum).params, "plain": plain},
                         a.repeat)
    report("online / plain SGD (time)", t["online"] / t["plain"])
    report("online gradients/s", res.trace.num_gradients / t["online"])

    trace = simulate(scn)
    replay(scn, trace, numerics=snum)
    replay_scan(scn, trace, numerics=snum)
    t = best_interleaved({"loop": lambda: replay(scn, trace, numerics=snum).params,
                          "scan": lambda: replay_scan(scn, trace, numerics=snum).params},
                         a.repeat)
    report("replay loop (s)", t["loop"])
    report("replay scan (s)", t["scan"])
    # The batched path: the gradients of many updates per call (drivers/batched.py); where
    # it overtakes the loop is the crossover this row measures.
    for kb in batches:
        replay(scn, trace, batch=kb, numerics=snum)
    t = best_interleaved({kb: (lambda kb=kb: replay(scn, trace, batch=kb,
                                                    numerics=snum).params)
                          for kb in batches}, a.repeat)
    for kb in batches:
        report(f"replay batched, {kb} gradients per call / loop (time)",
               t[kb] / rows["replay loop (s)"])
    batched_rate = trace.num_gradients / min(t.values())

    hypers = [{"lr": float(x)} for x in np.geomspace(1e-4, 1e-2, 16)]
    replay_vmapped(scn, trace, hypers, numerics=snum)
    t_vm = best(lambda: [r.params for r in replay_vmapped(scn, trace, hypers, numerics=snum)],
                1)
    report("16-point vmapped sweep / 16 loop replays", t_vm / (16 * rows["replay loop (s)"]))

    fastest = max(v for name, v in rows.items() if name.startswith("gradients/s"))
    # Each paper profile at the online rate (one point at a time, as `asyncsim run` runs
    # it); P1-F3's also at the batched replay rate and the fastest gradient rate's bound.
    for name, points in paper_profiles().items():
        total = paper_gradients(points)
        rows[f"{name} paper profile gradients"] = float(total)
        if at_p1_scale(points):
            report(f"{name} paper profile ({len(points)} runs), projected at the online rate "
                   "(h)", total / rows["online gradients/s"] / 3600)
    total = rows["p1_f3_lr_modulation paper profile gradients"]
    report("p1_f3_lr_modulation paper profile, projected at the batched rate (h)",
           total / batched_rate / 3600)
    report("p1_f3_lr_modulation paper profile, bound at the fastest gradient rate (h)",
           total / fastest / 3600)
    print(f"{'peak memory':<{width}}  {device_peak()}")
    print(f"(paper profiles: gradients of mu = {MU} over the measured rate, without "
          f"evaluations or compilation"
          f"{'; --tiny times a toy model, so its projections say nothing' if a.tiny else ''}; "
          f"this script: {time.perf_counter() - t_start:.0f} s)")
    if argv is None and not a.tiny:  # a toy model's numbers say nothing: not kept
        kept = Report(f"bench_gpu_{jax.default_backend()}", "The gradient paths at P1's "
                      f"scale on the {jax.default_backend()} backend "
                      f"({jax.devices()[0].device_kind}), and every study's paper profile "
                      "projected from them")
        for name, value in rows.items():
            kept.row(name, value, unit="h" if name.endswith("(h)") else "")
        kept.save()
    return rows


if __name__ == "__main__":
    main()
