"""The Python API: the functions behind the CLI, over every layer.

>>> import asyncsim
>>> scn = asyncsim.load_scenario("scenarios/p1_f1_staleness.toml", profile="smoke")
>>> trace = asyncsim.simulate(scn)          # timing only, no folder
>>> trace.staleness_stats()["staleness_mean"]

The drivers do the work (:mod:`asyncsim.drivers`); this module adds what needs the scenario
loader: :func:`replay_folder` (``asyncsim replay RUN_DIR``), which re-reads a run folder's
scenario and refuses timing overrides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from asyncsim import runs
from asyncsim._io import TRACE_META, DamagedFile, damaged, read_params
from asyncsim._registry import PluginRegistry
from asyncsim.config import Scenario, changed_keys, flatten, to_dict
from asyncsim.drivers import online
from asyncsim.drivers import replay as loop
from asyncsim.drivers.batched import DEFAULT_BATCH
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.checkpoint import load_params
from asyncsim.drivers.choose import choose_path
from asyncsim.drivers.driver import RunResult
from asyncsim.drivers.plugins import registries as _registries
from asyncsim.drivers.scan import replay_scan
from asyncsim.drivers.trace_only import TraceResult, simulate, trace_run
from asyncsim.errors import ScenarioError
from asyncsim.machine import fact_changes
from asyncsim.results import read_summary
from asyncsim.scenario import load_run_scenario, parse_override
from asyncsim.stability.measure import monitor_for
from asyncsim.trace import Trace

__all__ = ["TraceResult", "compare_with_source", "registries", "replay", "replay_folder",
           "run", "simulate", "trace_fixed_changes", "trace_run"]


def run(scn: Scenario, **kw: Any) -> RunResult:
    """Simulate ``scn`` with real gradients (the online driver,
    :func:`asyncsim.drivers.online.run`, which takes the same keywords: ``out``, ``resume``,
    ``force``, ``progress``, ...) and measure what its ``[measure]`` table asks for
    (:mod:`asyncsim.stability.measure`), stored with the run.

    Returns:
        A :class:`~asyncsim.drivers.driver.RunResult`; ``summary`` has the trace figures
        plus ``final_test_error``, ``diverged``, ``diverged_at``, ``param_hash``,
        ``wall_time`` and the measurements.
    """
    kw.setdefault("monitor", monitor_for(scn))
    return online.run(scn, **kw)


def replay(scn: Scenario, trace: Trace, **kw: Any) -> RunResult:
    """Re-execute ``trace``'s numerics under ``scn`` with no event loop, bit-identical to the
    online run that recorded it (:func:`asyncsim.drivers.replay.replay`, same keywords:
    ``out``, ``hyper``, ``max_memory``, ...), measuring what ``[measure]`` asks for."""
    kw.setdefault("monitor", monitor_for(scn))
    return loop.replay(scn, trace, **kw)


def registries() -> dict[str, PluginRegistry]:
    """Every plug-in registry by entry-point group (``asyncsim.delays``, ...)."""
    return _registries()


# What a recorded trace fixes, so a replay may not change it: the cluster, the protocol, the
# sweep grid and the run's length.
TRACE_FIXED = ("cluster", "protocol", "sweep")
TRACE_FIXED_RUN = ("updates", "gradients", "epochs", "sim_time", "trace_only")


_UNSET = object()


def _trace_fixed(key: str) -> bool:
    """Whether dotted ``key`` is one a recorded trace fixes (:data:`TRACE_FIXED`, ``run.`` +
    :data:`TRACE_FIXED_RUN`)."""
    section, _, rest = key.partition(".")
    return section in TRACE_FIXED or (section == "run" and rest.split(".")[0]
                                      in TRACE_FIXED_RUN)


def trace_fixed_changes(before: Scenario, after: Scenario) -> list[str]:
    """The dotted keys whose resolved values differ between two scenarios in what a trace
    fixes (:func:`_trace_fixed`), however they were set (``--set protocol.n=1`` or a whole
    table such as ``--set run={updates=5}``)."""
    return [k for k in changed_keys(to_dict(before), to_dict(after)) if _trace_fixed(k)]


def replay_folder(run_dir: str | Path, *, out: str | Path | None = None,
                  overrides: Sequence[str] = (), force: bool = False,
                  progress: bool = False, path: str = "loop") -> RunResult:
    """``asyncsim replay RUN_DIR``: replay a run folder's trace with its resolved scenario.

    ``overrides`` may change numerics only (``optimizer.*``, ``model.*``, ``data.*``,
    ``seed``, ``run.eval_every``...); the timing is the recorded trace, so a timing key
    (``cluster.*``, ``protocol.*``, the run's length) raises :class:`ScenarioError` before
    anything is written. Without ``out`` the result is written to ``RUN_DIR/replay``.
    """
    run_dir = runs.require_run_folder(run_dir)
    # A timing key is refused as such, before the loader can refuse its value for another
    # reason (--set protocol.kind=async on a softsync run: the run's n).
    named = [parse_override(o) if isinstance(o, str) else tuple(o) for o in overrides]
    recorded_scn = load_run_scenario(run_dir)
    recorded = flatten(to_dict(recorded_scn))
    changed = [k for k, v in named if _trace_fixed(k)
               and recorded.get(k, _UNSET) != v]  # the value it has already: no change
    if not changed:
        scn = load_run_scenario(run_dir, overrides=overrides) if overrides else recorded_scn
        changed = trace_fixed_changes(recorded_scn, scn)
    if changed and changed[0].split(".")[0] == "sweep":
        raise ScenarioError("sweep", "a replay re-executes one run's trace; a sweep grid "
                            "belongs in a scenario for asyncsim run (whose points replay "
                            "a shared trace where only numerics vary)", file="asyncsim replay")
    if changed:
        # Accepting these would write a replay folder whose scenario.toml disagrees with the
        # trace it actually executed.
        sets = " ".join(f"--set {o if isinstance(o, str) else '='.join(map(str, o))}"
                        for o in overrides)
        raise ScenarioError(changed[0], "is timing, which the recorded trace fixes; a replay "
                            "changes numerics only (optimizer.*, model.*, data.*, seed, "
                            "run.eval_every, run.eval_samples); to change timing, rerun: "
                            f"asyncsim run {run_dir / 'scenario.toml'} {sets}",
                            file="asyncsim replay")
    trace = _recorded_trace(run_dir, recorded_scn)
    out = out or run_dir / "replay"
    if path == "auto":
        path = choose_path(scn, trace)
    counts = trace.updates["n_grads"]
    if path == "scan" and trace.num_updates == 0:
        path = "loop"  # nothing to execute: the loop path writes the same (empty) replay
    elif path == "scan" and trace.uniform_n_grads is None:
        raise ScenarioError("--path", "scan needs the same number of gradients in every "
                            f"update; this trace's updates take {counts.min()} to "
                            f"{counts.max()}: use --path loop (or auto)", file="asyncsim replay")
    # The source's grouping of same-version gradients (a real run's PS computes them one by
    # one): on a GPU, where "auto" groups them, the replay must group as the source did to
    # replay it bit for bit.
    source = read_summary(run_dir) if runs.is_complete(run_dir) else {}
    if source.get("param_hash") is not None:
        # Read, and checked against the recorded param_hash, before anything is written:
        # compared with at the end.
        read_params(run_dir)
    grouping = source.get("grouping", "auto")
    if grouping not in ("none", "version", "auto"):
        raise runs.RunFolderError(f"{run_dir / runs.SUMMARY}: grouping must be none, version "
                                  f"or auto, got {grouping!r}")
    num = numerics_for(scn, grouping=grouping)
    def compare(summary, params):  # written with the replay's summary, which comes last
        return _compare(run_dir, summary, params, source)

    if path == "scan":
        return replay_scan(scn, trace, out=out, force=force, monitor=monitor_for(scn),
                           numerics=num, compare=compare)
    if path == "loop":
        return replay(scn, trace, out=out, force=force, progress=progress, numerics=num,
                      compare=compare)
    if path == "batched":
        return replay(scn, trace, out=out, force=force, progress=progress, numerics=num,
                      compare=compare, batch=DEFAULT_BATCH)
    raise ValueError(f"path must be loop, scan, batched or auto, got {path!r}")


def compare_with_source(run_dir: str | Path, result: RunResult) -> dict[str, Any]:
    """How a replay's final parameters compare with those of the run it replayed.

    Returns the ``summary.json`` fields ``source_param_hash`` (None when the source folder
    has no ``summary.json``, i.e. the run did not finish, or is a timing-only trace from
    ``asyncsim trace``, which has no parameters), ``matches_source`` (the two
    ``param_hash`` values are equal: bit-identical parameters) and ``max_abs_diff_to_source``
    (the largest absolute difference over all parameters; None when the source has no
    ``params.npz`` of the same structure, e.g. after ``--set model.*``, or when either side
    diverged: a diverged run stops at its own update, so no distance between the two means
    anything), and ``environment_changes``: what the last bits depend on that differs
    between the source run's machine and this one (:func:`asyncsim.runs.bit_facts`: the
    CPU, XLA's threads and flags, BLAS, the JAX, jaxlib and numpy versions, the backend,
    plug-in packages), e.g. ``["xla_threads: 1 -> 2"]``.
    """
    return _compare(run_dir, result.summary, result.params)


def _compare(run_dir: str | Path, summary: Mapping[str, Any], params,
             source: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:func:`compare_with_source` (``source``: the source's summary, when read already)."""
    run_dir = Path(run_dir)
    if source is None:
        source = read_summary(run_dir) if runs.is_complete(run_dir) else {}
    src_hash = source.get("param_hash")
    if src_hash is None:
        return {"source_param_hash": None, "matches_source": None,
                "max_abs_diff_to_source": None, "environment_changes": []}
    diverged = source.get("diverged") or summary.get("diverged")
    diff = None if diverged else _max_abs_diff(run_dir, params)
    return {"source_param_hash": src_hash,
            "matches_source": src_hash == summary.get("param_hash"),
            "max_abs_diff_to_source": diff,
            "environment_changes": _environment_changes(run_dir, source, summary)}


