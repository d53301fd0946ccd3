"""Sweeps: one scenario, a grid of overrides, one run folder per point plus an index table.

``[sweep]`` in a scenario maps dotted keys to lists; the cartesian product is run::

    [sweep]
    "protocol.n" = [1, 2, 4, 30]
    "optimizer.lr_rule" = ["constant", "inverse-staleness"]
    seed = [0, 1, 2]

Points whose scenarios differ only in numerics (``optimizer.*``) share their timing, so one
trace is simulated per timing group and each point is an exact replay of it
(:mod:`asyncsim.drivers.replay`); ``index.csv`` says which points shared a trace
(``trace_group``). By default (``run.sweep_path = "exact"``) every point has exactly the
numbers of its scenario run alone, whatever the machine's load; the faster paths for points
that differ only in lr, beta or weight decay (one vmapped program, ``lax.scan`` chunks) agree
to ~1e-5 and are an explicit opt-in, recorded per point (``sweep_path``, ``exact``).
A point whose folder is already complete is not run again, so an interrupted sweep resumes
where it stopped, and ``asyncsim run`` of a figure scenario "runs what is missing".

Layout::

    OUT/index.csv        one row per point: its keys, folder, trace_group, status, headline
    OUT/p000/ ...        a run folder per point (asyncsim.runs)
    OUT/trace_g00/       the shared timing of a group (trace only)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from asyncsim import runs
from asyncsim._io import (
    SCENARIO_TOML,
    SUMMARY,
    TRACE_META,
    DamagedFile,
    read_json,
    read_toml,
    toml_value,
)
from asyncsim.config import Scenario
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.choose import sweep_path
from asyncsim.drivers.folder_scenario import folder_scenario, scenario_changes
from asyncsim.drivers.online import run
from asyncsim.drivers.replay import replay
from asyncsim.drivers.scan import replay_scan
from asyncsim.drivers.trace_only import trace_run
from asyncsim.drivers.vmapped import hyper_of, replay_vmapped
from asyncsim.errors import ScenarioError
from asyncsim.numerics.core import NUMERICS_REVISION
from asyncsim.results import read_summary
from asyncsim.scenario import load_scenario, point_scenarios
from asyncsim.stability.measure import EDGES_CSV, monitor_for, observes_along, sweep_edges
from asyncsim.timing.protocols import timing_revision
from asyncsim.trace import Trace

INDEX = runs.SWEEP_INDEX
#: How often a local sweep rewrites its index while points run. Each write reads every
#: complete point's summary (0.14 s at 620 points), so a write after every point grew with
#: the square of the points: about 40 s of the 620-point remedies study.
INDEX_REFRESH_SECONDS = 30.0
# The columns index.csv holds for a point besides its summary's: its swept keys come between
# "point" and "folder" (asyncsim.results.SweepFolder.keys reads them so).
INDEX_COLUMNS = ("point", "folder", "sweep_path", "exact", "vmapped", "replay_path",
                 "trace_group", "shared_trace", "status")


def timing_key(scn: Scenario) -> str:
    """What fixes a scenario's timeline: everything but its numerics (optimizer, name), with
    the seed of the timing streams (:attr:`Scenario.timing_seed`) in place of ``seed``: under
    a fixed ``cluster.seed``, points that differ in ``seed`` share one trace."""
    d = folder_scenario(scn)[0]  # as its folder records it: input files by content
    for k in ("optimizer", "name", "description", "figure", "source", "sweep", "measure"):
        d.pop(k, None)
    d["seed"] = scn.timing_seed
    d["cluster"] = {k: v for k, v in d["cluster"].items() if k != "seed"}
    run = dict(d.get("run", {}))
    for k in ("eval_every", "eval_samples", "eval_train", "checkpoint_every", "sweep_path"):
        run.pop(k, None)
    d["run"] = run
    return json.dumps(d, sort_keys=True, default=str)


def plan(scn: Scenario) -> list[dict[str, Any]]:
    """The sweep's points: ``{"point", "keys", "scenario", "group"}`` in a fixed order; points
    of one timing group (:func:`timing_key`) share a trace."""
    groups: dict[str, int] = {}
    return [{"point": name, "keys": keys, "scenario": s,
             "group": groups.setdefault(timing_key(s), len(groups))}
            for name, keys, s in point_scenarios(scn)]


def _run_point(item: Mapping[str, Any], folder: Path, shared_trace, *, progress: bool):
    """Run one point: replay of the group's trace when it is shared, else an online run; both
    give the numbers of the point's scenario run alone, bit for bit."""
    scn = item["scenario"]
    monitor = monitor_for(scn)  # the scenario's [measure]: stored with the point
    extra = {"sweep_path": "exact"}
    if shared_trace is not None:
        return replay(scn, shared_trace, out=folder, force=True, progress=progress,
                      kind="run", monitor=monitor, extra=extra).summary
    return run(scn, out=folder, force=True, progress=progress, monitor=monitor,
               extra=extra).summary


