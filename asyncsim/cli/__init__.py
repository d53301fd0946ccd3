"""The ``asyncsim`` command line: a thin layer over the Python API.

Verbs: ``trace`` (timing only), ``run`` (online numerics), ``real`` (learner and PS actors
on Ray), ``calibrate`` (fit timing models to a real run), ``compare`` (two runs' staleness),
``replay`` (re-execute a trace), ``stability`` (edge tables), ``figures`` (draw from run
folders). A bad scenario exits with status 2 and one line on stderr naming the file, the key
and what is allowed.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import select
import sys
from pathlib import Path

from asyncsim._process import sigint_kept, tune_gc
from asyncsim.cli.parser import build_parser
from asyncsim.errors import ScenarioError
from asyncsim.runs import ONE_LINE_ERRORS, SCENARIO_TOML

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # as a process that SIGPIPE ended (128 + 13), what a shell expects


def _scenario_file(args) -> str | None:
    """The scenario file a verb works from: its argument, or a run folder's scenario.toml."""
    if getattr(args, "scenario", None):
        return str(args.scenario)
    folder = getattr(args, "resume", None) or getattr(args, "run_dir", None)
    return str(Path(folder) / SCENARIO_TOML) if folder else None


def _command(spec: str):
    """The function ``"module:function"`` of this package that runs a verb. Imported here,
    when the verb runs, and not at the top: the verbs' modules import JAX and pandas
    (~1.5 s), which ``asyncsim --help`` and an argument error should not pay (measured by
    tests/cli/test_cli.py::test_help_is_fast)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(f"asyncsim.cli.{module}"), name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with sigint_kept():  # a Ctrl-C that lands in a GC callback is not lost
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
    except BrokenPipeError:
        if not _stdout_broken():
            raise  # another pipe (a Ray worker's, a subprocess's): a failure to report
        # The reader of our output went away (`asyncsim compare A B | head`): nothing more
        # to say to it, and no traceback. Later writes (the exit's flush) go nowhere.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _stdout_broken() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error or a
    hang-up on it). Where poll does not exist, assume it is (the quiet exit); where standard
    output has no descriptor (captured, closed), it is not what broke."""
    if not hasattr(select, "poll"):
        return True
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


class _ExitWithoutTeardown:
    """The exit handler of :func:`console`: registered before anything else is imported,
    it runs after every other exit handler (Ray's shutdown, logging's flush, JAX's
    clean-up: LIFO) and then ends the process with ``os._exit``, skipping the interpreter's
    teardown of JAX, pandas and matplotlib -- 0.3-0.5 s of a 2.5 s warm smoke quickstart
    on a 2-core machine (README, "Start-up"), after every file asyncsim writes is
    closed (they are written whole, in ``with`` blocks, see ``asyncsim._io``). Non-daemon
    threads have been joined before exit handlers run. ``code`` stays None when the verb
    did not return (argparse's ``--help`` or usage error, an uncaught exception): that
    exit takes the interpreter's normal way out, and so does a process measured by
    coverage.py, whose data are written at the normal exit. Exit handlers registered before
    :func:`console` runs (none of asyncsim's) would be skipped."""

    code: int | None = None

    def __call__(self) -> None:
        if self.code is None or "coverage" in sys.modules:
            return  # (coverage.py writes its data at the normal exit)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed, or replaced by None
                pass
        os._exit(self.code)


def console() -> None:
    """The ``asyncsim`` command and ``python -m asyncsim.cli``: :func:`main`, with the
    exit status it returns, without the interpreter's teardown (:class:`_ExitWithoutTeardown`).
    In-process callers (the tests, a notebook) call :func:`main`, which returns, and keep
    their garbage collector's settings; this process takes asyncsim's (:func:`tune_gc`)."""
    finish = _ExitWithoutTeardown()
    atexit.register(finish)
    tune_gc()
    code = main()
    finish.code = code
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    console()
