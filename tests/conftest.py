"""Test settings: hypothesis profiles (dev: quick; ci: deterministic) and a CPU-only JAX."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("dev", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
# CI replays the same examples every run: a red CI is a real failure, not a new draw.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")
