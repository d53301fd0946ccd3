"""Run folders: one folder per run, written so that a killed run never leaves a corrupt one.

Layout (docs/design.md, "Run folders and measurements")::

    RUN_DIR/
      scenario.toml          the resolved scenario (profile and --set applied); rerunnable
      trace_grads.parquet    one row per applied gradient   } asyncsim.trace.Trace
      trace_updates.parquet  one row per update             }
      trace_meta.json
      updates.parquet        per-update numerics (train loss of the update's batches, lr)
      eval.csv               evaluations: version, sim_time, epoch, train_loss, test_error...
      summary.json           headline figures; written LAST: its presence marks completion
      provenance.json        package versions, git revision, seed, command, platform
      checkpoint/            numerics state every run.checkpoint_every updates (--resume)

Every file is written to a temporary name and renamed into place (atomic on POSIX), so a
reader sees either the old or the new file. A folder without ``summary.json`` is an
unfinished run: ``asyncsim run --resume DIR`` continues an online run (``asyncsim real
--resume DIR`` a real one); an unfinished trace or replay is redone with ``--force``
(``provenance.json`` says which driver wrote a folder: :func:`driver_of`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from asyncsim import _io
from asyncsim._io import dump_toml
from asyncsim._moved import deprecated_names
from asyncsim.config import Scenario, to_dict
from asyncsim.errors import ScenarioError

SUMMARY = "summary.json"
# What a scenario's [measure] table stores (asyncsim.stability.measure), which the figures
# read: a run folder's sharpness along the run, a sweep folder's measured stability edges.
SHARPNESS_CSV = "sharpness.csv"
EDGES_CSV = "edges.csv"

deprecated_names(__name__, globals(), {"jsonable": "asyncsim._io:jsonable"})


class RunFolderError(RuntimeError):
    """A run folder that cannot be used as asked (exists, incomplete, not a run)."""


# The run folder's names for the one atomic writer (:mod:`asyncsim._io`).
atomic_write_text = _io.write_text
atomic_write_json = _io.write_json


def is_complete(folder: str | os.PathLike) -> bool:
    return (Path(folder) / SUMMARY).exists()


def require_run_folder(folder: str | os.PathLike, *, scenario: bool = True) -> Path:
    """``folder`` as a Path if it holds a trace (and, with ``scenario``, its scenario.toml);
    otherwise a one-line :class:`RunFolderError` saying what it is instead: missing, a
    sweep folder (naming one of its points) or a folder without a trace."""
    # Imported here: the trace module imports pandas (~0.5 s), and this module is on the CLI's
    # error path, which reports a misspelt key before any heavy import (tests/test_cli.py).
    from asyncsim.trace import FILES as TRACE_FILES

    folder = Path(folder)
    if not folder.is_dir():
        raise RunFolderError(f"{folder}: no such run folder")
    need = (("scenario.toml",) if scenario else ()) + TRACE_FILES
    missing = [f for f in need if not (folder / f).exists()]
    if missing and (folder / "index.csv").exists():
        points = sorted(p.name for p in folder.iterdir() if (p / TRACE_FILES[0]).exists())
        example = f" (e.g. {folder / points[0]})" if points else ""
        raise RunFolderError(f"{folder}: a sweep folder; use one of its points{example}")
    if missing:
        raise RunFolderError(f"{folder}: not a run folder with a trace (missing "
                             f"{', '.join(missing)})")
    return folder


def driver_of(folder: Path) -> str:
    """What wrote a run folder, from its provenance.json: ``"online"`` (``asyncsim run``),
    ``"real"``, ``"replay"`` or ``"trace"`` (timing only)."""
    try:
        prov = json.loads((folder / "provenance.json").read_text())
    except (OSError, ValueError):
        return "online"
    return prov.get("driver") or ("replay" if prov.get("replay_of") is not None else "online")


# What each kind of unfinished folder is, and how to go on: only online and real runs
# checkpoint, so only they resume.
_LABEL = {"online": "run", "real": "real run", "replay": "replay", "trace": "trace"}
_RESUME = {"online": "asyncsim run --resume {f}", "real": "asyncsim real --resume {f}"}
_REDO = {"trace": "a trace is quick to redo: pass --force",
         "replay": "a replay has no checkpoints: rerun asyncsim replay with --force"}


def _go_on(kind: str, folder: Path) -> str:
    return (f"continue it with {_RESUME[kind].format(f=folder)}" if kind in _RESUME
            else _REDO.get(kind, "pass --force to start over"))


def resume_folder(folder: str | os.PathLike, *, driver: str = "online") -> Path:
    """The folder ``--resume`` names, as a Path; a one-line :class:`RunFolderError` when
    there is no such folder, or when ``driver`` cannot continue what wrote it (a timing-only
    trace has no gradients to resume; a real run resumes with ``asyncsim real``, an online
    one with ``asyncsim run``). An unfinished run may not have its trace files yet, so this
    checks less than :func:`require_run_folder`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RunFolderError(f"{folder}: no such run folder to resume")
    kind = driver_of(folder)
    # A replay changes numerics only, so an online run of its scenario.toml simulates the
    # same trace and ends with the same parameters: `run --resume` may redo it.
    ok = {driver, "replay"} if driver == "online" else {driver}
    if kind not in ok and not is_complete(folder):
        raise RunFolderError(f"{folder}: an unfinished {_LABEL.get(kind, kind)}; "
                             f"{_go_on(kind, folder)}")
    return folder


