"""Example asyncsim plug-in package (installed by the ``installed_plugin`` test fixture).

One of each kind a scenario file refers to by name, each exposed through its entry-point
group in ``pyproject.toml``: delay models (``Weibull`` subclasses
:class:`asyncsim.DelayModel`; ``Diurnal`` is duck-typed, which asyncsim wraps),
protocols (``Pairs``; ``EveryK``, with an option ``k``), a learning-rate rule
(``sqrt_staleness``), a model (``affine``) and a data set (``ramp``).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from asyncsim import Dataset, DelayModel, Model, Protocol


class Weibull(DelayModel):
    """Weibull compute times: ``scale * W`` with ``W ~ Weibull(shape)``; mean
    ``scale * Gamma(1 + 1/shape)``."""

    def __init__(self, shape: float, scale: float = 1.0) -> None:
        if not shape > 0:
            raise ValueError(f"shape: must be a positive number, got {shape!r}")
        if not scale > 0:
            raise ValueError(f"scale: must be a positive number, got {scale!r}")
        self.shape = shape
        self.scale = scale

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        return self.scale * float(rng.weibull(self.shape))

    def sample_block(self, rng: np.random.Generator, learner: int, size: int) -> np.ndarray:
        return self.scale * rng.weibull(self.shape, size)

    @property
    def mean(self) -> float:
        return self.scale * math.gamma(1.0 + 1.0 / self.shape)


class Diurnal:
    """A time-dependent load: ``base * (1 + amplitude * sin(2 pi now / period))``, times a
    unit-mean exponential. Not a DelayModel subclass on purpose."""

    time_dependent = True

    def __init__(self, base: float, amplitude: float = 0.5, period: float = 100.0) -> None:
        if not 0 <= amplitude < 1:
            raise ValueError(f"amplitude: must be in [0, 1), got {amplitude!r}")
        self.base, self.amplitude, self.period = base, amplitude, period

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        load = 1.0 + self.amplitude * math.sin(2.0 * math.pi * now / self.period)
        return self.base * load * float(rng.exponential())


class Pairs(Protocol):
    """Apply gradients two at a time in arrival order, whatever the cluster size
    (n-softsync with c = 2)."""

    def __init__(self, learners):
        super().__init__(learners)
        if learners < 2:
            raise ValueError(f"learners: 'pairs-test' needs >= 2, got {learners}")
        self.buffer: list[tuple] = []

    def updates_per_gradient(self):
        return 0.5

    def on_arrival(self, sim, grad):
        self.buffer.append(grad)
        if len(self.buffer) == 2:
            pair, self.buffer = self.buffer, []
            sim.apply_update(pair)


class EveryK(Protocol):
    """Apply gradients k at a time in arrival order: an option from the scenario,
    ``protocol = { kind = "every-k-test", k = 3 }``, read from this signature."""

    def __init__(self, learners, *, k: int = 2):
        super().__init__(learners)
        if k < 1:
            raise ValueError(f"k: must be >= 1, got {k}")
        self.k = k
        self.buffer: list[tuple] = []

    def updates_per_gradient(self):
        return 1.0 / self.k

    def on_arrival(self, sim, grad):
        self.buffer.append(grad)
        if len(self.buffer) == self.k:
            batch, self.buffer = self.buffer, []
            sim.apply_update(batch)


def sqrt_staleness(lr, staleness, mean_staleness):
    """alpha = alpha0 / sqrt(max(tau, 1))."""
    del mean_staleness
    return lr / jnp.sqrt(jnp.maximum(staleness, 1.0))


def affine(*, dim: int = 4, scale: float = 1.0) -> Model:
    """Least squares ``0.5 * mean((scale * x . w + b - y)^2)`` on ``dim`` features, zero init."""
    if dim < 1:
        raise ValueError(f"dim: must be >= 1, got {dim}")

    def init(key):
        del key
        return {"w": jnp.zeros((dim,), jnp.float32), "b": jnp.zeros((), jnp.float32)}

    def apply(params, x):
        return scale * x @ params["w"] + params["b"]

    def loss(params, x, y):
        return 0.5 * jnp.mean((apply(params, x) - y) ** 2)

    return Model("affine-test", init, apply, loss, (dim,), None)


def ramp(*, seed: int, dim: int = 4, n_train: int = 64, n_test: int = 16) -> Dataset:
    """Gaussian features with noiseless targets ``y = x . (1, 2, ..., dim)`` (floats)."""
    rng = np.random.default_rng([seed, 7])
    w = np.arange(1, dim + 1, dtype=np.float32)
    x = rng.standard_normal((n_train + n_test, dim)).astype(np.float32)
    y = (x @ w).astype(np.float32)
    return Dataset("ramp-test", x[:n_train], y[:n_train], x[n_train:], y[n_train:], 1)


NOT_CALLABLE = 42  # exposed as a broken lr rule: loading it must name the scenario key
