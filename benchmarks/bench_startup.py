"""Start-up: a short run cold (empty compilation cache) and warm (every program cached),
side by side, and the imports every asyncsim process pays.

Each row is a fresh ``python -m asyncsim.cli run SCENARIO --profile smoke`` process, as a
user types it, timed on the wall clock from the parent (interpreter start, imports, the
run, the figure, the exit). A round runs, in turn: cold (a new, empty ``ASYNCSIM_CACHE_DIR``),
warm (the same folder again), and the same pair with ``--no-figure``; the table gives the
best and the median of the rounds, and warm / cold three ways: of the bests, of the
medians, and per round (each warm run over the cold run just before it: the median and
the range; issue target: <= 0.35 for the smoke quickstart). Every run of a round must end
with the same ``param_hash`` and every warm run must load all its programs from the cache
(provenance.json's ``compilation_cache``), or the script exits 1: the cache may make a run
faster, never different.

The imports are timed the same way, each in a fresh interpreter (best of the rounds):
``import ml_dtypes`` alone is in the table because one release of it (0.7.0: its ufunc loops'
registration, numpy's PyUFunc_AddLoop comparing each new loop with all before it) takes
~0.55 s of every process here, against ~5 ms for 0.6.0 -- hence ``ml_dtypes!=0.7.0`` in
pyproject.toml.

    python benchmarks/bench_startup.py [--repeat 3] [--scenario scenarios/quickstart.toml]
    python benchmarks/bench_startup.py --tiny --repeat 1   # with an MLP: seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = {"ml_dtypes": "import ml_dtypes", "jax": "import jax", "pandas": "import pandas",
           "matplotlib (figures)": "import matplotlib.figure, matplotlib.backends.backend_agg",
           "asyncsim.api": "import asyncsim.api"}
# --tiny: the same scenario with P1's network swapped for the default MLP (seconds, not
# tens of seconds, figure included).
TINY = ["--set", "model.name=mlp"]


def _env(cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASYNCSIM_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR")}
    env["ASYNCSIM_CACHE_DIR"] = cache
    return env


def run_once(scenario: Path, out: Path, cache: str, *, figure: bool, profile: str,
             overrides: list[str]) -> tuple[float, dict]:
    """Wall seconds of one ``asyncsim run`` process, and what its folder recorded."""
    cmd = [sys.executable, "-m", "asyncsim.cli", "run", str(scenario), "--out", str(out),
           "--quiet", "--profile", profile, *overrides]
    if not figure:
        cmd.append("--no-figure")
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(cache), cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"bench_startup: {' '.join(cmd)} failed:\n{r.stderr}")
    prov = json.loads((out / "provenance.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    return wall, {"param_hash": summary["param_hash"], **prov["compilation_cache"]}


def import_time(stmt: str) -> float:
    """Wall seconds of ``python -c stmt`` less those of ``python -c pass``."""
    def wall(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
        return time.perf_counter() - t0

    return wall(stmt) - wall("pass")


def main(argv=None) -> dict[str, list[float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scenario", default="scenarios/quickstart.toml")
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--tiny", action="store_true",
                    help="the scenario with the default MLP for its model (seconds)")
    a = ap.parse_args(argv)
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        tmp = Path(tmp)
        scenario = (ROOT / a.scenario).resolve()
        overrides = TINY if a.tiny else []
        for r in range(a.repeat):
            seen: dict[str, dict] = {}
            for figure in (True, False):
                cache = str(tmp / f"cache-{r}-{figure}")
                for kind in ("cold", "warm"):
                    name = f"{kind}{'' if figure else ', --no-figure'}"
                    wall, rec = run_once(scenario, tmp / f"run-{r}-{figure}-{kind}", cache,
                                         figure=figure, profile=a.profile,
                                         overrides=overrides)
                    times.setdefault(name, []).append(wall)
                    seen[name] = rec
            hashes = {rec["param_hash"] for rec in seen.values()}
            if len(hashes) != 1:
                sys.exit(f"bench_startup: cold and warm runs differ: {seen}")
            for suffix in ("", ", --no-figure"):
                cold, warm = seen[f"cold{suffix}"], seen[f"warm{suffix}"]
                if cold["hits"]:
                    sys.exit(f"bench_startup: a cold run loaded programs: {cold}")
                if warm["misses"] or warm["hits"] != cold["misses"]:
                    sys.exit(f"bench_startup: a warm run compiled again: {warm}")
        for name, stmt in IMPORTS.items():
            times[f"import {name}"] = [import_time(stmt) for _ in range(a.repeat)]
    programs = seen["cold"]["misses"]
    label = f"{a.scenario} --profile {a.profile}{' ' + ' '.join(TINY) if a.tiny else ''}"
    print(f"{label}: {a.repeat} round(s), {programs} programs compiled cold, all loaded warm, "
          "one param_hash")
    print(f"{'':<28} {'best':>8} {'median':>8}")
    for name, ts in times.items():
        print(f"{name:<28} {min(ts):>7.2f}s {statistics.median(ts):>7.2f}s")
    print(f"{'':<28} {'bests':>8} {'medians':>8}   {'per round: median [range]'}")
    report = Report("bench_startup", f"A run's wall time from the shell, cold and warm "
                    f"compilation cache ({label})")
    for name in ("cold", "warm", "warm, --no-figure"):
        report.row(f"{name}: asyncsim run to exit", min(times[name]), unit="s",
                   repeats=times[name])
    for suffix in ("", ", --no-figure"):
        cold, warm = times[f"cold{suffix}"], times[f"warm{suffix}"]
        # Each round's warm run follows its cold one: their ratio, pair by pair, moves less
        # with the machine's drifting speed than a ratio of bests or of medians.
        rounds = sorted(w / c for w, c in zip(warm, cold, strict=True))
        print(f"warm / cold{suffix:<17} {min(warm) / min(cold):>8.2f} "
              f"{statistics.median(warm) / statistics.median(cold):>8.2f}   "
              f"{statistics.median(rounds):.2f} [{rounds[0]:.2f}-{rounds[-1]:.2f}]"
              "   (target <= 0.35)")
        report.row(f"warm / cold{suffix}", statistics.median(rounds), target="<= 0.35",
                   repeats=rounds, note="per round, the median")
    for name in IMPORTS:
        report.row(f"import {name}", min(times[f"import {name}"]), unit="s",
                   repeats=times[f"import {name}"])
    if argv is None:
        report.save()
    import ml_dtypes  # after the timings: this process's own import is not measured

    print(f"ml_dtypes {ml_dtypes.__version__}")
    # Set, every process compiles asyncsim's own modules from source (Python writes no
    # .pyc): 0.06-0.1 s of each run here that a default Python does not pay.
    print(f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r} "
          "(inherited by the runs)")
    return times


if __name__ == "__main__":
    main()
