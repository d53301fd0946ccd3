"""The parameter-server actor of a real run on Ray: the protocol, the core and the trace.

``asyncsim real SCENARIO`` runs the scenario's cluster for real (docs/design.md, "The one Driver"):

* every **learner** is a Ray actor holding its own
  :class:`~asyncsim.numerics.numerics.Numerics` (same model, same data set, same jitted
  gradient program); for its ``batch``-th gradient it computes
  ``num.grad(params, x_train, y_train, learner, batch)`` on the parameters it was sent;
* the **PS** is a Ray actor that owns the version counter, the core state and the trace. It
  *serves a pull* by sending the current parameters (an object-store reference, one per
  version) with the learner's next batch index, collects finished gradients with
  ``ray.wait`` in arrival order, and hands each arrival to the scenario's **unchanged**
  protocol object (:mod:`asyncsim.timing.protocols`) through a small stand-in for the SimPy
  simulation (:class:`~.clock.Clock`). When the protocol applies an update, the PS hands the
  gradients it took, in the protocol's order, to the one
  :class:`~asyncsim.drivers.driver.Driver`, which applies them with the update program of
  :meth:`Numerics.update`.

Because the gradients are computed by the identical jitted function on identical inputs, and
the update by the identical apply, ``asyncsim replay RUN_DIR`` of a real run reproduces its
``param_hash`` bit for bit (tested).

Protocols: ``async``, ``softsync`` (n), ``hardsync`` and ``ssp`` (s) are supported, plus any
plug-in protocol that uses only ``on_arrival``/``may_pull`` (not a custom ``start``).
``fixed-delay`` is P2's *serial* one-device emulation of delay, which has no meaning on a real
cluster: it is rejected with a ScenarioError.

Times: wall-clock seconds (``time.time()``) relative to the run's start, measured by the PS
(t_pull = the PS sent the weights, t_arrive = the PS saw the gradient, t_apply = the update
was applied) and by the learner (t_push = its gradient was ready; ``t_start``, an extra trace
column, = it started computing). Across machines a learner's clock may be skewed: t_push is
clamped into [t_pull, t_arrive] so the trace invariants hold.

Compute-time emulation: with ``emulate_compute=True`` (CLI: ``ASYNCSIM_REAL_EMULATE=1``) a
learner additionally sleeps a draw of ``cluster.compute`` (and ``cluster.speed``) from the
simulator's own per-learner stream, so heterogeneity can be emulated on a homogeneous
machine. Off by default: the default compute model (constant 1 s) would dominate.

Faults: learner actors have ``max_restarts=-1``; when one dies, its in-flight gradient is
lost (recorded in the ``restarts`` table, ``restarts.csv`` and ``trace_meta.json``) and the
PS re-sends the same batch index to the restarted actor, so program order is kept and no
gradient is applied twice. The PS checkpoints every ``run.checkpoint_every`` updates (0: by
wall time, as the online driver)
(``checkpoint.npz``: core state, the trace so far, restarts); ``asyncsim real --resume DIR``
restarts from it: updates applied before the checkpoint are kept, later ones (and any
gradient not yet applied) are recomputed, each learner restarting at its first unapplied
batch. Hardsync waits for live learners only (``Protocol.on_lost``/``on_back``): the round a
learner dies in, and the rounds while Ray restarts it (the PS probes it with ``ready``),
complete with the live learners' gradients (updates with ``n_grads < learners``, listed in
``trace_meta.json`` as ``short_rounds``); it rejoins at the next round start.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import ray  # the real driver is Ray's: this package is imported only for real runs

from asyncsim import runs
from asyncsim.config import Scenario
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.checkpoint import CKPT, checkpoint_trace, resume_from
from asyncsim.drivers.driver import Driver
from asyncsim.drivers.plugins import install_plugins
from asyncsim.drivers.real.clock import Clock
from asyncsim.timing.protocols import Protocol, make_protocol
from asyncsim.trace import RESTARTS_FILE, Trace

__all__ = ["PSHost", "PSImpl"]


_GCOLS = ("learner", "batch", "read_version", "apply_version", "staleness", "t_pull",
          "t_push", "t_arrive", "t_apply", "t_start")
_UCOLS = ("version", "time", "n_grads", "start")


class PSImpl:
    """The parameter server: protocol, update core, trace, evaluations, checkpoints.

    Args:
        scn: the scenario. folder: the run folder (must be visible to this process).
        learners: the learner actor handles, index = learner id.
        resume: restart from ``folder/checkpoint.npz`` when it exists.
        record: the scenario as the folder records it (:mod:`asyncsim.drivers.folder_scenario`,
            computed by the driver), kept in every checkpoint.
        faults: fault injection for tests and demos: ``{"kill_learner": [id, version]}``
            (the learner's process exits inside the first gradient it computes from a pull
            at that version or later, before returning it; Ray restarts the actor) and
            ``{"crash_ps_at": N}`` (the PS process exits right after update N and its
            checkpoint, like a crash).
    """

    def __init__(self, scn: Scenario, folder: str | None, learners: list, jobs: list, *,
                 resume: bool = False, faults: dict | None = None,
                 record: dict[str, Any] | None = None):
        self.scn = scn
        self.folder = Path(folder) if folder else None
        self.learners = learners
        self.jobs = jobs  # per learner: the object ref of its job description
        self.faults = dict(faults or {})
        self.num = num = numerics_for(scn, grouping="none")
        lam = scn.cluster.learners
        self.g: dict[str, list] = {k: [] for k in _GCOLS}
        self.u: dict[str, list] = {k: [] for k in _UCOLS}
        self.restarts: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self.t_offset = 0.0
        start = None
        if resume and self.folder is not None and (self.folder / CKPT).exists():
            # real_run checked it against the folder's scenario (there, its refusal is one
            # line; raised here, Ray would wrap it in a traceback).
            start = resume_from(self.folder, scn, num, check=False)
            extra = start[4]
            for k in _GCOLS:
                self.g[k] = list(extra["trace"]["grads"][k])
            for k in _UCOLS:
                self.u[k] = list(extra["trace"]["updates"][k])
            self.restarts = list(extra.get("restarts", []))
            self.resumes = list(extra.get("resumes", []))
            self.t_offset = float(self.u["time"][-1]) if self.u["time"] else 0.0
            self.resumes.append({"version": int(start[0]), "t": self.t_offset})
        self.driver = _RealDriver(scn, num, folder=self.folder, start=start, versions=False,
                                  record=record)
        self.driver.ps = self
        self.proto = make_protocol(scn.protocol, lam)
        self.clock = Clock(self._apply_update)
        self.next_batch = [0] * lam
        if start is not None:
            self._warm_protocol()
        self.clock.version = self.driver.start_version
        self.pending: dict[tuple[int, int], tuple] = {}  # (learner, batch) -> (loss, grads)
        # (learner, batch) -> (read version, its parameters): kept under compensation only,
        # the most distinct versions held at once reported (ps_versions_held).
        self.served: dict[tuple[int, int], tuple] = {}
        self.versions_held = 0
        self.stop_reason = ""
        self.stopped = False
        # Compile the update program for this protocol's update size now, not during the
        # first update; on a copy of the state, whose momentum the program takes over.
        c = max(1, round(1.0 / self.proto.updates_per_gradient()))
        g0 = jax.tree_util.tree_map(lambda p: np.zeros(np.shape(p), np.float32),
                                    self.driver.state.params)
        spare = jax.tree_util.tree_map(jnp.copy, self.driver.state)
        jax.block_until_ready(num.apply_given(spare, 0, [(0, 0, 0, 0)] * c,
                                              [g0] * c, {0: self.driver.state.params}))
        self._params_ref: tuple[int, Any] | None = None

    # -------------------------------------------------------------- bookkeeping
    def _warm_protocol(self) -> None:
        """Re-feed the checkpointed (applied) gradients to a fresh protocol, updates muted,
        so its buffers/clocks match the checkpoint; learners restart at their next batch."""

        muted = Clock(lambda grads: setattr(muted, "version", muted.version + 1))
        g, u = self.g, self.u
        lam = len(self.next_batch)
        # A short hardsync round (a learner died, see run()) is replayed as the same
        # on_lost calls, so the protocol's round bookkeeping matches the checkpoint too.
        lost_hook = (type(self.proto).on_lost is not Protocol.on_lost
                     and round(1.0 / self.proto.updates_per_gradient()) == lam)
        firsts = {int(st): int(n) for st, n in zip(u["start"], u["n_grads"], strict=True)}
        for i in range(len(g["learner"])):
            if lost_hook and firsts.get(i, lam) < lam:
                present = {int(x) for x in g["learner"][i:i + firsts[i]]}
                for k in range(lam):
                    if k not in present and self.proto.on_lost(muted, k):
                        self.proto.on_back(muted, k)  # (all actors are fresh after a resume)
            k = int(g["learner"][i])
            self.proto.on_arrival(muted, (k, int(g["batch"][i]), int(g["read_version"][i]),
                                          g["t_pull"][i], g["t_push"][i], g["t_arrive"][i]))
            self.next_batch[k] = max(self.next_batch[k], int(g["batch"][i]) + 1)

    def now(self) -> float:
        return self.t_offset + (time.time() - self.t0)

    def _params(self):
        """An object-store reference to the current version's parameters (one per version)."""

        v = self.clock.version
        if self._params_ref is None or self._params_ref[0] != v:
            self._params_ref = (v, ray.put(jax.device_get(self.driver.state.params)))
        return self._params_ref[1]

    # -------------------------------------------------------------- pulls and pushes
    def _pull(self, k: int) -> None:
        """Learner ``k`` asks for its next batch: wait if the protocol says so, else serve."""
        if self.stopped:
            return
        ev = self.proto.may_pull(self.clock, k, self.next_batch[k])
        if ev is not None and not ev.triggered:
            ev.callbacks.append(lambda: self._serve(k))
        else:
            self._serve(k)

    def _probe(self, k: int) -> None:
        """Ask lost learner ``k``'s actor to get ready: it answers once Ray restarted it."""
        if not self.stopped:
            self.probes[self.learners[k].ready.remote(self.jobs[k])] = k

    def _probed(self, ref) -> None:
        k = self.probes.pop(ref)
        try:
            pid = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            self.reprobe[k] = time.monotonic() + 0.5  # still restarting: ask again soon
            return
        if self.pids.get(k, pid) != pid:
            self.restarts.append({"event": "restarted", "learner": k,
                                  "batch": self.next_batch[k], "read_version": -1,
                                  "t_pull": float("nan"), "t": self.now(),
                                  "version": self.clock.version, "error": ""})
        self.pids[k] = pid
        self.rejoining.add(k)
        self.proto.on_back(self.clock, k)
        self._pull(k)

    def _serve(self, k: int) -> None:
        if self.stopped:
            return
        b = self.next_batch[k]
        read = self.clock.version
        t_pull = self.now()
        if k in self.rejoining:
            self.rejoining.discard(k)
            self.restarts.append({"event": "rejoined", "learner": k, "batch": b,
                                  "read_version": read, "t_pull": t_pull, "t": t_pull,
                                  "version": read, "error": ""})
        kill = self.faults.get("kill_learner")
        die = kill is not None and kill[0] == k and read >= kill[1]
        if die:
            del self.faults["kill_learner"]
        ref = self.learners[k].compute.remote(self.jobs[k], self._params(), b, die)
        self.inflight[ref] = (k, b, read, t_pull)
        if self.num.compensates:  # delay compensation reads the version served
            self.served[(k, b)] = (read, self.driver.state.params)
            held = len({r for r, _ in self.served.values()})
            self.versions_held = max(self.versions_held, held)

    def _apply_update(self, grads: list[tuple]) -> None:
        """The protocol's ``apply_update``: stack the taken gradients in order, apply, record."""

        if self.stopped:
            return
        v = self.clock.version
        rows, gs, losses, reads = [], [], [], {}
        for learner, batch, read, *_ in grads:
            loss, gr = self.pending.pop((learner, batch))
            rows.append((learner, batch, read, v - read))
            if self.num.compensates:
                r, params = self.served.pop((learner, batch))
                reads[r] = params
            gs.append(gr)
            losses.append(loss)
        # The learners computed these with the same gradient program, in the order the
        # protocol took them: what a replay of this trace computes itself, and the driver
        # applies them with the same update program (Numerics.apply_given).
        now_apply = self.now()
        g = self.g
        start = len(g["learner"])
        for (learner, batch, read, t_pull, t_push, t_arrive), row in zip(grads, rows,
                                                                         strict=True):
            t_start = self._t_start.pop((learner, batch))
            g["learner"].append(learner)
            g["batch"].append(batch)
            g["read_version"].append(read)
            g["apply_version"].append(v)
            g["staleness"].append(row[3])
            g["t_pull"].append(t_pull)
            g["t_push"].append(t_push)
            g["t_arrive"].append(t_arrive)
            g["t_apply"].append(now_apply)
            g["t_start"].append(t_start)
        self.u["version"].append(v)
        self.u["time"].append(now_apply)
        self.u["n_grads"].append(len(rows))
        self.u["start"].append(start)
        self.clock.version = v + 1
        # After the trace rows: a checkpoint the driver writes holds this update's.
        state = self.num.apply_given(self.driver.state, v, rows, gs, reads)
        ok = self.driver.applied(v, len(rows), state, np.asarray(losses, np.float32),
                                 now=now_apply)
        if ok is False:
            self._stop("diverged")
        else:
            self._stop_at_limit()
        if self.faults.get("crash_ps_at") == v + 1:
            os._exit(1)

    def _stop(self, reason: str) -> None:
        self.stopped = True
        self.stop_reason = reason

    def _stop_at_limit(self) -> None:
        """Stop if the run's length (``run.updates`` or ``run.gradients``) is reached."""
        if self.max_updates is not None and self.clock.version >= self.max_updates:
            self._stop("updates")
        elif self.max_gradients is not None and len(self.g["learner"]) >= self.max_gradients:
            self._stop("gradients")

    # -------------------------------------------------------------- the loop
    def run(self, limits: dict[str, Any], info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run to the scenario's length; write the run folder; return the summary."""
        self.max_updates = limits.get("max_updates")
        self.max_gradients = limits.get("max_gradients")
        self._t_start: dict[tuple[int, int], float] = {}
        self.inflight: dict[Any, tuple] = {}
        self.pids: dict[int, int] = {}
        self.probes: dict[Any, int] = {}  # ready() calls to lost learners -> learner
        self.reprobe: dict[int, float] = {}  # learner -> when to probe it again
        self.rejoining: set[int] = set()
        t_wall = time.perf_counter()
        self.t0 = time.time()
        self._stop_at_limit()  # a resume from a checkpoint taken at the very end
        for k in range(len(self.learners)):
            self._pull(k)
        self._loop(limits.get("max_time"))
        for ref in [*self.inflight, *self.probes]:
            ray.cancel(ref, force=False)
        return self._finish(t_wall, info)

    def _loop(self, max_time: float | None) -> None:
        """The PS's event loop over Ray futures: gradients arriving, learners lost and
        probed until Ray restarted them, until the run stops or nothing is left to wait for."""
        while not self.stopped and (self.inflight or self.probes or self.reprobe):
            for k in [k for k, t in self.reprobe.items() if t <= time.monotonic()]:
                del self.reprobe[k]
                self._probe(k)
            ready, _ = ray.wait([*self.inflight, *self.probes], num_returns=1,
                                timeout=0.25 if self.reprobe else 1.0)
            if max_time is not None and self.now() >= max_time:
                self._stop("sim_time")
                break
            for ref in ready:
                if ref in self.probes:
                    self._probed(ref)
                elif self._collect(ref):
                    break

    def _collect(self, ref) -> bool:
        """A learner's gradient came back (or its actor died): hand it to the protocol and
        let the learner pull again. True when this arrival stopped the run."""
        k, b, read, t_pull = self.inflight.pop(ref)
        try:
            loss, grads, t_start, t_push, pid = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
            self._lost(k, b, read, t_pull, e)
            return False
        t_arrive = self.now()
        if self.pids.get(k, pid) != pid:
            # A new process answered: the actor was restarted (by Ray) in between.
            self.restarts.append({"event": "restarted", "learner": k, "batch": b,
                                  "read_version": read, "t_pull": t_pull,
                                  "t": t_arrive, "version": self.clock.version,
                                  "error": ""})
        self.pids[k] = pid
        # Learner clocks may be skewed (other machines): keep pull <= push <= arrive.
        t_push = min(max(t_push - self.t0 + self.t_offset, t_pull), t_arrive)
        t_start = min(max(t_start - self.t0 + self.t_offset, t_pull), t_push)
        self.pending[(k, b)] = (loss, grads)
        self._t_start[(k, b)] = t_start
        self.next_batch[k] = b + 1
        self.proto.on_arrival(self.clock, (k, b, read, t_pull, t_push, t_arrive))
        if self.stopped:
            return True
        self._pull(k)
        return False

    def _lost(self, k: int, b: int, read: int, t_pull: float, e: Exception) -> None:
        """Learner ``k`` died: its pulled version and in-flight work are lost. The restarted
        actor gets the same batch index again (program order kept)."""
        ev = {"learner": k, "batch": b, "read_version": read, "t_pull": t_pull,
              "t": self.now(), "version": self.clock.version, "error": type(e).__name__}
        self.restarts.append({"event": "lost", **ev})
        self.served.pop((k, b), None)  # its version is no longer read
        if self.proto.on_lost(self.clock, k):
            # hardsync: rounds go on with the live learners from this one on (it may have
            # been applied just now) until the restarted actor answers a probe; k then
            # pulls again and rejoins at the next round.
            self.restarts.append({"event": "away", **ev})
            self._probe(k)
        else:
            self._serve(k)

    # -------------------------------------------------------------- the end
    def _short_rounds(self, applied: int) -> list[int]:
        """The hardsync rounds among the first ``applied`` updates completed without a lost
        learner (none unless one was away)."""
        lam = len(self.learners)
        if not (any(r["event"] == "away" for r in self.restarts)
                and round(1.0 / self.proto.updates_per_gradient()) == lam):
            return []
        return [v for v, n in zip(self.u["version"][:applied], self.u["n_grads"][:applied],
                                  strict=True) if n < lam]

    def _write_restarts(self) -> None:
        """``restarts.csv``: every learner lost, away, restarted or rejoined."""
        # Here: the PS's process would otherwise import pandas at its start (a run never
        # imports it: docs/design.md).
        import pandas as pd

        cols = ["event", "learner", "batch", "read_version", "t_pull", "t", "version", "error"]
        runs.atomic_write_text(self.folder / RESTARTS_FILE,
                               pd.DataFrame(self.restarts, columns=cols).to_csv(index=False))

    def _finish(self, t_wall: float, info: dict[str, Any] | None) -> dict[str, Any]:
        """The trace the PS saw, ``restarts.csv`` and the driver's output files; the
        summary."""
        wall = time.perf_counter() - t_wall
        applied = self.driver.stopped_at if self.driver.check() is False else len(self.u["version"])
        short = self._short_rounds(applied)
        meta = {"stop_reason": self.stop_reason or "stopped", "sim_time": self.now(),
                "learners": len(self.learners), "protocol": self.scn.protocol.kind,
                "seed": self.scn.seed, "kind": "real", "clock": "wall seconds",
                "restarts": self.restarts, "resumes": self.resumes, **(info or {})}
        if short:
            # Hardsync rounds completed without a dead learner (check_trace accepts them).
            meta.update({"short_rounds_allowed": True, "short_rounds": [int(v) for v in short]})
        trace = Trace.from_columns(self.g, self.u, meta)
        if self.folder is not None:
            self._write_restarts()
        # The PS's own figures go into the one summary the driver writes (last, so a folder
        # with summary.json is complete). updates_per_s counts every update the PS applied,
        # those after a divergence (rolled back) included: it measures the PS's throughput.
        new = len(self.u["version"]) - self.driver.start_version
        extra = {"restarts": sum(r["event"] == "restarted" for r in self.restarts),
                 "lost_gradients": sum(r["event"] == "lost" for r in self.restarts),
                 "short_rounds": len(short),
                 "resumes": len(self.resumes),
                 "real_wall_time": wall, "updates_per_s": new / wall if wall else None,
                 **({"ps_versions_held": self.versions_held,
                     "ps_version_bytes": self.versions_held * 4 * sum(
                         int(np.size(a)) for a in jax.tree_util.tree_leaves(
                             self.driver.state.params))} if self.num.compensates else {}),
                 **(info or {})}
        summary = self.driver.finish(trace, t_wall, kind="real", extra=extra).summary
        return {"summary": summary, "param_hash": summary["param_hash"]}

    def progress(self) -> int:
        return self.clock.version


class _RealDriver(Driver):
    """The :class:`~asyncsim.drivers.driver.Driver` of the PS: its checkpoints also hold the
    trace so far and the restarts (``ps``: the :class:`PSImpl`)."""

    ps: PSImpl

    def checkpoint_extra(self, done: int) -> dict[str, Any]:
        ps = self.ps
        trace = {"grads": {k: [_py(x) for x in ps.g[k]] for k in _GCOLS},
                 "updates": {k: [_py(x) for x in ps.u[k]] for k in _UCOLS}}
        # The trace so far, with its hash: a resume checks one against the other.
        return {**super().checkpoint_extra(done), "trace": trace,
                "trace_hash": checkpoint_trace(trace).hash(), "restarts": ps.restarts,
                "resumes": ps.resumes}


def _py(x):
    return x.item() if isinstance(x, np.generic) else x


class PSHost:
    """The PS actor: runs one :class:`PSImpl` per call of :meth:`run` (reusable)."""

    def __init__(self):
        self.ps: PSImpl | None = None

    def run(self, scn, folder, learners, jobs, resume, faults, limits, info, plugins=None,
            record=None):
        install_plugins(plugins)  # the driver's Python-registered plug-ins
        self.ps = PSImpl(scn, folder, learners, jobs, resume=resume, faults=faults,
                         record=record)
        try:
            return self.ps.run(limits, info)
        finally:
            self.ps = None

    def progress(self) -> int:
        return -1 if self.ps is None or not hasattr(self.ps, "t0") else self.ps.clock.version
