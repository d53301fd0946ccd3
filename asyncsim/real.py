"""Real distributed runs on Ray: learner actors, a parameter-server actor, the same numerics.

``asyncsim real SCENARIO`` runs the scenario's cluster for real (DESIGN.md, "real" driver):

* every **learner** is a Ray actor holding its own :class:`~asyncsim.engine.Numerics` (same
  model, same data set, same jitted ``_grad_one``); for its ``batch``-th gradient it computes
  ``_grad_one(params, x_train, y_train, learner, batch)`` on the parameters it was sent;
* the **PS** is a Ray actor that owns the version counter, the core state and the trace. It
  *serves a pull* by sending the current parameters (an object-store reference, one per
  version) with the learner's next batch index, collects finished gradients with
  ``ray.wait`` in arrival order, and hands each arrival to the scenario's **unchanged**
  protocol object (:mod:`asyncsim.protocols`) through a small stand-in for the SimPy
  simulation (:class:`_Clock`). When the protocol applies an update, the PS stacks the
  gradients it took, in the protocol's order, and calls the same jitted apply as
  :meth:`Numerics.update` (``num._apply(state, grads, staleness, learners, version)``).

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
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from asyncsim import runs
from asyncsim.config import Scenario
from asyncsim.errors import ScenarioError
from asyncsim.online import Driver

# XLA's CPU backend sizes its intra-op thread pool from OMP_NUM_THREADS / the CPU count, and
# the partition of a dot product, hence its last bits, depends on that size (measured: one
# thread vs two give gradients 1 ulp apart). Ray sets OMP_NUM_THREADS=1 in its workers, so
# actors are given the thread count of a plain process on the driver's machine: then
# `asyncsim replay` there reproduces the run bit for bit. threads=1 (less oversubscription)
# needs the replay run with OMP_NUM_THREADS=1 too; the run records its choice.
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
RESTARTS = "restarts.csv"
CKPT = "checkpoint.npz"


class RealRunError(RuntimeError):
    """A real run stopped before its end (e.g. the PS died); the folder can be resumed."""


# ----------------------------------------------------------------------------- Ray setup
def ensure_ray(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Connect to Ray once: a local instance by default, ``address`` to join a cluster."""
    import ray

    if ray.is_initialized():
        return
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                          "ignore_reinit_error": True}
    with warnings.catch_warnings():
        # Ray starts its processes with subprocess (fork immediately followed by exec, no
        # Python in the child), which trips JAX's warning about forking a multithreaded
        # process; that warning is about fork without exec, so it does not apply here.
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                category=RuntimeWarning)
        if address:
            ray.init(address=address, **kw)
        else:
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, **kw)


def check_supported(scn: Scenario) -> None:
    """Raise ScenarioError for a protocol a real run cannot execute."""
    from asyncsim.protocols import Protocol, get_protocol_class

    cls = get_protocol_class(scn.protocol.kind)
    if scn.protocol.kind == "fixed-delay" or cls.start is not Protocol.start:
        raise ScenarioError("protocol.kind", f"{scn.protocol.kind!r} schedules workers itself "
                            "(a serial emulation); real runs support async, softsync, "
                            "hardsync, ssp and plug-ins that only use on_arrival/may_pull")


# ----------------------------------------------------------------------------- learner
class LearnerImpl:
    """One learner process: computes gradients with the scenario's Numerics.

    Reusable across runs (a test session or a benchmark keeps the actors, and the jitted
    gradient compiled once): every call names its job, ``(job_id, scenario, learner,
    emulate, plug-ins)`` (an object-store reference resolved by Ray), and the actor (re)builds its
    Numerics when the job changes; a restarted actor rebuilds lazily on its first call.

    ``compute`` returns ``(loss, grads, t_start, t_push, pid)`` with numpy leaves and
    ``time.time()`` stamps; the gradient is ``Numerics._grad_one`` exactly. The pid lets the
    PS notice a restarted actor.
    """

    def __init__(self):
        self.job_id = None

    def _setup(self, job) -> None:
        from asyncsim.engine import Numerics

        job_id, scn, learner, emulate, plugins = job
        install_plugins(plugins)  # the driver's Python-registered plug-ins
        self.learner = learner
        self.num = Numerics(scn, grouping="none")
        self.sleep = None
        if emulate:
            from asyncsim.cluster import Simulation
            from asyncsim.scenario import base_dir

            # The simulator's own compute stream for this learner (same seed, same draws).
            self.sleep = Simulation(scn, base_dir=base_dir(scn)).compute[learner]
        self.job_id = job_id

    def ready(self, job) -> int:
        """Set up and warm up (compile) the gradient function; returns the process id."""
        import jax

        self._setup(job)
        p = self.num.init_params()
        jax.block_until_ready(self.num._grad_one(p, self.num.x_train, self.num.y_train,
                                                 np.int32(self.learner), np.int32(0)))
        return os.getpid()

    def compute(self, job, params, batch: int, die: bool = False):
        import jax

        if self.job_id != job[0]:
            self._setup(job)
        t_start = time.time()
        loss, g = self.num._grad_one(params, self.num.x_train, self.num.y_train,
                                     np.int32(self.learner), np.int32(batch))
        loss, g = jax.device_get((loss, g))
        if die:
            # Fault injection: the process dies with this gradient computed but not sent,
            # so the loss always falls on this task (a kill from outside could land after
            # a fast gradient was already returned, or while the learner waits idle).
            os._exit(1)
        if self.sleep is not None:
            time.sleep(self.sleep.next(0.0))
        return np.asarray(loss), g, t_start, time.time(), os.getpid()


