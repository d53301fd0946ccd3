"""The README's and the guide's examples run as written.

Every ```python block of README.md and of the pages in docs/ is executed, page by page in
order, the way a reader would run them: in a fresh folder holding the repository's
`scenarios/` and the quickstart's run folder (at smoke scale), a block that starts with
`# NAME.py` saved as that module instead, and the `test_*` functions a block defines called
(hypothesis runs their examples). Every `asyncsim ...` command of a ```bash block parses
with the command's own parser, and the scenario files it names exist."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The generated pages (their generators are tested), and the home page (the README).
GENERATED = {"cli.md", "keys.md", "performance.md", "changelog.md", "index.md", "api.md"}
PAGES = [REPO / "README.md", *(p for p in sorted((REPO / "docs").glob("*.md"))
                               if p.name not in GENERATED)]


def blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(), re.S | re.M)


def test_the_pages_have_their_examples():
    python = {p.name: len(blocks(p, "python")) for p in PAGES}
    assert python["README.md"] == 1 and python["results.md"] == 4 and python["plugins.md"] == 3
    assert sum(len(blocks(p, "bash")) for p in PAGES) >= 7


@pytest.fixture(scope="module")
def reader_dir(tmp_path_factory) -> Path:
    """A reader's working folder: the scenarios, the quickstart's run folder (smoke), and
    every page's `# NAME.py` modules."""
    from asyncsim.cli import main

    d = tmp_path_factory.mktemp("reader")
    (d / "scenarios").symlink_to(REPO / "scenarios")
    assert main(["run", "scenarios/quickstart.toml", "--profile", "smoke", "--out",
                 str(d / "runs" / "quickstart" / "seed0"), "--quiet", "--no-figure"]) == 0
    for page in PAGES:
        for block in blocks(page, "python"):
            module = re.match(r"# (\w+)\.py\n", block)
            if module:
                (d / f"{module[1]}.py").write_text(block)
    return d


def _update_core_applied(ns: dict) -> None:
    """results.md's update-core example: one update of c = 2 gradients of staleness 0 and 3
    (the core's counters), on the run's parameters."""
    state = ns["state"]
    assert float(state.grad_count) == 2.0 and float(state.stale_sum) == 3.0
    assert state.params.keys() == ns["result"].params.keys()


# What a page's examples leave behind, checked after they ran (beyond their own asserts).
AFTER = {"results.md": _update_core_applied}


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "python")],
                         ids=lambda p: p.name)
def test_the_python_examples_run_as_written(page, reader_dir, monkeypatch, fresh_registries):
    import matplotlib

    matplotlib.use("Agg")  # an example's plot draws into nothing
    monkeypatch.chdir(reader_dir)
    monkeypatch.syspath_prepend(str(reader_dir))
    ns: dict = {}
    try:
        for i, block in enumerate(blocks(page, "python")):
            if re.match(r"# \w+\.py\n", block):
                continue  # a module the reader saves (reader_dir), imported by later blocks
            called = {k for k in ns if k.startswith("test_")}
            exec(compile(block, f"{page.name}: python block {i + 1}", "exec"), ns)
            for name in sorted(k for k in ns if k.startswith("test_") and k not in called):
                ns[name]()
        AFTER.get(page.name, lambda ns: None)(ns)
    finally:
        for module in [m for m in sys.modules if (reader_dir / f"{m}.py").exists()]:
            sys.modules.pop(module)


def _commands(page: Path) -> list[list[str]]:
    """The ``asyncsim`` commands of a page's bash blocks, as argument lists (comments and
    ``&&`` chains split off; lines continued with a backslash joined)."""
    out = []
    for block in blocks(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            for part in line.split("&&"):
                words = shlex.split(part)
                if words[:1] == ["asyncsim"]:
                    out.append(words[1:])
    return out


@pytest.mark.parametrize("page", [p for p in PAGES if _commands(p)], ids=lambda p: p.name)
def test_the_commands_parse_and_name_files_that_exist(page):
    from asyncsim.cli.parser import build_parser

    parser = build_parser()
    for argv in _commands(page):
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page.name}: `asyncsim {' '.join(argv)}` does not parse")
        scenario = getattr(args, "scenario", None)
        if scenario:
            assert (REPO / scenario).is_file(), f"{page.name}: {scenario} does not exist"


def test_the_generated_pages_are_what_their_generators_write():
    """docs/cli.md (`python -m asyncsim.cli.reference > docs/cli.md`) and
    docs/performance.md (`python benchmarks/render.py`) are current; every verb is in the
    command reference with its flags."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import render
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    from asyncsim.cli.parser import verb_parsers
    from asyncsim.cli.reference import cli_reference

    cli = (REPO / "docs" / "cli.md").read_text()
    assert cli == cli_reference(), "docs/cli.md is stale: python -m asyncsim.cli.reference"
    for verb in verb_parsers():
        assert f"## asyncsim {verb}\n" in cli
    assert "--sharpness S" in cli and "--rows N" in cli
    perf = (REPO / "docs" / "performance.md").read_text()
    assert perf == render.render(), "docs/performance.md is stale: python benchmarks/render.py"
