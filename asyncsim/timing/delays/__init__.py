"""Delay models: compute time per gradient, link latency, PS service time.

A delay model is a small class that draws one non-negative duration (simulated seconds) from
the numpy ``Generator`` it is given; scenario files name a model and its parameters,
``{dist = "lognormal", mean = 1.0, cv = 0.1}``. :mod:`.base` holds the contract
(:class:`DelayModel`), the registry, :func:`make_delay` and the buffered
:class:`DelayStream` the simulator draws from; :mod:`.builtin` the built-in models
(``constant``, ``uniform``, ``normal``, ``lognormal``, ``exponential``, ``gamma``,
``shifted-exponential``, ``straggler``, ``empirical``). Adding a delay model touches one
file: your own (docs/plugins.md).
"""

from asyncsim.timing.delays.base import (
    DelayModel,
    DelayStream,
    available_delays,
    make_delay,
    register_delay,
)
from asyncsim.timing.delays.builtin import (
    Constant,
    Empirical,
    Exponential,
    Gamma,
    Lognormal,
    Normal,
    ShiftedExponential,
    Straggler,
    Uniform,
)

__all__ = [
    "Constant", "DelayModel", "DelayStream", "Empirical", "Exponential", "Gamma", "Lognormal",
    "Normal", "ShiftedExponential", "Straggler", "Uniform", "available_delays", "make_delay",
    "register_delay",
]
