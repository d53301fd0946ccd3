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
      checkpoint.npz         numerics state every run.checkpoint_every updates (--resume),
                             with the resolved scenario it belongs to
      inputs/                copies of the files the scenario reads (an empirical delay CSV),
                             which its scenario.toml names, so the folder replays anywhere
      .lock                  held by the one process writing the folder (:func:`opened`)

Every file is written to a temporary name and renamed into place (atomic on POSIX), so a
reader sees either the old or the new file. A folder without ``summary.json`` is an
unfinished run: ``asyncsim run --resume DIR`` continues an online run (``asyncsim real
--resume DIR`` a real one); an unfinished trace or replay is redone with ``--force``
(``provenance.json`` says which driver wrote a folder: :func:`driver_of`). One process
writes a folder at a time: a second writer is refused with one line (:func:`opened`).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import os
import platform
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from asyncsim import _io
from asyncsim._io import PROVENANCE, SCENARIO_TOML, SUMMARY, SWEEP_INDEX, dump_toml
from asyncsim.config import Scenario, to_dict
from asyncsim.errors import ScenarioError
from asyncsim.machine import BIT_FACTS, machine_facts
from asyncsim.trace import FILES as TRACE_FILES

LOCK = ".lock"
INPUTS = "inputs"
# What a scenario's [measure] table stores (asyncsim.stability.measure), which the figures
# read: a run folder's sharpness along the run, a sweep folder's measured stability edges.
SHARPNESS_CSV = "sharpness.csv"
EDGES_CSV = "edges.csv"


class RunFolderError(RuntimeError):
    """A run folder that cannot be used as asked (exists, incomplete, not a run)."""


# The errors that are one line for the user, not a traceback (asyncsim.cli prints them; the
# real driver unwraps them from the PS actor's remote errors).
ONE_LINE_ERRORS = (ScenarioError, RunFolderError, _io.WriteError, _io.DamagedFile)


# The run folder's names for the one atomic writer (:mod:`asyncsim._io`).
atomic_write_text = _io.write_text
atomic_write_json = _io.write_json


def is_complete(folder: str | os.PathLike) -> bool:
    return (Path(folder) / SUMMARY).exists()


