"""Online driver overhead, measured side by side with a plain jitted SGD loop.

1. cifar10-full at mu = 128: an online run (4 learners, async, so one gradient per update)
   vs a plain loop over one jitted SGD step doing the same gradients (same model, batch,
   samples). Target: ratio <= 1.10.
2. P1's lambda = 30, mu = 4, 30-softsync epoch vs a plain SGD epoch at batch 128 over the
   same number of samples. Target: <= 1.2 (the mu = 4 calls alone cost ~0.78 of batch 128
   per sample on 2 CPU cores; the rest is the simulator's own overhead).
3. Grouping of gradients that share a read version (hardsync, lambda = 30, mu = 4): one
   vmapped call per version vs each gradient by itself (``grouping="none"``: in programs of
   ``Numerics.fused_rows`` gradients).
4. An epoch of the studies' MLP under 4-softsync (c = 7 gradients an update) vs 30-softsync
   (c = 1): the cost of summing an update's slots. Target: <= 1.2.
5. The same 30-softsync epoch with P2's shifted momentum (30 per-learner buffers) vs
   heavy-ball (one): the cost of keeping a buffer per learner. Target: <= 1.2.
6. A 4-softsync MLP epoch with heavy-ball momentum and delay compensation (gap-aware,
   DC-ASGD-a), each vs the same epoch without: the cost of rewriting each of an update's 7
   gradients from the version it read. Target: <= 1.5 (one more pass over the parameters
   per gradient at most doubles an update's cost, about half the epoch's).
7. The same 4-softsync epoch (heavy-ball) with each update's gradients and the update in one
   compiled call (``Numerics.fused_rows``) vs its 7 gradients called one by one and the
   update program: the same bits, fewer dispatches. Target: <= 0.8.
8. An MLP hardsync epoch (c = 30 gradients an update, above the MLP's fused_rows of 10):
   gradients in programs of 10 vs one by one, and one program of all 30 vs programs of 10
   (the bound: above 32 MiB of temporaries a program's buffer is faulted in at every call).
Reports peak memory (max RSS) too.

    python benchmarks/bench_online.py [--grads 16] [--epoch-samples 1280]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncsim  # noqa: E402, F401  (first: it fixes XLA's thread count)

# isort: split
from _report import Report, ratios  # noqa: E402
from _util import interleaved, peak_rss_mib, plain_sgd_loop  # noqa: E402

from asyncsim.api import run  # noqa: E402
from asyncsim.drivers.build import numerics_for  # noqa: E402
from asyncsim.numerics.core import param_hash  # noqa: E402
from asyncsim.scenario import load_scenario  # noqa: E402


def scenario(learners, mu, n_train, proto, updates=None, gradients=None,
             model="cifar10-full", momentum="none", compensation=None):
    r = {"updates": updates} if updates else {"gradients": gradients}
    comp = {"compensation": {"kind": compensation}} if compensation else {}
    return load_scenario({
        "seed": 0, "model": {"name": model},
        "data": {"name": "synthetic-cifar", "batch_size": mu, "n_train": n_train,
                 "n_test": 100},
        "cluster": {"learners": learners, "compute": {"dist": "lognormal", "mean": 1.0,
                                                      "cv": 0.1}},
        "protocol": proto, "run": r | {"eval_samples": 100},
        "optimizer": {"lr": 0.001, "momentum": {"kind": momentum, "beta": 0.9}} | comp})


def compiled_run(scn, num=None):
    """A run of ``scn`` to time (its final params), its programs compiled by one run first."""
    num = num or numerics_for(scn)
    run(scn, numerics=num)
    return lambda: run(scn, numerics=num).params


def ratio_row(report, t, num, den, what, row, target):
    """Print and record the ratio of the best times ``t[num] / t[den]`` (their per-round
    ratios as its spread)."""
    r = min(t[num]) / min(t[den])
    print(f"{what}: {min(t[num]):.3f} s / {min(t[den]):.3f} s -> ratio {r:.3f} "
          f"(target {target})")
    report.row(row, r, target=target, repeats=ratios(t[num], t[den]))


def rows_timed(scn, bounds, repeat):
    """Wall times of ``scn``'s run with each ``bounds`` value as its Numerics' fused_rows
    (None: its own), side by side, ``repeat`` rounds; their final parameters checked equal
    (the bound chooses among bit-identical paths)."""
    num = numerics_for(scn)
    runs = {}
    for name, bound in bounds.items():
        n = copy.copy(num)
        n.fused_rows = num.fused_rows if bound is None else bound
        runs[name] = compiled_run(scn, n)
    hashes = {param_hash(r()) for r in runs.values()}
    assert len(hashes) == 1, f"fused_rows changed the numbers: {hashes}"
    return interleaved(runs, repeat)


def online_vs_plain(scn, repeat):
    """Wall times of the online run and of a plain loop over the same gradients, timed
    side by side, ``repeat`` rounds; and the number of gradients."""
    num = numerics_for(scn)
    res = run(scn, numerics=num)  # compiles
    g = res.trace.grads
    batches = list(zip(g["learner"].tolist(), g["batch"].tolist(), strict=True))
    plain = plain_sgd_loop(num, 0.001, batches, scn.data.batch_size)
    t = interleaved({"online": lambda: run(scn, numerics=num).params, "plain": plain}, repeat)
    return t["online"], t["plain"], len(batches)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grads", type=int, default=16)
    ap.add_argument("--epoch-samples", type=int, default=1280)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    report = Report("bench_online", "The online driver against a plain jitted SGD loop over "
                    "the same gradients, side by side")
    scn = scenario(4, 128, 2048, {"kind": "async"}, gradients=a.grads)
    to, tp, n = online_vs_plain(scn, a.repeat)
    print(f"1. cifar10-full mu=128, {n} gradients: online {min(to):.3f} s, plain jitted SGD "
          f"loop {min(tp):.3f} s -> ratio {min(to) / min(tp):.3f} (target <= 1.10)")
    report.row(f"online / plain SGD loop, cifar10-full, mu = 128, {n} gradients",
               min(to) / min(tp), target="<= 1.10", repeats=ratios(to, tp))

    n = a.epoch_samples
    scn = scenario(30, 4, n, {"kind": "softsync", "n": 30}, gradients=n // 4)
    num = numerics_for(scn)
    epoch = compiled_run(scn, num)
    ref = scenario(1, 128, n, {"kind": "async"}, gradients=n // 128)
    rnum = numerics_for(ref)
    plain = plain_sgd_loop(rnum, 0.001, [(0, b) for b in range(n // 128)], 128)
    plain4 = plain_sgd_loop(num, 0.001, [(i % 30, i // 30) for i in range(n // 4)], 4)
    t = interleaved({"epoch": epoch, "ref": plain, "mu4": plain4}, a.repeat)
    t_epoch, t_ref, t4 = (min(t[k]) for k in ("epoch", "ref", "mu4"))
    print(f"2. P1 lambda=30 mu=4 30-softsync epoch of {n} samples: {t_epoch:.3f} s; plain SGD "
          f"batch 128 epoch {t_ref:.3f} s -> ratio {t_epoch / t_ref:.3f} (target <= 1.2)")
    print(f"   (plain SGD at mu=4 over the same samples: {t4:.3f} s = {t4 / t_ref:.3f} of "
          f"batch 128; simulator overhead = {t_epoch / t4:.3f}x the bare mu=4 loop)")
    report.row(f"P1's 30-softsync epoch (lambda = 30, mu = 4, {n} samples) / a plain SGD "
               "epoch at batch 128", t_epoch / t_ref, target="<= 1.2",
               repeats=ratios(t["epoch"], t["ref"]))
    report.row("the same epoch / a plain SGD loop at mu = 4 (the simulator's own overhead)",
               t_epoch / t4, repeats=ratios(t["epoch"], t["mu4"]))

    scn = scenario(30, 4, 1200, {"kind": "hardsync"}, updates=4)
    t = interleaved({g: compiled_run(scn, numerics_for(scn, grouping=g))
                     for g in ("none", "version")}, a.repeat)
    for grouping, ts in t.items():
        print(f"3. hardsync lambda=30 mu=4, 4 updates, grouping={grouping}: {min(ts):.3f} s")
    report.row("hardsync, lambda = 30, mu = 4: gradients grouped by version / each by itself",
               min(t["version"]) / min(t["none"]), repeats=ratios(t["version"], t["none"]),
               note="above 1: grouping is slower on this backend (the default on CPU: none)")
    # n-softsync with c = 7 gradients an update against c = 1, over the same gradients, on
    # the studies' MLP (its 3072 x 128 layer is where a slow slot sum shows): what summing
    # an update's slots (asyncsim.numerics.aggregation.weighted_sum) costs.
    m = 4096
    t = interleaved({nn: compiled_run(scenario(30, 4, m, {"kind": "softsync", "n": nn},
                                               gradients=m // 4, model="mlp"))
                     for nn in (4, 30)}, a.repeat)
    ratio_row(report, t, 4, 30, f"4. an MLP epoch of {m} samples, 4-softsync / 30-softsync",
              f"an MLP [128] epoch, 4-softsync (c = 7 gradients an update) / 30-softsync "
              f"(c = 1), lambda = 30, mu = 4, {m} samples", "<= 1.2")
    # The same 30-softsync epoch with one momentum buffer per learner (P2's shifted
    # momentum) against one buffer: the update programs must write the buffer in place.
    t = interleaved({k: compiled_run(scenario(30, 4, m, {"kind": "softsync", "n": 30},
                                              gradients=m // 4, model="mlp", momentum=k))
                     for k in ("heavy-ball", "shifted")}, a.repeat)
    ratio_row(report, t, "shifted", "heavy-ball",
              "5. the MLP's 30-softsync epoch, shifted momentum / heavy-ball",
              f"an MLP [128] 30-softsync epoch, shifted momentum (30 buffers) / heavy-ball "
              f"(one), lambda = 30, mu = 4, {m} samples", "<= 1.2")
    # A 4-softsync epoch with each delay compensation against none: the rewrite
    # of every gradient (asyncsim.numerics.compensation) runs slot by slot over the layer.
    soft4 = {"kind": "softsync", "n": 4}
    t = interleaved({k: compiled_run(scenario(30, 4, m, soft4, gradients=m // 4, model="mlp",
                                              momentum="heavy-ball",
                                              compensation=None if k == "none" else k))
                     for k in ("none", "gap-aware", "dc-asgd-a")}, a.repeat)
    for k in ("gap-aware", "dc-asgd-a"):
        ratio_row(report, t, k, "none", f"6. the MLP's 4-softsync epoch, {k} / none",
                  f"an MLP [128] 4-softsync epoch, {k} compensation / none (heavy-ball), "
                  f"lambda = 30, mu = 4, {m} samples", "<= 1.5")
    # The same epoch with each update in one compiled call against its gradients called one
    # by one, then the update program (fused_rows = 1): the same bits, fewer dispatches.
    scn = scenario(30, 4, m, soft4, gradients=m // 4, model="mlp", momentum="heavy-ball")
    t = rows_timed(scn, {"one": None, "split": 1}, a.repeat)
    ratio_row(report, t, "one", "split",
              "7. the MLP's 4-softsync epoch, one call an update / gradients one by one",
              f"an MLP [128] 4-softsync epoch (heavy-ball), each update in one compiled call "
              f"/ its 7 gradients called one by one, then the update program, lambda = 30, "
              f"mu = 4, {m} samples", "<= 0.8")
    # Hardsync's 30 gradients an update, above the MLP's bound of 10: in programs of 10
    # (the default), one by one, and all 30 in one program.
    scn = scenario(30, 4, m, {"kind": "hardsync"}, gradients=m // 4, model="mlp",
                   momentum="heavy-ball")
    t = rows_timed(scn, {10: None, 1: 1, 30: 30}, a.repeat)
    ratio_row(report, t, 10, 1, "8. the MLP's hardsync epoch, programs of 10 / one by one",
              f"an MLP [128] hardsync epoch (c = 30), gradients in programs of 10 / one by "
              f"one, lambda = 30, mu = 4, {m} samples", "<= 0.9")
    ratio_row(report, t, 30, 10, "8. the same epoch, one program of 30 / programs of 10",
              "the same epoch, all 30 gradients in one program / in programs of 10 (above "
              "1: the bound is right)", "> 1")
    print(f"peak memory (max RSS): {peak_rss_mib():.0f} MiB")
    report.save()


if __name__ == "__main__":
    main()
