"""A scenario's numerics programs: the gradient program and the update program every driver
executes, with the model, the data set and the update core they close over.

:meth:`Numerics.update` executes one PS update from its timing record -- the rows
``(learner, batch, read_version, staleness)`` of the gradients it took -- with the shared
update core (:mod:`asyncsim.numerics.core`). The online driver calls it from the SimPy run as
updates happen; replay calls it in a plain loop over a saved trace. Same inputs, same jitted
functions, same order: online and replay give bit-identical parameters on one machine.

A gradient's inputs are fixed at pull time (the version read and the mini-batch
``batch_indices(seed, learner, batch)``), so gradients are computed lazily, when the update
that takes them is applied; the simulated timeline never depends on that choice.

Grouping (README, "Performance"): gradients of one update that read the same
version can be computed by one vmapped call (``grouping="version"``) or each by itself
(``grouping="none"``). On JAX's CPU backend computing each by itself measured faster for
small per-learner batches, so ``"auto"`` picks ``"none"`` on CPU and ``"version"`` on
GPU/TPU; ``benchmarks/bench_online.py`` measures both. Under ``"none"`` an update of up to
:attr:`Numerics.fused_rows` gradients is one compiled call: each gradient as the gradient
program computes it, then the update program (the remedies' MLP at c = 7: 1.4 ms an update
against 2.6 ms in eight calls); a larger one computes its gradients by calls of
``fused_rows``, then calls the update program. Under either, a single-gradient update is
one call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim._registry import path_options
from asyncsim.config import DataConfig, ModelConfig, OptimizerConfig
from asyncsim.errors import ScenarioError, first_line
from asyncsim.numerics.core import CoreState, make_core
from asyncsim.numerics.data import (
    Dataset,
    batch_indices,
    check_batch_size,
    dataset_factory,
)
from asyncsim.numerics.models import (
    Model,
    expand_parts,
    grad_fn,
    grad_parts,
    model_factory,
    tree_bytes,
)
from asyncsim.numerics.parts import build_dataset, build_model

INIT_TAG = 0x5EED  # model init key = fold_in(PRNGKey(seed), INIT_TAG): distinct from batches

Row = tuple[int, int, int, int]  # (learner, batch, read_version, staleness)

# An update of c gradients runs as one program (gradients and update) while its c rows'
# temporaries take at most FUSED_BYTES and c <= FUSED_MAX_ROWS (fused_rows), else as
# programs of fused_rows gradients each and the update program (the same bits either way).
# Above 32 MiB of temporaries glibc returns a program's buffer to the system after every
# call (its largest mmap threshold) and the pages are faulted in again: the remedies' MLP
# at c = 30 took 23 ms an update in one program against 12 ms in 31 calls.
FUSED_BYTES = 16 << 20
FUSED_MAX_ROWS = 16


def init_key(seed: int) -> jax.Array:
    """The key a scenario's model is initialised with (every driver, every figure)."""
    return _init_key(np.uint32(seed))


@jax.jit
def _init_key(seed):
    # One program, not four (seed, fold-in, their conversions): integer arithmetic only,
    # so the same bits as the operations run one by one.
    return jax.random.fold_in(jax.random.PRNGKey(seed), INIT_TAG)


