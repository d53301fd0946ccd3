"""Replay speed, side by side with plain SGD, online runs and one-by-one sweeps.

1. Replay gradient throughput (its faster path: loop or scan) / the fastest plain SGD loop
   (a Python loop over one jitted step, or lax.scan, whichever is faster here) for
   cifar10-full and an MLP, same batch and samples. Target >= 0.9.
2. Online / replay wall time for the quickstart scenario (at --qs-epochs epochs).
3. A 16-point learning-rate sweep over one trace, as sweeps run it (sweep_path's measured
   choice of vmapped or one by one, loop or scan), / 16 independent replays on their faster
   path. Target <= 0.5 on a small model; also shown for a FLOP-bound one.

    python benchmarks/bench_replay.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncsim  # noqa: E402, F401  (first: it fixes XLA's thread count)

# isort: split
import jax  # noqa: E402
import numpy as np  # noqa: E402
from _report import Report, ratios  # noqa: E402
from _util import (  # noqa: E402
    best,
    interleaved,
    peak_rss_mib,
    plain_sgd_loop,
    plain_sgd_scan,
)

from asyncsim.api import (
    run,  # noqa: E402
    simulate,  # noqa: E402
)
from asyncsim.drivers.build import numerics_for  # noqa: E402
from asyncsim.drivers.choose import sweep_path  # noqa: E402
from asyncsim.drivers.replay import replay  # noqa: E402
from asyncsim.drivers.scan import replay_scan  # noqa: E402
from asyncsim.drivers.slots import slot_plan  # noqa: E402
from asyncsim.drivers.vmapped import replay_vmapped  # noqa: E402
from asyncsim.numerics.models import num_params  # noqa: E402
from asyncsim.scenario import load_scenario  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def async_scn(model, mu, grads, data=None, learners=4):
    return load_scenario({
        "seed": 0, "model": model,
        "data": data or {"name": "synthetic-cifar", "batch_size": mu, "n_train": 2048,
                         "n_test": 100},
        "cluster": {"learners": learners, "compute": {"dist": "exponential", "mean": 1.0}},
        "protocol": {"kind": "async"}, "optimizer": {"lr": 0.001},
        "run": {"gradients": grads, "eval_samples": 100}})


def replay_vs_plain(report, name, scn, repeat, *, scan=True):
    """scan=False: skip replay's scan path and time the plain scan once (on 2 CPU cores a
    scan over convolutions is ~20x slower than a loop of jitted steps: ~140 s here)."""
    trace = simulate(scn)
    num = numerics_for(scn)
    g = trace.grads
    batches = list(zip(g["learner"].tolist(), g["batch"].tolist(), strict=True))
    mu = scn.data.batch_size
    fns = {"replay loop": lambda: replay(scn, trace, numerics=num).params,
           "plain loop": plain_sgd_loop(num, 0.001, batches, mu)}
    if scan:
        fns["replay scan"] = lambda: replay_scan(scn, trace, numerics=num).params
        fns["plain scan"] = plain_sgd_scan(num, 0.001, batches, mu)
        # The scan path's other store, side by side: stale parameter versions in a buffer.
        store = replay_scan(scn, trace.truncate(50), numerics=num).summary["replay_store"]
        if store == "gradients":
            fns["replay scan, versions"] = lambda: replay_scan(scn, trace, numerics=num,
                                                               store="versions").params
    for fn in fns.values():
        jax.block_until_ready(fn())  # compile
    rounds = interleaved(fns, repeat)
    t = {k: min(v) for k, v in rounds.items()}
    if not scan:
        t["replay scan"] = float("inf")
        t["plain scan"] = best(plain_sgd_scan(num, 0.001, batches, mu), 1)
        rounds["plain scan"] = [t["plain scan"]] * repeat
    fastest = min(t["plain loop"], t["plain scan"])
    path = min(("loop", "scan"), key=lambda p: t[f"replay {p}"])
    _, k = slot_plan(trace)
    # What replay adds per update over the fastest plain loop, next to the parameter bytes
    # (what the versions store copies out and in per stale update): a fixed cost per update.
    extra_ms = (t[f"replay {path}"] - fastest) / trace.num_updates * 1e3
    mbytes = num_params(num.init_params()) * 4 / 2**20
    versions = (f"; the scan keeping versions instead: {t['replay scan, versions']:.3f} s, "
                f"ratio {fastest / t['replay scan, versions']:.3f}"
                if "replay scan, versions" in t else "")
    print(f"1. {name}: {len(batches)} gradients at mu={mu} (async, max staleness "
          f"{trace.max_staleness}, {k} versions alive at most): replay loop "
          f"{t['replay loop']:.3f} s, replay scan {t['replay scan']:.3f} s; plain loop "
          f"{t['plain loop']:.3f} s, plain scan {t['plain scan']:.3f} s -> throughput ratio "
          f"{fastest / t[f'replay {path}']:.3f} with the {path} path (target >= 0.9); "
          f"replay adds {extra_ms:+.3f} ms per update ({mbytes:.2f} MiB of parameters)"
          f"{versions}")
    fastest_rounds = [min(a, b) for a, b in zip(rounds["plain loop"], rounds["plain scan"],
                                                strict=True)]
    report.row(f"replay throughput / the fastest plain SGD, {name} ({path} path)",
               fastest / t[f"replay {path}"], target=">= 0.9",
               repeats=ratios(fastest_rounds, rounds[f"replay {path}"]))


def sweep_vs_single(report, name, model, repeat, target=None):
    scn = load_scenario({
        "seed": 0, "model": model,
        "data": {"name": "synthetic-cifar", "batch_size": 16, "n_train": 1024, "n_test": 100},
        "cluster": {"learners": 8, "compute": {"dist": "exponential", "mean": 1.0}},
        "protocol": {"kind": "async"},
        "optimizer": {"lr": 0.01, "lr_rule": "inverse-staleness",
                      "momentum": {"kind": "heavy-ball", "beta": 0.9}},
        "run": {"updates": 400, "eval_every": 100, "eval_samples": 100}})
    trace = simulate(scn)
    num = numerics_for(scn)
    hypers = [{"lr": float(x)} for x in np.geomspace(1e-3, 0.03, 16)]
    mode, path = sweep_path(scn, trace, hypers, numerics=num)
    singles = {}
    for p, fn in (("loop", replay), ("scan", replay_scan)):
        fn(scn, trace, numerics=num, hyper=hypers[0])
        singles[p] = best(lambda fn=fn: [fn(scn, trace, numerics=num, hyper=h).params
                                         for h in hypers], 1)
    vm = {}
    for p in ("loop", "scan"):
        replay_vmapped(scn, trace, hypers, numerics=num, path=p)
        vm[p] = best(lambda p=p: [r.params for r in replay_vmapped(scn, trace, hypers,
                                                                   numerics=num, path=p)],
                     repeat)
    t_single = min(singles.values())
    t_chosen = vm[path] if mode == "vmapped" else singles[path]
    report.row(f"16-point lr sweep as sweeps run it / 16 replays on their faster path, {name}",
               t_chosen / t_single, target=target, note=f"sweeps choose {mode} {path}")
    print(f"3. 16-point lr sweep, {name}, 400 async updates at mu=16, eval every 100: "
          f"16 replays loop {singles['loop']:.2f} s / scan {singles['scan']:.2f} s; vmapped "
          f"loop {vm['loop']:.2f} s / scan {vm['scan']:.2f} s; sweeps choose {mode} {path} "
          f"-> {t_chosen:.2f} s; ratio to the faster 16 replays {t_chosen / t_single:.3f}"
          + (f" (target {target})" if target else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--qs-epochs", type=float, default=1.0)
    a = ap.parse_args()
    report = Report("bench_replay", "Replay against plain SGD, online against replay, and "
                    "sweeps over one trace against one replay per point, side by side")
    replay_vs_plain(report, "cifar10-full", async_scn({"name": "cifar10-full"}, 32, 64), a.repeat,
                    scan=False)
    replay_vs_plain(report, "mlp [128]", async_scn({"name": "mlp", "hidden": [128]}, 32, 1000),
                    a.repeat)
    # The version buffer costs a fixed ~0.1-0.3 ms per update on 2 CPU cores (copying a
    # stale version out for the gradient, the new one in): a 4x larger batch amortises it.
    replay_vs_plain(report, "mlp [128] at mu=128", async_scn({"name": "mlp", "hidden": [128]},
                                                             128, 1000), a.repeat)
    # Control: one learner, so no stale reads; the scan path then needs no version buffer.
    replay_vs_plain(report, "mlp [128], 1 learner", async_scn({"name": "mlp", "hidden": [128]},
                                                              32, 1000, learners=1), a.repeat)

    qs = load_scenario(REPO / "scenarios" / "quickstart.toml",
                       overrides=[f"run.epochs={a.qs_epochs}"])
    num = numerics_for(qs)
    t0 = time.perf_counter()
    res = run(qs, numerics=num)
    t_online = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = replay(qs, res.trace, numerics=num)
    t_replay = time.perf_counter() - t0
    assert again.summary["param_hash"] == res.summary["param_hash"]
    print(f"2. quickstart ({a.qs_epochs} epochs, {res.trace.num_updates} updates): online "
          f"{t_online:.2f} s (incl. compile), replay {t_replay:.2f} s -> online/replay "
          f"{t_online / t_replay:.2f}; same param_hash")
    report.row(f"online / replay of the quickstart ({a.qs_epochs} epochs, compiling included)",
               t_online / t_replay)

    # The target is the small model's, where the simulator's own work shows; the FLOP-bound
    # model is context (its 16 points' arithmetic is the cost, shared or not).
    sweep_vs_single(report, "mlp [32] on 4x4-pooled input (small)",
                    {"name": "mlp", "hidden": [32], "input_pool": 4}, a.repeat, "<= 0.5")
    sweep_vs_single(report, "mlp [32] on the full 3072 input", {"name": "mlp", "hidden": [32]},
                    a.repeat)
    print(f"peak memory (max RSS): {peak_rss_mib():.0f} MiB")
    report.save()


if __name__ == "__main__":
    main()
