"""The Trace: the complete timing record of a run (docs/design.md).

One row per *applied* gradient and one per update, stored column-wise as numpy arrays.
Gradient rows are ordered by ``apply_version`` and, within an update, by the order the PS
took them, so the gradients of update ``v`` are the contiguous rows
``updates["start"][v] : updates["start"][v] + updates["n_grads"][v]``.

Given a trace and the scenario's seed, the numerics of a run are fully determined: a
gradient's inputs are the parameters at ``read_version`` and the mini-batch
``(seed, learner, batch)`` (see :func:`asyncsim.numerics.data.batch_indices`).

With ``cluster.availability`` a third table, ``down``, has one row per period a learner was
down, with the gradient it lost then (pulled, never applied); its batch is recomputed when
the learner is back, so ``grads`` still holds each learner's batches 0, 1, 2, ... in order.

Staleness is P1's τ = i − j: ``apply_version`` (the PS timestamp i when the update that takes
the gradient is applied; the update produces version i + 1) minus ``read_version`` (the
timestamp j the learner read at *pull* time).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncsim import _checks
from asyncsim._io import (
    SUMMARY,
    TRACE_META,
    DamagedFile,
    damaged,
    jsonable,
    make_folder,
    read_csv,
    read_json,
    read_parquet,
    write_parquet,
    write_text,
)
from asyncsim.errors import ScenarioError

if TYPE_CHECKING:
    import pandas as pd

GRAD_COLUMNS: dict[str, type] = {
    "learner": np.int32,
    "batch": np.int64,  # the learner's local step: its k-th gradient (P1: one mini-batch each)
    "read_version": np.int64,
    "apply_version": np.int64,
    "staleness": np.int64,
    "t_pull": np.float64,  # the PS served the pull (the version was read)
    "t_push": np.float64,  # the learner finished computing and started sending
    # simulated: the push was done (its latency and any PS service time); real: the PS
    # picked the gradient up
    "t_arrive": np.float64,
    "t_apply": np.float64,  # the update that took it was applied
}
FILES = ("trace_grads.parquet", "trace_updates.parquet", TRACE_META)  # Trace.save
DOWN_FILE = "trace_down.parquet"  # written only when a learner went down

UPDATE_COLUMNS: dict[str, type] = {
    "version": np.int64,  # the PS timestamp the update was applied at (it creates version+1)
    "time": np.float64,
    "n_grads": np.int32,
    "start": np.int64,  # first gradient row of this update
}

# One row per period a learner was down (cluster.availability), in the order they began.
DOWN_COLUMNS: dict[str, type] = {
    "learner": np.int32,
    "t_down": np.float64,
    "t_up": np.float64,  # inf: still down when the run ended
    # The gradient it lost: the batch it had pulled and not yet delivered (-1: none, it was
    # waiting to pull), the version that pull read (-1) and when (NaN).
    "batch": np.int64,
    "read_version": np.int64,
    "t_pull": np.float64,
}


# The most learners a run has (cluster.learners' bound): a trace's learner ids are below it.
MAX_LEARNERS = 100_000

# Bytes of one gradient's trace row (9 columns of 8 bytes) plus its share of an update row,
# the Python-side buffers while the simulation grows them, and the saved copy.
ROW_BYTES = 2 * (9 * 8 + 4 * 8)


def check_fits(key: str, gradients: float) -> None:
    """Refuse, before a run starts, a trace of ``gradients`` rows that would need more than
    the machine's memory (``run.updates = 1e18`` would otherwise grow without end), in one
    line under ``key``."""
    _checks.memory(key, gradients * ROW_BYTES, f"a trace of {gradients:.3g} gradients needs",
                   f" ({ROW_BYTES} bytes each)")


def _text(name: str, v: Any) -> Any:
    return v if v is None else _checks.string(name, v)


# trace_meta.json's fields asyncsim reads, each checked when a trace is loaded (other fields
# are kept as they are): the values the commands compute with (learners, sim_time) and those
# they print or compare.
META_CHECKS = {
    "learners": lambda k, v: _checks.integer(k, v, low=1, high=MAX_LEARNERS),
    "sim_time": _checks.nonneg,
    "seed": lambda k, v: _checks.integer(k, v, low=0),
    "protocol": _text,
    "stop_reason": _text,
    "kind": _text,
    "short_rounds_allowed": _checks.flag,
}

# What a column of a trace table may hold, by the kind of its dtype (GRAD_COLUMNS & co.):
# integer columns integers, time columns numbers.
_COLUMN_KINDS = {"i": ("iu", "integers"), "f": ("iuf", "numbers")}


def _no_down() -> dict[str, np.ndarray]:
    return {k: np.zeros(0, t) for k, t in DOWN_COLUMNS.items()}


@dataclass(frozen=True)
class Trace:
    """Columnar timing record. ``grads``, ``updates`` and ``down`` map column names to 1-D
    arrays (``down`` is empty unless learners went down: :data:`DOWN_COLUMNS`); ``folder``
    is the run folder :meth:`load` read it from (None for a trace made in memory), where a
    replay of it may write (``RUN/replay``) and which it never replaces."""

    grads: Mapping[str, np.ndarray]
    updates: Mapping[str, np.ndarray]
    meta: Mapping[str, Any] = field(default_factory=dict)
    down: Mapping[str, np.ndarray] = field(default_factory=_no_down)
    folder: Path | None = field(default=None, compare=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_columns(
        cls,
        grads: Mapping[str, Any],
        updates: Mapping[str, Any],
        meta: Mapping[str, Any] | None = None,
        down: Mapping[str, Any] | None = None,
    ) -> Trace:
        g = {k: np.asarray(grads[k], dtype=t) for k, t in GRAD_COLUMNS.items()}
        u = {k: np.asarray(updates[k], dtype=t) for k, t in UPDATE_COLUMNS.items()}
        extra = {k: np.asarray(v) for k, v in grads.items() if k not in GRAD_COLUMNS}
        g.update(extra)
        d = (_no_down() if down is None else
             {k: np.asarray(down[k], dtype=t) for k, t in DOWN_COLUMNS.items()})
        return cls(g, u, dict(meta or {}), d)

    # ------------------------------------------------------------------ views
    @property
    def num_gradients(self) -> int:
        return int(self.grads["learner"].shape[0])

    @property
    def num_updates(self) -> int:
        return int(self.updates["version"].shape[0])

    @property
    def num_down(self) -> int:
        """Down periods of learners (0 without ``cluster.availability``)."""
        return int(self.down["learner"].shape[0])

    @property
    def staleness(self) -> np.ndarray:
        return self.grads["staleness"]

    @property
    def max_staleness(self) -> int:
        return int(self.staleness.max()) if self.num_gradients else 0

    @property
    def uniform_n_grads(self) -> int | None:
        """The number of gradients every update takes, or None when it varies or there are
        no updates: the compiled-chunk executor needs it constant (every built-in
        protocol's trace has it; a real hardsync run with a lost learner does not)."""
        counts = self.updates["n_grads"]
        if counts.size == 0 or np.any(counts != counts[0]):
            return None
        return int(counts[0])

    def gradients_df(self) -> pd.DataFrame:
        """One row per applied gradient, as a pandas DataFrame."""
        import pandas as pd  # here: a run never imports pandas (docs/design.md)

        return pd.DataFrame(dict(self.grads))

    def updates_df(self) -> pd.DataFrame:
        """One row per update, as a pandas DataFrame."""
        import pandas as pd  # here: a run never imports pandas (docs/design.md)

        return pd.DataFrame(dict(self.updates))

    def update_slice(self, v: int) -> slice:
        s = int(self.updates["start"][v])
        return slice(s, s + int(self.updates["n_grads"][v]))

    def iter_updates(self) -> Iterator[tuple[int, list[tuple[int, int, int, int]], float]]:
        """``(version, rows, time)`` per update, in order; ``rows`` are the timing rows
        ``(learner, batch, read_version, staleness)`` of the gradients it took, in the order
        the PS took them. The one loop over a trace that every loop executor uses."""
        g, u = self.grads, self.updates
        learner, batch = g["learner"].tolist(), g["batch"].tolist()
        read, stale = g["read_version"].tolist(), g["staleness"].tolist()
        starts, counts, times = u["start"].tolist(), u["n_grads"].tolist(), u["time"].tolist()
        for v in range(self.num_updates):
            s = starts[v]
            yield v, [(learner[i], batch[i], read[i], stale[i])
                      for i in range(s, s + counts[v])], times[v]

    def truncate(self, updates: int, *, stop_reason: str | None = None) -> Trace:
        """The first ``updates`` updates (a diverged run stops early, a probe times a few);
        ``stop_reason`` replaces the meta's, and ``sim_time`` becomes the last update's time
        when updates are cut."""
        if updates >= self.num_updates:
            n, meta = self.num_gradients, dict(self.meta)
        else:
            n = int(self.updates["start"][updates])
            meta = {**self.meta, "sim_time": float(self.updates["time"][updates - 1])
                    if updates else 0.0}
        if stop_reason is not None:
            meta["stop_reason"] = stop_reason
        down = self.down
        if updates < self.num_updates and self.num_down:
            # As if the run had stopped then: later down periods never began, and one in
            # progress had not ended.
            end = meta["sim_time"]
            keep = down["t_down"] <= end
            down = {k: v[keep] for k, v in down.items()}
            down["t_up"] = np.where(down["t_up"] > end, np.inf, down["t_up"])
        return Trace({k: v[:n] for k, v in self.grads.items()},
                     {k: v[:updates] for k, v in self.updates.items()}, meta, down)

    # ------------------------------------------------------------------ statistics
    def staleness_stats(self, *, skip: int = 0) -> dict[str, float]:
        """Mean, max, p99 and std of staleness, optionally after ``skip`` warm-up updates."""
        tau = self.staleness[self.grads["apply_version"] >= skip]
        if tau.size == 0:
            return {"staleness_mean": 0.0, "staleness_max": 0, "staleness_p99": 0.0,
                    "staleness_std": 0.0}
        return {
            "staleness_mean": float(tau.mean()),
            "staleness_max": int(tau.max()),
            "staleness_p99": float(np.percentile(tau, 99)),
            "staleness_std": float(tau.std()),
        }

    def staleness_histogram(self, *, skip: int = 0) -> pd.DataFrame:
        """Counts and frequencies of each staleness value (columns staleness, count, freq)."""
        import pandas as pd  # here: a run never imports pandas (docs/design.md)

        tau = self.staleness[self.grads["apply_version"] >= skip]
        counts = np.bincount(tau) if tau.size else np.zeros(1, np.int64)
        return pd.DataFrame({
            "staleness": np.arange(counts.size),
            "count": counts,
            "freq": counts / max(int(tau.size), 1),
        })

    def summary(self) -> dict[str, Any]:
        """The trace's headline figures for ``summary.json``: gradients, updates, sim_time,
        staleness mean/max/p99/std and trace_hash; with down periods, :meth:`down_stats`."""
        out = {"gradients": self.num_gradients, "updates": self.num_updates,
               "sim_time": float(self.meta.get("sim_time", 0.0)), **self.staleness_stats(),
               "trace_hash": self.hash()}
        if self.num_down:
            out.update(self.down_stats())
        return out

    def down_stats(self) -> dict[str, Any]:
        """``down_periods``, ``lost_gradients`` (pulled and never applied: a learner went down
        first) and ``up_fraction`` (the share of learner-time up, over ``sim_time`` and the
        meta's ``learners``) of a trace with learners that came and went."""
        d = self.down
        end = float(self.meta.get("sim_time", 0.0))
        lam = int(self.meta.get("learners", 0))
        down_time = float(np.sum(np.minimum(d["t_up"], end) - np.minimum(d["t_down"], end)))
        return {"down_periods": self.num_down,
                "lost_gradients": int(np.count_nonzero(d["batch"] >= 0)),
                "up_fraction": 1.0 - down_time / (lam * end) if lam and end > 0 else 1.0}

    def hash(self) -> str:
        """SHA-256 over every column's bytes (in a fixed column order): the trace's identity."""
        h = hashlib.sha256()
        # The down table only when it has rows: a trace without availability keeps the hash
        # it had before there was one.
        for table in (self.grads, self.updates, *((self.down,) if self.num_down else ())):
            for k in sorted(table):
                a = np.ascontiguousarray(table[k])
                h.update(k.encode())
                h.update(str(a.dtype).encode())
                h.update(a.tobytes())
        return h.hexdigest()

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | os.PathLike) -> None:
        """Write ``trace_grads.parquet``, ``trace_updates.parquet``, ``trace_meta.json``.

        Each file is written to a temporary name and renamed, so a reader never sees half
        a file.
        """
        folder = make_folder(folder)
        tables = [("trace_grads", self.grads), ("trace_updates", self.updates)]
        if self.num_down:
            tables.append(("trace_down", self.down))
        for name, table in tables:
            write_parquet(folder / f"{name}.parquet", table)
        if not self.num_down:
            (folder / DOWN_FILE).unlink(missing_ok=True)  # another trace's, saved here before
        # Its hash beside the tables, which :meth:`load` checks them against.
        meta = {**self.meta, "trace_hash": self.hash()}
        write_text(folder / TRACE_META,
                   json.dumps(jsonable(meta), indent=1, sort_keys=True))

    @classmethod
    def load(cls, folder: str | os.PathLike, *, learners: int | None = None) -> Trace:
        """The trace a run folder holds; a missing, damaged or inconsistent file is a
        one-line :class:`asyncsim._io.DamagedFile` naming it: a column that is missing or
        not of its type, a time that is NaN or infinite, a learner id outside 0 ..
        ``learners`` - 1 (trace_meta.json's, and ``learners``, the run's scenario's
        cluster.learners where the caller has it, must agree), a field of trace_meta.json
        that is not what :data:`META_CHECKS` allows, gradients that do not match the
        updates, tables whose :meth:`hash` is not the ``trace_hash`` recorded with them
        (trace_meta.json's and the folder's summary.json's: a trace edited into another
        valid one never passes for the recorded run). :func:`asyncsim.testing.check_trace`
        checks the rest (per learner and per protocol), too slow to check every load."""
        folder = Path(folder)
        meta_path = folder / TRACE_META
        meta = read_json(meta_path) if meta_path.exists() else {}
        recorded = _recorded_hashes(folder, meta)
        if not recorded:
            # Trace.save records it beside every trace, and a complete run's summary does
            # too (the one record in older folders): without either, nothing says the
            # tables are the run's.
            raise damaged(meta_path, "no trace_hash here or in summary.json, the record the "
                          "trace's tables are checked against")
        for key, check in META_CHECKS.items():
            if key in meta:
                try:
                    check(key, meta[key])
                except ScenarioError as e:
                    raise damaged(meta_path, f"{key}: {e.message}") from None
        if learners is not None and meta.get("learners", learners) != learners:
            raise damaged(meta_path, f"learners = {meta['learners']}, but the run's "
                          f"scenario has cluster.learners = {learners}")
        lam, whose = ((meta["learners"], "trace_meta.json has learners = {}") if "learners" in meta
                      else (learners, "the run's scenario has cluster.learners = {}") if learners
                      else (MAX_LEARNERS, "a run has at most {} learners"))
        tables = []
        for name, columns in (("trace_grads", GRAD_COLUMNS), ("trace_updates", UPDATE_COLUMNS)):
            path = folder / f"{name}.parquet"
            tables.append(_table(path, columns, lam, whose))
        down = None
        if (folder / DOWN_FILE).exists():
            table = _table(folder / DOWN_FILE, DOWN_COLUMNS, lam, whose)
            down = {k: table[k] for k in DOWN_COLUMNS}
        try:
            trace = cls.from_columns(*tables, meta, down)
        except (TypeError, ValueError) as e:
            raise damaged(f"{folder} (its trace)", e) from None
        g, u = trace.grads, trace.updates
        if (int(u["n_grads"].sum()) != trace.num_gradients
                or (trace.num_gradients and not (0 <= g["apply_version"].min()
                                                 and g["apply_version"].max()
                                                 < trace.num_updates))):
            raise damaged(folder / "trace_grads.parquet", "its gradients do not match the "
                          f"{trace.num_updates} updates of trace_updates.parquet")
        if recorded:
            check_hash(trace, recorded, folder / FILES[0])
        return dataclasses.replace(trace, folder=folder)


