"""The machine's part in a run's last bits: the thread counts and the XLA flag asyncsim fixes
before JAX starts, and the facts a run folder records so that a replay elsewhere can say
what differs.

What can change a run's parameters on CPU, with the scenario and the packages fixed
(measured; docs/reproducibility.md has the numbers):

* **XLA's intra-op thread pool.** XLA sizes it from ``PJRT_NPROC`` (else ``NPROC``, else the
  CPUs the process may run on: ``taskset``, cgroup cpusets), and one thread rounds a full
  reduction differently from two or more. Importing asyncsim sets ``PJRT_NPROC=2`` unless
  it is set already, so 1 core and 64 give the same bits; a value of the user's own is
  kept (and recorded).
* **OpenBLAS's threads and kernel.** No array that feeds a run is made with BLAS any more
  (the synthetic data sets are built from correctly rounded operations in a fixed order);
  asyncsim still sets ``OPENBLAS_NUM_THREADS=1`` so that what BLAS the host does (the
  sharpness measure's vectors) does not depend on the core count. OpenBLAS reads it when
  numpy is first imported.
* **The CPU model.** XLA compiles for the host CPU, and by default picks its math (the
  elementwise functions' code) by the platform: Zen 3 and Zen 4 CPUs, both with AVX2 and FMA,
  then end the same run at different bits. With ``--xla_cpu_enable_platform_dependent_math=
  false`` they end at the same bits (measured), so importing asyncsim adds that flag to
  ``XLA_FLAGS`` unless the flags name it already (:data:`FIXED_XLA_FLAGS`).
* **The CPU's instruction set.** x86-64 with AVX2 and FMA is the floor of the documented
  guarantee (without FMA, XLA's code rounds differently).
* **``XLA_FLAGS``** and the JAX, jaxlib and numpy versions.

Import asyncsim before JAX: JAX creates its CPU client, and with it the thread pool, on
first use, and later settings of ``PJRT_NPROC`` do not change it. When JAX was imported
first, asyncsim still sets the variable (enough if JAX has computed nothing yet), says so
once, and records it as ``jax_imported_first``.
"""

from __future__ import annotations

import os
import platform
import sys
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["BIT_FACTS", "FIXED_THREADS", "FIXED_XLA_FLAGS", "cpu_affinity", "fact_changes",
           "fix_settings", "machine_facts", "thread_counts"]

#: What importing asyncsim sets when the environment does not set it already.
FIXED_THREADS = {"PJRT_NPROC": "2", "OPENBLAS_NUM_THREADS": "1"}
#: What importing asyncsim adds to ``XLA_FLAGS`` when the flags do not name it already: the
#: CPU code whose bits do not depend on the CPU model (docs/reproducibility.md). XLA knows
#: the flag from jaxlib 0.8.1 on (the floor in pyproject.toml); an older one aborts on it.
FIXED_XLA_FLAGS = ("--xla_cpu_enable_platform_dependent_math=false",)
# The variables by which a user has already chosen each count (XLA also reads NPROC).
_CHOSEN_BY = {"PJRT_NPROC": ("PJRT_NPROC", "NPROC"),
              "OPENBLAS_NUM_THREADS": ("OPENBLAS_NUM_THREADS",)}

# The environment variables that set XLA's and OpenBLAS's thread counts (thread_counts).
_THREAD_VARIABLES = ("PJRT_NPROC", "NPROC", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                     "OMP_NUM_THREADS")

#: The keys of :func:`machine_facts` that can change a run's bits: what a replay and
#: ``asyncsim compare`` report when two runs' parameters differ.
BIT_FACTS = ("cpu_model", "cpu_id", "cpu_flags", "xla_threads", "xla_flags", "jax_platforms",
             "blas")

# The CPU flags (Linux /proc/cpuinfo names) that decide which code XLA and OpenBLAS run.
_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512vl", "avx512_bf16",
              "amx_tile")

# What fix_settings found when asyncsim was imported.
_FOUND: dict[str, Any] = {}


