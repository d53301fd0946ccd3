"""The top-level API: what ``asyncsim/__init__.py`` re-exports, that no re-exported name
hides a submodule, and that asyncsim 0.1's module paths keep importing (with a
DeprecationWarning) for a release."""

import importlib
import pkgutil
import sys
import types
import warnings

import pytest

import asyncsim


def test_all_names_exist_and_are_documented():
    for name in asyncsim.__all__:
        obj = getattr(asyncsim, name)
        assert obj.__doc__, f"asyncsim.{name} has no docstring"


def test_no_reexport_shadows_a_submodule():
    for info in pkgutil.iter_modules(asyncsim.__path__):
        with warnings.catch_warnings():  # the 0.1 paths among them warn (tested below)
            warnings.simplefilter("ignore", DeprecationWarning)
            mod = importlib.import_module(f"asyncsim.{info.name}")
        attr = getattr(asyncsim, info.name)
        assert attr is mod, f"asyncsim.{info.name} is {attr!r}, not the submodule"


OLD_PATHS = {  # asyncsim 0.1's modules: where a name they had lives now
    "asyncsim.engine": ("Numerics", "asyncsim.numerics.numerics"),
    "asyncsim.replayer": ("slot_plan", "asyncsim.drivers.scan"),
    "asyncsim.online": ("Driver", "asyncsim.drivers.driver"),
    "asyncsim.edges": ("find_edges", "asyncsim.stability.measured"),
    "asyncsim.core": ("make_core", "asyncsim.numerics.core"),
    "asyncsim.delays": ("Lognormal", "asyncsim.timing.delays.builtin"),
    "asyncsim.protocols": ("Softsync", "asyncsim.timing.protocols"),
    "asyncsim.cluster": ("Simulation", "asyncsim.timing.cluster"),
    "asyncsim.real": ("real_run", "asyncsim.drivers.real.run"),
    "asyncsim.models": ("mlp", "asyncsim.numerics.models.small"),
    "asyncsim.data": ("batch_indices", "asyncsim.numerics.data"),
    "asyncsim.sharpness": ("sharpness", "asyncsim.stability.sharpness"),
    "asyncsim.invariants": ("check_trace", "asyncsim.testing.invariants"),
}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_old_module_paths_keep_importing_with_a_deprecation_warning(old):
    name, new = OLD_PATHS[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated since asyncsim 0.2"):
        mod = importlib.import_module(old)
    assert getattr(mod, name) is getattr(importlib.import_module(new), name)


OLD_NAMES = {  # asyncsim 0.1's names in modules that stayed: what they are now
    ("asyncsim.api", "message_bytes"): ("asyncsim.drivers.build", "message_bytes"),
    ("asyncsim.runs", "jsonable"): ("asyncsim._io", "jsonable"),
    ("asyncsim.runs", "write_scenario"): ("asyncsim.drivers.folder_scenario", "write_scenario"),
    ("asyncsim.scenario", "validate"): ("asyncsim.scenario", "check"),
    ("asyncsim.api", "trace_summary"): ("asyncsim._compat", "trace_summary"),
}


@pytest.mark.parametrize("old", sorted(OLD_NAMES), ids=".".join)
def test_old_names_in_kept_modules_warn_and_forward(old):
    module, name = old
    new_module, new_name = OLD_NAMES[old]
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{module}.{name} is deprecated"):
        obj = getattr(mod, name)
    assert obj is getattr(importlib.import_module(new_module), new_name)
    with pytest.raises(AttributeError, match="no attribute"):
        _ = mod.no_such_name_in_0_1


def test_old_lr_rules_tuple_lists_the_registered_rules(tiny):
    from asyncsim import api
    from asyncsim.numerics.lr_rules import available_lr_rules

    with pytest.warns(DeprecationWarning, match="available_lr_rules"):
        rules = asyncsim.stability.LR_RULES
    assert rules == tuple(available_lr_rules())
    assert {"constant", "inverse-staleness", "stability-edge"} <= set(rules)
    with pytest.warns(DeprecationWarning, match="Trace.summary"):
        summary = api.trace_summary(asyncsim.simulate(tiny(run={"updates": 5})))
    assert summary["updates"] == 5


def test_replay_function_and_module():
    """``asyncsim.replay`` is the API's replay (it measures what [measure] asks); the old
    module ``asyncsim.replayer`` forwards to it and to the drivers."""
    from asyncsim import api
    from asyncsim.drivers import scan

    sys.modules.pop("asyncsim.replayer", None)
    with pytest.warns(DeprecationWarning):
        replayer = importlib.import_module("asyncsim.replayer")
    assert isinstance(replayer, types.ModuleType)
    assert sys.modules["asyncsim.replayer"] is replayer
    assert asyncsim.replay is api.replay and replayer.replay is api.replay
    assert replayer.slot_plan is scan.slot_plan


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

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert asyncsim.__version__ == pyproject["project"]["version"]
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"asyncsim {asyncsim.__version__}"
