"""The scenario schema: typed, frozen dataclasses, one per table, with the defaults.

Defaults live here, in code; a scenario file holds overrides only. Each field's comment is
its reference text (``docs/keys.md`` is generated from it by :mod:`asyncsim.keys`).
Distributions (``cluster.compute``, link latencies, PS service time) are kept as plain
mappings ``{"dist": name, **params}``, and the options of a protocol, model or data set as
the table's other keys (:data:`OPEN_TABLES`): the plug-in registries check them against the
named class's or factory's signature, so a user's plug-in needs no change here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


# Tables whose unknown keys go into `options` instead of being rejected: the options of the
# plug-in the table names (asyncsim._registry checks them against its signature).
OPEN_TABLES = {ModelConfig: "options", DataConfig: "options", ProtocolConfig: "options"}
