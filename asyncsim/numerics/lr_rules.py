"""Learning-rate rules: the one table of them, used by the update core, the stability
toolkit and the run measurements.

A rule is a pure JAX function ``rule(lr, staleness, mean_staleness) -> rates`` (see
:func:`register_lr_rule`); the core (:mod:`asyncsim.numerics.core`) multiplies its per-gradient
rates by the schedule. :func:`rate_at_delay` evaluates any registered rule (plug-ins included)
at a constant delay, in float64, which is what the stability analysis needs ("the rate a run
uses at delay τ": P2's η_τ for ``stability-edge``, α0/τ for ``inverse-staleness``).

Built-ins: ``constant`` (α0), ``inverse-staleness`` (P1's α0/τ, α0 at τ = 0),
``inverse-mean-staleness`` (α0/⟨τ⟩, Gupta et al. arXiv:1509.04210), ``stability-edge`` (P2's
η0·sin(π/(4τ+2)), docs/papers.md), and the staleness weights of federated and asynchronous
training: ``polynomial`` α0·(1+τ)^−a and ``hinge`` (FedAsync, Xie, Koyejo, Gupta 2019),
``exponential`` α0·e^−aτ, ``fedbuff`` α0/√(1+τ) (FedBuff, Nguyen et al. 2022, as FedScale
weights stale updates).

A rule may take parameters: keyword-only arguments after the three inputs, given in a
scenario as a table, ``lr_rule = { name = "polynomial", a = 0.5 }``, and checked against the
rule's signature with the one-line errors of a delay model's parameters
(:func:`make_lr_rule`). A string ``lr_rule`` is the rule with its defaults.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim import _checks
from asyncsim._registry import (
    PluginRegistry,
    call_checked,
    callable_value,
    check_options,
    signature_options,
)
from asyncsim.config import check_float32, rule_label, rule_spec  # noqa: F401  (re-exported)
from asyncsim.errors import ScenarioError

LrRule = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]

__all__ = ["LrRule", "available_lr_rules", "get_lr_rule", "make_lr_rule", "rate_at_delay",
           "register_lr_rule", "rule_label", "rule_spec"]

RULE_INPUTS = ("lr", "staleness", "mean_staleness")


_lr_rules: PluginRegistry[LrRule] = PluginRegistry(
    "asyncsim.lr_rules", "learning-rate rule", "optimizer.lr_rule",
    adapt=callable_value("a function rule(lr, staleness, mean_staleness)"))


def register_lr_rule(name: str, fn: LrRule | None = None, *, replace: bool = False):
    """Register a learning-rate rule under ``name`` (usable as ``optimizer.lr_rule``).

    A rule is a pure JAX function ``rule(lr, staleness, mean_staleness) -> rates``:

    Args (of the rule):
        lr: float32 scalar, the base rate alpha0 (``state.hyper["lr"]``, possibly traced).
        staleness: float32 ``[c]``, the staleness tau of each gradient of the update
            (padding slots included; their rates are discarded).
        mean_staleness: float32 scalar, the running mean staleness over all gradients
            applied so far including this update's.

    Returns (of the rule):
        float32 rates, ``[c]`` or a scalar (broadcast to ``[c]``). The schedule factor is
        applied on top by the core.

    Parameters (optional): keyword-only arguments after the three inputs, with defaults or
    without (then required), annotated ``float``/``int``/``bool`` -- a scenario gives them
    as ``lr_rule = { name = "mine", a = 0.5 }``, checked against this signature.

    Under ``optimizer.momentum.style = "torch"`` and with an ``optimizer.transform`` the core
    takes ``rule(1, staleness, mean_staleness)`` as each gradient's weight and applies ``lr``
    outside the momentum buffer or in the transform (PyTorch's form), so there a rule must be
    linear in ``lr``, ``rule(lr, ...) = lr * rule(1, ...)``, as every built-in rule is.

    Usable as a decorator (``@register_lr_rule("mine")``) or directly
    (``register_lr_rule("mine", fn)``). An installed package can instead expose the function
    under the entry-point group ``asyncsim.lr_rules`` (docs/plugins.md).

    Raises:
        ValueError: ``name`` is taken by another function and ``replace`` is false (the
            rule of every plug-in kind, :meth:`asyncsim._registry.PluginRegistry.register`).
    """
    deco = _lr_rules.decorator(name, replace=replace)
    return deco(fn) if fn is not None else deco


def available_lr_rules() -> list[str]:
    """The learning-rate rule names: built-ins, registered rules and entry points, sorted."""
    return _lr_rules.names()


def get_lr_rule(name: str) -> LrRule:
    """The rule registered as ``name`` (or installed under ``asyncsim.lr_rules``), with its
    parameters' defaults (see :func:`make_lr_rule` for a rule with parameters set).

    Raises:
        ScenarioError: (a ``ValueError``) naming ``optimizer.lr_rule`` and the allowed rules.
    """
    return _lr_rules.get(name)


def make_lr_rule(spec: str | Mapping[str, Any], key: str = "optimizer.lr_rule") -> LrRule:
    """The rule an ``lr_rule`` value names, its parameters checked against the rule's
    signature and bound: unknown, missing, wrong-typed or non-finite parameters are one-line
    ScenarioErrors under ``key.<parameter>`` (the checks of a delay model's parameters).
    A rule without parameters set is the registered function itself."""
    name, params = rule_spec(spec, key)
    fn = _lr_rules.get(name, key if isinstance(spec, str) else f"{key}.name")
    # The three inputs are the first three parameters, whatever a plug-in calls them.
    inputs = tuple(signature_options(fn)[0])[:len(RULE_INPUTS)]
    kwargs = check_options(fn, params, key=key, what=_lr_rules.what, name=name,
                           exclude=inputs, also=("name",))
    for k in _NONNEG.get(name, ()):
        if k in kwargs:
            _checks.nonneg(f"{key}.{k}", kwargs[k])
    for k, v in kwargs.items():  # the rules compute in float32, as the core does
        if isinstance(v, int | float) and not isinstance(v, bool):
            check_float32(f"{key}.{k}", v)
    # Keyed on the function, not the name: a rule registered again (replace=True, or in a
    # Ray worker) takes effect.
    rule = _bound(fn, tuple(sorted(kwargs.items())))
    _traced_once(rule, key, name)
    return rule


# What a rule is traced on once, before a run uses it: a float32 base rate, four gradients'
# staleness and the mean staleness, as the update core passes them (shapes only).
_PROBE = (jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.float32),
          jax.ShapeDtypeStruct((), jnp.float32))


@functools.cache
def _traced_once(rule: LrRule, key: str, name: str) -> None:
    """Trace ``rule`` on :data:`_PROBE` (``jax.eval_shape``: nothing is computed), so that
    what it refuses is refused before a run, as every plug-in kind's refusals are: a
    ``ValueError("<parameter>: ...")`` raised for a parameter's value is a one-line
    ScenarioError under ``key.<parameter>`` (:func:`asyncsim._registry.call_checked`), any
    other error of the rule's under ``key``; and rates that do not broadcast to one per
    gradient are refused under ``key``."""
    params = dict(getattr(rule, "keywords", {}))
    fn = getattr(rule, "func", rule)
    out = call_checked(lambda **kw: jax.eval_shape(functools.partial(fn, **kw), *_PROBE),
                       params, key=key, what=_lr_rules.what, name=name,
                       failure="{whose} cannot be traced (a rule is a JAX function of "
                               "traced arrays)")
    shape = getattr(out, "shape", None)
    try:
        fits = shape is not None and np.broadcast_shapes(shape, (4,)) == (4,)
    except ValueError:
        fits = False
    if not fits:
        raise ScenarioError(key, f"learning-rate rule {name!r} returned "
                            f"{shape if shape is not None else out!r} for the rates of 4 "
                            "gradients; a rule returns one rate per gradient, or one for all")


# Built-in parameters that must be >= 0 (a negative hinge slope divides by zero at some tau,
# a negative exponent makes staler gradients count more).
_NONNEG = {"polynomial": ("a",), "hinge": ("a", "b"), "exponential": ("a",)}


@functools.cache
def _bound(fn: LrRule, params: tuple[tuple[str, Any], ...]) -> LrRule:
    # One object per (rule, parameters): the summary-rate programs are cached by rule.
    return functools.partial(fn, **dict(params)) if params else fn


@register_lr_rule("constant")
def _constant(lr, staleness, mean_staleness):
    """alpha = alpha0 for every gradient (P1's baseline, P2's plain delayed SGD)."""
    del mean_staleness
    return jnp.broadcast_to(lr, staleness.shape)


@register_lr_rule("inverse-staleness")
def _inverse_staleness(lr, staleness, mean_staleness):
    """P1's staleness-dependent rate: alpha(tau) = alpha0/tau for tau > 0, alpha0 at tau = 0.

    ``max(tau, 1)`` gives both branches without a division by zero (tau is an integer).
    """
    del mean_staleness
    return lr / jnp.maximum(staleness, 1.0)


@register_lr_rule("inverse-mean-staleness")
def _inverse_mean_staleness(lr, staleness, mean_staleness):
    """The companion paper's (arXiv:1509.04210) alpha = alpha0 / <tau>, floored at <tau> = 1."""
    return jnp.broadcast_to(lr / jnp.maximum(mean_staleness, 1.0), staleness.shape)


@register_lr_rule("stability-edge")
def _stability_edge(lr, staleness, mean_staleness):
    """P2's eta_tau = eta0 sin(pi / (4 tau + 2)).

    Keeps the stability threshold eta * lambda_max < 2 sin(pi/(4 tau + 2)) of delayed SGD at
    the synchronous level 2 / eta0, i.e. the same set of reachable minima (P2, Sec. 3).
    Equals eta0 at tau = 0 and ~ eta0 * pi / (4 tau + 2) for large tau.
    """
    del mean_staleness
    return lr * jnp.sin(jnp.pi / (4.0 * staleness + 2.0))


@register_lr_rule("polynomial")
def _polynomial(lr, staleness, mean_staleness, *, a: float = 0.5):
    """FedAsync's polynomial staleness function s(τ) = (1 + τ)^−a (Xie, Koyejo, Gupta,
    "Asynchronous federated optimization", 2019, Sec. 5.2; a = 0.5 in its experiments, as
    FLSim's and Plato's polynomial weights): alpha = alpha0 (1 + tau)^-a."""
    del mean_staleness
    return lr * jnp.power(1.0 + staleness, -jnp.float32(a))


@register_lr_rule("hinge")
def _hinge(lr, staleness, mean_staleness, *, a: float = 10.0, b: float = 4.0):
    """FedAsync's hinge staleness function: 1 for τ <= b, else 1 / (a (τ - b) + 1) (Xie et
    al. 2019, Sec. 5.2; a = 10, b = 4 there)."""
    del mean_staleness
    return lr * jnp.where(staleness <= b, 1.0, 1.0 / (a * (staleness - b) + 1.0))


@register_lr_rule("exponential")
def _exponential(lr, staleness, mean_staleness, *, a: float):
    """alpha = alpha0 e^(-a tau) (an exponential staleness weight, as in FLSim's and Plato's
    families of staleness functions); ``a`` has no default in the literature: give it."""
    del mean_staleness
    return lr * jnp.exp(-jnp.float32(a) * staleness)


@register_lr_rule("fedbuff")
def _fedbuff(lr, staleness, mean_staleness):
    """FedBuff's staleness scaling 1/√(1 + τ) (Nguyen et al., "Federated learning with
    buffered asynchronous aggregation", AISTATS 2022; FedScale's async aggregation)."""
    del mean_staleness
    return lr / jnp.sqrt(1.0 + staleness)


def rate_at_delay(name: str | Mapping[str, Any], lr, tau):
    """The per-gradient rate the rule ``name`` (a name or an ``lr_rule`` table) gives every
    gradient of a run at constant delay ``tau`` (so the mean staleness is ``tau`` too),
    before any schedule: P2's η_τ for ``stability-edge``, ``lr/max(τ, 1)`` for
    ``inverse-staleness``.

    Evaluated in float64 (JAX's x64 mode, for this call only) on numpy inputs, broadcasting
    ``lr`` against ``tau``; returns a float for scalar inputs, else an array.
    """
    rule = make_lr_rule(name)
    lr64 = np.asarray(lr, np.float64)
    tau64 = np.asarray(tau, np.float64)
    if np.any(tau64 < 0):
        raise ValueError("tau must be non-negative")
    lr64, tau64 = np.broadcast_arrays(lr64, tau64)
    with _x64():
        out = np.asarray(_rate_program(rule)(lr64.ravel(), tau64.ravel()), np.float64)
    out = out.reshape(lr64.shape)
    return float(out) if out.ndim == 0 else out


@functools.cache
def _rate_program(rule: LrRule):
    """``rule`` at each (lr, tau) pair, one compiled program (not one per operation of the
    rule, as calling it op by op compiles)."""
    return jax.jit(jax.vmap(lambda a, t: jnp.reshape(rule(a, t[None], t), (-1,))[0]))


def _x64():
    """JAX's float64 mode as a context manager (``jax.enable_x64`` in current JAX,
    ``jax.experimental.enable_x64`` before it)."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # pragma: no cover - older JAX

    return enable_x64()
