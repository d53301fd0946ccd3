"""The ``asyncsim`` command line: a thin layer over the Python API.

Verbs: ``trace`` (timing only), ``run`` (online numerics), ``real`` (learner and PS actors
on Ray), ``calibrate`` (fit timing models to a real run), ``compare`` (two runs' staleness),
``replay`` (re-execute a trace), ``stability`` (edge tables), ``figures`` (draw from run
folders). A bad scenario exits with status 2 and one line on stderr naming the file, the key
and what is allowed.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from asyncsim.cli.parser import build_parser
from asyncsim.errors import ScenarioError
from asyncsim.runs import ONE_LINE_ERRORS

EXIT_USAGE = 2


def _scenario_file(args) -> str | None:
    """The scenario file a verb works from: its argument, or a run folder's scenario.toml."""
    if getattr(args, "scenario", None):
        return str(args.scenario)
    folder = getattr(args, "resume", None) or getattr(args, "run_dir", None)
    return str(Path(folder) / "scenario.toml") if folder else None


def _command(spec: str):
    """The function ``"module:function"`` of this package that runs a verb. Imported here,
    when the verb runs, and not at the top: the verbs' modules import JAX and pandas
    (~1.5 s), which ``asyncsim --help`` and an argument error should not pay (measured by
    tests/test_cli.py::test_help_is_fast)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(f"asyncsim.cli.{module}"), name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(_command(args.func)(args) or 0)
    except ScenarioError as e:
        # Errors found while running (a delay model's bad draw) know their key, not the file.
        print(f"asyncsim: error: {e.with_file(_scenario_file(args))}", file=sys.stderr)
        return EXIT_USAGE
    except ONE_LINE_ERRORS as e:  # a run folder refused, unwritable or damaged
        print(f"asyncsim: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("asyncsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