def read_summary(folder: str | os.PathLike) -> dict[str, Any]:
    return json.loads((Path(folder) / SUMMARY).read_text())


def profile_suffix(profile: str | None) -> str:
    """``""`` for the default profile, ``"-smoke"`` for ``smoke``: the one rule that names a
    profile's run folders (``runs/NAME-smoke``) apart from the default's (``runs/NAME``)."""
    return "" if profile in (None, "default") else f"-{profile}"


def sweep_out(name: str, profile: str | None, runs_dir: str | os.PathLike = "runs") -> Path:
    """Where a scenario's sweep (or its single runs, one folder per seed) lives."""
    return Path(runs_dir) / f"{name}{profile_suffix(profile)}"


def default_out(scn: Scenario, profile: str | None) -> Path:
    return sweep_out(scn.name, profile) / f"seed{scn.seed}"


def prepare(folder: str | os.PathLike, *, resume: bool = False, force: bool = False) -> Path:
    """Create (or reopen, with ``resume``) a run folder; refuse to clobber a finished run."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        if is_complete(folder) and not force:
            if resume:
                raise RunFolderError(f"{folder}: the run is complete; nothing to resume")
            raise RunFolderError(f"{folder}: already holds a complete run; "
                                 "choose another --out or pass --force")
        if not resume and not force and not is_complete(folder):
            kind = driver_of(folder)
            raise RunFolderError(f"{folder}: holds an unfinished {_LABEL.get(kind, kind)}; "
                                 f"{_go_on(kind, folder)}"
                                 + (", or pass --force to start over" if kind in _RESUME else ""))
        if force:
            for p in folder.iterdir():
                _remove(p)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# What a run writes before its first update: a folder holding only these has no results.
START_FILES = frozenset({"scenario.toml", "provenance.json"})


@contextlib.contextmanager
def removed_on_scenario_error(folder: Path | None, *, resume: bool = False):
    """Around the part of a run that can still find bad input (building the model and data
    set, a delay model's draws): on a :class:`ScenarioError`, :func:`discard_unstarted` a
    folder this run created, then re-raise."""
    try:
        yield
    except ScenarioError:
        if not resume:
            discard_unstarted(folder)
        raise


def discard_unstarted(folder: Path | None) -> None:
    """Remove ``folder`` if it holds nothing but :data:`START_FILES` (a run that stopped on a
    scenario error before producing anything), so bad input leaves no half-written folder;
    a folder with checkpoints or metrics is kept."""
    if folder is None or not folder.is_dir():
        return
    entries = list(folder.iterdir())
    if all(p.name in START_FILES and p.is_file() for p in entries):
        for p in entries:
            p.unlink()
        folder.rmdir()


def _remove(p: Path) -> None:
    if p.is_dir():
        for q in p.iterdir():
            _remove(q)
        p.rmdir()
    else:
        p.unlink()


# ----------------------------------------------------------------------------- TOML out
def scenario_toml(scn: Scenario) -> str:
    """The resolved scenario as a run folder's ``scenario.toml`` holds it (no ``source``)."""
    d = to_dict(scn)
    d.pop("source", None)
    return dump_toml(d)


def write_scenario(folder: Path, scn: Scenario) -> None:
    atomic_write_text(folder / "scenario.toml", scenario_toml(scn))


# ----------------------------------------------------------------------------- provenance
def git_revision() -> dict[str, Any]:
    here = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
        if rev.returncode != 0:
            return {"git_revision": None}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True, timeout=5)
        return {"git_revision": rev.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"git_revision": None}


def provenance(scn: Scenario, **extra: Any) -> dict[str, Any]:
    versions = {}
    for pkg in ("asyncsim", "jax", "jaxlib", "numpy", "simpy", "optax", "pandas", "ray"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "seed": scn.seed,
        "scenario_file": scn.source,
        "versions": versions,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "command": sys.argv,
        **git_revision(),
        **extra,
    }


def write_provenance(folder: Path, scn: Scenario, **extra: Any) -> None:
    atomic_write_json(folder / "provenance.json", provenance(scn, **extra))


def write_summary(folder: Path, summary: Mapping[str, Any]) -> None:
    atomic_write_json(folder / SUMMARY, summary)
