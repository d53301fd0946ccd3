"""Where asyncsim writes what the user names (asyncsim.runs.output_file, prepare): a file of
a run is never replaced by another verb's output, nothing is written over a folder or a
device, and ``--force`` removes a run, never a folder that is not one. Each refusal is one
line (exit 2) and leaves the files as they were."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from conftest import TINY

from asyncsim._io import dump_toml
from asyncsim.cli import main


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("asyncsim: error: ") and err.count("\n") == 1, err
    return err


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two timing-only run folders of the tiny scenario (seconds)."""
    base = tmp_path_factory.mktemp("runs")
    scn = base / "s.toml"
    scn.write_text(dump_toml({**TINY, "run": {"updates": 40}}))
    folders = base / "a", base / "b"
    for f in folders:
        assert main(["trace", str(scn), "--out", str(f), "--quiet"]) == 0
    return folders


def test_force_removes_a_run_never_a_folder_that_is_not_one(tmp_path, capsys):
    scn = tmp_path / "s.toml"
    scn.write_text(dump_toml(TINY))
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / ".bashrc").write_text("export PATH\n")
    (home / "docs" / "a.txt").write_text("notes\n")
    before = _digest(home)
    for extra in (["--force"], []):
        assert main(["trace", str(scn), "--out", str(home), "--quiet", *extra]) == 2
        err = _one_line(capsys)
        assert "holds files that are not a run's (e.g. .bashrc)" in err, err
        assert err.count("--force") == 1  # said once (it was said twice)
        assert _digest(home) == before and sorted(p.name for p in home.iterdir()) == [
            ".bashrc", "docs"]
    # A run folder is still redone with --force, and a run stopped as it started (only its
    # scenario.toml written) too.
    run = tmp_path / "run"
    assert main(["trace", str(scn), "--out", str(run), "--quiet"]) == 0
    assert main(["trace", str(scn), "--out", str(run), "--quiet", "--force"]) == 0
    (run / "summary.json").unlink()
    for p in run.iterdir():
        if p.name != "scenario.toml":
            p.unlink()
    assert main(["trace", str(scn), "--out", str(run), "--quiet", "--force"]) == 0
    assert (run / "summary.json").is_file()


def _sweep_file(tmp_path: Path, name: str, seeds: list[int]) -> Path:
    """A timing-only sweep of the tiny scenario over ``seeds`` (a point each)."""
    path = tmp_path / f"{name}.toml"
    path.write_text(dump_toml({**TINY, "name": name, "run": {"updates": 20},
                               "sweep": {"seed": seeds}}))
    return path


def test_a_sweep_and_a_run_never_write_into_each_others_folder(tmp_path, capsys):
    # A sweep aimed at a run's folder used to write its points and index beside the run's
    # files, and a run aimed at a sweep's folder took it for an unfinished run, whose
    # --force removed every point of the sweep.
    run_scn = tmp_path / "s.toml"
    run_scn.write_text(dump_toml(TINY))
    sweep_scn = _sweep_file(tmp_path, "sw", [1, 2])
    run, sweep = tmp_path / "run", tmp_path / "sweep"
    assert main(["trace", str(run_scn), "--out", str(run), "--quiet"]) == 0
    assert main(["trace", str(sweep_scn), "--out", str(sweep), "--quiet"]) == 0
    before = _digest(run), _digest(sweep)
    for extra in ([], ["--force"]):
        assert main(["trace", str(sweep_scn), "--out", str(run), "--quiet", *extra]) == 2
        assert f"{run}: holds a timing-only trace, not a sweep" in _one_line(capsys)
        assert main(["trace", str(run_scn), "--out", str(sweep), "--quiet", *extra]) == 2
        assert f"{sweep}: a sweep folder; a run writes a folder of its own" in _one_line(capsys)
    assert (_digest(run), _digest(sweep)) == before