def fix_settings() -> None:
    """Set :data:`FIXED_THREADS` in ``os.environ`` where the user has not chosen the count
    (``PJRT_NPROC`` or ``NPROC``; ``OPENBLAS_NUM_THREADS``) and add :data:`FIXED_XLA_FLAGS`
    to ``XLA_FLAGS`` where its flags do not name them, once, at import; say once when JAX
    was imported first, since its thread pool and flags may be fixed already."""
    if _FOUND:
        return
    unset = sorted(k for k in FIXED_THREADS
                   if not any(v in os.environ for v in _CHOSEN_BY[k]))
    flags = os.environ.get("XLA_FLAGS", "")
    named = {f.split("=", 1)[0].lstrip("-") for f in flags.split()}
    added = [f for f in FIXED_XLA_FLAGS if f.split("=", 1)[0].lstrip("-") not in named]
    _FOUND["threads_set_by_asyncsim"] = unset
    _FOUND["xla_flags_set_by_asyncsim"] = added
    _FOUND["jax_imported_first"] = "jax" in sys.modules
    for key in unset:
        os.environ[key] = FIXED_THREADS[key]
    if added:
        os.environ["XLA_FLAGS"] = " ".join([*flags.split(), *added])
    if _FOUND["jax_imported_first"] and ("PJRT_NPROC" in unset or added):
        warnings.warn(
            "JAX was imported before asyncsim: if it has computed anything, XLA keeps its "
            f"thread pool ({cpu_affinity()} CPUs here) and flags, and results may differ in "
            "the last bits from runs on other core counts and CPU models; import asyncsim "
            "first, or set PJRT_NPROC=2 and XLA_FLAGS="
            f"{' '.join(FIXED_XLA_FLAGS)} before starting Python", RuntimeWarning,
            stacklevel=3)


def cpu_affinity() -> int:
    """The number of CPUs this process may run on (``taskset``, cgroup cpusets)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _count(value: str | None) -> int | None:
    try:
        return int(value.strip()) if value is not None else None
    except ValueError:
        return None


def thread_counts(env: dict[str, str] | None = None) -> dict[str, int]:
    """The thread counts a process's last bits depend on, as this process (or one with
    ``env``) gets them:

    * ``xla``: XLA's CPU intra-op thread pool, from ``PJRT_NPROC`` (else ``NPROC``), else
      the CPUs the process may run on; ``OMP_NUM_THREADS`` and
      ``--xla_cpu_multi_thread_eigen=false`` do not change it;
    * ``blas``: numpy's OpenBLAS threads, from ``OPENBLAS_NUM_THREADS``, else
      ``GOTO_NUM_THREADS``, else ``OMP_NUM_THREADS``, capped at the CPUs.
    """
    env = os.environ if env is None else env
    cpus = cpu_affinity()
    xla = next((n for k in ("PJRT_NPROC", "NPROC") if (n := _count(env.get(k))) is not None),
               cpus)
    blas = next((n for k in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
                 if (n := _count(env.get(k))) is not None and n > 0), cpus)
    return {"xla": max(0, xla), "blas": min(blas, cpus)}


def _cpu() -> dict[str, Any]:
    """The CPU's model name and which of :data:`_ISA_FLAGS` it has (Linux; elsewhere the
    processor string and no flags)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            info = f.read()
    except OSError:
        return {"cpu_model": platform.processor() or None, "cpu_id": None, "cpu_flags": None}
    fields = dict(line.split(":", 1) for line in info.splitlines()[:64] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    have = set(fields.get("flags", "").split())
    ident = [fields.get(k) for k in ("vendor_id", "cpu family", "model", "stepping")]
    return {"cpu_model": fields.get("model name") or fields.get("Processor") or None,
            # vendor family/model/stepping: what tells Zen 2 from Zen 4 where the name does
            # not (a virtual machine's "AMD EPYC")
            "cpu_id": " ".join(ident[:1] + ["/".join(ident[1:])]) if all(ident) else None,
            "cpu_flags": [f for f in _ISA_FLAGS if f in have]}


def _blas() -> dict[str, Any]:
    """numpy's BLAS as it runs: library, version, kernel (OpenBLAS's core type) and
    threads, through threadpoolctl (None where it finds none)."""
    import numpy  # noqa: F401  (loads its BLAS, which threadpoolctl then finds)
    from threadpoolctl import threadpool_info

    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            return {"blas": {k: lib.get(k) for k in
                             ("internal_api", "version", "architecture", "num_threads")}}
    return {"blas": None}


def machine_facts() -> dict[str, Any]:
    """What a run's last bits depend on besides the scenario and the package versions, as
    ``provenance.json`` records it: the CPU model and ISA flags, the CPUs the process may
    run on, XLA's and BLAS's thread counts, the variables that set them, ``XLA_FLAGS``,
    ``JAX_PLATFORMS``, BLAS's kernel, and what :func:`fix_settings` found."""
    env = {k.lower(): os.environ.get(k, "") for k in _THREAD_VARIABLES}
    counts = thread_counts()
    return {**_cpu(), "cpu_affinity": cpu_affinity(), "xla_threads": counts["xla"],
            "xla_flags": os.environ.get("XLA_FLAGS", ""), **env,
            "jax_platforms": os.environ.get("JAX_PLATFORMS", ""), **_blas(),
            **_FOUND}


def fact_changes(then: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``"key: then's -> now's"`` for each key of ``now`` that ``then`` records (not None)
    with another value: what differs between two runs' machines, in ``now``'s order."""
    return [f"{k}: {then[k]!r} -> {v!r}" for k, v in now.items()
            if then.get(k) is not None and then[k] != v]
