"""A benchmark's results as data: ``benchmarks/results/NAME.json``, one file per benchmark,
rewritten by each run (its history is git's). ``benchmarks/render.py`` makes the performance
page (docs/performance.md) from them.

Each row holds its value (a ratio measured side by side, or a time), the spread of that
value over the run's repeats where it has them, its unit and its target; the file holds the
machine (its CPU, cores and the facts a run's bits depend on), the package versions, the git
revision and the command line that produced it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
_PACKAGES = ("asyncsim", "jax", "jaxlib", "numpy", "simpy", "optax", "ray")


def spread(values: Sequence[float]) -> dict[str, float]:
    """The median and the range of repeated measurements of one quantity."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round ratios a[i] / b[i] of two series timed side by side, round by round."""
    return [x / y for x, y in zip(a, b, strict=True)]


class Report:
    """The rows of one benchmark run; :meth:`save` writes them with the machine they ran on."""

    def __init__(self, name: str, what: str):
        self.name, self.what = name, what
        self.rows: list[dict[str, Any]] = []

    def row(self, label: str, value: float, *, unit: str = "ratio", target: str | None = None,
            repeats: Sequence[float] | None = None, note: str = "") -> None:
        """A row: ``value`` in ``unit`` (``ratio``, ``s``, ``events/s``...), ``target`` as
        text (``<= 1.10``), ``repeats`` the value's own measurements (its spread)."""
        self.rows.append({"row": label, "value": float(value), "unit": unit, "target": target,
                          "spread": spread(repeats) if repeats else None, "note": note})

    def save(self) -> Path:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"{self.name}.json"
        record = {"benchmark": self.name, "what": self.what, "rows": self.rows,
                  "machine": _machine(), "versions": _versions(), "git": _git(),
                  "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
        path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
        print(f"results: {path}")
        return path


def _machine() -> dict[str, Any]:
    from asyncsim.machine import machine_facts

    facts = machine_facts()
    keep = ("cpu_model", "cpu_id", "cpu_flags", "cpu_affinity", "xla_threads", "xla_flags")
    return {**{k: facts.get(k) for k in keep}, "cores": os.cpu_count()}


def _versions() -> dict[str, str | None]:
    out = {}
    for pkg in _PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


# What the benchmarks write, relative to the repository's root (see _git).
_OUTPUTS = ("benchmarks/results", "docs/performance.md")


def _git(here: Path = HERE) -> dict[str, Any]:
    """The revision of the repository holding ``here`` and whether its tracked files differ
    from it, the benchmarks' outputs (:data:`_OUTPUTS`) aside."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        # The benchmarks' own outputs (their results and the page rendered from them) are
        # not changes to the code measured: a second script run after a first still
        # measures the same revision.
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                     "--", *(f":(top,exclude){p}" for p in _OUTPUTS)],
                                    cwd=here, capture_output=True, text=True,
                                    timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return {"revision": None, "dirty": None}
    return {"revision": rev or None, "dirty": dirty}
