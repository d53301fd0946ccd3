"""A run folder is a contract: nothing in it executes code, nothing mixes two runs, and the
same scenario gives the same numbers (a sweep point included); a folder stands alone.

Each test is one way that contract was broken by a careful user (kills, edits, crafted
input, two writers, a moved folder), replayed against the real CLI and drivers.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY as TINY_SCENARIO
from conftest import DieAt, Killed

from asyncsim import runs
from asyncsim._io import dump_toml
from asyncsim.cli import main
from asyncsim.results import read_summary

# conftest's tiny scenario as a file: a 16-unit MLP on 256 synthetic images, 3 async
# learners, 30 updates.
TINY = dump_toml(TINY_SCENARIO)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("asyncsim: error: ") and err.count("\n") == 1, err
    return err


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asyncsim.cli", *args], capture_output=True,
                          text=True, **kw)


# ----------------------------------------------------------------------------- code execution
def test_a_figure_name_is_never_a_path_to_code(tmp_path, capsys):
    """`[figure] name` naming a .py file by path (absolute or ../) is refused before anything
    runs, with one line, and the file is never imported; `run --resume` of a folder whose
    scenario.toml was given such a name is refused the same way."""
    marker = tmp_path / "pwned"
    evil = _write(tmp_path / "evil" / "payload.py", f"open({str(marker)!r}, 'w').write('x')\n"
                  "def draw(sweep, out):\n    return []\n")
    for name in (str(evil.with_suffix("")), "../../" + str(evil.with_suffix("")).lstrip("/"),
                 "../evil/payload"):
        path = _write(tmp_path / "s.toml", TINY + f'\n[figure]\nname = {json.dumps(name)}\n')
        out = tmp_path / "run"
        assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
        assert "figure.name: unknown figure" in _one_line_error(capsys)
        assert not marker.exists() and not out.exists()
    # A folder someone sent: its scenario.toml names the payload.
    path = _write(tmp_path / "ok.toml", TINY)
    out = tmp_path / "sent"
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-figure"]) == 0
    (out / "summary.json").unlink()  # an unfinished run
    saved = tomllib.loads((out / "scenario.toml").read_text())
    (out / "scenario.toml").write_text(dump_toml({**saved, "figure": {"name": str(evil)}}))
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    assert "figure.name: unknown figure" in _one_line_error(capsys)
    assert not marker.exists()


# ----------------------------------------------------------------------------- silent wrong results
def test_a_rerun_sweep_never_reuses_a_stale_shared_trace(tmp_path, capsys):
    """Rerunning an edited sweep into the same folder re-simulates the shared trace when the
    timing changed: the points' staleness and trace hash are those of a fresh sweep."""
    sweep = TINY.replace("[cluster]\nlearners = 3",
                         "[cluster]\nlearners = 3\ncompute = { dist = \"lognormal\", mean = 1.0,"
                         " cv = 0.1 }") + '\n[sweep]\n"optimizer.lr" = [0.05, 0.1]\n'
    path = _write(tmp_path / "sw.toml", sweep)
    out = tmp_path / "sw"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    before = pd.read_csv(out / "index.csv")
    _write(path, sweep.replace("cv = 0.1", "cv = 2.0"))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    after = pd.read_csv(out / "index.csv")
    assert main(["run", str(path), "--out", str(tmp_path / "fresh"), "--quiet"]) == 0
    fresh = pd.read_csv(tmp_path / "fresh" / "index.csv")
    assert (after["trace_hash"] != before["trace_hash"]).all()
    assert after["trace_hash"].tolist() == fresh["trace_hash"].tolist()
    assert after["staleness_max"].tolist() == fresh["staleness_max"].tolist()
    assert after["param_hash"].tolist() == fresh["param_hash"].tolist()
    capsys.readouterr()


