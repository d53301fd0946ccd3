"""benchmarks/_report.py: what a result file records of the revision it measured."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import load_file

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_result_is_of_a_clean_revision_when_only_the_benchmarks_outputs_changed(tmp_path):
    """Scripts run one after another: the second must not call the revision dirty because
    the first rewrote its results file and the performance page; any other change is."""
    report = load_file(REPO / "benchmarks" / "_report.py", "_report")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    files = {"benchmarks/results/bench_a.json": "{}\n", "docs/performance.md": "# P\n",
             "benchmarks/bench_a.py": "x = 1\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
         "commit", "-qm", "first")
    rev = _git(tmp_path, "rev-parse", "HEAD")
    here = tmp_path / "benchmarks"
    assert report._git(here) == {"revision": rev, "dirty": False}

    (tmp_path / "benchmarks/results/bench_a.json").write_text('{"rows": []}\n')
    (tmp_path / "docs/performance.md").write_text("# P, rendered again\n")
    assert report._git(here) == {"revision": rev, "dirty": False}

    (tmp_path / "benchmarks/bench_a.py").write_text("x = 2\n")
    assert report._git(here) == {"revision": rev, "dirty": True}
