"""Run folders read back (asyncsim.results) and traces checked against their recorded hash
(asyncsim.trace): every value a reader uses is checked as it is read, and a trace edited
after its run wrote it never passes for the recorded one."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import TINY, DieAt, Killed, merged

from asyncsim._io import DamagedFile, dump_toml
from asyncsim.cli import main
from asyncsim.results import (
    EVAL_COLUMNS,
    PROVENANCE_FIELDS,
    SUMMARY_FIELDS,
    RunFolder,
    SweepFolder,
)
from asyncsim.trace import Trace


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The kinds of run folder asyncsim writes: an online run (measuring sharpness, with an
    evaluation of the train set), its replay, a timing-only trace with learners going down,
    a sweep of two points."""
    root = tmp_path_factory.mktemp("kinds")
    scn = merged(TINY, run={"updates": 12, "eval_every": 4, "eval_train": True},
                 measure={"initial_sharpness": True, "final_sharpness": True,
                          "sharpness_samples": 32})
    (root / "s.toml").write_text(dump_toml(scn))
    assert main(["run", str(root / "s.toml"), "--out", str(root / "run"), "--quiet"]) == 0
    assert main(["replay", str(root / "run"), "--quiet"]) == 0
    churn = merged(TINY, cluster={"learners": 3, "availability": {
        "up": {"dist": "exponential", "mean": 3.0}, "down": {"dist": "constant", "value": 1.0}}},
        run={"updates": 40})
    (root / "c.toml").write_text(dump_toml(churn))
    assert main(["trace", str(root / "c.toml"), "--out", str(root / "trace"), "--quiet"]) == 0
    sweep = merged(TINY, run={"updates": 6}, sweep={"optimizer.lr": [0.01, 0.02]})
    (root / "w.toml").write_text(dump_toml(sweep))
    assert main(["run", str(root / "w.toml"), "--out", str(root / "sweep"), "--quiet"]) == 0
    return {"run": root / "run", "replay": root / "run" / "replay", "trace": root / "trace",
            "sweep": root / "sweep"}


def test_the_schema_names_every_field_asyncsim_writes(folders):
    """Each summary and provenance field of every kind of folder is checked when read, and
    a folder as written passes its checks (the real run's are in tests/process/test_real.py)."""
    seen = set()
    for kind in ("run", "replay", "trace"):
        run = RunFolder(folders[kind])
        assert set(run.summary) <= set(SUMMARY_FIELDS), (kind, set(run.summary) - set(
            SUMMARY_FIELDS))
        seen |= set(run.summary)
        assert run.provenance["seed"] == 7 and run.recorded["seed"] == 7
        assert run.trace.hash() == run.summary["trace_hash"]
    for point in SweepFolder(folders["sweep"]).points():
        assert set(point.summary) <= set(SUMMARY_FIELDS)
    # The measured, compared and churn fields were among them.
    assert {"initial_sharpness", "final_sharpness", "final_train_error", "matches_source",
            "down_periods", "up_fraction", "environment_changes"} <= seen
    run = RunFolder(folders["run"])
    assert list(run.evals.columns) == list(EVAL_COLUMNS)
    assert run.num_params() == sum(a.size for a in run.params.values()) > 0
    assert run.updates["train_loss"].shape == (12,)


def _copy(src: Path, tmp_path: Path) -> Path:
    dest = tmp_path / src.name
    shutil.copytree(src, dest)
    return dest


def _with(path: Path, **fields) -> None:
    d = json.loads(path.read_text())
    path.write_text(json.dumps({**d, **fields}))


@pytest.mark.parametrize("record,field", [("summary", f) for f in sorted(SUMMARY_FIELDS)]
                         + [("provenance", f) for f in sorted(PROVENANCE_FIELDS)])
