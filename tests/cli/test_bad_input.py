"""Bad input through the CLI: one line (exit 2, no traceback), nothing left behind; and the
CLI says what it does (where it wrote, what a profile draws)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY as TINY_SCENARIO

from asyncsim._io import dump_toml, read_json
from asyncsim.cli import main


def _scenario(tmp_path: Path, **tables) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(dump_toml({**TINY_SCENARIO, **tables}))
    return path


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("asyncsim: error: ") and err.count("\n") == 1, err
    return err


def test_a_profile_the_file_does_not_define_is_refused(tmp_path, capsys):
    """`--profile smoke` on a file without [profiles.smoke] would run the full scale: it is
    refused with the file's profiles listed, and nothing is written."""
    path = _scenario(tmp_path, profiles={"paper": {"run": {"updates": 5}}})
    out = tmp_path / "runs" / "x"
    assert main(["run", str(path), "--profile", "smoke", "--out", str(out), "--quiet"]) == 2
    err = _one_line(capsys)
    assert "--profile: this scenario defines no 'smoke' profile; its profiles: default, paper" \
        in err and str(path) in err
    assert not (tmp_path / "runs").exists()


def test_run_honours_trace_only(tmp_path):
    """`run.trace_only = true` makes `asyncsim run` of a single scenario a timing-only run,
    as its scenario.toml says (no gradients, no parameters)."""
    path = _scenario(tmp_path, run={"updates": 20, "trace_only": True})
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    s = read_json(out / "summary.json")
    assert s["kind"] == "trace" and "param_hash" not in s
    assert not (out / "params.npz").exists() and s["updates"] == 20


def test_a_refused_run_leaves_no_empty_parent_folders(tmp_path, capsys):
    """Bad input found while running (here a model option the factory refuses) removes the
    run folder and the parents the run created (runs/NAME/), not folders that were there."""
    path = _scenario(tmp_path, model={"name": "mlp", "hidden": [0]})
    (tmp_path / "runs").mkdir()
    out = tmp_path / "runs" / "tiny" / "seed7"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    assert "model.hidden" in _one_line(capsys)
    assert not (tmp_path / "runs" / "tiny").exists() and (tmp_path / "runs").is_dir()


