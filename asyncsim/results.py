"""Run and sweep folders, read back: every value checked as it is read.

A run folder may come from anyone (a colleague's tarball, a half-copied disk), so what it
holds is input, not a record to trust. :class:`RunFolder` reads one through the one reader
(:mod:`asyncsim._io`) and checks each value a reader uses for its type and range as it is
read: ``summary.json``'s fields (:data:`SUMMARY_FIELDS`), ``provenance.json``'s
(:data:`PROVENANCE_FIELDS`), ``scenario.toml`` (the scenario schema, without the plug-in
registries: no JAX is imported), ``eval.csv``'s and ``updates.parquet``'s columns
(:data:`EVAL_COLUMNS`, :data:`UPDATE_COLUMNS`), the trace (:meth:`asyncsim.trace.Trace.load`,
its hash included), and the plug-in options and ``[figure]`` settings the schema leaves
free (:meth:`RunFolder.value`).
A value that is not what it should be is a one-line :class:`~asyncsim._io.DamagedFile`
naming the file and the field, never a traceback deep in a figure, nor a figure drawn from
it. :class:`SweepFolder` reads a sweep's ``index.csv`` and its complete points.

The figures (``asyncsim figures``, :mod:`asyncsim.analysis`) read run folders only through
these classes.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncsim import _checks
from asyncsim._io import (
    PARAMS,
    PROVENANCE,
    RUN_MARKS,
    SCENARIO_TOML,
    SUMMARY,
    SWEEP_INDEX,
    DamagedFile,
    damaged,
    npz_member,
    read_csv,
    read_json,
    read_params,
    read_parquet,
    read_toml,
)
from asyncsim.config import MOMENTUM_KINDS, Scenario, flatten
from asyncsim.errors import ScenarioError
from asyncsim.runs import (
    EDGES_CSV,
    KIND_LABELS,
    LOCK,
    RunFolderError,
    driver_from,
    scenario_toml,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from asyncsim.trace import Trace

Check = Callable[[str, Any], Any]


# ----------------------------------------------------------------------------- value checks
# Each returns the value as readers use it or raises a ScenarioError under the field's name
# (asyncsim._checks' wording), which the reader turns into a DamagedFile naming the file.
def _count(name: str, v: Any) -> int:
    return _checks.integer(name, v, low=0)


def _nonneg(name: str, v: Any) -> float:
    return _checks.nonneg(name, v)


def _text(name: str, v: Any) -> str:
    return _checks.string(name, v)


def _optional(check: Check) -> Check:
    def optional(name: str, v: Any) -> Any:
        return None if v is None else check(name, v)
    return optional


def _measured(name: str, v: Any) -> float:
    """A measured number that may have failed: a number (NaN or infinite too), JSON's
    ``null`` (written for NaN: NaN) or ``"inf"``/``"-inf"`` (written for them), as a float."""
    if v is None:
        return math.nan
    if v in ("inf", "-inf"):
        return float(v)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ScenarioError(name, f"must be a number (null, \"inf\" or \"-inf\" where it "
                            f"failed), got {v!r}")
    return float(v)


def _error_rate(name: str, v: Any) -> float:
    """A classification error: in [0, 1], or NaN where there was none to measure."""
    x = _measured(name, v)
    if not (math.isnan(x) or 0.0 <= x <= 1.0):
        raise ScenarioError(name, f"must be an error rate in [0, 1], got {v!r}")
    return x


def _fraction(name: str, v: Any) -> float:
    """A share of a whole: a finite number in [0, 1]."""
    x = _checks.nonneg(name, v)
    if x > 1:
        raise ScenarioError(name, f"must be a fraction in [0, 1], got {v!r}")
    return x


def _text_list(name: str, v: Any) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ScenarioError(name, f"must be a list of strings, got {v!r}")
    return v


def _versions(name: str, v: Any) -> Mapping[str, str | None]:
    _checks.table(name, v)
    for pkg, version in v.items():
        if version is not None and not isinstance(version, str):
            raise ScenarioError(f"{name}.{pkg}", f"must be a version string or null, "
                                f"got {version!r}")
    return v


_OPT_COUNT, _OPT_TEXT = _optional(_count), _optional(_text)

# summary.json: every field asyncsim writes and a reader may use, with its check. A field
# not listed (a plug-in monitor's) is kept as it is.
SUMMARY_FIELDS: dict[str, Check] = {
    **dict.fromkeys(("gradients", "updates", "staleness_max", "seed", "down_periods",
                     "lost_gradients", "restarts", "short_rounds", "resumes",
                     "vmapped_points", "replay_batch", "replay_gradient_calls",
                     "replay_pending_gradients", "replay_pool_bytes", "replay_version_bytes",
                     "replay_versions_held", "ps_version_bytes", "ps_versions_held", "threads",
                     "blas_threads", "numerics_revision"), _count),
    "diverged_at": _OPT_COUNT,
    **dict.fromkeys(("epochs", "sim_time", "staleness_mean", "staleness_p99", "staleness_std",
                     "wall_time", "real_wall_time", "startup_s", "updates_per_s"), _nonneg),
    "up_fraction": lambda k, v: _fraction(k, v),
    **dict.fromkeys(("final_test_error", "final_train_error"), _error_rate),
    **dict.fromkeys(("final_test_loss", "final_train_loss", "final_train_set_loss",
                     "lr_at_mean_tau", "lr_at_tau", "initial_sharpness", "final_sharpness",
                     "final_sharpness_lanczos", "max_abs_diff_to_source"), _measured),
    **dict.fromkeys(("diverged", "exact"), _checks.flag),
    **dict.fromkeys(("matches_source", "never_learned"), _optional(_checks.flag)),
    **dict.fromkeys(("backend", "grouping", "kind", "name", "param_hash", "trace_hash",
                     "stop_reason", "replay_path", "replay_store", "sweep_path"), _text),
    "source_param_hash": _OPT_TEXT,
    "environment_changes": _text_list,
}

# provenance.json: the fields readers use (the figures' captions, the bit facts replay and
# compare name), with their checks; the machine's other facts are kept as they are.
PROVENANCE_FIELDS: dict[str, Check] = {
    "seed": _count,
    "driver": _optional(lambda k, v: _checks.choice(k, v, tuple(KIND_LABELS), what="driver")),
    **dict.fromkeys(("scenario_file", "replay_of", "profile", "git_revision",
                     "python", "platform", "machine", "cpu_model"), _OPT_TEXT),
    "versions": _versions,
    "command": _text_list,
}


def _column_check(kind: str | tuple[str, ...]) -> Callable[[Any], str | None]:
    """A column check of pandas values: what is wrong with the column, or None."""
    import numpy as np

    def check(col) -> str | None:
        a = col.to_numpy()
        if not a.size:  # no rows (a header only): nothing wrong with the values
            return None
        if isinstance(kind, tuple):  # one of these strings
            bad = [x for x in a if x not in kind]
            return (f"holds {bad[0]!r}; allowed: {', '.join(kind)}" if bad else None)
        if a.dtype.kind not in ("iu" if kind == "count" else "iuf"):
            allowed = "integers" if kind == "count" else "numbers"
            return f"holds {a.dtype} values (e.g. {a[0]!r}); allowed: {allowed}"
        ok, allowed = _RANGES.get(kind, (None, ""))
        if ok is not None:
            bad = np.flatnonzero(~ok(a))
            if len(bad):
                return f"holds {a[bad[0]].item()!r} at row {bad[0]}; allowed: {allowed}"
        return None
    return check


def _where(test: Callable[[Any], Any], *, nan: bool = False) -> Callable[[Any], Any]:
    """The check of a column's values: finite and ``test``-true (or NaN, with ``nan``)."""
    def ok(a):
        import numpy as np

        good = np.isfinite(a) & test(a)
        return good | np.isnan(a) if nan else good
    return ok


