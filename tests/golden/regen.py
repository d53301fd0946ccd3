"""The golden trace table: scenarios of the timing layer and the hash of each one's trace.

``tests/golden/traces.json`` lists, per entry, a name, a scenario (a mapping in scenario-file
keys, so that it survives changes to the config classes) and the :meth:`Trace.hash` of its
trace-only run; ``tests/unit/test_golden_traces.py`` runs every entry and asserts its hash. The
table covers every protocol, learners that come and go (``cluster.availability``), the PS's
shared interface (fair and FIFO; ingress, egress, both), PS service time, every built-in
delay model, each run length, and grids where events meet at one instant (ties). Trace hashes
depend on no BLAS or XLA arithmetic, so they are the same on every machine.

Regenerate the table (only for a change that is meant to change traces; say so in the commit)::

    python tests/golden/regen.py [--out tests/golden/traces.json]

Relative paths in the scenarios (the empirical delay's CSV) resolve against this folder.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE = HERE / "traces.json"


def const(value: float) -> dict:
    return {"dist": "constant", "value": value}


def expo(mean: float) -> dict:
    return {"dist": "exponential", "mean": mean}


CHURN = {"up": expo(15.0), "down": expo(3.0)}
# Every built-in delay model, as a compute time of mean about 1.
DELAYS = {
    "constant": const(1.0),
    "uniform": {"dist": "uniform", "low": 0.5, "high": 1.5},
    "normal": {"dist": "normal", "mean": 1.0, "std": 0.3},
    "lognormal": {"dist": "lognormal", "mean": 1.0, "cv": 0.5},
    "exponential": expo(1.0),
    "gamma": {"dist": "gamma", "mean": 1.0, "cv": 0.7},
    "shifted-exponential": {"dist": "shifted-exponential", "shift": 0.5, "mean_excess": 0.5},
    "straggler": {"dist": "straggler", "p": 0.1, "factor": 4.0,
                  "base": {"dist": "lognormal", "mean": 1.0, "cv": 0.2}},
    "empirical": {"dist": "empirical", "path": "empirical.csv"},
}
PROTOCOLS = {
    "hardsync": {"kind": "hardsync"},
    "softsync-n1": {"kind": "softsync", "n": 1},
    "softsync-n2": {"kind": "softsync", "n": 2},
    "softsync-n4": {"kind": "softsync", "n": 4},
    "async": {"kind": "async"},
    "ssp-s0": {"kind": "ssp", "s": 0},
    "ssp-s2": {"kind": "ssp", "s": 2},
}
# fixed-delay's schedules (tau + 1 = 4 workers, the cluster's size).
FIXED_DELAY = {
    "round-robin": {"kind": "fixed-delay", "tau": 3},
    "random": {"kind": "fixed-delay", "tau": 3, "schedule": "random"},
    "normal": {"kind": "fixed-delay", "tau": 3, "schedule": "normal"},
    "normal-loc-scale": {"kind": "fixed-delay", "tau": 3, "schedule": "normal", "loc": 2.0,
                         "scale": 0.5},
    "race": {"kind": "fixed-delay", "tau": 3, "schedule": "race", "cv": 0.3},
}
# The protocols that run learner loops (availability, shared links).
LOOPED = ("hardsync", "softsync-n2", "async", "ssp-s2")


def base(protocol: dict, *, seed: int = 0, gradients: int = 200, **cluster) -> dict:
    cl = {"learners": 4, "compute": expo(1.0)} | cluster
    return {"seed": seed, "cluster": cl, "protocol": protocol,
            "run": {"gradients": gradients, "trace_only": True}}


def shared_net(sharing: str, directions: tuple[str, ...], *, nbytes: int = 1000,
               bandwidth: float = 3000.0, latency: dict | None = None) -> dict:
    link = {"bytes": nbytes, "bandwidth": 20_000.0}
    if latency is not None:
        link["latency"] = latency
    net = {"pull": dict(link), "push": dict(link)}
    for d in directions:
        net[d] = {"bandwidth": bandwidth, "sharing": sharing}
    return net


def catalogue() -> dict[str, dict]:
    """Every scenario of the table, by name."""
    out: dict[str, dict] = {}
    for name, proto in PROTOCOLS.items():
        out[f"protocol/{name}"] = base(proto)
    for name, proto in FIXED_DELAY.items():
        out[f"protocol/fixed-delay-{name}"] = base(proto)
    out["protocol/fixed-delay-race-churn"] = base(FIXED_DELAY["race"], availability=CHURN)
    for name in LOOPED:
        out[f"churn/{name}"] = base(PROTOCOLS[name], availability=CHURN)
        out[f"churn/{name}-seed1"] = base(PROTOCOLS[name], seed=1, availability=CHURN)
    out["churn/per-learner"] = base(PROTOCOLS["async"], availability=[
        CHURN, {"up": const(5.0), "down": const(1.0)},
        {"up": {"dist": "gamma", "mean": 8.0, "cv": 0.5}, "down": expo(2.0)},
        {"up": expo(20.0), "down": {"dist": "uniform", "low": 0.5, "high": 3.0}}])
    directions = {"ingress": ("ps_ingress",), "egress": ("ps_egress",),
                  "both": ("ps_ingress", "ps_egress")}
    for sharing, (dname, dirs), proto in itertools.product(
            ("fair", "fifo"), directions.items(), LOOPED):
        net = shared_net(sharing, dirs, latency=expo(0.05))
        out[f"links/{sharing}-{dname}/{proto}"] = base(PROTOCOLS[proto], network=net)
        out[f"links/{sharing}-{dname}/{proto}-churn"] = base(PROTOCOLS[proto], network=net,
                                                             availability=CHURN)
    out["links/fair-both/race"] = base(FIXED_DELAY["race"],
                                       network=shared_net("fair", directions["both"]))
    out["links/fair-both/no-latency"] = base(PROTOCOLS["async"],
                                             network=shared_net("fair", directions["both"]))
    out["links/fair-both/light-load"] = base(PROTOCOLS["async"], network=shared_net(
        "fair", directions["both"], bandwidth=30_000.0, latency=expo(0.05)))
    out["links/private-only"] = base(PROTOCOLS["async"], network={
        "pull": {"bytes": 1000, "bandwidth": 5000.0, "latency": expo(0.1)},
        "push": {"bytes": 2000, "bandwidth": 5000.0, "latency": const(0.05)}})
    for proto in ("async", "hardsync"):
        out[f"service/{proto}"] = base(PROTOCOLS[proto], ps_service=expo(0.1))
        out[f"service/{proto}-churn"] = base(PROTOCOLS[proto], ps_service=const(0.05),
                                             availability=CHURN)
    out["service/fair-both-churn"] = base(
        PROTOCOLS["softsync-n2"], ps_service=expo(0.05), availability=CHURN,
        network=shared_net("fair", directions["both"], latency=expo(0.05)))
    out["service/fifo-ingress"] = base(PROTOCOLS["ssp-s2"], ps_service=expo(0.05),
                                       network=shared_net("fifo", directions["ingress"]))
    for name, spec in DELAYS.items():
        out[f"delay/{name}"] = base(PROTOCOLS["async"], compute=spec)
        out[f"delay/{name}-latency"] = base(PROTOCOLS["softsync-n2"], network={
            "pull": {"latency": spec}, "push": {"latency": spec}})
    out["delay/per-learner-speed"] = base(
        PROTOCOLS["async"], compute=[DELAYS["constant"], DELAYS["gamma"], DELAYS["uniform"],
                                     DELAYS["straggler"]], speed=[1.0, 2.0, 0.5, 1.5])
    out["length/updates"] = base(PROTOCOLS["softsync-n2"]) | {
        "run": {"updates": 80, "trace_only": True}}
    out["length/sim-time"] = base(PROTOCOLS["hardsync"], availability=CHURN) | {
        "run": {"sim_time": 40.0, "trace_only": True}}
    timing_seed = base(PROTOCOLS["async"], seed=5)
    timing_seed["cluster"]["seed"] = 9  # cluster.seed: the timing streams' own seed
    out["length/timing-seed"] = timing_seed
    out.update(tie_grid())
    out.update(fair_churn_grid())
    out.update(availability_tie_grid())
    return out


def tie_grid() -> dict[str, dict]:
    """Tie-heavy clusters: constant compute (in half of them every other learner 1.5x as
    fast), constant link latencies and a fair interface whose lone transfers take whole
    time units, so events meet at the same instants."""
    out = {}
    for learners, latency, egress, ingress, kind, speed in itertools.product(
            (2, 3), (0.0, 1.0), (None, 50.0, 100.0), (None, 50.0, 100.0),
            ("async", "softsync"), (1.0, 1.5)):
        link = {"bytes": 100, "latency": const(latency)}
        net = {"pull": dict(link), "push": dict(link)}
        for key, bw in (("ps_egress", egress), ("ps_ingress", ingress)):
            if bw is not None:
                net[key] = {"bandwidth": bw, "sharing": "fair"}
        name = f"ties/{learners}-{latency}-{egress}-{ingress}-{kind}-{speed}"
        out[name] = {"seed": 0, "cluster": {
            "learners": learners, "network": net, "compute": const(2.0),
            "speed": [1.0 + (speed - 1.0) * (i % 2) for i in range(learners)]},
            "protocol": {"kind": kind} | ({"n": 1} if kind == "softsync" else {}),
            "run": {"gradients": 60, "trace_only": True}}
    return out


def fair_churn_grid() -> dict[str, dict]:
    """Fair interfaces (one direction or both) under churn, every protocol that runs
    learner loops, ties included (constant compute in half of them)."""
    out = {}
    for kind, directions, compute, seed in itertools.product(
            ("async", "softsync", "hardsync", "ssp"),
            (("ps_ingress",), ("ps_ingress", "ps_egress")),
            (expo(1.0), const(1.0)), (0, 1)):
        link = {"bytes": 1000, "bandwidth": 5000.0, "latency": expo(0.1)}
        net = {"pull": dict(link), "push": dict(link)}
        for key in directions:
            net[key] = {"bandwidth": 3000.0, "sharing": "fair"}
        proto = {"kind": kind} | {"softsync": {"n": 2}, "ssp": {"s": 2}}.get(kind, {})
        name = f"fair-churn/{kind}-{len(directions)}-{compute['dist']}-{seed}"
        out[name] = {"seed": seed, "protocol": proto, "cluster": {
            "learners": 5, "network": net, "compute": compute,
            "availability": {"up": expo(15.0), "down": expo(3.0)}},
            "run": {"gradients": 300, "trace_only": True}}
    return out


def availability_tie_grid() -> dict[str, dict]:
    """Learners that come and go at the instants their steps end (constant compute, link
    latencies and periods: every learner's up period ends with its 4th step), and not
    (exponential periods), under each protocol with a learner loop and each kind of link."""
    const_avail = [(latency, {"up": const(up), "down": const(1.0)})
                   for latency, up in ((0.0, 4.0), (0.25, 6.0))]
    expo_avail = (0.25, {"up": expo(6.0), "down": expo(1.0)})
    out = {}
    for kind, sharing, (i, (latency, avail)) in itertools.product(
            ("async", "softsync", "hardsync", "ssp"), (None, "fifo", "fair"),
            enumerate((*const_avail, expo_avail))):
        link = {"bytes": 100, "latency": const(latency)}
        net = {"pull": dict(link), "push": dict(link)}
        if sharing is not None:
            for key in ("ps_egress", "ps_ingress"):
                net[key] = {"bandwidth": 600.0, "sharing": sharing}
        proto = {"kind": kind} | {"softsync": {"n": 2}, "ssp": {"s": 1}}.get(kind, {})
        out[f"avail-ties/{kind}-{sharing}-{i}"] = {
            "seed": 0, "protocol": proto,
            "cluster": {"learners": 3, "network": net, "availability": avail,
                        "compute": const(1.0)},
            "run": {"gradients": 120, "trace_only": True}}
    return out


def trace_hash(scenario: dict) -> str:
    """The trace hash of one table entry's trace-only run (paths relative to this folder)."""
    from asyncsim.drivers.trace_only import simulate
    from asyncsim.scenario import load_scenario

    with contextlib.chdir(HERE):
        return simulate(load_scenario(scenario)).hash()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=TABLE)
    a = ap.parse_args(argv)
    rows = [{"name": name, "scenario": scn, "trace_hash": trace_hash(scn)}
            for name, scn in catalogue().items()]
    # One entry a line: a changed hash is a one-line diff.
    a.out.write_text("[\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]\n")
    print(f"{len(rows)} traces -> {a.out}")


if __name__ == "__main__":
    main()
