"""The run-folder verbs: ``trace``, ``run`` (sweeps included), ``replay`` and ``figures``.

The scenario is loaded before the API is imported: a misspelt key is then reported in a
fraction of a second, without waiting ~2 s for JAX and pandas (tests/cli/test_cli.py), hence the
imports inside the commands.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from asyncsim import runs
from asyncsim.errors import ScenarioError
from asyncsim.results import read_summary
from asyncsim.scenario import attributed, load_run_scenario, load_scenario


def resume_args(args, *, verb: str, driver: str = "online") -> Path:
    """The folder ``--resume DIR`` continues (:func:`asyncsim.runs.resume_folder`), once the
    rest of the command agrees with it. A resume continues the folder's own scenario.toml, so
    the command that started the run may be given again (its scenario file, ``--profile``,
    ``--set``, ``--seed`` and ``--out``), as long as they resolve to that very scenario and
    folder; anything else would be silently ignored, so it is refused, naming what differs."""
    where = f"asyncsim {verb}"
    folder = runs.resume_folder(args.resume, driver=driver)
    out = getattr(args, "out", None)
    if out is not None and Path(out).resolve() != folder.resolve():
        raise ScenarioError("--out", f"names {out}, and --resume continues {folder} in place: "
                            "give one of them", file=where)
    tweaks = [flag for flag, on in (("--set", getattr(args, "overrides", None)),
                                    ("--seed", getattr(args, "seed", None) is not None),
                                    ("--profile", getattr(args, "profile", None))) if on]
    if not getattr(args, "scenario", None):
        if tweaks:
            raise ScenarioError("--resume", f"continues the folder's own scenario.toml; "
                                f"{', '.join(tweaks)} change a scenario file, and none is "
                                "given", file=where)
        return folder
    from asyncsim._io import read_toml
    from asyncsim.drivers.folder_scenario import scenario_differences

    changed = scenario_differences(
        read_toml(folder / runs.SCENARIO_TOML, what="the run's scenario"), load_args(args))
    if changed:
        given = " ".join([str(args.scenario), *tweaks])
        shown = "; ".join(f"{k}: {then!r} there, {now!r} here" for k, then, now in changed[:3])
        raise ScenarioError("--resume", f"{folder} holds another scenario than {given} "
                            f"resolves to ({shown}{'; ...' if len(changed) > 3 else ''}); a "
                            "resume continues the folder's own run: start a new run for the "
                            "changed one", file=where)
    return folder


def load_args(args, *, validate: bool = True):
    return load_scenario(args.scenario, profile=getattr(args, "profile", None),
                         overrides=args.overrides, seed=args.seed, validate=validate)


# The summary fields a scenario's [measure] table adds (asyncsim.stability.measure).
MEASURED = ("initial_sharpness", "final_sharpness", "final_sharpness_lanczos")


def print_summary(summary: dict, keys=None) -> None:
    keys = [k for k in keys or summary if k in summary]
    width = max((len(k) for k in keys), default=0)
    for k in keys:
        v = summary[k]
        if isinstance(v, float):
            v = f"{v:.6g}"
        print(f"  {k:<{width}}  {v}")


def figure_to_draw(args, scn) -> bool:
    """Whether to draw ``scn``'s ``[figure]`` after it runs. Its name must be a registered
    figure (a name, never a path) and fit what runs, or the run is refused before it
    starts; a resumed sweep point keeps its sweep's ``[figure]``, which is then just not
    drawn here."""
    if "name" not in scn.figure or getattr(args, "no_figure", False):
        return False
    from asyncsim.figures import check_figure, check_figure_fits

    try:
        name = check_figure(scn.figure["name"])
        try:
            check_figure_fits(name, scn)
        except ScenarioError:
            if not getattr(args, "resume", None):
                raise
            return False
    except ScenarioError as e:  # named by the --set that set it, if one did
        raise attributed(e, scn.source, getattr(args, "overrides", None) or ()) from None
    return True


def cmd_trace(args, scn=None) -> int:
    """``asyncsim trace`` (and ``asyncsim run`` of a scenario with ``run.trace_only``, which
    has checked its figure)."""
    if scn is None:
        scn = load_args(args)  # before the heavy imports: a misspelt key is reported at once
        figure_to_draw(args, scn)
    from asyncsim.api import trace_run

    if scn.sweep:
        return _sweep(args, scn, trace_only=True)
    out = Path(args.out) if args.out else runs.default_out(scn, args.profile)
    t0 = time.perf_counter()
    result = trace_run(scn, out, force=args.force, progress=not args.quiet)
    if not args.quiet:
        print(f"trace written to {out} in {time.perf_counter() - t0:.2f} s")
        print_summary(result.summary, ["gradients", "updates", "sim_time", "staleness_mean",
                                        "staleness_max", "staleness_p99", "trace_hash"])
    return 0


def early_worker(args):
    """The figure worker of ``asyncsim run SCENARIO``, started before the scenario is
    validated (which imports JAX), or None.

    The worker's imports (matplotlib, pandas: ~1.5 s of CPU) then overlap this process's
    own imports, which use one core, instead of the run's first seconds, whose XLA programs
    use both cores of a small machine: of 20 warm smoke quickstarts interleaved with the
    worker started after the load, 18 ended sooner, the median by 5% (README, "Start-up").
    Its figure is read from the scenario resolved without the registry checks
    (:func:`~asyncsim.scenario.load_scenario`, ``validate=False``: the same file, profile
    and ``--set``); where that fails, or names no single run's figure, none is started here
    and the full load reports what is wrong, as without it. :func:`cmd_run` ends it if the
    full load refuses the scenario or draws another figure."""
    if args.resume or getattr(args, "no_figure", False):
        return None
    if not os.path.isfile(args.scenario):
        # A pipe (/dev/stdin) or a FIFO is read once, by the full load; a path that cannot
        # be checked (too long, no permission) is reported by it too (os.path.isfile, not
        # Path.is_file, which raises there on Python 3.11).
        return None
    try:
        scn = load_args(args, validate=False)
        if scn.sweep or scn.run.trace_only or not figure_to_draw(args, scn):
            return None
    except ScenarioError:
        return None
    from asyncsim.figures import FigureWorker

    return FigureWorker(scn.figure["name"])


def cmd_run(args) -> int:
    if not args.resume and not args.scenario:
        raise ScenarioError("", "give a scenario file, or --resume RUN_DIR", file="asyncsim run")
    if args.address and not args.ray:
        raise ScenarioError("--address", "names the Ray cluster that runs a sweep's points: "
                            "give it with --ray", file="asyncsim run")
    from asyncsim.figures import FigureWorker

    # Every worker started here is ended unless it draws (FigureWorker.close): on the way out
    # of a refused or failed run, and before a sweep or a trace-only run.
    with contextlib.ExitStack() as workers:
        worker = early_worker(args)
        if worker is not None:
            workers.enter_context(worker)
        if args.resume:
            out = resume_args(args, verb="run")
            scn = load_run_scenario(out)
        else:
            scn = load_args(args)
        draw = figure_to_draw(args, scn)
        single = args.resume or not (scn.sweep or scn.run.trace_only)
        fig = scn.figure.get("name") if draw and single else None
        if worker is not None and worker.name != fig:
            # The file changed between the two loads: not this figure, or not a single run.
            worker.close()
            worker = None
        if scn.sweep and not args.resume:
            return _sweep(args, scn, trace_only=scn.run.trace_only)
        if args.ray:
            raise ScenarioError("--ray", "runs a sweep's points as Ray tasks, and this is a "
                                "single run (no [sweep]); a run on Ray is `asyncsim real`",
                                file="asyncsim run")
        if scn.run.trace_only and not args.resume:
            return cmd_trace(args, scn)  # what its scenario.toml says: timing only
        if not args.resume:
            out = Path(args.out) if args.out else runs.default_out(scn, args.profile)
        if worker is None and fig:
            # The figure's imports (matplotlib) in a second process, while this one runs.
            worker = workers.enter_context(FigureWorker(fig))
        from asyncsim.api import run

        result = run(scn, out=out, resume=bool(args.resume), force=args.force,
                     progress=not args.quiet, profile=args.profile)
        if not args.quiet:
            print(f"run folder: {out}")
            print_summary(result.summary, ["updates", "gradients", "epochs", "sim_time",
                                            "staleness_mean", "staleness_max",
                                            "final_test_error", "diverged", "wall_time",
                                            # what its [measure] table asked for, if anything
                                            *MEASURED, "param_hash"])
        if worker is not None:
            default = args.profile in (None, "default") and not args.out and not args.resume
            # Drawn into the run folder unless it is the default figure: under its lock.
            with runs.locked(out) if not default else contextlib.nullcontext():
                for path in worker.draw(out, "figures" if default else out):
                    if not args.quiet:
                        print(f"figure: {path}")
    return 0


def cmd_timeline(args) -> int:
    """``asyncsim timeline RUN_DIR``: the run's Gantt chart (:mod:`asyncsim.timeline`)."""
    from asyncsim.timeline import draw_timeline

    folder = Path(args.run_dir)
    runs.require_run_folder(folder, scenario=False)
    own = folder / "timeline.png"
    # A .png, and its intervals beside it as .csv: neither may replace a file of a run (its
    # eval.csv, another run's), so inside a run folder only its own timeline.png is drawn.
    png = runs.output_file(args.figure or own, flag="--figure", verb="timeline",
                           suffixes=(".png",), own=own)
    runs.output_file(png.with_suffix(".csv"), flag="--figure", verb="timeline",
                     suffixes=(".csv",), own=own.with_suffix(".csv"))
    inside = runs.run_folder_of(png) is not None
    try:
        with runs.locked(folder) if inside else contextlib.nullcontext():
            png, use = draw_timeline(folder, png, learners=args.learners, window=args.window)
    except OSError as e:
        raise ScenarioError("--figure", f"cannot write {png}: {e.strerror or e}",
                            file="asyncsim timeline") from None
    if not args.quiet:
        print(f"timeline: {png}")
        print(use.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


def cmd_replay(args) -> int:
    from asyncsim.api import replay_folder

    result = replay_folder(args.run_dir, out=args.out, overrides=args.overrides,
                           force=args.force, progress=not args.quiet, path=args.path)
    if not args.quiet:
        print(f"replay folder: {result.out}")
        print_summary(result.summary, ["updates", "gradients", "final_test_error", "diverged",
                                        "wall_time", "param_hash"])
        print(_source_line(result.summary, args.run_dir, set_by_user=bool(args.overrides)))
    return 0


def _source_line(summary, run_dir, *, set_by_user: bool) -> str:
    """One line on how a replay compares with the run it replayed."""
    if summary.get("source_param_hash") is None:
        if not runs.is_complete(run_dir):
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
        line += f" (the {' and the '.join(diverged)} diverged: see diverged_at)"
    if set_by_user:
        return line + " (--set changed the numerics)"
    if summary.get("environment_changes"):
        # What the last bits depend on differs (docs/reproducibility.md).
        return line + (" (this machine differs from the source run's in what the last bits "
                       f"depend on: {'; '.join(summary['environment_changes'])})")
    if summary.get("replay_path") in ("scan", "batched"):
        return line + (f" (the {summary['replay_path']} path agrees with the loop to "
                       "floating-point tolerance, not bit for bit; --path loop reproduces "
                       "the hash)")
    return line + (" (the machines agree in everything recorded that the last bits depend "
                   "on: see docs/reproducibility.md for what is bit-identical where)")


def cmd_show(args) -> int:
    """``asyncsim show PATH``: a run folder's state, summary and next command; a sweep
    folder's points, one line each; anything else is one line (exit 2). Reads through
    :mod:`asyncsim.results` (every value checked), runs nothing."""
    from asyncsim.results import open_run, open_sweep

    path = Path(args.path)
    if (path / runs.SWEEP_INDEX).exists():
        sweep = open_sweep(path)
        states = [_point_state(path / name) for name in sweep.index["point"]]
        done = states.count("complete")
        diverged = sum(s.startswith("diverged") for s in states)
        # What running the sweep again makes: a damaged point is listed with its damage.
        left = sum(s == "not started" or s.startswith("unfinished") for s in states)
        print(f"{path}: a sweep of {len(states)} points ({done} complete"
              + (f", {diverged} diverged" if diverged else "")
              + (f", {left} to run" if left else "")
              + f"); keys {', '.join(sweep.keys) or '(none)'}")
        for (_, row), state in zip(sweep.index.iterrows(), states, strict=True):
            # A key this point leaves out (zipped keys) is empty in the index: not shown.
            keys = " ".join(f"{k}={_cell(row[k])}" for k in sweep.keys if row[k] == row[k])
            print(f"  {row['point']}  {keys}  {state}")
        if left:
            # A sweep checkpoints by point (asyncsim.sweep): running it again keeps them.
            print(f"go on: asyncsim run SCENARIO --out {path} (its scenario file; the "
                  "complete points are kept)")
        return 0
    run = open_run(path)
    print(f"{path}: a {runs.KIND_LABELS[run.kind]}, {_state(run)}")
    if run.complete:
        print_summary({k: v for k, v in run.summary.items() if not isinstance(v, list | dict)})
        again = (_replay_again(run.provenance, run.summary.get("replay_path"))
                 if run.kind == "replay" and run.provenance.get("replay_of")
                 else f"asyncsim {_VERB[run.kind]} {path / 'scenario.toml'} --out NEW_DIR")
        print(f"run it again: {again}")
        if run.kind != "trace":
            print(f"re-execute its trace: asyncsim replay {path} --out NEW_DIR")
    else:
        print(f"  {runs.unfinished_advice(path)}")
    return 0


def _replay_again(prov, path: str | None) -> str:
    """The command that made a replay (its ``--path`` and ``--set`` included), into a new
    folder: the recorded one where it was the ``asyncsim replay`` command, else its source and
    the path it took (a replay made from Python recorded no ``--set``)."""
    import shlex

    command = prov.get("command") or []
    if command[1:2] == ["replay"]:
        args, rest = [], iter(command[2:])
        for a in rest:
            if a == "--out":
                next(rest, None)
            elif not (a.startswith("--out=") or a == "--force"):
                args.append(a)
    else:
        args = [prov["replay_of"], *(["--path", path] if path else [])]
    return shlex.join(["asyncsim", "replay", *args, "--out", "NEW_DIR"])


def _cell(v):
    """An index value as the sweep listed it: 30, not the 30.0 a column with gaps holds."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


_VERB = {"online": "run", "replay": "run", "real": "real", "trace": "trace"}


def _point_state(folder: Path) -> str:
    """A sweep point's :func:`_state`; ``not started`` where the sweep has not made it yet,
    the damage where its files are not what asyncsim writes (the others still listed)."""
    from asyncsim.results import open_run

    try:
        return _state(open_run(folder))
    except runs.RunFolderError:
        return "not started"
    except runs.ONE_LINE_ERRORS as e:  # "summary.json: damaged (...); redo ..."
        return str(e).removeprefix(f"{folder}/")


def _state(run) -> str:
    """``complete``, ``diverged at update N``, ``unfinished (checkpoint at update N)``."""
    state = run.state
    if state == "diverged":
        return f"diverged at update {run.summary.get('diverged_at')}"
    if state == "unfinished":
        at = run.checkpoint_version()
        return "unfinished" + (f" (checkpoint at update {at})" if at is not None else "")
    return state


def cmd_figures(args) -> int:
    from asyncsim.figures import draw_figures

    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ScenarioError("--out", f"{args.out} is a file; name a folder for the figures",
                            file="asyncsim figures")
    for path in draw_figures(args.names, runs_dir=args.runs, out=args.out,
                             profile=args.profile):
        print(path)
    return 0


def _sweep(args, scn, *, trace_only: bool) -> int:
    """A scenario with [sweep]: run the missing points, write index.csv, draw its figure."""
    from asyncsim.figures import draw_figure
    from asyncsim.sweep import run_sweep

    out = Path(args.out) if args.out else runs.sweep_out(scn.name, args.profile)
    executor = None
    if getattr(args, "ray", False):
        # Ray is an optional extra, imported only for --ray.
        from asyncsim.drivers.real import ray_executor

        executor = ray_executor(address=args.address)
    index = run_sweep(scn, out, force=args.force, progress=not args.quiet, executor=executor,
                      trace_only=trace_only)
    if not args.quiet:
        # Its keys and what a reader looks at first; index.csv has every summary field.
        keys = list(index.columns[:list(index.columns).index("folder")])
        shown = [*keys, "status", "final_test_error", "diverged", "staleness_mean",
                 "staleness_max", *MEASURED]
        print(index[[c for c in shown if c in index.columns]].to_string(index=False))
        print(f"sweep index: {out / runs.SWEEP_INDEX}")
    fig = scn.figure.get("name")
    if fig and not getattr(args, "no_figure", False):
        default = args.profile in (None, "default") and not args.out
        with runs.locked(out):  # drawn from (and maybe into) the sweep folder: one writer
            for path in draw_figure(fig, out, "figures" if default else out / "figures"):
                if not args.quiet:
                    print(f"figure: {path}")
    return 0

