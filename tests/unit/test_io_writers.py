"""The run folder's table writers (asyncsim._io.write_parquet, csv_text): what pandas wrote,
without pandas, so that a run never imports it (0.2 s of every start-up, README "Start-up").
"""

from __future__ import annotations

import io
import math
import subprocess
import sys

import numpy as np
import pandas as pd
from conftest import TINY
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncsim._io import csv_text, dump_toml, read_csv, read_parquet, write_parquet

# Columns as a run writes them (eval.csv: ints, floats with NaN or None from a checkpoint's
# JSON) and as a user's could be (booleans, infinities, -0.0, huge and tiny floats).
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.none())
COLUMNS = st.one_of(st.lists(st.integers(-2**62, 2**62)), st.lists(st.booleans()),
                    st.lists(FLOATS), st.lists(st.one_of(st.integers(-10**6, 10**6), FLOATS)))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 6).flatmap(lambda n: st.tuples(
    st.lists(st.text("abz_, \"", min_size=1, max_size=5), min_size=1, max_size=4,
             unique=True),
    st.lists(COLUMNS.map(lambda c: c[:n] + [c[0] if c else 0] * max(0, n - len(c))),
             min_size=4, max_size=4))))
def test_csv_text_is_what_pandas_writes(table):
    names, cols = table
    columns = {k: c for k, c in zip(names, cols, strict=False)}
    expected = pd.DataFrame(columns).to_csv(index=False)
    assert csv_text(columns) == expected


def test_csv_text_by_hand():
    """A hand-checked table: pandas' layout (NaN and None empty, shortest round-trip floats,
    a lone empty field quoted) and read back to the same numbers."""
    text = csv_text({"version": [0, 5], "loss": [math.nan, 0.1], "t": [1e16, -0.0]})
    assert text == "version,loss,t\n0,,1e+16\n5,0.1,-0.0\n"
    assert csv_text({"x": [None, 2.5]}) == 'x\n""\n2.5\n'
    back = pd.read_csv(io.StringIO(text))
    assert back["loss"].isna().tolist() == [True, False] and back["t"].tolist() == [1e16, 0.0]


def test_write_parquet_reads_back_as_the_table_pandas_wrote(tmp_path):
    """Every dtype a trace holds, NaN and empty tables included: read_parquet gives the
    DataFrame that pandas' own to_parquet gave."""
    rng = np.random.default_rng(0)
    for n in (0, 1, 1000):
        cols = {"learner": rng.integers(0, 30, n).astype(np.int32),
                "batch": rng.integers(0, 2**40, n), "t": rng.random(n),
                "lost": np.where(rng.random(n) < 0.3, np.nan, rng.random(n)),
                "u8": rng.integers(0, 255, n).astype(np.uint8),
                "f32": rng.random(n).astype(np.float32),
                "flag": rng.random(n) < 0.5,
                "strided": rng.integers(0, 9, 2 * n)[::2],
                "big_endian": rng.random(n).astype(">f8")}  # pandas' writer refuses it
        write_parquet(tmp_path / "ours.parquet", cols)
        cols["big_endian"] = cols["big_endian"].astype("<f8")
        pd.DataFrame(cols).to_parquet(tmp_path / "pandas.parquet", index=False)
        ours = read_parquet(tmp_path / "ours.parquet")
        theirs = read_parquet(tmp_path / "pandas.parquet")
        pd.testing.assert_frame_equal(ours, theirs, check_exact=True)
        assert list(ours.columns) == list(cols)
    assert not list(tmp_path.glob(".*tmp"))  # written through the atomic writer


def test_a_run_imports_no_pandas(tmp_path):
    """`asyncsim run` (the online driver, its folder, its summary) never imports pandas; the
    result's DataFrames are made when asked for, equal to the files."""
    (tmp_path / "tiny.toml").write_text(dump_toml(TINY))
    code = f"""
import sys
from asyncsim.cli import main
assert main(["run", {str(tmp_path / "tiny.toml")!r}, "--out", {str(tmp_path / "run")!r},
             "--quiet", "--no-figure"]) == 0
assert "pandas" not in sys.modules, "a run imported pandas"
import asyncsim
from asyncsim.scenario import load_scenario
res = asyncsim.run(load_scenario({str(tmp_path / "tiny.toml")!r}))
assert "pandas" not in sys.modules, "asyncsim.run imported pandas"
print(res.evals.to_csv(index=False), end="")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "run"
    assert r.stdout == (folder / "eval.csv").read_text()
    evals = read_csv(folder / "eval.csv")
    assert evals["version"].tolist() == [0, 10, 20, 30]
    upd = read_parquet(folder / "updates.parquet")
    assert list(upd.columns) == ["version", "time", "n_grads", "start", "train_loss"]
    assert len(upd) == 30 and upd["train_loss"].notna().all()
