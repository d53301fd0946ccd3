"""The built-in delay models (the table in :mod:`asyncsim.timing.delays`).

Each checks its parameters with :mod:`asyncsim._checks`, whose errors name the parameter, so
:func:`~asyncsim.timing.delays.make_delay` reports them under the scenario key
(``cluster.compute.mean: must be a positive number, got -1.0``).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from asyncsim._checks import nonneg, positive
from asyncsim._io import DamagedFile, regular_file
from asyncsim.errors import first_line
from asyncsim.timing.delays.base import DelayModel, make_delay, register_delay

# Above 100 the shapes degenerate numerically (gamma shape < 1e-4 draws mostly zeros).
_MAX_CV = 100.0


# The smallest mean a generated spec has (spec_strategy, asyncsim.testing): durations stay
# away from 0, so generated runs make progress in simulated time.
STRATEGY_MIN_MEAN = 1e-3


def _floats(lo: float, hi: float):
    from hypothesis import strategies as st  # a test dependency: imported when testing

    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def _means(max_mean: float):
    return _floats(STRATEGY_MIN_MEAN, max_mean)


def _cv(v: float) -> float:
    if not 0 <= v <= _MAX_CV:
        raise ValueError(f"cv: must be a number in [0, {_MAX_CV:g}], got {v!r}")
    return v


# ----------------------------------------------------------------------------- built-ins
@register_delay("constant")
class Constant(DelayModel):
    """Always ``value`` (>= 0)."""

    def __init__(self, value: float) -> None:
        self.value = float(nonneg("value", value))

    @classmethod
    def spec_strategy(cls, max_mean):
        """Parameter tables of mean in [1e-3, max_mean] (:mod:`asyncsim.testing`)."""
        return _means(max_mean).map(lambda m: {"value": m})

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
        self.low = float(nonneg("low", low))
        if not high >= low:
            raise ValueError(f"high: must be >= low ({low!r}), got {high!r}")
        self.high = float(high)

    @classmethod
    def spec_strategy(cls, max_mean):
        from hypothesis import strategies as st

        return st.tuples(_means(max_mean), _floats(0.0, 1.0)).map(
            lambda t: {"low": t[0] * t[1], "high": max(2.0 * t[0] - t[0] * t[1], t[0] * t[1])})

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
        self.mu = float(positive("mean", mean))
        self.std = float(nonneg("std", std))

    @classmethod
    def spec_strategy(cls, max_mean):
        from hypothesis import strategies as st

        return st.tuples(_means(max_mean), _floats(0.0, 1.0)).map(
            lambda t: {"mean": t[0], "std": t[0] * t[1]})

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
        self._m = float(positive("mean", mean))
        self.cv = float(_cv(cv))
        self.sigma = math.sqrt(math.log1p(self.cv**2))
        self.mu = math.log(self._m) - 0.5 * self.sigma**2

    @classmethod
    def spec_strategy(cls, max_mean):
        from hypothesis import strategies as st

        return st.fixed_dictionaries({"mean": _means(max_mean), "cv": _floats(0.0, 2.0)})

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
        self._m = float(positive("mean", mean))

    @classmethod
    def spec_strategy(cls, max_mean):
        return _means(max_mean).map(lambda m: {"mean": m})

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
        self._m = float(positive("mean", mean))
        self.cv = float(_cv(cv))
        self._constant = self.cv < 1e-100
        if not self._constant:
            self.shape = 1.0 / self.cv**2
            self.scale = self._m * self.cv**2

    @classmethod
    def spec_strategy(cls, max_mean):
        from hypothesis import strategies as st

        return st.fixed_dictionaries({"mean": _means(max_mean), "cv": _floats(0.0, 2.0)})

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
        self.shift = float(nonneg("shift", shift))
        self.mean_excess = float(positive("mean_excess", mean_excess))

    @classmethod
    def spec_strategy(cls, max_mean):
        from hypothesis import strategies as st

        return st.tuples(_means(max_mean), _floats(0.0, 0.99)).map(
            lambda t: {"shift": t[0] * t[1], "mean_excess": t[0] * (1.0 - t[1])})

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

    @classmethod
    def spec_strategy(cls, max_mean, *, nested=None):
        """``nested(max_mean)``: a strategy of base specs (default: constant ones)."""
        from hypothesis import strategies as st

        def table(p, factor):
            base_max = max_mean / (1.0 - p + p * factor)
            if base_max < STRATEGY_MIN_MEAN:  # no room for a slowdown under a tiny max_mean
                p, base_max = 0.0, max_mean
            bases = (nested or (lambda m: Constant.spec_strategy(m).map(
                lambda t: {"dist": "constant", **t})))(base_max)
            return bases.map(lambda b: {"base": b, "p": p, "factor": factor})

        return st.tuples(_floats(0.0, 0.5), _floats(1.0, 10.0)).flatmap(lambda t: table(*t))

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
            regular_file(path, "csv")  # not a FIFO (opening it blocks), not /dev/zero
            with path.open(newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                columns = list(reader.fieldnames or [])
                rows = list(reader)
        except DamagedFile as e:
            raise ValueError(f"path: {e}") from None
        except OSError as e:
            raise ValueError(f"path: cannot read {str(path)!r}: {e.strerror or e}") from e
        except (csv.Error, UnicodeDecodeError) as e:  # a field over csv's limit, not UTF-8
            raise ValueError(f"path: {str(path)!r} is not a CSV file of UTF-8 text: "
                             f"{first_line(e)}") from None
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

