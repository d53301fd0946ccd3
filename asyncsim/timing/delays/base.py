"""Delay models: compute time per gradient, link latency, PS service time.

A delay model is a small class that draws one non-negative duration (in simulated seconds)
from the numpy ``Generator`` it is given. Scenario files name a model and its parameters,
``{dist = "lognormal", mean = 1.0, cv = 0.1}``; :func:`make_delay` turns such a spec into a
model, checking the parameters against the class's ``__init__`` signature so that a user's
model gets exactly the same checks as a built-in (docs/plugins.md).

Determinism (docs/design.md, "Determinism"): every draw comes from the ``Generator`` passed in,
never from ``random`` or the ``np.random.*`` module functions. The simulator gives each
(learner, link) its own Generator spawned from ``SeedSequence(seed)``, so adding a learner
does not change the other learners' draws.

Built-ins (parameters; the distribution of one draw):

==========================  ===============================================================
``constant``                ``value``: always ``value``.
``uniform``                 ``low``, ``high``: uniform on [low, high].
``normal``                  ``mean``, ``std``: a normal *truncated at 0 by rejection* (a
                            negative draw is redrawn), so the shape above 0 is exact; the
                            ``mean`` property is the mean after truncation.
``lognormal``               ``mean``, ``cv``: the mean and coefficient of variation of the
                            lognormal itself (sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2/2).
``exponential``             ``mean``.
``gamma``                   ``mean``, ``cv``: shape 1/cv^2, scale mean*cv^2 (cv = 0: constant).
``shifted-exponential``     ``shift``, ``mean_excess``: ``shift`` plus an exponential with
                            mean ``mean_excess``; the mean is shift + mean_excess.
``straggler``               ``base`` (a nested spec), ``p``, ``factor``: a draw of ``base``,
                            multiplied by ``factor`` with probability ``p``, independently per
                            draw (a transient straggler; persistent ones are ``cluster.speed``).
``empirical``               ``path``, ``column``: resampled uniformly with replacement from
                            the measured durations in one column of a CSV file.
==========================  ===============================================================

P1 (docs/papers.md) contrasts low-variance compute times (cv <= 0.1, e.g. ``lognormal``) with
exponential ones, which is why both parameterisations are by mean and spread.

Plug-ins: :func:`register_delay` registers a class by name from Python; packages expose
classes through the entry-point group ``asyncsim.delays`` (entry-point name = ``dist``
name). A name registered directly wins over an entry point of the same name, so a user can
always override an installed plug-in in their own code. See ``docs/plugins.md``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from asyncsim._checks import required, table
from asyncsim._registry import (
    PluginRegistry,
    alternatives,
    call_checked,
    check_options,
    path_options,
    signature_options,
)
from asyncsim.errors import ScenarioError

__all__ = [
    "DelayModel",
    "DelayStream",
    "available_delays",
    "make_delay",
    "register_delay",
]

ENTRY_POINT_GROUP = "asyncsim.delays"


# ----------------------------------------------------------------------------- base class
class DelayModel:
    """Base class of delay models: one non-negative duration per call.

    Subclasses declare their parameters as keyword arguments of ``__init__`` (annotated
    ``float``, ``int``, ``str``, ``bool``, ``Path`` or ``DelayModel`` for a nested spec);
    :func:`make_delay` checks a scenario's spec against that signature. ``__init__``
    validates values and raises ``ValueError("<param>: <what is allowed>, got <value>")``;
    the parameter name before the colon lets :func:`make_delay` name the scenario key.

    A model may declare ``spec_strategy(max_mean)``, a classmethod returning a hypothesis
    strategy of parameter tables whose model's mean lies in [1e-3, ``max_mean``]; the
    testing strategies (:mod:`asyncsim.testing`) draw from it, and derive one from the
    signature where there is none.

    Attributes:
        time_dependent: ``False`` (default) means draws do not depend on the simulated time,
            so the simulator may draw them in blocks ahead of time with :meth:`sample_block`.
            ``True`` means :meth:`sample` is called once per event with the current ``now``.
    """

    time_dependent: ClassVar[bool] = False

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        """One duration ``>= 0`` for ``learner`` at simulated time ``now``.

        Draw only from ``rng`` (the learner's or link's own Generator).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement sample()")

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        """``size`` independent durations, as a float64 array of shape ``(size,)``.

        Only used for time-independent models (``now`` is passed as 0.0). The default calls
        :meth:`sample` ``size`` times; built-ins override it with one vectorised draw, which
        has the same distribution but need not give the same values as repeated ``sample``.
        """
        return np.fromiter(
            (self.sample(rng, learner, 0.0) for _ in range(size)), dtype=np.float64, count=size
        )

    # ``mean`` is a property per the contract, but with a setter: a user's ``__init__`` that
    # does ``self.mean = mean`` must not crash on a read-only attribute.
    @property
    def mean(self) -> float | None:
        """The analytic mean of one draw if known, else ``None``."""
        return self.__dict__.get("_analytic_mean")

    @mean.setter
    def mean(self, value: float | None) -> None:
        self.__dict__["_analytic_mean"] = value


