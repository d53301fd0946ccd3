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
metrics so far are written atomically to ``checkpoint.npz`` (:mod:`.checkpoint`). Timing
never depends on numerics, so ``--resume`` re-simulates the timeline (cheap) and restarts the
numerics from the checkpoint: the final ``param_hash`` is the one an uninterrupted run gives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np

from asyncsim import runs
from asyncsim._io import csv_text, write_parquet
from asyncsim._process import raise_if_interrupted
from asyncsim.config import Scenario
from asyncsim.drivers.checkpoint import CKPT, save_checkpoint, save_params
from asyncsim.drivers.metrics import (
    DIVERGED_FACTOR,
    Recorder,
    eval_record,
    first_diverged,
    never_learned,
    params_finite,
    update_means,
)
from asyncsim.drivers.result import RunResult
from asyncsim.numerics import compile_cache
from asyncsim.numerics.core import NUMERICS_REVISION, CoreState, param_hash
from asyncsim.numerics.lr_rules import rate_at_delay
from asyncsim.numerics.numerics import EvalRecord, Numerics, Row
from asyncsim.timing.protocols import timing_revision
from asyncsim.trace import Trace

CHECK_EVERY = 16  # updates between fetches of the batch losses (the divergence check)
# The rollback window of a divergence check holds at most this many bytes of core states.
WINDOW_BYTES = 256 << 20
# With run.checkpoint_every = 0, a run folder still gets a checkpoint once this many seconds
# of wall time have passed since the last one, so a long run killed at any moment loses at
# most about a minute of work.
AUTO_CHECKPOINT_SECONDS = 60.0


class Monitor(Protocol):
    """What a run measures besides its metrics (:mod:`asyncsim.stability.measure`: sharpness
    along the run, at its start and end). The Driver calls :meth:`observe` at version 0,
    every :attr:`every` updates (0: never in between) and after the last update, then
    :meth:`finish`, whose fields join ``summary.json`` (a monitor may also write files into
    ``driver.folder``, before the summary marks the folder complete). ``driver.state`` is
    the run's own: the next update takes over its momentum buffers (the update programs
    donate them), so a monitor that keeps a state copies it (``jax.tree_util.tree_map(
    np.array, state)``); after a divergence, the state rolled back to has given up its
    momentum already (its parameters are there)."""

    every: int

    def observe(self, driver: Driver, version: int) -> None: ...

    def finish(self, driver: Driver) -> dict[str, Any]: ...

    # Optional, for checkpoints (a resumed run keeps what was measured before them):
    # ``state() -> JSON-able`` and ``restore(state)``.


@dataclass
class Observer:
    """A :class:`Monitor` calling ``fn(version, state)``: a run's state at version 0, every
    ``every`` updates and after the last one (``fn`` copies what it keeps: see
    :class:`Monitor`)."""

    fn: Callable[[int, CoreState], Any]
    every: int = 1

    def observe(self, driver: Driver, version: int) -> None:
        self.fn(version, driver.state)

    def finish(self, driver: Driver) -> dict[str, Any]:
        return {}


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
        # The scenario as the folder records it, kept in every checkpoint (drivers.folder_scenario).
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
        # The states after the unchecked updates, for a rollback to their parameters (the
        # update after each took over its momentum).
        self._window: list[CoreState] = []
        self._state_at: Callable[[int], CoreState] | None = None  # or a chunk's recomputation
        self._checked = len(self.rec.losses)  # updates the divergence rule has seen
        # What a state in the window holds: all but its momentum, which the next update's
        # program took over (P2's shifted momentum would count lambda times the model).
        state_bytes = sum(int(np.prod(np.shape(x))) * 4
                          for x in jax.tree_util.tree_leaves(self.state._replace(momentum=())))
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
        trace, measured = self._final(trace)
        rec, final = self.rec, self.state
        evals = {k: [getattr(e, k) for e in rec.evals] for k in EvalRecord.__dataclass_fields__}
        n = min(len(rec.losses), trace.num_updates)
        upd = {k: v[:n] for k, v in trace.updates.items()}
        upd["train_loss"] = np.asarray(update_means(rec.losses[:n]), np.float64)
        summary = self._summary(trace, t0, kind, {**measured, **(extra or {})})
        if compare is not None:
            summary.update(compare(summary, final.params))
        if self.folder is not None:
            self._write_folder(trace, evals, upd, summary)
        return RunResult(trace, summary, evals, upd, final.params, self.folder)

    def _final(self, trace: Trace) -> tuple[Trace, dict[str, Any]]:
        """The final check, evaluation and observation: the trace up to the last applied
        update, and what the monitor measured."""
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
        return trace, measured

    def _summary(self, trace: Trace, t0: float, kind: str,
                 more: Mapping[str, Any]) -> dict[str, Any]:
        """``summary.json``'s fields (``more``: the monitor's and the caller's, last)."""
        num, final, last = self.num, self.state, self.rec.evals[-1]
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
            # judged on the test examples the evaluations used (run.eval_samples)
            "never_learned": never_learned([r.test_error for r in self.rec.evals],
                                           num.y_test[:self.scn.run.eval_samples],
                                           num.model.num_classes),
            "param_hash": param_hash(final.params),
            "numerics_revision": NUMERICS_REVISION,
            "wall_time": time.perf_counter() - t0,
            "stop_reason": trace.meta.get("stop_reason"),
            "grouping": num.grouping,
            "backend": jax.default_backend(),
            # The loop's numbers, bit for bit: a scan or vmapped replay says False.
            "exact": True,
            **self._rates(trace_figures["staleness_mean"]),
            **more,
        }
        if self.scn.run.eval_train:
            loss, err = num.evaluate(final.params, split="train")
            summary.update(final_train_error=float(err), final_train_set_loss=float(loss))
        return summary

    def _write_folder(self, trace: Trace, evals: dict[str, list], upd: dict[str, Any],
                      summary: dict[str, Any]) -> None:
        """Every output file, ``summary.json`` last and once; the checkpoint goes."""
        folder = self.folder
        runs.add_provenance(folder, compilation_cache=compile_cache.stats())
        trace.save(folder)
        runs.atomic_write_text(folder / "eval.csv", csv_text(evals))
        write_parquet(folder / "updates.parquet", upd)
        save_params(folder, self.state.params)
        runs.write_summary(folder, summary)
        ck = folder / CKPT
        if ck.exists():
            ck.unlink()  # a complete run needs no checkpoint; final params are kept
