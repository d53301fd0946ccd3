"""The optimizer table's named choices and ranges: momentum kinds and styles, dampening, the
lr staleness, the weight-decay scope, an lr rule's ``{ name, ... }`` form, and the float32
range of the update core, checked once for scenario files and ``make_core`` alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from asyncsim._checks import choice, string, unit_interval
from asyncsim.config.schema import (
    LR_STALENESS,
    MOMENTUM_KINDS,
    MOMENTUM_STYLES,
    WEIGHT_DECAY_SCOPES,
    MomentumConfig,
    OptimizerConfig,
)
from asyncsim.errors import ScenarioError


def check_momentum_kind(kind: str) -> str:
    """``kind`` if it is one of :data:`MOMENTUM_KINDS`; else a ScenarioError under
    ``optimizer.momentum.kind`` listing them."""
    return choice("optimizer.momentum.kind", kind, MOMENTUM_KINDS, what="momentum")


def check_dampening(momentum: MomentumConfig) -> float | str | None:
    """The dampening of ``momentum`` (a MomentumConfig): None (none, the arithmetic without
    it), ``"beta"`` (kind ``"dampened"``: the shorthand for dampening = beta) or a float in
    (0, 1); a ScenarioError under ``optimizer.momentum.dampening`` where it does not fit
    (PyTorch's rule: Nesterov momentum takes no dampening)."""
    d = momentum.dampening
    key = "optimizer.momentum.dampening"
    if momentum.kind == "dampened":
        if d is not None:
            raise ScenarioError(key, "kind = \"dampened\" is the shorthand for dampening = "
                                "beta; give kind = \"heavy-ball\" with a dampening instead")
        return "beta"
    if d is None or d == 0:
        return None
    if momentum.kind == "none":
        raise ScenarioError(key, "needs a momentum buffer; kind \"none\" has none")
    if momentum.kind == "nesterov":
        raise ScenarioError(key, "Nesterov momentum takes no dampening (as in PyTorch); "
                            "use heavy-ball or shifted")
    return unit_interval(key, d)


def rule_spec(spec: str | Mapping[str, Any], key: str = "optimizer.lr_rule"
              ) -> tuple[str, dict[str, Any]]:
    """``(name, parameters)`` of an ``lr_rule`` value: a name, or a table with ``name``."""
    if isinstance(spec, str):
        return spec, {}
    if not isinstance(spec, Mapping):
        raise ScenarioError(key, f"must be a rule's name or a table {{ name = ..., "
                            f"<parameter> = ... }}, got {spec!r}")
    if "name" not in spec:
        raise ScenarioError(f"{key}.name", "missing: a table lr_rule names its rule "
                            "(lr_rule = { name = \"polynomial\", a = 0.5 })")
    name = string(f"{key}.name", spec["name"])
    return name, {k: v for k, v in spec.items() if k != "name"}


def rule_label(spec: str | Mapping[str, Any]) -> str:
    """A rule as one word for tables and captions: ``polynomial(a=0.5)``, or its name."""
    name, params = rule_spec(spec)
    return f"{name}({', '.join(f'{k}={v}' for k, v in sorted(params.items()))})" if params \
        else name


class OptimizerChoices(NamedTuple):
    """The optimizer's named choices, checked and with their defaults filled in
    (:func:`optimizer_choices`)."""

    kind: str  # MOMENTUM_KINDS
    style: str  # MOMENTUM_STYLES
    lr_staleness: str  # LR_STALENESS
    weight_decay_scope: str  # WEIGHT_DECAY_SCOPES
    dampening: float | str | None  # check_dampening


def optimizer_choices(opt: OptimizerConfig) -> OptimizerChoices:
    """The one check of an optimizer's named choices (momentum kind and style, dampening,
    lr staleness, weight-decay scope), for scenario files and ``make_core`` alike; a
    ScenarioError under the key at fault."""
    m = opt.momentum
    if opt.transform is not None and m.kind != "none":
        raise ScenarioError("optimizer.momentum.kind", f"must be \"none\" with "
                            f"optimizer.transform (the transform owns its moments), got "
                            f"{m.kind!r}")
    if opt.transform is not None and m.style not in (None, "caffe"):
        raise ScenarioError("optimizer.momentum.style", "is not used with optimizer.transform "
                            "(the transform takes the rule as a weight, the rate outside)")
    return OptimizerChoices(
        kind=check_momentum_kind(m.kind),
        style=choice("optimizer.momentum.style", m.style or "caffe", MOMENTUM_STYLES),
        lr_staleness=choice("optimizer.lr_staleness", opt.lr_staleness or "actual",
                                  LR_STALENESS),
        weight_decay_scope=choice("optimizer.weight_decay_scope",
                                        opt.weight_decay_scope or "all", WEIGHT_DECAY_SCOPES),
        dampening=check_dampening(m))


# The largest float32: the update core holds its rates, decay and momentum in float32.
FLOAT32_MAX = 3.4028234663852886e38


def check_float32(key: str, value: float) -> float:
    """``value`` if float32 holds it (the update core's precision: a larger rate or rule
    parameter overflows to inf, with numpy's RuntimeWarnings); else a ScenarioError."""
    if not abs(value) <= FLOAT32_MAX:
        raise ScenarioError(key, f"must be at most {FLOAT32_MAX:.4g} (float32, the update "
                            f"core's precision), got {value!r}")
    return value