def test_every_checked_field_of_the_wrong_type_is_one_line(folders, tmp_path, record, field):
    """A table where a field holds anything else: every field summary.json and
    provenance.json are checked for is refused, naming the file and the field."""
    run_dir = _copy(folders["run"], tmp_path)
    _with(run_dir / f"{record}.json", **{field: {"a": [1]}})
    with pytest.raises(DamagedFile, match=rf"{record}.json: damaged \({field}: "
                                          r"(must be|unknown driver \{'a': \[1\]\}; allowed)"):
        getattr(RunFolder(run_dir), record)


@pytest.mark.parametrize("field,value,why", [
    ("updates", -1, "must be an integer >= 0"),
    ("updates", 2.5, "must be an integer >= 0"),
    ("diverged", "no", "must be true or false"),
    ("final_test_error", 1.5, r"must be an error rate in \[0, 1\]"),
    ("staleness_mean", "inf", "must be a finite number >= 0"),
    ("up_fraction", 1.2, r"must be a fraction in \[0, 1\]"),
    ("final_train_loss", "NaN", "must be a number"),
])
def test_out_of_range_summary_values_are_refused(folders, tmp_path, field, value, why):
    run_dir = _copy(folders["run"], tmp_path)
    _with(run_dir / "summary.json", **{field: value})
    with pytest.raises(DamagedFile, match=rf"{field}: {why}"):
        RunFolder(run_dir).summary  # noqa: B018


def test_what_json_wrote_for_a_failed_measurement_reads_as_a_number(folders, tmp_path):
    """jsonable writes NaN as null and infinities as "inf"/"-inf": read back as floats."""
    run_dir = _copy(folders["run"], tmp_path)
    _with(run_dir / "summary.json", final_train_loss="inf", final_sharpness=None,
          lr_at_mean_tau="-inf")
    s = RunFolder(run_dir).summary
    assert s["final_train_loss"] == math.inf and s["lr_at_mean_tau"] == -math.inf
    assert math.isnan(s["final_sharpness"])
    with pytest.raises(DamagedFile, match="no field lr_at_tau"):
        RunFolder(run_dir).summary_value("lr_at_tau")


@pytest.mark.parametrize("column,value,why", [
    ("version", "abc", "holds object values"),
    ("gradients", -3, "holds -3 at row 0; allowed: finite numbers >= 0"),
    ("sim_time", float("inf"), "holds inf at row 0"),
    ("test_error", 2.0, r"holds 2.0 at row 0; allowed: errors in \[0, 1\]"),
])
def test_eval_columns_are_checked(folders, tmp_path, column, value, why):
    run_dir = _copy(folders["run"], tmp_path)
    ev = pd.read_csv(run_dir / "eval.csv")
    ev[column] = ev[column].astype(object)
    ev.loc[0, column] = value
    ev.to_csv(run_dir / "eval.csv", index=False)
    with pytest.raises(DamagedFile, match=rf"eval.csv: damaged \(column {column} {why}"):
        RunFolder(run_dir).evals  # noqa: B018


def test_an_eval_csv_of_a_header_only_is_no_rows(folders, tmp_path):
    run_dir = _copy(folders["run"], tmp_path)
    ev = pd.read_csv(run_dir / "eval.csv")
    ev.iloc[:0].to_csv(run_dir / "eval.csv", index=False)
    evals = RunFolder(run_dir).evals
    assert len(evals) == 0 and list(evals.columns) == list(ev.columns)


def test_a_diverged_runs_losses_may_be_nan_or_infinite(folders, tmp_path):
    run_dir = _copy(folders["run"], tmp_path)
    ev = pd.read_csv(run_dir / "eval.csv")
    ev.loc[1, "train_loss"], ev.loc[2, "test_loss"] = np.inf, np.nan
    ev.to_csv(run_dir / "eval.csv", index=False)
    assert np.isinf(RunFolder(run_dir).evals["train_loss"].iloc[1])