def test_a_sweep_goes_on_only_in_a_sweep_folder_of_its_own_scenario(tmp_path, capsys):
    a, b = _sweep_file(tmp_path, "a", [1, 2, 3]), _sweep_file(tmp_path, "b", [4, 5])
    out = tmp_path / "out"
    assert main(["trace", str(a), "--out", str(out), "--quiet"]) == 0
    before = _digest(out)
    assert main(["trace", str(a), "--out", str(out), "--quiet"]) == 0  # goes on: all kept
    assert _digest(out) == before
    # Stopped before its first index (only point folders): still its sweep, and it goes on.
    (out / "index.csv").unlink()
    assert main(["trace", str(a), "--out", str(out), "--quiet"]) == 0
    assert _digest(out) == before
    # Another scenario's sweep is refused, and replaces it only with --force, whole: no
    # point of the first is left beside the second's.
    assert main(["trace", str(b), "--out", str(out), "--quiet"]) == 2
    assert (f"{out}: holds runs of scenario 'a', not 'b'; choose another --out or pass "
            "--force to replace the sweep") in _one_line(capsys)
    assert _digest(out) == before
    assert main(["trace", str(b), "--out", str(out), "--quiet", "--force"]) == 0
    points = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert points == ["p000", "p001"]
    assert all('name = "b"' in (out / p / "scenario.toml").read_text() for p in points)
    # Every point and shared trace says whose sweep it is, not the first point alone: one
    # replaced by another scenario's run, or the shared trace of a sweep killed before its
    # first point, makes the folder another's.
    single = tmp_path / "c.toml"
    single.write_text(dump_toml({**TINY, "name": "c", "run": {"updates": 20}}))
    assert main(["trace", str(single), "--out", str(tmp_path / "c"), "--quiet"]) == 0
    shutil.rmtree(out / "p001")
    shutil.copytree(tmp_path / "c", out / "p001")  # a run folder moved in by hand
    assert main(["trace", str(b), "--out", str(out), "--quiet"]) == 2
    assert "holds runs of scenario 'c', not 'b'" in _one_line(capsys)
    killed = tmp_path / "killed"
    assert main(["trace", str(single), "--out", str(killed / "trace_g00"), "--quiet"]) == 0
    assert main(["trace", str(b), "--out", str(killed), "--quiet"]) == 2
    assert "holds runs of scenario 'c', not 'b'" in _one_line(capsys)


def test_a_point_of_a_sweep_another_process_runs_is_the_sweeps(tmp_path, capsys):
    # While a sweep runs (another process holds its folder's lock), a run aimed at one of
    # its points used to replace a point the sweep had listed (--force), or to be
    # overwritten when the sweep got there. A job of that sweep (a Ray task: another
    # process than the sweep's) still writes its points.
    import subprocess
    import sys

    from asyncsim import runs
    from asyncsim.api import trace_run
    from asyncsim.scenario import load_scenario

    sweep_scn = _sweep_file(tmp_path, "sw", [1, 2, 3])
    single = tmp_path / "c.toml"
    single.write_text(dump_toml({**TINY, "name": "c", "run": {"updates": 20}}))
    sweep = tmp_path / "sweep"
    assert main(["trace", str(sweep_scn), "--out", str(sweep), "--quiet"]) == 0
    shutil.rmtree(sweep / "p002")  # a point the sweep has not reached yet
    link = tmp_path / "link"
    link.symlink_to(sweep / "p001")
    before = _digest(sweep)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom asyncsim import runs\n"
         "with runs.locked(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)",
         str(sweep)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        for out in (sweep / "p001", sweep / "p002", link):  # complete, not reached, a link
            assert main(["trace", str(single), "--out", str(out), "--quiet", "--force"]) == 2
            assert (f"{out}: a point of the sweep in {sweep}, which another asyncsim process "
                    "is running") in _one_line(capsys)
        held = _digest(sweep)
        assert held.pop(".lock") and held == before and not (sweep / "p002").exists()
        # Two jobs of the sweep in one process (an executor's threads): the first to end
        # leaves the other a job of it.
        first, second = runs.sweep_job(sweep), runs.sweep_job(sweep)
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)
        trace_run(load_scenario(single), sweep / "p001", force=True)
        second.__exit__(None, None, None)
        assert 'name = "c"' in (sweep / "p001" / "scenario.toml").read_text()
        assert main(["trace", str(single), "--out", str(sweep / "p001"), "--quiet",
                     "--force"]) == 2  # no job of it any more
        assert "a point of the sweep" in _one_line(capsys)
    finally:
        holder.kill()
        holder.wait()
    # The sweep stopped, its points are still its own: a run there would stand in the index
    # under the point's keys (asyncsim show, open_sweep), so it is refused.
    assert main(["trace", str(sweep_scn), "--out", str(sweep), "--quiet", "--force"]) == 0
    before = _digest(sweep)
    for out in (sweep / "p001", sweep / "p007", link):
        assert main(["trace", str(single), "--out", str(out), "--quiet", "--force"]) == 2
        said = _one_line(capsys).strip().removeprefix("asyncsim: error: ")
        assert said == (f"{out}: a point of the sweep in {sweep}, which only its sweep "
                        f"writes (its index names the point's keys): rerun the sweep with "
                        f"--out {sweep}, or choose another --out")
    assert _digest(sweep) == before


