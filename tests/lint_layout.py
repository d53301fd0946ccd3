"""The layout keeps its promises (docs/design.md), checked in the lint step of ``.ci/run``:
``python tests/lint_layout.py`` prints one line per broken promise and exits 1, or exits 0.

* pyproject.toml lists every package of the tree (analysis/ maps into asyncsim.analysis), so a
  new subpackage cannot be missing from the wheel;
* docs/design.md's module map ("The layout") names every module of ``asyncsim/`` and
  ``analysis/``, and nothing else;
* nothing cites a document outside the repository;
* functions over ``MAX_FUNCTION_LINES`` lines are listed, as a smell to look at, not a limit
  to squeeze under: the check warns and does not fail (split a function where its concepts
  part, not where a count says).

Not a pytest module (its name does not start with ``test_``): these are facts about files,
checked once per CI run, not one test ID per source file.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 80
# Paths of documents that live outside this repository, which its files must never cite.
OUTSIDE = ("../shared", "/work/shared", "DESIGN.md", "PAPERS.md", "STYLE.md")


def sources() -> list[Path]:
    return sorted([*(REPO / "asyncsim").rglob("*.py"), *(REPO / "analysis").glob("*.py")])


def wheel_packages() -> list[str]:
    """What is wrong with ``[tool.setuptools]``'s explicit package list."""
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {".".join(p.parent.relative_to(REPO).parts)
            for p in (REPO / "asyncsim").rglob("__init__.py")} | {"asyncsim.analysis"}
    listed = set(tool["packages"])
    errors = [f"pyproject.toml: [tool.setuptools] packages lacks {p}"
              for p in sorted(tree - listed)]
    errors += [f"pyproject.toml: [tool.setuptools] packages lists {p}, not a package of the tree"
               for p in sorted(listed - tree)]
    if not (REPO / "analysis" / "__init__.py").exists():
        errors.append("analysis/__init__.py: missing (analysis/ ships as asyncsim.analysis)")
    if tool.get("package-dir") != {"asyncsim.analysis": "analysis"}:
        errors.append('pyproject.toml: package-dir must be {"asyncsim.analysis" = "analysis"}')
    return errors


def module_map(text: str) -> set[str]:
    """The paths docs/design.md's module map names: the first code block under
    "## The layout", one entry a line (``name.py`` or ``folder/``), indented two spaces per
    folder level; what follows the name on its line is its description."""
    section = text.split("\n## The layout\n", 1)[1]
    block = section.split("```\n", 2)[1]
    names, folders = set(), []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        folders[depth:] = []
        names.add("/".join([*folders, name]).rstrip("/"))
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
    return names


def design_map() -> list[str]:
    """What docs/design.md's module map lacks or names wrongly."""
    tree = set()
    for path in sources():
        rel = path.relative_to(REPO)
        tree.add(str(rel.parent) if rel.name == "__init__.py" else str(rel))
    try:
        named = module_map((REPO / "docs" / "design.md").read_text())
    except IndexError:
        return ["docs/design.md: no code block under '## The layout' (the module map)"]
    errors = [f"docs/design.md: the module map lacks {p}" for p in sorted(tree - named)]
    errors += [f"docs/design.md: the module map names {p}, which does not exist"
               for p in sorted(named - tree)]
    return errors


def citations() -> list[str]:
    """Tracked files that cite a document outside the repository."""
    tracked = subprocess.run(["git", "ls-files", "asyncsim", "analysis", "docs", "README.md",
                              "CHANGELOG.md", "scenarios", "tests", "benchmarks"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split()
    if not tracked:
        return ["not a git checkout: cannot list the tracked files"]
    this = str(Path(__file__).resolve().relative_to(REPO))
    errors = []
    for name in tracked:
        if name == this or not name.endswith((".py", ".md", ".toml")):
            continue
        text = (REPO / name).read_text()
        errors += [f"{name}: cites {w!r}, a document outside the repository"
                   for w in OUTSIDE if w in text]
    return errors


def long_functions() -> list[str]:
    """Functions (methods, nested functions) longer than ``MAX_FUNCTION_LINES`` lines."""
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name} has "
                                 f"{lines} lines (over {MAX_FUNCTION_LINES})")
    return found


def main() -> int:
    errors = wheel_packages() + design_map() + citations()
    warnings = long_functions()
    for line in warnings:
        print(f"warning: {line}")
    for line in errors:
        print(f"error: {line}")
    print(f"lint_layout: {len(errors)} error(s), {len(warnings)} function(s) over "
          f"{MAX_FUNCTION_LINES} lines (a warning)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