@pytest.mark.parametrize("edit,keys", [
    (lambda t: t.replace("updates = 40", "updates = 60"), "run.updates"),
    (lambda t: t.replace("hidden = [16]", "hidden = [32]"), "model.hidden"),
    (lambda t: t.replace("[cluster]\nlearners = 3", "[cluster]\nlearners = 4"),
     "cluster.learners"),
    # An emptied file is damaged (asyncsim always writes it whole), not "the defaults".
    (lambda t: "", "scenario.toml (the run's scenario): empty"),
])
def test_resume_refuses_a_scenario_edited_since_the_checkpoint(tmp_path, capsys, tiny, edit,
                                                               keys):
    """A checkpoint records the resolved scenario it belongs to; resuming a folder whose
    scenario.toml now resolves to anything else (a longer run, another model, an emptied
    file: damaged) is refused with one line naming the changed keys, and leaves the folder
    as it was."""
    from asyncsim.api import run

    scn = tiny(run={"updates": 40, "eval_every": 10, "checkpoint_every": 10})
    out = tmp_path / "run"
    with pytest.raises(Killed):
        run(scn, out=out, monitor=DieAt(25))
    assert (out / "checkpoint.npz").exists()
    toml = out / "scenario.toml"
    toml.write_text(edit(toml.read_text()))
    listing = sorted(p.name for p in out.iterdir())
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    err = _one_line_error(capsys)
    assert keys in err
    assert "empty" in keys or "scenario.toml changed since the checkpoint" in err
    assert sorted(p.name for p in out.iterdir()) == listing
    assert not (out / "summary.json").exists()


def test_an_unfinished_replay_is_not_resumed_as_an_online_run(tmp_path, capsys):
    """`run --resume` of an unfinished replay would simulate a new timeline in place of the
    replayed one: it is refused, naming the command that redoes the replay."""
    path = _write(tmp_path / "s.toml", TINY)
    src = tmp_path / "src"
    assert main(["run", str(path), "--out", str(src), "--quiet", "--no-figure"]) == 0
    rep = tmp_path / "rep"
    assert main(["replay", str(src), "--out", str(rep), "--quiet"]) == 0
    (rep / "summary.json").unlink()
    assert main(["run", "--resume", str(rep), "--quiet"]) == 2
    assert f"asyncsim replay {src} --out {rep} --force" in _one_line_error(capsys)


def _lock_pid(folder: Path) -> int | None:
    """The pid the holder of ``folder``'s lock wrote into it, or None."""
    try:
        text = (folder / runs.LOCK).read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def test_a_second_writer_is_refused_and_the_folder_holds_one_run(tmp_path):
    """Two `asyncsim run` (seeds 0 and 1) on one --out: the second is refused with one line
    naming the first's pid, and the folder is the first run's throughout (scenario.toml,
    provenance.json and summary.json agree on its seed). Same for two sweeps."""
    # The first is stopped (SIGSTOP) once it holds the lock, so it is still writing when
    # the second, a fresh process, gets to the lock, however loaded the machine (the second
    # is refused before it compiles anything: no other lock is shared).
    path = _write(tmp_path / "s.toml", TINY.replace("updates = 30", "updates = 2000")
                  .replace("eval_every = 10", "eval_every = 1000"))
    for extra, out in (([], tmp_path / "run"),
                       (["--set", "sweep.optimizer.lr=[0.05, 0.1]"], tmp_path / "sweep")):
        first = subprocess.Popen([sys.executable, "-m", "asyncsim.cli", "run", str(path),
                                  "--out", str(out), "--seed", "0", "--quiet", "--no-figure",
                                  *extra], stderr=subprocess.PIPE, text=True)
        try:
            # Held once its pid is in the lock file: the holder writes it after the flock
            # (the file alone exists a moment before: stopped then, the first would not
            # hold the lock, and the second would take it).
            deadline = time.monotonic() + 60
            while _lock_pid(out) != first.pid and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _lock_pid(out) == first.pid, "the first run never took the lock"
            first.send_signal(signal.SIGSTOP)
            assert first.poll() is None, "the first run ended before it could be stopped"
            second = _cli("run", str(path), "--out", str(out), "--seed", "1", "--quiet",
                          "--no-figure", *extra)
            assert second.returncode == 2
            assert second.stderr.count("\n") == 1
            assert (f"another asyncsim process (pid {first.pid}) is writing this folder"
                    in second.stderr)
            first.send_signal(signal.SIGCONT)
            assert first.wait(timeout=300) == 0, first.stderr.read()
        finally:
            first.kill()
        assert not (out / runs.LOCK).exists()  # removed by its holder at the end
        folders = [out] if not extra else sorted(out.glob("p0*"))
        for f in folders:
            seeds = {tomllib.loads((f / "scenario.toml").read_text())["seed"],
                     json.loads((f / "provenance.json").read_text())["seed"],
                     _summary(f)["seed"]}
            assert seeds == {0}