def test_a_scenario_key_and_a_plugin_option_of_the_wrong_type(folders, tmp_path):
    run_dir = _copy(folders["run"], tmp_path)
    text = (run_dir / "scenario.toml").read_text()
    (run_dir / "scenario.toml").write_text(text.replace("learners = 3", "learners = \"three\""))
    with pytest.raises(DamagedFile, match=r"scenario.toml: damaged \(cluster.learners: must"):
        RunFolder(run_dir).recorded  # noqa: B018
    (run_dir / "scenario.toml").write_text(text.replace("n_train = 256", "n_train = \"many\""))
    run = RunFolder(run_dir)
    assert run.recorded["data"]["n_train"] == "many"  # a data set's option: not the schema's
    with pytest.raises(DamagedFile, match="data.n_train: must be a positive integer"):
        run.value("data.n_train", None, lambda k, v: _positive_int(k, v))
    assert run.value("protocol.n", 4, _positive_int) == 4  # not set: the default, checked
    # A TOML date (no asyncsim value is one) is damage, not a traceback of the TOML writer.
    assert "\nfigure = {}\n" in text
    (run_dir / "scenario.toml").write_text(text.replace("\nfigure = {}\n",
                                                        "\nfigure = { when = 1979-05-27 }\n"))
    with pytest.raises(DamagedFile, match=r"scenario.toml: damaged \(figure.when: is a TOML "):
        RunFolder(run_dir).value("figure.when", None, lambda k, v: v)


def _positive_int(key, v):
    from asyncsim import _checks

    return _checks.integer(key, v)


@pytest.mark.parametrize("name", ["../elsewhere", "/etc", "a/b", ".", "..", ""])
def test_a_sweeps_point_names_are_plain_folder_names(folders, tmp_path, name):
    sweep = _copy(folders["sweep"], tmp_path)
    index = pd.read_csv(sweep / "index.csv")
    index.loc[0, "point"] = name
    index.to_csv(sweep / "index.csv", index=False)
    with pytest.raises(DamagedFile, match="point: .*allowed: a folder name"):
        list(SweepFolder(sweep).points())


# ----------------------------------------------------------------------------- trace hashes
def _edit_one_learner(folder: Path) -> None:
    """Rewrite trace_grads.parquet with one gradient's learner id changed: another valid
    trace, same schema."""
    table = pq.read_table(folder / "trace_grads.parquet")
    learners = table.column("learner").to_numpy().copy()
    learners[3] = (learners[3] + 1) % 3
    i = table.schema.get_field_index("learner")
    table = table.set_column(i, table.schema.field(i), [learners])
    pq.write_table(table, folder / "trace_grads.parquet")


