"""Test settings: hypothesis profiles (dev: quick; ci: deterministic) and a CPU-only JAX."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("dev", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
# CI replays the same examples every run: a red CI is a real failure, not a new draw.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


PLUGIN_DIR = Path(__file__).parent / "plugin_pkg"


@pytest.fixture
def fresh_registries():
    """Every plug-in registry (delay models, protocols, lr rules, models, data sets) is put
    back as it was after the test: what the test registers does not leak into others."""
    from asyncsim.api import registries

    saved = {group: reg.snapshot() for group, reg in registries().items()}
    yield registries()
    for group, reg in registries().items():
        reg.restore(saved[group])


@pytest.fixture(scope="session")
def installed_plugin(tmp_path_factory):
    """Install tests/plugin_pkg with pip into a temporary target dir on sys.path, offline.

    A ``--target`` dir keeps the running interpreter's site-packages untouched (others may be
    running tests in it); ``importlib.metadata`` scans ``sys.path`` on every call, so the
    distribution and its entry points are visible as soon as the dir is on the path. On
    teardown every registry forgets what it loaded from it.
    """
    from asyncsim.api import registries

    target = tmp_path_factory.mktemp("plugin_site")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    cmd += ["--no-index", "--disable-pip-version-check", "--quiet", "--target", str(target)]
    subprocess.run([*cmd, str(PLUGIN_DIR)], check=True, capture_output=True, timeout=120)
    sys.path.insert(0, str(target))
    yield target
    sys.path.remove(str(target))
    sys.modules.pop("asyncsim_plugin_example", None)
    for reg in registries().values():
        reg.forget_plugins()