def test_a_sweep_point_has_the_numbers_of_its_scenario_run_alone(tmp_path, capsys):
    """By default a point of a hyperparameter sweep over a shared trace has exactly the
    parameters of its scenario.toml run alone (whatever a timing probe would say); the
    faster vmapped path is an opt-in that index.csv and summary.json record."""
    sweep = TINY + '\n[sweep]\n"optimizer.lr" = [0.02, 0.05, 0.1]\n"optimizer.weight_decay"' \
        ' = [0.0, 0.001]\n'
    path = _write(tmp_path / "sw.toml", sweep)
    out = tmp_path / "sw"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    index = pd.read_csv(out / "index.csv")
    assert index["shared_trace"].all() and (index["sweep_path"] == "exact").all()
    assert index["exact"].all() and not index["vmapped"].any()
    for _, row in index.iterrows():
        alone = tmp_path / "alone" / row["point"]
        assert main(["run", str(out / row["point"] / "scenario.toml"), "--out", str(alone),
                     "--quiet"]) == 0
        assert _summary(alone)["param_hash"] == row["param_hash"], row["point"]
    # The opt-in: one vmapped program, recorded as such, agreeing to ~1e-5 only.
    fast = tmp_path / "fast"
    assert main(["run", str(path), "--out", str(fast), "--quiet", "--set",
                 "run.sweep_path=vmapped"]) == 0
    vm = pd.read_csv(fast / "index.csv")
    assert (vm["sweep_path"] == "vmapped").all() and vm["vmapped"].all()
    assert not vm["exact"].any()
    assert all(_summary(fast / p)["sweep_path"] == "vmapped" for p in vm["point"])
    assert main(["run", str(path), "--out", str(fast), "--quiet", "--set",
                 "run.sweep_path=fastst"]) == 2
    assert "run.sweep_path: unknown sweep path 'fastst'; allowed: exact" in \
        _one_line_error(capsys)


# A run of the `asyncsim` command (asyncsim.cli.main, in a process of its own) that does
# ``act()`` just before the Driver's checks after update ``AT`` (sys.argv[3]): a precise,
# synchronous point of the run, the same on every machine and under any load.
_RUN_WITH_AN_ACT_AT = """
import json, os, signal, sys
# Ctrl-C as at a terminal: a process started in the background by a shell inherits SIGINT
# ignored (bash does that for `cmd &`), and then no Ctrl-C ever lands.
signal.signal(signal.SIGINT, signal.default_int_handler)
from asyncsim.cli import main
from asyncsim.drivers import driver as drv

AT, seen, dropped = int(sys.argv[3]), [], []
real = drv.Driver._after

def after(self, done, **kw):
    seen.append(done)
    if done == AT:
        act()
    return real(self, done, **kw)

drv.Driver._after = after
# what the interpreter drops ("Exception ignored in ...")
sys.unraisablehook = lambda u: dropped.append(u.exc_type.__name__)
"""

_KILL_9 = _RUN_WITH_AN_ACT_AT + """
def act():
    os.kill(os.getpid(), signal.SIGKILL)  # kill -9: no handler, no clean-up, no exit code

main(["run", sys.argv[1], "--out", sys.argv[2], "--quiet", "--no-figure"])
"""


