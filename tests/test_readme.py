"""The README's examples run as written (the property test of a user's delay model)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hypothesis import given, settings

import asyncsim
from asyncsim.testing import check_trace, scenarios
from asyncsim.timing.delays import DelayModel, available_delays


class Weibull(DelayModel):
    """Weibull compute times: scale * W, W ~ Weibull(shape)."""

    def __init__(self, shape: float, scale: float = 1.0) -> None:
        if not shape > 0:
            raise ValueError(f"shape: must be a positive number, got {shape!r}")
        if not scale > 0:
            raise ValueError(f"scale: must be a positive number, got {scale!r}")
        self.shape, self.scale = shape, scale

    def sample(self, rng: np.random.Generator, learner: int, now: float) -> float:
        return self.scale * float(rng.weibull(self.shape))

    def sample_block(self, rng, learner, size):
        return self.scale * rng.weibull(self.shape, size)

    @property
    def mean(self) -> float:
        return self.scale * math.gamma(1.0 + 1.0 / self.shape)


if "weibull-readme" not in available_delays():
    asyncsim.register_delay("weibull-readme")(Weibull)


@settings(max_examples=30, deadline=None)
@given(scenarios(kinds=["softsync", "hardsync", "ssp"], max_learners=16))
def test_weibull_cluster_keeps_invariants(scn):
    compute = {"dist": "weibull-readme", "shape": 1.5, "scale": 0.5}
    scn = asyncsim.load_scenario(scn, overrides=[("cluster.compute", compute)])
    check_trace(asyncsim.simulate(scn), scn)


def test_api_example():
    quickstart = Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.toml"
    scn = asyncsim.load_scenario(quickstart, profile="smoke",
                                 overrides=["protocol.n=8", "model.name=\"mlp\"",
                                            "run.epochs=0.05"])
    trace = asyncsim.simulate(scn)
    assert trace.gradients_df().groupby("learner").staleness.mean().notna().all()
    result = asyncsim.run(scn)
    again = asyncsim.replay(scn, result.trace)
    assert again.summary["param_hash"] == result.summary["param_hash"]
