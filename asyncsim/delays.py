"""Delay models: compute time per gradient, link latency, PS service time.

A delay model is a small class that draws one non-negative duration (in simulated seconds)
from the numpy ``Generator`` it is given. Scenario files name a model and its parameters,
``{dist = "lognormal", mean = 1.0, cv = 0.1}``; :func:`make_delay` turns such a spec into a
model, checking the parameters against the class's ``__init__`` signature so that a user's
model gets exactly the same checks as a built-in (DESIGN.md, "Plug-ins").

Determinism (DESIGN.md, "Determinism"): every draw comes from the ``Generator`` passed in,
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

P1 (PAPERS.md) contrasts low-variance compute times (cv <= 0.1, e.g. ``lognormal``) with
exponential ones, which is why both parameterisations are by mean and spread.

Plug-ins: :func:`register_delay` registers a class by name from Python; packages expose
classes through the entry-point group ``asyncsim.delays`` (entry-point name = ``dist``
name). A name registered directly wins over an entry point of the same name, so a user can
always override an installed plug-in in their own code. See ``docs/plugins.md``.
"""

from __future__ import annotations

import csv
import functools
import inspect
import math
import os
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Union

import numpy as np

from asyncsim._plugins import PluginRegistry
from asyncsim.errors import ScenarioError, did_you_mean

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
    ENTRY_POINT_GROUP, "distribution", "dist", adapt=lambda obj, name: _adapt(obj, name))


def register_delay(name: str) -> Callable[[type], type]:
    """Register a delay-model class under ``name`` (a class decorator).

    ``@register_delay("weibull")`` over a class, or ``register_delay("weibull")(Weibull)``.
    A class that does not derive from :class:`DelayModel` but has ``sample(rng, learner,
    now)`` is wrapped. Registering a second, different class under a taken name raises
    ``ValueError``; re-registering the same ``module.qualname`` (a reloaded module, a
    re-run notebook cell) replaces it. Returns the class unchanged.
    """
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"delay model name must be a non-empty string without spaces: {name!r}")

    def decorator(cls: type) -> type:
        adapted = _adapt(cls, name)
        old = _registry.direct.get(name)
        if old is not None and _origin_id(old) != _origin_id(adapted):
            raise ValueError(
                f"delay model {name!r} is already registered to {_origin_id(old)}; "
                f"cannot register {_origin_id(adapted)}"
            )
        _registry.direct[name] = adapted
        return cls

    return decorator


def available_delays() -> list[str]:
    """Names of all delay models: built-ins, registered classes and entry points, sorted."""
    return _registry.names()


