"""Test helpers for asyncsim and its users: hypothesis strategies and trace checks.

Strategies (in the style of ``hypothesis.extra.numpy``) generate valid delay specs, clusters,
protocols and whole scenarios, small enough that a trace-only simulation of one takes
milliseconds, and learning-rate rules (:mod:`.strategies`)::

    from hypothesis import given
    from asyncsim.testing import scenarios

    @given(scenarios(kinds=["softsync"], max_learners=8))
    def test_staleness_bounded(scn): ...

``check_trace(trace, scenario)`` raises with a clear message on any violated invariant of a
trace (staleness, ordering, protocol rules; :mod:`.invariants`); asyncsim's own property
tests use it.
"""

from asyncsim.testing.invariants import TraceInvariantError, check_trace
from asyncsim.testing.strategies import (
    DELAY_DISTS,
    FIXED_DELAY_MAX_TAU,
    PROTOCOL_KINDS,
    clusters,
    delay_specs,
    lr_rule_specs,
    plugin_specs,
    protocols,
    scenarios,
)

__all__ = ["DELAY_DISTS", "FIXED_DELAY_MAX_TAU", "PROTOCOL_KINDS", "TraceInvariantError",
           "check_trace", "clusters", "delay_specs", "lr_rule_specs", "plugin_specs", "protocols",
           "scenarios"]
