"""asyncsim 0.1 functions whose job moved, for the deprecated paths of one release (0.2).

Each is the 0.1 call written with the new pieces; :mod:`asyncsim._moved` forwards the old
names here (with a DeprecationWarning). Dead 0.1 helpers (``replay_many``,
``summarize_params``, ``nan_to_none``, ``get_dotted``, ``read_index``, ``params_finite``,
``cluster.simulate``) are gone, not forwarded.
"""

from __future__ import annotations

from typing import Any

from asyncsim.config import Scenario
from asyncsim.trace import Trace


def truncate(trace: Trace, updates: int) -> Trace:
    """0.1's ``replayer.truncate``: :meth:`asyncsim.trace.Trace.truncate`."""
    return trace.truncate(updates, stop_reason="diverged")


def trace_summary(trace: Trace) -> dict[str, Any]:
    """0.1's ``api.trace_summary``: :meth:`asyncsim.trace.Trace.summary`."""
    return trace.summary()


def train_size(scn: Scenario) -> int:
    """0.1's ``api.train_size``: :func:`asyncsim.numerics.data.train_size`."""
    from asyncsim.numerics.data import train_size as size

    return size(scn.data.name, scn.data.options)


def updates_per_epoch(scn: Scenario, n_train: int) -> float:
    """0.1's ``engine.updates_per_epoch``: PS updates per pass over the train set."""
    from asyncsim.timing.protocols import make_protocol

    proto = make_protocol(scn.protocol, scn.cluster.learners)
    return n_train * proto.updates_per_gradient() / scn.data.batch_size


def scan_replay(scn: Scenario, trace: Trace, *, hyper: dict[str, float] | None = None):
    """0.1's ``edges.scan_replay``: the final parameters of the compiled-chunk replay."""
    from asyncsim.drivers.scan import replay_scan

    return replay_scan(scn, trace, hyper=hyper).params


def __getattr__(name: str) -> Any:
    # 0.1's ``stability.LR_RULES`` (a tuple of rule names): the registered rules now, computed
    # on use so importing this module loads no JAX.
    if name == "LR_RULES":
        from asyncsim.numerics.lr_rules import available_lr_rules

        return tuple(available_lr_rules())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
