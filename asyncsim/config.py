"""Typed, frozen scenario configuration with strict validation.

Defaults live here, in code; a scenario file holds overrides only. :func:`from_dict` turns a
nested mapping (parsed TOML) into a :class:`Scenario` and rejects unknown keys, wrong types
and impossible values with a :class:`ScenarioError` that names the key and what is allowed.
Cross-field rules (``n <= learners``, known delay models, protocol parameters) are checked by
:func:`asyncsim.scenario.check`.

Distributions (``cluster.compute``, link latencies, PS service time) are kept as plain
mappings ``{"dist": name, **params}``; :mod:`asyncsim.delays` validates them against the
delay-model registry, so a user's plug-in needs no change here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Union

from asyncsim._checks import choice, int64
from asyncsim.errors import ScenarioError, did_you_mean

Dist = Mapping[str, Any]
"""A delay-model spec: ``{"dist": "lognormal", "mean": 1.0, "cv": 0.1}``."""


def _const(value: float) -> dict[str, Any]:
    return {"dist": "constant", "value": value}


@dataclass(frozen=True)
class LinkConfig:
    """One direction of the PS link. Message time = latency sample + bytes / bandwidth."""

    latency: Dist = field(default_factory=lambda: _const(0.0))
    bandwidth: float = math.inf  # bytes per simulated second; inf = size costs nothing
    bytes: int | None = None  # message size; None = 4 bytes x the model's parameter count


SHARINGS = ("fair", "fifo")


@dataclass(frozen=True)
class SharedLinkConfig:
    """The PS's network interface in one direction, shared by every learner's transfers."""

    bandwidth: float = math.inf  # bytes per simulated second; inf = size costs nothing
    # fair (processor sharing: the bandwidth divided among the transfers in progress) | fifo
    # (one transfer at a time, in arrival order)
    sharing: str = "fair"


@dataclass(frozen=True)
class NetworkConfig:
    pull: LinkConfig = field(default_factory=LinkConfig)  # PS -> learner (weights)
    push: LinkConfig = field(default_factory=LinkConfig)  # learner -> PS (gradient)
    # The PS's interface, shared by all pulls (egress) / all pushes (ingress), on top of each
    # learner's own link: a pull crosses the egress, then the learner's link; a push the
    # learner's link, then the ingress. Bytes per transfer: the direction's message size.
    # None: unlimited
    ps_ingress: SharedLinkConfig | None = None
    # The PS's interface for pulls (see ps_ingress); None: unlimited
    ps_egress: SharedLinkConfig | None = None


@dataclass(frozen=True)
class AvailabilityConfig:
    """A learner's up and down periods (delay-model specs, plug-ins included): it starts up
    at t = 0 and alternates an up period and a down period, each drawn from its own stream."""

    up: Dist | None = None  # how long the learner stays up (required)
    down: Dist | None = None  # how long it then stays down (required)


@dataclass(frozen=True)
class ClusterConfig:
    learners: int = 4
    # One spec for all learners, or a list with one spec per learner.
    compute: Dist | tuple[Dist, ...] = field(default_factory=lambda: _const(1.0))
    # Per-learner speed factors: a learner with speed 2 computes twice as fast.
    speed: tuple[float, ...] | None = None
    network: NetworkConfig = field(default_factory=NetworkConfig)
    # PS service time per message (serialised pushes and pulls, like P1's blocking MPI calls).
    ps_service: Dist | None = None
    # Learners that come and go: {up = DIST, down = DIST} for every learner, or a list with one
    # table per learner. A learner going down loses the gradient it is pulling, computing or
    # pushing (recorded in the trace's down table, never applied); back up, it pulls afresh
    # and recomputes that batch. None: always up
    availability: AvailabilityConfig | tuple[AvailabilityConfig, ...] | None = None
    # Seed of the timing streams (compute times, links, PS service, schedules); None: the
    # scenario's `seed`. Fix it to vary the numerics' seed (data, init, batch order) over one
    # timeline: a sweep over `seed` then shares one trace (Scenario.timing_seed).
    seed: int | None = None


@dataclass(frozen=True)
class ProtocolConfig:
    kind: str = "async"  # hardsync | softsync | async | fixed-delay | ssp | a plug-in
    # Every other key of [protocol] is an option of the protocol `kind` names, checked
    # against its class's __init__ signature (asyncsim.timing.protocols): softsync's n,
    # fixed-delay's tau, schedule, cv, loc and scale, ssp's s, a plug-in's own.
    options: Mapping[str, Any] = field(default_factory=dict)


# run.sweep_path: "exact", one loop replay per point (bit-identical to the point's scenario
# run alone); "vmapped" / "vmapped-scan", one program for all the points (a loop of
# vmapped steps / compiled lax.scan chunks); "scan", lax.scan chunks point by point;
# "fastest", whichever of those a timing probe predicts fastest here (so the numbers may
# then depend on the machine's load: an explicit opt-in, recorded in index.csv).
SWEEP_PATHS = ("exact", "vmapped", "vmapped-scan", "scan", "fastest")


# The momentum variants of the update core (asyncsim.numerics.core); the stability toolkit
# has an edge for each (asyncsim.stability.closed_form).
MOMENTUM_KINDS = ("none", "heavy-ball", "dampened", "nesterov", "shifted")
# Where the rate sits: "caffe" (inside the buffer, P1's framework: m <- beta m + alpha g,
# theta <- theta - m) or "torch" (PyTorch's SGD, P2's official code: m <- beta m + (1 - d) g,
# the first step m <- g, theta <- theta - eta m).
MOMENTUM_STYLES = ("caffe", "torch")
# Which gradients' staleness sets the rates of the lr rule: "actual" (each gradient's own
# staleness) or "nominal" (the protocol's nominal delay, a constant rate from the first
# update, as P2's official regimes set eta_tau by hand).
LR_STALENESS = ("actual", "nominal")
NOMINAL_NEEDS = ("\"nominal\" needs a protocol with a nominal delay (fixed-delay: tau; async: "
                 "learners - 1; hardsync: 0)")
# Which parameters weight decay applies to: "all", or "weights" (the parameters of rank >= 2:
# conv kernels and dense matrices, never biases or normalisation scales: P2's official
# ResNet, regularization_pre_step).
WEIGHT_DECAY_SCOPES = ("all", "weights")


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
    if not 0.0 <= d < 1.0:
        raise ScenarioError(key, f"must be in [0, 1), got {d}")
    return float(d)


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
    name = spec["name"]
    if not isinstance(name, str):
        raise ScenarioError(f"{key}.name", f"must be a string, got {name!r}")
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


@dataclass(frozen=True)
class MomentumConfig:
    kind: str = "none"  # one of MOMENTUM_KINDS
    beta: float = 0.9
    # caffe (rate inside the buffer) | torch (PyTorch's SGD); None: caffe
    style: str | None = None
    # PyTorch's dampening d: the buffer takes (1 - d) of each step; None: 0, or beta for
    # kind = "dampened" (its shorthand)
    dampening: float | None = None


@dataclass(frozen=True)
class ScheduleConfig:
    decay_epochs: tuple[float, ...] = ()  # multiply the rate by decay_factor at these epochs
    decay_factor: float = 0.1
    warmup_epochs: float = 0.0  # linear warm-up from 0 over this many epochs
    warmup_updates: int = 0  # or over this many updates (whichever is given)


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 0.01  # alpha_0 (P1) / eta_0 (P2)
    # constant | inverse-staleness | ... or a table { name = "polynomial", a = 0.5 }
    lr_rule: str | Mapping[str, Any] = "constant"
    # actual (each gradient's staleness sets its rate) | nominal (the protocol's nominal
    # delay); None: actual
    lr_staleness: str | None = None
    momentum: MomentumConfig = field(default_factory=MomentumConfig)
    weight_decay: float = 0.0
    # Per-layer multipliers of weight_decay, by parameter-path prefix (P1: {"fc" = 250.0}).
    weight_decay_mult: Mapping[str, float] = field(default_factory=dict)
    # all | weights (rank >= 2: conv kernels, dense matrices); None: all
    weight_decay_scope: str | None = None
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    # An optax optimizer alias stepping the PS, { name = "adam", b1 = 0.9, ... }
    # (asyncsim.numerics.transforms); None: SGD with `momentum`
    transform: Mapping[str, Any] | None = None
    # Delay compensation from the read version, { kind = "dc-asgd", lambda = 0.04 }
    # (asyncsim.numerics.compensation); None: none
    compensation: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ModelConfig:
    name: str = "mlp"
    # Every other key of [model] is passed to the model's constructor, which validates it.
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DataConfig:
    name: str = "synthetic-cifar"
    batch_size: int = 32  # mu, per learner and gradient
    # Every other key of [data] is passed to the dataset's constructor, which validates it.
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunConfig:
    # Run length: exactly one of these may be set; none = 100 updates.
    updates: int | None = None
    gradients: int | None = None
    epochs: float | None = None
    sim_time: float | None = None
    eval_every: int = 0  # evaluate every K updates (0 = only at the end)
    eval_samples: int | None = None  # test samples per evaluation (None = the whole test set)
    # Also evaluate the final parameters on the whole train set (summary.json:
    # final_train_error, final_train_set_loss; P2's generalization gap is test - train
    # error); None: false
    eval_train: bool | None = None
    checkpoint_every: int = 0  # updates between checkpoints (0 = once a minute of wall time)
    # How a sweep replays points that differ only in lr, momentum beta or weight decay over
    # one shared trace (SWEEP_PATHS): "exact" (default) gives each point exactly the
    # numbers of its scenario run alone; the others are faster and agree to ~1e-5 only.
    sweep_path: str = "exact"
    # Timing only: no gradients, as `asyncsim trace` (a staleness study); sweeps and single
    # runs both honour it.
    trace_only: bool = False


@dataclass(frozen=True)
class MeasureConfig:
    """What a run measures for its figures, stored in its folder (the figures read it there
    and never rerun numerics; asyncsim.stability.measure)."""

    # Training samples (the first ones) whose mean loss the sharpness is measured on.
    sharpness_samples: int = 1024
    # lambda_max at the initial weights -> summary.json initial_sharpness (power iteration).
    initial_sharpness: bool = False
    # lambda_max of the final weights -> summary.json final_sharpness (P2's power iteration)
    # and final_sharpness_lanczos (a check when the top eigenvalues are close).
    final_sharpness: bool = False
    # lambda_max this many times along the run (every updates // points) -> sharpness.csv.
    sharpness_points: int = 0
    # A sweep of fixed-delay traces on a one-dimensional quadratic: the measured stability
    # edge of every trace -> the sweep folder's edges.csv, under each momentum kind of
    # edge_momenta (default: the scenario's).
    edges: bool = False
    edge_momenta: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str = "scenario"  # names the run folders (runs/NAME/seedN)
    description: str = ""  # free text, for the reader
    # Seeds the numerics (data, initialisation, batches) and, unless cluster.seed is set,
    # the timing streams.
    seed: int = 0
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    run: RunConfig = field(default_factory=RunConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    # Sweep grids: {"optimizer.lr" = [0.1, 0.01], ...}; the cartesian product is run.
    sweep: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    # Free-form settings for analysis/ (figure name, panels, labels).
    figure: Mapping[str, Any] = field(default_factory=dict)
    # Set by the loader, never by a file: the scenario file this came from (relative paths in
    # it, e.g. an empirical delay CSV, resolve against its folder).
    source: str | None = None

    @property
    def base_dir(self) -> Path | None:
        """The folder relative paths in the scenario resolve against: its file's folder."""
        return Path(self.source).parent if self.source else None

    @property
    def timing_seed(self) -> int:
        """The seed of the timing streams: ``cluster.seed`` if set, else ``seed``."""
        return self.seed if self.cluster.seed is None else self.cluster.seed