def _recorded_hashes(folder: Path, meta: Mapping[str, Any]) -> dict[str, str]:
    """The ``trace_hash`` values a folder records for its trace: ``{file: hash}`` of
    trace_meta.json's and summary.json's (a complete run's)."""
    summary = folder / SUMMARY
    records = {TRACE_META: meta, SUMMARY: read_json(summary) if summary.exists() else {}}
    # None: written before traces recorded it, or a folder's summary without a trace
    return {name: r["trace_hash"] for name, r in records.items()
            if r.get("trace_hash") is not None}


def check_hash(trace: Trace, recorded: Mapping[str, str], label: str | os.PathLike, *,
               advice: str = "replay the original folder, or redo the run") -> None:
    """Refuse, as a one-line :class:`asyncsim._io.DamagedFile` naming ``label`` (the file
    that holds the trace), a ``trace`` whose :meth:`Trace.hash` is not every hash in
    ``recorded`` (``{where it was recorded: hash}``): its tables were changed after the run
    wrote them (or a file of another run was put in their place)."""
    actual = trace.hash()
    for where, value in recorded.items():
        if not isinstance(value, str):
            raise DamagedFile(f"{label}: trace_hash in {where} is {value!r}; allowed: a "
                              f"SHA-256 hex string; {advice}")
        if value != actual:
            raise DamagedFile(
                f"{label}: does not match its recorded trace_hash ({value[:12]}… in {where}; "
                f"the trace's tables hash to {actual[:12]}…): the trace was changed after "
                f"its run wrote it; {advice}")


