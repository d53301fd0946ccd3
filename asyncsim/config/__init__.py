"""Typed, frozen scenario configuration with strict validation.

Three modules, one concept each: :mod:`.schema` (the frozen dataclasses, one per table, and
their defaults), :mod:`.convert` (their conversion from and to nested dicts: ``from_dict``
rejects unknown keys and wrong types in one line naming the key; ``to_dict``, ``flatten``,
``changed_keys``) and :mod:`.optimizer` (the optimizer table's named choices and ranges).
Their public names are this package's interface: ``from asyncsim.config import Scenario``.
"""

from asyncsim.config.convert import changed_keys, flatten, from_dict, to_dict
from asyncsim.config.optimizer import (
    FLOAT32_MAX,
    OptimizerChoices,
    check_dampening,
    check_float32,
    check_momentum_kind,
    optimizer_choices,
    rule_label,
    rule_spec,
)
from asyncsim.config.schema import (
    LR_STALENESS,
    MOMENTUM_KINDS,
    MOMENTUM_STYLES,
    NOMINAL_NEEDS,
    OPEN_TABLES,
    SHARINGS,
    SWEEP_PATHS,
    WEIGHT_DECAY_SCOPES,
    AvailabilityConfig,
    ClusterConfig,
    DataConfig,
    Dist,
    LinkConfig,
    MeasureConfig,
    ModelConfig,
    MomentumConfig,
    NetworkConfig,
    OptimizerConfig,
    ProtocolConfig,
    RunConfig,
    Scenario,
    ScheduleConfig,
    SharedLinkConfig,
)

__all__ = [
    "FLOAT32_MAX", "LR_STALENESS", "MOMENTUM_KINDS", "MOMENTUM_STYLES", "NOMINAL_NEEDS",
    "OPEN_TABLES", "SHARINGS", "SWEEP_PATHS", "WEIGHT_DECAY_SCOPES", "AvailabilityConfig",
    "ClusterConfig", "DataConfig", "Dist", "LinkConfig", "MeasureConfig", "ModelConfig",
    "MomentumConfig", "NetworkConfig", "OptimizerChoices", "OptimizerConfig",
    "ProtocolConfig", "RunConfig", "ScheduleConfig", "Scenario", "SharedLinkConfig",
    "changed_keys", "check_dampening", "check_float32", "check_momentum_kind", "flatten",
    "from_dict", "optimizer_choices", "rule_label", "rule_spec", "to_dict",
]