# The values each numeric column kind allows ("number": any, NaN and infinities included).
_RANGES: dict[str, tuple[Callable[[Any], Any], str]] = {
    "count": (_where(lambda a: a >= 0), "finite numbers >= 0"),
    "time": (_where(lambda a: a >= 0), "finite numbers >= 0"),
    "time_or_nan": (_where(lambda a: a >= 0, nan=True), "finite numbers >= 0, or empty"),
    "positive": (_where(lambda a: a > 0), "finite numbers > 0"),
    "beta": (_where(lambda a: abs(a) < 1), "momentum factors beta with |beta| < 1"),
    "error": (_where(lambda a: (a >= 0) & (a <= 1), nan=True), "errors in [0, 1]"),
}


# eval.csv's columns (:class:`asyncsim.numerics.numerics.EvalRecord`): losses may be NaN or
# infinite (a run that diverged, an update with no batch loss), the rest may not.
EVAL_COLUMNS = {"version": "count", "gradients": "count", "sim_time": "time", "epoch": "time",
                "train_loss": "number", "test_loss": "number", "test_error": "error"}
# updates.parquet's columns (the trace's update table and each update's batch loss).
UPDATE_COLUMNS = {"version": "count", "time": "time", "n_grads": "count", "start": "count",
                  "train_loss": "number"}