def require_run_folder(folder: str | os.PathLike, *, scenario: bool = True) -> Path:
    """``folder`` as a Path if it holds a trace (and, with ``scenario``, its scenario.toml);
    otherwise a one-line :class:`RunFolderError` saying what it is instead: missing, a
    sweep folder (naming one of its points) or a folder without a trace."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RunFolderError(f"{folder}: no such run folder")
    need = ((SCENARIO_TOML,) if scenario else ()) + TRACE_FILES
    missing = [f for f in need if not (folder / f).exists()]
    if missing and is_sweep_folder(folder):
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
        prov = _io.read_json(folder / PROVENANCE)
    except _io.DamagedFile:
        return "online"
    return driver_from(prov)


def driver_from(prov: Mapping[str, Any]) -> str:
    """:func:`driver_of` from a provenance record already read (an older folder names no
    driver: a replay then says what it replayed)."""
    return prov.get("driver") or ("replay" if prov.get("replay_of") is not None else "online")


# What wrote a run folder (its provenance's ``driver``), in words; the one naming of the
# kinds, for messages and ``asyncsim show``.
KIND_LABELS = {"online": "simulated run", "real": "real run", "replay": "replay",
               "trace": "timing-only trace"}
# How to go on with an unfinished folder of each kind: only online and real runs
# checkpoint, so only they resume.
_RESUME = {"online": "asyncsim run --resume {f}", "real": "asyncsim real --resume {f}"}
_REDO = {"trace": "a trace is quick to redo: pass --force",
         "replay": "a replay has no checkpoints: rerun asyncsim replay with --force"}


def _go_on(kind: str, folder: Path) -> str:
    if kind in _RESUME and not (folder / SCENARIO_TOML).exists():
        # Killed before the run wrote its scenario (or a full disk left only its temporary
        # file): there is nothing to continue from.
        return "it was stopped before it wrote scenario.toml, so it cannot be resumed: " \
               "pass --force to start over"
    return (f"continue it with {_RESUME[kind].format(f=folder)}" if kind in _RESUME
            else _REDO.get(kind, "pass --force to start over"))


def unfinished_advice(folder: str | os.PathLike) -> str:
    """How to go on with an unfinished folder, in the words of the commands that refuse it:
    the resume of an online or real run, the redo of a replay or a trace."""
    folder = Path(folder)
    kind = driver_of(folder)
    if kind == "replay":
        # A replay re-executes its source's trace; it has no checkpoints to resume from.
        src = _replay_source(folder)
        return ("a replay has no checkpoints: " + (f"asyncsim replay {src} --out {folder} "
                                                  "--force" if src
                                                  else "rerun asyncsim replay with --force"))
    return _go_on(kind, folder)


def _replay_source(folder: Path) -> str | None:
    try:
        return _io.read_json(folder / PROVENANCE).get("replay_of")
    except _io.DamagedFile:
        return None


def resume_folder(folder: str | os.PathLike, *, driver: str = "online") -> Path:
    """The folder ``--resume`` names, as a Path; a one-line :class:`RunFolderError` when
    there is no such folder, or when ``driver`` cannot continue what wrote it (a timing-only
    trace has no gradients to resume; a real run resumes with ``asyncsim real``, an online
    one with ``asyncsim run``). An unfinished run may not have its trace files yet, so this
    checks less than :func:`require_run_folder`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RunFolderError(f"{folder}: no such run folder to resume")
    if is_complete(folder):
        return folder  # prepare() says there is nothing to resume
    if is_sweep_folder(folder):
        # A sweep checkpoints by point: running its scenario again skips the complete ones.
        raise RunFolderError(f"{folder}: a sweep folder; a sweep goes on when its scenario "
                             f"runs again into it (asyncsim run SCENARIO --out {folder}), "
                             "which keeps its complete points")
    kind = driver_of(folder)
    if kind == "replay":
        # Resuming a replay as an online run would simulate a new timeline in its place (a
        # real run's replay: a simulated trace with parameters of neither run).
        raise RunFolderError(f"{folder}: an unfinished replay; {unfinished_advice(folder)}")
    if kind != driver:
        raise RunFolderError(f"{folder}: an unfinished {KIND_LABELS.get(kind, kind)}; "
                             f"{_go_on(kind, folder)}")
    if not (folder / SCENARIO_TOML).exists():
        raise RunFolderError(f"{folder}: nothing to resume: {_go_on(kind, folder)}")
    return folder


def profile_suffix(profile: str | None) -> str:
    """``""`` for the default profile, ``"-smoke"`` for ``smoke``: the one rule that names a
    profile's run folders (``runs/NAME-smoke``) apart from the default's (``runs/NAME``)."""
    return "" if profile in (None, "default") else f"-{profile}"


def sweep_out(name: str, profile: str | None, runs_dir: str | os.PathLike = "runs") -> Path:
    """Where a scenario's sweep (or its single runs, one folder per seed) lives."""
    return Path(runs_dir) / f"{name}{profile_suffix(profile)}"


def default_out(scn: Scenario, profile: str | None) -> Path:
    return sweep_out(scn.name, profile) / f"seed{scn.seed}"


# Files only asyncsim writes: a folder holding one is a run or sweep folder.
_MARKS = _io.RUN_MARKS


def is_run_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a run or sweep folder: it holds a file only asyncsim writes, or
    nothing but what a run writes first (:data:`START_FILES`: a run stopped as it started)."""
    folder = Path(folder)
    if not folder.is_dir():
        return False
    if any((folder / m).exists() for m in _MARKS):
        return True
    return all(p.name in START_FILES or p.name.endswith(".tmp") for p in folder.iterdir())


# What a sweep writes in its folder (asyncsim.sweep): its index, a run folder per point and
# per shared trace, the measured edges, the figures drawn into it, the lock and temporary
# files. A folder holding anything else is not a sweep's, whatever it is named. Its index is
# _io.SWEEP_INDEX (also one of the marks of a folder asyncsim wrote).
_SWEEP_RUNS = re.compile(r"p\d{3,}|trace_g\d{2,}")
_SWEEP_FILES = frozenset({"edges.csv", LOCK})


def is_sweep_folder(folder: str | os.PathLike, *, besides: str | None = None) -> bool:
    """Whether ``folder`` holds a sweep: nothing but what a sweep writes there (its index,
    whose first column is ``point``; run folders named as its points and shared traces;
    ``edges.csv``; a ``figures`` folder; the lock and temporary files), and at least its
    index or one point or shared trace (a sweep stopped while it simulated its traces
    writes no index yet). ``besides``: an entry not to count (a folder being created in it)."""
    odd, own = _sweep_entries(Path(folder), besides)
    return own and not odd


def _sweep_entries(folder: Path, besides: str | None = None) -> tuple[list[str], bool]:
    """The names in ``folder`` that a sweep does not write there, sorted, and whether it
    holds a sweep's index, point or shared trace."""
    if not folder.is_dir():
        return [], False
    odd, own = [], False
    for p in folder.iterdir():
        name = p.name
        if name == besides or name in _SWEEP_FILES or (name.startswith(".")
                                                        and name.endswith(".tmp")):
            continue
        if _SWEEP_RUNS.fullmatch(name):
            ok = p.is_dir() and is_run_folder(p)
        elif name == SWEEP_INDEX:
            ok = _is_index(p)
        else:
            ok = name == "figures" and p.is_dir()
        if ok:
            own = own or name != "figures"
        else:
            odd.append(name)
    return sorted(odd), own


