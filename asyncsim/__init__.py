"""asyncsim: a discrete-event simulator for staleness and minima selection in async SGD.

SimPy models learners with configurable compute-time distributions and network delays; a
parameter server applies their real JAX gradients under the protocols of the literature
(hardsync, n-softsync, async, fixed delay, SSP) through one update core shared by simulated
runs, exact replays and real runs on Ray.

The public API::

    scn = asyncsim.load_scenario("scenarios/quickstart.toml", profile="smoke")
    trace = asyncsim.simulate(scn)                 # timing only
    result = asyncsim.run(scn)                      # real gradients (online driver)
    result.trace.gradients_df(), result.evals, result.summary, result.params
    again = asyncsim.replay(scn, result.trace)      # exact re-execution, no event loop
    run = asyncsim.open_run("runs/quickstart/seed0")  # a run folder's results
    sweep = asyncsim.open_sweep("runs/p1_f3_lr_modulation")  # a sweep's, one row a point
"""

import importlib
import importlib.util
from typing import TYPE_CHECKING

from asyncsim import machine as _machine

# Before anything imports JAX: XLA's and BLAS's thread counts and XLA's platform-independent
# math, so that a run's bits depend on neither the core count nor the CPU model
# (asyncsim.machine).
_machine.fix_settings()

# The public names and the modules that define them. They are imported on first use
# (PEP 562), so that `asyncsim --help`, argument errors and other commands that never touch
# JAX do not pay for importing it (about 1.5 s of the CLI's start-up, measured).
_EXPORTS = {
    "CoreState": "asyncsim.numerics.core",
    "Dataset": "asyncsim.numerics.data",
    "DelayModel": "asyncsim.timing.delays",
    "Model": "asyncsim.numerics.models",
    "Protocol": "asyncsim.timing.protocols",
    "RunResult": "asyncsim.drivers.result",
    "Scenario": "asyncsim.config",
    "ScenarioError": "asyncsim.errors",
    "Trace": "asyncsim.trace",
    "TraceResult": "asyncsim.api",
    "UpdateCore": "asyncsim.numerics.core",
    "as_optax": "asyncsim.numerics.core",
    "get_dataset": "asyncsim.numerics.data",
    "get_model": "asyncsim.numerics.models",
    "load_scenario": "asyncsim.scenario",
    "make_core": "asyncsim.numerics.core",
    "make_delay": "asyncsim.timing.delays",
    "open_run": "asyncsim.results",
    "open_sweep": "asyncsim.results",
    "param_hash": "asyncsim.numerics.core",
    "register_dataset": "asyncsim.numerics.data",
    "register_delay": "asyncsim.timing.delays",
    "register_lr_rule": "asyncsim.numerics.lr_rules",
    "register_model": "asyncsim.numerics.models",
    "register_protocol": "asyncsim.timing.protocols",
    "replay": "asyncsim.api",
    "run": "asyncsim.api",
    "run_sweep": "asyncsim.sweep",
    "simulate": "asyncsim.api",
    "trace_run": "asyncsim.api",
}

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from asyncsim.api import TraceResult, replay, run, simulate, trace_run
    from asyncsim.config import Scenario
    from asyncsim.drivers.result import RunResult
    from asyncsim.errors import ScenarioError
    from asyncsim.numerics.core import CoreState, UpdateCore, as_optax, make_core, param_hash
    from asyncsim.numerics.data import Dataset, get_dataset, register_dataset
    from asyncsim.numerics.lr_rules import register_lr_rule
    from asyncsim.numerics.models import Model, get_model, register_model
    from asyncsim.results import open_run, open_sweep
    from asyncsim.scenario import load_scenario
    from asyncsim.sweep import run_sweep
    from asyncsim.timing.delays import DelayModel, make_delay, register_delay
    from asyncsim.timing.protocols import Protocol, register_protocol
    from asyncsim.trace import Trace


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"asyncsim.{name}"):
        value = importlib.import_module(f"asyncsim.{name}")  # `asyncsim.timing.…` works too
    else:
        raise AttributeError(f"module 'asyncsim' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__version__ = "0.10.0"

__all__ = [
    "CoreState",
    "Dataset",
    "DelayModel",
    "Model",
    "Protocol",
    "RunResult",
    "Scenario",
    "ScenarioError",
    "Trace",
    "TraceResult",
    "UpdateCore",
    "as_optax",
    "get_dataset",
    "get_model",
    "load_scenario",
    "make_core",
    "make_delay",
    "open_run",
    "open_sweep",
    "param_hash",
    "register_dataset",
    "register_delay",
    "register_lr_rule",
    "register_model",
    "register_protocol",
    "replay",
    "run",
    "run_sweep",
    "simulate",
    "trace_run",
]
