"""The stability toolkit of P2: closed-form edges of delayed SGD (:mod:`.closed_form`),
edges measured by simulation (:mod:`.measured`), sharpness (:mod:`.sharpness`) and the
measurements a run stores for its figures (:mod:`.measure`).

``from asyncsim.stability import edge`` keeps working: the closed forms are re-exported here.
This package's ``__init__`` imports only numpy, so ``asyncsim stability`` prints its table
without loading JAX.
"""

from asyncsim.stability.closed_form import (
    MOMENTUM_KINDS,
    asymptote,
    char_poly,
    edge,
    edge_table,
    effective_edge,
    spectral_radius,
)


def lr_for_delay(eta0, tau, rule: str = "stability-edge"):
    """The rate learning-rate rule ``rule`` gives at constant delay ``tau`` (P2's
    η_τ = η0·sin(π/(4τ+2)) for ``stability-edge``; any registered rule): the one table of
    rules, :func:`asyncsim.numerics.lr_rules.rate_at_delay`."""
    # Imported here, not at the top: the rules are JAX functions, and the closed forms above
    # (the `asyncsim stability` table) should not pay JAX's ~1.5 s import.
    from asyncsim.numerics.lr_rules import rate_at_delay

    return rate_at_delay(rule, eta0, tau)


def closed_form_applies(optimizer) -> tuple[bool, str]:
    """Whether :func:`edge` predicts the stability edge of ``optimizer`` (an
    ``[optimizer]`` table or an ``OptimizerConfig``) at a constant delay, and why.

    * every lr rule: at constant delay τ it gives every gradient the rate ``rule(η0, τ)``,
      so the edge in ``η0·λ`` is ``edge(τ) / rule(1, τ)`` (:func:`lr_for_delay`);
    * every momentum kind and dampening: the closed forms of :mod:`.closed_form`;
    * ``dc-asgd`` and ``dc-asgd-a``: the plain edge is their *linear* stability edge at the
      minimum -- the correction ``λ g⊙g⊙Δθ`` (``λ0 g⊙g⊙Δθ / √ms``) is cubic (quadratic) in
      the distance from it, so it leaves the linearised dynamics; a run from a finite
      distance feels it (measured at τ = 4, 6,000 updates from w = 1: dc-asgd, λ = 0.04,
      0.3474 on the quadratic λ_h = 0.01 but 0.3538 on λ_h = 1; dc-asgd-a 0.3565 and
      0.3555; plain 0.3473);
    * ``gap-aware``: no -- it divides by ``1 + |Δθ|/C`` with ``C`` a running rms of the
      gradients (or of the steps), which shrinks with the distance from the minimum as
      ``Δθ`` does: the ratio does not vanish near it, and the dynamics are not linear;
    * an optax ``transform``: no (adaptive preconditioners are not linear), except
      ``sgd``, which is torch-style SGD: the plain edge, or with ``momentum`` the heavy-ball
      (``nesterov``: Nesterov) edge at that beta.

    The measured-edge tool measures any of them (:func:`asyncsim.stability.measured.
    find_edge` with ``optimizer=``).
    """
    from collections.abc import Mapping

    get = optimizer.get if isinstance(optimizer, Mapping) else (
        lambda k, d=None: getattr(optimizer, k, d))
    transform = get("transform")
    if transform is not None and transform.get("name") != "sgd":
        return False, (f"optax transform {transform.get('name')!r}: an adaptive update is "
                       "not linear, no closed form (measure it)")
    if transform is not None and transform.get("momentum"):
        kind = "nesterov" if transform.get("nesterov") else "heavy-ball"
        return True, (f"optax sgd with momentum: the {kind} edge at beta = "
                      f"{transform['momentum']} (torch style), divided by rule(1, τ)")
    comp = get("compensation")
    if comp is not None and comp.get("kind") == "gap-aware":
        return False, ("gap-aware divides by 1 + |Δθ|/C, C a running rms of the gradients: "
                       "not linear near the minimum; no closed form (measure it)")
    if comp is not None:
        return True, (f"{comp.get('kind')}: its correction is of higher order in the distance "
                      "from the minimum: the plain delayed edge is its linear-stability edge")
    return True, "constant rate rule(η0, τ) at constant delay: edge(τ) / rule(1, τ)"


__all__ = ["MOMENTUM_KINDS", "asymptote", "char_poly", "closed_form_applies", "edge",
           "edge_table", "effective_edge", "lr_for_delay", "spectral_radius"]