# Each table's times that must be numbers, finite (False) or possibly infinite (True: a down
# period's t_up, when it had not ended); a real trace's t_start too. A down period's t_pull
# is NaN when it lost no gradient.
_TIMES = {"trace_grads": dict.fromkeys(("t_start", "t_pull", "t_push", "t_arrive", "t_apply"),
                                       False),
          "trace_updates": {"time": False}, "trace_down": {"t_down": False, "t_up": True}}


def _table(path: Path, columns: Mapping[str, type], learners: int,
           whose: str) -> dict[str, np.ndarray]:
    """The columns of the trace table ``path``; a missing column, one that does not hold
    what :data:`GRAD_COLUMNS` & co. say, a time of :data:`_TIMES` that is NaN (or infinite),
    or a learner id outside ``0 .. learners - 1`` (``whose``: what says so) is damage,
    checked before the columns are cast (a string, or an id of 2**40, would cast)."""
    df = read_parquet(path)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise damaged(path, f"no column {', '.join(missing)}")
    table = {k: df[k].to_numpy() for k in df.columns}
    times = {k: inf for k, inf in _TIMES[path.stem].items() if k in table}
    for k in [*columns, *(k for k in times if k not in columns)]:
        kinds, allowed = _COLUMN_KINDS[np.dtype(columns.get(k, np.float64)).kind]
        if table[k].dtype.kind not in kinds:
            raise damaged(path, f"column {k} holds {table[k].dtype} values; allowed: {allowed}")
    for k, inf in times.items():
        a = table[k]
        bad = np.flatnonzero(np.isnan(a) if inf else ~np.isfinite(a))
        if len(bad):
            raise damaged(path, f"column {k} holds {a[bad[0]].item()!r} at row {bad[0]}; "
                          f"allowed: {'numbers or inf' if inf else 'finite numbers'}")
    ids = table.get("learner")
    if ids is not None and ids.size and not (0 <= ids.min() and ids.max() < learners):
        bad = ids[(ids < 0) | (ids >= learners)][0]
        raise damaged(path, f"learner id {bad}; allowed: 0 .. {learners - 1}, as "
                      + whose.format(learners))
    return table


