"""Run folders someone sends you, and files a scenario names, that are not what they should
be: one line (exit 2) naming the file and the field or column and what is allowed, never a
traceback, a hang or a machine's memory eaten, and nothing left behind.

A FIFO or /dev/zero in place of a file: refused by ``asyncsim._io.regular_file`` before it
is opened (these run the CLI in a process of its own, limited in time and memory, so a
regression fails instead of hanging). trace_meta.json's fields and the trace tables'
columns: checked by ``Trace.load`` (dtypes, finite times, learner ids, ``learners``).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import TINY, merged

from asyncsim._io import MAX_BYTES, dump_toml
from asyncsim.cli import main

# Each verb that reads a run folder, writing only under ``out`` (which must not exist after
# a refusal).
VERBS = {
    "timeline": lambda r, out: ["timeline", str(r), "--figure", str(out / "t.png"), "--quiet"],
    "replay": lambda r, out: ["replay", str(r), "--out", str(out / "rep"), "--quiet"],
    "calibrate": lambda r, out: ["calibrate", str(r), "--out", str(out / "c" / "c.toml")],
    "compare": lambda r, out: ["compare", str(r), str(r), "--figure", str(out / "cmp.png")],
}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A tiny run folder, as `asyncsim trace s.toml --out r` makes it."""
    root = tmp_path_factory.mktemp("source")
    path = root / "s.toml"
    path.write_text(dump_toml(TINY))
    assert main(["trace", str(path), "--out", str(root / "r"), "--quiet"]) == 0
    return root / "r"


def _copy(source: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "r"
    shutil.copytree(source, folder)
    return folder


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _refused(capsys, folder: Path, verb: str, tmp_path: Path, *names: str) -> str:
    """Run ``verb`` on ``folder``: exit 2, one line naming each of ``names``, nothing
    written (no output, the folder as it was); returns the line."""
    before = _files(folder)
    out = tmp_path / "out"
    capsys.readouterr()
    rc = main(VERBS[verb](folder, out))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("asyncsim: error: ") and err.count("\n") == 1, err
    for name in names:
        assert name in err, err
    assert not out.exists() and _files(folder) == before
    return err


def _limit() -> None:  # in the child: reading /dev/zero ends in a MemoryError, not the OOM
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))


def _cli(args: list[str], tmp_path: Path, *, fifo: Path | None = None) -> tuple[int, str]:
    """The CLI in a process of its own (3 GiB of address space, 60 s): its exit status and
    stderr. With ``fifo``: fails as soon as the CLI opens that FIFO, which a reader does
    only to block on it."""
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err, open(os.devnull, "w") as null:
        proc = subprocess.Popen([sys.executable, "-m", "asyncsim.cli", *args], stdout=null,
                                stderr=err, preexec_fn=_limit)
    deadline = time.monotonic() + 60
    try:
        while proc.poll() is None:
            if fifo is not None:
                try:  # succeeds only once a reader has the FIFO open
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
                else:
                    pytest.fail(f"asyncsim {args[0]} opened the FIFO {fifo} to read it")
            if time.monotonic() > deadline:
                pytest.fail(f"asyncsim {' '.join(args)} still runs after 60 s")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err_path.read_text()


def _one_line(rc: int, err: str, *names: str) -> None:
    assert rc == 2, err
    assert err.startswith("asyncsim: error: ") and err.count("\n") == 1, err
    for name in names:
        assert name in err, err


# ----------------------------------------------------------------- 1: not a regular file
@pytest.mark.parametrize("verb", list(VERBS))
def test_a_trace_table_linked_to_dev_zero_is_refused_unread(source, tmp_path, verb):
    folder = _copy(source, tmp_path)
    (folder / "trace_grads.parquet").unlink()
    (folder / "trace_grads.parquet").symlink_to("/dev/zero")
    rc, err = _cli(VERBS[verb](folder, tmp_path / "out"), tmp_path)
    _one_line(rc, err, "trace_grads.parquet", "not a regular file (a character device)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("verb,name", [("timeline", "trace_grads.parquet"),
                                       ("compare", "trace_meta.json"),
                                       ("replay", "scenario.toml")])
