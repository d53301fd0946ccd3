"""A run folder someone sent you may carry symbolic links (a tarball keeps them): no verb
follows one out of the folder. Every verb that writes into a run folder, under a link
planted where it writes, either refuses in one line naming the link or (``--force``, which
starts over) removes the link itself; in every case nothing outside the folder changes.

The matrix: planted links (the lock, ``inputs/``, ``replay/``, a file the run writes, a
temporary file, the timeline's and the calibrated scenario's files, a figure folder) x the
verbs run --resume, run --force, trace --force, replay, figures, timeline, calibrate,
compare and real --resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import TINY, DieAt, Killed, merged

from asyncsim._io import dump_toml
from asyncsim.cli import main


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A scenario file, a complete run (where `asyncsim figures quickstart --profile smoke`
    finds it), an unfinished one with a checkpoint, and a timing-only trace."""
    from asyncsim.api import run
    from asyncsim.scenario import load_scenario

    root = tmp_path_factory.mktemp("made")
    scn = root / "s.toml"
    scn.write_text(dump_toml(merged(TINY, run={"updates": 30, "eval_every": 10,
                                               "checkpoint_every": 10})))
    complete = root / "runs" / "quickstart-smoke" / "seed7"
    assert main(["run", str(scn), "--out", str(complete), "--quiet", "--no-figure"]) == 0
    with pytest.raises(Killed):
        run(load_scenario(scn), out=root / "unfinished", monitor=DieAt(25))
    assert main(["trace", str(scn), "--out", str(root / "trace"), "--quiet"]) == 0
    return {"scenario": scn, "complete": complete, "unfinished": root / "unfinished",
            "trace": root / "trace"}


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                         if p.is_file() else "folder")
            for p in sorted(folder.rglob("*"))}


def _outside(tmp_path: Path) -> Path:
    """Someone's files, which a link in the run folder points at."""
    home = tmp_path / "someone"
    (home / "docs").mkdir(parents=True)
    (home / "notes.txt").write_text("mine\n")
    (home / "docs" / "a.txt").write_text("keep\n")
    (home / "empty").mkdir()
    return home


# Where each link points: a file, a folder with files, an empty folder.
TARGETS = {"file": lambda home: home / "notes.txt", "folder": lambda home: home / "docs",
           "empty": lambda home: home / "empty"}


def _plant(folder: Path, rel: str, target: Path) -> Path:
    link = folder / rel
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    elif link.exists() or link.is_symlink():
        link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


def _as_real(folder: Path) -> None:
    """Mark an unfinished online run as an unfinished real run (what `asyncsim real`
    resumes): its provenance names the driver."""
    path = folder / "provenance.json"
    prov = json.loads(path.read_text())
    path.write_text(json.dumps({**prov, "driver": "real"}))


# The commands that write into the folder f anew or in place (s: the scenario file).
def _resume(f, s, t):
    return ["run", "--resume", f, "--quiet", "--no-figure"]


def _run_force(f, s, t):
    return ["run", s, "--out", f, "--force", "--quiet", "--no-figure"]


def _trace_force(f, s, t):
    return ["trace", s, "--out", f, "--force", "--quiet"]


