"""The one Driver: what every path that executes a run's numerics shares.

Online runs, replays (loop, scan, vmapped) and real runs on Ray all execute updates from
their timing rows and hand the results to :class:`Driver`, which owns the core state, the
parameter versions still to be read, the batch losses, the evaluations, divergence,
checkpoints, the stop reason and the run folder's output files.

Divergence: every ``CHECK_EVERY`` updates the batch losses are fetched; the first update
with a non-finite loss, or a loss a million times the first update's, stops the run
cleanly, recorded in ``summary.json`` as ``diverged: true`` and ``diverged_at``.

Checkpoints and resume: every ``run.checkpoint_every`` updates (or, when that is 0, once a
minute of wall time) the numerics state, the parameter versions still in use and the
metrics so far are written atomically to ``checkpoint.npz``. Timing never depends on
numerics, so ``--resume`` re-simulates the timeline (cheap) and restarts the numerics from
the checkpoint: the final ``param_hash`` is the one an uninterrupted run gives.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from asyncsim import runs
from asyncsim._io import DamagedFile, atomic, csv_text, damaged, npz_member, read_npz, write_parquet
from asyncsim._process import raise_if_interrupted
from asyncsim.config import Scenario
from asyncsim.drivers.record import check_resume
from asyncsim.drivers.recorder import Recorder, eval_record
from asyncsim.drivers.result import RunResult
from asyncsim.errors import ScenarioError
from asyncsim.numerics import compile_cache
from asyncsim.numerics.core import CoreState, param_hash
from asyncsim.numerics.lr_rules import rate_at_delay
from asyncsim.numerics.models import num_params
from asyncsim.numerics.numerics import EvalRecord, Numerics, Row, build_model
from asyncsim.timing.protocols import make_protocol, protocol_options, timing_revision
from asyncsim.trace import Trace

CHECK_EVERY = 16  # updates between fetches of the batch losses (the divergence check)
# The rollback window of a divergence check holds at most this many bytes of core states.
WINDOW_BYTES = 256 << 20
CKPT = "checkpoint.npz"
# With run.checkpoint_every = 0, a run folder still gets a checkpoint once this many seconds
# of wall time have passed since the last one, so a long run killed at any moment loses at
# most about a minute of work.
AUTO_CHECKPOINT_SECONDS = 60.0
DIVERGED_FACTOR = 1e6


class Monitor(Protocol):
    """What a run measures besides its metrics (:mod:`asyncsim.stability.measure`: sharpness
    along the run, at its start and end). The Driver calls :meth:`observe` at version 0,
    every :attr:`every` updates (0: never in between) and after the last update, then
    :meth:`finish`, whose fields join ``summary.json`` (a monitor may also write files into
    ``driver.folder``, before the summary marks the folder complete)."""

    every: int

    def observe(self, driver: Driver, version: int) -> None: ...

    def finish(self, driver: Driver) -> dict[str, Any]: ...

    # Optional, for checkpoints (a resumed run keeps what was measured before them):
    # ``state() -> JSON-able`` and ``restore(state)``.


@dataclass
class Observer:
    """A :class:`Monitor` calling ``fn(version, state)``: a run's state at version 0, every
    ``every`` updates and after the last one."""

    fn: Callable[[int, CoreState], Any]
    every: int = 1

    def observe(self, driver: Driver, version: int) -> None:
        self.fn(version, driver.state)

    def finish(self, driver: Driver) -> dict[str, Any]:
        return {}


def numerics_for(scn: Scenario, **kw: Any) -> Numerics:
    """``scn``'s :class:`Numerics`, told the protocol's gradients per update (a timing fact
    that epoch-based schedules need) and its nominal delay (for ``lr_staleness =
    "nominal"``)."""
    proto = make_protocol(scn.protocol, scn.cluster.learners)
    return Numerics(scn, grads_per_update=1.0 / proto.updates_per_gradient(),
                    nominal_staleness=proto.nominal_staleness(), **kw)


def message_bytes(scn: Scenario, *, always: bool = False) -> int | None:
    """4 bytes per model parameter, when a message's size matters and is not given: a link,
    or the PS's shared interface in its direction, has a finite bandwidth and no ``bytes``
    (with ``always``, in any case)."""
    net = scn.cluster.network
    if not always and not any(link.bytes is None and (math.isfinite(link.bandwidth) or (
            shared is not None and math.isfinite(shared.bandwidth)))
               for link, shared in ((net.pull, net.ps_egress), (net.push, net.ps_ingress))):
        return None
    model = build_model(scn)  # a ScenarioError under `model` for an option it refuses
    return 4 * num_params(jax.eval_shape(model.init, jax.random.PRNGKey(0)))


def first_diverged(losses: list[np.ndarray], base: int, first_loss: float) -> int | None:
    """Version of the first update (counting from ``base``) whose batch losses are not all
    finite or exceed ``DIVERGED_FACTOR * first_loss``; None if there is none."""
    if not losses:
        return None
    flat, owner = _flatten(losses)
    limit = DIVERGED_FACTOR * first_loss if np.isfinite(first_loss) else np.inf
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(flat) | (flat > limit)
    hit = np.flatnonzero(bad)
    return None if hit.size == 0 else base + int(owner[hit[0]])


@jax.jit
def _all_finite(params) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x))
                              for x in jax.tree_util.tree_leaves(params)]))


def params_finite(params) -> bool:
    """Whether every parameter is finite (one compiled reduction)."""
    return bool(_all_finite(params))


def update_means(losses: list[np.ndarray]) -> np.ndarray:
    """The mean batch loss of each update (NaN for an update with no gradients)."""
    if not losses:
        return np.zeros(0)
    flat, owner = _flatten(losses)
    sums = np.bincount(owner, weights=flat.astype(np.float64), minlength=len(losses))
    sizes = np.bincount(owner, minlength=len(losses))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sizes > 0, sums / np.maximum(sizes, 1), np.nan)


def _flatten(losses: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """All batch losses in one array, and the index of the update each belongs to: one
    vectorised pass instead of a Python loop over updates (measured: ~25 ms less per
    1,000-update replay, about 3% of a scan replay of a small MLP)."""
    sizes = np.fromiter((x.size for x in losses), np.int64, len(losses))
    flat = np.concatenate([np.ravel(x) for x in losses])
    return flat, np.repeat(np.arange(len(losses)), sizes)


def _flat(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def save_checkpoint(folder: Path, version: int, state: CoreState, versions: dict[int, Any],
                    rec: Recorder, extra: dict[str, Any]) -> None:
    arrays: dict[str, np.ndarray] = {f"state_{i}": a for i, a in enumerate(_flat(state))}
    arrays.update({f"v{v}_{i}": a for v, params in versions.items()
                   for i, a in enumerate(_flat(params))})
    meta = {"version": version, "versions": sorted(versions),
            "evals": [e.__dict__ for e in rec.evals], "extra": extra,
            "losses_len": [int(x.size) for x in rec.losses]}
    arrays["losses"] = (np.concatenate(rec.losses) if rec.losses
                        else np.zeros(0, np.float32)).astype(np.float32)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with atomic(folder / CKPT, fsync=True) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def load_checkpoint(folder: Path, template_state: CoreState, template_params):
    z = read_npz(folder / CKPT, what="the checkpoint")
    meta = json.loads(bytes(z["meta"]).decode())
    s_def = jax.tree_util.tree_structure(template_state)
    s_leaves = [z[f"state_{i}"] for i in range(s_def.num_leaves)]
    state = jax.tree_util.tree_unflatten(s_def, [jax.numpy.asarray(a) for a in s_leaves])
    p_def = jax.tree_util.tree_structure(template_params)
    versions = {}
    for v in meta["versions"]:
        leaves = [jax.numpy.asarray(z[f"v{v}_{i}"]) for i in range(p_def.num_leaves)]
        versions[v] = jax.tree_util.tree_unflatten(p_def, leaves)
    flat = z["losses"]
    rec = Recorder()
    pos = 0
    for n in meta["losses_len"]:
        rec.losses.append(flat[pos:pos + n])
        pos += n
    rec.evals = [EvalRecord(**e) for e in meta["evals"]]
    return meta["version"], state, versions, rec, meta["extra"]


# What to do about a checkpoint that cannot be used.
_START_OVER = "pass --force to start over"


def checkpoint_meta(folder: Path) -> dict[str, Any]:
    """The metadata of ``folder``'s checkpoint (its version, what it was saved with), read
    without loading its states; a checkpoint that cannot be read is a one-line
    :class:`~asyncsim._io.DamagedFile`."""
    raw = npz_member(folder / CKPT, "meta", what="the checkpoint", advice=_START_OVER)
    try:
        meta = json.loads(bytes(raw).decode())
    except ValueError as e:
        raise damaged(folder / CKPT, e, _START_OVER) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("extra", {}), dict):
        raise damaged(folder / CKPT, "its metadata is not a table", _START_OVER)
    return meta


def check_checkpoint(folder: Path, scn: Scenario) -> dict[str, Any]:
    """Refuse, in one line, a checkpoint that does not belong to ``scn`` (the folder's
    scenario.toml as it is now: :func:`asyncsim.drivers.record.check_resume`); returns the
    scenario as the folder records it, which the resumed run's checkpoints keep."""
    extra = checkpoint_meta(folder).get("extra", {})
    revision = timing_revision(scn.protocol)
    if extra.get("timing_revision") != revision:
        schedule = protocol_options(scn.protocol)["schedule"]
        raise ScenarioError("protocol.schedule", f"{folder / CKPT} was made under another "
                            f"timing model of schedule {schedule!r} (before "
                            f"asyncsim 0.3 it was the racing model, now \"race\"); "
                            f"{_START_OVER}", file=str(folder))
    return check_resume(folder, extra.get("scenario"), scn)


