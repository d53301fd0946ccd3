"""JAX's persistent compilation cache, on by default: a short run's second start in seconds.

Most of a short run is XLA compiling its programs (P1's network: ~15 s of a 4-update smoke
run). JAX can keep every compiled executable on disk and load it instead of compiling the
same program again, in the next run, the next test, or a Ray actor that restarts.
:func:`enable` turns that on when :mod:`asyncsim.numerics` is first imported, before
anything compiles:

* the folder: ``ASYNCSIM_CACHE_DIR`` when set (``off`` turns the cache off), else the
  platform's per-user cache folder (``platformdirs.user_cache_dir("asyncsim")``, e.g.
  ``~/.cache/asyncsim`` on Linux) + ``/jax``, shared by every asyncsim process of the user
  on the machine, Ray learners included; a folder the user gave JAX itself
  (``JAX_COMPILATION_CACHE_DIR``) is kept;
* every program is cached, however small or quick to compile (JAX's defaults keep only
  programs that took a second or more), up to 2 GiB, least recently used first out.

A cached executable is the program XLA compiled for the same computation, backend and
compile options (JAX's cache key), so loading it never changes a number: the same
``param_hash`` cold, warm and with the cache off (tests/cli/test_compile_cache.py). A folder
that cannot be created or written is a warning and the run compiles as before; JAX reports
an unreadable entry as a warning and compiles it again (``jax_raise_persistent_cache_errors``
stays off). :func:`stats` (the folder, hits and misses of this process) goes into each run's
``provenance.json``.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import jax
from jax import monitoring

__all__ = ["ENV", "cache_dir", "enable", "stats"]

ENV = "ASYNCSIM_CACHE_DIR"
MAX_BYTES = 2 * 1024**3

_state: dict[str, Any] = {"tried": False, "dir": None, "enabled": False,
                          "reason": "not enabled yet", "hits": 0, "requests": 0}


def cache_dir() -> Path | None:
    """The folder the cache uses by the environment (None: ``ASYNCSIM_CACHE_DIR=off``)."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() == "off":
        return None
    if value:
        return Path(value).expanduser()
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(os.environ["JAX_COMPILATION_CACHE_DIR"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("asyncsim")) / "jax"


def _usable(folder: Path) -> str | None:
    """None if ``folder`` can hold the cache (created if missing), else why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as e:
        return f"{e.strerror or e}"
    return None


def _count(event: str, **_: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _state["hits"] += 1
    elif event == "/jax/compilation_cache/compile_requests_use_cache":
        _state["requests"] += 1


def enable() -> dict[str, Any]:
    """Point JAX's persistent cache at :func:`cache_dir` (once per process); returns
    :func:`stats`. Never raises for the folder: an unusable one is a warning."""
    if _state["tried"]:
        return stats()
    _state["tried"] = True
    folder = cache_dir()
    if folder is None:
        _state["reason"] = f"{ENV}=off"
        return stats()
    problem = _usable(folder)
    if problem is not None:
        _state["reason"] = f"{folder}: {problem}"
        warnings.warn(f"asyncsim: the compilation cache folder {folder} cannot be used "
                      f"({problem}); compiling without it (set {ENV} to another folder, or "
                      f"to off)", RuntimeWarning, stacklevel=2)
        return stats()
    jax.config.update("jax_compilation_cache_dir", str(folder))
    # Keep every program: asyncsim's are many and small (an update, a gradient, an
    # evaluation chunk), each under JAX's default of one second of compile time.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    monitoring.register_event_listener(_count)
    _state.update(dir=str(folder), enabled=True, reason="")
    return stats()


def stats() -> dict[str, Any]:
    """This process's use of the cache: ``dir``, ``enabled``, ``reason`` (why not, when
    not), ``hits`` (programs loaded from it) and ``misses`` (programs compiled and written
    to it)."""
    return {"dir": _state["dir"], "enabled": _state["enabled"],
            **({"reason": _state["reason"]} if not _state["enabled"] else {}),
            "hits": _state["hits"], "misses": _state["requests"] - _state["hits"]}