def test_a_sweep_never_writes_beside_what_it_did_not_write(tmp_path, capsys):
    """Whatever its names: a folder holding anything but a sweep's own files (its index,
    point and trace run folders, edges.csv, figures/) is not a sweep's, and neither a sweep
    nor its --force touches it; a run does not write inside a sweep folder."""
    a = _sweep_file(tmp_path, "a", [1, 2])
    sweep = tmp_path / "sweep"
    assert main(["trace", str(a), "--out", str(sweep), "--quiet"]) == 0
    (sweep / "notes.txt").write_text("notes\n")
    user = tmp_path / "user"  # a folder of the user's with an index.csv of its own
    (user / "album").mkdir(parents=True)
    (user / "index.csv").write_text("id,title\n1,x\n")
    (user / "album" / "a.jpg").write_bytes(b"jpg")
    looks = tmp_path / "looks"  # folders named like points, that are not run folders
    (looks / "p100").mkdir(parents=True)
    (looks / "p100" / "thesis.tex").write_text("tex\n")
    (looks / "trace_g01").mkdir()
    for folder, odd in ((sweep, "notes.txt"), (user, "album"), (looks, "p100")):
        before = _digest(folder), sorted(p.name for p in folder.rglob("*"))
        for extra in ([], ["--force"]):
            assert main(["trace", str(a), "--out", str(folder), "--quiet", *extra]) == 2
            assert f"{folder}: holds what a sweep does not write (e.g. {odd})" in (
                _one_line(capsys))
            assert (_digest(folder), sorted(p.name for p in folder.rglob("*"))) == before
    # A folder of figures alone holds no sweep to go on with or to replace.
    drawn = tmp_path / "drawn"
    (drawn / "figures").mkdir(parents=True)
    (drawn / "figures" / "f.png").write_bytes(b"png")
    for extra in ([], ["--force"]):
        assert main(["trace", str(a), "--out", str(drawn), "--quiet", *extra]) == 2
        assert f"{drawn}: holds no sweep, only figures; choose another --out" in (
            _one_line(capsys))
        assert (drawn / "figures" / "f.png").read_bytes() == b"png"
    # A run inside a sweep folder (as a run of the sweep's scenario without its [sweep]
    # table would land by default, runs/NAME/seedN) is refused, and leaves no folder.
    (sweep / "notes.txt").unlink()
    single = tmp_path / "s.toml"
    single.write_text(dump_toml(TINY))
    assert main(["trace", str(single), "--out", str(sweep / "seed7"), "--quiet"]) == 2
    assert (f"{sweep / 'seed7'}: inside the sweep folder {sweep}, where only its points and "
            "shared traces are written") in _one_line(capsys)
    assert not (sweep / "seed7").exists()
    assert main(["trace", str(a), "--out", str(sweep), "--quiet"]) == 0


def test_timeline_never_writes_into_another_run_folder(two_runs, tmp_path, capsys):
    a, b = two_runs
    before = _digest(b)
    for target in (b / "eval.png", b / "inputs" / "x.png", a / "x.png"):
        assert main(["timeline", str(a), "--figure", str(target), "--quiet"]) == 2
        err = _one_line(capsys)
        assert "--figure" in err and "inside the run folder" in err, err
    assert _digest(b) == before and not (a / "x.png").exists()
    # Its .csv goes beside the .png: a folder there refuses both before either is written.
    (tmp_path / "o.csv").mkdir()
    assert main(["timeline", str(a), "--figure", str(tmp_path / "o.png"), "--quiet"]) == 2
    assert "o.csv is a folder" in _one_line(capsys)
    assert not (tmp_path / "o.png").exists()
    # Its own timeline.png, and a file elsewhere, are drawn.
    assert main(["timeline", str(a), "--quiet"]) == 0
    assert main(["timeline", str(a), "--figure", str(tmp_path / "t.png"), "--quiet"]) == 0
    assert (a / "timeline.png").is_file() and (tmp_path / "t.csv").is_file()
    (a / "timeline.png").unlink()
    (a / "timeline.csv").unlink()


