"""The top-level API: what ``asyncsim/__init__.py`` re-exports, that no re-exported name
hides a submodule, and that asyncsim 0.1's module paths and names are gone (0.4.0)."""

import importlib
import pkgutil
import sys

import pytest

import asyncsim


def test_all_names_exist_and_are_documented():
    for name in asyncsim.__all__:
        obj = getattr(asyncsim, name)
        assert obj.__doc__, f"asyncsim.{name} has no docstring"


def test_no_reexport_shadows_a_submodule():
    for info in pkgutil.iter_modules(asyncsim.__path__):
        mod = importlib.import_module(f"asyncsim.{info.name}")
        attr = getattr(asyncsim, info.name)
        assert attr is mod, f"asyncsim.{info.name} is {attr!r}, not the submodule"


# asyncsim 0.1's module paths, forwarded through 0.2 and 0.3 and removed in 0.4.0
# (CHANGELOG.md has the table of their new homes).
OLD_MODULES = ["cluster", "core", "data", "delays", "edges", "engine", "invariants", "models",
               "models_imagenet", "online", "protocols", "real", "replayer", "sharpness"]
# 0.1 names of modules that stayed, removed in 0.4.0 (CHANGELOG.md says what to call instead).
OLD_NAMES = [("asyncsim.api", "message_bytes"), ("asyncsim.api", "trace_summary"),
             ("asyncsim.api", "train_size"), ("asyncsim.runs", "jsonable"),
             ("asyncsim.runs", "write_scenario"), ("asyncsim.scenario", "validate"),
             ("asyncsim.stability", "LR_RULES")]


def test_the_0_1_module_paths_are_gone():
    for old in OLD_MODULES:
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"asyncsim.{old}")
        with pytest.raises(AttributeError, match="no attribute"):
            getattr(asyncsim, old)


def test_the_0_1_names_are_gone():
    for module, name in OLD_NAMES:
        with pytest.raises(AttributeError):
            getattr(importlib.import_module(module), name)


def test_replay_is_the_apis():
    """``asyncsim.replay`` is the API's replay (it measures what [measure] asks), not the
    drivers' loop it wraps."""
    from asyncsim import api
    from asyncsim.drivers import replay as loop

    assert asyncsim.replay is api.replay
    assert asyncsim.replay is not loop.replay


def test_import_is_lazy_and_submodules_are_reachable_as_attributes():
    """`import asyncsim` (and so `asyncsim --help`) does not import JAX or pandas; the public
    names and the submodules load on first use."""
    import subprocess

    code = ("import sys, asyncsim, asyncsim.cli; "
            "assert 'jax' not in sys.modules and 'pandas' not in sys.modules, 'eager'; "
            "import asyncsim.timing.delays as d, asyncsim.numerics.models as m; "
            "assert asyncsim.timing.delays.register_delay is d.register_delay; "
            "assert 'alexnet' in asyncsim.numerics.models.available_models(); "
            "assert asyncsim.Trace.__module__ == 'asyncsim.trace'; "
            "assert asyncsim.as_optax.__module__ == 'asyncsim.numerics.core'")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert set(asyncsim.__all__) <= set(dir(asyncsim))


def test_version_is_the_packages_and_the_cli_prints_it(capsys):
    import tomllib
    from pathlib import Path

    from asyncsim.cli import main

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert asyncsim.__version__ == pyproject["project"]["version"]
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"asyncsim {asyncsim.__version__}"
