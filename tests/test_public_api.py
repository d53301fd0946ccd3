"""The top-level API: what ``asyncsim/__init__.py`` re-exports, and that no re-exported
name hides a submodule (``asyncsim.replay`` is the function; its module is
``asyncsim.replayer``, so ``asyncsim.replayer.slot_plan`` and ``import asyncsim.replayer``
both reach the module)."""

import importlib
import pkgutil
import sys
import types

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


def test_replay_function_and_module():
    import asyncsim.replayer as replayer

    assert isinstance(replayer, types.ModuleType)
    assert sys.modules["asyncsim.replayer"] is replayer
    assert asyncsim.replay is replayer.replay and callable(asyncsim.replay)
    assert callable(asyncsim.replayer.slot_plan)


def test_import_is_lazy_and_submodules_are_reachable_as_attributes():
    """`import asyncsim` (and so `asyncsim --help`) does not import JAX or pandas; the public
    names and the submodules load on first use."""
    import subprocess

    code = ("import sys, asyncsim, asyncsim.cli; "
            "assert 'jax' not in sys.modules and 'pandas' not in sys.modules, 'eager'; "
            "assert callable(asyncsim.delays.register_delay); "
            "assert 'alexnet' in asyncsim.models.available_models(); "
            "assert asyncsim.Trace.__module__ == 'asyncsim.trace'")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert set(asyncsim.__all__) <= set(dir(asyncsim))


def test_version_is_the_packages_and_the_cli_prints_it(capsys):
    import tomllib
    from pathlib import Path

    from asyncsim.cli import main

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert asyncsim.__version__ == pyproject["project"]["version"]
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"asyncsim {asyncsim.__version__}"