def test_argument_errors_are_one_line():
    r = subprocess.run([sys.executable, "-m", "asyncsim.cli", "run", "--bogus"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "unrecognized arguments: --bogus" in r.stderr and "--help" in r.stderr
    r = subprocess.run([sys.executable, "-m", "asyncsim.cli", "replay"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "run_dir" in r.stderr


def test_replay_says_where_it_wrote_and_quiet_sweeps_print_nothing(tmp_path, capsys):
    path = _scenario(tmp_path)
    src = tmp_path / "src"
    assert main(["run", str(path), "--out", str(src), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["replay", str(src)]) == 0
    assert f"replay folder: {src / 'replay'}" in capsys.readouterr().out
    sweep = _scenario(tmp_path, sweep={"optimizer.lr": [0.05, 0.1]})
    assert main(["run", str(sweep), "--out", str(tmp_path / "sw"), "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def test_a_figure_that_does_not_fit_the_scenario_is_refused_before_running(tmp_path, capsys):
    """A single-run figure on a sweep (or a sweep's figure on one run) is refused before
    any point runs, not after, with a FileNotFoundError."""
    sweep = _scenario(tmp_path, figure={"name": "quickstart"},
                      sweep={"optimizer.lr": [0.05, 0.1]})
    assert main(["run", str(sweep), "--out", str(tmp_path / "sw"), "--quiet"]) == 2
    assert "figure.name: 'quickstart' draws one run folder; this scenario is a sweep" in \
        _one_line(capsys)
    single = _scenario(tmp_path, figure={"name": "p2_f1"})
    assert main(["run", str(single), "--out", str(tmp_path / "one"), "--quiet"]) == 2
    assert "'p2_f1' draws a sweep; this scenario is a single run" in _one_line(capsys)
    assert not (tmp_path / "sw").exists() and not (tmp_path / "one").exists()


def test_figures_of_another_profile_never_overwrite_the_committed_ones(tmp_path, capsys,
                                                                       monkeypatch):
    """`asyncsim figures NAME --profile smoke` draws beside the smoke runs (the run folder of
    a single-run figure), not into ./figures where the paper-scale figures live."""
    path = _scenario(tmp_path, figure={"name": "quickstart"})
    runs_dir = tmp_path / "runs"
    run = runs_dir / "quickstart-smoke" / "seed7"
    assert main(["run", str(path), "--out", str(run), "--quiet", "--no-figure"]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["figures", "quickstart", "--runs", str(runs_dir), "--profile", "smoke"]) == 0
    assert (run / "quickstart.png").exists() and not (tmp_path / "figures").exists()
    assert main(["figures", "quickstart", "--runs", str(runs_dir), "--profile", "smoke",
                 "--out", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "quickstart.png").exists()
    # Into a run or sweep folder only where they belong (a figure in a sweep folder's root
    # made the sweep refuse its own folder).
    sweep, other = tmp_path / "sweep", tmp_path / "other"
    path.write_text(dump_toml({**TINY_SCENARIO, "run": {"updates": 10},
                               "sweep": {"seed": [1, 2]}}))
    assert main(["trace", str(path), "--out", str(sweep), "--quiet"]) == 0
    assert main(["trace", str(sweep / "p000" / "scenario.toml"), "--out", str(other),
                 "--quiet"]) == 0
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for out, where in ((sweep, "the sweep"), (sweep / "figures", "inside the sweep"),
                       (other, "the run"), (run / "figs", "inside the run")):
        assert main(["figures", "quickstart", "--runs", str(runs_dir), "--profile", "smoke",
                     "--out", str(out)]) == 2
        err = _one_line(capsys)
        home = out.parent if "inside" in where else out
        kind = where.split()[-1]
        assert (f"--out: {out} is {where} folder {home}, whose files only its {kind} writes "
                f"(figures drawn from {run} go there only into {run})") in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert main(["figures", "quickstart", "--runs", str(runs_dir), "--profile", "smoke",
                 "--out", str(run)]) == 0
    # Every figure's --out is checked before any is drawn: the quickstart's own folder is
    # not P1-F1's, so neither is drawn.
    repo = Path(__file__).resolve().parents[2]
    assert main(["run", str(repo / "scenarios" / "p1_f1_staleness.toml"), "--profile", "smoke",
                 "--out", str(runs_dir / "p1_f1_staleness-smoke"), "--quiet",
                 "--no-figure"]) == 0
    (run / "quickstart.png").unlink()
    assert main(["figures", "quickstart", "p1_f1_staleness", "--runs", str(runs_dir),
                 "--profile", "smoke", "--out", str(run)]) == 2
    assert f"--out: {run} is the run folder {run}" in _one_line(capsys)
    assert not (run / "quickstart.png").exists()


@pytest.mark.parametrize("how", ["empty", "garbled"])
def test_a_damaged_summary_stops_a_replay_before_it_writes(tmp_path, capsys, how):
    """Before, a truncated summary.json let the replay run and write RUN/replay, then
    crashed; now the source is read first."""
    path = _scenario(tmp_path)
    src = tmp_path / "src"
    assert main(["run", str(path), "--out", str(src), "--quiet"]) == 0
    (src / "summary.json").write_bytes(b"" if how == "empty" else b'{"param_ha')
    assert main(["replay", str(src), "--quiet"]) == 2
    assert "summary.json" in _one_line(capsys)
    assert not (src / "replay").exists()


@pytest.mark.parametrize("sets,attributed,words", [
    # A --set value is named as the --set, not as if the file held it.
    (["protocol.n=12"], "--set protocol.n=12: protocol.n", "1..4"),
    # Switching a table's kind keeps the file's other keys: say how to replace the table.
    (["protocol.kind=async"], "protocol.n", "--set 'protocol={kind=\"async\"}'"),
    # A table set whole is quoted inline, on the one line (it was written as a [v] table
    # over three lines, its first key dropped).
    (['cluster.compute={dist="lognormal", mean=1.0, cv=-1}'],
     '--set cluster.compute={ dist = "lognormal", mean = 1.0, cv = -1 }: cluster.compute.cv',
     "got -1"),
])
def test_set_errors_name_the_set_and_say_how_to_replace_a_table(tmp_path, capsys, sets,
                                                                  attributed, words):
    path = _scenario(tmp_path, cluster={"learners": 4}, protocol={"kind": "softsync", "n": 2})
    args = [a for s in sets for a in ("--set", s)]
    assert main(["trace", str(path), *args, "--out", str(tmp_path / "t"), "--quiet"]) == 2
    err = _one_line(capsys)
    assert attributed in err and words in err
    if sets[0].startswith("protocol.n"):
        assert str(path) not in err


def test_replay_refuses_a_timing_set_as_timing(tmp_path, capsys):
    """`replay --set protocol.kind=async` is refused because the trace fixes the protocol,
    not for the run's softsync n that the new kind does not take."""
    path = _scenario(tmp_path, cluster={"learners": 4}, protocol={"kind": "softsync", "n": 2})
    src = tmp_path / "src"
    assert main(["run", str(path), "--out", str(src), "--quiet"]) == 0
    assert main(["replay", str(src), "--set", "protocol.kind=async", "--quiet"]) == 2
    err = _one_line(capsys)
    assert "protocol.kind: is timing, which the recorded trace fixes" in err


def test_profile_and_toml_errors_name_the_exact_key(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(dump_toml(TINY_SCENARIO) + "\n[profiles.smoke.rnu]\nupdates = 3\n")
    assert main(["trace", str(path), "--quiet"]) == 2
    err = _one_line(capsys)
    assert "profiles.smoke.rnu: unknown key; allowed here: name" in err
    assert "did you mean 'run'?" in err
    path.write_text("[optimizer]\nlr = 0.1\nlr = 0.2\n")
    assert main(["trace", str(path), "--quiet"]) == 2
    assert "Cannot overwrite a value (at line 3, column 9): 'lr = 0.2'" in _one_line(capsys)


def test_sizes_that_cannot_fit_are_refused_before_anything_runs(tmp_path, capsys):
    """A data set or a trace larger than the machine's memory is one line naming the key and
    the estimate, and leaves no folder (before: a 38-line _ArrayMemoryError, or a trace
    growing without end)."""
    path = _scenario(tmp_path, data={"name": "synthetic-cifar", "n_train": 10**12})
    assert main(["run", str(path), "--out", str(tmp_path / "big"), "--quiet"]) == 2
    assert "data.n_train: the data set does not fit in this machine's memory" in \
        _one_line(capsys)
    path = _scenario(tmp_path, run={"updates": 10**18})
    assert main(["trace", str(path), "--out", str(tmp_path / "long"), "--quiet"]) == 2
    assert "run.updates: a trace of 1e+18 gradients needs about" in _one_line(capsys)
    assert not (tmp_path / "big").exists() and not (tmp_path / "long").exists()


def test_the_key_reference_is_generated_from_the_config():
    """docs/keys.md is what `python -m asyncsim.keys` writes (regenerate it after changing
    asyncsim/config/schema.py), and it lists every key the loader accepts."""
    import dataclasses

    from asyncsim import config
    from asyncsim.keys import key_reference

    doc = (Path(__file__).resolve().parents[2] / "docs" / "keys.md").read_text()
    assert doc == key_reference(), "docs/keys.md is stale: python -m asyncsim.keys > docs/keys.md"
    for f in dataclasses.fields(config.RunConfig):
        assert f"| `run.{f.name}` |" in doc
    assert "| `run.trace_only` | `bool` | `false` |" in doc
    assert "| `protocol.kind` | `str` | `\"async\"` |" in doc and "Built in: async," in doc


def test_changing_only_the_figure_table_reruns_no_point(tmp_path):
    """A figure does not change the numbers: editing [figure] and rerunning a complete sweep
    recomputes nothing (before: every point ran again)."""
    sweep = {"sweep": {"optimizer.lr": [0.05, 0.1]}}
    path = _scenario(tmp_path, **sweep)
    out = tmp_path / "sw"
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-figure"]) == 0
    stamps = {p: (p / "summary.json").stat().st_mtime_ns for p in out.glob("p0*")}
    path = _scenario(tmp_path, **sweep, figure={"title": "another caption"})
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-figure"]) == 0
    assert {p: (p / "summary.json").stat().st_mtime_ns for p in out.glob("p0*")} == stamps


def test_a_run_folder_records_the_protocol_options_given(tmp_path):
    """A run's scenario.toml records the [protocol] options the scenario gives, no
    defaults; folders that spell out defaults (fixed-delay's `schedule` and `cv`, as
    asyncsim <= 0.3 wrote them for every protocol) still count as the same run, and a
    changed option does not."""
    import tomllib

    from asyncsim.drivers.folder_scenario import scenario_changes
    from asyncsim.scenario import load_scenario

    for protocol in ({"kind": "softsync", "n": 1}, {"kind": "fixed-delay", "tau": 2}):
        path = _scenario(tmp_path, protocol=protocol, cluster={"learners": 3},
                         run={"updates": 5, "trace_only": True})
        out = tmp_path / protocol["kind"]
        assert main(["trace", str(path), "--out", str(out), "--quiet"]) == 0
        saved = tomllib.loads((out / "scenario.toml").read_text())
        assert saved["protocol"] == protocol
        old = {**saved, "protocol": {**saved["protocol"], "schedule": "round-robin",
                                     "cv": 0.1}}
        assert scenario_changes(old, load_scenario(path)) == []  # the defaults: the same
        other = {**old, "protocol": {**old["protocol"], "cv": 0.3}}
        assert scenario_changes(other, load_scenario(path)) == ["protocol.cv"]


def test_option_types_are_checked_when_the_scenario_loads(tmp_path, capsys):
    """`model.hidden = "abc"` is refused under its own key by `asyncsim trace` too, which
    never builds the model (before: accepted, and reported under `model` by run)."""
    path = _scenario(tmp_path, model={"name": "mlp", "hidden": "abc"})
    assert main(["trace", str(path), "--out", str(tmp_path / "t"), "--quiet"]) == 2
    assert "model.hidden: must be a list of integers, got 'abc'" in _one_line(capsys)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("verb", ["replay", "stability", "figures", "run", "trace"])
def test_every_option_says_what_it_does(verb):
    from asyncsim.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "verb")
    silent = [a.dest for a in sub.choices[verb]._actions if a.dest != "help" and not a.help]
    assert silent == []


def test_set_attribution_takes_the_last_set_and_survives_any_value(tmp_path, capsys):
    """Repeated --set of one key: the last one (the one applied) is named; a value TOML
    cannot write (from Python) still gives the ScenarioError, not a TypeError."""
    import numpy as np

    from asyncsim.errors import ScenarioError
    from asyncsim.scenario import load_scenario

    path = _scenario(tmp_path)
    assert main(["trace", str(path), "--set", "optimizer.lr=0.1", "--set", "optimizer.lr=-1",
                 "--quiet"]) == 2
    assert "--set optimizer.lr=-1: optimizer.lr" in _one_line(capsys)
    with pytest.raises(ScenarioError, match="--set optimizer.lr=np.float32"):
        load_scenario(path, overrides=[("optimizer.lr", np.float32(-1))])
    # A kind switch plus a --set of the failing key names the --set, with no table hint.
    path = _scenario(tmp_path, cluster={"learners": 4}, protocol={"kind": "async"})
    assert main(["trace", str(path), "--set", "protocol.kind=softsync", "--set",
                 "protocol.n=0", "--quiet"]) == 2
    err = _one_line(capsys)
    assert "--set protocol.n=0: protocol.n" in err and "replace the table" not in err


def test_a_figure_refused_is_named_by_what_set_it(tmp_path, capsys):
    """``[figure] name`` is checked after the scenario loads (asyncsim run): a --set of it
    is named as the load names its own keys' --set, the file otherwise; nothing is left."""
    path = _scenario(tmp_path, figure={"name": "quickstart"})
    out = tmp_path / "r"
    assert main(["run", str(path), "--set", "figure.name=quickstar", "--out", str(out),
                 "--quiet"]) == 2
    err = _one_line(capsys)
    assert err.startswith("asyncsim: error: --set figure.name=quickstar: figure.name: unknown "
                          "figure 'quickstar'") and "did you mean 'quickstart'" in err
    path = _scenario(tmp_path, figure={"name": "p2_f3"})  # a sweep's figure, a single run
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    assert _one_line(capsys).startswith(f"asyncsim: error: {path}: figure.name: 'p2_f3' draws "
                                        "a sweep")
    assert not out.exists()


def test_a_path_that_cannot_be_checked_is_one_line(tmp_path, capsys):
    """A file name too long for the OS: the load's one line, for every verb that reads a
    scenario (asyncsim run checks the path first, for its figure's worker)."""
    path = str(tmp_path / ("a" * 300 + ".toml"))
    for verb in ("run", "trace"):
        assert main([verb, path, "--quiet"]) == 2
        assert "cannot read the file" in _one_line(capsys)


def test_replay_accepts_a_timing_set_that_changes_nothing(tmp_path, capsys):
    path = _scenario(tmp_path, cluster={"learners": 4}, protocol={"kind": "softsync", "n": 2})
    src = tmp_path / "src"
    assert main(["run", str(path), "--out", str(src), "--quiet"]) == 0
    assert main(["replay", str(src), "--set", "protocol.n=2", "--quiet"]) == 0
    assert main(["replay", str(src), "--set", "protocol.n=1", "--out", str(tmp_path / "r"),
                 "--quiet"]) == 2
    assert "protocol.n: is timing" in _one_line(capsys)


def test_a_resumed_sweep_point_keeps_its_sweeps_figure_without_drawing_it(tmp_path):
    """A sweep point's scenario.toml keeps the sweep's [figure] and no [sweep]: resuming it
    runs (the figure is the sweep's to draw), while a fresh run of it is refused."""
    path = _scenario(tmp_path, figure={"name": "p2_f1"}, sweep={"optimizer.lr": [0.05, 0.1]})
    out = tmp_path / "sw"
    assert main(["run", str(path), "--out", str(out), "--quiet", "--no-figure"]) == 0
    point = out / "p000"
    (point / "summary.json").unlink()
    assert main(["run", "--resume", str(point), "--quiet"]) == 0
    assert (point / "summary.json").exists() and not list(point.glob("*.png"))


def test_ray_flags_that_would_be_ignored_are_refused(tmp_path, capsys):
    """`--address` without `--ray`, and `--ray` for a single run (no [sweep]: nothing runs
    as Ray tasks), were silently ignored: one line each, nothing written."""
    path = _scenario(tmp_path)
    out = tmp_path / "out"
    assert main(["run", str(path), "--address", "10.0.0.1:6379", "--out", str(out)]) == 2
    assert "--address: names the Ray cluster that runs a sweep's points: give it with --ray" \
        in _one_line(capsys)
    assert main(["run", str(path), "--ray", "--out", str(out), "--quiet"]) == 2
    assert "--ray: runs a sweep's points as Ray tasks, and this is a single run" \
        in _one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]
