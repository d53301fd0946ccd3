"""The machine's part in a run's bits (asyncsim.machine): importing asyncsim fixes XLA's and
BLAS's thread counts, so one CPU gives the bits of two, and XLA's platform-independent math,
so one CPU model gives the bits of another (the quickstart's golden hash); provenance.json
names what could still change them, and a replay says which of those differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncsim.machine import BIT_FACTS, FIXED_XLA_FLAGS

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "scenarios" / "quickstart.toml")
_SET_BY_USERS = ("PJRT_NPROC", "NPROC", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                 "OMP_NUM_THREADS", "XLA_FLAGS")


def _fresh_env(**extra: str) -> dict[str, str]:
    """The environment of a fresh shell: none of the variables that set the thread counts
    (this test process has them from asyncsim's own import)."""
    env = {k: v for k, v in os.environ.items() if k not in _SET_BY_USERS}
    return {**env, **extra}


def _python(code: str, *args: str, cpus: set[int] | None = None, **env: str):
    """``python -c code args`` in a fresh environment; ``cpus``: pinned to them before
    anything is imported (what ``taskset -c`` does)."""
    pin = f"import os; os.sched_setaffinity(0, {sorted(cpus)!r}); " if cpus else ""
    return subprocess.run([sys.executable, "-c", pin + code, *args], env=_fresh_env(**env),
                          capture_output=True, text=True, timeout=600)


def _asyncsim(*args: str, cpus: set[int] | None = None, **env: str):
    """The ``asyncsim`` command in a fresh environment (see :func:`_python`)."""
    return _python("import sys; from asyncsim.cli import main; sys.exit(main(sys.argv[1:]))",
                   *args, cpus=cpus, **env)


_FACTS = ("import os, json, asyncsim; from asyncsim.machine import machine_facts; "
          "f = machine_facts(); print(json.dumps([os.environ['PJRT_NPROC'], "
          "os.environ['OPENBLAS_NUM_THREADS'], f['xla_threads'], f['blas']['num_threads'], "
          "f['threads_set_by_asyncsim'], f['jax_imported_first']]))")
_FLAGS = ("import os, json, asyncsim; from asyncsim.machine import machine_facts; "
          "f = machine_facts(); print(json.dumps([f['xla_flags'], "
          "f['xla_flags_set_by_asyncsim']]))")
PDM = FIXED_XLA_FLAGS[0]  # --xla_cpu_enable_platform_dependent_math=false


def test_importing_asyncsim_fixes_the_thread_counts_unless_the_user_did():
    r = _python(_FACTS)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["2", "1", 2, 1, ["OPENBLAS_NUM_THREADS", "PJRT_NPROC"],
                                    False]
    assert "JAX was imported" not in r.stderr
    r = _python(_FACTS, PJRT_NPROC="3", OPENBLAS_NUM_THREADS="1")
    assert json.loads(r.stdout) == ["3", "1", 3, 1, [], False]
    r = _python(_FACTS.replace("os.environ['PJRT_NPROC']", "os.environ.get('PJRT_NPROC')"),
                NPROC="3")  # XLA's other variable is the user's choice too
    assert json.loads(r.stdout) == [None, "1", 3, 1, ["OPENBLAS_NUM_THREADS"], False]


def test_importing_asyncsim_adds_the_platform_independent_math_flag_unless_named():
    assert PDM == "--xla_cpu_enable_platform_dependent_math=false"
    r = _python(_FLAGS)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [PDM, [PDM]]
    # The user's other flags are kept, the fixed one added after them.
    r = _python(_FLAGS, XLA_FLAGS="--xla_cpu_max_isa=AVX2")
    assert json.loads(r.stdout) == [f"--xla_cpu_max_isa=AVX2 {PDM}", [PDM]]
    # A flag the user set either way is the user's choice.
    for mine in ("--xla_cpu_enable_platform_dependent_math=true",
                 "--xla_cpu_enable_platform_dependent_math"):
        r = _python(_FLAGS, XLA_FLAGS=mine)
        assert json.loads(r.stdout) == [mine, []]


def test_jax_imported_first_is_said_once_and_recorded():
    r = _python("import jax; import importlib, asyncsim; importlib.reload(asyncsim); "
                + _FACTS.replace("import os, json, asyncsim; ", "import os, json; "))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("JAX was imported before asyncsim") == 1, r.stderr
    assert f"set PJRT_NPROC=2 and XLA_FLAGS={PDM} before starting Python" in r.stderr
    assert json.loads(r.stdout)[-1] is True
    # The user fixed both: nothing to say.
    r = _python("import jax; " + _FACTS, PJRT_NPROC="2", XLA_FLAGS=PDM)
    assert "JAX was imported" not in r.stderr and json.loads(r.stdout)[-1] is True


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


# The quickstart (smoke)'s param_hash and trace_hash, by (jax, jaxlib, numpy) version, for
# this revision of the numerics (asyncsim.numerics.core.NUMERICS_REVISION), measured on an
# AMD EPYC Zen 3 (family 25 model 1, AVX2 and FMA) with 1 or 2 CPUs; revision 1's hash was
# the same there and on a Zen 4 (family 25 model 17, AVX-512) (docs/reproducibility.md).
# Other versions may compile other code.
GOLDEN = {("0.10.2", "0.10.2", "2.4.6"): (
    "2ed92ddf6593401edb7b1d020d624e4344d38e32138b12d2c39599d2bdadeff8",
    "d8234fc8b80d91e21a57607902aadb23927d608c0338465666ce0372a1470f3a")}


def test_the_quickstart_ends_at_its_golden_bits_on_this_cpu_model(tmp_path):
    """What "same bits on every machine" means, checked on whichever machine runs the suite:
    the CPU model, its ISA beyond the AVX2 + FMA floor and the core count do not change the
    quickstart's parameters."""
    from importlib.metadata import version

    versions = tuple(version(p) for p in ("jax", "jaxlib", "numpy"))
    if versions not in GOLDEN:
        pytest.skip(f"no golden hash recorded for jax, jaxlib, numpy {versions}")
    out = tmp_path / "qs"
    r = _asyncsim("run", QUICKSTART, "--profile", "smoke", "--no-figure", "--quiet", "--out",
                  str(out))
    assert r.returncode == 0, r.stderr
    s, prov = _summary(out), json.loads((out / "provenance.json").read_text())
    machine = {k: prov[k] for k in ("cpu_model", "cpu_id", "cpu_flags", "xla_flags",
                                    "xla_threads", "blas")}
    assert (s["param_hash"], s["trace_hash"]) == GOLDEN[versions], (
        f"this machine's bits differ from the golden ones: {machine}")


def test_one_cpu_gives_the_bits_of_two(tmp_path):
    """The quickstart (smoke) pinned to one CPU ends at the same param_hash as on two, and a
    pinned replay matches its source with nothing to report; with XLA's pool at one thread
    (PJRT_NPROC=1, the size XLA picks under `taskset -c 0` unless told) the bits differ and
    the replay names the cause."""
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to compare one with two")
    one = {min(cpus)}
    src, pinned = tmp_path / "src", tmp_path / "pinned"
    base = ("run", QUICKSTART, "--profile", "smoke", "--no-figure", "--quiet", "--out")
    for folder, pin in ((src, None), (pinned, one)):
        r = _asyncsim(*base, str(folder), cpus=pin)
        assert r.returncode == 0, r.stderr
    a, b = _summary(src), _summary(pinned)
    assert (b["param_hash"], b["trace_hash"]) == (a["param_hash"], a["trace_hash"])
    prov = json.loads((pinned / "provenance.json").read_text())
    assert prov["cpu_affinity"] == 1 and prov["xla_threads"] == 2

    r = _asyncsim("replay", str(src), "--path", "loop", "--out", str(tmp_path / "rep"),
                  cpus=one)
    assert r.returncode == 0, r.stderr
    s = _summary(tmp_path / "rep")
    assert s["matches_source"] is True and s["environment_changes"] == []

    r = _asyncsim("replay", str(src), "--path", "loop", "--out", str(tmp_path / "rep1"),
                  cpus=one, PJRT_NPROC="1")
    assert r.returncode == 0, r.stderr
    s = _summary(tmp_path / "rep1")
    assert s["matches_source"] is False
    assert s["environment_changes"] == ["xla_threads: 2 -> 1"]
    assert "depend on: xla_threads: 2 -> 1" in r.stdout.splitlines()[-1]


def test_provenance_names_what_changes_bits_and_replay_compares_it(tmp_path):
    """provenance.json records the CPU (model, identity, ISA flags), XLA's threads and flags,
    BLAS (library, kernel, threads) and the versions; a replay compares each with its own,
    and `asyncsim compare` of two runs whose parameters differ names what differs."""
    from conftest import TINY

    from asyncsim._io import dump_toml

    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(TINY))
    src = tmp_path / "src"
    r = _asyncsim("run", str(path), "--out", str(src), "--quiet", "--no-figure")
    assert r.returncode == 0, r.stderr
    prov = json.loads((src / "provenance.json").read_text())
    for key in BIT_FACTS:
        assert key in prov, key
    assert prov["xla_threads"] == 2 and prov["xla_flags"] == PDM
    assert prov["blas"]["num_threads"] == 1 and prov["blas"]["internal_api"]
    assert prov["plugins"] == [] and prov["versions"]["numpy"]
    if sys.platform == "linux" and os.uname().machine == "x86_64":
        assert {"avx2", "fma"} <= set(prov["cpu_flags"]), prov["cpu_flags"]
        assert prov["cpu_model"] and prov["cpu_id"]

    # The source, as if recorded on another CPU with other XLA flags.
    other = {**prov, "cpu_model": "Other CPU", "cpu_flags": ["sse4_2", "avx"],
             "xla_flags": "--xla_cpu_max_isa=AVX", "versions": {**prov["versions"],
                                                                "numpy": "1.0.0"}}
    (src / "provenance.json").write_text(json.dumps(other))
    # ... and by an earlier revision of the update core's numerics.
    from asyncsim.numerics.core import NUMERICS_REVISION

    summary = _summary(src)
    (src / "summary.json").write_text(json.dumps({**summary, "numerics_revision": 1}))
    r = _asyncsim("replay", str(src), "--path", "loop", "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    assert _summary(tmp_path / "rep")["environment_changes"] == [
        f"cpu_model: 'Other CPU' -> {prov['cpu_model']!r}",
        f"cpu_flags: ['sse4_2', 'avx'] -> {prov['cpu_flags']!r}",
        f"xla_flags: '--xla_cpu_max_isa=AVX' -> {PDM!r}",
        f"numerics_revision: 1 -> {NUMERICS_REVISION}",
        f"numpy: '1.0.0' -> {prov['versions']['numpy']!r}"]

    seven = tmp_path / "seed8"
    r = _asyncsim("run", str(path), "--out", str(seven), "--seed", "8", "--quiet",
                  "--no-figure")
    assert r.returncode == 0, r.stderr
    r = _asyncsim("compare", str(src), str(seven))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == (
        "param_hash: A's differs from B's; the machines differ in what the last bits depend "
        f"on: cpu_model: 'Other CPU' -> {prov['cpu_model']!r}; cpu_flags: ['sse4_2', 'avx'] "
        f"-> {prov['cpu_flags']!r}; xla_flags: '--xla_cpu_max_isa=AVX' -> {PDM!r}; "
        f"numerics_revision: 1 -> {NUMERICS_REVISION}; numpy: "
        f"'1.0.0' -> {prov['versions']['numpy']!r}")
    r = _asyncsim("compare", str(src), str(src))
    assert r.stdout.splitlines()[-1] == ("param_hash: the same in A and B (bit-identical "
                                         "parameters)")
