"""Server optimizers from optax: ``[optimizer] transform = { name = "adam", b1 = 0.9 }``.

The parameter server can step any optax optimizer alias (``optax.adam``, ``optax.rmsprop``,
``optax.lamb``, ... -- :func:`transform_names` lists them) instead of asyncsim's SGD with
momentum. The update core (:mod:`asyncsim.numerics.core`) then ends its chain with
:func:`server_transform` in place of momentum and descent, and applies, at update ``t`` with
the ``c`` gradients ``g_l`` of staleness ``tau_l``,

    d = (1/c) sum_l s_l (g_l + wd_p theta),   s_l = rule(1, tau_l, <tau>),
    updates, opt_state = tx.update(d, opt_state, theta),   theta <- theta + updates,

where ``rule`` is the scenario's ``lr_rule`` taken as a per-gradient weight (at rate 1, as
under ``momentum.style = "torch"``), and ``tx`` is the alias at learning rate ``lr x
schedule(t)``. The rate is one of the alias's hyperparameters held in its state
(``optax.inject_hyperparams``), set before each update: so a decay schedule moves it and a
sweep can ``vmap`` over ``lr`` exactly as over SGD's rate. The transform's state lives in
``CoreState.opt_state``: checkpointed, resumed and replayed like the momentum buffers.

Options are checked against the alias's signature with the one-line errors of a delay
model's parameters; only numbers, booleans and strings are accepted (a TOML value never
becomes code), and the transform is built and stepped once on a two-element tree when the
scenario is checked, so an option optax refuses is reported then, not mid-run.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from asyncsim._checks import choice, finite, flag, is_finite, nonneg, positive, table, unit_interval
from asyncsim._registry import call_checked, check_options
from asyncsim.errors import ScenarioError
from asyncsim.numerics.chain import Piece

KEY = "optimizer.transform"
# Aliases that need more than gradients to step (L-BFGS: the loss, for its line search) or
# that draw noise from a key of their own (noisy_sgd: optax's fixed key, not the scenario's
# seed, and a typed key in its state that checkpoints cannot hold).
_NEEDS_MORE = ("lbfgs", "noisy_sgd")
# Options that optax takes as functions (a mask over the parameters): not from a file.
_CALLABLE_ONLY = ("mask", "weight_decay_mask")

# The aliases' common options with a range, and its check. Decay rates of
# moment estimates are in [0, 1) (b1 = 2 makes the moments grow without end); eps guards a
# division, so it is positive (>= 0 where the alias's own default is 0).
_RANGES = {"b1": unit_interval, "b2": unit_interval, "b3": unit_interval,
           "decay": unit_interval, "eps": positive,
           "eps_root": functools.partial(nonneg, finite=False)}

__all__ = ["make_transform", "server_transform", "transform_names", "transform_spec"]


@functools.cache
def _aliases() -> dict[str, Any]:
    import optax

    out = {}
    for name in dir(optax):
        fn = getattr(optax, name)
        if (inspect.isfunction(fn) and not name.startswith("_") and name not in _NEEDS_MORE
                and fn.__module__.startswith("optax._src.alias")
                and "learning_rate" in inspect.signature(fn).parameters):
            out[name] = fn
    return out


def transform_names() -> list[str]:
    """The optax optimizer aliases ``optimizer.transform.name`` accepts (those of
    ``optax`` that take a ``learning_rate`` and step on gradients alone), sorted."""
    return sorted(_aliases())


def transform_spec(spec: Mapping[str, Any], key: str = KEY) -> tuple[str, dict[str, Any]]:
    """``(alias name, its options)`` of a ``transform`` table, checked: a known alias, only
    its own keyword options (``learning_rate`` is asyncsim's ``lr`` x schedule), scalar
    values. Raises a one-line ScenarioError under ``key``."""
    table(key, spec, '{ name = "adam", ... }')
    name = spec.get("name")
    names = transform_names()
    if "name" not in spec:
        raise ScenarioError(f"{key}.name", f"missing: the optax optimizer to step the PS, one "
                            f"of: {', '.join(names)}")
    choice(f"{key}.name", name, names, what="optax optimizer")
    options = {k: v for k, v in spec.items() if k != "name"}
    if "learning_rate" in options:
        raise ScenarioError(f"{key}.learning_rate", "is set by asyncsim: optimizer.lr x "
                            "optimizer.schedule; give optimizer.lr instead")
    fn = _aliases()[name]
    params = inspect.signature(fn).parameters
    for k, v in options.items():
        ok = isinstance(v, bool | str) or (isinstance(v, int | float) and is_finite(v))
        if not ok:
            raise ScenarioError(f"{key}.{k}", f"must be a finite number, true or false, or a "
                                f"string, got {v!r}")
        if k in _CALLABLE_ONLY:
            raise ScenarioError(f"{key}.{k}", "takes a function in optax, which a scenario "
                                "file cannot give")
        d = params[k].default if k in params else None
        ann = str(params[k].annotation) if k in params else ""
        # optax's annotations admit arrays; the default says what the option is.
        if ((d is None and "float" in ann)
                or (isinstance(d, int | float) and not isinstance(d, bool))):
            finite(f"{key}.{k}", v)
        if isinstance(d, bool):
            flag(f"{key}.{k}", v)
        if k in _RANGES and isinstance(v, int | float) and not isinstance(v, bool):
            # eps = 0 where it is the alias's own default (lars)
            _RANGES["eps_root" if k == "eps" and d == 0 else k](f"{key}.{k}", v)
    kwargs = check_options(fn, options, key=key, what="optax optimizer", name=name,
                           exclude=("learning_rate",), also=("name",))
    return name, kwargs


def make_transform(spec: Mapping[str, Any], key: str = KEY):
    """The optax ``GradientTransformation`` a ``transform`` table names, its learning rate a
    hyperparameter in its state (``state.hyperparams["learning_rate"]``, float32), so the
    core sets it before each update. Checked (:func:`transform_spec`) and stepped once on a
    tiny tree: an option optax refuses is a one-line ScenarioError under ``key``."""
    name, kwargs = transform_spec(spec, key)
    return _built(name, tuple(sorted(kwargs.items())), key)


@functools.cache
def _built(name: str, kwargs: tuple[tuple[str, Any], ...], key: str):
    import optax

    fn = _aliases()[name]
    # Only the rate is injected (a float32 array in the state, set each update); every other
    # option stays the Python value optax.<name>(...) would see, so the arithmetic is the
    # alias's own (a float32 b1 would round 1 - b1 differently).
    static = tuple(n for n in inspect.signature(fn).parameters if n != "learning_rate")
    tx = call_checked(lambda **kw: optax.inject_hyperparams(
        fn, static_args=static, hyperparam_dtype=jnp.float32)(learning_rate=1.0, **kw),
        dict(kwargs), key=key, what="optax optimizer", name=name)
    tiny = {"w": jnp.ones((2,), jnp.float32)}
    try:
        jax.eval_shape(lambda p: tx.update(p, tx.init(p), p), tiny)
    except (TypeError, ValueError) as e:
        msg = " ".join(str(e).split())[:200]
        raise ScenarioError(key, f"optax refuses {name!r} with these options: {msg}") from None
    return tx


def with_learning_rate(opt_state, eta):
    """``opt_state`` (an ``InjectHyperparamsState``) with its learning rate set to ``eta``."""
    hp = dict(opt_state.hyperparams)
    hp["learning_rate"] = jnp.asarray(eta, hp["learning_rate"].dtype)
    return opt_state._replace(hyperparams=hp)


def server_transform(tx) -> Piece:
    """The chain's last step under ``optimizer.transform``: ``updates, opt_state =
    tx.update(d, opt_state, theta)`` at the rate ``eta = Update.eta`` (``lr x schedule``), then
    ``theta <- theta + updates`` in each parameter's dtype; ``d = Update.direction``, the
    softsync aggregate of the rule-weighted gradients. Owns ``CoreState.opt_state``."""
    import jax

    def init(params):
        return {"opt_state": tx.init(params)}

    def update(u, state):
        updates, opt_state = tx.update(u.direction, with_learning_rate(state.opt_state, u.eta),
                                       u.params)
        new = jax.tree_util.tree_map(lambda p, d: (p + d).astype(jnp.result_type(p)),
                                     u.params, updates)
        return u, state._replace(params=new, opt_state=opt_state)

    return Piece(init, update)