# ----------------------------------------------------------------------------- registry
_registry: PluginRegistry[type[DelayModel]] = PluginRegistry(
    ENTRY_POINT_GROUP, "delay model", "dist", adapt=lambda obj, name: _adapt(obj, name))


def register_delay(name: str, *, replace: bool = False) -> Callable[[type], type]:
    """Register a delay-model class under ``name`` (a class decorator).

    ``@register_delay("weibull")`` over a class, or ``register_delay("weibull")(Weibull)``.
    A class that does not derive from :class:`DelayModel` but has ``sample(rng, learner,
    now)`` is wrapped. The rule of every plug-in kind
    (:meth:`asyncsim._registry.PluginRegistry.register`): a name taken by another class is a
    ``ValueError`` naming both unless ``replace``; the same ``module.qualname`` again (a
    reloaded module, a re-run notebook cell) replaces it. Returns the class unchanged.
    """
    return _registry.decorator(name, replace=replace)


def available_delays() -> list[str]:
    """Names of all delay models: built-ins, registered classes and entry points, sorted."""
    return _registry.names()


def _adapt(obj: Any, name: str) -> type[DelayModel]:
    """``obj`` as a DelayModel subclass, wrapping a duck-typed class."""
    if not isinstance(obj, type):
        raise TypeError(f"delay model {name!r} must be a class, got {obj!r}")
    if issubclass(obj, DelayModel):
        return obj
    if not callable(getattr(obj, "sample", None)):
        raise TypeError(f"delay model {name!r}: {obj.__qualname__} has no sample() method")
    return _wrap(obj)


def _wrap(user_cls: type) -> type[DelayModel]:
    has_block = callable(getattr(user_cls, "sample_block", None))

    class Wrapped(DelayModel):
        time_dependent = bool(getattr(user_cls, "time_dependent", False))
        _wrapped = user_cls

        def __init__(self, **params: Any) -> None:
            self._inner = user_cls(**params)

        def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
            return self._inner.sample(rng, learner, now)

        if has_block:

            def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
                return np.asarray(self._inner.sample_block(rng, learner, size), np.float64)

        @property
        def mean(self) -> float | None:
            m = getattr(self._inner, "mean", None)
            return None if callable(m) else m

    Wrapped.__name__ = user_cls.__name__
    Wrapped.__qualname__ = user_cls.__qualname__
    Wrapped.__module__ = user_cls.__module__
    Wrapped.__doc__ = user_cls.__doc__
    return Wrapped


# ----------------------------------------------------------------------------- make_delay
def make_delay(
    spec: Mapping[str, Any] | DelayModel,
    *,
    key: str = "",
    base_dir: str | os.PathLike[str] | None = None,
) -> DelayModel:
    """Build the delay model a scenario spec describes.

    Args:
        spec: ``{"dist": name, **params}``, as parsed from TOML. A :class:`DelayModel`
            instance is returned unchanged (handy from Python).
        key: the dotted scenario key of ``spec`` (``"cluster.compute"``,
            ``"cluster.compute[3]"``), used to name the offending key in errors.
        base_dir: folder that relative ``Path`` parameters (``empirical``'s ``path``) resolve
            against: the scenario file's folder. ``None``: the current directory.

    Raises:
        ScenarioError: unknown ``dist``; missing, unknown, wrong-typed, non-finite or
            out-of-range parameters; a plug-in that fails to load. The error names the key
            (``cluster.compute.mean``) and what is allowed there.
    """
    if isinstance(spec, DelayModel):
        return spec
    table(key, spec, 'such as {dist = "lognormal", mean = 1.0, cv = 0.1}')
    dist_key = _join(key, "dist")
    name = required(dist_key, spec, "dist", available_delays)
    if not isinstance(name, str):
        raise ScenarioError(
            dist_key, f"must be a string; allowed: {', '.join(available_delays())}, got {name!r}"
        )
    cls = _registry.get(name, dist_key)
    # The one option checker of every plug-in kind (asyncsim._registry): the __init__
    # signature is the parameter list; ValueError("<param>: ...") names the key.
    kwargs = check_options(cls, {k: v for k, v in spec.items() if k != "dist"}, key=key,
                           what=_registry.what, name=name, also=("dist",), base_dir=base_dir,
                           nested={DelayModel: ("a delay-model table {dist = ..., ...}",
                                                _nested)})
    return call_checked(cls, kwargs, key=key, what=_registry.what, name=name)


