"""The stability toolkit of P2: closed-form edges of delayed SGD (:mod:`.closed_form`),
edges measured by simulation (:mod:`.measured`), sharpness (:mod:`.sharpness`) and the
measurements a run stores for its figures (:mod:`.measure`).

``from asyncsim.stability import edge`` keeps working: the closed forms are re-exported here.
This package's ``__init__`` imports only numpy, so ``asyncsim stability`` prints its table
without loading JAX.
"""

from asyncsim._moved import deprecated_names
from asyncsim.stability.closed_form import (
    MOMENTUM_KINDS,
    asymptote,
    char_poly,
    edge,
    edge_table,
    effective_edge,
    spectral_radius,
)

# 0.1's fixed tuple of rule names: the registry lists them now (``available_lr_rules``).
deprecated_names(__name__, globals(), {
    "LR_RULES": ("asyncsim._compat:LR_RULES", "asyncsim.numerics.lr_rules.available_lr_rules()")})


def lr_for_delay(eta0, tau, rule: str = "stability-edge"):
    """The rate learning-rate rule ``rule`` gives at constant delay ``tau`` (P2's
    η_τ = η0·sin(π/(4τ+2)) for ``stability-edge``; any registered rule): the one table of
    rules, :func:`asyncsim.numerics.lr_rules.rate_at_delay`."""
    # Imported here, not at the top: the rules are JAX functions, and the closed forms above
    # (the `asyncsim stability` table) should not pay JAX's ~1.5 s import.
    from asyncsim.numerics.lr_rules import rate_at_delay

    return rate_at_delay(rule, eta0, tau)


__all__ = ["MOMENTUM_KINDS", "asymptote", "char_poly", "edge", "edge_table",
           "effective_edge", "lr_for_delay", "spectral_radius"]
