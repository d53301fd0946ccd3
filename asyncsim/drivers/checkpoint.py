"""A run folder's saved numerics: ``checkpoint.npz`` (what ``--resume`` restarts from) and
``params.npz`` (the final parameters).

A checkpoint holds the core state, the parameter versions later gradients still read, the
batch losses and evaluations so far, and ``extra``: the gradients applied, what a monitor
measured, the timing revision it was made under and the scenario as the folder records it
(:mod:`asyncsim.drivers.folder_scenario`), which :func:`check_checkpoint` holds the folder's
``scenario.toml`` to. Writes are atomic; a checkpoint that cannot be used is a one-line
:class:`~asyncsim._io.DamagedFile` or a :class:`~asyncsim.errors.ScenarioError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from asyncsim._io import (
    PARAMS,
    DamagedFile,
    atomic,
    damaged,
    npz_member,
    read_npz,
    read_params,
)
from asyncsim.config import Scenario
from asyncsim.drivers.folder_scenario import check_resume
from asyncsim.drivers.metrics import Recorder
from asyncsim.errors import ScenarioError
from asyncsim.numerics.core import CoreState
from asyncsim.numerics.numerics import EvalRecord, Numerics
from asyncsim.timing.protocols import protocol_options, timing_revision
from asyncsim.trace import Trace, check_hash

CKPT = "checkpoint.npz"
# What to do about a checkpoint that cannot be used.
_START_OVER = "pass --force to start over"


def _flat(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def save_checkpoint(folder: Path, version: int, state: CoreState, versions: dict[int, Any],
                    rec: Recorder, extra: dict[str, Any]) -> None:
    arrays: dict[str, np.ndarray] = {f"state_{i}": a for i, a in enumerate(_flat(state))}
    arrays.update({f"v{v}_{i}": a for v, params in versions.items()
                   for i, a in enumerate(_flat(params))})
    meta = {"version": version, "versions": sorted(versions),
            "evals": [e.__dict__ for e in rec.evals], "extra": extra,
            "losses_len": [int(x.size) for x in rec.losses]}
    arrays["losses"] = (np.concatenate(rec.losses) if rec.losses
                        else np.zeros(0, np.float32)).astype(np.float32)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with atomic(folder / CKPT, fsync=True) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def load_checkpoint(folder: Path, template_state: CoreState, template_params):
    """``(version, state, versions, recorder, extra)`` of ``folder``'s checkpoint, every
    array of the shape and dtype of its ``template_*`` leaf and the metadata consistent (one
    loss entry per update before ``version``, the versions held at most ``version``): a
    checkpoint edited or cut short is a one-line DamagedFile, never a run resumed from
    something it did not save."""
    path = folder / CKPT
    z = read_npz(path, what="the checkpoint")
    meta = json.loads(bytes(z["meta"]).decode())
    version, held, lens = meta["version"], meta["versions"], meta["losses_len"]
    if not (_count(version) and isinstance(held, list) and all(_count(v) and v <= version
                                                                for v in held)
            and isinstance(lens, list) and len(lens) == version
            and all(_count(n) for n in lens) and sum(lens) == z["losses"].size):
        raise damaged(path, "its metadata does not fit its update count", _START_OVER)

    def leaves(prefix: str, template) -> list:
        out = []
        for i, t in enumerate(jax.tree_util.tree_leaves(template)):
            a = z[f"{prefix}_{i}"]
            if a.shape != np.shape(t) or a.dtype != np.asarray(t).dtype:
                raise damaged(path, f"{prefix}_{i} is {a.dtype}{list(a.shape)}, the run's "
                              f"{np.asarray(t).dtype}{list(np.shape(t))}", _START_OVER)
            out.append(jax.numpy.asarray(a))
        return out

    state = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template_state),
                                         leaves("state", template_state))
    p_def = jax.tree_util.tree_structure(template_params)
    versions = {v: jax.tree_util.tree_unflatten(p_def, leaves(f"v{v}", template_params))
                for v in held}
    flat = z["losses"]
    rec = Recorder()
    pos = 0
    for n in meta["losses_len"]:
        rec.losses.append(flat[pos:pos + n])
        pos += n
    rec.evals = [EvalRecord(**e) for e in meta["evals"]]
    return meta["version"], state, versions, rec, meta["extra"]


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def checkpoint_meta(folder: Path) -> dict[str, Any]:
    """The metadata of ``folder``'s checkpoint (its version, what it was saved with), read
    without loading its states; a checkpoint that cannot be read is a one-line
    :class:`~asyncsim._io.DamagedFile`."""
    raw = npz_member(folder / CKPT, "meta", what="the checkpoint", advice=_START_OVER)
    try:
        meta = json.loads(bytes(raw).decode())
    except ValueError as e:
        raise damaged(folder / CKPT, e, _START_OVER) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("extra", {}), dict):
        raise damaged(folder / CKPT, "its metadata is not a table", _START_OVER)
    return meta


def check_checkpoint(folder: Path, scn: Scenario) -> dict[str, Any]:
    """Refuse, in one line, a checkpoint that does not belong to ``scn`` (the folder's
    scenario.toml as it is now: :func:`asyncsim.drivers.folder_scenario.check_resume`); returns the
    scenario as the folder records it, which the resumed run's checkpoints keep."""
    extra = checkpoint_meta(folder).get("extra", {})
    revision = timing_revision(scn.protocol)
    if extra.get("timing_revision") != revision:
        # fixed-delay's schedule is what changed meaning; another protocol's checkpoint
        # marked so was made for another scenario.
        schedule = protocol_options(scn.protocol).get("schedule")
        why = ("" if schedule is None else f" of schedule {schedule!r} (before asyncsim 0.3 "
               "it was the racing model, now \"race\")")
        raise ScenarioError("protocol.schedule" if schedule is not None else "protocol.kind",
                            f"{folder / CKPT} was made under another timing model{why}; "
                            f"{_START_OVER}", file=str(folder))
    if "trace_hash" in extra:  # a real run's checkpoint holds the trace so far
        try:
            trace = checkpoint_trace(extra["trace"])
        except (KeyError, TypeError, ValueError) as e:
            raise damaged(folder / CKPT, f"its trace: {e}", _START_OVER) from None
        check_hash(trace, {CKPT: extra["trace_hash"]}, folder / CKPT, advice=_START_OVER)
    return check_resume(folder, extra.get("scenario"), scn)


