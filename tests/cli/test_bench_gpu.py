"""benchmarks/bench_gpu.py --tiny: every row of the GPU benchmark, at toy size on the CPU."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from asyncsim.scenario import load_scenario, point_scenarios

REPO = Path(__file__).resolve().parents[2]


def test_bench_gpu_tiny_prints_every_row(capsys):
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks" / "bench_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--tiny", "--repeat", "1"])
    out = capsys.readouterr().out
    for name in ("gradients/s, one by one", "gradients/s, grouped by version",
                 "gradients/s, vmapped over 8 versions", "online / plain SGD (time)",
                 "replay loop (s)", "replay scan (s)", "16-point vmapped sweep / 16 loop replays",
                 "replay batched, 2 gradients per call / loop (time)",
                 "replay batched, 8 gradients per call / loop (time)",
                 "P1-F3 paper profile, projected at the online rate (h)",
                 "P1-F3 paper profile, projected at the batched rate (h)"):
        assert name in out and math.isfinite(rows[name]) and rows[name] > 0, name
    assert "peak memory" in out
    # The projection is the profile's gradients over the measured rate, both read here.
    scn = load_scenario(REPO / "scenarios" / "p1_f3_lr_modulation.toml", profile="paper")
    points = [p for _, _, p in point_scenarios(scn)]
    total = sum(p.run.epochs * 50_000 / p.data.batch_size for p in points)
    assert rows["P1-F3 paper profile gradients"] == total
    hours = rows["P1-F3 paper profile, projected at the online rate (h)"]
    assert math.isclose(hours * 3600 * rows["online gradients/s"], total, rel_tol=1e-12)
