"""The learning-rate schedule of the update core: step decays at epochs and a linear
warm-up, as a traced function of the PS version (:func:`make_schedule`), and the chain's
piece that applies it (:func:`scheduled`). P1 decays at epochs (its CIFAR10 recipe), P2's
official regimes divide the rate by 10 at epochs 81/122/164.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from asyncsim.config import OptimizerConfig
from asyncsim.errors import ScenarioError
from asyncsim.numerics.chain import Piece, no_state

__all__ = ["make_schedule", "scheduled"]


def make_schedule(opt: OptimizerConfig, updates_per_epoch: float | None):
    """The rate factor as a function of the PS version ``step``, or None if always 1."""
    sched = opt.schedule
    uses_epochs = bool(sched.decay_epochs) or sched.warmup_epochs > 0
    if uses_epochs and updates_per_epoch is None:
        raise ScenarioError(
            "optimizer.schedule",
            "decay_epochs / warmup_epochs need updates_per_epoch (pass it to make_core, "
            "or use warmup_updates)",
        )
    if updates_per_epoch is not None and not updates_per_epoch > 0:
        raise ValueError(f"updates_per_epoch must be > 0, got {updates_per_epoch!r}")
    if sched.warmup_epochs > 0 and sched.warmup_updates > 0:
        raise ScenarioError("optimizer.schedule", "give warmup_epochs or warmup_updates, not both")
    # Decay after epoch e means from update ceil(e * updates_per_epoch) on (epoch = step /
    # updates_per_epoch >= e). Thresholds are integers computed here in float64, rounded
    # so that 0.1 * 30 is 3, so the traced comparison is exact integer arithmetic.
    thresholds = [
        math.ceil(round(e * updates_per_epoch, 9))
        for e in sched.decay_epochs  # type: ignore[operator]
    ]
    # factors[k] = decay_factor ** k, computed in float64 then rounded once to float32.
    factors = np.asarray(
        [sched.decay_factor**k for k in range(len(thresholds) + 1)], dtype=np.float32
    )
    if sched.warmup_updates > 0:
        warmup = float(sched.warmup_updates)
    else:
        warmup = sched.warmup_epochs * updates_per_epoch if sched.warmup_epochs > 0 else 0.0
    if not thresholds and warmup == 0.0:
        return None  # no schedule: skip the multiply entirely (cheaper, trivially exact)

    def factor(step):
        step = jnp.asarray(step)
        out = jnp.float32(1.0)
        if thresholds:
            passed = sum((step >= t).astype(jnp.int32) for t in thresholds)
            out = jnp.asarray(factors)[passed]
        if warmup > 0:
            ramp = (step.astype(jnp.float32) + 1.0) / jnp.float32(warmup)
            out = out * jnp.minimum(ramp, 1.0)
        return out

    return factor


def scheduled(schedule) -> Piece:
    """The chain's piece of a schedule (:func:`make_schedule`, not None): ``sched(step)``
    multiplies each gradient's rate (style caffe: the rates are inside the buffer) or the
    rate outside the buffer ``eta`` (style torch, optax transforms), where
    ``sched(step) = decay_factor ** #{e in decay_epochs : step / updates_per_epoch >= e}``
    times the warm-up ramp ``min((step + 1) / W, 1)``."""

    def update(u, state):
        if u.eta is not None:
            return u._replace(eta=schedule(u.step) * u.eta), state
        return u._replace(rates=schedule(u.step) * u.rates), state

    return Piece(no_state, update)