def test_a_fifo_in_a_run_folder_is_refused_unopened(source, tmp_path, verb, name):
    folder = _copy(source, tmp_path)
    (folder / name).unlink()
    os.mkfifo(folder / name)
    rc, err = _cli(VERBS[verb](folder, tmp_path / "out"), tmp_path, fifo=folder / name)
    _one_line(rc, err, name, "not a regular file (a named pipe)")
    assert not (tmp_path / "out").exists()


def test_a_file_over_the_readers_cap_is_refused_unread(source, tmp_path, capsys):
    folder = _copy(source, tmp_path)
    with open(folder / "trace_meta.json", "r+b") as f:  # sparse: no disk space taken
        f.truncate(MAX_BYTES["json"] + 1)
    err = _refused(capsys, folder, "timeline", tmp_path, "trace_meta.json")
    assert "allowed: a json file of at most 64 MiB" in err


@pytest.mark.parametrize("how", ["dev-zero", "folder"])
def test_a_scenario_that_is_not_a_regular_file_is_refused(tmp_path, how):
    # (A pipe is read, once: `asyncsim run /dev/stdin < s.toml`, tests/cli/test_figures.py.)
    path = tmp_path / "s.toml"
    if how == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    rc, err = _cli(["trace", str(path), "--out", str(tmp_path / "out"), "--quiet"], tmp_path)
    _one_line(rc, err, str(path), "not a regular file")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["fifo", "dev-zero"])
def test_an_empirical_delay_file_that_is_not_a_regular_file_is_refused(tmp_path, how):
    csv = tmp_path / "d.csv"
    if how == "fifo":
        os.mkfifo(csv)
    else:
        csv.symlink_to("/dev/zero")
    path = tmp_path / "s.toml"
    path.write_text(dump_toml(merged(TINY, cluster={
        "compute": {"dist": "empirical", "path": "d.csv"}})))
    rc, err = _cli(["trace", str(path), "--out", str(tmp_path / "out"), "--quiet"], tmp_path,
                   fifo=csv if how == "fifo" else None)
    _one_line(rc, err, "cluster.compute.path", "not a regular file")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------- 2: nested too deeply
