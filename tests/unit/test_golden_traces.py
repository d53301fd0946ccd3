"""The golden trace table (tests/golden/traces.json): each scenario's trace-only run has the
trace hash the table records, so a change to the timing layer that moves any event --
a tie-break, a link's arithmetic, a stream's draws -- fails here, naming the scenarios.
How the table is made and regenerated: tests/golden/regen.py."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

from asyncsim.timing.delays import DelayModel, builtin, make_delay
from asyncsim.timing.protocols import FixedDelay, available_protocols

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
sys.path.insert(0, str(GOLDEN))

from regen import trace_hash  # noqa: E402

ROWS = json.loads((GOLDEN / "traces.json").read_text())


def test_every_trace_has_its_golden_hash():
    changed = [row["name"] for row in ROWS if trace_hash(row["scenario"]) != row["trace_hash"]]
    assert not changed, f"{len(changed)} of {len(ROWS)} traces changed: {changed[:20]}"


def _params(scns, name):
    """The parameters of the first spec of delay model ``name`` in the table."""
    stack = list(scns)
    while stack:
        spec = stack.pop(0)
        if isinstance(spec, dict):
            if spec.get("dist") == name:
                return {k: v for k, v in spec.items() if k != "dist"}
            stack.extend(spec.values())
        elif isinstance(spec, list):
            stack.extend(spec)
    raise KeyError(name)


def _scenarios():
    return [row["scenario"] for row in ROWS]


def test_the_table_covers_every_protocol_delay_model_and_link():
    scns = _scenarios()
    assert len({row["name"] for row in ROWS}) == len(ROWS) > 300
    builtin_protocols = {"async", "softsync", "hardsync", "fixed-delay", "ssp"}
    assert builtin_protocols <= set(available_protocols())
    kinds = {s["protocol"]["kind"] for s in scns}
    assert kinds == builtin_protocols
    assert {s["protocol"].get("schedule", "round-robin") for s in scns
            if s["protocol"]["kind"] == "fixed-delay"} == set(FixedDelay.SCHEDULES)
    assert {s["protocol"]["n"] for s in scns if s["protocol"]["kind"] == "softsync"} >= {1, 2, 4}

    def dists(spec):
        if isinstance(spec, list):
            for s in spec:
                yield from dists(s)
        elif isinstance(spec, dict):
            if "dist" in spec:
                yield spec["dist"]
            for v in spec.values():
                yield from dists(v)

    # Every delay model asyncsim defines (a new built-in fails here until it is in the table).
    models = {type(make_delay({"dist": name} | _params(scns, name), base_dir=GOLDEN))
              for name in set(dists(scns))}
    assert {cls for _, cls in inspect.getmembers(builtin, inspect.isclass)
            if cls.__module__ == builtin.__name__ and issubclass(cls, DelayModel)} <= models
    shared = [(d, s["cluster"]["network"][d]["sharing"]) for s in scns
              for d in ("ps_ingress", "ps_egress") if d in s["cluster"].get("network", {})]
    assert set(shared) == {(d, k) for d in ("ps_ingress", "ps_egress") for k in ("fair", "fifo")}
    both = {(s["cluster"]["network"]["ps_ingress"]["sharing"], "availability" in s["cluster"])
            for s in scns if {"ps_ingress", "ps_egress"} <= set(s["cluster"].get("network", {}))}
    assert both == {(k, churn) for k in ("fair", "fifo") for churn in (False, True)}
    churned = {s["protocol"]["kind"] for s in scns if "availability" in s["cluster"]}
    assert churned == builtin_protocols  # fixed-delay: its race schedule
    assert any("ps_service" in s["cluster"] and "availability" in s["cluster"] for s in scns)
    assert {k for s in scns for k in s["run"]} >= {"gradients", "updates", "sim_time"}


def test_a_changed_trace_is_caught():
    # The check compares hashes, not a pass-through: another seed gives another hash.
    row = next(r for r in ROWS if r["name"] == "links/fair-both/async-churn")
    scn = json.loads(json.dumps(row["scenario"]))
    scn["seed"] += 1
    assert trace_hash(scn) != row["trace_hash"]
