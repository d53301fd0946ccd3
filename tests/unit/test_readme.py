"""The README's Python examples run as written: each ```python block is executed, in order,
the way a reader would (the delay model as the module ``my_delays.py`` it says it is)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def test_the_readme_has_its_examples():
    assert len(BLOCKS) == 4
    assert BLOCKS[2].startswith("# my_delays.py")


@pytest.fixture
def reader(tmp_path, monkeypatch, fresh_registries):
    """A reader's session: the repository as working directory (the examples name
    scenarios/...), my_delays.py importable, registrations dropped afterwards."""
    monkeypatch.chdir(REPO)
    (tmp_path / "my_delays.py").write_text(BLOCKS[2])
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_delays", None)


def test_the_api_and_update_core_examples(reader):
    ns: dict = {}
    exec(compile(BLOCKS[0], "README.md: Python API", "exec"), ns)  # asserts same param_hash
    assert ns["again"].summary["param_hash"] == ns["result"].summary["param_hash"]
    exec(compile(BLOCKS[1], "README.md: the update core", "exec"), ns)
    state, params = ns["state"], ns["result"].params
    assert float(state.grad_count) == 2.0 and float(state.stale_sum) == 3.0
    assert state.params.keys() == params.keys()


def test_the_delay_model_and_its_property_test(reader):
    ns: dict = {}
    exec(compile(BLOCKS[3], "README.md: property test", "exec"), ns)
    ns["test_weibull_cluster_keeps_invariants"]()  # hypothesis runs its examples here
    from my_delays import Weibull

    assert Weibull(shape=1.0, scale=2.0).mean == pytest.approx(2.0)  # Gamma(2) = 1