# ----------------------------------------------------------------------------- PS
class _Event:
    """Stand-in for a SimPy event: protocols only create, ``succeed`` and test it."""

    __slots__ = ("callbacks", "triggered")

    def __init__(self):
        self.callbacks: list[Callable[[], None]] = []
        self.triggered = False

    def succeed(self):
        self.triggered = True
        cbs, self.callbacks = self.callbacks, []
        for cb in cbs:
            cb()


class _Env:
    def event(self):
        return _Event()


class _Clock:
    """The part of :class:`asyncsim.cluster.Simulation` protocols use: ``version``,
    ``env.event()``, ``apply_update(grads)``."""

    def __init__(self, apply: Callable[[Sequence[tuple]], None]):
        self.env = _Env()
        self.version = 0
        self._apply = apply

    def apply_update(self, grads):
        self._apply(list(grads))

    def note_pull(self, learner, version):  # hardsync/ssp never need it; kept for plug-ins
        pass


_GCOLS = ("learner", "batch", "read_version", "apply_version", "staleness", "t_pull",
          "t_push", "t_arrive", "t_apply", "t_start")
_UCOLS = ("version", "time", "n_grads", "start")


class PSImpl:
    """The parameter server: protocol, update core, trace, evaluations, checkpoints.

    Args:
        scn: the scenario. folder: the run folder (must be visible to this process).
        learners: the learner actor handles, index = learner id.
        resume: restart from ``folder/checkpoint.npz`` when it exists.
        faults: fault injection for tests and demos: ``{"kill_learner": [id, version]}``
            (the learner's process exits inside the first gradient it computes from a pull
            at that version or later, before returning it; Ray restarts the actor) and
            ``{"crash_ps_at": N}`` (the PS process exits right after update N and its
            checkpoint, like a crash).
    """

    def __init__(self, scn: Scenario, folder: str | None, learners: list, jobs: list, *,
                 resume: bool = False, faults: dict | None = None):
        import jax

        from asyncsim.engine import Numerics
        from asyncsim.online import load_checkpoint
        from asyncsim.protocols import get_protocol_class

        self.scn = scn
        self.folder = Path(folder) if folder else None
        self.learners = learners
        self.jobs = jobs  # per learner: the object ref of its job description
        self.faults = dict(faults or {})
        self.num = num = Numerics(scn, grouping="none")
        lam = scn.cluster.learners
        self.g: dict[str, list] = {k: [] for k in _GCOLS}
        self.u: dict[str, list] = {k: [] for k in _UCOLS}
        self.restarts: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        self.t_offset = 0.0
        start = None
        if resume and self.folder is not None and (self.folder / CKPT).exists():
            template = num.init_state()
            start = load_checkpoint(self.folder, template, template.params)
            extra = start[4]
            for k in _GCOLS:
                self.g[k] = list(extra["trace"]["grads"][k])
            for k in _UCOLS:
                self.u[k] = list(extra["trace"]["updates"][k])
            self.restarts = list(extra.get("restarts", []))
            self.resumes = list(extra.get("resumes", []))
            self.t_offset = float(self.u["time"][-1]) if self.u["time"] else 0.0
            self.resumes.append({"version": int(start[0]), "t": self.t_offset})
        self.driver = _RealDriver(scn, num, folder=self.folder, start=start, ps=self)
        self.proto = get_protocol_class(scn.protocol.kind)(scn.protocol, lam)
        self.clock = _Clock(self._apply_update)
        self.next_batch = [0] * lam
        if start is not None:
            self._warm_protocol()
        self.clock.version = self.driver.start_version
        self.pending: dict[tuple[int, int], tuple] = {}  # (learner, batch) -> (loss, grads)
        self.stop_reason = ""
        self.stopped = False
        # Compile the apply for this protocol's update size now, not during the first update.
        c = max(1, round(1.0 / self.proto.updates_per_gradient()))
        g0 = jax.tree_util.tree_map(lambda p: np.zeros((c, *np.shape(p)), np.float32),
                                    self.driver.state.params)
        jax.block_until_ready(num._apply(self.driver.state, g0, np.zeros(c, np.int32),
                                         np.zeros(c, np.int32), np.int32(0)))
        self._params_ref: tuple[int, Any] | None = None

    # -------------------------------------------------------------- bookkeeping
    def _warm_protocol(self) -> None:
        """Re-feed the checkpointed (applied) gradients to a fresh protocol, updates muted,
        so its buffers/clocks match the checkpoint; learners restart at their next batch."""
        from asyncsim.protocols import Protocol

        muted = _Clock(lambda grads: setattr(muted, "version", muted.version + 1))
        g, u = self.g, self.u
        lam = len(self.next_batch)
        # A short hardsync round (a learner died, see run()) is replayed as the same
        # on_lost calls, so the protocol's round bookkeeping matches the checkpoint too.
        lost_hook = type(self.proto).on_lost is not Protocol.on_lost
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
        import jax
        import ray

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
        import ray

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

    def _apply_update(self, grads: list[tuple]) -> None:
        """The protocol's ``apply_update``: stack the taken gradients in order, apply, record."""
        import jax

        if self.stopped:
            return
        v = self.clock.version
        rows, gs, losses = [], [], []
        for learner, batch, read, *_ in grads:
            loss, gr = self.pending.pop((learner, batch))
            rows.append((learner, batch, read, v - read))
            gs.append(gr)
            losses.append(loss)
        # The learners computed these with the same jitted gradient function, in the order
        # the protocol took them: the apply input a replay of this trace computes itself.
        stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *gs)
        ok = self.driver.apply_real(v, rows, stacked, np.asarray(losses, np.float32),
                                    now_fn=self.now)
        now_apply = self.driver.now
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
        self.driver.after_update(v + 1)
        if ok is False:
            self._stop("diverged")
        elif self.max_updates is not None and v + 1 >= self.max_updates:
            self._stop("updates")
        elif self.max_gradients is not None and len(self.g["learner"]) >= self.max_gradients:
            self._stop("gradients")
        if self.faults.get("crash_ps_at") == v + 1:
            os._exit(1)

    def _stop(self, reason: str) -> None:
        self.stopped = True
        self.stop_reason = reason

    # -------------------------------------------------------------- the loop
    def run(self, limits: dict[str, Any], info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run to the scenario's length; write the run folder; return the summary."""
        import ray

        from asyncsim.trace import Trace

        self.max_updates = limits.get("max_updates")
        self.max_gradients = limits.get("max_gradients")
        max_time = limits.get("max_time")
        self._t_start: dict[tuple[int, int], float] = {}
        self.inflight: dict[Any, tuple] = {}
        self.pids: dict[int, int] = {}
        self.probes: dict[Any, int] = {}  # ready() calls to lost learners -> learner
        self.reprobe: dict[int, float] = {}  # learner -> when to probe it again
        self.rejoining: set[int] = set()
        t_wall = time.perf_counter()
        self.t0 = time.time()
        # A resume from a checkpoint taken at the very end has nothing left to do.
        if self.max_updates is not None and self.clock.version >= self.max_updates:
            self._stop("updates")
        elif self.max_gradients is not None and len(self.g["learner"]) >= self.max_gradients:
            self._stop("gradients")
        for k in range(len(self.learners)):
            self._pull(k)
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
                    continue
                k, b, read, t_pull = self.inflight.pop(ref)
                try:
                    loss, grads, t_start, t_push, pid = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                    # The learner died: its pulled version and in-flight work are lost. The
                    # restarted actor gets the same batch index again (program order kept).
                    ev = {"learner": k, "batch": b, "read_version": read, "t_pull": t_pull,
                          "t": self.now(), "version": self.clock.version,
                          "error": type(e).__name__}
                    self.restarts.append({"event": "lost", **ev})
                    if self.proto.on_lost(self.clock, k):
                        # hardsync: rounds go on with the live learners from this one on (it
                        # may have been applied just now) until the restarted actor answers
                        # a probe; k then pulls again and rejoins at the next round.
                        self.restarts.append({"event": "away", **ev})
                        self._probe(k)
                    else:
                        self._serve(k)
                    continue
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
                    break
                self._pull(k)
        for ref in [*self.inflight, *self.probes]:
            ray.cancel(ref, force=False)
        wall = time.perf_counter() - t_wall
        lam = len(self.learners)
        short = ([v for v, n in zip(self.u["version"], self.u["n_grads"], strict=True)
                  if n < lam] if any(r["event"] == "away" for r in self.restarts) else [])
        meta = {"stop_reason": self.stop_reason or "stopped", "sim_time": self.now(),
                "learners": len(self.learners), "protocol": self.scn.protocol.kind,
                "seed": self.scn.seed, "kind": "real", "clock": "wall seconds",
                "restarts": self.restarts, "resumes": self.resumes, **(info or {})}
        if short:
            # Hardsync rounds completed without a dead learner (check_trace accepts them).
            meta.update({"short_rounds_allowed": True, "short_rounds": [int(v) for v in short]})
        trace = Trace.from_columns(self.g, self.u, meta)
        res = self.driver.finish(trace, t_wall, kind="real")
        summary = dict(res.summary)
        new = trace.num_updates - self.driver.start_version
        summary.update({"restarts": sum(r["event"] == "restarted" for r in self.restarts),
                        "lost_gradients": sum(r["event"] == "lost" for r in self.restarts),
                        "short_rounds": len(short),
                        "resumes": len(self.resumes),
                        "real_wall_time": wall, "updates_per_s": new / wall if wall else None,
                        **(info or {})})
        if self.folder is not None:
            import pandas as pd

            cols = ["event", "learner", "batch", "read_version", "t_pull", "t", "version",
                    "error"]
            runs.atomic_write_text(self.folder / RESTARTS,
                                   pd.DataFrame(self.restarts, columns=cols).to_csv(index=False))
            runs.write_summary(self.folder, summary)
        return {"summary": summary, "param_hash": summary["param_hash"]}

    def progress(self) -> int:
        return self.clock.version


class _RealDriver(Driver):
    """:class:`asyncsim.online.Driver` fed with gradients computed elsewhere.

    Keeps the Driver's recorder, evaluation, divergence check and ``finish`` (so every file
    has exactly the simulated runs' format); checkpoints also hold the trace so far.
    """

    def __init__(self, scn, num, *, folder, start, ps):
        super().__init__(scn, num, folder=folder, start=start)
        self.ps = ps
        self.versions = {}  # the PS serves only the current version; learners keep copies

    def apply_real(self, v: int, rows, grads, losses, *, now_fn) -> bool | None:
        """Apply update ``v`` exactly as :meth:`Numerics.update` would, with given gradients."""
        from asyncsim.online import CHECK_EVERY

        num = self.num
        self.grads_applied += len(rows)
        staleness = np.asarray([r[3] for r in rows], np.int32)
        learners = np.asarray([r[0] for r in rows], np.int32)
        self.state = num._apply(self.state, grads, staleness, learners, np.int32(v))
        self.now = now_fn()
        rec = self.rec
        rec.pending.append(losses)
        if len(rec.pending) >= CHECK_EVERY:
            bad = rec.flush()
            if bad is not None:
                self.diverged_at = bad
                return False
        done = v + 1
        r = self.scn.run
        if r.eval_every and done % r.eval_every == 0:
            self.evaluate(done)
            if self.diverged_at is not None:
                return False
        return None

    def after_update(self, done: int) -> None:
        """Checkpoint (after the PS recorded update ``done - 1`` in its trace)."""
        from asyncsim import online
        from asyncsim.online import save_checkpoint

        r = self.scn.run
        # As the online driver: every run.checkpoint_every updates, or (when that is 0)
        # once online.AUTO_CHECKPOINT_SECONDS of wall time have passed since the last one.
        due = (done % r.checkpoint_every == 0 if r.checkpoint_every else
               time.monotonic() - getattr(self, "_last_ckpt", time.monotonic())
               > getattr(online, "AUTO_CHECKPOINT_SECONDS", float("inf")))
        if self.folder is not None and due:
            self._last_ckpt = time.monotonic()
            self.rec.flush()
            ps = self.ps
            trace = {"grads": {k: [_py(x) for x in ps.g[k]] for k in _GCOLS},
                     "updates": {k: [_py(x) for x in ps.u[k]] for k in _UCOLS}}
            save_checkpoint(self.folder, done, self.state, {done: self.state.params}, self.rec,
                            {"grads_applied": self.grads_applied, "trace": trace,
                             "restarts": ps.restarts, "resumes": ps.resumes})


def _py(x):
    return x.item() if isinstance(x, np.generic) else x


# ----------------------------------------------------------------------------- driver side
def default_threads() -> int:
    """The intra-op threads of a plain process here (what ``asyncsim replay`` will use)."""
    env = os.environ.get("OMP_NUM_THREADS")
    return int(env) if env and env.isdigit() else (os.cpu_count() or 1)


def _actor_options(threads: int) -> dict[str, Any]:
    env = {"OMP_NUM_THREADS": str(threads)}
    if threads == 1:
        env["XLA_FLAGS"] = SINGLE_THREAD_XLA
    # A persistent compile cache, when the user has one: a restarted learner then loads its
    # gradient function instead of compiling it again.
    for k in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    return {"runtime_env": {"env_vars": env}}


def pack_plugins(scenarios: list[Scenario]) -> bytes | None:
    """The plug-ins ``scenarios`` use that were registered in this process, pickled for a Ray
    actor or task (:func:`asyncsim._plugins.python_registrations`); None if there are none.

    Pickled by value, module included: a rule defined in a script's helper module, a notebook
    or a test file need not be importable where the actor runs.
    """
    from ray import cloudpickle

    from asyncsim._plugins import python_registrations

    regs = python_registrations(scenarios)
    if not regs:
        return None
    mods = {sys.modules.get(getattr(o, "__module__", None) or "") for _, _, o in regs}
    mods = {m for m in mods if m is not None and m.__name__ != "__main__"
            and m.__name__ not in cloudpickle.list_registry_pickle_by_value()}
    for m in mods:
        cloudpickle.register_pickle_by_value(m)
    try:
        return cloudpickle.dumps(regs)
    finally:
        for m in mods:
            cloudpickle.unregister_pickle_by_value(m)


def install_plugins(blob: bytes | None) -> None:
    """Register what :func:`pack_plugins` packed (in the actor or task)."""
    if blob is not None:
        import pickle

        from asyncsim._plugins import install_registrations

        install_registrations(pickle.loads(blob))


class PSHost:
    """The PS actor: runs one :class:`PSImpl` per call of :meth:`run` (reusable)."""

    def __init__(self):
        self.ps: PSImpl | None = None

    def run(self, scn, folder, learners, jobs, resume, faults, limits, info, plugins=None):
        install_plugins(plugins)  # the driver's Python-registered plug-ins
        self.ps = PSImpl(scn, folder, learners, jobs, resume=resume, faults=faults)
        try:
            return self.ps.run(limits, info)
        finally:
            self.ps = None

    def progress(self) -> int:
        return -1 if self.ps is None or not hasattr(self.ps, "t0") else self.ps.clock.version


class RealCluster:
    """The Ray actors of real runs: ``size`` learners and one PS, reusable across runs.

    ``real_run`` makes one per run unless given one; tests and benchmarks keep one so each
    process starts (and compiles the model's gradient) once. Learners have
    ``max_restarts=-1``; the PS has none (a dead PS is replaced by the next run).
    """

    def __init__(self, size: int, *, threads: int | None = None, learner_cpus: float = 0,
                 address: str | None = None):
        import ray

        ensure_ray(address)
        self.threads = threads or default_threads()
        self.opts = _actor_options(self.threads)
        Learner = ray.remote(LearnerImpl).options(max_restarts=-1, max_task_retries=0,
                                                  num_cpus=learner_cpus, **self.opts)
        self.learners = [Learner.remote() for _ in range(size)]
        self._ps = None

    @property
    def ps(self):
        """The PS actor, pinned to this node (it writes the run folder the user named)."""
        import ray

        if self._ps is not None:
            try:
                ray.get(self._ps.progress.remote(), timeout=60)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                self._ps = None
        if self._ps is None:
            try:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                here = {"scheduling_strategy": NodeAffinitySchedulingStrategy(
                    ray.get_runtime_context().get_node_id(), soft=False)}
            except Exception:  # pragma: no cover - ray client: no local node
                here = {}
            self._ps = ray.remote(PSHost).options(num_cpus=0, max_restarts=0,
                                                  max_concurrency=2, **self.opts,
                                                  **here).remote()
        return self._ps

    def close(self) -> None:
        import ray

        for a in [*self.learners, *([self._ps] if self._ps is not None else [])]:
            ray.kill(a, no_restart=True)
        self.learners, self._ps = [], None


def _ready(learners: list, jobs: list, *, timeout: float = 300.0) -> list[int]:
    """Set up the learners for this job; wait for actors that Ray is still restarting (a
    reused cluster after a run that lost one)."""
    import ray

    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get([a.ready.remote(j) for a, j in zip(learners, jobs, strict=True)])
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def real_run(scn: Scenario, *, out: str | Path | None, resume: bool = False,
             force: bool = False, address: str | None = None, emulate_compute: bool = False,
             threads: int | None = None, learner_cpus: float = 0, faults: dict | None = None,
             profile: str | None = None, cluster: RealCluster | None = None) -> dict[str, Any]:
    """Run ``scn`` on Ray (learner actors + a PS actor) and write its run folder.

    Returns the run's summary (the fields of a simulated run's ``summary.json`` plus
    ``restarts``, ``resumes``, ``real_wall_time``, ``updates_per_s``, ``startup_s``,
    ``threads``).

    Args:
        threads: intra-op threads per actor (default: :func:`default_threads`, which makes
            a replay in a plain process on this machine bit-identical).
        learner_cpus: Ray CPUs reserved per learner (0: place all of them even on a small
            machine; on a cluster set 1 to spread them over nodes).
        emulate_compute: also sleep a draw of ``cluster.compute`` per gradient.
        faults: fault injection, see :class:`PSImpl`.
        cluster: reuse these actors (then ``threads``/``learner_cpus``/``address`` are its).

    Raises:
        ScenarioError: an unsupported protocol. RealRunError: the PS died (the folder is
        resumable with ``resume=True``; updates after the last checkpoint are redone).
    """
    import ray

    from asyncsim.api import train_size
    from asyncsim.cluster import run_length

    check_supported(scn)
    folder = None
    if out is not None:
        folder = runs.prepare(out, resume=resume, force=force).resolve()
        if not (resume and (folder / "scenario.toml").exists()):
            runs.write_scenario(folder, scn)
            runs.write_provenance(folder, scn, profile=profile, driver="real",
                                  ray_address=address)
    t_start = time.perf_counter()
    own = cluster is None
    if own:
        cluster = RealCluster(scn.cluster.learners, threads=threads,
                              learner_cpus=learner_cpus, address=address)
    lam = scn.cluster.learners
    if len(cluster.learners) < lam:
        raise ValueError(f"the RealCluster has {len(cluster.learners)} learners, "
                         f"the scenario needs {lam}")
    learners = cluster.learners[:lam]
    job_id = f"{os.getpid()}-{time.time_ns()}"
    # Plug-ins registered in this process (a script's register_lr_rule, say) travel with the
    # job: actors are fresh processes that never ran the registering code.
    plugins = pack_plugins([scn])
    jobs = [ray.put((job_id, scn, k, emulate_compute, plugins)) for k in range(lam)]
    try:
        ps = cluster.ps
        if "JAX_COMPILATION_CACHE_DIR" in cluster.opts["runtime_env"]["env_vars"]:
            # One learner compiles and fills the persistent cache; the others then load it
            # (on 2 cores, λ concurrent compiles of the same function cost λ times the CPU).
            _ready(learners[:1], jobs[:1])
        _ready(learners, jobs)
        startup = time.perf_counter() - t_start
        n_train = train_size(scn) if scn.run.epochs is not None else None
        try:
            out_ = ray.get(ps.run.remote(scn, str(folder) if folder else None, learners, jobs,
                                         resume, faults, run_length(scn, n_train=n_train),
                                         {"startup_s": startup, "threads": cluster.threads},
                                         plugins))
        except ray.exceptions.RayActorError as e:
            raise RealRunError(f"the PS died ({type(e).__name__}); continue with "
                               f"asyncsim real --resume {folder}") from e
        return out_["summary"]
    finally:
        if own:
            cluster.close()


def real_command(args) -> int:
    """``asyncsim real SCENARIO [--address ADDR] [--out DIR] [--set K=V] | --resume DIR``."""
    from asyncsim.cli import _load, _print_summary

    if args.resume:
        from asyncsim.scenario import load_scenario

        out = runs.resume_folder(args.resume, driver="real")
        scn = load_scenario(out / "scenario.toml")
    else:
        if not args.scenario:
            raise ScenarioError("", "give a scenario file, or --resume RUN_DIR",
                                file="asyncsim real")
        scn = _load(args)
        out = Path(args.out) if args.out else runs.default_out(scn, args.profile).with_name(
            f"real-seed{scn.seed}")
    emulate = bool(getattr(args, "emulate_compute", False)) or os.environ.get(
        "ASYNCSIM_REAL_EMULATE", "") not in ("", "0")
    try:
        summary = real_run(scn, out=out, resume=bool(args.resume), force=args.force,
                           address=args.address, emulate_compute=emulate,
                           profile=getattr(args, "profile", None))
    except RealRunError as e:
        print(f"asyncsim: error: {e}")
        return 1
    if not args.quiet:
        print(f"run folder: {out}")
        _print_summary(summary, ["updates", "gradients", "sim_time", "staleness_mean",
                                 "staleness_max", "final_test_error", "diverged", "restarts",
                                 "updates_per_s", "param_hash"])
    return 0


# ----------------------------------------------------------------------------- calibrate
def measured_durations(trace) -> dict[str, Any]:
    """Per-learner compute times and the pull/push link times of a real trace (seconds).

    compute = t_push - t_start; pull = t_start - t_pull (weights reach the learner);
    push = t_arrive - t_push (the gradient reaches the PS and is picked up).
    """
    g = trace.grads
    t_start = g["t_start"] if "t_start" in g else g["t_pull"]
    lam = int(trace.meta.get("learners", int(g["learner"].max()) + 1))
    comp = np.maximum(g["t_push"] - t_start, 0.0)
    return {"compute": [comp[g["learner"] == k] for k in range(lam)],
            "pull": np.maximum(t_start - g["t_pull"], 0.0),
            "push": np.maximum(g["t_arrive"] - g["t_push"], 0.0)}


def calibrate(run_dir: str | Path, *, out: str | Path | None = None,
              kind: str = "empirical") -> Path:
    """Fit the timing of a real run and write a scenario that simulates it.

    ``empirical``: the measured durations go to ``calib_*.csv`` next to the scenario and the
    scenario resamples them (``dist = "empirical"``), per learner for compute, shared for
    the pull and push links. ``parametric``: lognormal by measured mean and cv. The scenario
    is the run's own (model, data, protocol, optimizer, seed) with the same number of
    updates; returns its path.
    """
    from asyncsim.config import to_dict
    from asyncsim.scenario import load_scenario
    from asyncsim.trace import Trace

    run_dir = runs.require_run_folder(run_dir)
    scn = load_scenario(run_dir / "scenario.toml")
    trace = Trace.load(run_dir)
    out = Path(out) if out else run_dir / "calibrated.toml"
    out.parent.mkdir(parents=True, exist_ok=True)
    m = measured_durations(trace)

    def spec(values: np.ndarray, name: str) -> dict[str, Any]:
        values = values[np.isfinite(values)]
        if values.size == 0:
            return {"dist": "constant", "value": 0.0}
        if kind == "parametric":
            mean = float(values.mean())
            if mean <= 0:
                return {"dist": "constant", "value": 0.0}
            return {"dist": "lognormal", "mean": mean, "cv": float(values.std() / mean)}
        path = out.parent / f"calib_{name}.csv"
        runs.atomic_write_text(path, "seconds\n" + "".join(f"{float(x)!r}\n" for x in values))
        return {"dist": "empirical", "path": path.name, "column": "seconds"}

    d = to_dict(scn)
    for k in ("source", "sweep"):
        d.pop(k, None)
    d["name"] = f"{scn.name}-calibrated"
    d["description"] = f"timing calibrated ({kind}) from the real run {run_dir}"
    cl = d.setdefault("cluster", {})
    cl["compute"] = [spec(c, f"compute_{k}") for k, c in enumerate(m["compute"])]
    cl.pop("speed", None)
    cl.pop("ps_service", None)
    cl["network"] = {"pull": {"latency": spec(m["pull"], "pull")},
                     "push": {"latency": spec(m["push"], "push")}}
    run = {k: v for k, v in d.get("run", {}).items()
           if k not in ("updates", "gradients", "epochs", "sim_time")}
    run["updates"] = trace.num_updates
    d["run"] = run
    runs.atomic_write_text(out, runs.dump_toml(d))
    load_scenario(out)  # validate what we wrote (names the key if something is off)
    return out


def calibrate_command(args) -> int:
    path = calibrate(args.run_dir, out=args.out, kind=args.kind)
    print(f"calibrated scenario: {path}")
    print(f"simulate it with: asyncsim trace {path} --out RUN_B; then "
          f"asyncsim compare {args.run_dir} RUN_B")
    return 0


# ----------------------------------------------------------------------------- compare
def staleness_distribution(trace, *, skip: int = 0) -> np.ndarray:
    """Frequencies of staleness 0, 1, 2, ... (after ``skip`` warm-up updates)."""
    return trace.staleness_histogram(skip=skip)["freq"].to_numpy()


def compare(run_a: str | Path, run_b: str | Path, *, figure: str | Path | None = None,
            skip: int = 0) -> dict[str, Any]:
    """Two runs' staleness distributions side by side.

    Returns ``tv_distance`` (½ Σ|p_a − p_b|, in [0, 1]), per run mean, p99, max and count,
    and ``table`` (staleness, freq_a, freq_b). With ``figure`` draws both as bars (Agg).
    """
    from asyncsim.trace import Trace

    ta = Trace.load(runs.require_run_folder(run_a, scenario=False))
    tb = Trace.load(runs.require_run_folder(run_b, scenario=False))
    pa, pb = staleness_distribution(ta, skip=skip), staleness_distribution(tb, skip=skip)
    n = max(pa.size, pb.size)
    pa, pb = np.pad(pa, (0, n - pa.size)), np.pad(pb, (0, n - pb.size))
    tvd = 0.5 * float(np.abs(pa - pb).sum())
    res: dict[str, Any] = {"tv_distance": tvd}
    for tag, t in (("a", ta), ("b", tb)):
        s = t.staleness_stats(skip=skip)
        res[f"mean_{tag}"] = s["staleness_mean"]
        res[f"p99_{tag}"] = s["staleness_p99"]
        res[f"max_{tag}"] = s["staleness_max"]
        res[f"gradients_{tag}"] = t.num_gradients
    res["table"] = [{"staleness": i, "freq_a": float(pa[i]), "freq_b": float(pb[i])}
                    for i in range(n)]
    if figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        x = np.arange(n)
        ax.bar(x - 0.2, pa, 0.4, label=f"A: {Path(run_a).name} (mean {res['mean_a']:.2f})")
        ax.bar(x + 0.2, pb, 0.4, label=f"B: {Path(run_b).name} (mean {res['mean_b']:.2f})")
        ax.set_xlabel("staleness τ")
        ax.set_ylabel("frequency")
        ax.set_title(f"staleness distributions, TV distance {tvd:.3f}")
        ax.legend()
        fig.tight_layout()
        Path(figure).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(figure, dpi=120)
        plt.close(fig)
        res["figure"] = str(figure)
    return res


def compare_command(args) -> int:
    res = compare(args.run_a, args.run_b, figure=args.figure)
    print(f"{'':<10}{'A':>12}{'B':>12}")
    for k in ("gradients", "mean", "p99", "max"):
        print(f"{k:<10}{res[k + '_a']:>12.4g}{res[k + '_b']:>12.4g}")
    print(f"total variation distance: {res['tv_distance']:.4f}")
    print(f"{'tau':>5}{'freq A':>10}{'freq B':>10}")
    for row in res["table"]:
        print(f"{row['staleness']:>5}{row['freq_a']:>10.4f}{row['freq_b']:>10.4f}")
    if "figure" in res:
        print(f"figure: {res['figure']}")
    return 0


# ----------------------------------------------------------------------------- sweeps
def ray_executor(address: str | None = None, *, num_cpus: float = 1) -> Callable:
    """An executor for :func:`asyncsim.sweep.run_sweep`: each job runs as one Ray task.

    ``executor(jobs) -> [summary, ...]`` in job order. Each job writes its own run folder;
    a job runs in the driver's working directory (relative ``--out`` paths mean the same
    folder as locally), so on a multi-node cluster the output folder must be shared.
    Results equal the local executor's (same functions, same inputs).
    """
    import ray

    ensure_ray(address)
    cwd = os.getcwd()
    # Ray gives tasks OMP_NUM_THREADS=num_cpus; XLA's results depend on the thread count
    # (see SINGLE_THREAD_XLA's comment), so tasks get the local process's count instead.
    env = {"OMP_NUM_THREADS": str(default_threads())}

    @ray.remote(num_cpus=num_cpus, runtime_env={"env_vars": env})
    def _job(job, plugins):
        install_plugins(plugins)
        old = os.getcwd()
        os.chdir(cwd)
        try:
            return job()
        finally:
            os.chdir(old)

    def execute(jobs: Sequence[Callable[[], dict[str, Any]]]) -> list[dict[str, Any]]:
        # The plug-ins the points use that this process registered in Python travel along.
        plugins = pack_plugins([s for j in jobs for s in getattr(j, "scenarios", [])])
        return ray.get([_job.remote(j, plugins) for j in jobs])

    return execute


__all__ = ["RealRunError", "calibrate", "calibrate_command", "compare", "compare_command",
           "ray_executor", "real_command", "real_run", "check_supported", "measured_durations",
           "SINGLE_THREAD_XLA"]
