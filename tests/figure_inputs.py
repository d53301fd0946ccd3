"""Wrong-typed values in the run folders a figure reads: every figure module refuses each one
in one line (exit 2) naming the file and the field, and draws nothing.

The figure test files (tests/cli/test_*figure*.py) call :func:`assert_refused` on the smoke
runs they already made, one case per figure module and damage of :data:`DAMAGES`: a
``summary.json`` field, a ``scenario.toml`` key, a ``provenance.json`` field, an
``eval.csv`` or ``updates.parquet`` column, a plug-in option the figure reads (``protocol.n``,
``protocol.tau``, a compute time's mean), each given a value of the wrong type, in every
point of a copy of the runs.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from asyncsim._io import dump_toml
from asyncsim.cli import main


def _json_field(name: str, value) -> Callable[[Path], bool]:
    def damage(path: Path) -> bool:
        d = json.loads(path.read_text())
        if name not in d:
            return False
        path.write_text(json.dumps({**d, name: value}))
        return True
    return damage


def _toml_key(key: str, value) -> Callable[[Path], bool]:
    def damage(path: Path) -> bool:
        d = tomllib.loads(path.read_text())
        *tables, leaf = key.split(".")
        node = d
        for t in tables:
            node = node.get(t)
            if not isinstance(node, dict):
                return False
        if leaf not in node:
            return False
        node[leaf] = value
        path.write_text(dump_toml(d))
        return True
    return damage


def _column(name: str, reader, writer) -> Callable[[Path], bool]:
    def damage(path: Path) -> bool:
        df = reader(path)
        if name not in df.columns or df.empty:
            return False
        df[name] = df[name].astype(object)
        df.loc[df.index[0], name] = "abc"
        writer(df.astype({name: str}), path)
        return True
    return damage


_csv = _column  # (named for the cases below)

# damage name -> (file, field named in the message, how to damage a point's file)
DAMAGES: dict[str, tuple[str, str, Callable[[Path], bool]]] = {
    "summary": ("summary.json", "updates", _json_field("updates", "many")),
    "scenario": ("scenario.toml", "seed", _toml_key("seed", "zero")),
    "provenance": ("provenance.json", "scenario_file",
                   _json_field("scenario_file", ["a.toml", "b.toml"])),
    "eval": ("eval.csv", "version",
             _csv("version", pd.read_csv, lambda df, p: df.to_csv(p, index=False))),
    "updates": ("updates.parquet", "train_loss",
                _column("train_loss", pd.read_parquet,
                        lambda df, p: df.to_parquet(p, index=False))),
    "protocol.n": ("scenario.toml", "protocol.n", _toml_key("protocol.n", "four")),
    "protocol.tau": ("scenario.toml", "protocol.tau", _toml_key("protocol.tau", "eight")),
    "compute.mean": ("scenario.toml", "cluster.compute.mean",
                     _toml_key("cluster.compute.mean", "fast")),
    "edges": ("edges.csv", "measured",
              _csv("measured", pd.read_csv, lambda df, p: df.to_csv(p, index=False))),
}


def _copy_runs(name: str, source: Path, runs: Path, also: dict[str, Path]) -> Path:
    """``source`` where ``asyncsim figures NAME --runs RUNS --profile smoke`` finds it
    (a sweep as RUNS/NAME-smoke, one run as RUNS/NAME-smoke/seedN), and ``also`` (other
    sweeps a figure reads, by folder name) beside it; the copy of ``source``."""
    if (source / "summary.json").exists():
        dest = runs / f"{name}-smoke" / "seed0"
    else:
        dest = runs / f"{name}-smoke"
    shutil.copytree(source, dest)
    for folder, path in also.items():
        shutil.copytree(path, runs / folder)
    return dest


def _damage_all(root: Path, file: str, damage: Callable[[Path], bool]) -> int:
    """Apply ``damage`` to ``file`` in ``root`` and every folder below it; how many."""
    return sum(damage(p) for p in sorted(root.rglob(file)))


def assert_refused(name: str, source: Path, which: str, tmp_path: Path, capsys, *,
                   also: dict[str, Path] | None = None) -> str:
    """Damage a copy of ``source`` (the runs of figure ``name``) as :data:`DAMAGES`
    ``[which]`` says, draw the figure with ``asyncsim figures``: exit 2, one line naming the
    file and the field, no figure written. Returns the line."""
    file, field, damage = DAMAGES[which]
    runs = tmp_path / "runs"
    copy = _copy_runs(name, source, runs, also or {})
    assert _damage_all(copy, file, damage), f"{name}: no {file} with {field} to damage"
    out = tmp_path / "drawn"
    capsys.readouterr()
    rc = main(["figures", name, "--runs", str(runs), "--profile", "smoke", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, f"{name} drew from a {which} of the wrong type: {err}"
    assert err.startswith("asyncsim: error: ") and err.count("\n") == 1, err
    # The field as the message names it: "(updates: must be ...)", "column version holds ..."
    assert "Traceback" not in err and file in err, err
    assert f"({field}: " in err or f"column {field} " in err, err
    assert not out.exists(), f"{name}: {sorted(p.name for p in out.iterdir())}"
    return err
