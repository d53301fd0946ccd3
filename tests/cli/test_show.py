"""`asyncsim show PATH`: a run folder's state (complete, unfinished, diverged at N), its
summary and the command that goes on from it; a sweep's points, one line each; anything
else, or a damaged folder, one line (exit 2)."""

from __future__ import annotations

import json

import pytest
from conftest import TINY, DieAt, Killed, merged

from asyncsim._io import dump_toml
from asyncsim.cli import main


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from asyncsim.api import run
    from asyncsim.scenario import load_scenario

    root = tmp_path_factory.mktemp("show")
    scn = merged(TINY, run={"updates": 12, "checkpoint_every": 4})
    (root / "s.toml").write_text(dump_toml(scn))
    assert main(["run", str(root / "s.toml"), "--out", str(root / "complete"), "--quiet",
                 "--no-figure"]) == 0
    with pytest.raises(Killed):
        run(load_scenario(scn), out=root / "unfinished", monitor=DieAt(9))
    (root / "hot.toml").write_text(dump_toml(merged(scn, optimizer={"lr": 1e9})))
    assert main(["run", str(root / "hot.toml"), "--out", str(root / "diverged"), "--quiet",
                 "--no-figure"]) == 0
    (root / "w.toml").write_text(dump_toml(merged(scn, sweep={"optimizer.lr": [0.01, 0.02]})))
    assert main(["run", str(root / "w.toml"), "--out", str(root / "sweep"), "--quiet"]) == 0
    zipped = merged(scn, sweep={"setup": [{"protocol.kind": "hardsync"},
                                          {"protocol.kind": "softsync", "protocol.n": 3}]})
    (root / "z.toml").write_text(dump_toml(zipped))
    assert main(["run", str(root / "z.toml"), "--out", str(root / "zipped"), "--quiet"]) == 0
    return root


def _show(capsys, path) -> tuple[int, list[str], str]:
    capsys.readouterr()
    rc = main(["show", str(path)])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


def test_a_complete_run(made, capsys):
    rc, lines, _ = _show(capsys, made / "complete")
    assert rc == 0 and lines[0] == f"{made / 'complete'}: a run (simulated, online), complete"
    summary = json.loads((made / "complete" / "summary.json").read_text())
    assert f"  param_hash        {summary['param_hash']}" in lines
    assert lines[-2] == (f"run it again: asyncsim run {made / 'complete' / 'scenario.toml'} "
                         "--out NEW_DIR")


def test_an_unfinished_run_says_where_its_checkpoint_is_and_how_to_resume(made, capsys):
    rc, lines, _ = _show(capsys, made / "unfinished")
    assert rc == 0
    assert lines == [f"{made / 'unfinished'}: a run (simulated, online), unfinished "
                     "(checkpoint at update 8)",
                     f"  continue it with asyncsim run --resume {made / 'unfinished'}"]


def test_a_diverged_run_says_where(made, capsys):
    at = json.loads((made / "diverged" / "summary.json").read_text())["diverged_at"]
    rc, lines, _ = _show(capsys, made / "diverged")
    assert rc == 0 and lines[0].endswith(f"diverged at update {at}") and at is not None


def test_a_sweep_is_one_line_per_point(made, capsys):
    rc, lines, _ = _show(capsys, made / "sweep")
    assert rc == 0
    assert lines == [f"{made / 'sweep'}: a sweep of 2 points (2 complete); keys optimizer.lr",
                     "  p000  optimizer.lr=0.01  complete", "  p001  optimizer.lr=0.02  complete"]
    # A point the sweep has not made yet (a sweep still running, or killed).
    import shutil

    shutil.copytree(made / "sweep", made / "half")
    shutil.rmtree(made / "half" / "p001")
    assert _show(capsys, made / "half")[1][1:] == ["  p000  optimizer.lr=0.01  complete",
                                                  "  p001  optimizer.lr=0.02  not started"]
    # Zipped keys: a key a point leaves out is not shown, an integer is shown as one.
    rc, lines, _ = _show(capsys, made / "zipped")
    assert lines[1:] == ["  p000  protocol.kind=hardsync  complete",
                         "  p001  protocol.kind=softsync protocol.n=3  complete"]


def test_anything_else_or_a_damaged_folder_is_one_line(made, tmp_path, capsys):
    import shutil

    shutil.copytree(made / "complete", tmp_path / "damaged")
    (tmp_path / "damaged" / "summary.json").write_text('{"updates": "many"}')
    for path, fragment in ((tmp_path / "nothing", "no such folder"),
                           (tmp_path, "not a run folder"),
                           (tmp_path / "damaged", "summary.json: damaged (updates: must be")):
        rc, lines, err = _show(capsys, path)
        assert rc == 2 and lines == [] and err.count("\n") == 1 and fragment in err, err