def _is_index(path: Path) -> bool:
    """Whether ``path`` is a sweep's index: a CSV file whose first column is ``point``."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
            return path.is_file() and head in (b"point", b"point,", b"point\n", b"point\r")
    except OSError:
        return False


def sweep_names(folder: str | os.PathLike) -> set[str | None]:
    """The scenario names the points and shared traces of the sweep ``folder`` recorded
    (each carries its sweep's name; None: one whose scenario has no name); a run folder that
    has not written its scenario yet, or whose scenario is damaged, adds none."""
    names: set[str | None] = set()
    for run in Path(folder).iterdir():
        if _SWEEP_RUNS.fullmatch(run.name):
            try:
                names.add(_io.read_toml(run / SCENARIO_TOML).get("name"))
            except _io.DamagedFile:  # missing (not started) or cut short
                continue
    return names


def prepare_sweep(folder: str | os.PathLike, name: str, *, force: bool = False) -> Path:
    """Check, holding its lock, that the sweep of scenario ``name`` may write ``folder``:
    a new or empty folder, or a sweep folder (:func:`is_sweep_folder`) of that scenario's,
    which the sweep goes on in (its complete points are kept). With ``force`` a sweep
    folder is emptied first, whatever scenario's it is, as ``--force`` removes a run's files
    before the run starts. A run's folder, or a folder holding anything a sweep does not
    write, is refused with or without ``force`` (one line): ``--force`` replaces a sweep
    with a sweep only."""
    folder = Path(folder)
    nested = _nesting_refusal(folder)
    if nested is not None:
        raise _refused(folder, nested)
    entries = ([p for p in folder.iterdir() if p.name != LOCK and not p.name.endswith(".tmp")]
               if folder.is_dir() else [])
    if not entries:
        return folder
    odd, own = _sweep_entries(folder)
    if odd or not own:
        if any((folder / m).exists() for m in _MARKS if m != SWEEP_INDEX) or all(
                p.name in START_FILES for p in entries):
            raise RunFolderError(f"{folder}: holds a {KIND_LABELS.get(driver_of(folder))}, "
                                 "not a sweep; --force replaces a sweep only: choose "
                                 "another --out")
        if not odd:  # a figures/ folder or edges.csv, with no index, point or trace
            raise RunFolderError(f"{folder}: holds no sweep, only "
                                 f"{', '.join(sorted(p.name for p in entries))}; choose "
                                 "another --out")
        raise RunFolderError(f"{folder}: holds what a sweep does not write (e.g. {odd[0]}); "
                             "choose another --out")
    if force:
        _remove_for_force(folder)
        return folder
    others = sweep_names(folder) - {name}
    if others:
        which = ", ".join(sorted(repr(n) if n is not None else "one without a name"
                                 for n in others))
        raise RunFolderError(f"{folder}: holds runs of scenario {which}, not {name!r}; "
                             "choose another --out or pass --force to replace the sweep")
    return folder


def run_folder_of(path: str | os.PathLike) -> Path | None:
    """The run or sweep folder that ``path`` (a file to write, once links are followed) lies
    in, or None."""
    p = Path(path).resolve()
    for d in p.parents:
        if any((d / m).exists() for m in _MARKS):
            return d
    return None


# What a figure can be written as (matplotlib infers the format from the suffix).
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


def output_file(path: str | os.PathLike, *, flag: str, verb: str,
                suffixes: tuple[str, ...] = FIGURE_SUFFIXES,
                own: str | os.PathLike | None = None) -> Path:
    """``path``, a file the user names for ``asyncsim VERB`` to write (a figure, a
    calibrated scenario), checked before anything is computed. Refused with one line (a
    :class:`ScenarioError` under ``flag``) when its suffix is not one of ``suffixes``, when
    something that is not a file is there (a folder, a device such as /dev/full, a broken
    link: writing would replace it), or when it lies inside a run or sweep folder
    (:func:`run_folder_of`) other than at ``own``, the one file there this verb writes
    (RUN_DIR/timeline.png): another verb's output never replaces a file of a run."""
    path = Path(path)
    where = f"asyncsim {verb}"
    if suffixes and path.suffix.lower() not in suffixes:
        raise ScenarioError(flag, f"must name a {' | '.join(suffixes)} file, got "
                            f"{str(path)!r}", file=where)
    if (path.exists() or path.is_symlink()) and not path.is_file():
        what = ("a folder" if path.is_dir() else "a broken link" if not path.exists()
                else "not a regular file")
        raise ScenarioError(flag, f"{path} is {what}; name a file to write", file=where)
    if own is None or path.resolve() != Path(own).resolve():
        home = run_folder_of(path)
        if home is not None:
            only = f" (asyncsim {verb} writes there only {own})" if own is not None else ""
            raise ScenarioError(flag, f"{path} is inside the run folder {home}, whose files "
                                f"only its run writes{only}; choose a file elsewhere",
                                file=where)
    return path


def prepare(folder: str | os.PathLike, *, resume: bool = False, force: bool = False,
            source: str | os.PathLike | None = None) -> Path:
    """Create (or reopen, with ``resume``) a run folder; refuse to clobber a finished run,
    and never touch a folder that is not a run folder (:func:`is_run_folder`): ``--force``
    removes a run, not whatever else ``--out`` names. A run folder never lies inside another
    run's, but for a replay's inside its ``source`` (``RUN/replay``), which it may not hold
    (:func:`_nesting_refusal`). Call it holding the folder's lock (:func:`opened` does
    both)."""
    folder = Path(folder)
    nested = _nesting_refusal(folder, source)
    if nested is not None:
        raise _refused(folder, nested)
    if folder.is_dir():
        if is_sweep_folder(folder):
            raise RunFolderError(f"{folder}: a sweep folder; a run writes a folder of its "
                                 "own, and --force replaces a run only: choose another --out")
        # Where the folder is, links followed: a link to a sweep's point is that point.
        refused = _sweep_refusal(folder.resolve(), resume=resume)
        if refused is not None:
            raise _refused(folder, refused)
        if not is_run_folder(folder):
            others = sorted(p.name for p in folder.iterdir()
                            if p.name not in START_FILES and not p.name.endswith(".tmp"))
            raise RunFolderError(f"{folder}: holds files that are not a run's (e.g. "
                                 f"{others[0]}); --force removes runs only: choose another "
                                 "--out")
        for p in folder.glob(".*.tmp"):
            p.unlink()  # a write cut short by a kill: never part of the run
        if resume:
            _io.no_links_inside(folder)  # what the run goes on writing stays inside it
    if folder.exists() and any(p.name != LOCK for p in folder.iterdir()):
        if is_complete(folder) and not force:
            if resume:
                raise RunFolderError(f"{folder}: the run is complete; nothing to resume")
            raise RunFolderError(f"{folder}: already holds a complete run; "
                                 "choose another --out or pass --force")
        if not resume and not force and not is_complete(folder):
            kind = driver_of(folder)
            go_on = _go_on(kind, folder)
            raise RunFolderError(f"{folder}: holds an unfinished {KIND_LABELS.get(kind, kind)}; "
                                 f"{go_on}" + ("" if "--force" in go_on
                                                else ", or pass --force to start over"))
        if force:
            _remove_for_force(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# The sweep folders whose points this process writes as jobs of their sweep, which another
# process (the sweep's, when its jobs run as Ray tasks) may hold the lock of: how many jobs
# of each are under way (an executor may run several in threads of one process).
_SWEEP_JOBS: collections.Counter[Path] = collections.Counter()
_SWEEP_JOBS_LOCK = threading.Lock()


@contextlib.contextmanager
def sweep_job(sweep: str | os.PathLike) -> Iterator[None]:
    """The block writes points of the sweep in ``sweep`` for that sweep (a job of
    :func:`asyncsim.sweep.run_sweep`, here or in a Ray worker): :func:`prepare` lets it
    write them while the sweep runs."""
    key = Path(sweep).resolve()
    with _SWEEP_JOBS_LOCK:
        _SWEEP_JOBS[key] += 1
    try:
        yield
    finally:
        with _SWEEP_JOBS_LOCK:
            _SWEEP_JOBS[key] -= 1
            if not _SWEEP_JOBS[key]:
                del _SWEEP_JOBS[key]


def _refused(folder: Path, why: str) -> RunFolderError:
    """The one-line refusal of ``folder`` for ``why``; the folder is discarded first if it
    holds nothing but the lock (made for this run or sweep: nothing is left behind)."""
    if folder.is_dir() and all(p.name == LOCK for p in folder.iterdir()):
        discard_unstarted(folder)
    return RunFolderError(f"{folder}: {why}")


def _nesting_refusal(folder: Path, source: str | os.PathLike | None = None) -> str | None:
    """Why a run may not write ``folder`` for where it lies, or None: inside another run's
    folder (whose ``--force`` would remove it, and whose files only its run writes), but
    for a replay's folder inside its ``source``; or, for a replay, at or around its source
    (``--force`` would remove the run being replayed). Links are followed."""
    real = folder.resolve()
    src = Path(source).resolve() if source is not None else None
    if src is not None and (real == src or real in src.parents):
        return (f"holds the run being replayed ({source}), which --force would remove: "
                "choose another --out")
    for d in real.parents:
        # What every run writes first: a folder of a project that merely holds a file
        # called summary.json is not taken for a run's.
        if (d / PROVENANCE).is_file() and (d / SCENARIO_TOML).is_file():
            if d == src:
                return None
            return (f"inside the run folder {d}, whose files only its run writes: choose "
                    "another --out")
    return None


def _sweep_refusal(real: Path, *, resume: bool = False) -> str | None:
    """Why a run may not write the folder ``real`` (links followed) of the sweep folder it
    lies in, or None: a folder there other than a point or shared trace, or a point or
    shared trace, unless this process runs that sweep (holds its lock, or runs a job of it:
    :func:`sweep_job`) or ``resume``-s the point while no other process runs the sweep, or
    the folder has no index (runs named like points, not a sweep's yet) -- the sweep's to
    write: a run aimed at it (``--out SWEEP/p003 --force``) would stand in the index under
    the point's keys, replace a point the sweep has listed, or be overwritten by the sweep
    when it gets there."""
    sweep = real.parent
    if not _SWEEP_RUNS.fullmatch(real.name):
        if is_sweep_folder(sweep, besides=real.name):
            return (f"inside the sweep folder {sweep}, where only its points and shared "
                    "traces are written: choose another --out")
        return None
    if (sweep not in _HELD and sweep not in _SWEEP_JOBS
            and is_sweep_folder(sweep, besides=real.name)):
        if _held_elsewhere(sweep / LOCK):
            return (f"a point of the sweep in {sweep}, which another asyncsim process is "
                    "running; wait for it to finish or choose another --out")
        if resume or not (sweep / SWEEP_INDEX).exists():
            # The point's own run going on (its scenario.toml is checked); or a folder of
            # runs named like points with no index naming their keys (a sweep writes its
            # index before its first point).
            return None
        return (f"a point of the sweep in {sweep}, which only its sweep writes (its index "
                f"names the point's keys): rerun the sweep with --out {sweep}, or choose "
                "another --out")
    return None


def _remove_for_force(folder: Path) -> None:
    """What ``--force`` does to a run or sweep folder it may replace: remove everything in
    it but its lock (which this process holds), unless another process is writing a folder
    inside it (a replay in RUN/replay, a sweep's point)."""
    busy = _busy_below(folder)
    if busy is not None:
        raise RunFolderError(f"{folder}: --force would remove {busy}, which another "
                             "asyncsim process is writing; wait for it to finish")
    for p in folder.iterdir():
        if p.name != LOCK:
            _io.remove(p)


# Folders this process holds the lock of: resolved path -> [file descriptor, remove the
# folder at release (discard_unstarted emptied it)].
_HELD: dict[Path, list[int]] = {}


@contextlib.contextmanager
def locked(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold ``folder``'s lock (``folder/.lock``, an ``fcntl.flock``) for the block, creating
    the folder; a second process asking for it gets a one-line :class:`RunFolderError`
    naming the holder's pid, so two writers never mix two runs in one folder. Re-entrant
    within a process. The lock goes away with the process however it ends (the kernel
    drops it), and the file is removed when the block ends."""
    folder = Path(folder)
    _io.no_link(folder / LOCK)  # RUN/replay linked elsewhere: refused before it is made
    created = _make(folder)
    key = folder.resolve()
    if key in _HELD:  # an outer block of this process holds it, and releases it
        yield folder
        return
    fd = _acquire(folder / LOCK)
    _HELD[key] = [fd, 0]
    made = [p for p in created if p != folder]  # the parents this run made (runs/NAME)
    try:
        with _io.writing(folder):
            yield folder
    finally:
        discard = _HELD.pop(key)[1]
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == (folder / LOCK).stat().st_ino:
                (folder / LOCK).unlink()
        os.close(fd)  # closing releases the lock
        if discard:
            # Emptied by discard_unstarted: gone, with the empty parents this run made,
            # unless another writer has just created its lock in it (then it is its own).
            for d in (folder, *reversed(made)):
                try:
                    d.rmdir()
                except OSError:
                    break


def _make(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; the folders created, outermost first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()][::-1]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file of that name, a read-only place, ...
        raise RunFolderError(f"{folder}: cannot be a run folder: {e.strerror or e}") from None
    return missing


def _busy_below(folder: Path) -> Path | None:
    """A folder inside ``folder`` whose lock another process holds (a replay writing
    RUN/replay, a sweep point), which removing ``folder``'s content would pull away."""
    for lock in folder.rglob(LOCK):
        if lock.parent != folder and _held_elsewhere(lock):
            return lock.parent
    return None


def _held_elsewhere(lock: Path) -> bool:
    """Whether the lock file ``lock`` is held by another process (or by this one through a
    file descriptor other than :data:`_HELD`'s: check that first)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe
    return False


def _acquire(path: Path) -> int:
    while True:
        try:
            # Never through a link: a lock linked to a file outside would be truncated.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:  # its folder was just discarded by its last writer
            _make(_io.no_link(path).parent)  # checked again: it is a new folder
            continue
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _io.link_refused(path, path.parent) from None
            raise RunFolderError(f"{path.parent}: cannot be written: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise RunFolderError(f"{path.parent}: another asyncsim process{who} is writing "
                                 "this folder; wait for it to finish or choose another "
                                 "--out") from None
        # The holder may have removed the file between our open and flock: then we hold a
        # lock on a file nobody else will open; take the one at the path instead.
        try:
            same = os.fstat(fd).st_ino == path.stat().st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


@contextlib.contextmanager
def opened(out: str | os.PathLike | None, *, resume: bool = False, force: bool = False,
           source: str | os.PathLike | None = None) -> Iterator[Path | None]:
    """The run folder a driver writes, for the block: locked (:func:`locked`), then
    :func:`prepare`-d (``source``: the folder a replay replays); on a
    :class:`ScenarioError` (bad input found while running), a folder this run created and
    left without results is removed (:func:`discard_unstarted`). ``out=None``: no folder
    (yields None). A ``..`` in ``out`` is taken as written (:func:`as_written`), so what
    ``--force`` removes stays where ``out`` names."""
    if out is None:
        yield None
        return
    with locked(as_written(out)) as folder:
        prepare(folder, resume=resume, force=force, source=source)
        with removed_on_scenario_error(folder, resume=resume):
            yield folder


def as_written(out: str | os.PathLike) -> Path:
    """``out`` with its ``..`` taken as written (``RUN/replay/..`` is ``RUN``) where that is
    where the system's path leads too; through a link (``RUN/link/..``, the parent of the
    link's target) it is kept as given, for the link checks to refuse."""
    plain = os.path.normpath(out)
    return Path(plain if os.path.realpath(plain) == os.path.realpath(out) else out)


# What a run writes before its first update: a folder holding only these has no results.
START_FILES = frozenset({SCENARIO_TOML, PROVENANCE, INPUTS, LOCK})


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
    if all(p.name in START_FILES for p in entries):
        held = _HELD.get(folder.resolve())
        for p in entries:
            if not (held and p.name == LOCK):
                _io.remove(p)
        if held:
            held[1] = 1  # the lock's release removes the lock file, then the folder
        else:
            (folder / LOCK).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()


# ----------------------------------------------------------------------------- TOML out
def scenario_dict(scn: Scenario) -> dict[str, Any]:
    """The resolved scenario as a run folder records it, before its input files are placed
    (:func:`asyncsim.drivers.folder_scenario.folder_scenario` does that): no ``source``."""
    d = to_dict(scn)
    d.pop("source", None)
    return d


def scenario_toml(scn: Scenario) -> str:
    """:func:`scenario_dict` as TOML (what the JSON-free figure code compares runs with)."""
    return dump_toml(scenario_dict(scn))


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


# The packages whose versions provenance.json records; jax, jaxlib and numpy can change bits.
_VERSIONED = ("asyncsim", "jax", "jaxlib", "numpy", "simpy", "optax", "pandas", "ray")
_BIT_VERSIONS = ("jax", "jaxlib", "numpy")


def bit_facts(prov: Mapping[str, Any], summary: Mapping[str, Any]) -> dict[str, Any]:
    """What a run's bits depend on besides its scenario, from its ``provenance.json`` and
    ``summary.json`` (:data:`asyncsim.machine.BIT_FACTS`, the backend, the JAX, jaxlib and
    numpy versions, each plug-in package's version); None where a record lacks one."""
    versions = prov.get("versions") if isinstance(prov.get("versions"), Mapping) else {}
    facts = {k: prov.get(k) for k in BIT_FACTS}
    facts["backend"] = summary.get("backend")
    facts["numerics_revision"] = summary.get("numerics_revision")
    facts.update({pkg: versions.get(pkg) for pkg in _BIT_VERSIONS})
    for p in _plugin_packages(prov):
        facts[f"plug-in package {p['package']}"] = p.get("version")
    return facts


def _plugin_packages(prov: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The entries of a provenance's ``plugins`` that name a package (a folder's record may
    have been edited: anything else there is skipped, not a traceback)."""
    plugins = prov.get("plugins")
    return [p for p in (plugins if isinstance(plugins, list) else [])
            if isinstance(p, Mapping) and isinstance(p.get("package"), str)]


def bit_facts_here(source_prov: Mapping[str, Any], summary: Mapping[str, Any]
                   ) -> dict[str, Any]:
    """:func:`bit_facts` of this process, for the plug-in packages ``source_prov`` names."""
    plugins = [{"package": p["package"], "version": package_version(p["package"])}
               for p in _plugin_packages(source_prov)]
    here = {**machine_facts(), "plugins": plugins,
            "versions": {pkg: package_version(pkg) for pkg in _BIT_VERSIONS}}
    return bit_facts(here, summary)


def package_version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def provenance(scn: Scenario, **extra: Any) -> dict[str, Any]:
    versions = {pkg: package_version(pkg) for pkg in _VERSIONED}
    return {
        "seed": scn.seed,
        "scenario_file": scn.source,
        "versions": versions,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "command": sys.argv,
        **machine_facts(),
        **git_revision(),
        **extra,
    }


def write_provenance(folder: Path, scn: Scenario, **extra: Any) -> None:
    atomic_write_json(folder / PROVENANCE, provenance(scn, **extra))


def read_provenance(folder: str | os.PathLike) -> dict[str, Any]:
    """A folder's ``provenance.json``; ``{}`` when it is missing or damaged (its readers
    only report from it: what differs between two runs' machines)."""
    try:
        prov = _io.read_json(Path(folder) / PROVENANCE, what=PROVENANCE)
    except _io.DamagedFile:
        return {}
    return prov if isinstance(prov, dict) else {}


def add_provenance(folder: Path, **fields: Any) -> None:
    """Add ``fields`` to ``folder``'s provenance.json (what is known only at the end of a
    run, such as its use of the compilation cache); no readable file, nothing to add to."""
    path = folder / PROVENANCE
    try:
        recorded = _io.read_json(path, what=PROVENANCE)
    except _io.DamagedFile:
        # Missing or damaged (a resumed run's, say): the commands that read it say so; the
        # run that is finishing is not the place to fail.
        return
    atomic_write_json(path, {**recorded, **fields})


def write_summary(folder: Path, summary: Mapping[str, Any]) -> None:
    atomic_write_json(folder / SUMMARY, summary)
