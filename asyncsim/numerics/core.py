"""The update core: one pure JAX function pair shared by every driver.

The parameter server (PS) of every driver -- the online SimPy run, the trace replay and the
Ray run -- applies updates through the pair returned by :func:`make_core`, in the style of
optax's ``GradientTransformation`` (a pair of pure functions over pytrees, state in a
``NamedTuple``)::

    core = make_core(opt, num_learners=30, updates_per_epoch=12_500)
    state = core.init(params)
    step_fn = jax.jit(core.apply)
    state = step_fn(state, grads, staleness=tau, learner_ids=ids, step=version)

One call of ``apply`` is one PS update: it takes the ``c`` gradients the protocol grouped
into that update (``c = 1`` for plain async, ``c = floor(lambda / n)`` for n-softsync,
``c = lambda`` for hardsync) and returns the next state. Nothing inside reads a clock, a
global or a SimPy object, and nothing in it depends on Python values that change between
updates, so a jitted ``apply`` compiles once per shape.

The numerics (all rates sit *inside* the update, Caffe / P1 style):

* per-gradient rate ``alpha_l = schedule(step) * rule(alpha0, tau_l, <tau>)`` where ``rule``
  is a registered learning-rate rule (:func:`register_lr_rule`);
* P1's n-softsync aggregation ``d = (1/c) sum_l alpha_l (g_l + wd_p * theta)`` with
  ``theta`` the current (fresh) master weights (P2's code also decays the master weights);
* a momentum variant (none, heavy ball, dampened, Nesterov, or P2's shifted momentum with one
  buffer per learner).

References:
    P1: Zhang, Gupta, Lian, Liu, "Staleness-aware async-SGD for distributed deep learning",
    IJCAI 2016, arXiv:1511.05950.  Companion: Gupta, Zhang, Wang, "Model accuracy and
    runtime tradeoff in distributed deep learning", arXiv:1509.04210.
    P2: Giladi, Shpigel Nacson, Hoffer, Soudry, "At stability's edge: how to adjust
    hyperparameters to preserve minima selection in asynchronous training of neural
    networks?", ICLR 2020, arXiv:1909.12340.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim.config import MOMENTUM_KINDS, OptimizerConfig, check_momentum_kind
from asyncsim.errors import ScenarioError
from asyncsim.numerics.lr_rules import (  # noqa: F401  (re-exported: the core's rules)
    LrRule,
    available_lr_rules,
    get_lr_rule,
    register_lr_rule,
)

PyTree = Any

__all__ = [
    "MOMENTUM_KINDS",
    "check_momentum_kind",
    "CoreState",
    "UpdateCore",
    "MOMENTUM_KINDS",
    "make_core",
    "register_lr_rule",
    "available_lr_rules",
    "get_lr_rule",
    "param_hash",
    "as_optax",
]

class CoreState(NamedTuple):
    """The PS state between updates.

    Attributes:
        params: the master weights.
        momentum: ``()`` for kind ``"none"``; one buffer shaped like ``params`` for
            ``"heavy-ball"``, ``"dampened"`` and ``"nesterov"``; for ``"shifted"`` one buffer
            per learner, i.e. every leaf has a leading axis ``num_learners``. Buffers hold
            rate-scaled steps (the rate is inside the momentum, Caffe / P1 style).
        stale_sum: float32 scalar, the sum of the staleness of every gradient applied so far
            (for ``inverse-mean-staleness``).
        grad_count: float32 scalar, the number of gradients applied so far (padding excluded).
        hyper: float32 scalars ``{"lr", "beta", "weight_decay"}``. They live in the state,
            like ``optax.inject_hyperparams``, so a sweep can ``vmap`` over them.
    """

    params: PyTree
    momentum: PyTree | tuple
    stale_sum: jax.Array
    grad_count: jax.Array
    hyper: dict[str, jax.Array]


class UpdateCore(NamedTuple):
    """The pure pair returned by :func:`make_core`.

    Attributes:
        init: ``init(params, *, lr=None, beta=None, weight_decay=None) -> CoreState``; ``None``
            takes the value from the :class:`~asyncsim.config.OptimizerConfig`.
        apply: ``apply(state, grads, *, staleness, learner_ids, step, mask=None) -> CoreState``.
    """

    init: Callable[..., CoreState]
    apply: Callable[..., CoreState]


# ----------------------------------------------------------------------------- schedule
def _make_schedule(opt: OptimizerConfig, updates_per_epoch: float | None):
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


# ----------------------------------------------------------------------------- weight decay
def _path_str(path) -> str:
    parts = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            parts.append(k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            parts.append(str(k.key))
        else:  # pragma: no cover - exotic custom nodes
            parts.append(str(k))
    return "/".join(parts)


def _prefix_matches(prefix: str, path: str) -> bool:
    # Whole path components only: "fc" matches "fc/w" but not "fc2/w".
    prefix = prefix.strip("/")
    return prefix == "" or path == prefix or path.startswith(prefix + "/")


def _wd_multipliers(params: PyTree, mult: dict[str, float]) -> PyTree:
    """A pytree of Python floats: the weight-decay multiplier of each leaf (longest prefix)."""

    def one(path, _leaf):
        p = _path_str(path)
        best = max(
            (k for k in mult if _prefix_matches(k, p)),
            key=lambda k: len(k.strip("/")),
            default=None,
        )
        return 1.0 if best is None else float(mult[best])

    return jax.tree_util.tree_map_with_path(one, params)


# ----------------------------------------------------------------------------- the core
def make_core(
    opt: OptimizerConfig, *, num_learners: int, updates_per_epoch: float | None = None
) -> UpdateCore:
    """Build the PS update core for an optimizer configuration.

    Args:
        opt: learning rate alpha0, rule, momentum, weight decay (with per-prefix multipliers)
            and schedule.
        num_learners: lambda; the size of the leading axis of shifted momentum's buffers.
            ``learner_ids`` passed to ``apply`` must lie in ``[0, num_learners)``.
        updates_per_epoch: PS updates per epoch, needed only by epoch-based schedules.

    Returns:
        An :class:`UpdateCore` ``(init, apply)``.

    Raises:
        ValueError (a :class:`~asyncsim.errors.ScenarioError` where a config key is at
        fault): unknown rule or momentum kind, epoch-based schedule without
        ``updates_per_epoch``, both warm-up settings given, ``num_learners < 1``.

    The semantics of one ``apply(state, grads, *, staleness, learner_ids, step, mask)``:

    * ``grads``: a pytree like ``params`` whose leaves have a leading axis ``c`` -- the c
      gradients of this update, each a learner's mean mini-batch gradient Delta theta_l.
    * ``staleness``: int ``[c]``, tau_l = (PS version at apply) - (version read at pull).
    * ``learner_ids``: int ``[c]``, who computed each gradient (used by shifted momentum).
    * ``step``: the PS version at which the update is applied (0 for the first update);
      may be traced. It drives the schedule only.
    * ``mask``: bool ``[c]`` or None; False marks a padding slot that contributes nothing
      and is not counted in c. An update whose slots are all padding leaves params and
      momentum unchanged.

    1. Running mean staleness (companion paper 1509.04210): ``<tau> = (stale_sum + sum_l
       tau_l) / (grad_count + c)``, i.e. including this update's gradients.
    2. Rates: ``alpha_l = schedule(step) * rule(alpha0, tau_l, <tau>)``; schedule(step) =
       ``decay_factor ** #{e in decay_epochs : step / updates_per_epoch >= e}`` times the
       warm-up ramp ``min((step + 1) / W, 1)``.
    3. Aggregation, P1 Sec. 3 (n-softsync): ``d = (1/c) sum_l alpha_l (g_l + wd_p theta)``
       with theta the fresh master weights and ``wd_p = weight_decay * mult(p)``.
    4. Momentum, beta = ``hyper["beta"]`` (P2 Sec. 4 for the delayed variants):

       - ``none``:       theta <- theta - d
       - ``heavy-ball``: m <- beta m + d;           theta <- theta - m
       - ``dampened``:   m <- beta m + (1 - beta) d; theta <- theta - m  (PyTorch's
         dampening=beta from the first step on; PyTorch copies the first gradient)
       - ``nesterov``:   m <- beta m + d;           theta <- theta - (d + beta m)
       - ``shifted``:    per gradient l, in slot order, m_{k_l} <- beta m_{k_l} + d_l with
         ``d_l = (1/c) alpha_l (g_l + wd_p theta)``; then theta <- theta - sum_l m_{k_l}
         (each slot contributing its learner's buffer as it stood after that slot). With
         P2's round robin (N = tau + 1 workers, c = 1) this is P2's shifted momentum
         ``w_{t+1} = w_t - eta grad L(w_{t-tau}) + beta (w_{t-tau} - w_{t-tau-1})``.

    With a constant rate, rate-inside heavy ball equals PyTorch's/optax's rate-outside form.
    """
    # Why this is long: init and apply are closures over the one configuration (rule,
    # schedule, weight-decay multipliers, momentum kind), as optax builds its transforms;
    # the arithmetic of each momentum kind lives in _plain and _shifted.
    kind = check_momentum_kind(opt.momentum.kind)
    if num_learners < 1:
        raise ValueError(f"num_learners must be >= 1, got {num_learners!r}")
    rule = get_lr_rule(opt.lr_rule)
    schedule = _make_schedule(opt, updates_per_epoch)
    wd_mult = dict(opt.weight_decay_mult)

    def init(params, *, lr=None, beta=None, weight_decay=None) -> CoreState:
        """The initial state: zero momentum, zero staleness statistics.

        Raises:
            ValueError: a ``weight_decay_mult`` prefix matches no parameter (likely a typo).
        """
        paths = [_path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
        for prefix in wd_mult:
            if not any(_prefix_matches(prefix, p) for p in paths):
                raise ScenarioError(
                    f"optimizer.weight_decay_mult.{prefix}",
                    f"matches no parameter; parameters: {', '.join(paths)}",
                )
        if kind == "none":
            momentum: PyTree | tuple = ()
        elif kind == "shifted":
            momentum = jax.tree_util.tree_map(
                lambda p: jnp.zeros((num_learners, *jnp.shape(p)), jnp.result_type(p)), params
            )
        else:
            momentum = jax.tree_util.tree_map(jnp.zeros_like, params)

        def f32(x, default):
            return jnp.asarray(default if x is None else x, jnp.float32)

        return CoreState(
            params=params,
            momentum=momentum,
            stale_sum=jnp.zeros((), jnp.float32),
            grad_count=jnp.zeros((), jnp.float32),
            hyper={
                "lr": f32(lr, opt.lr),
                "beta": f32(beta, opt.momentum.beta),
                "weight_decay": f32(weight_decay, opt.weight_decay),
            },
        )

    def apply(state: CoreState, grads, *, staleness, learner_ids, step, mask=None) -> CoreState:
        """One PS update with the c gradients in ``grads`` (see :func:`make_core`)."""
        tm = jax.tree_util.tree_map
        leaves = jax.tree_util.tree_leaves(grads)
        c = leaves[0].shape[0]
        staleness = jnp.asarray(staleness, jnp.int32)
        learner_ids = jnp.asarray(learner_ids, jnp.int32)
        if staleness.shape != (c,) or learner_ids.shape != (c,):
            raise ValueError(
                f"staleness {staleness.shape} and learner_ids {learner_ids.shape} must have "
                f"shape ({c},), the leading axis of grads"
            )
        tau = staleness.astype(jnp.float32)
        if mask is None:
            valid = None
            n_valid = jnp.float32(c)
            tau_sum = jnp.sum(tau)
        else:
            valid = jnp.asarray(mask, bool)
            if valid.shape != (c,):
                raise ValueError(f"mask {valid.shape} must have shape ({c},)")
            n_valid = jnp.sum(valid, dtype=jnp.float32)
            tau_sum = jnp.sum(jnp.where(valid, tau, 0.0))
            # Padding slots may hold anything (even NaN): zero them, 0 * NaN is NaN.
            grads = tm(lambda g: jnp.where(_bcast(valid, g), g, jnp.zeros((), g.dtype)), grads)

        stale_sum = state.stale_sum + tau_sum
        grad_count = state.grad_count + n_valid
        mean_tau = stale_sum / jnp.maximum(grad_count, 1.0)

        hyper = state.hyper
        rates = jnp.broadcast_to(jnp.asarray(rule(hyper["lr"], tau, mean_tau), jnp.float32), (c,))
        if schedule is not None:
            rates = schedule(step) * rates
        # w_l = alpha_l / c. Without a mask c is static, and for c = 1 this is exact, which
        # makes one learner at tau = 0 bit-identical to optax.sgd.
        weights = rates / (c if valid is None else jnp.maximum(n_valid, 1.0))
        if valid is not None:
            weights = jnp.where(valid, weights, 0.0)

        params = state.params
        mult = _wd_multipliers(params, wd_mult)
        wd = hyper["weight_decay"]
        beta = hyper["beta"]

        if kind == "shifted":
            new_params, momentum = _shifted(
                params, state.momentum, grads, weights, learner_ids, valid, mult, wd, beta
            )
        else:
            new_params, momentum = _plain(kind, params, state.momentum, grads, weights, mult,
                                          wd, beta)

        if valid is not None:
            # An all-padding update is a no-op (momentum must not decay on an empty update).
            any_valid = n_valid > 0
            new_params = tm(lambda n, o: jnp.where(any_valid, n, o), new_params, params)
            momentum = tm(lambda n, o: jnp.where(any_valid, n, o), momentum, state.momentum)

        return CoreState(
            params=new_params,
            momentum=momentum,
            stale_sum=stale_sum,
            grad_count=grad_count,
            hyper=hyper,
        )

    return UpdateCore(init=init, apply=apply)


def _bcast(v: jax.Array, like: jax.Array) -> jax.Array:
    """Reshape a ``[c]`` vector to broadcast against a ``[c, ...]`` leaf."""
    return v.reshape(v.shape + (1,) * (like.ndim - 1))


def _cast(x, p):
    return x.astype(jnp.result_type(p))


def _plain(kind, params, buffers, grads, weights, mult, wd, beta):
    """Every momentum kind but shifted: one aggregate step d, then the kind's buffer."""
    tm = jax.tree_util.tree_map
    cast = _cast
    c = weights.shape[0]
    # d = sum_l w_l g_l + (sum_l w_l) wd_p theta  (weight decay on the fresh theta)
    w_total = jnp.sum(weights)
    if c == 1:
        # One gradient (async, fixed delay, lambda-softsync): the same value without a
        # reduction over a length-1 axis, which XLA's CPU backend materialises as a separate
        # pass over the parameters (measured ~25% of a small MLP step).
        d = tm(lambda g, p, k: cast(weights[0] * g[0] + (w_total * (wd * k)) * p, p),
               grads, params, mult)
    else:
        d = tm(lambda g, p, k: cast(jnp.sum(_bcast(weights, g) * g, axis=0)
                                    + (w_total * (wd * k)) * p, p),
               grads, params, mult)
    if kind == "none":
        momentum = ()
        step_ = d
    elif kind == "heavy-ball":
        momentum = tm(lambda m, x: cast(beta * m + x, m), buffers, d)
        step_ = momentum
    elif kind == "dampened":
        momentum = tm(lambda m, x: cast(beta * m + (1.0 - beta) * x, m), buffers, d)
        step_ = momentum
    else:  # nesterov
        momentum = tm(lambda m, x: cast(beta * m + x, m), buffers, d)
        step_ = tm(lambda x, m: cast(x + beta * m, m), d, momentum)
    return tm(lambda p, s: cast(p - s, p), params, step_), momentum


def _shifted(params, buffers, grads, weights, learner_ids, valid, mult, wd, beta):
    """P2's shifted momentum: one buffer per learner, gradients applied in slot order.

    Slots are processed sequentially so that a learner appearing twice in one update sees
    its own first gradient in its buffer before the second, exactly as two c-slot-weighted
    single updates would.
    """
    tm = jax.tree_util.tree_map
    # The decay term wd_p * theta uses the fresh theta at the start of the update (P1/P2).
    decay = tm(lambda p, k: (wd * k) * p, params, mult)
    c = weights.shape[0]
    valid = jnp.ones((c,), bool) if valid is None else valid

    def slot(carry, xs):
        bufs, acc = carry
        w_l, k_l, ok, g_l = xs
        old = tm(lambda b: b[k_l], bufs)
        new = tm(
            lambda b, g, dc: jnp.where(ok, (beta * b + w_l * (g + dc)).astype(b.dtype), b),
            old,
            g_l,
            decay,
        )
        bufs = tm(lambda b, n: b.at[k_l].set(n), bufs, new)
        acc = tm(lambda a, n: a + jnp.where(ok, n, jnp.zeros((), n.dtype)), acc, new)
        return (bufs, acc), None

    acc0 = tm(jnp.zeros_like, params)
    if c == 1:
        # No loop for plain async (the common case): same arithmetic as one scan step.
        (bufs, acc), _ = slot(
            (buffers, acc0), (weights[0], learner_ids[0], valid[0], tm(lambda g: g[0], grads))
        )
    else:
        (bufs, acc), _ = jax.lax.scan(slot, (buffers, acc0), (weights, learner_ids, valid, grads))
    new_params = tm(lambda p, a: (p - a).astype(jnp.result_type(p)), params, acc)
    return new_params, bufs


# ----------------------------------------------------------------------------- helpers
def param_hash(params: PyTree) -> str:
    """A deterministic fingerprint of a pytree of arrays (e.g. for ``summary.json``).

    SHA-256 over, for each leaf in tree order: its dtype name, its shape and its bytes in C
    order. Equal values of the same dtypes and shapes give equal hashes on any platform of
    the same endianness; a one-ulp change in any element changes the hash.
    """
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(params):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def as_optax(core: UpdateCore):
    """Wrap ``core`` as an ``optax.GradientTransformation`` for the c = 1, tau = 0 case.

    ``update(grads, state, params)`` applies one fresh gradient from learner 0 at step
    ``state.grad_count`` and returns ``new_params - params`` as the updates, so
    ``optax.apply_updates`` reproduces the core's parameters up to rounding. Requires
    ``params`` (the master weights may have been changed outside the core).
    """
    import optax

    def init_fn(params):
        return core.init(params)

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("as_optax(core).update needs params")
        state = state._replace(params=params)
        step = state.grad_count.astype(jnp.int32)
        new = core.apply(
            state,
            jax.tree_util.tree_map(lambda g: g[None], updates),
            staleness=jnp.zeros((1,), jnp.int32),
            learner_ids=jnp.zeros((1,), jnp.int32),
            step=step,
        )
        deltas = jax.tree_util.tree_map(lambda n, p: n - p, new.params, params)
        return deltas, new

    return optax.GradientTransformation(init_fn, update_fn)
