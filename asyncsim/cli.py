"""The ``asyncsim`` command line: a thin layer over the Python API.

Verbs: ``trace`` (timing only), ``run`` (online numerics), ``real`` (learner and PS actors
on Ray), ``calibrate`` (fit timing models to a real run), ``compare`` (two runs' staleness),
``replay`` (re-execute a trace), ``stability`` (edge tables), ``figures`` (draw from run
folders). A bad scenario exits with status 2 and one line on stderr naming the file, the key
and what is allowed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from asyncsim.errors import ScenarioError
from asyncsim.runs import RunFolderError

EXIT_USAGE = 2


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


def build_parser() -> argparse.ArgumentParser:
    from asyncsim import __version__

    ap = argparse.ArgumentParser(prog="asyncsim", description=__doc__.splitlines()[0])
    # For bug reports; a run folder's provenance.json records the package versions in full.
    ap.add_argument("--version", action="version", version=f"asyncsim {__version__}")
    sub = ap.add_subparsers(dest="verb", required=True)

    p = sub.add_parser("trace", help="simulate timing only and write the run folder")
    _add_scenario_args(p)
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("run", help="simulate with real gradients (online driver)")
    _add_scenario_args(p, optional=True)
    p.add_argument("--resume", metavar="DIR", help="continue an unfinished run folder")
    p.add_argument("--ray", action="store_true",
                   help="run the sweep's points as Ray tasks (local Ray unless --address)")
    p.add_argument("--address", help="join this Ray cluster (with --ray)")
    p.add_argument("--no-figure", action="store_true", help="do not draw the scenario's figure")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("real", help="a real distributed run on Ray (learner and PS actors)")
    _add_scenario_args(p, optional=True)
    p.add_argument("--address", help="join an existing Ray cluster (default: start a local one)")
    p.add_argument("--resume", metavar="DIR", help="continue a real run from its checkpoint")
    p.set_defaults(func=cmd_real)

    p = sub.add_parser("calibrate",
                       help="fit timing models to a real run's trace; write a scenario")
    p.add_argument("run_dir")
    p.add_argument("--out", help="scenario to write (default: RUN_DIR/calibrated.toml)")
    p.add_argument("--kind", choices=("empirical", "parametric"), default="empirical")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("compare", help="compare two runs' staleness distributions")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--figure", metavar="PNG", help="draw both distributions")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("replay", help="re-execute a recorded trace with the update core")
    p.add_argument("run_dir")
    p.add_argument("--out")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--force", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--path", choices=("loop", "scan", "auto"), default="loop",
                   help="loop: jitted steps in a Python loop (bit-exact with online runs); "
                        "scan: chunks of updates in one lax.scan; auto: measure, then pick")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("stability", help="stability edges of delayed SGD (P2)")
    p.add_argument("--tau", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16, 32])
    p.add_argument("--momentum", nargs="+", default=["none", "heavy-ball", "dampened", "shifted"])
    p.add_argument("--beta", type=float, nargs="+", default=[0.9])
    p.add_argument("--measure", action="store_true",
                   help="also measure the edge by simulation on a quadratic")
    p.add_argument("--figure", metavar="PNG", help="write a figure of the edges")
    p.set_defaults(func=cmd_stability)

    p = sub.add_parser("figures", help="draw figures from existing run folders only")
    p.add_argument("names", nargs="*", help="figure names (default: all)")
    p.add_argument("--runs", default="runs", help="folder holding the run folders")
    p.add_argument("--out", default="figures")
    p.add_argument("--profile", choices=("smoke", "default", "paper"), default=None,
                   help="draw from the runs of this profile (runs/NAME-PROFILE)")
    p.set_defaults(func=cmd_figures)
    return ap


def _load(args):
    from asyncsim.scenario import load_scenario

    return load_scenario(args.scenario, profile=getattr(args, "profile", None),
                         overrides=args.overrides, seed=args.seed)


def _print_summary(summary: dict, keys=None) -> None:
    keys = keys or list(summary)
    width = max(len(k) for k in keys)
    for k in keys:
        if k in summary:
            v = summary[k]
            if isinstance(v, float):
                v = f"{v:.6g}"
            print(f"  {k:<{width}}  {v}")


def cmd_trace(args) -> int:
    from asyncsim import runs

    scn = _load(args)  # before the heavy imports: a misspelt key is reported at once
    from asyncsim.api import trace_run

    if scn.sweep:
        return _sweep(args, scn, trace_only=True)
    out = Path(args.out) if args.out else runs.default_out(scn, args.profile)
    t0 = time.perf_counter()
    result = trace_run(scn, out, force=args.force, progress=not args.quiet)
    if not args.quiet:
        print(f"trace written to {out} in {time.perf_counter() - t0:.2f} s")
        _print_summary(result.summary, ["gradients", "updates", "sim_time", "staleness_mean",
                                        "staleness_max", "staleness_p99", "trace_hash"])
    return 0


def cmd_run(args) -> int:
    from asyncsim import runs

    if not args.resume and not args.scenario:
        raise ScenarioError("", "give a scenario file, or --resume RUN_DIR", file="asyncsim run")
    if args.resume:
        from asyncsim.scenario import load_scenario

        out = runs.resume_folder(args.resume)
        scn = load_scenario(out / "scenario.toml")
    else:
        scn = _load(args)
        if scn.sweep:
            return _sweep(args, scn, trace_only=scn.run.trace_only)
        out = Path(args.out) if args.out else runs.default_out(scn, args.profile)
    from asyncsim.online import run  # JAX and pandas: after the scenario is known to be good

    result = run(scn, out=out, resume=bool(args.resume), force=args.force,
                 progress=not args.quiet, profile=args.profile)
    if not args.quiet:
        print(f"run folder: {out}")
        _print_summary(result.summary, ["updates", "gradients", "epochs", "sim_time",
                                        "staleness_mean", "staleness_max", "final_test_error",
                                        "diverged", "wall_time", "param_hash"])
    fig = scn.figure.get("name")
    if fig and not args.no_figure:
        from asyncsim.figures import draw_figure

        default = args.profile in (None, "default") and not args.out and not args.resume
        for path in draw_figure(fig, out, "figures" if default else out):
            if not args.quiet:
                print(f"figure: {path}")
    return 0


def cmd_replay(args) -> int:
    from asyncsim.replayer import replay_folder

    result = replay_folder(args.run_dir, out=args.out, overrides=args.overrides,
                           force=args.force, progress=not args.quiet, path=args.path)
    if not args.quiet:
        _print_summary(result.summary, ["updates", "gradients", "final_test_error", "diverged",
                                        "wall_time", "param_hash"])
        print(_source_line(result.summary, args.run_dir, set_by_user=bool(args.overrides)))
    return 0


def _source_line(summary, run_dir, *, set_by_user: bool) -> str:
    """One line on how a replay compares with the run it replayed."""
    from asyncsim.runs import is_complete, read_summary

    if summary.get("source_param_hash") is None:
        if not is_complete(run_dir):
            return "the source run has no summary.json (it did not finish): nothing to compare"
        return "the source is a timing-only trace (no parameters): nothing to compare"
    if summary["matches_source"]:
        return "same param_hash as the source run: bit-identical parameters"
    diff = summary.get("max_abs_diff_to_source")
    line = "param_hash differs from the source run's" + (
        f": max |difference| over the parameters {diff:.3g}" if diff is not None else "")
    diverged = [who for who, s in (("source run", read_summary(run_dir)), ("replay", summary))
                if s.get("diverged")]
    if diverged:
        line += f" (the {' and the '.join(diverged)} diverged: non-finite parameters)"
    if set_by_user:
        return line + " (--set changed the numerics)"
    if summary.get("replay_path") == "scan":
        return line + (" (the scan path agrees with the loop to floating-point tolerance, "
                       "not bit for bit; --path loop reproduces the hash)")
    return line + (" (the loop path is bit-identical only on the machine and package versions "
                   "that recorded the run: see its provenance.json)")


def cmd_stability(args) -> int:
    from asyncsim.stability_cli import stability_command

    return stability_command(args)


def cmd_figures(args) -> int:
    from asyncsim.figures import draw_figures

    for path in draw_figures(args.names, runs_dir=args.runs, out=args.out,
                             profile=args.profile):
        print(path)
    return 0


def cmd_real(args) -> int:
    from asyncsim.real import real_command

    return real_command(args)


def cmd_calibrate(args) -> int:
    from asyncsim.real import calibrate_command

    return calibrate_command(args)


def cmd_compare(args) -> int:
    from asyncsim.real import compare_command

    return compare_command(args)


def _sweep(args, scn, *, trace_only: bool) -> int:
    """A scenario with [sweep]: run the missing points, write index.csv, draw its figure."""
    from asyncsim.figures import draw_figure
    from asyncsim.sweep import run_sweep

    out = Path(args.out) if args.out else Path("runs") / (
        scn.name + ("" if args.profile in (None, "default") else f"-{args.profile}"))
    executor = None
    if getattr(args, "ray", False):
        from asyncsim.real import ray_executor

        executor = ray_executor(address=args.address)
    index = run_sweep(scn, out, force=args.force, progress=not args.quiet, executor=executor,
                      trace_only=trace_only)
    if not args.quiet:
        cols = [c for c in index.columns if c not in ("folder", "param_hash", "trace_hash")]
        print(index[cols].to_string(index=False))
        print(f"sweep index: {out / 'index.csv'}")
    fig = scn.figure.get("name")
    if fig and not getattr(args, "no_figure", False):
        default = args.profile in (None, "default") and not args.out
        for path in draw_figure(fig, out, "figures" if default else out / "figures"):
            print(f"figure: {path}")
    return 0


def _scenario_file(args) -> str | None:
    """The scenario file a verb works from: its argument, or a run folder's scenario.toml."""
    if getattr(args, "scenario", None):
        return str(args.scenario)
    folder = getattr(args, "resume", None) or getattr(args, "run_dir", None)
    return str(Path(folder) / "scenario.toml") if folder else None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ScenarioError as e:
        # Errors found while running (a delay model's bad draw) know their key, not the file.
        print(f"asyncsim: error: {e.with_file(_scenario_file(args))}", file=sys.stderr)
        return EXIT_USAGE
    except RunFolderError as e:
        print(f"asyncsim: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("asyncsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
