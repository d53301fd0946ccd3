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

``make_core`` assembles ``apply`` as a chain of small pure pieces (:mod:`asyncsim.numerics.chain`),
the way optax builds ``adam`` as ``chain(scale_by_adam(), scale_by_learning_rate())``; each
piece's docstring states its contract and its source. In order (:func:`core_pieces`):

1. :func:`~asyncsim.numerics.chain.read_slots` -- the c slots: staleness, learner ids,
   padding (``mask``) zeroed and not counted.
2. :func:`~asyncsim.numerics.weights.running_mean_staleness` -- ``<tau>`` (1509.04210), and
   with ``lr_staleness = "nominal"`` :func:`~asyncsim.numerics.weights.nominal_staleness`
   (the protocol's nominal delay, P2's hand-set eta_tau).
3. :func:`~asyncsim.numerics.compensation.compensated` -- ``optimizer.compensation``
   (dc-asgd, dc-asgd-a, gap-aware) rewrites each gradient from the version it was read at.
4. :func:`~asyncsim.numerics.weights.rule_rates` -- the lr rule (:func:`register_lr_rule`)
   at each gradient's staleness: ``alpha_l = rule(alpha0, tau_l, <tau>)`` (style caffe), or
   a weight at rate 1 with the rate outside (style torch, optax transforms).
5. :func:`~asyncsim.numerics.schedule.scheduled` -- decays at epochs and warm-up.
6. :func:`~asyncsim.numerics.aggregation.softsync_weights` -- ``w_l = alpha_l / c``.
7. :func:`~asyncsim.numerics.weight_decay.weight_decay` -- ``wd_p`` of each parameter (scope
   and per-prefix multipliers), on the fresh master weights.
8. the step: :func:`~asyncsim.numerics.aggregation.aggregate` (P1 Sec. 3's n-softsync mean
   ``d = sum_l w_l (g_l + wd_p theta)``), then :func:`~asyncsim.numerics.momentum.buffer_momentum`
   (heavy ball, dampened, Nesterov; caffe or torch) and
   :func:`~asyncsim.numerics.momentum.descend`; or P2's per-learner
   :func:`~asyncsim.numerics.momentum.shifted_momentum` and ``descend``; or, with
   ``optimizer.transform``, the aggregate and :func:`~asyncsim.numerics.transforms.server_transform`
   (an optax alias).
9. :func:`~asyncsim.numerics.compensation.step_statistics` -- the compensation's statistics
   of the step taken; and, around the whole chain,
   :func:`~asyncsim.numerics.chain.unless_all_padding`.

Adding a remedy is one new piece in one file: a function returning a
:class:`~asyncsim.numerics.chain.Piece` ``(init, update)`` in the module of its concept (a new
delay compensation is a new entry of :data:`asyncsim.numerics.compensation.KINDS` and its
function there; a new per-gradient rate is an lr rule, :func:`register_lr_rule`, with no
change here), and the one line of :func:`core_pieces` that puts it in the chain where its
equation says. A piece keeps the arithmetic of its step in its order: the chain is the
order of the float32 operations, and every parameter hash depends on it.

References:
    P1: Zhang, Gupta, Lian, Liu, "Staleness-aware async-SGD for distributed deep learning",
    IJCAI 2016, arXiv:1511.05950.  Companion: Gupta, Zhang, Wang, "Model accuracy and
    runtime tradeoff in distributed deep learning", arXiv:1509.04210.
    P2: Giladi, Shpigel Nacson, Hoffer, Soudry, "At stability's edge: how to adjust
    hyperparameters to preserve minima selection in asynchronous training of neural
    networks?", ICLR 2020, arXiv:1909.12340.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from asyncsim._io import array_hash
from asyncsim.config import (
    MOMENTUM_KINDS,
    MOMENTUM_STYLES,
    NOMINAL_NEEDS,
    OptimizerConfig,
    check_momentum_kind,
    optimizer_choices,
)
from asyncsim.errors import ScenarioError
from asyncsim.numerics.aggregation import aggregate, softsync_weights
from asyncsim.numerics.chain import Piece, chain, read_slots, unless_all_padding
from asyncsim.numerics.compensation import compensated, make_compensation, step_statistics
from asyncsim.numerics.lr_rules import (  # noqa: F401  (re-exported: the core's rules)
    LrRule,
    available_lr_rules,
    get_lr_rule,
    make_lr_rule,
    register_lr_rule,
)
from asyncsim.numerics.momentum import buffer_momentum, descend, shifted_momentum
from asyncsim.numerics.schedule import make_schedule, scheduled
from asyncsim.numerics.transforms import make_transform, server_transform
from asyncsim.numerics.weight_decay import weight_decay
from asyncsim.numerics.weights import nominal_staleness as nominal_delay
from asyncsim.numerics.weights import rule_rates, running_mean_staleness