def fused_rows(programs: Programs) -> int:
    """The most gradients an update computes in its one compiled call: their temporaries
    within :data:`FUSED_BYTES`, and at most :data:`FUSED_MAX_ROWS`, since XLA compiles each
    gradient of the unrolled program anew (~0.23 s each for the remedies' MLP).

    A row's share is what XLA's memory analysis gives the one-row gradients program, its
    temporaries and its gradient (the rows of one program do not share their temporaries:
    P1's network at mu = 4 took 4.2, 8.0 and 15.5 MiB for 1, 2 and 4 rows, at mu = 128
    136 MiB a row); without an analysis, the gradient's bytes."""
    params = jax.eval_shape(programs.model.init, jax.random.PRNGKey(0))
    one = np.zeros(1, np.int32)
    analysis = programs.gradients.lower((params,), programs.x_train, programs.y_train, one,
                                        one).compile().memory_analysis()
    if analysis is not None:
        per_row = analysis.temp_size_in_bytes + analysis.output_size_in_bytes
    else:
        per_row = tree_bytes(params)
    return max(1, min(FUSED_MAX_ROWS, FUSED_BYTES // max(per_row, 1)))


def _to_device(a: np.ndarray) -> jax.Array:
    """``a`` on the default device in JAX's dtype for it (int64 labels -> int32)."""
    return jax.device_put(np.asarray(a, jax.dtypes.canonicalize_dtype(np.asarray(a).dtype)))


class Programs:
    """Model, device-resident data and the jitted gradient/eval functions of one
    (model, data, seed, batch size): shared by every Numerics with the same ones, so sweeps
    and tests compile them once."""

    def __init__(self, model: Model, data: Dataset, *, seed: int, batch_size: int):
        self.model, self.data = model, data
        # Device-resident data, gathered inside jit by batch_indices.
        # (device_put, not jnp.asarray: no conversion program to compile per array.)
        self.x_train, self.y_train, self.x_test, self.y_test = (
            _to_device(a) for a in (data.x_train, data.y_train, data.x_test, data.y_test))
        vg = grad_fn(model)
        mu, n = batch_size, int(data.x_train.shape[0])

        def one(params, x_all, y_all, learner, batch):
            idx = batch_indices(seed, learner, batch, mu, n)
            return vg(params, x_all[idx], y_all[idx])

        self.one = one  # (params, x_all, y_all, learner, batch) -> (loss, grads); unjitted
        self.grad_one = jax.jit(one)

        def gradients(reads, x_all, y_all, learners, batches):
            # The gradients of an update's rows (each at the version it read), each behind
            # a barrier, which keeps XLA from fusing across them or into what takes them.
            # That each is `grad_one`'s arithmetic, bit for bit, wherever it is computed is
            # tested (tests/unit/test_engine.py), not promised by XLA: check it again on a
            # new jaxlib. Losses [k], a tuple of k gradients.
            outs = [jax.lax.optimization_barrier(
                one(params_r, x_all, y_all, learners[k], batches[k]))
                for k, params_r in enumerate(reads)]
            return jnp.stack([loss for loss, _ in outs]), tuple(g for _, g in outs)

        self.gradients_fn = gradients
        self.gradients = jax.jit(gradients)
        # The update programs of each update core over these (Numerics.__init__).
        self.updates: dict[Any, UpdatePrograms] = {}
        if model.dense_input is not None:
            # Pending gradients for the replayer's scan path (models.DenseInput): the same
            # gradient as `one`, its first kernel kept as dL/dz and expanded when applied.
            # What travels with the parts to rebuild the first kernel's gradient: the batch's
            # features when they are smaller than its inputs (a pooled MLP), else the batch's
            # indices (one gather of the inputs when applied: storing the inputs would cost a
            # write now and a copy then).
            feats = model.dense_input.features
            d_in = int(np.prod(jax.eval_shape(
                feats, jax.ShapeDtypeStruct((1, *data.x_train.shape[1:]), jnp.float32)).shape))
            keep_features = d_in < int(np.prod(data.x_train.shape[1:]))

            def parts_one(params, x_all, y_all, learner, batch):
                idx = batch_indices(seed, learner, batch, mu, n)
                x = x_all[idx]
                loss, parts = grad_parts(model, params, x, y_all[idx])
                return loss, (parts, feats(x) if keep_features else idx)

            def expand_one(parts_with, x_all):
                parts, kept = parts_with
                return expand_parts(model, parts, kept if keep_features else feats(x_all[kept]))

            self.parts_one, self.expand_one = parts_one, expand_one
        self.grad_group = jax.jit(jax.vmap(one, in_axes=(None, None, None, 0, 0)))

        def eval_batch(params, x, y):
            return model.loss(params, x, y), model.error(params, x, y)

        self.eval_batch_raw = eval_batch
        self.eval_batch = jax.jit(eval_batch)

    @functools.cached_property
    def fused_rows(self) -> int:
        """:func:`fused_rows`: measured when an update first takes several gradients."""
        return fused_rows(self)


class UpdatePrograms:
    """The jitted update programs of one update core over one :class:`Programs`: shared by
    every :class:`Numerics` whose optimizer differs only in the core's hyperparameters (lr,
    momentum beta, weight decay: traced, in ``CoreState.hyper``), so the points of a sweep
    over them trace and compile them once.

    * ``apply``: THE update program, ``(state, a tuple of the c gradients as grad_one
      computes them, staleness [c], learners [c], step, reads)``. Every update of every
      driver applies its gradients with it, alone or inside ``fused``, the real PS
      included, so a real run replays bit for bit: compiling the apply as a separate
      program from the one used online changed the last bits (3e-8 on cifar10-full).
    * ``fused``: an update of up to ``fused_rows`` gradients in one dispatch,
      ``(state, reads, x_all, y_all, learners, batches, staleness, step)``: its gradients
      (``Programs.gradients_fn``), then ``apply``'s arithmetic, the same bits as the
      gradients computed by learners elsewhere and applied by ``apply`` (tested).
    * ``fused1``: ``fused`` for one gradient, with scalars ``(state, params_r, x_all,
      y_all, learner, batch, staleness, step)``: the single-gradient update of every
      grouping.
    * ``apply_stacked``: ``apply`` with the gradients stacked on a leading axis c, for the
      grouped path (``grouping="version"``), whose gradients come from one vmapped call.

    ``reads`` are the versions the rows read, one per row; ``apply`` and ``apply_stacked``
    take them under delay compensation only, else ``()``.
    """

    def __init__(self, core_apply, programs: Programs, *, compensates: bool):
        gradients = programs.gradients_fn

        def apply_stacked(state, grads, staleness, learner_ids, step, reads=()):
            return core_apply(state, grads, staleness=staleness, learner_ids=learner_ids,
                              step=step, read_params=_stack(reads))

        def apply(state, grads_list, staleness, learner_ids, step, reads=()):
            return core_apply(state, _stack(grads_list), staleness=staleness,
                              learner_ids=learner_ids, step=step, read_params=_stack(reads))

        def fused(state, reads, x_all, y_all, learners, batches, staleness, step):
            losses, grads = gradients(reads, x_all, y_all, learners, batches)
            st = apply(state, grads, staleness, learners, step, reads if compensates else ())
            return st, losses

        def fused1(state, params_r, x_all, y_all, learner, batch, staleness, step):
            # The c = 1 update with scalars (the common case: fewer host arrays to make and
            # send than fused's), also for the vmapped replayer.
            return fused(state, (params_r,), x_all, y_all, learner[None], batch[None],
                         staleness[None], step)

        self.apply_fn, self.fused1_fn = apply, fused1
        self.apply = _jit_donating_momentum(apply)
        self.fused1 = _jit_donating_momentum(fused1)
        self.apply_stacked = _jit_donating_momentum(apply_stacked)
        self.fused = _jit_donating_momentum(fused)


def _hyper_free(optimizer: OptimizerConfig) -> str:
    """``optimizer`` without the core's traced hyperparameters: the key of its update
    programs (:class:`UpdatePrograms`)."""
    return repr(dataclasses.replace(optimizer, lr=0.0, weight_decay=0.0,
                                    momentum=dataclasses.replace(optimizer.momentum,
                                                                 beta=0.0)))


_SHARED: dict[Any, Programs] = {}
_SHARED_MAX = 4
_UPDATES_MAX = 64  # update cores' programs kept per Programs


def _shared(model: ModelConfig, data: DataConfig, *, seed: int, base_dir: Path | None,
            source: str | None) -> Programs:
    # With a relative file option, the scenario's folder too: it names another file there.
    files = [data.options[k] for k in path_options(dataset_factory(data.name), data.options)]
    files += [model.options[k] for k in path_options(model_factory(model.name), model.options)]
    where = (str(base_dir) if any(not Path(f).expanduser().is_absolute() for f in files)
             else None)
    key = (model.name, repr(sorted(model.options.items())), data.name,
           repr(sorted(data.options.items())), seed, data.batch_size, where)

    def make():
        m = build_model(model, source=source, base_dir=base_dir)
        d = build_dataset(data, base_dir, seed=seed, source=source)
        check_fits(m, d)
        return Programs(m, d, seed=seed, batch_size=data.batch_size)

    return _recent(_SHARED, key, _SHARED_MAX, make)


def check_fits(model: Model, data: Dataset) -> None:
    """Refuse, in one line under ``model``, a model that cannot take the data set's examples:
    its loss does not trace on a batch of them (an input size it was not built for), or the
    data has more classes than it outputs. Shapes only (``jax.eval_shape``): nothing runs,
    and the error comes before a run folder holds anything but its start, not as an XLA
    shape error from inside the first gradient.

    Raises:
        ScenarioError: under ``model``, naming both and the shapes."""
    x = jax.ShapeDtypeStruct((2, *data.x_train.shape[1:]), data.x_train.dtype)
    y = jax.ShapeDtypeStruct((2, *data.y_train.shape[1:]), data.y_train.dtype)
    whose = f"model {model.name!r} cannot take data set {data.name!r}"
    try:
        params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0)))  # all traced
        jax.eval_shape(model.loss, params, x, y)
    except (TypeError, ValueError) as e:
        raise ScenarioError("model", f"{whose}: its examples have shape "
                            f"{tuple(data.x_train.shape[1:])}, the model's input is "
                            f"{tuple(model.input_shape)} ({first_line(e)})") from None
    if model.num_classes is not None and data.num_classes > model.num_classes:
        raise ScenarioError("model", f"{whose}: it has {data.num_classes} "
                            f"classes, the model outputs {model.num_classes}")


