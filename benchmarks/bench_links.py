"""Trace-only speed with the PS's shared interface vs private links only (issue: clusters
as they are; target: within 2x).

Side by side in one process, lambda = 30 learners, async, exponential compute times, 358 kB
messages (P1's network), four clusters: private links that cost nothing (one event per
gradient, the compute); private links of 100 MB/s each (a pull and a push are timed: three
events per gradient, the baseline a shared interface is measured against -- a cluster whose
transfers take time at all); the same with the PS's shared ingress and egress of 10.7 MB/s
(the rate at which the interface carries 30 messages per time unit, so transfers overlap
and the sharing code does real work), FIFO and fair (processor sharing); and learners that
come and go (``cluster.availability``: exponential up periods of mean 50 and down periods of
mean 10 compute times, so a sixth of the time is down and gradients are lost), alone and with
each shared interface; and fair sharing at 10x that bandwidth (the interface a tenth
loaded: fewer transfers overlap), alone and with availability. Reports gradients per CPU
second of this process (its CPU time, not the wall clock: other work on the machine then
moves the ratios less; the best run of each row) and each row's ratio to the timed private
links, taken per pair of runs side by side (the median and the range over the repeats).

    python benchmarks/bench_links.py [--gradients 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Report  # noqa: E402

from asyncsim.api import simulate  # noqa: E402
from asyncsim.scenario import load_scenario  # noqa: E402

BYTES = 358_312


AVAILABILITY = {"up": {"dist": "exponential", "mean": 50.0},
                "down": {"dist": "exponential", "mean": 10.0}}


def scenario(sharing: str | None, gradients: int, *, private: float = float("inf"),
             churn: bool = False, headroom: float = 1.0):
    net = {"pull": {"bytes": BYTES, "bandwidth": private},
           "push": {"bytes": BYTES, "bandwidth": private}}
    if sharing is not None:
        for d in ("ps_ingress", "ps_egress"):
            net[d] = {"bandwidth": 30 * BYTES * headroom, "sharing": sharing}
    cluster = {"learners": 30, "compute": {"dist": "exponential", "mean": 1.0}, "network": net}
    if churn:
        cluster["availability"] = AVAILABILITY
    return load_scenario({"seed": 0, "cluster": cluster, "protocol": {"kind": "async"},
                          "run": {"gradients": gradients, "trace_only": True}})


def main(argv=None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gradients", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    rows = {"free links": (None, float("inf"), False, 1.0),
            "private links": (None, 1e8, False, 1.0),
            "+ shared, fifo": ("fifo", 1e8, False, 1.0),
            "+ shared, fair": ("fair", 1e8, False, 1.0),
            "+ availability": (None, 1e8, True, 1.0),
            "+ avail., fifo": ("fifo", 1e8, True, 1.0),
            "+ avail., fair": ("fair", 1e8, True, 1.0),
            "+ fair, 10x bw": ("fair", 1e8, False, 10.0),
            "+ avail., fair, 10x bw": ("fair", 1e8, True, 10.0)}

    def timed(name: str) -> float:
        sharing, private, churn, headroom = rows[name]
        scn = scenario(sharing, a.gradients, private=private, churn=churn, headroom=headroom)
        t0 = time.process_time()
        simulate(scn)
        return time.process_time() - t0

    base = "private links"
    best: dict[str, float] = {}
    ratios: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(a.repeat):
        for name in rows:
            # Each row right beside a run of the timed private links, in turn first and
            # second: its ratio is taken per pair, so a slow spell of the machine (this one's
            # speed drifts by 10-20% over seconds) slows both runs of a pair, not one row's.
            pair = [name] if name == base else ([base, name] if r % 2 else [name, base])
            t = {n: timed(n) for n in pair}
            for n, v in t.items():
                best[n] = min(best.get(n, float("inf")), v)
            ratios[name].append(t[name] / t[base])
    print(f"{'':<23} {'gradients/CPU s':>15}   x the timed private links' time: median of "
          f"{a.repeat} pairs [range]")
    report = Report("bench_links", "Trace-only CPU time with the PS's shared interface and "
                    "learners that come and go, against timed private links, pair by pair")
    for name in rows:
        q = sorted(ratios[name])
        print(f"{name:<23} {a.gradients / best[name]:>15,.0f}   {statistics.median(q):5.2f}x "
              f"[{q[0]:.2f}-{q[-1]:.2f}]")
        if name != base:
            report.row(f"lambda = 30 async, {a.gradients:,} gradients: {name} / private links",
                       statistics.median(q), target=None if name == "free links" else "<= 2",
                       repeats=q, note="the median of the pairs")
    if argv is None:
        report.save()
    return {name: statistics.median(q) for name, q in ratios.items()}


if __name__ == "__main__":
    main()