def checked_table(df: pd.DataFrame, columns: Mapping[str, str | tuple[str, ...]], path: Path,
                  *, required: tuple[str, ...] | None = None) -> pd.DataFrame:
    """``df`` (read from ``path``) once each of ``columns`` it holds is what ``columns``
    says (``count``: integers >= 0; ``time``: finite numbers >= 0, ``time_or_nan`` or NaN;
    ``positive``: finite numbers > 0; ``beta``: finite, |β| < 1; ``number``: any numbers,
    NaN included; ``error``: numbers in [0, 1] or NaN; ``text``: any; a tuple: one of its
    strings); ``required`` (default: all of ``columns``) must be there. Otherwise a
    one-line DamagedFile naming the column."""
    need = tuple(columns) if required is None else required
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise damaged(path, f"no column {', '.join(missing)}")
    for name, kind in columns.items():
        if name in df.columns and kind != "text":
            why = _column_check(kind)(df[name])
            if why:
                raise damaged(path, f"column {name} {why}")
    return df


def checked_fields(record: Mapping[str, Any], fields: Mapping[str, Check],
                   path: Path) -> dict[str, Any]:
    """``record`` (read from ``path``) with each of ``fields`` it holds checked (and
    converted: ``"inf"`` to a float, ``null`` to NaN where a number may have failed); a
    wrong type or range is a one-line DamagedFile naming the field."""
    out = dict(record)
    for name, check in fields.items():
        if name in out:
            try:
                out[name] = check(name, out[name])
            except (ScenarioError, TypeError) as e:
                why = e.message if isinstance(e, ScenarioError) else str(e)
                raise damaged(path, f"{name}: {why}") from None
    return out


def _same_value(listed: Any, own: Any) -> bool:
    """Whether an index cell (as pandas read it) is a scenario's plain value ``own``."""
    if isinstance(own, bool) or isinstance(listed, bool):
        return listed is own or str(listed).lower() == str(own).lower()
    if isinstance(own, int | float):
        try:  # a column holding one text cell is read as text throughout
            return float(listed) == float(own)
        except (TypeError, ValueError):
            return False
    return str(listed) == own


def read_summary(folder: str | os.PathLike) -> dict[str, Any]:
    """A run folder's ``summary.json``, each field a reader uses checked
    (:data:`SUMMARY_FIELDS`); a damaged file or field is a one-line DamagedFile. What a
    replay, ``asyncsim compare`` and a sweep read of a finished run."""
    path = Path(folder) / SUMMARY
    return checked_fields(read_json(path), SUMMARY_FIELDS, path)