def _origin_id(cls: type) -> str:
    src = getattr(cls, "_wrapped", cls)
    return f"{src.__module__}.{src.__qualname__}"


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
    if not isinstance(spec, Mapping):
        raise ScenarioError(
            key,
            f'must be a table such as {{dist = "lognormal", mean = 1.0, cv = 0.1}}, got {spec!r}',
        )
    dist_key = _join(key, "dist")
    if "dist" not in spec:
        raise ScenarioError(dist_key, f"missing; allowed: {', '.join(available_delays())}")
    name = spec["dist"]
    if not isinstance(name, str):
        raise ScenarioError(
            dist_key, f"must be a string; allowed: {', '.join(available_delays())}, got {name!r}"
        )
    cls = _registry.get(name, dist_key)
    kwargs = _check_params(cls, name, spec, key, base_dir)
    try:
        return cls(**kwargs)
    except ScenarioError:
        raise
    except ValueError as e:
        # Contract: ValueError("<param>: <message>") -> ScenarioError("<key>.<param>", message).
        param, sep, message = str(e).partition(": ")
        if sep and (param in kwargs or param in _params(cls)[0]):
            raise ScenarioError(_join(key, param), message) from e
        raise ScenarioError(key, f"invalid parameters for {name!r}: {e}") from e


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@functools.cache
def _params(cls: type) -> tuple[dict[str, inspect.Parameter], dict[str, Any], bool]:
    """(keyword parameters of ``cls.__init__``, their type hints, accepts ``**kwargs``)."""
    src = getattr(cls, "_wrapped", cls)
    init = src.__init__
    if init is object.__init__:
        return {}, {}, False
    sig = inspect.signature(init)
    params = {
        p.name: p
        for p in list(sig.parameters.values())[1:]  # drop self
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # unresolvable annotations in a user's class: check names only
        hints = {}
    return params, hints, var_kw


def _check_params(
    cls: type, name: str, spec: Mapping[str, Any], key: str, base_dir: Any
) -> dict[str, Any]:
    params, hints, var_kw = _params(cls)
    allowed = ", ".join(params) or "none"
    kwargs: dict[str, Any] = {}
    for k, v in spec.items():
        if k == "dist":
            continue
        if k not in params and not var_kw:
            raise ScenarioError(
                _join(key, k), f"unknown parameter for {name!r}; allowed: {allowed}"
                f"{did_you_mean(k, params)}")
        p = params.get(k)
        hint = hints.get(k, inspect.Parameter.empty)
        if hint is inspect.Parameter.empty and p is not None and p.default is not p.empty:
            hint = type(p.default)  # unannotated: infer from the default's type
        kwargs[k] = _coerce(hint, v, _join(key, k), base_dir)
    required = [n for n, p in params.items() if p.default is p.empty]
    for n in required:
        if n not in kwargs:
            raise ScenarioError(_join(key, n), f"missing; {name!r} requires: {', '.join(required)}")
    return kwargs


_NONE = type(None)


def _coerce(hint: Any, value: Any, key: str, base_dir: Any) -> Any:
    """``value`` checked (and converted) against the annotation ``hint``."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        alts = typing.get_args(hint)
    else:
        alts = (hint,)
    if value is None and _NONE in alts:
        return None
    wants = []
    for t in alts:
        if t is float:
            wants.append("a finite number")
            if isinstance(value, int | float) and not isinstance(value, bool):
                if not math.isfinite(value):
                    raise ScenarioError(key, f"must be a finite number, got {value!r}")
                return float(value)
        elif t is int:
            wants.append("an integer")
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif t is bool:
            wants.append("true or false")
            if isinstance(value, bool):
                return value
        elif t is str:
            wants.append("a string")
            if isinstance(value, str):
                return value
        elif t in (Path, os.PathLike):
            wants.append("a file path")
            if isinstance(value, str | os.PathLike):
                path = Path(value).expanduser()
                if not path.is_absolute() and base_dir is not None:
                    path = Path(base_dir) / path
                return path
        elif isinstance(t, type) and issubclass(t, DelayModel):
            wants.append("a delay-model table {dist = ..., ...}")
            if isinstance(value, DelayModel):
                return value
            if isinstance(value, Mapping):
                return make_delay(value, key=key, base_dir=base_dir)
        elif t is not _NONE:
            return value  # an annotation we do not check (Any, a user's type): pass through
    raise ScenarioError(key, f"must be {' or '.join(wants)}, got {value!r}")


# ----------------------------------------------------------------------------- checks
def _positive(name: str, v: float) -> float:
    if not v > 0:
        raise ValueError(f"{name}: must be a positive number, got {v!r}")
    return v


def _nonneg(name: str, v: float) -> float:
    if not v >= 0:
        raise ValueError(f"{name}: must be a number >= 0, got {v!r}")
    return v


def _cv(v: float) -> float:
    # Above 100 the shapes degenerate numerically (gamma shape < 1e-4 draws mostly zeros).
    if not 0 <= v <= _MAX_CV:
        raise ValueError(f"cv: must be a number in [0, {_MAX_CV:g}], got {v!r}")
    return v


_MAX_CV = 100.0


# ----------------------------------------------------------------------------- built-ins
@register_delay("constant")
class Constant(DelayModel):
    """Always ``value`` (>= 0)."""

    def __init__(self, value: float) -> None:
        self.value = float(_nonneg("value", value))

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        return self.value

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        return np.full(size, self.value)

    @property
    def mean(self) -> float:
        return self.value


@register_delay("uniform")
class Uniform(DelayModel):
    """Uniform on [``low``, ``high``], 0 <= low <= high."""

    def __init__(self, low: float, high: float) -> None:
        self.low = float(_nonneg("low", low))
        if not high >= low:
            raise ValueError(f"high: must be >= low ({low!r}), got {high!r}")
        self.high = float(high)

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        return float(rng.uniform(self.low, self.high))

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        return rng.uniform(self.low, self.high, size)

    @property
    def mean(self) -> float:
        return 0.5 * (self.low + self.high)


@register_delay("normal")
class Normal(DelayModel):
    """A normal(``mean``, ``std``) truncated at 0 by rejection: negative draws are redrawn.

    Rejection keeps the density's shape above 0 exact (clipping would put a point mass at 0).
    ``mean`` must be > 0, so at least half of all draws are accepted. ``mean``/``std`` are
    the parameters before truncation; the ``mean`` property is the truncated mean.
    """

    def __init__(self, mean: float, std: float) -> None:
        self.mu = float(_positive("mean", mean))
        self.std = float(_nonneg("std", std))

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        while True:
            x = float(rng.normal(self.mu, self.std))
            if x >= 0.0:
                return x

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        out = rng.normal(self.mu, self.std, size)
        bad = np.flatnonzero(out < 0.0)
        while bad.size:  # each slot keeps its first accepted draw: iid truncated normals
            out[bad] = rng.normal(self.mu, self.std, bad.size)
            bad = bad[out[bad] < 0.0]
        return out

    @property
    def mean(self) -> float:
        if self.std == 0.0:
            return self.mu
        a = -self.mu / self.std
        pdf = math.exp(-0.5 * a * a) / math.sqrt(2.0 * math.pi)
        tail = 0.5 * math.erfc(a / math.sqrt(2.0))  # P(Z > a)
        return self.mu + self.std * pdf / tail


@register_delay("lognormal")
class Lognormal(DelayModel):
    """Lognormal with the given ``mean`` (> 0) and coefficient of variation ``cv`` (in
    [0, 100]).

    sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2 / 2, so that E[X] = mean and
    std(X) / E[X] = cv.
    """

    def __init__(self, mean: float, cv: float) -> None:
        self._m = float(_positive("mean", mean))
        self.cv = float(_cv(cv))
        self.sigma = math.sqrt(math.log1p(self.cv**2))
        self.mu = math.log(self._m) - 0.5 * self.sigma**2

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        return float(rng.lognormal(self.mu, self.sigma))

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        return rng.lognormal(self.mu, self.sigma, size)

    @property
    def mean(self) -> float:
        return self._m


@register_delay("exponential")
class Exponential(DelayModel):
    """Exponential with the given ``mean`` (> 0)."""

    def __init__(self, mean: float) -> None:
        self._m = float(_positive("mean", mean))

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        return float(rng.exponential(self._m))

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        return rng.exponential(self._m, size)

    @property
    def mean(self) -> float:
        return self._m


@register_delay("gamma")
class Gamma(DelayModel):
    """Gamma with the given ``mean`` (> 0) and ``cv`` (in [0, 100]): shape 1/cv^2, scale
    mean*cv^2.

    ``cv = 1`` is the exponential; ``cv = 0`` (or below 1e-100, where 1/cv^2 overflows) is
    the constant ``mean``.
    """

    def __init__(self, mean: float, cv: float) -> None:
        self._m = float(_positive("mean", mean))
        self.cv = float(_cv(cv))
        self._constant = self.cv < 1e-100
        if not self._constant:
            self.shape = 1.0 / self.cv**2
            self.scale = self._m * self.cv**2

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        if self._constant:
            return self._m
        return float(rng.gamma(self.shape, self.scale))

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        if self._constant:
            return np.full(size, self._m)
        return rng.gamma(self.shape, self.scale, size)

    @property
    def mean(self) -> float:
        return self._m


@register_delay("shifted-exponential")
class ShiftedExponential(DelayModel):
    """``shift`` (>= 0) plus an exponential with mean ``mean_excess`` (> 0).

    The usual model of a fixed minimum compute time plus random interference; its mean is
    ``shift + mean_excess``.
    """

    def __init__(self, shift: float, mean_excess: float) -> None:
        self.shift = float(_nonneg("shift", shift))
        self.mean_excess = float(_positive("mean_excess", mean_excess))

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        return self.shift + float(rng.exponential(self.mean_excess))

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        return self.shift + rng.exponential(self.mean_excess, size)

    @property
    def mean(self) -> float:
        return self.shift + self.mean_excess


@register_delay("straggler")
class Straggler(DelayModel):
    """A draw of ``base``, slowed down by ``factor`` (>= 1) with probability ``p``.

    The slowdown is decided independently per draw (transient stragglers: a noisy neighbour,
    a GC pause). In TOML: ``compute = {dist = "straggler", p = 0.05, factor = 4.0,
    base = {dist = "lognormal", mean = 1.0, cv = 0.1}}``. Mean: base mean * (1 - p + p*factor).
    The model is time-dependent exactly when ``base`` is.
    """

    def __init__(self, base: DelayModel, p: float, factor: float) -> None:
        self.base = make_delay(base, key="base")  # a spec when built directly from Python
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p: must be a probability in [0, 1], got {p!r}")
        if not factor >= 1.0:
            raise ValueError(f"factor: must be a slowdown >= 1, got {factor!r}")
        self.p = float(p)
        self.factor = float(factor)
        self.time_dependent = self.base.time_dependent  # type: ignore[misc]

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        d = self.base.sample(rng, learner, now)
        return d * self.factor if rng.random() < self.p else d

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        d = np.array(self.base.sample_block(rng, learner, size), dtype=np.float64)
        d[rng.random(size) < self.p] *= self.factor
        return d

    @property
    def mean(self) -> float | None:
        m = self.base.mean
        return None if m is None else m * (1.0 - self.p + self.p * self.factor)


@register_delay("empirical")
class Empirical(DelayModel):
    """Measured durations, resampled uniformly with replacement.

    ``path``: a CSV file with a header row; relative to the scenario file's folder.
    ``column``: the column of durations (may be omitted when the file has one column).
    Every value must be a finite number >= 0; blank cells are skipped.
    """

    def __init__(self, path: Path, column: str | None = None) -> None:
        path = Path(path)
        try:
            with path.open(newline="") as f:
                reader = csv.DictReader(f)
                columns = list(reader.fieldnames or [])
                rows = list(reader)
        except OSError as e:
            raise ValueError(f"path: cannot read {str(path)!r}: {e.strerror or e}") from e
        if column is None:
            if len(columns) != 1:
                raise ValueError(
                    f"column: required, the file has columns: {', '.join(columns) or 'none'}"
                )
            column = columns[0]
        if column not in columns:
            raise ValueError(
                f"column: no column {column!r} in {str(path)!r}; allowed: {', '.join(columns)}"
            )
        values = []
        for i, row in enumerate(rows, start=2):  # line 1 is the header
            cell = (row.get(column) or "").strip()
            if not cell:
                continue
            try:
                v = float(cell)
            except ValueError:
                raise ValueError(
                    f"column: line {i} of {str(path)!r} is not a number: {cell!r}"
                ) from None
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(
                    f"column: line {i} of {str(path)!r} must be a finite number >= 0, got {v!r}"
                )
            values.append(v)
        if not values:
            raise ValueError(f"column: no values in column {column!r} of {str(path)!r}")
        self.path = path
        self.column = column
        self.values = np.asarray(values, dtype=np.float64)

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        return float(self.values[rng.integers(self.values.size)])

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        return self.values[rng.integers(0, self.values.size, size)]

    @property
    def mean(self) -> float:
        return float(self.values.mean())


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
            delay" deep inside a run.
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
            raise ValueError(
                f"delay model {type(self.model).__name__}.sample_block returned shape "
                f"{block.shape}, expected ({size},)"
            )
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
