"""The persistent compilation cache (asyncsim.numerics.compile_cache): on by default, never a
number changed, never a failure.

Each case runs `asyncsim run` in a fresh process (the cache is set up once per process, when
asyncsim.numerics is first imported) with its own ASYNCSIM_CACHE_DIR, and reads what the run
folder recorded: summary.json's param_hash and provenance.json's compilation_cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY

from asyncsim._io import dump_toml


def _run(tmp_path: Path, name: str, cache: str | None, **env: str):
    """(summary, provenance, stderr) of one `asyncsim run` of the tiny scenario."""
    scenario = tmp_path / "tiny.toml"
    if not scenario.exists():
        scenario.write_text(dump_toml(TINY))
    out = tmp_path / name
    full = {k: v for k, v in os.environ.items()
            if k not in ("ASYNCSIM_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")}
    full.update(env)
    if cache is not None:
        full["ASYNCSIM_CACHE_DIR"] = cache
    r = subprocess.run([sys.executable, "-m", "asyncsim.cli", "run", str(scenario), "--out",
                        str(out), "--quiet", "--no-figure"], capture_output=True, text=True,
                       env=full, timeout=300)
    assert r.returncode == 0, r.stderr
    return (json.loads((out / "summary.json").read_text()),
            json.loads((out / "provenance.json").read_text()), r.stderr)


def test_cold_warm_and_off_give_the_same_numbers(tmp_path):
    """The first run compiles and writes every program (small ones too), the second loads
    them all, and the run without the cache compiles them again: one param_hash."""
    folder = tmp_path / "cache"
    cold, cold_prov, _ = _run(tmp_path, "cold", str(folder))
    warm, warm_prov, _ = _run(tmp_path, "warm", str(folder))
    off, off_prov, _ = _run(tmp_path, "off", "off")
    assert cold["param_hash"] == warm["param_hash"] == off["param_hash"]
    c, w = cold_prov["compilation_cache"], warm_prov["compilation_cache"]
    assert c["enabled"] and c["dir"] == str(folder) and c["hits"] == 0 and c["misses"] >= 5
    assert w["hits"] == c["misses"] and w["misses"] == 0  # every program came from the cache
    assert off_prov["compilation_cache"] == {"dir": None, "enabled": False, "hits": 0,
                                             "misses": 0, "reason": "ASYNCSIM_CACHE_DIR=off"}
    assert len(list(folder.glob("*-cache"))) == c["misses"]


def test_an_unusable_or_corrupt_cache_is_a_warning_never_a_failure(tmp_path):
    """A folder that cannot be created (under a file) warns once and the run compiles as
    before; entries overwritten with garbage are compiled again, to the same numbers."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    bad, prov, err = _run(tmp_path, "bad", str(blocker / "cache"))
    assert "compilation cache folder" in err and "compiling without it" in err
    assert prov["compilation_cache"]["enabled"] is False
    assert "Not a directory" in prov["compilation_cache"]["reason"]
    folder = tmp_path / "cache"
    good, _, _ = _run(tmp_path, "good", str(folder))
    for entry in folder.glob("*-cache"):
        entry.write_bytes(b"\x00garbage")
    again, prov, _ = _run(tmp_path, "again", str(folder))
    assert bad["param_hash"] == good["param_hash"] == again["param_hash"]
    assert prov["compilation_cache"]["hits"] == 0  # nothing usable was loaded


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG cache folder is Linux's")
def test_the_default_folder_is_the_users_cache_folder(tmp_path):
    """Without ASYNCSIM_CACHE_DIR: platformdirs' per-user cache folder, + /jax."""
    _, prov, _ = _run(tmp_path, "default", None, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert prov["compilation_cache"]["dir"] == str(tmp_path / "xdg" / "asyncsim" / "jax")
    assert prov["compilation_cache"]["misses"] > 0


def test_a_cache_filled_under_one_thread_count_serves_another_with_its_numbers(tmp_path):
    """XLA's CPU thread count (PJRT_NPROC) acts when a program runs, not when it is compiled:
    programs compiled with one thread and loaded by a run with two give that run the numbers
    it computes with the cache off."""
    folder = str(tmp_path / "cache")
    _run(tmp_path, "one-thread", folder, PJRT_NPROC="1")
    warm, prov, _ = _run(tmp_path, "two-threads", folder, PJRT_NPROC="2")
    off, _, _ = _run(tmp_path, "two-threads-off", "off", PJRT_NPROC="2")
    assert prov["compilation_cache"]["hits"] > 0 and prov["pjrt_nproc"] == "2"
    assert warm["param_hash"] == off["param_hash"]
