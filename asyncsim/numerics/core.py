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

The numerics (:func:`make_core` states them exactly):

* per-gradient rate ``alpha_l = schedule(step) * rule(alpha0, tau_l, <tau>)`` where ``rule``
  is a registered learning-rate rule (:func:`register_lr_rule`), at each gradient's own
  staleness or at the protocol's nominal delay (P2's hand-set eta_tau);
* P1's n-softsync aggregation ``d = (1/c) sum_l alpha_l (g_l + wd_p * theta)`` with
  ``theta`` the current (fresh) master weights (P2's code also decays the master weights),
  on every parameter or on weights only (P2's ResNet);
* a momentum variant (none, heavy ball, dampened, Nesterov, or P2's shifted momentum with one
  buffer per learner), with PyTorch's dampening, in one of two styles: ``caffe`` (the rate
  inside the buffer, P1's framework; the default) or ``torch`` (PyTorch's SGD, which P2's
  official code steps: the rate outside, each buffer a copy of its first step).

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
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim.config import (
    MOMENTUM_KINDS,
    MOMENTUM_STYLES,
    NOMINAL_NEEDS,
    OptimizerConfig,
    check_momentum_kind,
    optimizer_choices,
)
from asyncsim.errors import ScenarioError
from asyncsim.numerics.compensation import make_compensation
from asyncsim.numerics.lr_rules import (  # noqa: F401  (re-exported: the core's rules)
    LrRule,
    available_lr_rules,
    get_lr_rule,
    make_lr_rule,
    register_lr_rule,
)
from asyncsim.numerics.schedule import make_schedule

PyTree = Any

__all__ = ["MOMENTUM_KINDS", "MOMENTUM_STYLES", "check_momentum_kind", "CoreState", "UpdateCore",
           "make_core", "register_lr_rule", "available_lr_rules", "get_lr_rule", "param_hash",
           "as_optax"]

class CoreState(NamedTuple):
    """The PS state between updates.

    Attributes:
        params: the master weights.
        momentum: ``()`` for kind ``"none"``; one buffer shaped like ``params`` for
            ``"heavy-ball"``, ``"dampened"`` and ``"nesterov"``; for ``"shifted"`` one buffer
            per learner, i.e. every leaf has a leading axis ``num_learners``. Under style
            ``"caffe"`` buffers hold rate-scaled steps (the rate is inside the momentum, P1's
            framework); under ``"torch"`` they hold gradients (PyTorch's ``momentum_buffer``).
        stale_sum: float32 scalar, the sum of the staleness of every gradient applied so far
            (for ``inverse-mean-staleness``).
        grad_count: float32 scalar, the number of gradients applied so far (padding excluded).
        hyper: float32 scalars ``{"lr", "beta", "weight_decay"}``. They live in the state,
            like ``optax.inject_hyperparams``, so a sweep can ``vmap`` over them.
        started: ``()`` except under style ``"torch"`` with a buffer: bool, whether the
            buffer has taken its first step (PyTorch starts a buffer as a copy of the first
            gradient) -- a scalar, or ``[num_learners]`` for ``"shifted"``.
        comp: an adaptive ``optimizer.compensation``'s statistics, else ``()``.
        opt_state: the ``optimizer.transform``'s optax state (its rate among its
            hyperparameters), else ``()``.
    """

    params: PyTree
    momentum: PyTree | tuple
    stale_sum: jax.Array
    grad_count: jax.Array
    hyper: dict[str, jax.Array]
    started: jax.Array | tuple = ()
    comp: PyTree | tuple = ()
    opt_state: PyTree | tuple = ()


class UpdateCore(NamedTuple):
    """The pure pair returned by :func:`make_core`.

    Attributes:
        init: ``init(params, *, lr=None, beta=None, weight_decay=None) -> CoreState``; ``None``
            takes the value from the :class:`~asyncsim.config.OptimizerConfig`.
        apply: ``apply(state, grads, *, staleness, learner_ids, step, mask=None,
            read_params=None) -> CoreState``; ``read_params`` (the parameters each gradient
            was computed on, leading axis c) is needed by ``optimizer.compensation`` only.
    """

    init: Callable[..., CoreState]
    apply: Callable[..., CoreState]


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


def _wd_multipliers(params: PyTree, mult: dict[str, float], scope: str = "all") -> PyTree:
    """A pytree of Python floats: the weight-decay multiplier of each leaf (longest prefix);
    0 for the leaves of rank < 2 under scope ``"weights"`` (biases, normalisation scales)."""

    def one(path, leaf):
        if scope == "weights" and jnp.ndim(leaf) < 2:
            return 0.0
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
    opt: OptimizerConfig, *, num_learners: int, updates_per_epoch: float | None = None,
    nominal_staleness: float | None = None,
) -> UpdateCore:
    """Build the PS update core for an optimizer configuration.

    Args:
        opt: learning rate alpha0, rule, momentum (kind, beta, style, dampening), weight
            decay (with per-prefix multipliers and a scope) and schedule.
        num_learners: lambda; the size of the leading axis of shifted momentum's buffers.
            ``learner_ids`` passed to ``apply`` must lie in ``[0, num_learners)``.
        updates_per_epoch: PS updates per epoch, needed only by epoch-based schedules.
        nominal_staleness: the protocol's nominal delay (``Protocol.nominal_staleness``),
            needed only by ``opt.lr_staleness = "nominal"``.

    Returns:
        An :class:`UpdateCore` ``(init, apply)``.

    Raises:
        ValueError (a :class:`~asyncsim.errors.ScenarioError` where a config key is at
        fault): unknown rule, momentum kind, style or scope, a dampening that does not fit
        the kind, epoch-based schedule without ``updates_per_epoch``, both warm-up settings
        given, ``"nominal"`` staleness without a nominal delay, ``num_learners < 1``.

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
    * ``read_params``: like ``grads``, the version each gradient was computed on (its
      slot's ``theta_read``); with ``opt.compensation`` each gradient is first rewritten
      from it (:mod:`asyncsim.numerics.compensation`), in slot order.

    1. Running mean staleness (companion paper 1509.04210): ``<tau> = (stale_sum + sum_l
       tau_l) / (grad_count + c)``, i.e. including this update's gradients.
    2. Rates: the rule sees each gradient's staleness tau_l and <tau> (``lr_staleness =
       "actual"``) or the protocol's nominal delay for both (``"nominal"``: a rate constant
       from the first update, as P2's official regimes set eta_tau by hand).
       ``sched(step) = decay_factor ** #{e in decay_epochs : step / updates_per_epoch >= e}``
       times the warm-up ramp ``min((step + 1) / W, 1)``.
    3. Weight decay ``wd_p = weight_decay * mult(p)`` on the fresh master weights theta; 0
       on the parameters of rank < 2 under ``weight_decay_scope = "weights"``.
    4. Momentum, beta = ``hyper["beta"]``, dampening ``dmp`` (``momentum.dampening``, 0 by
       default; beta for kind ``"dampened"``, its shorthand). P2 Sec. 4 for the delayed
       variants.

       Style ``"caffe"`` (the default; P1's framework): the rate is inside the buffer.
       ``alpha_l = sched(step) * rule(alpha0, tau_l, <tau>)``, P1 Sec. 3's n-softsync
       aggregate ``d = (1/c) sum_l alpha_l (g_l + wd_p theta)``, and

       - ``none``:       theta <- theta - d
       - ``heavy-ball``: m <- beta m + (1 - dmp) d;  theta <- theta - m
       - ``dampened``:   m <- beta m + (1 - beta) d; theta <- theta - m (dampened from the
         first step on)
       - ``nesterov``:   m <- beta m + (1 - dmp) d;  theta <- theta - (d + beta m)
       - ``shifted``:    per gradient l, in slot order, m_{k_l} <- beta m_{k_l} + (1 - dmp)
         d_l with ``d_l = (1/c) alpha_l (g_l + wd_p theta)``; then theta <- theta - sum_l
         m_{k_l} (each slot contributing its learner's buffer as it stood after that slot).
         With P2's round robin (N = tau + 1 workers, c = 1) this is P2's shifted momentum
         ``w_{t+1} = w_t - eta grad L(w_{t-tau}) + beta (w_{t-tau} - w_{t-tau-1})``.

       Style ``"torch"`` (PyTorch's ``torch.optim.SGD``, which P2's official code steps):
       the rate ``eta_t = sched(step) * alpha0`` is outside the buffer, each gradient is
       weighted by the rule at rate 1, ``s_l = rule(1, tau_l, <tau>)``, so ``g = (1/c) sum_l
       s_l (g_l + wd_p theta)`` (the mean gradient plus ``wd_p theta`` for the constant
       rule), and a buffer starts as a copy of its first step:

       - ``none``:       theta <- theta - eta_t g
       - ``heavy-ball`` / ``dampened``: m <- g on the buffer's first update, else
         m <- beta m + (1 - dmp) g; theta <- theta - eta_t m
       - ``nesterov``:   m as heavy ball; theta <- theta - eta_t (g + beta m)
       - ``shifted``:    per gradient l, in slot order, learner k_l's own buffer as heavy
         ball (each learner's buffer starts as a copy of its own first step, as the official
         MSGD server's per-worker buffers do); theta <- theta - eta_t sum_l m_{k_l}.

    With a constant rate and no dampening, the two styles are the same dynamics (m_caffe =
    eta m_torch): they differ in rounding, in the first step of a dampened buffer, and once
    the rate changes (a decay moves the whole buffer under caffe, only new steps under torch).

    5. ``opt.transform`` (an optax alias, momentum kind ``"none"``): the weights are the
       rule's at rate 1 as under torch, ``d = (1/c) sum_l s_l (g_l + wd_p theta)``, and
       ``theta <- theta + tx.update(d)`` with the alias at rate ``eta_t = sched(step) *
       alpha0`` (:mod:`asyncsim.numerics.transforms`).
    """
    # Why this is long: init and apply are closures over the one configuration (rule,
    # schedule, weight-decay multipliers, momentum kind and style), as optax builds its
    # transforms; the arithmetic of each momentum kind lives in _plain and _shifted.
    kind, style, staleness_from, scope, damp = optimizer_choices(opt)
    if num_learners < 1:
        raise ValueError(f"num_learners must be >= 1, got {num_learners!r}")
    if staleness_from == "nominal" and nominal_staleness is None:
        raise ScenarioError("optimizer.lr_staleness", NOMINAL_NEEDS)
    rule = make_lr_rule(opt.lr_rule)
    schedule = make_schedule(opt, updates_per_epoch)
    wd_mult = dict(opt.weight_decay_mult)
    torch_style = style == "torch"
    tx = None
    if opt.transform is not None:
        from asyncsim.numerics.transforms import make_transform, with_learning_rate

        tx = make_transform(opt.transform)
    comp = None if opt.compensation is None else make_compensation(opt.compensation)
    unit_rule = torch_style or tx is not None  # the rule is a weight; the rate is outside

    def init(params, *, lr=None, beta=None, weight_decay=None) -> CoreState:
        """The initial state: zero momentum, zero staleness statistics.

        Raises:
            ValueError: a ``weight_decay_mult`` prefix matches no parameter (likely a typo).
        """
        flat = jax.tree_util.tree_flatten_with_path(params)[0]
        # Under scope "weights" only the parameters of rank >= 2 take weight decay at all.
        paths = [_path_str(p) for p, leaf in flat if scope == "all" or jnp.ndim(leaf) >= 2]
        for prefix in wd_mult:
            if not any(_prefix_matches(prefix, p) for p in paths):
                what = ("matches no parameter" if scope == "all" else
                        "matches no parameter of rank >= 2 (weight_decay_scope = \"weights\")")
                raise ScenarioError(f"optimizer.weight_decay_mult.{prefix}",
                                    f"{what}; parameters: {', '.join(paths)}")
        started: jax.Array | tuple = ()
        if kind == "none":
            momentum: PyTree | tuple = ()
        elif kind == "shifted":
            momentum = jax.tree_util.tree_map(
                lambda p: jnp.zeros((num_learners, *jnp.shape(p)), jnp.result_type(p)), params
            )
            if torch_style:
                started = jnp.zeros((num_learners,), bool)
        else:
            momentum = jax.tree_util.tree_map(jnp.zeros_like, params)
            if torch_style:
                started = jnp.zeros((), bool)

        def f32(x, default):
            return jnp.asarray(default if x is None else x, jnp.float32)

        extra = {"comp": comp.init(params) if comp else (),
                 "opt_state": tx.init(params) if tx else ()}

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
            started=started,
            **extra,
        )

    def apply(state: CoreState, grads, *, staleness, learner_ids, step, mask=None,
              read_params=None) -> CoreState:
        """One PS update with the c gradients in ``grads`` (see :func:`make_core`)."""
        # Why this is long: the numbered steps of make_core's docstring, in that order, in one
        # traced function (masks, compensation, rates, weights, the kind's step, padding).
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
        if staleness_from == "nominal":
            tau = jnp.full((c,), nominal_staleness, jnp.float32)
            mean_tau = jnp.float32(nominal_staleness)

        hyper = state.hyper
        grads, comp_state = _compensated(comp, state, grads, valid, read_params)
        # caffe: the rule gives each gradient its rate; torch and transforms: its weight at
        # rate 1, the rate multiplying the buffer's (or the transform's) step.
        rule_lr = jnp.float32(1.0) if unit_rule else hyper["lr"]
        rates = jnp.broadcast_to(jnp.asarray(rule(rule_lr, tau, mean_tau), jnp.float32), (c,))
        eta = hyper["lr"] if unit_rule else None
        if schedule is not None:
            if unit_rule:
                eta = schedule(step) * eta
            else:
                rates = schedule(step) * rates
        # w_l = alpha_l / c. Without a mask c is static, and for c = 1 this is exact, which
        # makes one learner at tau = 0 bit-identical to optax.sgd.
        weights = rates / (c if valid is None else jnp.maximum(n_valid, 1.0))
        if valid is not None:
            weights = jnp.where(valid, weights, 0.0)

        params = state.params
        mult = _wd_multipliers(params, wd_mult, scope)
        wd = hyper["weight_decay"]
        beta = hyper["beta"]
        fresh = _Damp(beta if damp == "beta" else damp)

        opt_state = state.opt_state
        if tx is not None:
            d = _aggregate(params, grads, weights, mult, wd)
            updates, opt_state = tx.update(d, with_learning_rate(opt_state, eta), params)
            new_params = tm(lambda p, u: (p + u).astype(jnp.result_type(p)), params, updates)
            momentum, started = state.momentum, state.started
        elif kind == "shifted":
            new_params, momentum, started = _shifted(
                params, state.momentum, grads, weights, learner_ids, valid, mult, wd, beta,
                fresh, state.started, eta)
        else:
            new_params, momentum, started = _plain(
                kind, params, state.momentum, grads, weights, mult, wd, beta, fresh,
                state.started, eta)

        if comp is not None:  # gap-aware's step statistics
            comp_state = comp.after(comp_state, params, new_params)
        if valid is not None:
            # An all-padding update is a no-op (momentum must not decay on an empty update).
            any_valid = n_valid > 0
            new_params, momentum, started, opt_state, comp_state = tm(
                lambda n, o: jnp.where(any_valid, n, o), (new_params, momentum, started,
                                                          opt_state, comp_state),
                (params, state.momentum, state.started, state.opt_state, state.comp))

        return CoreState(params=new_params, momentum=momentum, stale_sum=stale_sum,
                         grad_count=grad_count, hyper=hyper, started=started, comp=comp_state,
                         opt_state=opt_state)

    return UpdateCore(init=init, apply=apply)