PyTree = Any

# Raised whenever the core's numbers for an unchanged scenario change (recorded in every
# run's summary.json; a sweep reruns a complete point made under another revision).
# 2: the n-softsync sum over an update's slots is explicitly in order, step by step
# (aggregation.weighted_sum, a scan then; see 5); revision 1 left the order to XLA's
# fusion, which rounded a few elements of a leaf differently (1 ulp) wherever c > 1.
# 3: shifted momentum's step adds each learner's buffer row as stored
# (momentum.shifted_momentum); with one gradient an update XLA had recomputed the row inside
# the parameter update, rounding a few elements differently.
# 4: delay compensation rewrites an update's gradients in an unrolled loop over its slots,
# each slot's result materialised (compensation.make_compensation), not a lax.scan: XLA
# fuses the rewrite with the rest of the update differently, rounding differently wherever
# c > 1.
# 5: the n-softsync sum is an unrolled loop (aggregation.weighted_sum), the scan's numbers
# bit for bit, but an optax transform taking it (Adam) rounds a few elements differently
# from its second update on wherever c > 1; every other run keeps its bits.
NUMERICS_REVISION = 5

__all__ = ["NUMERICS_REVISION", "MOMENTUM_KINDS", "MOMENTUM_STYLES", "check_momentum_kind",
           "CoreState", "UpdateCore", "make_core", "core_pieces", "register_lr_rule",
           "available_lr_rules", "get_lr_rule", "param_hash", "as_optax"]