def _plain_name(name: Any, path: Path, field: str) -> str:
    """A folder name read from a file (a sweep's point, a figure's other sweep): one name,
    never a path that could lead out of the folder it is looked up in."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\0" in name):
        raise damaged(path, f"{field}: {name!r}; allowed: a folder name (no path)")
    return name


# ----------------------------------------------------------------------------- run folders
class RunFolder:
    """A run folder (online, replay, trace-only or real), read on demand and checked.

    Each property reads its file once, on first use: ``scenario`` (the
    :class:`~asyncsim.config.Scenario`), ``recorded`` (the scenario as a dict, every key
    checked by the schema), ``summary``, ``provenance`` (``{}`` where there is none),
    ``evals`` (eval.csv), ``trace``; :meth:`updates` reads updates.parquet's columns,
    :meth:`params` the final parameters, :meth:`value` one scenario key the schema leaves
    to a plug-in or to ``[figure]``.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def complete(self) -> bool:
        """Whether the run finished (its summary.json, written last, is there)."""
        return self.file(SUMMARY).exists()

    @property
    def kind(self) -> str:
        """What wrote the folder: ``"online"`` (``asyncsim run``), ``"replay"``, ``"real"``
        or ``"trace"`` (timing only), from its provenance."""
        return driver_from(self.provenance)

    @property
    def state(self) -> str:
        """``"complete"``, ``"diverged"`` (complete, stopped at ``summary["diverged_at"]``)
        or ``"unfinished"`` (no summary.json: killed, or still running)."""
        if not self.complete:
            return "unfinished"
        return "diverged" if self.summary.get("diverged") else "complete"

    def checkpoint_version(self) -> int | None:
        """The update an unfinished run's checkpoint holds (None: no checkpoint)."""
        path = self.file("checkpoint.npz")
        if not path.exists():
            return None
        raw = npz_member(path, "meta", what="the checkpoint")
        try:
            meta = json.loads(bytes(raw).decode())
            return _count("version", meta["version"])
        except (ValueError, KeyError, TypeError, ScenarioError) as e:
            raise damaged(path, f"its metadata: {e}") from None

    @cached_property
    def scenario(self) -> Scenario:
        from asyncsim.scenario import load_run_scenario

        try:
            return load_run_scenario(self.path, validate=False)
        except ScenarioError as e:
            raise damaged(self.file(SCENARIO_TOML),
                          f"{e.key}: {e.message}" if e.key else e.message) from None

    @cached_property
    def recorded(self) -> dict[str, Any]:
        """The scenario as a run folder records it (:func:`asyncsim.runs.scenario_toml`,
        read back: a plain dict, defaults filled in), each key checked by the scenario
        schema; plug-in options (``protocol.n``, ``data.n_train``) are read with
        :meth:`value`."""
        return tomllib.loads(scenario_toml(self.scenario))

    def value(self, key: str, default: Any, check: Check) -> Any:
        """The scenario's dotted ``key`` (``protocol.tau``, ``figure.warmup_updates``),
        ``default`` where it is not set, checked by ``check(key, value)``: for what the
        schema leaves to the plug-ins (their options; ``[figure]`` is free-form), which are
        checked against their registries only where the numerics are imported."""
        node: Any = self.recorded
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                node = default
                break
            node = node[part]
        try:
            return check(key, node)
        except ScenarioError as e:
            raise damaged(self.file(SCENARIO_TOML), f"{e.key}: {e.message}") from None

    @cached_property
    def summary(self) -> dict[str, Any]:
        return read_summary(self.path)

    def summary_value(self, name: str) -> Any:
        """``summary.json``'s field ``name``, checked; a missing one is damage too (a figure
        asks only for what its scenario's runs write)."""
        if name not in self.summary:
            raise damaged(self.file(SUMMARY), f"no field {name}")
        return self.summary[name]

    @cached_property
    def provenance(self) -> dict[str, Any]:
        path = self.file(PROVENANCE)
        if not path.exists():
            return {}
        return checked_fields(read_json(path), PROVENANCE_FIELDS, path)

    @cached_property
    def evals(self) -> pd.DataFrame:
        path = self.file("eval.csv")
        return checked_table(read_csv(path), EVAL_COLUMNS, path)

    @property
    def has_evals(self) -> bool:
        return self.file("eval.csv").exists()

    @cached_property
    def updates(self) -> pd.DataFrame:
        """updates.parquet: one row per update (its version, time, gradients, the mean train
        loss of its batches), each column checked."""
        path = self.file("updates.parquet")
        return checked_table(read_parquet(path), UPDATE_COLUMNS, path,
                             required=("version", "train_loss"))

    @cached_property
    def trace(self) -> Trace:
        from asyncsim.trace import Trace

        return Trace.load(self.path, learners=self.scenario.cluster.learners)

    @cached_property
    def params(self) -> dict[str, np.ndarray]:
        """The final parameters (params.npz) as numpy arrays, by pytree path (e.g.
        ``"['conv1']['w']"``), checked against the summary's param_hash; a trace-only run
        has none (a one-line DamagedFile)."""
        return read_params(self.path)

    def num_params(self) -> int | None:
        """How many parameters the model has (None: no params.npz, a trace-only run)."""
        if not self.file(PARAMS).exists():
            return None
        return int(sum(a.size for a in self.params.values()))

    def table(self, name: str, columns: Mapping[str, str | tuple[str, ...]]) -> pd.DataFrame:
        """A CSV table the run wrote besides the standard files (its ``sharpness.csv``),
        checked against ``columns`` (see :func:`checked_table`)."""
        path = self.file(name)
        return checked_table(read_csv(path), columns, path)