@pytest.mark.parametrize("verb,name,text", [
    ("replay", "scenario.toml", "seed = " + "[" * 2000 + "]" * 2000 + "\n"),
    ("timeline", "trace_meta.json", '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"),
])
def test_a_file_nested_too_deeply_is_one_line(source, tmp_path, capsys, verb, name, text):
    folder = _copy(source, tmp_path)
    (folder / name).write_text(text)
    _refused(capsys, folder, verb, tmp_path, name, "nested too deeply")


def test_a_scenario_nested_too_deeply_is_one_line(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text("seed = " + "[" * 2000 + "]" * 2000 + "\n")
    assert main(["trace", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "nested too deeply" in err, err


# ----------------------------------------------------------------- 3: trace_meta.json
def _meta(folder: Path, **fields) -> None:
    meta = json.loads((folder / "trace_meta.json").read_text())
    (folder / "trace_meta.json").write_text(json.dumps({**meta, **fields}))


@pytest.mark.parametrize("verb", list(VERBS))
def test_wrong_typed_trace_meta_is_one_line(source, tmp_path, capsys, verb):
    folder = _copy(source, tmp_path)
    meta = json.loads((folder / "trace_meta.json").read_text())
    _meta(folder, **dict.fromkeys(meta, "x"))
    err = _refused(capsys, folder, verb, tmp_path, "trace_meta.json", "learners")
    assert "must be an integer in 1..100000, got 'x'" in err


@pytest.mark.parametrize("verb,fields,says", [
    ("replay", {"sim_time": "x"}, "sim_time: must be a finite number >= 0"),
    ("replay", {"sim_time": "inf"}, "sim_time: must be a finite number >= 0"),
    ("calibrate", {"learners": True}, "learners: must be an integer in 1..100000"),
    ("timeline", {"learners": 2}, "learner id 2; allowed: 0 .. 1, as trace_meta.json has "
     "learners = 2"),
    ("calibrate", {"learners": 5}, "learners = 5, but the run's scenario has "
     "cluster.learners = 3"),
    ("compare", {"stop_reason": 7}, "stop_reason: must be a string"),
])
def test_trace_meta_out_of_range_is_one_line(source, tmp_path, capsys, verb, fields, says):
    folder = _copy(source, tmp_path)
    _meta(folder, **fields)
    err = _refused(capsys, folder, verb, tmp_path)
    assert says in err and ("trace_meta.json" in err or "trace_grads.parquet" in err), err


@pytest.mark.parametrize("learners", [10**8, 10**30])
def test_a_huge_learners_in_trace_meta_is_one_line_not_a_hang(source, tmp_path, learners):
    # calibrate made one compute spec per learner: 10**8 of them (in a process of its own,
    # limited in time and memory, so a regression fails instead of hanging).
    folder = _copy(source, tmp_path)
    _meta(folder, learners=learners)
    rc, err = _cli(VERBS["calibrate"](folder, tmp_path / "out"), tmp_path)
    _one_line(rc, err, "trace_meta.json", "learners: must be an integer in 1..100000")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------- 4, 6: trace tables
def _damage_grads(folder: Path, how: str) -> None:
    path = folder / "trace_grads.parquet"
    g = pd.read_parquet(path)
    if how == "nan-t_apply":
        g["t_apply"] = np.nan
    elif how == "negative-learner":
        g.loc[0, "learner"] = -7
    elif how == "strings":
        g = g.astype(str)
    elif how == "learner-1e6":
        g["learner"] = g["learner"].astype(np.int64)
        g.loc[0, "learner"] = 10**6
    elif how == "infinite-times":  # compute = constant 1e308: the clock overflows
        late = g.index >= len(g) // 2
        for k in ("t_push", "t_arrive", "t_apply"):
            g.loc[late, k] = np.inf
        u = pd.read_parquet(folder / "trace_updates.parquet")
        u.loc[u.index >= len(u) // 2, "time"] = np.inf
        u.to_parquet(folder / "trace_updates.parquet")
    g.to_parquet(path)


DAMAGE = {"nan-t_apply": "column t_apply holds nan at row 0; allowed: finite numbers",
          "negative-learner": "learner id -7; allowed: 0 .. 2",
          "strings": "column learner holds object values; allowed: integers",
          "learner-1e6": "learner id 1000000; allowed: 0 .. 2",
          "infinite-times": "holds inf at row"}


@pytest.mark.parametrize("verb", list(VERBS))
@pytest.mark.parametrize("how", list(DAMAGE))
def test_impossible_trace_values_are_one_line(source, tmp_path, capsys, verb, how):
    folder = _copy(source, tmp_path)
    _damage_grads(folder, how)
    with warnings.catch_warnings():  # calibrate's "invalid value in subtract" included
        warnings.simplefilter("error", RuntimeWarning)
        err = _refused(capsys, folder, verb, tmp_path, "trace_grads.parquet")
    assert DAMAGE[how] in err, err


# ----------------------------------------------------------------- 5: --learners
def test_a_learner_range_beyond_any_integer_type(source, tmp_path, capsys):
    folder = _copy(source, tmp_path)
    png = tmp_path / "t.png"
    assert main(["timeline", str(folder), "--learners", "0:99999999999999999999999",
                 "--figure", str(png), "--quiet"]) == 0
    assert set(pd.read_csv(png.with_suffix(".csv"))["learner"]) == {0, 1, 2}
    capsys.readouterr()
    assert main(["timeline", str(folder), "--learners", f"0:{10**400}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--learners: must be A:B with integers" in err, err
