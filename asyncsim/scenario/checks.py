"""The cross-field checks of a scenario (:func:`check`): registries, ranges, protocol
options against the cluster, the run's length, the sweep's keys; one line each."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asyncsim import _checks
from asyncsim._registry import check_options
from asyncsim.config import (
    FLOAT32_MAX,
    NOMINAL_NEEDS,
    SWEEP_PATHS,
    Scenario,
    check_float32,
    check_momentum_kind,
    optimizer_choices,
)
from asyncsim.errors import ScenarioError

# A scenario's name is one folder under runs/: no separator, no "." or "..", nothing hidden.
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
_LOG_F32 = math.log(FLOAT32_MAX)


def _positive(key: str, value: float | None, *, allow_zero: bool = False) -> None:
    if value is not None:
        (_checks.nonneg if allow_zero else _checks.positive)(key, value, finite=True)


def check(scn: Scenario, *, base_dir: Path | None = None) -> None:
    """Cross-field checks: registries, ranges, protocol parameters against the cluster."""
    # The registries are imported here, not at the top: the models', data sets' and rules'
    # modules import JAX (~1.5 s), and a file with a misspelt key (caught by from_dict before
    # this runs) should be reported at once (tests/cli/test_cli.py).
    from asyncsim.numerics.data import check_batch_size, declared_train_size
    from asyncsim.timing.checks import check_cluster
    from asyncsim.timing.protocols import make_protocol

    if not _NAME.fullmatch(scn.name):
        raise ScenarioError("name", "names the run folder (runs/NAME/seedN): must be 1 to 100 "
                            f"letters, digits, . _ -, not starting with '.', got {scn.name!r}")
    for key, seed in (("seed", scn.seed), ("cluster.seed", scn.cluster.seed)):
        # numpy's SeedSequence takes no negative seed, and JAX keys keep 32 bits: seed 2**32
        # would silently give seed 0's batches.
        if seed is not None:
            _checks.integer(key, seed, low=0, high=2**32 - 1)
    check_cluster(scn.cluster, scn.protocol, base_dir)
    make_protocol(scn.protocol, scn.cluster.learners)  # its options, checked as it is built
    _check_optimizer(scn)
    _check_factory("model", scn.model.name, scn.model.options, base_dir)
    _check_factory("data", scn.data.name, scn.data.options)
    _checks.integer("data.batch_size", scn.data.batch_size)
    n_train = declared_train_size(scn.data.name, scn.data.options)
    if n_train is not None:
        check_batch_size(scn.data.batch_size, n_train, scn.data.name)
    _check_run(scn)
    _check_measure(scn)
    for k, values in scn.sweep.items():
        check_sweep_key(k)
        if not isinstance(values, tuple) or not values:
            raise ScenarioError(f"sweep.{k}", "must be a non-empty list of values")
        for i, v in enumerate(values):
            if v in values[:i]:
                raise ScenarioError(f"sweep.{k}", f"lists {v!r} twice: give each value once")


def _check_optimizer(scn: Scenario) -> None:
    from asyncsim.numerics.compensation import compensation_spec  # see check
    from asyncsim.numerics.lr_rules import make_lr_rule

    o = scn.optimizer
    _positive("optimizer.lr", o.lr)
    check_float32("optimizer.lr", o.lr)
    make_lr_rule(o.lr_rule)  # an unknown rule or a refused parameter names optimizer.lr_rule
    choices = optimizer_choices(o)
    if o.transform is not None:
        from asyncsim.numerics.transforms import make_transform

        make_transform(o.transform)  # built and stepped once: optax's refusals, in one line
    if o.compensation is not None:
        compensation_spec(o.compensation)
    _checks.unit_interval("optimizer.momentum.beta", o.momentum.beta)
    if choices.lr_staleness == "nominal":
        from asyncsim.timing.protocols import make_protocol  # see check

        proto = make_protocol(scn.protocol, scn.cluster.learners)
        if proto.nominal_staleness() is None:
            raise ScenarioError("optimizer.lr_staleness",
                                f"{NOMINAL_NEEDS}; {scn.protocol.kind!r} has none")
    _positive("optimizer.weight_decay", o.weight_decay, allow_zero=True)
    check_float32("optimizer.weight_decay", o.weight_decay)
    for k, m in o.weight_decay_mult.items():
        _positive(f"optimizer.weight_decay_mult.{k}", m, allow_zero=True)
        check_float32(f"optimizer.weight_decay_mult.{k}", m)
    s = o.schedule
    for i, e in enumerate(s.decay_epochs):
        _positive(f"optimizer.schedule.decay_epochs[{i}]", e)
    _positive("optimizer.schedule.decay_factor", s.decay_factor)
    if math.log(o.lr) + len(s.decay_epochs) * math.log(max(s.decay_factor, 1.0)) > _LOG_F32:
        raise ScenarioError("optimizer.schedule.decay_factor", f"optimizer.lr x "
                            f"{s.decay_factor}^{len(s.decay_epochs)} overflows float32 (at most "
                            f"{FLOAT32_MAX:.4g}: the update core's precision)")
    _positive("optimizer.schedule.warmup_epochs", s.warmup_epochs, allow_zero=True)
    _checks.integer("optimizer.schedule.warmup_updates", s.warmup_updates, low=0)


def _check_run(scn: Scenario) -> None:
    r = scn.run
    given = [k for k in ("updates", "gradients", "epochs", "sim_time") if getattr(r, k) is not None]
    if len(given) > 1:
        raise ScenarioError(f"run.{given[1]}", f"give one run length only; got {', '.join(given)}")
    for k in ("updates", "gradients", "epochs", "sim_time"):
        v = getattr(r, k)
        if v is not None:
            _positive(f"run.{k}", float(v))
    for k in ("eval_every", "checkpoint_every"):
        _checks.integer(f"run.{k}", getattr(r, k), low=0)
    if r.eval_samples is not None:
        _checks.integer("run.eval_samples", r.eval_samples)
    _checks.choice("run.sweep_path", r.sweep_path, SWEEP_PATHS, what="sweep path")


def _check_measure(scn: Scenario) -> None:
    m = scn.measure
    _checks.integer("measure.sharpness_samples", m.sharpness_samples)
    _checks.integer("measure.sharpness_points", m.sharpness_points, low=0)
    if m.sharpness_points and scn.run.updates is None:
        raise ScenarioError("measure.sharpness_points", "spaces the measurements over the "
                            "run's updates: give the run's length as run.updates")
    for i, kind in enumerate(m.edge_momenta):
        try:
            check_momentum_kind(kind)
        except ScenarioError as e:
            raise ScenarioError(f"measure.edge_momenta[{i}]", e.message) from None
    if m.edges and scn.protocol.kind != "fixed-delay":
        raise ScenarioError("measure.edges", "measures the stability edge of a constant delay: "
                            "needs protocol.kind = \"fixed-delay\" (P2's tau + 1 workers), got "
                            f"{scn.protocol.kind!r}")
    if m.edges and (scn.model.name != "quadratic"
                    or len(scn.model.options.get("eigenvalues", [])) != 1):
        raise ScenarioError("measure.edges", "measures the stability edge of a "
                            "one-dimensional quadratic: needs model.name = \"quadratic\" "
                            "with one eigenvalue (model.eigenvalues = [1.0])")


def _check_factory(section: str, name: str, options: Mapping[str, Any],
                   base_dir: Path | None = None) -> None:
    """Model/data names against their registries; options against the factory signature
    (the one option checker, :func:`asyncsim._registry.check_options`). A model's factory
    is also called (once per [model] table and folder; it makes functions, in well under a
    millisecond for the built-ins), so the values it refuses are refused here, for every
    point of a sweep before any runs, and by ``asyncsim trace``, which never uses the
    model; what the model needs of this machine (its memory) is checked where a run builds
    it. A data set's factory is not called here: it makes the data."""
    from asyncsim.numerics.data import dataset_factory  # see check
    from asyncsim.numerics.models import get_model, model_factory

    if section == "model":
        key = (model_factory(name), repr(sorted(options.items())), str(base_dir))
        if key not in _BUILT_MODELS:
            get_model(name, base_dir=base_dir, **options)
            _BUILT_MODELS.add(key)
        return
    # a data set's factory gets the scenario's seed from asyncsim
    check_options(dataset_factory(name), options, key=section, what="data set", name=name,
                  exclude=("seed",), also=("name", "batch_size"), base_dir=None)


# The [model] tables built by _check_factory (a sweep's points share theirs).
_BUILT_MODELS: set[tuple[Any, str, str]] = set()





def check_sweep_key(key: str) -> None:
    """A sweep varies its points' scenario, not the sweep itself nor its one figure (the
    [figure] table describes the figure drawn from all the points)."""
    top = key.split(".")[0]
    if top == "sweep":
        raise ScenarioError(f"sweep.{key}", "a sweep cannot vary the sweep itself; give its "
                            "axes as keys of [sweep]")
    if top == "figure":
        raise ScenarioError(f"sweep.{key}", "[figure] describes the one figure drawn from all "
                            "the points; it cannot vary between them")