def resume_from(folder: Path, scn: Scenario, num: Numerics, *, check: bool = True):
    """The checkpoint ``folder`` resumes from (:func:`load_checkpoint`'s tuple), once it is
    known to belong to ``scn`` (:func:`check_checkpoint`; ``check=False``: the caller has
    checked it). A damaged checkpoint is a one-line :class:`~asyncsim._io.DamagedFile`."""
    if check:
        check_checkpoint(folder, scn)
    template = num.init_state()
    try:
        return load_checkpoint(folder, template, template.params)
    except DamagedFile:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as e:  # arrays that do not fit
        raise damaged(folder / CKPT, e, _START_OVER) from None


class Driver:
    """The one driver of a run's numerics, whatever executes its updates.

    Online runs, loop replays and the real PS hand it each update (:meth:`on_update`, or
    :meth:`applied` with gradients applied elsewhere); the compiled-chunk and vmapped
    executors hand it each chunk's losses and the state at its end (:meth:`chunk_applied`).
    It owns the core state, the parameter versions later gradients read, the batch losses,
    the evaluations (every ``run.eval_every`` updates and at the end), what a
    :class:`Monitor` measures, the checkpoints (every ``run.checkpoint_every`` updates, or
    once a minute) and the stop.

    Divergence, the same for every path: update ``v`` diverged if its batch losses are not
    all finite or one exceeds ``DIVERGED_FACTOR`` times the first update's mean |loss|, if
    the parameters it produced are not all finite, or if the evaluation right after it
    (version ``v + 1``) has a test loss that is not finite or exceeds ``DIVERGED_FACTOR``
    times the first evaluation's. The run stops there: update ``v`` is the last one applied
    (``diverged_at = v``, ``updates = v + 1``, ``stop_reason = "diverged"``). Losses are
    fetched from the device every ``check_every`` updates rather than after each one (a
    sync per update would cost the small models a third of their speed); the states of the
    updates in between are kept, so a divergence found late rolls back to the exact update.
    """

    def __init__(self, scn: Scenario, num: Numerics, *, folder: Path | None = None,
                 start: tuple | None = None, hyper: dict[str, float] | None = None,
                 versions: bool = True, monitor: Monitor | None = None,
                 evaluate: bool = True, checkpoints: bool = True,
                 record: dict[str, Any] | None = None):
        self.scn, self.num, self.folder = scn, num, folder
        # The scenario as the folder records it, kept in every checkpoint (drivers.record).
        self.record = record
        self.hyper = dict(hyper or {})
        if start is not None:
            self.start_version, self.state, self.versions, self.rec, extra = start
            self.grads_applied = int(extra.get("grads_applied", 0))
            if monitor is not None and "monitor" in extra and hasattr(monitor, "restore"):
                monitor.restore(extra["monitor"])  # what it measured before the checkpoint
        else:
            self.start_version = 0
            self.state = num.init_state(**self.hyper)
            self.versions = {0: self.state.params}
            self.rec = Recorder()
            self.grads_applied = 0
        if not versions:
            self.versions = None  # the real PS: learners keep the versions they read
        self.diverged_at: int | None = None
        self.stopped_at: int | None = None  # updates applied when the run stopped on divergence
        self.now = 0.0
        self.monitor = monitor
        # Replays keep no checkpoints: they are redone, not resumed (runs._REDO).
        self.checkpoints = checkpoints and folder is not None
        self._window: list[CoreState] = []  # states after the unchecked updates (rollback)
        self._state_at: Callable[[int], CoreState] | None = None  # or a chunk's recomputation
        self._checked = len(self.rec.losses)  # updates the divergence rule has seen
        state_bytes = sum(int(np.prod(np.shape(x))) * 4
                          for x in jax.tree_util.tree_leaves(self.state))
        # Keep at most ~WINDOW_BYTES of states for rollback: a model too big for 16 states
        # fetches its losses after every update instead (its gradients dwarf the sync).
        self.check_every = max(1, min(CHECK_EVERY, WINDOW_BYTES // max(state_bytes, 1)))
        self._last_ckpt = time.monotonic()
        self.pbar = None
        if evaluate and self.start_version == 0 and not self.rec.evals:
            self.evaluate(0)
        self._observed = -1
        if monitor is not None and self.start_version == 0:
            self._observe(0)

    # ------------------------------------------------------------------ feeding updates
    def on_update(self, v: int, rows: Sequence[Row], *, alive, now: float) -> bool | None:
        """Execute update ``v`` from its timing rows (loop executors: online, replay); ``alive``
        holds the versions later gradients still read. Returns False to stop the run."""
        if v < self.start_version:  # restored from the checkpoint (grads_applied included)
            return None
        state, losses = self.num.update(self.state, self.versions, v, rows)
        return self.applied(v, len(rows), state, losses, alive=alive, now=now)

    def applied(self, v: int, n_grads: int, state: CoreState, losses, *, now: float,
                alive=None) -> bool | None:
        """Update ``v`` of ``n_grads`` gradients was applied, giving ``state`` and its batch
        ``losses``: record, check, evaluate, observe, checkpoint. False: stop the run."""
        self.grads_applied += n_grads
        self.now = now
        self.state = state
        if self.versions is not None:
            versions = self.versions
            versions[v + 1] = state.params
            for k in [k for k in versions if k != v + 1 and alive is not None and k not in alive]:
                del versions[k]
        self.rec.pending.append(losses)
        self._window.append(state)
        if self.pbar is not None:
            self.pbar.update(1)
        return self._after(v + 1)

    def chunk_applied(self, end: int, state: CoreState, losses: np.ndarray, grads: int, *,
                      now: float, state_at: Callable[[int], CoreState],
                      evaluation: tuple[float, float] | None = None) -> bool | None:
        """A chunk of updates (a compiled chunk, or a vmapped executor's stretch of updates)
        ended at version ``end``: ``losses`` are the batch losses of its updates ([updates,
        c], fetched), ``state`` the state after it, ``grads`` the gradients applied in all;
        ``state_at(v)`` gives (or recomputes) the state after any update ``v`` of the chunk,
        so a divergence inside it rolls back there; ``evaluation`` is the (test loss, test
        error) at ``end`` when an evaluation is due and was computed elsewhere (vmapped).
        False: stop the run."""
        self.rec.losses.extend(np.asarray(x) for x in losses)
        self.grads_applied, self.now, self.state = grads, now, state
        self._state_at = state_at
        return self._after(end, chunk=True, evaluation=evaluation)

    def _after(self, done: int, *, chunk: bool = False,
               evaluation: tuple[float, float] | None = None) -> bool | None:
        """What follows update ``done - 1``: the checks, evaluations, observations and
        checkpoints that are due; a Ctrl-C that the interpreter dropped is raised here."""
        raise_if_interrupted()
        r = self.scn.run
        eval_due = bool(r.eval_every) and done % r.eval_every == 0
        obs_due = self.monitor is not None and bool(self.monitor.every) and (
            done % self.monitor.every == 0)
        ckpt_due = self.checkpoints and (
            done % r.checkpoint_every == 0 if r.checkpoint_every
            else time.monotonic() - self._last_ckpt > AUTO_CHECKPOINT_SECONDS)
        if (chunk or eval_due or obs_due or ckpt_due
                or len(self.rec.pending) >= self.check_every) and self.check() is False:
            return False
        if eval_due:
            self.evaluate(done, evaluation)
            if self.diverged_at is not None:
                return False
        if obs_due:
            self._observe(done)
        if ckpt_due:
            save_checkpoint(self.folder, done, self.state, self.versions or {}, self.rec,
                            self.checkpoint_extra(done))
            self._last_ckpt = time.monotonic()
        return None

    # ------------------------------------------------------------------ divergence
    def check(self) -> bool | None:
        """Fetch the pending losses and apply the divergence rule to the updates since the last
        check; on divergence the state rolls back to the diverged update. False: diverged."""
        if self.diverged_at is not None:
            return False
        first, window, state_at = self._checked, self._window, self._state_at
        self._window, self._state_at = [], None
        self.rec.flush()
        end = self._checked = len(self.rec.losses)
        if end == first:
            return None
        if state_at is None:
            def state_at(v: int) -> CoreState:
                return window[v - first]
        bad = first_diverged(self.rec.losses[first:], first, self.rec.first_loss())
        if not params_finite(self.state.params):
            # The first update whose parameters are not finite (non-finite numbers stay so).
            lo, hi = first, end - 1
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if not params_finite(state_at(mid).params) else (mid + 1, hi)
            bad = lo if bad is None else min(bad, lo)
        if bad is None:
            return None
        self._diverge(bad, state_at(bad))
        return False

    def _diverge(self, v: int, state: CoreState) -> None:
        """Stop at update ``v``: it is the last one applied."""
        self.diverged_at, self.stopped_at, self.state = v, v + 1, state
        del self.rec.losses[v + 1:]
        self.rec.evals = [e for e in self.rec.evals if e.version <= v + 1]

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, version: int, result: tuple[float, float] | None = None) -> None:
        """Record the evaluation at ``version`` (``result``: its (test loss, test error)
        computed elsewhere, e.g. by a vmapped program; default: evaluated here). A test
        loss that is not finite, or ``DIVERGED_FACTOR`` times the first evaluation's, stops
        the run: the update before it diverged."""
        r = self.scn.run
        recent = self.rec.losses[max(version - max(r.eval_every, 1), 0):version]
        train_loss = float(np.mean(np.concatenate(recent))) if recent else math.nan
        fields = dict(version=version, gradients=self.grads_applied, sim_time=self.now,
                      epoch=self.num.epoch_of(self.grads_applied), train_loss=train_loss)
        if result is None and version == 0:
            # Nothing is checked against the first evaluation until the next one: it is
            # fetched then (Recorder.evaluate_later), and computes meanwhile.
            pending = self.num.evaluate(self.state.params, samples=r.eval_samples, wait=False)
            self.rec.evaluate_later(lambda: eval_record(fields, pending()))
            return
        if result is None:
            result = self.num.evaluate(self.state.params, samples=r.eval_samples)
        evals = self.rec.evals
        evals.append(eval_record(fields, result))
        test_loss, first = evals[-1].test_loss, evals[0].test_loss
        limit = DIVERGED_FACTOR * abs(first) if math.isfinite(first) else math.inf
        if (version > 0 and self.diverged_at is None
                and not (math.isfinite(test_loss) and test_loss <= limit)):
            self._diverge(version - 1, self.state)

    def _observe(self, version: int) -> None:
        self.monitor.observe(self, version)
        self._observed = version

    def show_progress(self, total: int | None) -> None:
        """A progress bar of updates (closed by :meth:`finish`)."""
        from tqdm.auto import tqdm  # tqdm's import is slow; only runs that show a bar pay it

        self.pbar = tqdm(total=total, initial=self.start_version, unit="upd", mininterval=0.5,
                         leave=False, disable=None)

    def close_progress(self) -> None:
        if self.pbar is not None:
            self.pbar.close()
            self.pbar = None

    def _rates(self, staleness_mean: float) -> dict[str, float]:
        """The per-gradient rate the run's rule gives (before any schedule), what figures
        plot against: ``lr_at_mean_tau`` at the run's mean staleness rounded to an integer
        (α0/τ̄ for inverse-staleness), and ``lr_at_tau`` at the protocol's constant delay τ
        when it has one (fixed-delay: P2's η_τ for stability-edge). Under ``lr_staleness =
        "nominal"`` every gradient's rate is the rule's at the nominal delay, so both are."""
        rule, lr = self.scn.optimizer.lr_rule, self.hyper.get("lr", self.scn.optimizer.lr)
        tau_bar = round(staleness_mean)
        if self.scn.optimizer.lr_staleness == "nominal":
            tau_bar = self.num.nominal_staleness
        out = {"lr_at_mean_tau": rate_at_delay(rule, lr, tau_bar)}
        tau = self.scn.protocol.options.get("tau")  # fixed-delay's
        if tau is not None:
            out["lr_at_tau"] = rate_at_delay(rule, lr, tau)
        return out

    def checkpoint_extra(self, done: int) -> dict[str, Any]:
        """What a checkpoint keeps beside the numerics (the real PS adds its trace): the
        gradients applied and what the monitor measured so far."""
        extra: dict[str, Any] = {"grads_applied": self.grads_applied,
                                 "scenario": self.record}
        revision = timing_revision(self.scn.protocol)
        if revision is not None:  # check_checkpoint: the timing it was made under
            extra["timing_revision"] = revision
        if self.monitor is not None and hasattr(self.monitor, "state"):
            extra["monitor"] = self.monitor.state()
        return extra

    # ------------------------------------------------------------------ the end
    def finish(self, trace: Trace, t0: float, *, kind: str = "run",
               extra: Mapping[str, Any] | None = None,
               compare: Callable[[dict[str, Any], Any], Mapping[str, Any]] | None = None
               ) -> RunResult:
        """Final check and evaluation, summary (plus ``extra`` fields, and those
        ``compare(summary, final params)`` returns: a replay's comparison with its source)
        and, with a folder, every output file, ``summary.json`` last and once, so a folder
        with a summary has all of it. A diverged run's trace ends at its last applied
        update."""
        self.check()
        self.close_progress()
        if self.stopped_at is not None:
            # Back to the diverged update: its time and gradient count, whatever update the
            # divergence was found at (the evaluation below records them).
            trace = trace.truncate(self.stopped_at)
            self.grads_applied = trace.num_gradients
            self.now = float(trace.updates["time"][-1]) if trace.num_updates else 0.0
        if self.rec.evals[-1].version != trace.num_updates:
            self.evaluate(trace.num_updates)  # the final parameters (a diverged run's too)
        if self.stopped_at is not None:  # the final evaluation may find it too
            trace = trace.truncate(self.stopped_at, stop_reason="diverged")
        measured = {}
        if self.monitor is not None:
            if self._observed != trace.num_updates:
                self._observe(trace.num_updates)
            measured = self.monitor.finish(self)
        num, rec, final = self.num, self.rec, self.state
        evals = {k: [getattr(e, k) for e in rec.evals] for k in EvalRecord.__dataclass_fields__}
        n = min(len(rec.losses), trace.num_updates)
        upd = {k: v[:n] for k, v in trace.updates.items()}
        upd["train_loss"] = np.asarray(update_means(rec.losses[:n]), np.float64)
        last = rec.evals[-1]
        trace_figures = trace.summary()
        summary = {
            "name": self.scn.name, "seed": self.scn.seed, "kind": kind,
            **trace_figures,
            "epochs": num.epoch_of(trace.num_gradients),
            "final_test_error": last.test_error,
            "final_test_loss": last.test_loss,
            "final_train_loss": last.train_loss,
            "diverged": self.diverged_at is not None,
            "diverged_at": self.diverged_at,
            "param_hash": param_hash(final.params),
            "wall_time": time.perf_counter() - t0,
            "stop_reason": trace.meta.get("stop_reason"),
            "grouping": num.grouping,
            "backend": jax.default_backend(),
            # The loop's numbers, bit for bit: a scan or vmapped replay says False.
            "exact": True,
            **self._rates(trace_figures["staleness_mean"]),
            **measured,
            **(extra or {}),
        }
        if self.scn.run.eval_train:
            loss, err = num.evaluate(final.params, split="train")
            summary.update(final_train_error=float(err), final_train_set_loss=float(loss))
        if compare is not None:
            summary.update(compare(summary, final.params))
        folder = self.folder
        if folder is not None:
            runs.add_provenance(folder, compilation_cache=compile_cache.stats())
            trace.save(folder)
            runs.atomic_write_text(folder / "eval.csv", csv_text(evals))
            write_parquet(folder / "updates.parquet", upd)
            save_params(folder, final.params)
            runs.write_summary(folder, summary)
            ck = folder / CKPT
            if ck.exists():
                ck.unlink()  # a complete run needs no checkpoint; final params are kept
        return RunResult(trace, summary, evals, upd, final.params, folder)


def save_params(folder: Path, params) -> None:
    """``params.npz``: the final parameters, leaves named by their pytree path."""
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    arrays = {jax.tree_util.keystr(p): np.asarray(x) for p, x in flat}
    with atomic(folder / "params.npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def load_params(folder: str | Path, template):
    """The final parameters of a run folder, in the structure of ``template``."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(template)
    z = read_npz(Path(folder) / "params.npz", what="the final parameters")
    leaves = [jax.numpy.asarray(z[jax.tree_util.keystr(p)]) for p, _ in flat]
    return jax.tree_util.tree_unflatten(treedef, leaves)
