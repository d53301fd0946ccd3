"""Every file of a run folder is read through one reader (asyncsim._io.read): a damaged
file is one line naming it, never a parser's traceback, and nothing is written first.

The matrix: each file of a complete and of an unfinished folder, emptied, truncated to half
or garbled at its start, under `asyncsim replay`, `run --resume` and `asyncsim figures`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import TINY as TINY_SCENARIO
from conftest import DieAt, Killed

from asyncsim._io import DamagedFile, dump_toml, read_csv
from asyncsim.cli import main

COMPLETE = ("scenario.toml", "trace_grads.parquet", "trace_updates.parquet",
            "trace_meta.json", "updates.parquet", "eval.csv", "summary.json",
            "provenance.json", "params.npz")
UNFINISHED = ("scenario.toml", "provenance.json", "checkpoint.npz")
# What each command reads, so a damaged one must stop it (exit 2); any other file's damage
# may pass unnoticed (exit 0), but never as a traceback.
READS = {
    "replay": {"scenario.toml", "trace_grads.parquet", "trace_updates.parquet",
               "trace_meta.json", "summary.json", "params.npz"},
    "resume": {"scenario.toml", "checkpoint.npz"},
    "figures": {"scenario.toml", "trace_grads.parquet", "trace_updates.parquet",
                "trace_meta.json", "eval.csv", "summary.json", "provenance.json",
                "params.npz"},
}
DAMAGE = {
    "empty": lambda b: b"",
    "truncated": lambda b: b[: len(b) // 2],
    # Not UTF-8, no parquet/zip magic: what a disk error or a binary overwrite leaves.
    "garbled": lambda b: bytes([0xFF, 0xFE, 0x00, 0x9C] * 16) + b[64:],
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A complete run where `asyncsim figures quickstart --profile smoke` finds it, and an
    unfinished one with a checkpoint (killed at update 25, checkpoint at 20)."""
    from asyncsim.api import run
    from asyncsim.scenario import load_scenario

    root = tmp_path_factory.mktemp("pristine")
    scn = dict(TINY_SCENARIO, figure={"name": "quickstart"},
               run={"updates": 30, "eval_every": 10, "checkpoint_every": 10})
    path = root / "s.toml"
    path.write_text(dump_toml(scn))
    complete = root / "runs" / "quickstart-smoke" / "seed7"
    assert main(["run", str(path), "--out", str(complete), "--quiet", "--no-figure"]) == 0
    unfinished = root / "unfinished"
    with pytest.raises(Killed):
        run(load_scenario(path), out=unfinished, monitor=DieAt(25))
    return complete, unfinished


def _cases():
    for name in COMPLETE:
        for how in DAMAGE:
            for verb in ("replay", "figures"):
                yield "complete", name, how, verb
    for name in UNFINISHED:
        for how in DAMAGE:
            yield "unfinished", name, how, "resume"


@pytest.mark.parametrize("which,name,how,verb", list(_cases()),
                         ids=lambda x: str(x))
def test_a_damaged_file_is_one_line_and_leaves_nothing(pristine, tmp_path, capsys, which,
                                                       name, how, verb):
    complete, unfinished = pristine
    src = complete if which == "complete" else unfinished
    runs_dir = tmp_path / "runs"
    folder = runs_dir / src.parent.name / src.name
    shutil.copytree(src, folder)
    target = folder / name
    target.write_bytes(DAMAGE[how](target.read_bytes()))
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    out = tmp_path / "out"
    args = {"replay": ["replay", str(folder), "--out", str(out), "--quiet"],
            "resume": ["run", "--resume", str(folder), "--quiet", "--no-figure"],
            "figures": ["figures", "quickstart", "--runs", str(runs_dir), "--profile",
                        "smoke", "--out", str(out)]}[verb]
    capsys.readouterr()
    rc = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if name in READS[verb]:
        assert rc == 2, f"{verb} accepted a {how} {name}"
    if rc == 2:
        assert err.startswith("asyncsim: error: ") and err.count("\n") == 1, err
        assert name in err or str(folder) in err, err
        # Nothing was written: no replay or figure folder, the run folder as it was.
        assert not out.exists()
        assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
    else:
        assert rc == 0, err


def test_a_half_eval_csv_is_refused_not_plotted(tmp_path):
    """A table cut mid-row parses in pandas (NaN-filled); the reader refuses it."""
    path = tmp_path / "eval.csv"
    path.write_text("version,gradients,test_error\n0,0,0.9\n10,10,0.8\n20,2")
    with pytest.raises(DamagedFile, match=r"eval.csv: damaged \(truncated"):
        read_csv(path)
    path.write_text("version,gradients,test_error\n0,0,0.9\n10,10,0.8\n")
    assert read_csv(path)["test_error"].tolist() == [0.9, 0.8]
    Path(tmp_path / "empty.csv").write_text("")
    with pytest.raises(DamagedFile, match="empty.csv: empty"):
        read_csv(tmp_path / "empty.csv")


