"""The Trace: the complete timing record of a run (docs/design.md).

One row per *applied* gradient and one per update, stored column-wise as numpy arrays.
Gradient rows are ordered by ``apply_version`` and, within an update, by the order the PS
took them, so the gradients of update ``v`` are the contiguous rows
``updates["start"][v] : updates["start"][v] + updates["n_grads"][v]``.

Given a trace and the scenario's seed, the numerics of a run are fully determined: a
gradient's inputs are the parameters at ``read_version`` and the mini-batch
``(seed, learner, batch)`` (see :func:`asyncsim.data.batch_indices`).

Staleness is P1's τ = i − j: ``apply_version`` (the PS timestamp i when the update that takes
the gradient is applied; the update produces version i + 1) minus ``read_version`` (the
timestamp j the learner read at *pull* time).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from asyncsim._io import atomic, damaged, jsonable, read_json, read_parquet, write_text

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
FILES = ("trace_grads.parquet", "trace_updates.parquet", "trace_meta.json")  # Trace.save

UPDATE_COLUMNS: dict[str, type] = {
    "version": np.int64,  # the PS timestamp the update was applied at (it creates version+1)
    "time": np.float64,
    "n_grads": np.int32,
    "start": np.int64,  # first gradient row of this update
}


@dataclass(frozen=True)
class Trace:
    """Columnar timing record. ``grads`` and ``updates`` map column names to 1-D arrays."""

    grads: Mapping[str, np.ndarray]
    updates: Mapping[str, np.ndarray]
    meta: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_columns(
        cls,
        grads: Mapping[str, Any],
        updates: Mapping[str, Any],
        meta: Mapping[str, Any] | None = None,
    ) -> Trace:
        g = {k: np.asarray(grads[k], dtype=t) for k, t in GRAD_COLUMNS.items()}
        u = {k: np.asarray(updates[k], dtype=t) for k, t in UPDATE_COLUMNS.items()}
        extra = {k: np.asarray(v) for k, v in grads.items() if k not in GRAD_COLUMNS}
        g.update(extra)
        return cls(g, u, dict(meta or {}))

    # ------------------------------------------------------------------ views
    @property
    def num_gradients(self) -> int:
        return int(self.grads["learner"].shape[0])

    @property
    def num_updates(self) -> int:
        return int(self.updates["version"].shape[0])

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
        return pd.DataFrame(dict(self.grads))

    def updates_df(self) -> pd.DataFrame:
        """One row per update, as a pandas DataFrame."""
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
        return Trace({k: v[:n] for k, v in self.grads.items()},
                     {k: v[:updates] for k, v in self.updates.items()}, meta)

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
        tau = self.staleness[self.grads["apply_version"] >= skip]
        counts = np.bincount(tau) if tau.size else np.zeros(1, np.int64)
        return pd.DataFrame({
            "staleness": np.arange(counts.size),
            "count": counts,
            "freq": counts / max(int(tau.size), 1),
        })

    def summary(self) -> dict[str, Any]:
        """The trace's headline figures for ``summary.json``: gradients, updates, sim_time,
        staleness mean/max/p99/std and trace_hash."""
        return {"gradients": self.num_gradients, "updates": self.num_updates,
                "sim_time": float(self.meta.get("sim_time", 0.0)), **self.staleness_stats(),
                "trace_hash": self.hash()}

    def hash(self) -> str:
        """SHA-256 over every column's bytes (in a fixed column order): the trace's identity."""
        h = hashlib.sha256()
        for table in (self.grads, self.updates):
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
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name, table in (("trace_grads", self.grads), ("trace_updates", self.updates)):
            with atomic(folder / f"{name}.parquet") as tmp:
                pd.DataFrame(dict(table)).to_parquet(tmp, index=False)
        write_text(folder / "trace_meta.json",
                   json.dumps(jsonable(dict(self.meta)), indent=1, sort_keys=True))

    @classmethod
    def load(cls, folder: str | os.PathLike) -> Trace:
        """The trace a run folder holds; a missing, damaged or inconsistent file is a
        one-line :class:`asyncsim._io.DamagedFile` naming it."""
        folder = Path(folder)
        tables = []
        for name, columns in (("trace_grads", GRAD_COLUMNS), ("trace_updates", UPDATE_COLUMNS)):
            path = folder / f"{name}.parquet"
            df = read_parquet(path)
            missing = [c for c in columns if c not in df.columns]
            if missing:
                raise damaged(path, f"no column {', '.join(missing)}")
            tables.append({k: df[k].to_numpy() for k in df.columns})
        meta_path = folder / "trace_meta.json"
        meta = read_json(meta_path) if meta_path.exists() else {}
        try:
            trace = cls.from_columns(*tables, meta)
        except (TypeError, ValueError) as e:
            raise damaged(f"{folder} (its trace)", e) from None
        g, u = trace.grads, trace.updates
        if (int(u["n_grads"].sum()) != trace.num_gradients
                or (trace.num_gradients and not (0 <= g["apply_version"].min()
                                                 and g["apply_version"].max()
                                                 < trace.num_updates))):
            raise damaged(folder / "trace_grads.parquet", "its gradients do not match the "
                          f"{trace.num_updates} updates of trace_updates.parquet")
        return trace