def _recent(cache: dict, key, limit: int, make):
    """``cache[key]``, made by ``make()`` if missing; the ``limit`` most recently used
    entries are kept."""
    hit = cache.pop(key, None)
    if hit is None:
        hit = make()
    cache[key] = hit  # most recently used last
    while len(cache) > limit:
        del cache[next(iter(cache))]
    return hit


def _stack(trees):
    """Pytrees stacked on a new leading axis (None for none): an update's gradients, the
    versions its rows read."""
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *trees) if trees else None


def _jit_donating_momentum(fn):
    """``jax.jit(fn)`` for an update program ``fn(state, *args)``, the state's momentum
    buffers donated: XLA writes the new buffers where the old ones were.

    P2's shifted momentum keeps one buffer per learner (lambda times the parameters) and
    changes one of them per gradient; an undonated buffer is copied whole at every update
    (the 30 buffers of a 394,000-parameter MLP: 23 ms an update, 0.7 ms donated). Donation
    changes where results are written, not what is computed. The caller gives up the
    momentum of the state it passes: the drivers keep earlier states (the rollback window)
    for their parameters only.
    """
    def split(momentum, state, *args):
        return fn(state._replace(momentum=momentum), *args)

    jitted = jax.jit(split, donate_argnums=(0,))

    @functools.wraps(fn)
    def call(state, *args):
        return jitted(state.momentum, state._replace(momentum=()), *args)

    return call


