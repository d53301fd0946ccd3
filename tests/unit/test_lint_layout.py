"""The lint script's module-map reader (tests/lint_layout.py, run by .ci/run): what it takes
for a module of docs/design.md's map, and that a module missing from the map, or a map line
naming no module, is an error."""

from pathlib import Path

from conftest import load_file

lint = load_file(Path(__file__).parents[1] / "lint_layout.py", "lint_layout")

MAP = """# title

## The layout

text

```
asyncsim/                 the package
  trace.py                the record
  timing/                 no JAX
    delays/               delay models
      base.py             the registry
    cluster.py            the Simulation
  api.py                  the API
analysis/                 figures
  p2_f1.py                P2-F1
```

```
not/a/map.py
```
"""


def test_the_map_is_read_as_a_tree_one_entry_a_line():
    assert lint.module_map(MAP) == {
        "asyncsim", "asyncsim/trace.py", "asyncsim/timing", "asyncsim/timing/delays",
        "asyncsim/timing/delays/base.py", "asyncsim/timing/cluster.py", "asyncsim/api.py",
        "analysis", "analysis/p2_f1.py"}


def test_a_module_missing_from_the_map_or_a_map_line_naming_none_is_an_error(monkeypatch):
    assert lint.design_map() == []  # today's tree and docs/design.md agree
    real = lint.sources()
    extra = lint.REPO / "asyncsim" / "timing" / "not_in_the_map.py"
    monkeypatch.setattr(lint, "sources", lambda: [*real, extra])
    assert lint.design_map() == [
        "docs/design.md: the module map lacks asyncsim/timing/not_in_the_map.py"]
    gone = lint.REPO / "asyncsim" / "trace.py"
    monkeypatch.setattr(lint, "sources", lambda: [p for p in real if p != gone])
    assert lint.design_map() == [
        "docs/design.md: the module map names asyncsim/trace.py, which does not exist"]
