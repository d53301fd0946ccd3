"""Bad values found by a sweep of extreme inputs: each is one line naming the file and the key
(exit 2, no traceback, no hang) and leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_bad_input import _one_line, _scenario

from asyncsim.cli import main

TRACE = {"updates": 30, "trace_only": True}


def _refused(tmp_path: Path, capsys, verb: str, key: str, *extra: str, **tables) -> str:
    """``asyncsim VERB`` of TINY with ``tables`` is refused in one line naming ``key``, and
    writes nothing."""
    path = _scenario(tmp_path, **tables)
    out = tmp_path / "out"
    args = [verb, str(path), "--out", str(out), "--quiet", *extra]
    if verb == "run":
        args.append("--no-figure")
    assert main(args) == 2
    err = _one_line(capsys)
    assert f"{path}: {key}: " in err or f": {key}: " in err, err
    assert not out.exists()
    return err


# ----------------------------------------------------------------------------- 1. name
@pytest.mark.parametrize("name", ["../../escape", "ABS", "", ".", ".hidden", "a\x00b", "a\nb",
                                  "a/b", "x" * 101])
def test_a_name_is_one_safe_folder_name(tmp_path, capsys, monkeypatch, name):
    """`name` is the folder under runs/: a path, an empty or dot name, a NUL or newline would
    write outside runs/, into runs/seed0 or fail with a traceback."""
    if name == "ABS":
        name = str(tmp_path / "abs")
    work = tmp_path / "work"
    work.mkdir()
    path = _scenario(work, name=name, run=TRACE)
    monkeypatch.chdir(work)
    assert main(["trace", str(path), "--quiet"]) == 2
    assert f"{path}: name: names the run folder" in _one_line(capsys)
    assert sorted(os.listdir(tmp_path)) == ["work"] and os.listdir(work) == ["s.toml"]


def test_names_that_are_folder_names_still_run(tmp_path):
    path = _scenario(tmp_path, name="p1_f3-lr.modulation", run=TRACE)
    assert main(["trace", str(path), "--out", str(tmp_path / "t"), "--quiet"]) == 0


# ----------------------------------------------------------------------------- 2. normal draw
@pytest.mark.parametrize("loc,scale,key", [(1.0, 1e-300, "protocol.scale"),
                                           (1e300, 1.0, "protocol.loc"),
                                           (1e308, 1e-300, "protocol.loc"),
                                           (2.0, 1e7, "protocol.scale")])
def test_the_normal_schedule_bounds_loc_and_scale(tmp_path, capsys, loc, scale, key):
    """Before: OverflowError or `max() arg is an empty sequence` from the draw."""
    err = _refused(tmp_path, capsys, "trace", key,
                   protocol={"kind": "fixed-delay", "tau": 2, "schedule": "normal",
                             "loc": loc, "scale": scale},
                   cluster={"learners": 3}, run=TRACE)
    assert "must be a finite number" in err and "..1e+06 (staleness units" in err


# ----------------------------------------------------------------------------- 3. inf time
@pytest.mark.parametrize("cluster,key", [
    ({"learners": 3, "compute": {"dist": "constant", "value": 1e308}}, "cluster.compute"),
    ({"learners": 3, "network": {"push": {"bandwidth": 1e-320}}},
     "cluster.network.push.bandwidth"),
    ({"learners": 3, "network": {"ps_egress": {"bandwidth": 1e-320}}},
     "cluster.network.ps_egress.bandwidth"),
])
def test_times_that_are_not_finite_are_refused(tmp_path, capsys, cluster, key):
    """Before: accepted, and summary.json said sim_time = inf."""
    _refused(tmp_path, capsys, "trace", key, cluster=cluster, run=TRACE)


# ----------------------------------------------------------------------------- 4. livelock
@pytest.mark.parametrize("how", ["constant", "empirical"])
def test_time_that_stands_still_stops_a_sim_time_run(tmp_path, capsys, how):
    """Zero compute times never reach run.sim_time (before: the run never ended)."""
    (tmp_path / "zeros.csv").write_text("t\n" + "0.0\n" * 5)
    compute = ({"dist": "constant", "value": 0.0} if how == "constant"
               else {"dist": "empirical", "path": "zeros.csv"})
    err = _refused(tmp_path, capsys, "trace", "cluster.compute",
                   cluster={"learners": 3, "compute": compute},
                   run={"sim_time": 1.0, "trace_only": True})
    assert "stands still at t = 0" in err and "run.sim_time = 1" in err


def test_zero_times_with_a_run_length_in_updates_still_run(tmp_path):
    path = _scenario(tmp_path, cluster={"learners": 3,
                                        "compute": {"dist": "constant", "value": 0.0}},
                     run={"updates": 20_000, "trace_only": True})
    assert main(["trace", str(path), "--out", str(tmp_path / "t"), "--quiet"]) == 0


# ----------------------------------------------------------------------------- 5. sizes
@pytest.mark.parametrize("hidden", [100_000_000_000, 10**7, 2**70])
def test_a_model_too_big_for_the_machine_is_refused(tmp_path, capsys, hidden):
    """Before: XLA aborted (C++ stack trace, rc -6) or `TypeError: get(): incompatible
    function arguments`."""
    err = _refused(tmp_path, capsys, "run", "model.hidden",
                   model={"name": "mlp", "hidden": [hidden]})
    assert "the model does not fit in this machine's memory" in err


def test_an_mlp_deeper_than_xla_compiles_in_time_is_refused(tmp_path, capsys):
    """Before: 5,000 hidden layers of width 2 compiled for minutes, then XLA aborted."""
    err = _refused(tmp_path, capsys, "run", "model.hidden",
                   model={"name": "mlp", "hidden": [2] * 5000})
    assert "at most 100 layers, got 5000" in err


@pytest.mark.parametrize("model,key,words", [
    ({"name": "mlp", "hidden": [-1]}, "model.hidden", "positive integers"),
    ({"name": "mlp", "hidden": [8], "activation": "foo"}, "model.activation", "relu, tanh"),
])
def test_a_trace_refuses_the_model_values_a_run_refuses(tmp_path, capsys, model, key, words):
    """`asyncsim trace` never uses the model, but the scenario is the one a run would take:
    the [model] table is built when the scenario is checked, so both refuse it alike."""
    for verb in ("trace", "run"):
        assert words in _refused(tmp_path, capsys, verb, key, model=model)


@pytest.mark.parametrize("data", [{"name": "synthetic-cifar", "batch_size": 8,
                                   "n_train": 1_000_000_000, "n_test": 64},
                                  {"name": "gaussian", "batch_size": 8, "n_train": 10**12}])
def test_a_data_set_too_big_for_the_machine_is_refused_before_it_is_made(tmp_path, capsys,
                                                                          data):
    """n_train = 1e9 used to pass (each allocation fit, then 10^9 labels were shuffled for
    minutes); 1e8 was refused only because one allocation failed."""
    model = ({"name": "quadratic", "eigenvalues": [1.0]} if data["name"] == "gaussian"
             else {"name": "mlp", "hidden": [16]})
    err = _refused(tmp_path, capsys, "run", "data.n_train", data=data, model=model)
    assert "the data set does not fit in this machine's memory: it needs about" in err


# ----------------------------------------------------------------------------- 6. 64 bits
@pytest.mark.parametrize("tables,key", [
    ({"protocol": {"kind": "ssp", "s": 2**70}}, "protocol.s"),
    ({"run": {**TRACE, "eval_every": 2**70}}, "run.eval_every"),
    ({"run": {**TRACE, "checkpoint_every": 2**70}}, "run.checkpoint_every"),
    ({"measure": {"sharpness_points": 2**70}}, "measure.sharpness_points"),
    ({"measure": {"sharpness_samples": -(2**70)}}, "measure.sharpness_samples"),
    ({"optimizer": {"lr": 0.05, "schedule": {"warmup_updates": 2**70}}},
     "optimizer.schedule.warmup_updates"),
])
def test_integers_beyond_64_bits_are_refused(tmp_path, capsys, tables, key):
    err = _refused(tmp_path, capsys, "trace", key, **tables)
    assert "must be a 64-bit integer" in err


# ----------------------------------------------------------------------------- 7. optimizer
@pytest.mark.parametrize("optimizer,key,words", [
    ({"transform": {"name": "adam", "b1": 2.0}}, "optimizer.transform.b1", "in [0, 1)"),
    ({"transform": {"name": "adam", "eps": -1.0}}, "optimizer.transform.eps", "a positive number"),
    ({"lr": 1e308}, "optimizer.lr", "float32"),
    ({"lr_rule": {"name": "polynomial", "a": 1e308}}, "optimizer.lr_rule.a", "float32"),
    ({"schedule": {"decay_epochs": [1, 2], "decay_factor": 1e30}},
     "optimizer.schedule.decay_factor", "float32"),
])
def test_optimizer_values_that_mean_nothing_are_refused(tmp_path, capsys, optimizer, key,
                                                        words):
    """Before: accepted (numpy's overflow RuntimeWarnings for the float32 ones)."""
    err = _refused(tmp_path, capsys, "trace", key, optimizer={"lr": 0.05, **optimizer},
                   run=TRACE)
    assert words in err


def test_no_momentum_takes_any_beta_and_eps_zero_where_it_is_the_default(tiny):
    # A beta beside kind "none" is unused, not wrong: a sweep over momentum.kind keeps one
    # beta for all its points (tests/unit/test_engine.py's replay grid does).
    tiny(optimizer={"lr": 0.05, "momentum": {"kind": "none", "beta": 0.5}})
    tiny(optimizer={"lr": 0.05, "transform": {"name": "lars", "eps": 0.0}})


def test_more_eval_samples_than_the_test_set_evaluate_all_of_it(tiny):
    """By design (README, [run]): eval_samples caps an evaluation, so a larger number than
    the test set holds (64) evaluates the whole test set."""
    from asyncsim.api import run

    run_ = {"updates": 4, "eval_every": 2}
    capped = run(tiny(run={**run_, "eval_samples": 10_000})).evals
    whole = run(tiny(run=run_)).evals
    assert capped["test_loss"].tolist() == whole["test_loss"].tolist()


# ----------------------------------------------------------------------------- 8. sweeps
@pytest.mark.parametrize("sweep,key", [
    ({"figure.name": ["os", "sys"]}, "sweep.figure.name"),
    ({"sweep": [{"optimizer.lr": 0.1}, {"optimizer.lr": 0.2}]}, "sweep.sweep"),
    ({"sweep.x": [[0.1, 0.2]]}, "sweep.sweep.x"),
    ({"optimizer.lr": [0.1, 0.1]}, "sweep.optimizer.lr"),
    ({"optimizer.lr": [1, 1.0]}, "sweep.optimizer.lr"),  # the same float
])
def test_sweep_axes_are_checked_as_their_keys(tmp_path, capsys, sweep, key):
    """Before: run, writing points that cannot be rerun (an unknown figure), a nested sweep
    that was dropped, or the same point twice."""
    _refused(tmp_path, capsys, "run", key, sweep=sweep, run=TRACE)


@pytest.mark.parametrize("select", [[], ["--profile", "smoke"]])
def test_every_profile_is_checked_when_the_file_loads(tmp_path, capsys, select):
    """A profile that is not selected is still checked (before: only with --profile)."""
    _refused(tmp_path, capsys, "trace", "profiles.paper.cluster.learners", *select,
             profiles={"smoke": {"run": {"updates": 5}},
                       "paper": {"cluster": {"learners": -1}}}, run=TRACE)


def test_a_profile_breaking_a_key_it_does_not_set_says_which_profile(tmp_path, capsys):
    err = _refused(tmp_path, capsys, "trace", "protocol.n",
                   protocol={"kind": "softsync", "n": 3},
                   profiles={"smoke": {"cluster": {"learners": 2}}}, run=TRACE)
    assert "(in profile 'smoke')" in err


# ----------------------------------------------------------------------------- 9. source
def test_source_is_refused_from_set_as_from_a_file(tmp_path, capsys):
    path = _scenario(tmp_path, run=TRACE)
    assert main(["trace", str(path), "--set", "source='x'", "--out", str(tmp_path / "t"),
                 "--quiet"]) == 2
    assert "--set source=x: source: is set by asyncsim" in _one_line(capsys)
    assert not (tmp_path / "t").exists()


def test_a_set_value_nested_too_deeply_is_one_line(tmp_path, capsys):
    """Before: `--set seed=[[[...]]]` 1,000 deep was a RecursionError traceback from tomllib."""
    path = _scenario(tmp_path, run=TRACE)
    deep = "[" * 1000 + "]" * 1000
    assert main(["trace", str(path), "--set", f"seed={deep}", "--out", str(tmp_path / "t"),
                 "--quiet"]) == 2
    assert "seed: the value is nested too deeply" in _one_line(capsys)
    assert not (tmp_path / "t").exists()


def test_an_integer_beyond_float_range_for_a_number_is_one_line(tmp_path, capsys):
    """Before: `optimizer.lr = 1000...0` (401 digits) was an OverflowError traceback."""
    err = _refused(tmp_path, capsys, "trace", "optimizer.lr", optimizer={"lr": 10**400},
                   run=TRACE)
    assert "must be a number, got an integer of 401 digits, beyond float range" in err


# ----------------------------------------------------------------------------- 8. files and sets
def test_files_a_scenario_names_are_read_as_what_they_should_be(tmp_path, capsys):
    """An empirical CSV with a field beyond csv's limit or not UTF-8, a CIFAR10 path at a
    FIFO (opening it blocks) or at /dev/zero (it never ends): one line each."""
    big = tmp_path / "big.csv"
    big.write_text("d\n" + "1" * 200_000 + "\n")
    latin = tmp_path / "latin.csv"
    latin.write_bytes("d\n1.0\n\xe9\n".encode("latin-1"))
    for csv_file in (big, latin):
        err = _refused(tmp_path, capsys, "trace", "cluster.compute.path",
                       cluster={"learners": 2, "compute": {"dist": "empirical",
                                                           "path": str(csv_file)}})
        assert f"{str(csv_file)!r} is not a CSV file of UTF-8 text" in err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        err = _refused(tmp_path, capsys, "run", "data",
                       data={"name": "cifar10", "path": str(path), "batch_size": 4})
        assert f"{path}: not a regular file" in err


@pytest.mark.parametrize("item,says", [
    ("optimizer.lr=0.1\n[cluster]\nlearners=0", "optimizer.lr: one value only: give each key "
     "its own --set (the value went on to set cluster)"),
    ("optimizer..lr=1", "optimizer..lr: must be a dotted key"),
    ('"optimizer.lr"=1', '"optimizer.lr": must be a dotted key'),
    ('sweep."protocol.n=[1]', 'sweep."protocol.n: must be a dotted key'),
])
def test_a_set_is_one_key_and_one_value(tmp_path, capsys, item, says):
    """A --set whose value goes on over lines would set other tables, which no key reads;
    a key with quotes or an empty part is named as the --set's, not the file's."""
    path = _scenario(tmp_path)
    assert main(["trace", str(path), "--out", str(tmp_path / "out"), "--set", item]) == 2
    assert f"asyncsim: error: --set: {says}" in _one_line(capsys)
    assert not (tmp_path / "out").exists()
    # An array may still span lines.
    assert main(["trace", str(path), "--out", str(tmp_path / "ok"), "--quiet",
                 "--set", "sweep.seed=[1,\n 2]"]) == 0


def test_a_sweep_says_at_which_point_a_run_stopped(tmp_path, capsys):
    """A value only a run can find wrong (times that overflow) stops the sweep in one line
    naming the point; the points before it are complete, and its index lists them once."""
    from asyncsim import open_sweep

    path = _scenario(tmp_path, run={"updates": 10}, sweep={"cluster.compute": [
        {"dist": "constant", "value": 1.0}, {"dist": "constant", "value": 1e308}]})
    out = tmp_path / "sw"
    assert main(["trace", str(path), "--out", str(out), "--quiet"]) == 2
    assert f"(at point p001, {out / 'p001'})" in _one_line(capsys)
    assert list(open_sweep(out).table["point"]) == ["p000"]
    index = (out / "index.csv").read_text().splitlines()
    (out / "index.csv").write_text("\n".join([*index, index[1]]) + "\n")  # p000 twice
    with pytest.raises(ValueError, match="index.csv: damaged \\(point p000 listed twice"):
        _ = open_sweep(out).table


def test_errors_name_the_key_that_set_the_value(tmp_path, capsys):
    """A bad key of the selected profile is named under the profile (not as the file's own
    `run.updatez`), a value a --set gives under the --set, and `stability --tau` beyond the
    workers --measure can simulate as `--tau` (not `cluster.learners`)."""
    path = _scenario(tmp_path, profiles={"smoke": {"run": {"updatez": 3}}})
    assert main(["trace", str(path), "--profile", "smoke", "--out", str(tmp_path / "o")]) == 2
    assert f"{path}: profiles.smoke.run.updatez: unknown key" in _one_line(capsys)
    path = _scenario(tmp_path, profiles={"smoke": {"run": {"updates": 3}}})
    assert main(["trace", str(path), "--profile", "smoke", "--out", str(tmp_path / "o"),
                 "--set", "run.updates=-1"]) == 2
    assert "--set run.updates=-1: run.updates: must be a positive" in _one_line(capsys)
    assert main(["stability", "--tau", "100000", "--measure"]) == 2
    assert ("asyncsim stability: --tau: --measure simulates tau + 1 workers: at most 99999, "
            "got 100000") in _one_line(capsys)


def test_an_index_never_lends_a_point_other_keys(tmp_path):
    """index.csv names each point's keys; a cell edited (or a point replaced by hand) that
    contradicts the point's own scenario.toml is refused, naming the point and the key."""
    import pandas as pd

    from asyncsim import open_sweep

    path = _scenario(tmp_path, run={"updates": 10}, sweep={"optimizer.lr": [0.01, 0.02]})
    out = tmp_path / "sw"
    assert main(["trace", str(path), "--out", str(out), "--quiet"]) == 0
    assert list(open_sweep(out).table["optimizer.lr"]) == [0.01, 0.02]
    index = pd.read_csv(out / "index.csv")
    for cell in ("abc", 0.5):
        index["optimizer.lr"] = index["optimizer.lr"].astype(object)
        index.loc[1, "optimizer.lr"] = cell
        index.to_csv(out / "index.csv", index=False)
        with pytest.raises(ValueError, match=f"index.csv: damaged \\(point p001: optimizer.lr "
                                             f"= {cell!r}, but its scenario.toml has 0.02"):
            _ = open_sweep(out).table