def _environment_changes(run_dir: Path, source: Mapping[str, Any],
                         summary: Mapping[str, Any]) -> list[str]:
    """``"key: source's -> this machine's"`` for what a run's last bits depend on
    (:func:`asyncsim.runs.bit_facts`)."""
    prov = runs.read_provenance(run_dir)
    return fact_changes(runs.bit_facts(prov, source), runs.bit_facts_here(prov, summary))


def _recorded_trace(run_dir: Path, scn: Scenario) -> Trace:
    """``run_dir``'s trace, marked as its (``meta["source"]``: a replay writes inside it,
    never at or around it), once the folder's scenario ``scn`` is known to be the one that
    recorded it: an edited scenario.toml would otherwise be replayed, and copied into the
    replay, as if it were."""
    trace = Trace.load(run_dir, learners=scn.cluster.learners)
    kind = trace.meta.get("protocol", scn.protocol.kind)
    if kind != scn.protocol.kind:  # in the words of Trace.load's learners check
        raise damaged(run_dir / TRACE_META, f"protocol = {kind!r}, but the run's scenario "
                      f"has protocol.kind = {scn.protocol.kind!r}")
    return dataclasses.replace(trace, meta={**trace.meta, "source": str(run_dir)})


def _max_abs_diff(run_dir: Path, params) -> float | None:
    """The largest |difference| between ``params`` and the run folder's ``params.npz``; None
    when the folder's parameters do not have the same structure."""
    try:
        src = load_params(run_dir, params)
    except DamagedFile:
        raise  # not the run's parameters (read_params): never compared as if they were
    except (OSError, KeyError, ValueError, TypeError):
        return None
    if [np.shape(x) for x in jax.tree_util.tree_leaves(src)] != [
            np.shape(x) for x in jax.tree_util.tree_leaves(params)]:
        return None  # another model (--set model.*, or an edited scenario.toml)
    diffs = jax.tree_util.tree_map(
        lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64)
                                         - np.asarray(b, np.float64)), initial=0.0)),
        params, src)
    return max(jax.tree_util.tree_leaves(diffs), default=0.0)
