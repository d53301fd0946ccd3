"""The thread counts a process's last bits depend on (docs/real.md, "Exact replay"): what a
real run records of its learners and refuses when they differ from the PS's."""

from __future__ import annotations

import os

__all__ = ["cpu_affinity", "thread_counts"]


def _count(value: str | None) -> int | None:
    try:
        return int(value.strip()) if value is not None else None
    except ValueError:
        return None


def cpu_affinity() -> int:
    """The number of CPUs this process may run on (``taskset``, cgroup cpusets)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def thread_counts(env: dict[str, str] | None = None) -> dict[str, int]:
    """The thread counts a process's last bits depend on, as this process (or one with
    ``env``) gets them (measured: docs/real.md, "Exact replay"):

    * ``xla``: XLA's CPU intra-op thread pool. XLA sizes it from ``PJRT_NPROC`` (else
      ``NPROC``), else from the CPUs the process may run on (``sched_getaffinity``:
      ``tsl::port::MaxParallelism``); ``OMP_NUM_THREADS`` and
      ``--xla_cpu_multi_thread_eigen=false`` do not change it;
    * ``blas``: the threads of numpy's OpenBLAS (the synthetic data sets are generated with
      numpy matrix products): ``OPENBLAS_NUM_THREADS``, else ``GOTO_NUM_THREADS``, else
      ``OMP_NUM_THREADS``, capped at the affinity's CPU count.
    """

    env = os.environ if env is None else env
    cpus = cpu_affinity()
    xla = next((n for k in ("PJRT_NPROC", "NPROC") if (n := _count(env.get(k))) is not None),
               cpus)
    blas = next((n for k in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
                 if (n := _count(env.get(k))) is not None and n > 0), cpus)
    return {"xla": max(0, xla), "blas": min(blas, cpus)}
