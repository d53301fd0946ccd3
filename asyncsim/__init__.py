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
"""

from asyncsim import models_imagenet  # noqa: F401  (registers "alexnet", P1-F4)
from asyncsim.api import TraceResult, simulate, trace_run
from asyncsim.config import Scenario
from asyncsim.core import CoreState, UpdateCore, make_core, param_hash, register_lr_rule
from asyncsim.data import Dataset, get_dataset, register_dataset
from asyncsim.delays import DelayModel, make_delay, register_delay
from asyncsim.errors import ScenarioError
from asyncsim.models import Model, get_model, register_model
from asyncsim.online import RunResult, run
from asyncsim.protocols import Protocol, register_protocol
from asyncsim.replayer import replay
from asyncsim.scenario import load_scenario
from asyncsim.sweep import run_sweep
from asyncsim.trace import Trace

__version__ = "0.1.0"

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
    "get_dataset",
    "get_model",
    "load_scenario",
    "make_core",
    "make_delay",
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
