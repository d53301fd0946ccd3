"""benchmarks/bench_gpu.py --tiny: every row of the GPU benchmark, at toy size on the CPU."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import load_file

from asyncsim.scenario import load_scenario, point_scenarios

REPO = Path(__file__).resolve().parents[2]


def test_bench_gpu_tiny_prints_every_row(capsys):
    bench = load_file(REPO / "benchmarks" / "bench_gpu.py", "bench_gpu")
    rows = bench.main(["--tiny", "--repeat", "1"])
    out = capsys.readouterr().out
    for name in ("gradients/s, one by one", "gradients/s, grouped by version",
                 "gradients/s, vmapped over 8 versions", "online / plain SGD (time)",
                 "replay loop (s)", "replay scan (s)", "16-point vmapped sweep / 16 loop replays",
                 "replay batched, 2 gradients per call / loop (time)",
                 "replay batched, 8 gradients per call / loop (time)",
                 "p1_f3_lr_modulation paper profile, projected at the batched rate (h)"):
        assert name in out and math.isfinite(rows[name]) and rows[name] > 0, name
    assert "peak memory" in out
    # Every scenario with a paper profile is projected: its gradients over the measured
    # online rate, both read here.
    papers = sorted(f.stem for f in (REPO / "scenarios").glob("*.toml")
                    if "[profiles.paper" in f.read_text() and f.stem != "p1_f4_imagenet")
    assert not any(k.startswith("p1_f4_imagenet") for k in rows)  # ImageNet: size unknown
    assert {"p1_f3_lr_modulation", "p1_tradeoff", "p2_f1", "p2_f4", "remedies"} <= set(papers)
    projected = [k for k in rows if "projected at the online rate" in k]
    assert sorted(k.split()[0] for k in projected) == ["p1_f3_lr_modulation", "p1_tradeoff",
                                                       "remedies"]
    for name in papers:
        scn = load_scenario(REPO / "scenarios" / f"{name}.toml", profile="paper")
        points = [p for _, _, p in point_scenarios(scn)]
        # epochs x train-set size / mu, or (P2-F4) updates of one gradient each
        total = sum(p.run.epochs * p.data.options.get("n_train", 50_000) / p.data.batch_size
                    if p.run.epochs is not None else p.run.updates for p in points)
        assert rows[f"{name} paper profile gradients"] == pytest.approx(total, abs=len(points))
        key = f"{name} paper profile ({len(points)} runs), projected at the online rate (h)"
        if {(p.model.name, p.data.batch_size) for p in points} != {("cifar10-full", 4)}:
            assert key not in rows  # another model or batch: P1's rate says nothing
            continue
        assert math.isclose(rows[key] * 3600 * rows["online gradients/s"],
                            rows[f"{name} paper profile gradients"], rel_tol=1e-12)
