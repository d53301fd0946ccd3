"""Starting real runs: the Ray connection, the actors' settings, :func:`real_run`, and Ray
as an executor of a sweep's points (:func:`ray_executor`). See :mod:`.learner` and :mod:`.ps`
for what the learner and PS actors do.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray  # the real driver is Ray's: this package is imported only for real runs

from asyncsim import runs
from asyncsim.config import Scenario
from asyncsim.drivers.checkpoint import CKPT, check_checkpoint
from asyncsim.drivers.folder_scenario import start_folder
from asyncsim.drivers.plugins import install_plugins, pack_plugins
from asyncsim.drivers.real import watchdog
from asyncsim.drivers.real.learner import LearnerImpl
from asyncsim.drivers.real.ps import PSHost
from asyncsim.drivers.run_length import run_length
from asyncsim.errors import ScenarioError
from asyncsim.machine import thread_counts
from asyncsim.numerics import compile_cache
from asyncsim.numerics.data import train_size
from asyncsim.timing.protocols import Protocol, get_protocol_class


class RealRunError(RuntimeError):
    """A real run stopped before its end (e.g. the PS died); the folder can be resumed."""


# ----------------------------------------------------------------------------- Ray setup
_GUARD: watchdog.Guard | None = None


def _close_guard(wait: float | None = 5.0) -> None:
    """After ``ray.shutdown``: the watchdog ends any process of the session that outlived
    it, and exits. Not an exit hook: when this process exits, the kernel closes the pipe
    after every exit hook has run (Ray's shutdown included), so the watchdog never races
    Ray's own teardown, and the exit does not wait for it."""

    global _GUARD
    if _GUARD is not None:
        _GUARD.close(wait=wait)
        _GUARD = None


def _session_dir() -> str | None:
    """The folder of the local Ray session (its logs and sockets): every process of the
    session holds files in it, which is how the watchdog finds them."""
    try:
        return ray._private.worker._global_node.get_session_dir_path()
    except Exception:  # pragma: no cover - a Ray without it: the environment mark only
        return None


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Connect to Ray once: a local instance by default, ``address`` to join a cluster.

    A local instance started here goes away with this process however it ends (a
    ``kill -9`` included): see :mod:`.watchdog`. A cluster joined with ``address`` is left
    alone.
    """

    global _GUARD
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
            return
        _close_guard()  # a previous local instance (ray.shutdown() since): end its rest
        # Ray's own programs (raylet, gcs_server) live in its package folder.
        _GUARD = watchdog.guard((os.path.dirname(os.path.realpath(ray.__file__)),))
        if _GUARD is None:  # no /proc: Ray's own fate sharing only
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, **kw)
            return
        # The GCS and the raylet inherit the marker, and everything the raylet starts
        # inherits it from them; this process's later children do not get it.
        saved = {k: os.environ.get(k) for k in _GUARD.env()}
        os.environ.update(_GUARD.env())
        try:
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, **kw)
            if not watchdog.session_pids(_GUARD.token):
                # ray.init joined a running instance (RAY_ADDRESS, or one `ray start` left
                # in /tmp/ray/ray_current_cluster) instead of starting one: not ours to end.
                _close_guard()
            elif (d := _session_dir()) is not None:
                _GUARD.session(d)
        except BaseException:
            _close_guard()
            raise
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def shutdown_ray() -> None:
    """``ray.shutdown()``, then end whatever of a local instance outlived it."""

    ray.shutdown()
    _close_guard()


def check_supported(scn: Scenario) -> None:
    """Raise ScenarioError for a protocol a real run cannot execute."""

    net = scn.cluster.network
    for direction in ("ps_ingress", "ps_egress"):
        if getattr(net, direction) is not None:
            raise ScenarioError(f"cluster.network.{direction}", "a real run's transfers cross "
                                "the real network: remove the simulated shared link")
    if scn.cluster.availability is not None:
        raise ScenarioError("cluster.availability", "a real run's learners are up until their "
                            "processes fail (and Ray restarts them); remove the simulated "
                            "availability")
    cls = get_protocol_class(scn.protocol.kind)
    if scn.protocol.kind == "fixed-delay" or cls.start is not Protocol.start:
        raise ScenarioError("protocol.kind", f"{scn.protocol.kind!r} schedules workers itself "
                            "(a serial emulation); real runs support async, softsync, "
                            "hardsync, ssp and plug-ins that only use on_arrival/may_pull")


# ----------------------------------------------------------------------------- driver side
def numerics_env(threads: int | None = None) -> dict[str, str]:
    """The environment that gives a Ray worker this process's numerics.

    A gradient's last bits depend on XLA's CPU thread pool, which XLA sizes from
    ``PJRT_NPROC`` or else from the process's CPU affinity (not from ``OMP_NUM_THREADS``);
    importing asyncsim fixes it, and numpy's BLAS threads, where the user has not
    (:mod:`asyncsim.machine`). So a worker gets both counts of this process explicitly
    (``threads``: both set to that instead), whatever its own affinity and whatever Ray sets
    (``OMP_NUM_THREADS=1``), plus
    this process's ``JAX_*``/``XLA_*`` variables (``XLA_FLAGS`` can change the programs) and
    ``ASYNCSIM_CACHE_DIR`` (the persistent compilation cache, :mod:`asyncsim.numerics.
    compile_cache`, lets a restarted learner load its gradient function instead of
    compiling it again).
    """

    env = {k: v for k, v in os.environ.items()
           if k.startswith(("JAX_", "XLA_")) or k == compile_cache.ENV}
    if threads is not None:
        return {**env, "PJRT_NPROC": str(threads), "OMP_NUM_THREADS": str(threads),
                "OPENBLAS_NUM_THREADS": str(threads)}
    n = thread_counts()
    return {**env, "PJRT_NPROC": str(n["xla"]), "OPENBLAS_NUM_THREADS": str(n["blas"]),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(n["blas"])}


def _actor_options(threads: int | None) -> dict[str, Any]:
    return {"runtime_env": {"env_vars": numerics_env(threads)}}


class RealCluster:
    """The Ray actors of real runs: ``size`` learners and one PS, reusable across runs.

    ``real_run`` makes one per run unless given one; tests and benchmarks keep one so each
    process starts (and compiles the model's gradient) once. Learners have
    ``max_restarts=-1``; the PS has none (a dead PS is replaced by the next run).
    """

    def __init__(self, size: int, *, threads: int | None = None, learner_cpus: float = 0,
                 address: str | None = None):
        ensure_ray(address)
        self.opts = _actor_options(threads)
        # What the actors are given (and what a replay needs): XLA's and BLAS's threads.
        env = self.opts["runtime_env"]["env_vars"]
        self.counts = thread_counts(env)
        self.threads = self.counts["xla"]
        Learner = ray.remote(LearnerImpl).options(max_restarts=-1, max_task_retries=0,
                                                  num_cpus=learner_cpus, **self.opts)
        self.learners = [Learner.remote() for _ in range(size)]
        self._ps = None

    @property
    def ps(self):
        """The PS actor, pinned to this node (it writes the run folder the user named)."""

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
        for a in [*self.learners, *([self._ps] if self._ps is not None else [])]:
            ray.kill(a, no_restart=True)
        self.learners, self._ps = [], None


def _ready(learners: list, jobs: list, *, timeout: float = 300.0) -> list[int]:
    """Set up the learners for this job; wait for actors that Ray is still restarting (a
    reused cluster after a run that lost one)."""

    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get([a.ready.remote(j) for a, j in zip(learners, jobs, strict=True)])
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _check_threads(learners: list, want: dict[str, int]) -> None:
    """Warn when a learner's process does not get the thread counts asked for (a node with
    fewer CPUs than this one caps BLAS's): its gradients may then differ in the last bits
    from a replay here."""

    got = ray.get([a.thread_counts.remote() for a in learners])
    bad = [k for k, g in enumerate(got) if g != want]
    if bad:
        warnings.warn(f"learners {bad} run with threads {got[bad[0]]}, not {want}: a replay "
                      "on this machine may differ in the last bits", RuntimeWarning,
                      stacklevel=3)


def real_run(scn: Scenario, *, out: str | Path | None, resume: bool = False,
             force: bool = False, address: str | None = None, emulate_compute: bool = False,
             threads: int | None = None, learner_cpus: float = 0, faults: dict | None = None,
             profile: str | None = None, cluster: RealCluster | None = None) -> dict[str, Any]:
    """Run ``scn`` on Ray (learner actors + a PS actor) and write its run folder.

    Returns the run's summary (the fields of a simulated run's ``summary.json`` plus
    ``restarts``, ``resumes``, ``real_wall_time``, ``updates_per_s``, ``startup_s``,
    ``threads`` (XLA's), ``blas_threads``).

    Args:
        threads: XLA's and BLAS's threads per actor (default: this process's, see
            :func:`numerics_env`, which makes a replay in a plain process on this machine
            bit-identical; with ``threads=N``, replay with ``PJRT_NPROC=N
            OMP_NUM_THREADS=N``).
        learner_cpus: Ray CPUs reserved per learner (0: place all of them even on a small
            machine; on a cluster set 1 to spread them over nodes).
        emulate_compute: also sleep a draw of ``cluster.compute`` per gradient.
        faults: fault injection, see :class:`PSImpl`.
        cluster: reuse these actors (then ``threads``/``learner_cpus``/``address`` are its).

    Raises:
        ScenarioError: an unsupported protocol. RealRunError: the PS died (the folder is
        resumable with ``resume=True``; updates after the last checkpoint are redone).
    """

    check_supported(scn)
    # The driver holds the folder's lock for the run; the PS actor writes into it.
    with runs.opened(out, resume=resume, force=force) as folder:
        folder = folder.resolve() if folder is not None else None
        record = None
        if folder is not None and resume and (folder / CKPT).exists():
            # Checked here, not in the PS actor: there Ray would wrap the one-line refusal.
            record = check_checkpoint(folder, scn)
        elif folder is not None:  # a new run, or a resume with nothing checkpointed yet
            record = start_folder(folder, scn, profile=profile, driver="real",
                                  ray_address=address)
        return _real_run(scn, folder, resume, address, emulate_compute, threads,
                         learner_cpus, faults, cluster, record)


def _real_run(scn, folder, resume, address, emulate_compute, threads, learner_cpus, faults,
              cluster, record) -> dict[str, Any]:
    """:func:`real_run` once its folder is prepared (and locked)."""
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
        if compile_cache.stats()["enabled"]:
            # One learner compiles and fills the persistent cache (the learners use this
            # process's folder: compile_cache); the others then load it (on 2 cores, λ
            # concurrent compiles of the same function cost λ times the CPU).
            _ready(learners[:1], jobs[:1])
        _ready(learners, jobs)
        _check_threads(learners, cluster.counts)
        startup = time.perf_counter() - t_start
        n_train = (train_size(scn.data.name, scn.data.options) if scn.run.epochs is not None
                   else None)
        try:
            out_ = ray.get(ps.run.remote(scn, str(folder) if folder else None, learners, jobs,
                                         resume, faults, run_length(scn, n_train=n_train),
                                         {"startup_s": startup, "threads": cluster.threads,
                                          "blas_threads": cluster.counts["blas"]},
                                         plugins, record))
        except ray.exceptions.RayActorError as e:
            raise RealRunError(f"the PS died ({type(e).__name__}); continue with "
                               f"asyncsim real --resume {folder}") from e
        except ray.exceptions.RayTaskError as e:
            # What the PS refused in one line (a damaged checkpoint, a full disk, a bad
            # draw) stays one line here, not Ray's remote traceback.
            if isinstance(e.cause, runs.ONE_LINE_ERRORS):
                raise e.cause from None
            raise
        return out_["summary"]
    finally:
        if own:
            cluster.close()


# ----------------------------------------------------------------------------- sweeps
def ray_executor(address: str | None = None, *, num_cpus: float = 1) -> Callable:
    """An executor for :func:`asyncsim.sweep.run_sweep`: each job runs as one Ray task.

    ``executor(jobs) -> [summary, ...]`` in job order. Each job writes its own run folder;
    a job runs in the driver's working directory (relative ``--out`` paths mean the same
    folder as locally), so on a multi-node cluster the output folder must be shared.
    Results equal the local executor's (same functions, same inputs).
    """

    ensure_ray(address)
    cwd = os.getcwd()
    # Ray gives tasks OMP_NUM_THREADS=num_cpus; results depend on XLA's and BLAS's thread
    # counts, so tasks get this process's (see numerics_env).
    env = numerics_env()

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