def test_an_edited_trace_is_refused_by_replay_and_nothing_is_written(folders, tmp_path,
                                                                      capsys):
    run_dir = _copy(folders["run"], tmp_path)
    shutil.rmtree(run_dir / "replay")
    _edit_one_learner(run_dir)
    before = sorted(p.name for p in run_dir.iterdir())
    capsys.readouterr()
    assert main(["replay", str(run_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (
        f"{run_dir / 'trace_grads.parquet'}: does not match its recorded trace_hash" in err), err
    assert "in trace_meta.json" in err and sorted(p.name for p in run_dir.iterdir()) == before


def test_the_hash_is_checked_against_each_record(folders, tmp_path):
    """trace_meta.json's hash, and the summary's where the meta has none (a folder written
    before traces recorded it); a trace saved again by other code keeps its identity."""
    run_dir = _copy(folders["run"], tmp_path)
    trace = Trace.load(run_dir)
    meta = json.loads((run_dir / "trace_meta.json").read_text())
    assert meta["trace_hash"] == trace.hash()
    del meta["trace_hash"]
    (run_dir / "trace_meta.json").write_text(json.dumps(meta))
    assert Trace.load(run_dir).hash() == trace.hash()
    _with(run_dir / "summary.json", trace_hash="0" * 64)
    with pytest.raises(DamagedFile, match="000000000000… in summary.json"):
        Trace.load(run_dir)
    _with(run_dir / "summary.json", trace_hash=17)
    with pytest.raises(DamagedFile, match="trace_hash in summary.json is 17; allowed: a SHA"):
        Trace.load(run_dir)
    # Neither record: nothing to check the tables against (an edit with its hashes deleted).
    _with(run_dir / "summary.json", trace_hash=None)
    with pytest.raises(DamagedFile, match="trace_meta.json: damaged \\(no trace_hash here or "
                                          "in summary.json"):
        Trace.load(run_dir)
    # Re-encoded by pandas, column for column: the same trace.
    run_dir = _copy(folders["trace"], tmp_path / "again")
    df = pd.read_parquet(run_dir / "trace_grads.parquet")
    df.to_parquet(run_dir / "trace_grads.parquet", index=False)
    assert Trace.load(run_dir).hash() == RunFolder(run_dir).summary["trace_hash"]


def test_an_edited_shared_trace_of_a_sweep_is_simulated_again(tmp_path):
    """A sweep resumed over an edited shared trace does not reuse it (sweep._group_trace)."""
    scn = merged(TINY, run={"updates": 6}, cluster={"seed": 3}, sweep={"seed": [1, 2]})
    (tmp_path / "w.toml").write_text(dump_toml(scn))
    out = tmp_path / "sweep"
    assert main(["run", str(tmp_path / "w.toml"), "--out", str(out), "--quiet"]) == 0
    shared = [p for p in out.rglob("trace_meta.json") if not (p.parent / "eval.csv").exists()]
    assert shared, "no shared trace in this sweep"
    first = pd.read_csv(out / "index.csv")
    for meta in shared:
        _edit_one_learner(meta.parent)
    for p in out.iterdir():  # its points must be redone: remove their results
        if (p / "eval.csv").exists():
            shutil.rmtree(p)
    assert main(["run", str(tmp_path / "w.toml"), "--out", str(out), "--quiet"]) == 0
    again = pd.read_csv(out / "index.csv")
    assert again["param_hash"].tolist() == first["param_hash"].tolist()
    for meta in shared:
        Trace.load(meta.parent)  # simulated again: it matches its hash


def test_a_real_checkpoints_trace_is_checked_before_a_resume(tmp_path):
    """A real run's checkpoint carries the trace so far and its hash
    (drivers.real.ps._RealDriver); check_checkpoint refuses one whose trace was edited."""
    from asyncsim.api import run
    from asyncsim.drivers.checkpoint import CKPT, check_checkpoint, checkpoint_trace
    from asyncsim.scenario import load_scenario

    scn = load_scenario(merged(TINY, run={"updates": 12, "checkpoint_every": 3}))
    out = tmp_path / "unfinished"
    with pytest.raises(Killed):
        run(scn, out=out, monitor=DieAt(7))
    path = out / CKPT
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays["meta"]).decode())
    trace = {"grads": {"learner": [0, 1], "batch": [0, 0], "read_version": [0, 0],
                       "apply_version": [0, 1], "staleness": [0, 1], "t_pull": [0.0, 0.0],
                       "t_push": [1.0, 1.5], "t_arrive": [1.0, 1.5], "t_apply": [1.0, 1.5]},
             "updates": {"version": [0, 1], "time": [1.0, 1.5], "n_grads": [1, 1],
                         "start": [0, 1]}}

    def save(trace_hash):
        meta["extra"].update(trace=trace, trace_hash=trace_hash)
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        np.savez(path, **arrays)

    save(checkpoint_trace(trace).hash())
    check_checkpoint(out, scn)
    trace["grads"]["learner"][1] = 2
    save(meta["extra"]["trace_hash"])
    with pytest.raises(DamagedFile, match="checkpoint.npz: does not match its recorded "
                                          "trace_hash .*pass --force to start over"):
        check_checkpoint(out, scn)


# ------------------------------------------------------------------------ open_run, open_sweep
def test_open_run_reads_every_kind_of_folder_without_jax(folders):
    """A notebook's view of run folders: nothing here imports JAX, the parameters included
    (checked in a fresh process)."""
    import subprocess
    import sys

    code = ("import sys, asyncsim; r = asyncsim.open_run(sys.argv[1]); "
            "print(r.kind, r.state, r.summary['updates'], len(r.evals), r.trace.num_updates, "
            "len(r.params), len(r.updates), 'jax' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, str(folders["run"])], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["online", "complete", "12", "4", "12", "4", "12", "False"]
    import asyncsim

    replay = asyncsim.open_run(folders["replay"])
    assert (replay.kind, replay.summary["matches_source"]) == ("replay", True)
    trace = asyncsim.open_run(folders["trace"])
    assert trace.kind == "trace" and trace.trace.num_down > 0 and not trace.has_evals


def test_open_run_and_open_sweep_refuse_what_they_are_not(folders, tmp_path):
    import asyncsim
    from asyncsim.runs import RunFolderError

    with pytest.raises(RunFolderError, match="a sweep folder; use asyncsim.open_sweep"):
        asyncsim.open_run(folders["sweep"])
    with pytest.raises(RunFolderError, match="a run folder, not a sweep"):
        asyncsim.open_sweep(folders["run"])
    with pytest.raises(RunFolderError, match="no such folder"):
        asyncsim.open_run(tmp_path / "nothing")
    (tmp_path / "notes").mkdir()
    with pytest.raises(RunFolderError, match="not a run folder"):
        asyncsim.open_run(tmp_path / "notes")


def test_open_sweep_is_one_row_per_point_with_its_keys_and_every_summary_scalar(folders):
    import asyncsim

    sweep = asyncsim.open_sweep(folders["sweep"])
    assert sweep.keys == ["optimizer.lr"]
    t = sweep.table
    assert t["point"].tolist() == ["p000", "p001"] and t["optimizer.lr"].tolist() == [0.01, 0.02]
    index = pd.read_csv(folders["sweep"] / "index.csv")
    for col in ("final_test_error", "staleness_p99", "param_hash", "updates"):
        assert t[col].tolist() == index[col].tolist(), col  # the index has every scalar too
    for run, row in zip(sweep.points(), t.itertuples(), strict=True):
        assert row.final_test_error == run.summary["final_test_error"]
    ev = sweep.evals()
    assert list(ev.columns[:2]) == ["point", "optimizer.lr"] and len(ev) == 2 * 2
    last = ev.groupby("optimizer.lr")["test_error"].last()
    assert last.tolist() == t["final_test_error"].tolist()


@pytest.mark.parametrize("columns,column,value,why", [
    ("edges", "beta", 1.5, "allowed: momentum factors beta with |beta| < 1"),
    ("edges", "tau", -1, "allowed: finite numbers >= 0"),
    ("sharpness", "lr", 0.0, "allowed: finite numbers > 0"),
    ("sharpness", "tau", -2.0, "allowed: finite numbers >= 0, or empty"),
])
def test_table_values_out_of_range_are_refused(tmp_path, columns, column, value, why):
    """The ranges a figure relies on (a closed-form edge needs |beta| < 1, a rate is
    positive), checked as the table is read."""
    from asyncsim.results import EDGES_COLUMNS, SHARPNESS_COLUMNS, checked_table

    kinds = {"edges": EDGES_COLUMNS, "sharpness": SHARPNESS_COLUMNS}[columns]
    good = {"tau": 2, "beta": 0.9, "lr": 0.1}
    df = pd.DataFrame({column: [value, good[column]]})
    checked_table(pd.DataFrame({column: [good[column]] * 2}), kinds, tmp_path / "t.csv",
                  required=(column,))
    # A protocol without a fixed delay writes no staleness for the sharpness table: NaN.
    checked_table(pd.DataFrame({"tau": [math.nan] * 2}), SHARPNESS_COLUMNS, tmp_path / "s.csv",
                  required=("tau",))
    with pytest.raises(DamagedFile, match=rf"t.csv: damaged \(column {column} holds "
                                          rf"{value!r} at row 0; {re.escape(why)}"):
        checked_table(df, kinds, tmp_path / "t.csv", required=(column,))