def _compensated(comp, state, grads, valid, read_params):
    """(gradients, compensation statistics) after ``opt.compensation`` (none: as given)."""
    if comp is None:
        return grads, state.comp
    if read_params is None:
        raise ValueError("optimizer.compensation needs read_params, the parameters each "
                         "gradient was computed on")
    grads, stats = comp.apply(state.comp, grads, state.params, read_params, valid)
    if valid is not None:  # a padding slot's rewritten value is dropped as before
        grads = jax.tree_util.tree_map(
            lambda g: jnp.where(_bcast(valid, g), g, jnp.zeros((), g.dtype)), grads)
    return grads, stats


class _Damp:
    """The fresh part of a buffer's step: x without dampening, (1 - d) x with it (d static
    or the traced beta). Without dampening the step is x itself, so the arithmetic, and
    every hash, is the one before dampening existed."""

    def __init__(self, d):
        self.d = d

    def __call__(self, x):
        return x if self.d is None else (1.0 - self.d) * x


def _bcast(v: jax.Array, like: jax.Array) -> jax.Array:
    """Reshape a ``[c]`` vector to broadcast against a ``[c, ...]`` leaf."""
    return v.reshape(v.shape + (1,) * (like.ndim - 1))


def _cast(x, p):
    return x.astype(jnp.result_type(p))