def spec_files(spec: Any) -> list[tuple[tuple[str, ...], str]]:
    """The file paths a delay spec reads, nested specs (a straggler's ``base``) included:
    ``(where in the spec, the path as written)``, e.g. ``(("path",), "delays.csv")`` for an
    ``empirical`` model; found from the models' annotations (``Path``), so a plug-in's file
    parameters are found too. A run folder copies these files (docs/design.md)."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("dist"), str):
        return []
    cls = _registry.get(spec["dist"], "dist")
    out = [((k,), spec[k]) for k in path_options(cls, spec)]
    _, hints, _ = signature_options(cls)
    for k, v in spec.items():
        if isinstance(v, Mapping) and DelayModel in alternatives(hints.get(k)):
            out += [((k, *where), path) for where, path in spec_files(v)]
    return out


def _nested(spec: Mapping[str, Any], key: str, base_dir: Any) -> DelayModel:
    """A delay-model parameter given as a table (a straggler's ``base``)."""
    return make_delay(spec, key=key, base_dir=base_dir)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# ----------------------------------------------------------------------------- streams
class DelayStream:
    """Per-(learner, link) buffered sampler, on the simulator's hot path.

    Time-independent models are drawn in blocks with :meth:`DelayModel.sample_block` and
    served from a Python list; time-dependent models get one :meth:`DelayModel.sample` call
    per event with the current time. Block sizes grow 64, 128, ... up to ``block``, so a
    short run does not pay for thousands of unused draws per stream. Every duration is
    multiplied by ``scale`` (a learner with speed 2 has ``scale = 0.5``). The values are
    exactly those of this loop, so a stream is reproducible from (model, rng, learner)::

        size = min(64, block)
        while True:
            if model.time_dependent:
                yield scale * model.sample(rng, learner, now)
            else:
                yield from scale * model.sample_block(rng, learner, size)
                size = min(2 * size, block)

    ``key`` is the scenario key the model came from (``cluster.compute``, ...), for messages.

    Raises:
        ScenarioError: (a ValueError) under ``key`` if the model returns a negative, NaN or
            infinite duration (a plug-in bug, or parameters whose draws overflow, e.g. an
            exponential of mean 1e308), reported here rather than as SimPy's "negative
            delay" deep inside a run, or a ``sample_block`` that returns another number of
            draws than it was asked for.
    """

    FIRST_BLOCK = 64

    __slots__ = ("model", "rng", "learner", "scale", "block", "key", "_td", "_size", "_buf",
                 "_i", "_n")

    def __init__(
        self,
        model: DelayModel,
        rng: np.random.Generator,
        learner: int,
        *,
        scale: float = 1.0,
        block: int = 4096,
        key: str = "",
    ) -> None:
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale: must be a positive finite number, got {scale!r}")
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block: must be an integer >= 1, got {block!r}")
        self.model = model
        self.rng = rng
        self.learner = learner
        self.scale = float(scale)
        self.block = block
        self.key = key
        self._td = bool(model.time_dependent)
        self._size = min(self.FIRST_BLOCK, block)
        self._buf: list[float] = []
        self._i = 0
        self._n = 0

    def next(self, now: float) -> float:
        """The next duration (simulated seconds, >= 0) for an event at time ``now``."""
        i = self._i
        if i < self._n:
            self._i = i + 1
            return self._buf[i]
        return self._slow_next(now)

    def _slow_next(self, now: float) -> float:
        if self._td:
            d = float(self.model.sample(self.rng, self.learner, now)) * self.scale
            if not 0.0 <= d < math.inf:
                raise self._bad(d, now)
            return d
        size = self._size
        self._size = min(2 * size, self.block)
        block = np.asarray(self.model.sample_block(self.rng, self.learner, size), np.float64)
        if block.shape != (size,):
            raise ScenarioError(self.key, f"delay model {type(self.model).__name__}'s "
                                f"sample_block returned shape {block.shape} for learner "
                                f"{self.learner}; it was asked for ({size},)")
        if self.scale != 1.0:
            block = block * self.scale
        ok = np.isfinite(block) & (block >= 0.0)
        if not ok.all():
            raise self._bad(float(block[np.argmin(ok)]), now)
        # Python floats: cheaper to index than numpy scalars, and to add to SimPy times.
        self._buf = block.tolist()
        self._n = size
        self._i = 1
        return self._buf[0]

    def _bad(self, d: float, now: float) -> ScenarioError:
        return ScenarioError(self.key, f"delay model {type(self.model).__name__} returned {d!r} "
                             f"for learner {self.learner} (drawn at simulated time {now:.6g}); "
                             "durations must be finite and >= 0")
