"""Test settings: hypothesis profiles (dev: quick; ci: deterministic) and a CPU-only JAX."""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Before any test module imports JAX: asyncsim fixes XLA's and BLAS's thread counts as a
# user's program gets them (asyncsim.machine).
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import asyncsim  # noqa: E402, F401

settings.register_profile("dev", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
# CI replays the same examples every run: a red CI is a real failure, not a new draw.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


PLUGIN_DIR = Path(__file__).parent / "plugin_pkg"

# The tiny scenario most tests start from: a 16-unit MLP on 256 synthetic images, 8 per batch
# (a gradient costs well under a millisecond, and the programs compile in about a second).
TINY = {"name": "tiny", "seed": 7, "model": {"name": "mlp", "hidden": [16]},
        "data": {"name": "synthetic-cifar", "batch_size": 8, "n_train": 256, "n_test": 64},
        "cluster": {"learners": 3}, "protocol": {"kind": "async"},
        "optimizer": {"lr": 0.05}, "run": {"updates": 30, "eval_every": 10}}


def load_file(path: Path, name: str):
    """The Python file at ``path`` imported as module ``name`` (a benchmark script, the lint
    script, the example plug-in), without putting its folder on ``sys.path``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Killed(Exception):
    """What :class:`DieAt` raises: a run killed in process."""


def record_states(states: dict):
    """A run's monitor that keeps every update's CoreState, as numpy arrays, in
    ``states[version]``: what a hand re-execution starts each update from."""
    import jax
    import numpy as np

    from asyncsim.drivers.driver import Observer

    def record(version, state):
        states[version] = jax.tree_util.tree_map(np.array, state)

    return Observer(record)


class DieAt:
    """A run's monitor that kills it (in process, so the point is exact) at update ``at``,
    after the checkpoints its scenario takes before then: an unfinished run folder."""

    every = 1

    def __init__(self, at: int):
        self.at = at

    def observe(self, driver, version):
        if version >= self.at:
            raise Killed(version)

    def finish(self, driver):
        return {}


def merged(base: dict, **tables) -> dict:
    """``base`` with ``tables`` laid over it, tables merged one level deep."""
    d = copy.deepcopy(base)
    for k, v in tables.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    return d


class TinyScenarios:
    """``tiny(cluster={"learners": 4}, run={"updates": 6})``: :data:`TINY` with those keys
    replaced (one level deep), loaded; ``tiny.with_defaults(...)``: a factory with other
    defaults (a test module's own)."""

    def __init__(self, base: dict):
        self.base = base

    def __call__(self, **tables):
        from asyncsim.scenario import load_scenario

        return load_scenario(merged(self.base, **tables))

    def with_defaults(self, **tables) -> TinyScenarios:
        return TinyScenarios(merged(self.base, **tables))


@pytest.fixture(scope="session")
def tiny() -> TinyScenarios:
    """The factory of tiny scenarios (:class:`TinyScenarios`)."""
    return TinyScenarios(TINY)


@pytest.fixture(scope="module")
def num_cache():
    """A module's Numerics per (seed, model, data, optimizer, learners, protocol): built once,
    its programs compiled once."""
    from asyncsim.drivers.build import numerics_for

    cache = {}

    def get(scn):
        key = (scn.seed, repr(scn.model), repr(scn.data), repr(scn.optimizer),
               scn.cluster.learners, repr(scn.protocol))
        if key not in cache:
            cache[key] = numerics_for(scn)
        return cache[key]

    return get


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