def test_resume_after_kill_9_writes_what_the_uninterrupted_run_does(tmp_path):
    """`kill -9` of `asyncsim run` between two checkpoints (at update 150; checkpoints every
    100), then `run --resume`: eval.csv (the gradients and epochs of the evaluations after
    the checkpoint included) and the final parameters are those of the run that was never
    stopped. The run kills itself at that update, so the kill lands there on any machine."""
    path = _write(tmp_path / "s.toml", TINY.replace("updates = 30", "updates = 300")
                  .replace("eval_every = 10", "eval_every = 50\ncheckpoint_every = 100"))
    full = tmp_path / "full"
    assert _cli("run", str(path), "--out", str(full), "--quiet", "--no-figure").returncode == 0
    out = tmp_path / "killed"
    r = subprocess.run([sys.executable, "-c", _KILL_9, str(path), str(out), "150"],
                       capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert (out / "checkpoint.npz").exists() and not (out / "summary.json").exists()
    assert _cli("run", "--resume", str(out), "--quiet", "--no-figure").returncode == 0
    pd.testing.assert_frame_equal(pd.read_csv(out / "eval.csv"), pd.read_csv(full / "eval.csv"),
                                  check_exact=True)
    assert _summary(out)["param_hash"] == _summary(full)["param_hash"]


_CTRL_C_WHERE_IT_IS_DROPPED = _RUN_WITH_AN_ACT_AT + """
class Dropped:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C, while the interpreter runs __del__

def act():
    # No reference to it is left: it is freed at once, and the KeyboardInterrupt raised in
    # its __del__ is dropped there, before the Driver's checks of this update.
    Dropped()
    assert dropped == ["KeyboardInterrupt"], dropped

rc = main(["run", sys.argv[1], "--out", sys.argv[2], "--quiet", "--no-figure"])
print(json.dumps({"rc": rc, "dropped": dropped, "last": max(seen)}))
"""


def test_a_ctrl_c_that_the_interpreter_drops_stops_the_run_resumably(tmp_path, monkeypatch):
    """Ctrl-C raises KeyboardInterrupt in whatever Python code runs then; in a garbage
    collector callback (JAX's frees XLA buffers) or a ``__del__`` the interpreter prints
    "Exception ignored" and drops it, and the run went on to exit 0. Now it stops after that
    update, as any Ctrl-C does (status 130, a checkpoint and no summary), and resumes to the
    numbers of the run that was never stopped.

    The Ctrl-C lands in a ``__del__``, which the interpreter drops the same way as in a gc
    callback (both go to ``sys.unraisablehook``): reference counting runs it at once, in the
    main thread, where a gc callback runs only when a collection does (``gc.collect()`` does
    nothing while another thread collects). The stopped run is a process of its own, as a
    command is."""
    from asyncsim import _process

    path = _write(tmp_path / "s.toml",
                  TINY.replace("eval_every = 10", "eval_every = 10\ncheckpoint_every = 5"))
    full = tmp_path / "full"
    assert main(["run", str(path), "--out", str(full), "--quiet", "--no-figure"]) == 0
    out = tmp_path / "stopped"
    r = subprocess.run([sys.executable, "-c", _CTRL_C_WHERE_IT_IS_DROPPED, str(path), str(out),
                        "12"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["dropped"] == ["KeyboardInterrupt"], got  # dropped where it landed
    assert got["rc"] == 130 and r.stderr.endswith("asyncsim: interrupted\n")
    assert got["last"] == 12  # stopped after the update it landed in
    assert (out / "checkpoint.npz").exists() and not (out / "summary.json").exists()
    # A Ctrl-C recorded before (here: by hand) is not the next run's: it runs to its end
    # (with Python's SIGINT handler, as at a terminal: asyncsim keeps any other, an
    # ignored SIGINT included, and then records nothing).
    monkeypatch.setattr(_process, "_interrupted", True)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(["run", "--resume", str(out), "--quiet", "--no-figure"]) == 0
    finally:
        signal.signal(signal.SIGINT, before)
    assert _summary(out)["param_hash"] == _summary(full)["param_hash"]


def test_a_replay_killed_at_its_summary_write_is_complete(tmp_path, monkeypatch):
    """summary.json is written once and last: a replay killed the moment it appears already
    has its comparison with the source (replay_path, matches_source, source_param_hash)."""
    from asyncsim import _io
    from asyncsim.api import replay_folder

    path = _write(tmp_path / "s.toml", TINY)
    src = tmp_path / "src"
    assert main(["run", str(path), "--out", str(src), "--quiet", "--no-figure"]) == 0
    real = _io.write_json

    class Kill(BaseException):
        pass

    def write_json(p, obj):
        real(p, obj)
        if Path(p).name == "summary.json":
            raise Kill  # the process dies right after summary.json appears

    monkeypatch.setattr(_io, "write_json", write_json)
    monkeypatch.setattr(runs, "atomic_write_json", write_json)
    with pytest.raises(Kill):
        replay_folder(src, out=tmp_path / "rep")
    s = _summary(tmp_path / "rep")
    assert s["replay_path"] == "loop" and s["matches_source"] is True
    assert s["source_param_hash"] == _summary(src)["param_hash"]


# ----------------------------------------------------------------------------- standing alone
def test_a_folder_with_a_relative_input_replays_resumes_and_reruns_after_moving(
        tmp_path, capsys, monkeypatch):
    """A scenario's empirical delays (`path = "delays.csv"`, relative, and a `~` path) are
    copied into the run folder with their hash; a run killed after a checkpoint resumes,
    and the finished folder replays and reruns, after the folder moved and the original
    files are gone, with the numbers of the run that was never stopped."""
    from asyncsim.api import run
    from asyncsim.scenario import load_scenario

    home = tmp_path / "home"
    _write(home / "push.csv", "s\n0.1\n0.3\n")
    monkeypatch.setenv("HOME", str(home))
    src_dir = tmp_path / "study"
    _write(src_dir / "delays.csv", "seconds\n0.5\n1.0\n2.5\n")
    text = TINY.replace("[cluster]\nlearners = 3", textwrap.dedent("""\
        [cluster]
        learners = 3
        compute = { dist = "empirical", path = "delays.csv", column = "seconds" }
        [cluster.network.push]
        latency = { dist = "straggler", p = 0.2, factor = 3.0, base = { dist = "empirical", \
        path = "~/push.csv" } }
        """)).replace("eval_every = 10", "eval_every = 10\ncheckpoint_every = 10")
    path = _write(src_dir / "s.toml", text)
    full = tmp_path / "full"
    assert main(["run", str(path), "--out", str(full), "--quiet", "--no-figure"]) == 0
    out = tmp_path / "run"
    with pytest.raises(Killed):
        run(load_scenario(path), out=out, monitor=DieAt(25))
    saved = tomllib.loads((out / "scenario.toml").read_text())
    name = saved["cluster"]["compute"]["path"]
    assert name.startswith("inputs/") and name.endswith("-delays.csv")
    assert (out / name).read_text() == (src_dir / "delays.csv").read_text()
    prov = json.loads((out / "provenance.json").read_text())["inputs"]
    assert set(prov) == {"cluster.compute.path", "cluster.network.push.latency.base.path"}
    base = saved["cluster"]["network"]["push"]["latency"]["base"]["path"]
    assert base.startswith("inputs/") and (out / base).read_text() == "s\n0.1\n0.3\n"
    # Move the killed folder; the original files are gone.
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(out, moved)
    shutil.rmtree(src_dir)
    shutil.rmtree(home)
    assert (moved / "checkpoint.npz").exists()
    assert main(["run", "--resume", str(moved), "--quiet", "--no-figure"]) == 0
    assert _summary(moved)["param_hash"] == _summary(full)["param_hash"]
    assert sorted(p.name for p in (moved / "inputs").iterdir()) == sorted(
        Path(v["file"]).name for v in prov.values())  # read again, not copied again
    assert main(["replay", str(moved), "--quiet"]) == 0
    assert _summary(moved / "replay")["matches_source"] is True
    assert main(["run", str(moved / "scenario.toml"), "--out", str(tmp_path / "again"),
                 "--quiet", "--no-figure"]) == 0
    assert _summary(tmp_path / "again")["param_hash"] == _summary(full)["param_hash"]
    capsys.readouterr()


@pytest.mark.parametrize("left", [[], [".scenario.toml.tmp"]])
def test_a_folder_killed_before_its_scenario_says_force(tmp_path, capsys, left):
    """Killed before scenario.toml existed (or a full disk left only its temporary file):
    the advice is --force, which works; --resume is refused in one line."""
    path = _write(tmp_path / "s.toml", TINY)
    out = tmp_path / "run"
    out.mkdir()
    (out / "provenance.json").write_text("{}")
    for name in left:
        (out / name).write_text("name = ")
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-figure"]) == 2
    err = _one_line_error(capsys)
    assert "cannot be resumed: pass --force" in err and "--resume" not in err
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    assert "pass --force to start over" in _one_line_error(capsys)
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-figure",
                 "--force"]) == 0
    assert not list(out.glob(".*.tmp"))


def test_a_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path):
    """A write the storage refuses (here a file-size limit, as a full disk would) ends the
    run with one line naming the file; no temporary file stays behind, the folder keeps its
    complete files, and --resume continues once there is room."""
    path = _write(tmp_path / "s.toml", TINY.replace("eval_every = 10",
                                                    "eval_every = 10\ncheckpoint_every = 10"))
    out = tmp_path / "run"
    limit = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
             "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000)); "
             "from asyncsim.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", limit, "run", str(path), "--out", str(out),
                        "--quiet", "--no-figure"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1
    assert "cannot write" in r.stderr and "checkpoint.npz: File too large" in r.stderr
    assert "it needed more than the" in r.stderr and f"MiB free in {out}" in r.stderr
    assert not list(out.glob(".*.tmp")) and not (out / "checkpoint.npz").exists()
    assert (out / "scenario.toml").exists()
    assert _cli("run", "--resume", str(out), "--quiet", "--no-figure").returncode == 0
    assert (out / "summary.json").exists()


