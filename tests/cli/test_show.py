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
    assert rc == 0 and lines[0] == f"{made / 'complete'}: a simulated run, complete"
    summary = json.loads((made / "complete" / "summary.json").read_text())
    assert ["param_hash", summary["param_hash"]] in [line.split() for line in lines]
    assert lines[-2] == (f"run it again: asyncsim run {made / 'complete' / 'scenario.toml'} "
                         "--out NEW_DIR")


def test_an_unfinished_run_says_where_its_checkpoint_is_and_how_to_resume(made, capsys):
    rc, lines, _ = _show(capsys, made / "unfinished")
    assert rc == 0
    assert lines == [f"{made / 'unfinished'}: a simulated run, unfinished "
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
    assert _show(capsys, made / "half")[1] == [
        f"{made / 'half'}: a sweep of 2 points (1 complete, 1 to run); keys optimizer.lr",
        "  p000  optimizer.lr=0.01  complete", "  p001  optimizer.lr=0.02  not started",
        f"go on: asyncsim run SCENARIO --out {made / 'half'} (its scenario file; the complete "
        "points are kept)"]
    # --resume continues a run, not a sweep: it says how a sweep goes on instead.
    assert main(["run", "--resume", str(made / "half")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"asyncsim: error: {made / 'half'}: a sweep folder; a sweep goes on when its scenario "
        f"runs again into it (asyncsim run SCENARIO --out {made / 'half'}), which keeps its "
        "complete points")
    # A damaged point is listed as damaged, the others still shown.
    shutil.copytree(made / "sweep", made / "hurt")
    (made / "hurt" / "p001" / "summary.json").write_text('{"updates": "many"}')
    lines = _show(capsys, made / "hurt")[1]
    # (not "to run": running the sweep again keeps a point whose summary exists)
    assert lines[0] == f"{made / 'hurt'}: a sweep of 2 points (1 complete); keys optimizer.lr"
    assert lines[1] == "  p000  optimizer.lr=0.01  complete"
    assert lines[2].startswith("  p001  optimizer.lr=0.02  summary.json: damaged (updates: "
                               "must be")
    # Zipped keys: a key a point leaves out is not shown, an integer is shown as one.
    rc, lines, _ = _show(capsys, made / "zipped")
    assert lines[1:] == ["  p000  protocol.kind=hardsync  complete",
                         "  p001  protocol.kind=softsync protocol.n=3  complete"]


def test_anything_else_or_a_damaged_folder_is_one_line(made, tmp_path, capsys):
    import shutil

    shutil.copytree(made / "complete", tmp_path / "damaged")
    (tmp_path / "damaged" / "summary.json").write_text('{"updates": "many"}')
    shutil.copytree(made / "complete", tmp_path / "stranger")
    prov = json.loads((tmp_path / "stranger" / "provenance.json").read_text())
    (tmp_path / "stranger" / "provenance.json").write_text(json.dumps({**prov,
                                                                       "driver": "quantum"}))
    (tmp_path / "killed").mkdir()
    (tmp_path / "killed" / ".lock").touch()  # a run killed as it started
    for path, fragment in ((tmp_path / "nothing", "no such folder"),
                           (tmp_path, "not a run folder"),
                           (tmp_path / "killed", "a run stopped before it wrote its scenario "
                                                 "(it holds only .lock): run its command "
                                                 "again with --force"),
                           (tmp_path / "damaged", "summary.json: damaged (updates: must be"),
                           (tmp_path / "stranger", "provenance.json: damaged (driver: unknown "
                                                   "driver 'quantum'; allowed: online,")):
        rc, lines, err = _show(capsys, path)
        assert rc == 2 and lines == [] and err.count("\n") == 1 and fragment in err, err


def test_a_replay_and_an_empty_summary(made, tmp_path, capsys):
    """A replay's "run it again" replays its source into a new folder (never over itself);
    a summary with no scalar fields is shown as nothing, not an error."""
    assert main(["replay", str(made / "complete"), "--out", str(tmp_path / "r"),
                 "--quiet"]) == 0
    rc, lines, _ = _show(capsys, tmp_path / "r")
    assert rc == 0 and lines[0] == f"{tmp_path / 'r'}: a replay, complete"
    # Made from Python (here, in-process), it recorded its source and path, not a command.
    assert f"run it again: asyncsim replay {made / 'complete'} --path loop --out NEW_DIR" in lines
    # Made by the asyncsim command: that command, into a new folder.
    prov = json.loads((tmp_path / "r" / "provenance.json").read_text())
    (tmp_path / "r" / "provenance.json").write_text(json.dumps({**prov, "command": [
        "/bin/asyncsim", "replay", str(made / "complete"), "--path", "scan", "--set",
        "optimizer.lr=0.01", "--out", "old", "--force", "--quiet"]}))
    assert _show(capsys, tmp_path / "r")[1][-2] == (
        f"run it again: asyncsim replay {made / 'complete'} --path scan --set "
        "optimizer.lr=0.01 --quiet --out NEW_DIR")
    (tmp_path / "r" / "summary.json").write_text("{}")
    rc, lines, err = _show(capsys, tmp_path / "r")
    assert rc == 0 and err == "" and lines[1].startswith("run it again: ")
