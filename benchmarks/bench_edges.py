"""Benchmark: analytic edge table, and measured quadratic edges vmapped vs point by point.

    python benchmarks/bench_edges.py [--points N]

1. The closed-form table of :mod:`asyncsim.stability` for τ = 0..256 × 3 momentum kinds
   (heavy-ball, dampened, shifted) × 10 β values (target: under a second).
2. One stability grid of the measured-edge search (:mod:`asyncsim.stability.measured`): 20 delays
   (τ = 0..19) × 256 learning rates, all in one compiled vmapped ``lax.scan`` program,
   against the same sweep run point by point (one compiled single-lane program, called per
   (τ, η)). Running all 5,120 points one by one takes minutes, so by default a random
   subset of ``--points`` points is timed and the per-point time scaled to 5,120 (the
   printout says so); ``--points 5120`` runs them all. The stability verdicts of the timed
   points are checked to agree with the vmapped program's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Report  # noqa: E402


def bench_table() -> tuple[float, int]:
    from asyncsim.stability import edge_table

    edge_table(range(4), ("heavy-ball",), (0.5,))  # warm-up (imports, first calls)
    t0 = time.perf_counter()
    table = edge_table(range(257), ("heavy-ball", "dampened", "shifted"),
                       np.linspace(0.0, 0.95, 10))
    return time.perf_counter() - t0, len(table)


def bench_measured(points: int, seed: int = 0) -> dict[str, float]:
    from asyncsim.api import simulate
    from asyncsim.drivers.build import numerics_for
    from asyncsim.drivers.scan import growth_inputs
    from asyncsim.stability import edge
    from asyncsim.stability.measured import (
        default_steps,
        growth,
        quadratic_scenario,
        stable_mask,
    )

    taus = list(range(20))
    steps = default_steps(max(taus))
    scns = [quadratic_scenario(t, steps=steps) for t in taus]
    traces = [simulate(s) for s in scns]
    # A grid of x = η·λ around each delay's edge (as in the search's refinement step).
    grid = np.stack([np.linspace(0.9, 1.1, 256) * edge(t) for t in taus])
    num = numerics_for(scns[-1])  # sized for the most workers; shared by both ways
    inputs = growth_inputs(traces)
    singles = {j: growth_inputs([traces[j]]) for j in range(len(traces))}
    t0 = time.perf_counter()
    growth(traces, scns[-1], grid, num, inputs)
    compile_vmapped = time.perf_counter() - t0
    t0 = time.perf_counter()
    wa, wb = growth(traces, scns[-1], grid, num, inputs)
    vmapped = time.perf_counter() - t0
    verdict = stable_mask(wa, wb)

    # Point by point: one trace and one rate per call (one program per slot count K).
    rng = np.random.default_rng(seed)
    total = grid.size
    chosen = rng.choice(total, size=min(points, total), replace=False)
    for j in sorted({int(i) // 256 for i in chosen}):
        growth([traces[j]], scns[-1], grid[j:j + 1, :1], num, singles[j])  # compile
    t0 = time.perf_counter()
    agree = 0
    for idx in chosen:
        j, k = divmod(int(idx), 256)
        a, b = growth([traces[j]], scns[-1], grid[j:j + 1, k:k + 1], num, singles[j])
        agree += bool(stable_mask(a, b)[0, 0]) == bool(verdict[j, k])
    per_point = (time.perf_counter() - t0) / len(chosen)
    return {"vmapped_s": vmapped, "vmapped_compile_s": compile_vmapped,
            "per_point_s": per_point, "points_timed": len(chosen),
            "point_by_point_s": per_point * total, "ratio": per_point * total / vmapped,
            "agree": agree, "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=64,
                    help="points timed one by one (5120 = the whole sweep)")
    args = ap.parse_args()
    dt, rows = bench_table()
    print(f"analytic edge table: {rows} rows (tau 0..256 x 3 kinds x 10 betas) in {dt:.3f} s")
    m = bench_measured(args.points)
    scaled = "" if m["points_timed"] == 5120 else (
        f" (scaled from {m['points_timed']} points timed)")
    print(f"measured sweep, 20 delays x 256 rates x {m['steps']} updates:")
    print(f"  one vmapped program: {m['vmapped_s']:.2f} s "
          f"(+ {m['vmapped_compile_s'] - m['vmapped_s']:.2f} s first-call compile)")
    print(f"  point by point:      {m['point_by_point_s']:.1f} s{scaled}, "
          f"{1e3 * m['per_point_s']:.1f} ms per point")
    print(f"  ratio point-by-point / vmapped: {m['ratio']:.0f}x; verdicts agree on "
          f"{m['agree']}/{m['points_timed']} points")
    report = Report("bench_edges", "The stability edges: the closed-form table, and a "
                    "measured sweep as one vmapped program against point by point")
    report.row(f"analytic edge table, {rows} rows", dt, unit="s")
    report.row("measured sweep, 20 delays x 256 rates: point by point / one vmapped program",
               m["ratio"], note=f"verdicts agree on {m['agree']}/{m['points_timed']} points")
    report.save()


if __name__ == "__main__":
    main()