# Tables whose unknown keys go into `options` instead of being rejected.
_OPEN_TABLES = {ModelConfig: "options", DataConfig: "options", ProtocolConfig: "options"}


# ----------------------------------------------------------------------------- ranges
# The largest float32: the update core holds its rates, decay and momentum in float32.
FLOAT32_MAX = 3.4028234663852886e38


def check_float32(key: str, value: float) -> float:
    """``value`` if float32 holds it (the update core's precision: a larger rate or rule
    parameter overflows to inf, with numpy's RuntimeWarnings); else a ScenarioError."""
    if not abs(value) <= FLOAT32_MAX:
        raise ScenarioError(key, f"must be at most {FLOAT32_MAX:.4g} (float32, the update "
                            f"core's precision), got {value!r}")
    return value


def physical_memory() -> int | None:
    """This machine's memory in bytes; None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(key: str, need: float, what: str, detail: str = "") -> None:
    """The one rule for sizes a scenario sets (a trace's length, a data set, a model):
    refuse, before anything is built, what needs more than the machine's memory, in one
    line under ``key``: ``{what} about N GiB{detail}; this machine has M GiB``."""
    have = physical_memory()
    if have is not None and not need <= have:
        need = min(need, 1e300)  # an integer beyond float range (TOML's are unbounded)
        raise ScenarioError(key, f"{what} about {need / 2**30:.3g} GiB{detail}; this machine "
                            f"has {have / 2**30:.3g} GiB")


# ----------------------------------------------------------------------------- conversion
def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "nothing"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        return "a list" if inner is Any else f"a list of {_describe(inner)}"
    if origin in (Mapping, dict) or tp is Mapping:
        return "a table"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, str(tp)
    )


def _shape(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) or origin in (Mapping, dict) or tp is Mapping:
        return "table"
    return "list" if origin is tuple else "value"


def _shape_of(value: Any) -> str:
    if isinstance(value, Mapping):
        return "table"
    return "list" if isinstance(value, list | tuple) else "value"


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, key)
            except ScenarioError as e:
                errors.append((a, e))
        # Report the most specific failure when only one alternative could apply: the only
        # one, or the only one of the value's shape (a table for a table, a list for a list).
        shaped = [e for a, e in errors if _shape(a) == _shape_of(value)]
        if len(errors) == 1 or len(shaped) == 1:
            raise (errors[0][1] if len(errors) == 1 else shaped[0])
        raise ScenarioError(key, f"must be {_describe(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ScenarioError(key, f"must be a table, got {value!r}")
        return from_dict(tp, value, prefix=key)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ScenarioError(key, f"must be {_describe(tp)}, got {value!r}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or tp is Mapping:
        if not isinstance(value, Mapping):
            raise ScenarioError(key, f"must be a table, got {value!r}")
        args = typing.get_args(tp)
        vt = args[1] if len(args) == 2 else Any
        if vt is Any:
            return dict(value)
        if typing.get_origin(vt) is tuple:
            # sweep grids: each value a list
            return {k: _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
        return {k: _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ScenarioError(key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(key, f"must be an integer, got {value!r}")
        return int64(key, value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ScenarioError(key, f"must be a number, got {value!r}")
        value = float(value)
        if math.isnan(value):
            raise ScenarioError(key, "must be a number, got NaN")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ScenarioError(key, f"must be a string, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: Mapping[str, Any], *, prefix: str = "") -> Any:
    """Build the frozen dataclass ``cls`` from ``data``, rejecting unknown keys.

    Raises:
        ScenarioError: naming the dotted key and the allowed keys or type.
    """
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    open_field = _OPEN_TABLES.get(cls)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in names or k == open_field:
            if open_field is not None:
                extra[k] = v
                continue
            allowed = ", ".join(n for n in names)
            raise ScenarioError(key, f"unknown key; allowed here: {allowed}"
                                     f"{did_you_mean(k, names)}")
        kwargs[k] = _convert(hints[k], v, key)
    if open_field is not None:
        kwargs[open_field] = extra
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """The plain nested-dict form of a config (inverse of :func:`from_dict`), TOML-ready."""
    if dataclasses.is_dataclass(obj):
        out: dict[str, Any] = {}
        open_field = _OPEN_TABLES.get(type(obj))
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.name == open_field:
                out.update({k: to_dict(x) for k, x in v.items()})
            elif v is not None:
                out[f.name] = to_dict(v)
        return out
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    return obj


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: a nested scenario dict by dotted key (leaves,
    lists and empty tables keep their values)."""
    if not isinstance(d, Mapping) or not d:
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def changed_keys(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two nested scenario dicts, sorted."""
    b, a = flatten(before), flatten(after)
    return sorted(k for k in b.keys() | a.keys() if b.get(k, _MISSING) != a.get(k, _MISSING))


_MISSING = object()