class CoreState(NamedTuple):
    """The PS state between updates. Each field but ``hyper`` is owned by the piece of the
    chain that writes it (``params``: the descent or the server transform).

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


# ----------------------------------------------------------------------------- the core
def make_core(
    opt: OptimizerConfig, *, num_learners: int, updates_per_epoch: float | None = None,
    nominal_staleness: float | None = None,
) -> UpdateCore:
    """Build the PS update core for an optimizer configuration: the chain of
    :func:`core_pieces`, with the all-padding guard, as an ``(init, apply)`` pair.

    ``apply(state, grads, *, staleness, learner_ids, step, mask=None, read_params=None)`` is
    one PS update:

    * ``grads``: a pytree like ``params`` whose leaves have a leading axis ``c`` -- the
      c gradients of this update, each a learner's mean mini-batch gradient.
    * ``staleness``: int ``[c]``, tau_l = (PS version at apply) - (version read at pull).
    * ``learner_ids``: int ``[c]``, who computed each gradient (shifted momentum).
    * ``step``: the PS version at which the update is applied (0 for the first); may be
      traced. It drives the schedule only.
    * ``mask``: bool ``[c]`` or None; False marks a padding slot that contributes nothing
      and is not counted in c. An update whose slots are all padding leaves params and
      momentum unchanged.
    * ``read_params``: like ``grads``, the version each gradient was computed on; needed by
      ``opt.compensation`` only.

    Args:
        opt: learning rate alpha0, rule, momentum (kind, beta, style, dampening), weight
            decay (with per-prefix multipliers and a scope), schedule, transform and
            compensation.
        num_learners: lambda; the size of the leading axis of shifted momentum's buffers.
            ``learner_ids`` passed to ``apply`` must lie in ``[0, num_learners)``.
        updates_per_epoch: PS updates per epoch, needed only by epoch-based schedules.
        nominal_staleness: the protocol's nominal delay (``Protocol.nominal_staleness``),
            needed only by ``opt.lr_staleness = "nominal"``.

    Returns:
        An :class:`UpdateCore` ``(init, apply)``, ``apply`` as above.

    Raises:
        ValueError: unknown rule, momentum kind, style or scope, a dampening that does not
            fit the kind, epoch-based schedule without ``updates_per_epoch``, both warm-up
            settings given, ``"nominal"`` staleness without a nominal delay,
            ``num_learners < 1`` (a :class:`~asyncsim.errors.ScenarioError`, which is a
            ValueError, where a config key is at fault).
    """
    steps = unless_all_padding(chain(*core_pieces(
        opt, num_learners=num_learners, updates_per_epoch=updates_per_epoch,
        nominal_staleness=nominal_staleness)))

    def init(params, *, lr=None, beta=None, weight_decay=None) -> CoreState:
        """The initial state: zero momentum, zero staleness statistics; ``None`` takes the
        hyperparameter from ``opt``.

        Raises:
            ValueError: a ``weight_decay_mult`` prefix matches no parameter (likely a typo).
        """
        fields = {"momentum": (), **steps.init(params)}

        def f32(x, default):
            return jnp.asarray(default if x is None else x, jnp.float32)

        hyper = {"lr": f32(lr, opt.lr), "beta": f32(beta, opt.momentum.beta),
                 "weight_decay": f32(weight_decay, opt.weight_decay)}
        return CoreState(params=params, hyper=hyper, **fields)

    def apply(state: CoreState, grads, *, staleness, learner_ids, step, mask=None,
              read_params=None) -> CoreState:
        """One PS update with the c gradients in ``grads`` (see :func:`make_core`)."""
        u = read_slots(state.params, grads, staleness=staleness, learner_ids=learner_ids,
                       step=step, mask=mask, read_params=read_params)
        return steps.update(u, state)[1]

    return UpdateCore(init=init, apply=apply)


def core_pieces(
    opt: OptimizerConfig, *, num_learners: int, updates_per_epoch: float | None = None,
    nominal_staleness: float | None = None,
) -> list[Piece]:
    """The chain of :func:`make_core` for ``opt``, in order (the module docstring lists the
    pieces); the arguments and errors are :func:`make_core`'s."""
    kind, style, staleness_from, scope, damp = optimizer_choices(opt)
    if num_learners < 1:
        raise ValueError(f"num_learners must be >= 1, got {num_learners!r}")
    if staleness_from == "nominal" and nominal_staleness is None:
        raise ScenarioError("optimizer.lr_staleness", NOMINAL_NEEDS)
    rule = make_lr_rule(opt.lr_rule)
    schedule = make_schedule(opt, updates_per_epoch)
    torch = style == "torch"
    tx = None if opt.transform is None else make_transform(opt.transform)
    comp = (None if opt.compensation is None
            else make_compensation(opt.compensation, transform=tx is not None))

    pieces = [running_mean_staleness()]
    if staleness_from == "nominal":
        pieces.append(nominal_delay(nominal_staleness))
    if comp is not None:
        buffer = ("none" if tx is not None or kind == "none"
                  else "per-learner" if kind == "shifted" else "one")
        pieces.append(compensated(comp, buffer=buffer, caffe=not torch))
    # caffe: the rule gives each gradient its rate; torch and transforms: its weight at rate
    # 1, the rate multiplying the buffer's (or the transform's) step.
    pieces.append(rule_rates(rule, rate_outside=torch or tx is not None))
    if schedule is not None:
        pieces.append(scheduled(schedule))
    pieces += [softsync_weights(), weight_decay(dict(opt.weight_decay_mult), scope)]
    if tx is not None:
        pieces += [aggregate(), server_transform(tx)]
    elif kind == "shifted":
        pieces += [shifted_momentum(num_learners, torch=torch, dampening=damp), descend()]
    elif kind == "none":
        pieces += [aggregate(), descend()]
    else:
        pieces += [aggregate(), buffer_momentum(nesterov=kind == "nesterov", torch=torch,
                                                dampening=damp), descend()]
    if comp is not None:
        pieces.append(step_statistics(comp))
    return pieces


# ----------------------------------------------------------------------------- helpers
def param_hash(params: PyTree) -> str:
    """A deterministic fingerprint of a pytree of arrays (e.g. for ``summary.json``).

    SHA-256 over, for each leaf in tree order: its dtype name, its shape and its bytes in C
    order. Equal values of the same dtypes and shapes give equal hashes on any platform of
    the same endianness; a one-ulp change in any element changes the hash.
    """
    return array_hash(jax.tree_util.tree_leaves(params))


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