def _aggregate(params, grads, weights, mult, wd):
    """d = sum_l w_l g_l + (sum_l w_l) wd_p theta (weight decay on the fresh theta)."""
    tm = jax.tree_util.tree_map
    w_total = jnp.sum(weights)
    if weights.shape[0] == 1:
        # One gradient (async, fixed delay, lambda-softsync): the same value without a
        # reduction over a length-1 axis, which XLA's CPU backend materialises as a separate
        # pass over the parameters (measured ~25% of a small MLP step).
        return tm(lambda g, p, k: _cast(weights[0] * g[0] + (w_total * (wd * k)) * p, p),
                  grads, params, mult)
    return tm(lambda g, p, k: _cast(jnp.sum(_bcast(weights, g) * g, axis=0)
                                    + (w_total * (wd * k)) * p, p),
              grads, params, mult)


def _plain(kind, params, buffers, grads, weights, mult, wd, beta, fresh, started, eta):
    """Every momentum kind but shifted: one aggregate step d, then the kind's buffer.
    ``eta`` is None under style caffe (the rates are in ``weights``), the rate under torch."""
    tm = jax.tree_util.tree_map
    cast = _cast
    d = _aggregate(params, grads, weights, mult, wd)
    if kind == "none":
        momentum = ()
        step_ = d
    elif eta is not None:  # torch: the buffer starts as a copy of its first step
        momentum = tm(lambda m, x: cast(jnp.where(started, beta * m + fresh(x), x), m),
                      buffers, d)
        step_ = (tm(lambda x, m: cast(x + beta * m, m), d, momentum) if kind == "nesterov"
                 else momentum)
        started = jnp.ones((), bool)
    elif kind == "nesterov":
        momentum = tm(lambda m, x: cast(beta * m + fresh(x), m), buffers, d)
        step_ = tm(lambda x, m: cast(x + beta * m, m), d, momentum)
    else:  # heavy-ball, dampened
        momentum = tm(lambda m, x: cast(beta * m + fresh(x), m), buffers, d)
        step_ = momentum
    if eta is not None:
        return tm(lambda p, s: cast(p - eta * s, p), params, step_), momentum, started
    return tm(lambda p, s: cast(p - s, p), params, step_), momentum, started