def checkpoint_trace(trace: dict[str, Any]) -> Trace:
    """The trace a real run's checkpoint holds (``{"grads": columns, "updates": columns}``
    of plain lists), as a :class:`~asyncsim.trace.Trace`: what its ``trace_hash`` is of."""
    return Trace.from_columns(trace["grads"], trace["updates"])


def resume_from(folder: Path, scn: Scenario, num: Numerics, *, check: bool = True):
    """The checkpoint ``folder`` resumes from (:func:`load_checkpoint`'s tuple), once it is
    known to belong to ``scn`` (:func:`check_checkpoint`; ``check=False``: the caller has
    checked it). A damaged checkpoint is a one-line :class:`~asyncsim._io.DamagedFile`."""
    if check:
        check_checkpoint(folder, scn)
    template = num.init_state()
    try:
        return load_checkpoint(folder, template, template.params)
    except DamagedFile:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as e:  # arrays that do not fit
        raise damaged(folder / CKPT, e, _START_OVER) from None


def save_params(folder: Path, params) -> None:
    """``params.npz``: the final parameters, leaves named by their pytree path."""
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    arrays = {jax.tree_util.keystr(p): np.asarray(x) for p, x in flat}
    with atomic(folder / PARAMS) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def load_params(folder: str | Path, template):
    """The final parameters of a run folder, in the structure of ``template``."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(template)
    z = read_params(folder)
    leaves = [jax.numpy.asarray(z[jax.tree_util.keystr(p)]) for p, _ in flat]
    return jax.tree_util.tree_unflatten(treedef, leaves)