Executor = Callable[[list[Callable[[], dict[str, Any]]]], list[dict[str, Any]]]


def run_sweep(scn: Scenario, out: str | Path, *, force: bool = False, progress: bool = False,
              executor: Executor | None = None, share_traces: bool = True,
              trace_only: bool = False, vmap: str = "auto") -> pd.DataFrame:
    """Run every point of ``scn``'s sweep that is not complete yet; write ``OUT/index.csv``.

    ``out`` is new, empty or a sweep folder of ``scn``'s name, which the sweep goes on in;
    anything else is refused in one line (:func:`asyncsim.runs.prepare_sweep`). ``force``
    reruns every point, in a sweep folder emptied first (whatever sweep it held).

    Args:
        executor: runs a list of zero-argument jobs and returns their summaries in order
            (default: one after another here; ``asyncsim.drivers.real.ray_executor`` runs
            them as Ray tasks). Results are identical either way.
        share_traces: replay one simulated trace per timing group (exact; faster).
        trace_only: timing only (for staleness studies): no gradients at all.
        vmap: for points of one trace that differ only in lr, momentum beta or weight decay:
            ``"auto"`` replays them as the scenario's ``run.sweep_path`` says (default
            ``"exact"``: one loop replay each, bit-identical to the point run alone),
            ``"always"`` as one vmapped program (``"vmapped"``), ``"never"`` exactly.
    """
    out = runs.as_written(out)  # `..` as written, as a run's --out (runs.opened)
    # One process runs a sweep folder at a time (a second one is refused in one line); the
    # points' own folders are locked by the drivers that write them.
    with runs.locked(out):
        runs.prepare_sweep(out, scn.name, force=force)
        return _run_sweep(scn, out, force, progress, executor, share_traces, trace_only, vmap)


def _run_sweep(scn, out, force, progress, executor, share_traces, trace_only,
               vmap) -> pd.DataFrame:
    """:func:`run_sweep` holding the sweep folder's lock."""
    items = plan(scn)
    by_group: dict[int, list[dict[str, Any]]] = {}
    for it in items:
        by_group.setdefault(it["group"], []).append(it)
    jobs: list[tuple[dict[str, Any], Callable[[], dict[str, Any]]]] = []
    for g, members in by_group.items():
        todo = [it for it in members
                if force or not _up_to_date(out / it["point"], it["scenario"],
                                            numbers=not trace_only)]
        if not todo:
            continue
        if trace_only:
            for it in todo:
                jobs.append((it, _trace_job(it, out / it["point"])))
            continue
        shared = share_traces and len(members) > 1
        trace = _group_trace(members[0]["scenario"], out / f"trace_g{g:02d}") if shared else None
        # Measurements along the run need the loop path, one point at a time.
        observed = any(observes_along(it["scenario"]) for it in todo)
        mode = _mode(todo[0]["scenario"], vmap)
        hypers = (_hyper_only(todo, scn) if shared and mode != "exact" and not observed
                  else None)
        if hypers is not None and len(todo) > 1:
            jobs.append(({"point": "vmapped"}, _vmap_job(todo, hypers, out, trace, mode)))
            continue
        for it in todo:
            jobs.append((it, _job(it, out / it["point"], trace, progress)))

    def write_index() -> pd.DataFrame:
        return _write_index(out, items, by_group, share_traces, trace_only)

    # A sweep killed part-way still has an index, at most INDEX_REFRESH_SECONDS behind what
    # finished (a resumed sweep writes it anew).
    write_index()
    try:
        if executor is None:
            # Locally, refresh the index now and then so figures can be drawn mid-sweep.
            written = time.monotonic()
            for it, job in jobs:
                _at_point(out, it, job)()
                if time.monotonic() - written >= INDEX_REFRESH_SECONDS:
                    write_index()
                    written = time.monotonic()
        elif jobs:
            # Summaries are read back from the folders.
            executor([_sweep_job(out, _at_point(out, it, j)) for it, j in jobs])
    finally:
        index = write_index()  # what finished, also when a point failed or was interrupted
    complete = all(runs.is_complete(out / it["point"]) for it in items)
    if scn.measure.edges and complete and (jobs or not (out / EDGES_CSV).exists()):
        sweep_edges(out, items)  # the sweep's measurement, from the points' saved traces
    return index