def _default_grouping() -> str:
    return "none" if jax.default_backend() == "cpu" else "version"


@dataclass
class EvalRecord:
    version: int
    gradients: int
    sim_time: float
    epoch: float
    train_loss: float
    test_loss: float
    test_error: float


class Numerics:
    """Model, data, update core and the jitted functions of a scenario's numerics parts.

    Args:
        model, data, optimizer: the scenario's ``[model]``, ``[data]`` and ``[optimizer]``.
        seed: the scenario's seed (model init, batches, the data set).
        num_learners: the cluster's learners (per-learner momentum buffers).
        base_dir, source: the scenario file's folder (relative data paths resolve against
            it) and the file (named in refusals).
        grouping: ``"none"`` | ``"version"`` | ``"auto"`` (see the module docstring).
        grads_per_update: gradients per PS update (the protocol's c, a timing fact the
            drivers pass: :func:`asyncsim.drivers.build.numerics_for`); needed only by
            epoch-based schedules, which convert epochs to updates with it.
        nominal_staleness: the protocol's nominal delay (a timing fact too); needed only by
            ``optimizer.lr_staleness = "nominal"``.

    Attributes:
        fused_rows: the most gradients an update computes in one compiled call with the
            update (``grouping="none"``; :func:`fused_rows`); a larger update computes its
            gradients by calls of that many, then calls the update program. Either way the
            same bits.

    The drivers build it from a scenario with :func:`asyncsim.drivers.build.numerics_for`;
    programs of the same (model, data, seed, batch size) are shared, and so are the update
    programs of optimizers that differ only in lr, momentum beta and weight decay
    (:class:`UpdatePrograms`), so sweeps and tests compile them once.
    """

    def __init__(self, model: ModelConfig, data: DataConfig, optimizer: OptimizerConfig, *,
                 seed: int, num_learners: int, base_dir: Path | None = None,
                 source: str | None = None, grouping: str = "auto",
                 grads_per_update: float | None = None,
                 nominal_staleness: float | None = None):
        shared = _shared(model, data, seed=seed, base_dir=base_dir, source=source)
        self.model = shared.model
        self.data = shared.data
        self.n_train = int(self.data.x_train.shape[0])
        self.mu = data.batch_size
        check_batch_size(self.mu, self.n_train, data.name)
        self.seed = seed
        # PS updates per pass over the train set: n_train / (mu * gradients per update).
        self.upe = (None if grads_per_update is None
                    else self.n_train / (self.mu * grads_per_update))
        self.nominal_staleness = nominal_staleness
        self.core = make_core(optimizer, num_learners=num_learners,
                              updates_per_epoch=self.upe,
                              nominal_staleness=nominal_staleness)
        self.grouping = _default_grouping() if grouping == "auto" else grouping
        if self.grouping not in ("none", "version"):
            raise ValueError(f"grouping must be none, version or auto, got {grouping!r}")
        self.x_train, self.y_train = shared.x_train, shared.y_train
        self.x_test, self.y_test = shared.x_test, shared.y_test
        self.grad = shared.grad_one  # jitted (params, x_all, y_all, learner, batch)
        self._grad_group = shared.grad_group
        self._eval_batch = shared.eval_batch
        self.programs = shared
        # Delay compensation reads the parameters each gradient was computed on: the
        # update programs then take them too (``reads``, one version per row).
        self.compensates = optimizer.compensation is not None
        key = (_hyper_free(optimizer), num_learners, self.upe, nominal_staleness)
        updates = _recent(shared.updates, key, _UPDATES_MAX, lambda: UpdatePrograms(
            self.core.apply, shared, compensates=self.compensates))
        self.apply_fn, self.apply = updates.apply_fn, updates.apply
        self.fused1_fn = updates.fused1_fn
        self._fused, self._fused1 = updates.fused, updates.fused1
        self._apply_stacked = updates.apply_stacked
        self._gradients = shared.gradients
        self._fused_rows: int | None = None

    @property
    def fused_rows(self) -> int:
        return self.programs.fused_rows if self._fused_rows is None else self._fused_rows

    @fused_rows.setter
    def fused_rows(self, rows: int) -> None:
        self._fused_rows = rows  # this Numerics' own bound (a benchmark's, a test's)

    # ------------------------------------------------------------------ state
    def init_params(self):
        return self.model.init(init_key(self.seed))

    def init_state(self, **hyper: Any) -> CoreState:
        # One program for the zero buffers and the hyperparameters (zeros and float32
        # casts: the same bits as op by op); hyperparameters are traced, so a sweep over lr
        # compiles it once.
        given = {k: v for k, v in hyper.items() if v is not None}
        return self._init_state(self.init_params(), given)

    @functools.cached_property
    def _init_state(self):
        return jax.jit(lambda params, hyper: self.core.init(params, **hyper))

    # ------------------------------------------------------------------ one update
    def _grouped_gradients(self, versions: dict[int, Any], rows: Sequence[Row]):
        """Losses [c] and stacked gradients (leading axis c) of an update's rows, in order,
        with one vmapped call per read version (``grouping="version"``)."""
        groups: dict[int, list[int]] = {}
        for i, (_, _, r, _) in enumerate(rows):
            groups.setdefault(r, []).append(i)
        parts_l, parts_g, order = [], [], []
        for r, idx in groups.items():
            ls = np.asarray([rows[i][0] for i in idx], np.int32)
            bs = np.asarray([rows[i][1] for i in idx], np.int32)
            loss, g = self._grad_group(versions[r], self.x_train, self.y_train, ls, bs)
            parts_l.append(loss)
            parts_g.append(g)
            order.extend(idx)
        losses = jnp.concatenate(parts_l)
        grads = jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *parts_g)
        if order != sorted(order):
            inv = np.argsort(np.asarray(order))
            losses = losses[inv]
            grads = jax.tree_util.tree_map(lambda a: a[inv], grads)
        return losses, grads

    def update(self, state: CoreState, versions: dict[int, Any], version: int,
               rows: Sequence[Row]) -> tuple[CoreState, jax.Array]:
        """Apply PS update ``version`` taking ``rows``; returns the new state and batch losses.

        Every driver executes updates through this method, so the same rows give the same
        compiled calls and bit-identical results online, in replay and on Ray.
        """
        step = np.int32(version)
        if len(rows) == 1:
            (l, b, r, tau), = rows
            return self._fused1(state, versions[r], self.x_train, self.y_train, np.int32(l),
                                np.int32(b), np.int32(tau), step)
        staleness = np.asarray([row[3] for row in rows], np.int32)
        learners = np.asarray([row[0] for row in rows], np.int32)
        batches = np.asarray([row[1] for row in rows], np.int32)
        reads = tuple(versions[r] for _, _, r, _ in rows)
        if self.grouping == "none" and len(rows) <= self.fused_rows:
            return self._fused(state, reads, self.x_train, self.y_train, learners, batches,
                               staleness, step)
        compensated = self.reads(versions, rows)
        if self.grouping == "none":
            # Above the bound: the gradients by chunks of fused_rows, then the update.
            k = self.fused_rows
            parts = [self._gradients(reads[i:i + k], self.x_train, self.y_train,
                                     learners[i:i + k], batches[i:i + k])
                     for i in range(0, len(rows), k)]
            state = self.apply(state, tuple(g for _, gs in parts for g in gs), staleness,
                               learners, step, compensated)
            return state, jnp.concatenate([losses for losses, _ in parts])
        losses, grads = self._grouped_gradients(versions, rows)
        state = self._apply_stacked(state, grads, staleness, learners, step, compensated)
        return state, losses

    # ------------------------------------------------------------------ batched gradients
    def gradient_pool(self, slots: int):
        """A device pool of ``slots`` gradients (and their batch losses), zeros: where the
        batched path (:mod:`asyncsim.drivers.batched`) keeps gradients computed before the
        update that takes them."""
        shapes = jax.eval_shape(self.model.init, jax.random.PRNGKey(0))
        return (jax.tree_util.tree_map(lambda s: jnp.zeros((slots, *s.shape), s.dtype),
                                       shapes), jnp.zeros(slots, jnp.float32))

    def grads_into(self, pool, reads: Sequence[Any], learners: np.ndarray,
                   batches: np.ndarray, slots: np.ndarray):
        """The gradients of K rows in one call -- row k at the parameters ``reads[k]`` (the
        version it read), learner ``learners[k]``, batch ``batches[k]`` -- written to pool
        slots ``slots[k]``: one program vmapped over the versions (the same per-row
        arithmetic as :attr:`grad`, batched, so equal to it to rounding, not bit for bit).
        Returns the new pool."""
        return self._grads_into(pool, tuple(reads), self.x_train, self.y_train,
                                np.asarray(learners, np.int32), np.asarray(batches, np.int32),
                                np.asarray(slots, np.int32))

    def apply_pooled(self, state: CoreState, pool, version: int, rows: Sequence[Row],
                     slots: np.ndarray, versions: dict[int, Any] | None = None):
        """Apply update ``version`` taking ``rows`` whose gradients are in pool ``slots``
        (one per row, in order), with the update core; returns the state and the rows'
        batch losses."""
        return self._apply_pooled(state, pool, np.asarray(slots, np.int32),
                                  np.asarray([r[3] for r in rows], np.int32),
                                  np.asarray([r[0] for r in rows], np.int32),
                                  np.int32(version), self.reads(versions or {}, rows))

    @functools.cached_property
    def _grads_into(self):
        vone = jax.vmap(self.programs.one, in_axes=(0, None, None, 0, 0))

        def grads_into(pool, reads, x_all, y_all, learners, batches, slots):
            loss, g = vone(_stack(reads), x_all, y_all, learners, batches)
            grads, losses = pool
            return (jax.tree_util.tree_map(lambda p, a: p.at[slots].set(a), grads, g),
                    losses.at[slots].set(loss))

        # The pool is updated in place where the backend can (not on CPU, which would
        # only warn that it cannot).
        donate = () if jax.default_backend() == "cpu" else (0,)
        return jax.jit(grads_into, donate_argnums=donate)

    @functools.cached_property
    def _apply_pooled(self):
        core_apply = self.core.apply

        def apply_pooled(state, pool, slots, staleness, learners, step, reads):
            grads, losses = pool
            taken = jax.tree_util.tree_map(lambda p: p[slots], grads)
            return core_apply(state, taken, staleness=staleness, learner_ids=learners,
                              step=step, read_params=_stack(reads)), losses[slots]

        return _jit_donating_momentum(apply_pooled)

    def reads(self, versions: dict[int, Any], rows: Sequence[Row]) -> tuple:
        """The read versions' parameters the update programs take with ``rows``: one per
        row under delay compensation, else none."""
        return tuple(versions[r[2]] for r in rows) if self.compensates else ()

    def apply_given(self, state: CoreState, version: int, rows: Sequence[Row],
                    grads: Sequence[Any], versions: dict[int, Any] | None = None) -> CoreState:
        """Apply update ``version`` with gradients computed elsewhere (the real PS: by the
        learners, with :attr:`grad`), one per row, through the same update program as
        :meth:`update`; ``versions`` holds the rows' read versions under compensation."""
        return self.apply(state, tuple(grads), np.asarray([r[3] for r in rows], np.int32),
                          np.asarray([r[0] for r in rows], np.int32), np.int32(version),
                          self.reads(versions or {}, rows))

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, params, *, samples: int | None = None, batch: int = 1000,
                 program=None, split: str = "test", wait: bool = True):
        """(loss, error) on the first ``samples`` examples of the ``split`` set ("test", or
        "train" for the generalization gap), the means of ``batch``-sized chunks weighted
        by their sizes (in float64). ``program``: the ``(params, x, y) -> (loss, error)`` to
        evaluate with (default: the model's; a vmapped sweep passes its program over stacked
        parameters and gets arrays, one value per point). ``wait=False``: the chunks are
        dispatched and a function returning the pair is returned at once, so the device
        computes them while the caller goes on (the same pair, to the bit)."""
        program = program or self._eval_batch
        if split not in ("test", "train"):
            raise ValueError(f"split must be 'test' or 'train', got {split!r}")
        x, y = (self.x_test, self.y_test) if split == "test" else (self.x_train, self.y_train)
        n = x.shape[0] if samples is None else min(samples, x.shape[0])
        spans = [(s, min(s + batch, n)) for s in range(0, n, batch)]
        chunks = ((*program(params, x[s:e], y[s:e]), e - s) for s, e in spans)
        if not wait:  # all dispatched now; waiting, each is fetched before the next starts
            chunks = list(chunks)

        def result():
            tot_l = tot_e = np.float64(0.0)
            for loss, err, size in chunks:
                tot_l = tot_l + np.asarray(loss, np.float64) * size
                tot_e = tot_e + np.asarray(err, np.float64) * size
            return tot_l / max(n, 1), tot_e / max(n, 1)

        return result() if wait else result

    def epoch_of(self, gradients: int) -> float:
        return gradients * self.mu / self.n_train