def test_calibrate_out_is_a_toml_file_outside_other_runs(two_runs, tmp_path, capsys):
    a, b = two_runs
    before = _digest(b), _digest(a)
    (tmp_path / "d.toml").mkdir()
    os.symlink(tmp_path / "nowhere", tmp_path / "broken.toml")
    os.symlink(os.devnull, tmp_path / "dev.toml")
    cases = {str(a / "summary.json"): "must name a .toml file",
             str(a / "scenario.toml"): "inside the run folder",
             str(b / "c.toml"): "inside the run folder",
             str(tmp_path / "d.toml"): "is a folder",
             str(tmp_path / "broken.toml"): "is a broken link",
             str(tmp_path / "dev.toml"): "is not a regular file",
             os.devnull: "must name a .toml file"}
    for out, fragment in cases.items():
        assert main(["calibrate", str(a), "--out", out]) == 2
        err = _one_line(capsys)
        assert "--out" in err and fragment in err, (out, err)
    assert (_digest(b), _digest(a)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.toml", "d.toml", "dev.toml"]
    # Elsewhere it writes the scenario with its CSVs beside it.
    out = tmp_path / "cal" / "c.toml"
    assert main(["calibrate", str(a), "--out", str(out)]) == 0
    assert out.is_file() and (out.parent / "calib_pull.csv").is_file()


def test_figure_files_of_compare_stability_and_figures(two_runs, tmp_path, capsys):
    a, b = two_runs
    (tmp_path / "d.png").mkdir()
    for argv, fragment in (
            (["compare", str(a), str(b), "--figure", str(tmp_path / "x.txt")],
             "must name a .png | .pdf | .svg file"),
            (["compare", str(a), str(b), "--figure", str(tmp_path / "d.png")], "is a folder"),
            (["compare", str(a), str(b), "--figure", str(b / "staleness.png")],
             "inside the run folder"),
            (["stability", "--tau", "1", "--figure", "."], "must name a .png"),
            (["stability", "--tau", "1", "--figure", str(tmp_path / "d.png")], "is a folder")):
        assert main(argv) == 2
        err = _one_line(capsys)
        assert "--figure" in err and fragment in err, (argv, err)
    (tmp_path / "f").write_text("")
    assert main(["figures", "quickstart", "--runs", str(tmp_path), "--out",
                 str(tmp_path / "f")]) == 2
    assert "--out" in (err := _one_line(capsys)) and "is a file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.png", "f"]
    assert main(["compare", str(a), str(b), "--figure", str(tmp_path / "s.pdf")]) == 0
    assert (tmp_path / "s.pdf").read_bytes().startswith(b"%PDF")


def test_a_run_folder_never_lies_inside_another_run_or_around_what_it_replays(tmp_path,
                                                                               capsys):
    """A run inside another run's folder (`--out RUN/sub`), or a sweep there, would be
    removed by that run's --force; a replay at or around its source (`replay R --out R
    --force`) removed the run it was replaying; a `..` in --out (`RUN/replay/..`) left a
    half-removed folder. Each is refused in one line and leaves nothing, or means the folder
    as written; a replay still writes inside its source (RUN/replay)."""
    scn = tmp_path / "s.toml"
    scn.write_text(dump_toml({**TINY, "run": {"updates": 8}}))
    sweep = _sweep_file(tmp_path, "sw", [1, 2])
    run = tmp_path / "run"
    assert main(["run", str(scn), "--out", str(run), "--quiet", "--no-figure"]) == 0
    assert main(["replay", str(run), "--quiet"]) == 0  # RUN/replay: the replay's own place
    assert main(["replay", str(run), "--path", "scan", "--out", str(run / "scan"),
                 "--quiet"]) == 0  # on every path
    # From Python too: a trace loaded from the run knows its folder.
    from asyncsim import replay
    from asyncsim.scenario import load_run_scenario
    from asyncsim.trace import Trace

    replay(load_run_scenario(run), Trace.load(run), out=run / "py")
    before = _digest(run)
    for verb, what, out in (("run", scn, run / "sub"), ("trace", scn, run / "replay" / "x"),
                            ("trace", sweep, run / "sweep")):
        assert main([verb, str(what), "--out", str(out), "--quiet"]) == 2
        home = run / "replay" if "replay" in out.parts else run
        assert (f"{out}: inside the run folder {home}, whose files only its run writes: "
                "choose another --out") in _one_line(capsys)
        assert not out.exists()
    for out in (run, tmp_path):
        for path in ("loop", "scan"):
            assert main(["replay", str(run), "--out", str(out), "--force", "--quiet",
                         "--path", path]) == 2
            assert (f"{out}: holds the run being replayed ({run}), which --force would "
                    "remove") in _one_line(capsys)
    assert _digest(run) == before
    # `..` as written: RUN/replay/.. is RUN, redone whole by --force (its replay with it).
    dotted = run / "replay" / ".."
    assert main(["trace", str(scn), "--out", str(dotted), "--quiet", "--force"]) == 0
    assert sorted(p.name for p in run.iterdir()) == sorted(
        ["provenance.json", "scenario.toml", "summary.json", "trace_grads.parquet",
         "trace_meta.json", "trace_updates.parquet"])
