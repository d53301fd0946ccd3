"""Per-gradient rates: the staleness the lr rule sees, and the rule itself (pieces of the
update core's chain, :mod:`asyncsim.numerics.chain`).

* :func:`running_mean_staleness` -- the running mean staleness of the companion paper
  (Gupta, Zhang, Wang, arXiv:1509.04210), over every gradient applied so far;
* :func:`nominal_staleness` -- the protocol's nominal delay in place of each gradient's own
  (``optimizer.lr_staleness = "nominal"``, as P2's official regimes set eta_tau by hand);
* :func:`rule_rates` -- the registered lr rule (:mod:`asyncsim.numerics.lr_rules`) at each
  gradient's staleness: its rate (style caffe) or its weight at rate 1, the rate outside
  (style torch, optax transforms).

The schedule (:mod:`asyncsim.numerics.schedule`) then scales the rates or the outer rate, and
the softsync mean (:mod:`asyncsim.numerics.aggregation`) divides them by c.
"""

from __future__ import annotations

import jax.numpy as jnp

from asyncsim.numerics.chain import Piece, no_state
from asyncsim.numerics.lr_rules import LrRule

__all__ = ["nominal_staleness", "rule_rates", "running_mean_staleness"]


def running_mean_staleness() -> Piece:
    """The mean staleness ``<tau>`` the lr rule sees (1509.04210's running mean staleness):

        <tau> = (stale_sum + sum_l tau_l) / max(grad_count + c, 1)

    over every gradient applied so far, this update's valid ones included. Owns
    ``CoreState.stale_sum`` and ``grad_count`` (float32; padding slots count for nothing).
    """

    def init(params):
        return {"stale_sum": jnp.zeros((), jnp.float32),
                "grad_count": jnp.zeros((), jnp.float32)}

    def update(u, state):
        stale_sum = state.stale_sum + u.tau_sum
        grad_count = state.grad_count + u.n_valid
        mean_tau = stale_sum / jnp.maximum(grad_count, 1.0)
        return (u._replace(mean_tau=mean_tau),
                state._replace(stale_sum=stale_sum, grad_count=grad_count))

    return Piece(init, update)


def nominal_staleness(tau0: float) -> Piece:
    """The rule sees the protocol's nominal delay ``tau0`` (``Protocol.nominal_staleness``)
    for every gradient and as the mean: a rate constant from the first update, as P2's
    official regimes set eta_tau for a fixed delay. The running statistics are still kept."""

    def update(u, state):
        return (u._replace(tau=jnp.full((u.c,), tau0, jnp.float32),
                           mean_tau=jnp.float32(tau0)), state)

    return Piece(no_state, update)


def rule_rates(rule: LrRule, *, rate_outside: bool) -> Piece:
    """Each gradient's rate from the lr rule, ``rule(lr, tau_l, <tau>)`` with ``lr =
    hyper["lr"]`` (alpha0; P1 Sec. 3: ``alpha_l = alpha0 / tau_l`` for inverse-staleness).

    With ``rate_outside`` (style torch, an optax transform) the rule gives a weight at rate
    1, ``s_l = rule(1, tau_l, <tau>)``, and the rate ``eta = hyper["lr"]`` multiplies the
    buffer's (or the transform's) step instead (``Update.eta``; None otherwise).
    """

    def update(u, state):
        lr = state.hyper["lr"]
        rule_lr = jnp.float32(1.0) if rate_outside else lr
        rates = jnp.broadcast_to(jnp.asarray(rule(rule_lr, u.tau, u.mean_tau), jnp.float32),
                                 (u.c,))
        return u._replace(rates=rates, eta=lr if rate_outside else None), state

    return Piece(no_state, update)
