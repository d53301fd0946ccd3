"""The verbs of real runs: ``real`` (learner and PS actors on Ray), ``calibrate`` (fit a
real run's timing as a scenario) and ``compare`` (two runs' staleness distributions)."""

from __future__ import annotations

import os
from pathlib import Path

from asyncsim import runs
from asyncsim.calibrate import calibrate, compare
from asyncsim.cli.commands import load_args, print_summary, resume_args
from asyncsim.drivers.real import RealRunError, real_run
from asyncsim.errors import ScenarioError
from asyncsim.scenario import load_run_scenario


def cmd_real(args) -> int:
    """``asyncsim real SCENARIO [--address ADDR] [--out DIR] [--set K=V] | --resume DIR``."""
    if args.resume:
        out = resume_args(args, verb="real", driver="real")
        scn = load_run_scenario(out)
    else:
        if not args.scenario:
            raise ScenarioError("", "give a scenario file, or --resume RUN_DIR",
                                file="asyncsim real")
        scn = load_args(args)
        out = Path(args.out) if args.out else runs.default_out(scn, args.profile).with_name(
            f"real-seed{scn.seed}")
    emulate = bool(getattr(args, "emulate_compute", False)) or os.environ.get(
        "ASYNCSIM_REAL_EMULATE", "") not in ("", "0")
    try:
        summary = real_run(scn, out=out, resume=bool(args.resume), force=args.force,
                           address=args.address, emulate_compute=emulate,
                           profile=getattr(args, "profile", None))
    except RealRunError as e:
        print(f"asyncsim: error: {e}")
        return 1
    if not args.quiet:
        print(f"run folder: {out}")
        print_summary(summary, ["updates", "gradients", "sim_time", "staleness_mean",
                                 "staleness_max", "final_test_error", "diverged", "restarts",
                                 "updates_per_s", "param_hash"])
    return 0


def cmd_calibrate(args) -> int:
    notes: list[str] = []
    path = calibrate(args.run_dir, out=args.out, kind=args.kind, notes=notes)
    print(f"calibrated scenario: {path}")
    for line in notes:
        print(f"  {line}")
    print(f"simulate it with: asyncsim trace {path} --out RUN_B; then "
          f"asyncsim compare {args.run_dir} RUN_B")
    return 0


def cmd_compare(args) -> int:
    if args.figure:
        runs.output_file(args.figure, flag="--figure", verb="compare")
    res = compare(args.run_a, args.run_b, figure=args.figure)
    print(f"{'':<10}{'A':>12}{'B':>12}")
    for k in ("gradients", "mean", "p99", "max"):
        print(f"{k:<10}{res[k + '_a']:>12.4g}{res[k + '_b']:>12.4g}")
    print(f"total variation distance: {res['tv_distance']:.4f}")
    print(f"{'tau':>5}{'freq A':>10}{'freq B':>10}")
    shown = res["table"] if args.rows <= 0 else res["table"][:args.rows]
    for row in shown:
        print(f"{row['staleness']:>5}{row['freq_a']:>10.4f}{row['freq_b']:>10.4f}")
    if len(shown) < len(res["table"]):
        print(f"  ... {len(res['table']) - len(shown)} more rows, up to tau = "
              f"{res['table'][-1]['staleness']} (--rows 0 prints them all)")
    if None not in (res["param_hash_a"], res["param_hash_b"]):
        print(_parameters_line(res))
    if "figure" in res:
        print(f"figure: {res['figure']}")
    return 0


def _parameters_line(res) -> str:
    """One line on whether A's and B's final parameters agree, and if not, what of their
    machines differs (docs/reproducibility.md)."""
    if res["param_hash_a"] == res["param_hash_b"]:
        return "param_hash: the same in A and B (bit-identical parameters)"
    changes = res["environment_changes"]
    return "param_hash: A's differs from B's" + (
        f"; the machines differ in what the last bits depend on: {'; '.join(changes)}"
        if changes else "; their machines agree in everything recorded that the last bits "
        "depend on (compare their scenario.toml files)")
