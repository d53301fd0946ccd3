"""Which staleness remedies have a closed-form stability edge, and the measured edges of
those that do and do not (asyncsim.stability.closed_form_applies, measured.find_edge with
``optimizer=``)."""

from __future__ import annotations

import pytest

from asyncsim.stability import closed_form_applies, edge, lr_for_delay
from asyncsim.stability.measured import find_edge

TAU = 4
STEPS = 6000


def test_which_remedies_have_a_closed_form():
    assert closed_form_applies({})[0]
    assert closed_form_applies({"lr_rule": {"name": "hinge", "a": 10, "b": 2}})[0]
    assert closed_form_applies({"compensation": {"kind": "dc-asgd"}})[0]
    assert closed_form_applies({"compensation": {"kind": "dc-asgd-a"}})[0]
    assert not closed_form_applies({"compensation": {"kind": "gap-aware"}})[0]
    assert not closed_form_applies({"transform": {"name": "adam"}})[0]
    assert closed_form_applies({"transform": {"name": "sgd"}})[0]
    ok, why = closed_form_applies({"transform": {"name": "sgd", "momentum": 0.5}})
    assert ok and "heavy-ball edge at beta = 0.5" in why
    from types import MappingProxyType

    from asyncsim.config import OptimizerConfig

    assert not closed_form_applies(OptimizerConfig(transform={"name": "rmsprop"}))[0]
    assert not closed_form_applies(MappingProxyType({"transform": {"name": "adam"}}))[0]


def test_find_edge_keeps_its_momentum_arguments_under_optimizer_keys():
    # optimizer={"momentum": {...}} adds to the momentum the arguments name, not replaces it.
    hb = find_edge(TAU, "heavy-ball", 0.5, steps=STEPS)
    also = find_edge(TAU, "heavy-ball", 0.5, steps=STEPS,
                     optimizer={"momentum": {"style": "caffe"}})
    assert also == hb and hb == pytest.approx(edge(TAU, "heavy-ball", 0.5), rel=2e-3)


@pytest.mark.parametrize("rule", [{"name": "polynomial", "a": 0.5}, "fedbuff",
                                  {"name": "hinge", "a": 1.0, "b": 2.0}])
def test_a_weighted_rule_moves_the_edge_by_its_rate(rule):
    # At constant delay a rule is a constant rate: the edge in eta0*lambda is edge / rule(1).
    predicted = edge(TAU) / lr_for_delay(1.0, TAU, rule)
    measured = find_edge(TAU, steps=STEPS, optimizer={"lr_rule": rule})
    assert measured == pytest.approx(predicted, rel=2e-3)
    assert predicted > 1.5 * edge(TAU)  # the rule changes the edge: the test can tell


def test_compensation_edges():
    plain = find_edge(TAU, steps=STEPS)
    assert plain == pytest.approx(edge(TAU), rel=2e-3)
    # DC-ASGD's correction lambda g*g*(w_now - w_read) is cubic in w: where gradients are
    # small (a flat quadratic, lambda_h = 0.01, the same edge in x = eta * lambda_h) the run
    # sits at the plain (linear) edge; on the unit quadratic from w = 1 a large lambda shows
    # the higher order.
    small = find_edge(TAU, steps=STEPS, eigenvalue=0.01,
                      optimizer={"compensation": {"kind": "dc-asgd", "lambda": 0.04}})
    big = find_edge(TAU, steps=STEPS, optimizer={"compensation": {"kind": "dc-asgd",
                                                                    "lambda": 0.5}})
    assert small == pytest.approx(plain, rel=1e-3)
    assert big > plain * 1.02
    # Gap-aware has no closed form; it divides stale steps by 1 + gap / C: far more stable.
    ga = find_edge(TAU, steps=STEPS, optimizer={"compensation": {"kind": "gap-aware"}})
    assert ga > 2 * plain
