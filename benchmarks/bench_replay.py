"""Replay speed, side by side with plain SGD, online runs and one-by-one sweeps.

1. Replay gradient throughput / the fastest plain SGD loop (a Python loop over one jitted
   step, or lax.scan, whichever is faster here) for cifar10-full and an MLP, same batch and
   samples. Target >= 0.9.
2. Online / replay wall time for the quickstart scenario (at --qs-epochs epochs).
3. A 16-point learning-rate sweep over one trace, vmapped, / 16 independent replays.
   Target <= 0.5 on a small model.

    python benchmarks/bench_replay.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _util import best, peak_rss_mib, plain_sgd_loop, plain_sgd_scan  # noqa: E402

from asyncsim.api import simulate  # noqa: E402
from asyncsim.engine import Numerics  # noqa: E402
from asyncsim.online import run  # noqa: E402
from asyncsim.replay import replay, replay_vmapped  # noqa: E402
from asyncsim.scenario import load_scenario  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def async_scn(model, mu, grads, data=None):
    return load_scenario({
        "seed": 0, "model": model,
        "data": data or {"name": "synthetic-cifar", "batch_size": mu, "n_train": 2048,
                         "n_test": 100},
        "cluster": {"learners": 4, "compute": {"dist": "exponential", "mean": 1.0}},
        "protocol": {"kind": "async"}, "optimizer": {"lr": 0.001},
        "run": {"gradients": grads, "eval_samples": 100}})


def replay_vs_plain(name, scn, repeat):
    trace = simulate(scn)
    num = Numerics(scn)
    replay(scn, trace, numerics=num)
    t_replay = best(lambda: replay(scn, trace, numerics=num).params, repeat)
    g = trace.grads
    batches = list(zip(g["learner"].tolist(), g["batch"].tolist(), strict=True))
    mu = scn.data.batch_size
    t_loop = best(plain_sgd_loop(num, 0.001, batches, mu), repeat)
    t_scan = best(plain_sgd_scan(num, 0.001, batches, mu), repeat)
    fastest = min(t_loop, t_scan)
    print(f"1. {name}: {len(batches)} gradients at mu={mu}: replay {t_replay:.3f} s; plain loop "
          f"{t_loop:.3f} s, plain scan {t_scan:.3f} s -> throughput ratio "
          f"{fastest / t_replay:.3f} (target >= 0.9)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--qs-epochs", type=float, default=1.0)
    a = ap.parse_args()
    replay_vs_plain("cifar10-full", async_scn({"name": "cifar10-full"}, 32, 64), a.repeat)
    replay_vs_plain("mlp [128]", async_scn({"name": "mlp", "hidden": [128]}, 32, 1000),
                    a.repeat)

    qs = load_scenario(REPO / "scenarios" / "quickstart.toml",
                       overrides=[f"run.epochs={a.qs_epochs}"])
    num = Numerics(qs)
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

    scn = load_scenario({
        "seed": 0, "model": {"name": "mlp", "hidden": [32]},
        "data": {"name": "synthetic-cifar", "batch_size": 16, "n_train": 1024, "n_test": 100},
        "cluster": {"learners": 8, "compute": {"dist": "exponential", "mean": 1.0}},
        "protocol": {"kind": "async"}, "optimizer": {"lr": 0.01, "lr_rule": "inverse-staleness"},
        "run": {"updates": 400, "eval_samples": 100}})
    trace = simulate(scn)
    num = Numerics(scn)
    hypers = [{"lr": float(x)} for x in np.geomspace(1e-3, 0.1, 16)]
    replay(scn, trace, numerics=num, hyper=hypers[0])
    replay_vmapped(scn, trace, hypers, numerics=num)
    t_single = best(lambda: [replay(scn, trace, numerics=num, hyper=h).params
                             for h in hypers], 1)
    t_vm = best(lambda: [r.params for r in replay_vmapped(scn, trace, hypers, numerics=num)],
                a.repeat)
    print(f"3. 16-point lr sweep, mlp [32], 400 async updates at mu=16: vmapped {t_vm:.2f} s, "
          f"16 replays {t_single:.2f} s -> ratio {t_vm / t_single:.3f} (target <= 0.5)")
    print(f"peak memory (max RSS): {peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