# ----------------------------------------------------------------------------- away intervals
AWAY_COLUMNS = ["learner", "kind", "t0", "t1", "staleness", "batch"]
RESTARTS_FILE = "restarts.csv"  # a real run's lost learners and their restarts


def read_restarts(folder: str | os.PathLike) -> pd.DataFrame | None:
    """A run folder's ``restarts.csv`` (a real run's), or None where it has none."""
    path = Path(folder) / RESTARTS_FILE
    return read_csv(path) if path.exists() else None


def away_intervals(trace: Trace, restarts: pd.DataFrame | None = None) -> pd.DataFrame:
    """The intervals a run's learners were away, one row each (``learner``, ``kind``, ``t0``,
    ``t1``, ``staleness`` = -1, ``batch``): ``down`` from a simulated trace's down table (cut
    at the run's end) and from a real run's ``restarts.csv`` table (``restarts``: a lost
    learner to its ``rejoined`` -- hardsync, which goes on without it -- or, where the PS
    serves the restarted actor at once, its ``restarted``; one not back by the end, to the
    run's end), and ``lost``, the work a
    simulated learner lost by going down (its pull to the moment it went down). The one
    reading of "down" that ``asyncsim timeline``, ``asyncsim calibrate`` and ``check_trace``
    share; a damaged ``restarts`` table is a one-line :class:`asyncsim._io.DamagedFile`."""
    import pandas as pd  # here: a run never imports pandas (docs/design.md)

    away = []
    if trace.num_down:
        d = {k: np.asarray(v) for k, v in trace.down.items()}
        end = float(trace.meta.get("sim_time", np.max(d["t_down"])))
        lost = d["batch"] >= 0
        away.append(pd.DataFrame({"learner": d["learner"], "kind": "down", "t0": d["t_down"],
                                  "t1": np.minimum(d["t_up"], end), "staleness": -1,
                                  "batch": -1}))
        away.append(pd.DataFrame({"learner": d["learner"][lost], "kind": "lost",
                                  "t0": d["t_pull"][lost], "t1": d["t_down"][lost],
                                  "staleness": -1, "batch": d["batch"][lost]}))
    if restarts is not None and len(restarts):
        try:
            away.append(_restart_downs(trace, restarts))
        except (KeyError, ValueError, TypeError) as e:
            raise damaged(RESTARTS_FILE, e, "move it aside: the trace alone has the "
                          "rest") from None
    away = [a for a in away if len(a)]
    if not away:
        return pd.DataFrame({"learner": np.zeros(0, int), "kind": np.zeros(0, object),
                             "t0": np.zeros(0), "t1": np.zeros(0),
                             "staleness": np.zeros(0, int), "batch": np.zeros(0, int)})
    return pd.concat(away, ignore_index=True)[AWAY_COLUMNS]


def _restart_downs(trace: Trace, restarts: pd.DataFrame) -> pd.DataFrame:
    """A real run's down intervals, from its restarts table (see :func:`away_intervals`)."""
    import pandas as pd  # here: a run never imports pandas (docs/design.md)

    rows = []
    for k, ev in restarts.sort_values("t", kind="stable").groupby("learner"):
        start = None
        events = list(ev[["event", "t"]].itertuples(index=False))
        for i, (kind, t) in enumerate(events):
            if kind == "lost" and start is None:
                start = float(t)
            elif start is not None and kind in ("rejoined", "restarted"):
                later = [e for e, _ in events[i + 1:]]
                if kind == "restarted" and "rejoined" in later[:2]:
                    continue  # hardsync: down until it rejoins
                rows.append({"learner": int(k), "kind": "down", "t0": start,
                             "t1": float(t), "staleness": -1, "batch": -1})
                start = None
        if start is not None:  # not back when the run ended
            rows.append({"learner": int(k), "kind": "down", "t0": start,
                         "t1": max(float(trace.meta.get("sim_time", start)), start),
                         "staleness": -1, "batch": -1})
    return pd.DataFrame(rows, columns=AWAY_COLUMNS)
