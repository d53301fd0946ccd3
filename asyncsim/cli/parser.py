"""The ``asyncsim`` argument parser. Each verb names the function that runs it as
``"module:function"`` of this package, imported only when that verb runs (see
:func:`asyncsim.cli.main`)."""

from __future__ import annotations

import argparse

_DESCRIPTION = ("asyncsim: a discrete-event simulator for staleness and minima selection in "
                "asynchronous SGD")


class _Parser(argparse.ArgumentParser):
    """argparse, its errors in one line (the usage block is what ``--help`` is for), exit 2
    like every other refusal of the CLI."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _count(text: str) -> int:
    """A whole number ≥ 0, for an option that counts (argparse names the option)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return n


def _add_scenario_args(p: argparse.ArgumentParser, *, profile: bool = True,
                       optional: bool = False) -> None:
    p.add_argument("scenario", nargs="?" if optional else None, help="a scenario TOML file")
    p.add_argument("--out", help="run folder (default: runs/NAME[-PROFILE]/seedN)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set protocol.n=4 (repeatable)")
    p.add_argument("--seed", type=int, help="override the scenario's seed")
    p.add_argument("--force", action="store_true", help="overwrite an existing run folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    if profile:
        p.add_argument("--profile", choices=("smoke", "default", "paper"), default=None,
                       help="scale the scenario (smoke: seconds; paper: the papers' setup)")


def _verb(sub, name: str, about: str) -> argparse.ArgumentParser:
    """A verb's parser; ``about`` is its line in ``asyncsim --help`` and heads its own."""
    return sub.add_parser(name, help=about, description=about)


def build_parser() -> argparse.ArgumentParser:
    """The CLI's whole surface: the verbs in the order ``asyncsim --help`` lists them."""
    return _build()[0]


def verb_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each verb's parser, in the order ``asyncsim --help`` lists them (the CLI reference,
    :mod:`asyncsim.cli.reference`, is written from them)."""
    return dict(_build()[1].choices)


def _build():
    from asyncsim import __version__

    ap = _Parser(prog="asyncsim", description=_DESCRIPTION)
    # For bug reports; a run folder's provenance.json records the package versions in full.
    ap.add_argument("--version", action="version", version=f"asyncsim {__version__}")
    sub = ap.add_subparsers(dest="verb", required=True)
    _add_run_verbs(sub)
    _add_real_verbs(sub)
    _add_replay_verb(sub)
    _add_inspection_verbs(sub)
    return ap, sub


def _add_run_verbs(sub) -> None:
    """``trace`` and ``run``: a scenario simulated, timing only or with real gradients."""
    p = _verb(sub, "trace", "simulate timing only and write the run folder")
    _add_scenario_args(p)
    p.set_defaults(func="commands:cmd_trace")

    p = _verb(sub, "run", "simulate with real gradients (online driver)")
    _add_scenario_args(p, optional=True)
    p.add_argument("--resume", metavar="DIR", help="continue an unfinished run folder")
    p.add_argument("--ray", action="store_true",
                   help="run the sweep's points as Ray tasks (local Ray unless --address)")
    p.add_argument("--address", help="join this Ray cluster (with --ray)")
    p.add_argument("--no-figure", action="store_true", help="do not draw the scenario's figure")
    p.set_defaults(func="commands:cmd_run")


def _add_real_verbs(sub) -> None:
    """``real``, ``calibrate`` and ``compare``: a run on Ray, and its timing set against the
    simulator's."""
    p = _verb(sub, "real", "a real distributed run on Ray (learner and PS actors)")
    _add_scenario_args(p, optional=True)
    p.add_argument("--address", help="join an existing Ray cluster (default: start a local one)")
    p.add_argument("--resume", metavar="DIR", help="continue a real run from its checkpoint")
    p.set_defaults(func="real:cmd_real")

    p = _verb(sub, "calibrate", "fit timing models to a real run's trace; write a scenario")
    p.add_argument("run_dir")
    p.add_argument("--out", help="scenario to write (default: RUN_DIR/calibrated.toml)")
    p.add_argument("--kind", choices=("empirical", "parametric"), default="empirical")
    p.set_defaults(func="real:cmd_calibrate")

    p = _verb(sub, "compare", "compare two runs' staleness distributions")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--figure", metavar="PNG", help="draw both distributions")
    p.add_argument("--rows", type=_count, default=20, metavar="N",
                   help="staleness rows of the table to print (default 20; 0: all)")
    p.set_defaults(func="real:cmd_compare")