def test_force_never_pulls_a_folder_from_under_its_writer(tmp_path, capsys):
    """`--force` on a folder holding another writer's folder (a replay writing RUN/replay)
    is refused in one line instead of deleting it mid-write."""
    path = _write(tmp_path / "s.toml", TINY)
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-figure"]) == 0
    with runs.locked(out / "replay"):  # held as a replay's driver holds it
        assert main(["run", str(path), "--out", str(out), "--quiet", "--no-figure",
                     "--force"]) == 2
        err = _one_line_error(capsys)
        assert f"--force would remove {out / 'replay'}, which another asyncsim process" in err
    assert (out / "summary.json").exists()
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-figure",
                 "--force"]) == 0


def merged_checkpoints(path: Path) -> Path:
    """``path``'s scenario with a checkpoint every 5 updates, as a file beside it."""
    d = tomllib.loads(path.read_text())
    d["run"] = {**d["run"], "checkpoint_every": 5}
    return _write(path.with_name("ck.toml"), dump_toml(d))


def test_resume_takes_the_command_that_started_the_run_and_nothing_else(tmp_path, capsys):
    """`run --resume DIR` continues the folder's own scenario: the command that started the
    run may be given again (its scenario file and --out), but a scenario that resolves to
    another one, --set or --seed without a file, or another --out would be ignored, so they
    are refused in one line naming what differs; an --out that cannot be a folder (an
    existing file) is one line, not a traceback."""
    from asyncsim.api import run
    from asyncsim.scenario import load_scenario

    path = merged_checkpoints(_write(tmp_path / "s.toml", TINY))
    out = tmp_path / "run"
    with pytest.raises(Killed):
        run(load_scenario(path), out=out, monitor=DieAt(12))
    cases = {("--set", "seed=3"): "--set change a scenario file, and none is given",
             ("--seed", "3"): "--seed change a scenario file, and none is given",
             (str(path), "--seed", "3"): f"holds another scenario than {path} --seed resolves "
                                         "to (seed: 7 there, 3 here)",
             ("--out", str(tmp_path / "elsewhere")): "--out: names"}
    for extra, fragment in cases.items():
        assert main(["run", "--resume", str(out), *extra, "--quiet", "--no-figure"]) == 2
        err = _one_line_error(capsys)
        assert err.startswith("asyncsim: error: asyncsim run: ") and fragment in err, err
    assert not runs.is_complete(out)
    # The command that started it, given again with --resume: continued to the end.
    assert main(["run", str(path), "--out", str(out), "--resume", str(out), "--quiet",
                 "--no-figure"]) == 0
    assert read_summary(out)["updates"] == 30
    afile = _write(tmp_path / "taken", "not a folder")
    assert main(["run", str(path), "--out", str(afile), "--quiet"]) == 2
    assert f"{afile}: cannot be a run folder" in _one_line_error(capsys)
    assert afile.read_text() == "not a folder"
