"""Starting real runs: the Ray connection, the actors' settings, :func:`real_run`, and Ray
as an executor of a sweep's points (:func:`ray_executor`). See :mod:`.actors` for what the
learner and PS actors do.
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
from asyncsim.drivers.plugins import install_plugins, pack_plugins
from asyncsim.drivers.real.actors import (
    SINGLE_THREAD_XLA,
    LearnerImpl,
    PSHost,
    RealRunError,
)
from asyncsim.errors import ScenarioError
from asyncsim.numerics.data import train_size
from asyncsim.timing.cluster import run_length
from asyncsim.timing.protocols import Protocol, get_protocol_class


# ----------------------------------------------------------------------------- Ray setup
def ensure_ray(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Connect to Ray once: a local instance by default, ``address`` to join a cluster."""

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

    cls = get_protocol_class(scn.protocol.kind)
    if scn.protocol.kind == "fixed-delay" or cls.start is not Protocol.start:
        raise ScenarioError("protocol.kind", f"{scn.protocol.kind!r} schedules workers itself "
                            "(a serial emulation); real runs support async, softsync, "
                            "hardsync, ssp and plug-ins that only use on_arrival/may_pull")


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


class RealCluster:
    """The Ray actors of real runs: ``size`` learners and one PS, reusable across runs.

    ``real_run`` makes one per run unless given one; tests and benchmarks keep one so each
    process starts (and compiles the model's gradient) once. Learners have
    ``max_restarts=-1``; the PS has none (a dead PS is replaced by the next run).
    """

    def __init__(self, size: int, *, threads: int | None = None, learner_cpus: float = 0,
                 address: str | None = None):
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
        n_train = (train_size(scn.data.name, scn.data.options) if scn.run.epochs is not None
                   else None)
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