def _write_index(out: Path, items, by_group, share_traces: bool,
                 trace_only: bool) -> pd.DataFrame:
    rows = []
    # Every point's keys, in the order they first appear: the columns after "point" (a
    # point of zipped keys that leaves one out has it empty).
    names = list(dict.fromkeys(k for it in items for k in it["keys"]))
    for it in items:
        folder = out / it["point"]
        complete = runs.is_complete(folder)
        summary = read_summary(folder) if complete else {}
        # A table value (an lr_rule with parameters, a compensation) as its TOML text.
        keys = {k: toml_value(v) if isinstance(v, Mapping) else v
                for k in names for v in [it["keys"].get(k)]}
        row: dict[str, Any] = {"point": it["point"], **keys, "folder": str(folder),
                               # What ran (an API caller's vmap= may override the file).
                               "sweep_path": summary.get("sweep_path")
                               or it["scenario"].run.sweep_path,
                               "exact": summary.get("exact") if summary else None,
                               "vmapped": bool(summary.get("vmapped_points")),
                               "replay_path": summary.get("replay_path", ""),
                               "trace_group": it["group"],
                               "shared_trace": share_traces and not trace_only
                               and len(by_group[it["group"]]) > 1}
        if complete:
            row["status"] = "complete"
            # Every scalar of its summary ([measure]'s sharpness, staleness_p99, ...), not the
            # lists (a replay's environment_changes), nor a column the index has already.
            row.update({k: v for k, v in summary.items()
                        if k not in row and not isinstance(v, list | dict)})
        else:
            row["status"] = "missing"
        rows.append(row)
    index = pd.DataFrame(rows)
    runs.atomic_write_text(out / INDEX, index.to_csv(index=False))
    return index


def _up_to_date(folder: Path, scn: Scenario, *, numbers: bool = True) -> bool:
    """A complete point folder whose saved scenario is this point's (folders are named by
    position, so an edited sweep file must not silently reuse another setup's run), made by
    this revision of the update core's numerics (``numbers``: the point trains) and of its
    timing model."""
    if not runs.is_complete(folder):
        return False
    try:
        saved = read_toml(folder / SCENARIO_TOML)
        if numbers and (read_json(folder / SUMMARY).get("numerics_revision")
                        != NUMERICS_REVISION):
            return False  # made by other numerics: its numbers are not this asyncsim's
    except DamagedFile:
        return False  # run again
    if scenario_changes(saved, scn):
        return False
    if timing_revision(scn.protocol) is None:
        return True  # nothing to read: no timing of this scenario changed meaning
    try:
        return _same_timing_model(read_json(folder / TRACE_META), scn)
    except DamagedFile:
        return False


def _same_timing_model(trace_meta: Mapping[str, Any], scn: Scenario) -> bool:
    """Whether a trace with ``trace_meta`` was simulated under the timing model ``scn``
    means now (:func:`~asyncsim.timing.protocols.timing_revision`: fixed-delay "normal" was
    the racing model before asyncsim 0.3)."""
    return trace_meta.get("timing_revision") == timing_revision(scn.protocol)


def _hyper_only(todo, scn: Scenario):
    """Core hyperparameters per point when the points of a group differ only in those."""
    keys = sorted({k for it in todo for k in it["keys"]})
    varying = [k for k in keys if len({repr(it["keys"].get(k)) for it in todo}) > 1]
    hypers = []
    for it in todo:
        if any(k not in it["keys"] for k in varying):
            return None  # zipped sweep entries may leave a key out: not hyper-only
        h = hyper_of({k: it["keys"][k] for k in varying})
        if not h:
            return None
        hypers.append(h)
    return hypers