def _npz_edit(path: Path, edit) -> None:
    """Rewrite an npz archive with ``edit(arrays)`` applied: a well-formed file with
    other contents."""
    import numpy as np

    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _meta_edit(**changes):
    """An edit of a checkpoint's metadata (a JSON document stored as bytes)."""
    import json

    import numpy as np

    def edit(arrays):
        meta = json.loads(bytes(arrays["meta"]).decode())
        for k, v in changes.items():
            meta[k] = v(meta[k]) if callable(v) else v
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)

    return edit


def _json_edit(name: str, **changes):
    def edit(folder: Path):
        import json

        d = json.loads((folder / name).read_text())
        for k, v in changes.items():
            if v is _DROP:
                d.pop(k, None)
            else:
                d[k] = v
        (folder / name).write_text(json.dumps(d))
    return edit


_DROP = object()


def _untraced_learner(folder: Path):
    """A learner id changed in the trace, and the hashes it is checked against deleted."""
    import pandas as pd

    grads = pd.read_parquet(folder / "trace_grads.parquet")
    grads.loc[0, "learner"] = 1 - grads.loc[0, "learner"]
    grads.to_parquet(folder / "trace_grads.parquet")
    for name in ("trace_meta.json", "summary.json"):
        _json_edit(name, trace_hash=_DROP)(folder)


# Well-formed files whose contents were edited: (folder, the edit, the command, what the
# one line names; None: read and reported, no traceback).
EDITED = {
    "params with NaN weights": ("complete", lambda f: _npz_edit(
        f / "params.npz", lambda a: [a.__setitem__(k, a[k] * float("nan")) for k in a]),
        "open_run", "params.npz: does not match the param_hash"),
    "params edited, replayed": ("complete", lambda f: _npz_edit(
        f / "params.npz", lambda a: [a.__setitem__(k, a[k] + 1.0) for k in a]),
        "replay", "params.npz: does not match the param_hash"),
    "trace edited, its hashes deleted": ("complete", _untraced_learner, "replay",
                                         "trace_meta.json: damaged (no trace_hash"),
    "summary param_hash a number": ("complete", _json_edit("summary.json", param_hash=5),
                                    "replay", "summary.json: damaged (param_hash"),
    "provenance plugins a number": ("complete", lambda f: (
        _json_edit("provenance.json", plugins=5)(f),
        _json_edit("summary.json", param_hash="0" * 64)(f)), "compare", None),
    "scenario learners edited": ("complete", lambda f: (f / "scenario.toml").write_text(
        (f / "scenario.toml").read_text().replace("learners = 3", "learners = 4")), "replay",
        "but the run's scenario has cluster.learners = 4"),
    "checkpoint from the future": ("unfinished", lambda f: _npz_edit(
        f / "checkpoint.npz", _meta_edit(version=99999)), "resume",
        "checkpoint.npz: damaged (its metadata does not fit its update count"),
    "checkpoint losses cut": ("unfinished", lambda f: _npz_edit(
        f / "checkpoint.npz", lambda a: a.__setitem__("losses", a["losses"][:-3])), "resume",
        "checkpoint.npz: damaged (its metadata does not fit its update count"),
    "checkpoint state of another shape": ("unfinished", lambda f: _npz_edit(
        f / "checkpoint.npz", lambda a: a.__setitem__("state_0", a["state_0"][..., :1])),
        "resume", "checkpoint.npz: damaged (state_0 is"),
}


@pytest.mark.parametrize("case", list(EDITED))
def test_an_edited_file_is_one_line_and_leaves_nothing(pristine, tmp_path, capsys, case):
    """A run folder from anyone: a file edited into another well-formed one (weights, a
    trace with its hashes deleted, a summary's field, a scenario that contradicts its
    trace, a checkpoint's metadata or arrays) is refused in one line naming it, with
    nothing written, or (what is only reported, a provenance record) read without a
    traceback."""
    from asyncsim import open_run

    which, edit, verb, says = EDITED[case]
    complete, unfinished = pristine
    folder = tmp_path / "run"
    shutil.copytree(complete if which == "complete" else unfinished, folder)
    edit(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    out = tmp_path / "out"
    if verb == "open_run":
        with pytest.raises(DamagedFile, match="does not match the param_hash"):
            _ = open_run(folder).params
        return
    args = {"replay": ["replay", str(folder), "--out", str(out), "--quiet"],
            "resume": ["run", "--resume", str(folder), "--quiet", "--no-figure"],
            "compare": ["compare", str(folder), str(complete)]}[verb]
    capsys.readouterr()
    rc = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if says is None:  # compared and reported: the parameters differ
        assert rc in (0, 1) and not err, err
        return
    assert rc == 2 and err.startswith("asyncsim: error: ") and err.count("\n") == 1, err
    assert says in err, err
    assert not out.exists()
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