# (source folder, link inside it, what it points at, argv (folder, scenario, tmp), outcome):
# "refused" -- exit 2, one line naming the link; "removed" -- exit 0, the link gone.
CASES = {
    "resume/lock": ("unfinished", ".lock", "file", _resume, "refused"),
    "resume/checkpoint": ("unfinished", "checkpoint.npz", "file", _resume, "refused"),
    "resume/inputs": ("unfinished", "inputs", "folder", _resume, "refused"),
    "run-force/lock": ("complete", ".lock", "file", _run_force, "refused"),
    "run-force/inputs": ("complete", "inputs", "folder", _run_force, "removed"),
    "run-force/summary": ("complete", "summary.json", "file", _run_force, "removed"),
    "run-force/tmp": ("complete", ".summary.json.tmp", "file", _run_force, "removed"),
    "trace-force/lock": ("trace", ".lock", "file", _trace_force, "refused"),
    "trace-force/grads": ("trace", "trace_grads.parquet", "file", _trace_force, "removed"),
    "replay/folder": ("complete", "replay", "empty",
                      lambda f, s, t: ["replay", f, "--quiet"], "refused"),
    "replay/lock": ("complete", "replay/.lock", "file",
                    lambda f, s, t: ["replay", f, "--quiet"], "refused"),
    "replay/file": ("complete", "replay/summary.json", "file",
                    lambda f, s, t: ["replay", f, "--quiet", "--force"], "removed"),
    "figures/png": ("complete", "quickstart.png", "file",
                    lambda f, s, t: ["figures", "quickstart", "--runs", f.parent.parent,
                                     "--profile", "smoke"], "refused"),
    "figures/out": ("complete", "figs", "empty",
                    lambda f, s, t: ["figures", "quickstart", "--runs", f.parent.parent,
                                     "--profile", "smoke", "--out", f / "figs"], "refused"),
    "timeline/png": ("trace", "timeline.png", "file",
                     lambda f, s, t: ["timeline", f, "--quiet"], "refused"),
    "timeline/csv": ("trace", "timeline.csv", "file",
                     lambda f, s, t: ["timeline", f, "--quiet"], "refused"),
    "calibrate/toml": ("trace", "calibrated.toml", "file",
                       lambda f, s, t: ["calibrate", f], "refused"),
    "calibrate/folder": ("trace", "sub", "empty",
                         lambda f, s, t: ["calibrate", f, "--out", f / "sub" / "c.toml"],
                         "refused"),
    "compare/figure": ("trace", "sub", "empty",
                       lambda f, s, t: ["compare", f, f, "--figure", f / "sub" / "c.png"],
                       "refused"),
    "real-resume/lock": ("unfinished", ".lock", "file",
                         lambda f, s, t: ["real", "--resume", f, "--quiet"], "refused"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_no_verb_follows_a_link_out_of_a_run_folder(made, tmp_path, capsys, case):
    source, rel, target, argv, outcome = CASES[case]
    home = _outside(tmp_path)
    folder = tmp_path / "runs" / "quickstart-smoke" / "seed7"
    shutil.copytree(made[source], folder)
    if case.startswith("real-"):
        _as_real(folder)
    link = _plant(folder, rel, TARGETS[target](home))
    before = _digest(home)
    capsys.readouterr()
    rc = main([str(a) for a in argv(folder, made["scenario"], tmp_path)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert _digest(home) == before, f"{case}: files outside the run folder changed"
    if outcome == "refused":
        assert rc == 2, err
        assert err.startswith("asyncsim: error: ") and err.count("\n") == 1, err
        assert f"{link}: a symbolic link inside the run folder" in err, err
        assert link.is_symlink()  # left for the user to look at
    else:
        assert rc == 0, err
        assert not link.is_symlink(), f"{case}: the link is still there"


def test_a_users_own_links_above_the_run_folder_are_followed(made, tmp_path):
    """Only what lies inside a run folder is held to the rule: `runs` may be a link to
    another disk, and `--out` may name a link to a folder."""
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "runs").symlink_to(disk)
    out = tmp_path / "runs" / "t"
    assert main(["trace", str(made["scenario"]), "--out", str(out), "--quiet"]) == 0
    assert (disk / "t" / "summary.json").is_file()
    assert main(["replay", str(out), "--quiet"]) == 0  # writes runs/t/replay
    assert (disk / "t" / "replay" / "summary.json").is_file()
    assert main(["timeline", str(out), "--quiet"]) == 0
    assert (disk / "t" / "timeline.png").is_file()


def test_force_removes_a_link_never_its_target(made, tmp_path):
    """The remover under --force: a link to someone's folder goes, their files stay."""
    from asyncsim._io import remove

    home = _outside(tmp_path)
    folder = tmp_path / "run"
    shutil.copytree(made["trace"], folder)
    (folder / "inputs").mkdir()
    (folder / "inputs" / "deep").symlink_to(home / "docs")
    (folder / "inputs" / "x.csv").symlink_to(home / "notes.txt")
    before = _digest(home)
    remove(folder / "inputs")
    assert not (folder / "inputs").exists() and _digest(home) == before


def test_a_run_writing_into_a_fresh_folder_is_guarded_before_it_has_a_mark(tmp_path):
    """A folder this process holds the lock of is a run folder to `no_link` from the first
    write, before any file marks it as one."""
    from asyncsim._io import LinkInFolder, no_link, run_root
    from asyncsim.runs import locked

    home = _outside(tmp_path)
    folder = tmp_path / "fresh"
    with locked(folder):
        (folder / "inputs").symlink_to(home / "docs")
        assert run_root(folder / "inputs" / "x.csv") == folder
        with pytest.raises(LinkInFolder, match="inputs: a symbolic link inside the run folder"):
            no_link(folder / "inputs" / "x.csv")
    assert run_root(folder / "inputs" / "x.csv") is None  # released, and it has no mark
    os.unlink(folder / "inputs")


def test_a_dotdot_after_a_link_in_a_run_folder_is_refused(made, tmp_path, capsys):
    """``RUN/link/../x`` reads as ``RUN/x`` but the system goes through the link (to the
    parent of its target): the path as given is checked, prefix by prefix."""
    from asyncsim._io import LinkInFolder, no_link

    home = _outside(tmp_path)
    folder = tmp_path / "run"
    shutil.copytree(made["trace"], folder)
    (folder / "inputs").symlink_to(home / "docs")
    through = folder / "inputs" / ".." / "x.csv"  # home/x.csv, not folder/x.csv
    with pytest.raises(LinkInFolder, match="inputs: a symbolic link inside the run folder"):
        no_link(through)
    before = _digest(home)
    assert main(["replay", str(folder), "--out", str(folder / "inputs" / ".." / "r"),
                 "--quiet"]) == 2
    assert "inputs: a symbolic link inside the run folder" in capsys.readouterr().err
    assert _digest(home) == before and not (home / "r").exists()
    # Without a link the same spelling is an ordinary path.
    os.unlink(folder / "inputs")
    (folder / "inputs").mkdir()
    assert no_link(through) == through