# run.sweep_path -> (one program for all points or one by one, loop or scan).
_FAST = {"vmapped": ("vmapped", "loop"), "vmapped-scan": ("vmapped", "scan"),
         "scan": ("single", "scan")}


def _mode(scn: Scenario, vmap: str) -> str:
    """The sweep path of a group's points: the scenario's ``run.sweep_path``, unless the
    caller's ``vmap`` forces one (``"always"``: vmapped; ``"never"``: exact)."""
    if vmap not in ("auto", "always", "never"):
        raise ValueError(f"vmap must be auto, always or never, got {vmap!r}")
    return {"always": "vmapped", "never": "exact"}.get(vmap, scn.run.sweep_path)


def _vmap_job(todo, hypers, out, trace, mode):
    """The job of a group's hyperparameter-only points on an opt-in fast path (``mode``, a
    :data:`~asyncsim.config.SWEEP_PATHS` entry other than "exact")."""
    def job():
        base = todo[0]["scenario"]
        num = numerics_for(base)
        folders = [out / it["point"] for it in todo]
        if mode == "fastest":  # the opt-in whose numbers may follow the machine's load
            how, path = sweep_path(base, trace, hypers, numerics=num)
        else:
            how, path = _FAST[mode]
        if trace.uniform_n_grads is None:
            path = "loop"  # the scan needs the same number of gradients in every update
        monitors = [monitor_for(it["scenario"]) for it in todo]
        extra = {"sweep_path": mode}
        if how == "vmapped":
            res = replay_vmapped(base, trace, hypers, numerics=num, outs=folders, path=path,
                                 monitors=monitors, extra=extra)
        elif path == "scan":
            res = [replay_scan(it["scenario"], trace, out=f, force=True, numerics=num,
                               hyper=h, kind="run", monitor=mon, extra=extra)
                   for it, f, h, mon in zip(todo, folders, hypers, monitors, strict=True)]
        else:
            res = [replay(it["scenario"], trace, out=f, force=True, kind="run", monitor=mon,
                          extra=extra)
                   for it, f, mon in zip(todo, folders, monitors, strict=True)]
        return [r.summary for r in res]
    job.scenarios = [it["scenario"] for it in todo]
    return job


# Each job carries the scenarios it runs (``job.scenarios``) so that an executor that runs it
# in another process can send the plug-ins they use along (asyncsim.drivers.real.ray_executor).
def _job(it, folder, trace, progress):
    def job():
        return _run_point(it, folder, trace, progress=progress)
    job.scenarios = [it["scenario"]]
    return job


def _sweep_job(out: Path, job):
    """``job`` run as a job of the sweep in ``out`` (in another process, whose points
    :func:`asyncsim.runs.prepare` would otherwise refuse while this sweep holds the lock)."""
    def sweep_job():
        with runs.sweep_job(out):
            return job()
    sweep_job.scenarios = job.scenarios
    return sweep_job


def _at_point(out: Path, it: dict[str, Any], job):
    """``job``, its ScenarioError (a value only a run finds wrong: times that overflow)
    saying at which point of the sweep in ``out`` it stopped."""
    point = it["point"]
    if point == "vmapped":
        return job  # one program for many points

    def at_point():
        try:
            return job()
        except ScenarioError as e:
            raise ScenarioError(e.key, f"{e.message} (at point {point}, {out / point})",
                                file=e.file) from None
    at_point.scenarios = job.scenarios
    return at_point


def _trace_job(it, folder):
    def job():
        return trace_run(it["scenario"], folder, force=True).summary
    job.scenarios = [it["scenario"]]
    return job


def _group_trace(scn: Scenario, folder: Path):
    """The shared timing of a group: simulated once, saved, reused on a resumed sweep while
    it is this group's timing (an edited sweep file's trace is simulated again)."""
    if runs.is_complete(folder):
        try:
            saved = load_scenario(folder / SCENARIO_TOML)
        except (ScenarioError, DamagedFile):
            saved = None
        if saved is not None and timing_key(saved) == timing_key(scn):
            try:
                trace = Trace.load(folder)
            except DamagedFile:
                trace = None  # cheap to simulate again
            if trace is not None and _same_timing_model(trace.meta, scn):
                return trace
    return trace_run(scn, folder, force=True).trace