def _add_replay_verb(sub) -> None:
    """``replay``: a recorded trace re-executed with the update core."""
    p = _verb(sub, "replay", "re-execute a recorded trace with the update core")
    p.add_argument("run_dir", help="the run folder whose trace to replay")
    p.add_argument("--out", help="replay folder (default: RUN_DIR/replay)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="change numerics only (optimizer.*, model.*, data.*, seed, "
                   "run.eval_every, run.eval_samples); the trace fixes the timing")
    p.add_argument("--force", action="store_true", help="overwrite an existing replay folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar or table")
    p.add_argument("--path", choices=("loop", "scan", "batched", "auto"), default="loop",
                   help="loop: jitted steps in a Python loop (bit-exact with online runs); "
                        "scan: chunks of updates in one lax.scan; batched: the gradients of "
                        "many updates per call (for GPUs); auto: measure loop and scan, "
                        "then pick")
    p.set_defaults(func="commands:cmd_replay")


def _add_inspection_verbs(sub) -> None:
    """``show``, ``stability``, ``timeline`` and ``figures``: what a run folder holds,
    closed forms and figures, without simulating."""
    p = _verb(sub, "show", "what a run or sweep folder holds, and how to go on")
    p.add_argument("path", help="a run folder or a sweep folder")
    p.set_defaults(func="commands:cmd_show")

    p = _verb(sub, "stability", "stability edges of delayed SGD (P2)")
    p.add_argument("--tau", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16, 32],
                   help="the constant delays of the table's rows")
    p.add_argument("--momentum", nargs="+", default=["none", "heavy-ball", "dampened", "shifted"],
                   help="momentum kinds: none, heavy-ball, dampened, shifted, nesterov")
    p.add_argument("--beta", type=float, nargs="+", default=[0.9],
                   help="momentum coefficients (one table each)")
    p.add_argument("--measure", action="store_true",
                   help="also measure the edge by simulation on a quadratic")
    p.add_argument("--sharpness", type=float, metavar="S",
                   help="the loss's top Hessian eigenvalue (a run's initial_sharpness, say): "
                        "print each edge as the largest stable learning rate, edge / S")
    p.add_argument("--trace", metavar="RUN_DIR",
                   help="also measure the edge of that run's own (random) staleness: "
                        "delayed GD on a quadratic driven by its recorded trace")
    p.add_argument("--figure", metavar="PNG", help="write a figure of the edges")
    p.set_defaults(func="stability:stability_command")

    p = _verb(sub, "timeline", "a Gantt chart of a run folder, from its trace alone")
    p.add_argument("run_dir", help="a run folder (simulated, replayed or real)")
    p.add_argument("--figure", metavar="PNG", help="where to draw it (default: "
                   "RUN_DIR/timeline.png; its intervals beside it as .csv)")
    p.add_argument("--learners", metavar="A:B", help="only learners A <= k < B")
    p.add_argument("--window", metavar="T0:T1", help="only the times T0 .. T1")
    p.add_argument("--quiet", action="store_true", help="no utilisation table")
    p.set_defaults(func="commands:cmd_timeline")

    p = _verb(sub, "figures", "draw figures from existing run folders only")
    p.add_argument("names", nargs="*", help="figure names (default: all)")
    p.add_argument("--runs", default="runs", help="folder holding the run folders")
    p.add_argument("--out", default=None,
                   help="where to draw (default: figures/ for the default profile; for "
                   "another, the sweep's figures/ folder or the run folder)")
    p.add_argument("--profile", choices=("smoke", "default", "paper"), default=None,
                   help="draw from the runs of this profile (runs/NAME-PROFILE)")
    p.set_defaults(func="commands:cmd_figures")
