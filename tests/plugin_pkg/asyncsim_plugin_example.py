"""Example asyncsim delay-model plug-in (installed by tests/test_delays.py).

``Weibull`` subclasses :class:`asyncsim.delays.DelayModel`; ``Diurnal`` is duck-typed (it
only has ``sample``), which asyncsim wraps.
"""

from __future__ import annotations

import math

import numpy as np

from asyncsim.delays import DelayModel


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