def _shifted(params, buffers, grads, weights, learner_ids, valid, mult, wd, beta, fresh,
             started, eta):
    """P2's shifted momentum: one buffer per learner, gradients applied in slot order.

    Slots are processed sequentially so that a learner appearing twice in one update sees
    its own first gradient in its buffer before the second, exactly as two c-slot-weighted
    single updates would. Under style torch (``eta`` not None) each learner's buffer starts
    as a copy of its own first step, ``started`` [num_learners] saying which have.
    """
    tm = jax.tree_util.tree_map
    # The decay term wd_p * theta uses the fresh theta at the start of the update (P1/P2).
    decay = tm(lambda p, k: (wd * k) * p, params, mult)
    c = weights.shape[0]
    valid = jnp.ones((c,), bool) if valid is None else valid
    torch_style = eta is not None

    def slot(carry, xs):
        bufs, acc, on = carry
        w_l, k_l, ok, g_l = xs
        old = tm(lambda b: b[k_l], bufs)
        if torch_style:
            was = on[k_l]

            def step_of(b, x):
                return jnp.where(was, beta * b + fresh(x), x)

            on = on.at[k_l].set(was | ok)
        else:
            def step_of(b, x):
                return beta * b + fresh(x)

        new = tm(
            lambda b, g, dc: jnp.where(ok, step_of(b, w_l * (g + dc)).astype(b.dtype), b),
            old,
            g_l,
            decay,
        )
        bufs = tm(lambda b, n: b.at[k_l].set(n), bufs, new)
        acc = tm(lambda a, n: a + jnp.where(ok, n, jnp.zeros((), n.dtype)), acc, new)
        return (bufs, acc, on), None

    acc0 = tm(jnp.zeros_like, params)
    if c == 1:
        # No loop for plain async (the common case): same arithmetic as one scan step.
        (bufs, acc, started), _ = slot(
            (buffers, acc0, started),
            (weights[0], learner_ids[0], valid[0], tm(lambda g: g[0], grads)))
    else:
        (bufs, acc, started), _ = jax.lax.scan(
            slot, (buffers, acc0, started), (weights, learner_ids, valid, grads))
    if torch_style:
        new_params = tm(lambda p, a: (p - eta * a).astype(jnp.result_type(p)), params, acc)
    else:
        new_params = tm(lambda p, a: (p - a).astype(jnp.result_type(p)), params, acc)
    return new_params, bufs, started


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