# ----------------------------------------------------------------------------- sweep folders
# A sweep's edges.csv (asyncsim.stability.measure) and a run's sharpness.csv.
EDGES_COLUMNS = {"point": "text", "tau": "count", "schedule": "text", "momentum": MOMENTUM_KINDS,
                 "beta": "beta", "measured": "number", "closed_form": "number",
                 "staleness_mean": "number", "staleness_max": "number"}
SHARPNESS_COLUMNS = {"update": "count", "sharpness": "number", "train_loss": "number",
                     "lr": "positive", "tau": "time_or_nan", "lr_rule": "text", "edge": "number",
                     "bound": "number", "eta_lambda": "number"}


class SweepFolder:
    """A sweep folder: its ``index.csv`` (one row per point, each point's folder a plain
    name inside it) and its points' :class:`RunFolder` s."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._keys_of: dict[str, dict[str, Any]] = {}  # _key_values, once per point

    def __repr__(self) -> str:
        return f"SweepFolder({str(self.path)!r})"

    @cached_property
    def index(self) -> pd.DataFrame:
        path = self.path / SWEEP_INDEX
        df = checked_table(read_csv(path), {"point": "text", "folder": "text"}, path)
        for name in df["point"]:
            _plain_name(name, path, "point")
        twice = df["point"][df["point"].duplicated()].tolist()
        if twice:  # one point's folder would stand for two rows of keys
            raise damaged(path, f"point {twice[0]} listed twice")
        return df

    @property
    def keys(self) -> list[str]:
        """The swept keys (dotted scenario keys, ``seed``): the columns the sweep writes
        between ``point`` and ``folder`` in its index."""
        cols = list(self.index.columns)
        return cols[cols.index("point") + 1:cols.index("folder")]

    @cached_property
    def table(self) -> pd.DataFrame:
        """One row per complete point: ``point``, its swept keys (as the sweep lists them;
        a table as its TOML text), every scalar of its summary, ``folder``; every summary
        value checked (:class:`RunFolder`). The frame to compare points with pandas."""
        import pandas as pd

        rows = []
        for run in self.points():
            row = {"point": run.path.name, **self._key_values(run)}
            row.update({k: v for k, v in run.summary.items()
                        if k not in row and not isinstance(v, list | dict)})
            rows.append({**row, "folder": str(run.path)})
        return pd.DataFrame(rows)

    def evals(self) -> pd.DataFrame:
        """Every complete point's evaluations (eval.csv) in long form, each row with its
        ``point`` and swept keys: learning curves for ``groupby``."""
        import pandas as pd

        frames = [run.evals.assign(point=run.path.name, **self._key_values(run))
                  for run in self.points() if run.has_evals]
        if not frames:
            return pd.DataFrame(columns=["point", *self.keys, *EVAL_COLUMNS])
        df = pd.concat(frames, ignore_index=True)
        return df[["point", *self.keys, *EVAL_COLUMNS]]

    def _key_values(self, run: RunFolder) -> dict[str, Any]:
        """A point's swept values, as its row of the index holds them, each that names a
        plain value of the point's scenario checked against it: an index edited (or a point
        replaced) never lends a point other keys (read and checked once per point: the
        table and the evaluations both ask)."""
        if run.path.name in self._keys_of:
            return self._keys_of[run.path.name]
        row = self.index[self.index["point"] == run.path.name].iloc[0]
        values = {k: row[k].item() if hasattr(row[k], "item") else row[k] for k in self.keys}
        own = flatten(read_toml(run.file(SCENARIO_TOML)))  # as written: only compared
        for k, v in values.items():
            have = own.get(k)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue  # a zipped sweep entry that leaves the key out
            if isinstance(have, bool | int | float | str) and not _same_value(v, have):
                raise damaged(self.path / SWEEP_INDEX, f"point {run.path.name}: {k} = {v!r}, "
                              f"but its scenario.toml has {have!r}")
        self._keys_of[run.path.name] = values
        return values

    def points(self, *, complete: bool = True) -> Iterator[RunFolder]:
        """Each point's run folder, in index order (``complete``: only those that finished:
        a sweep may still be running)."""
        for name in self.index["point"]:
            run = RunFolder(self.path / name)
            if run.complete or not complete:
                yield run

    def edges(self) -> pd.DataFrame:
        """The stability edges the sweep measured (its ``edges.csv``)."""
        path = self.path / EDGES_CSV
        if not path.exists():
            raise DamagedFile(f"{path}: missing; run the sweep (its [measure] edges writes it "
                              "once every point is complete)")
        return checked_table(read_csv(path), EDGES_COLUMNS, path)

    def sibling(self, name: Any, field: str) -> SweepFolder:
        """Another sweep beside this one, named by ``name`` (read from ``field`` of this
        sweep's scenario): one folder name, never a path out of the parent folder."""
        return SweepFolder(self.path.parent / _plain_name(name, self.path / SWEEP_INDEX, field))


def open_run(path: str | Path) -> RunFolder:
    """A run folder (online, replay, trace-only or real) to read results from: its
    ``scenario``, ``summary``, ``evals`` (DataFrame), ``updates``, ``trace`` and ``params``,
    each read on first use and checked; JAX is not imported. A folder that is not a run (a
    sweep, nothing) is a one-line :class:`~asyncsim.runs.RunFolderError`::

        run = asyncsim.open_run("runs/quickstart/seed0")
        run.summary["final_test_error"], run.evals.plot(x="sim_time", y="test_error")
    """
    path = Path(path)
    if os.path.lexists(path / SWEEP_INDEX) or not any(
            os.path.lexists(path / m) for m in _RUN_FILES):
        raise RunFolderError(_not_a_run(path))
    return RunFolder(path)


def open_sweep(path: str | Path) -> SweepFolder:
    """A sweep folder to read results from: ``.table``, one row per complete point with its
    swept keys beside its summary's scalars; ``.evals()``, every point's evaluations in long
    form; ``.points()``, the :class:`RunFolder` s. JAX is not imported::

        sweep = asyncsim.open_sweep("runs/p1_f3_lr_modulation")
        sweep.table.groupby("protocol.n")["final_test_error"].mean()
    """
    path = Path(path)
    if not (path / SWEEP_INDEX).exists():
        raise RunFolderError(_not_a_run(path) if not (path / SUMMARY).exists() else
                             f"{path}: a run folder, not a sweep; use asyncsim.open_run")
    return SweepFolder(path)


def _not_a_run(path: Path) -> str:
    if not path.exists():
        return f"{path}: no such folder"
    if (path / SWEEP_INDEX).exists():
        return f"{path}: a sweep folder; use asyncsim.open_sweep (or one of its points)"
    held = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    if held and all(n == LOCK or n.endswith(".tmp") for n in held):
        # What a run killed as it started leaves: its lock, maybe a file cut short.
        return (f"{path}: a run stopped before it wrote its scenario (it holds only "
                f"{', '.join(held)}): run its command again with --force")
    return f"{path}: not a run folder (none of {', '.join(_RUN_FILES)})"


# What marks a run folder (not a sweep's): a file only asyncsim writes, or the scenario that
# a run killed before its first other file has already written.
_RUN_FILES = (*(m for m in RUN_MARKS if m != SWEEP_INDEX), SCENARIO_TOML)


def run_folders(source: str | Path) -> list[RunFolder]:
    """``source`` itself if it is one complete run folder, else a sweep's complete points."""
    run = RunFolder(source)
    return [run] if run.complete else list(SweepFolder(source).points())


