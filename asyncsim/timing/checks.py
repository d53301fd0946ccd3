"""The checks of a scenario's ``[cluster]`` table (:func:`asyncsim.scenario.check` calls
:func:`check_cluster`): the cluster's rules live with the timing layer that runs it, beside
the delay models' and protocols' own checks."""

from __future__ import annotations

from pathlib import Path

from asyncsim import _checks
from asyncsim.config import SHARINGS, ClusterConfig, ProtocolConfig
from asyncsim.errors import ScenarioError
from asyncsim.timing.delays import make_delay
from asyncsim.timing.protocols import protocol_options
from asyncsim.trace import MAX_LEARNERS


def check_cluster(cluster: ClusterConfig, protocol: ProtocolConfig,
                  base_dir: Path | None) -> None:
    """The cluster's checks: learners, delay specs (against the registry), links, the PS's
    interface and availability (the protocol: what fixed-delay's serial schedules refuse); a
    one-line ScenarioError under the key at fault."""
    c = cluster
    lam = c.learners
    _checks.integer("cluster.learners", lam, high=MAX_LEARNERS)
    if isinstance(c.compute, tuple):
        if len(c.compute) != lam:
            raise ScenarioError("cluster.compute", f"a per-learner list needs {lam} entries "
                                f"(cluster.learners), got {len(c.compute)}")
        for i, spec in enumerate(c.compute):
            make_delay(spec, key=f"cluster.compute[{i}]", base_dir=base_dir)
    else:
        make_delay(c.compute, key="cluster.compute", base_dir=base_dir)
    if c.speed is not None:
        if len(c.speed) != lam:
            raise ScenarioError("cluster.speed", f"needs {lam} entries (cluster.learners), "
                                f"got {len(c.speed)}")
        for i, s in enumerate(c.speed):
            _checks.positive(f"cluster.speed[{i}]", s, finite=True)
    for direction in ("pull", "push"):
        link = getattr(c.network, direction)
        key = f"cluster.network.{direction}"
        make_delay(link.latency, key=f"{key}.latency", base_dir=base_dir)
        _bandwidth(f"{key}.bandwidth", link.bandwidth)
        if link.bytes is not None:
            _checks.integer(f"{key}.bytes", link.bytes, low=0)
    for direction in ("ps_ingress", "ps_egress"):
        shared = getattr(c.network, direction)
        if shared is None:
            continue
        key = f"cluster.network.{direction}"
        _bandwidth(f"{key}.bandwidth", shared.bandwidth)
        _checks.choice(f"{key}.sharing", shared.sharing, SHARINGS)
        serial = _serial_schedule(protocol)
        if serial:
            raise ScenarioError(key, f"fixed-delay's {serial!r} schedule steps its workers "
                                "one at a time and models no network; remove the shared "
                                "link or use schedule = \"race\"")
    if c.ps_service is not None:
        make_delay(c.ps_service, key="cluster.ps_service", base_dir=base_dir)
    if c.availability is not None:
        _check_availability(c, protocol, base_dir)


def _check_availability(cluster: ClusterConfig, protocol: ProtocolConfig,
                        base_dir: Path | None) -> None:
    avail, lam = cluster.availability, cluster.learners
    if isinstance(avail, tuple):
        if len(avail) != lam:
            raise ScenarioError("cluster.availability", f"a per-learner list needs {lam} "
                                f"entries (cluster.learners), got {len(avail)}")
        tables = [(f"cluster.availability[{i}]", a) for i, a in enumerate(avail)]
    else:
        tables = [("cluster.availability", avail)]
    for key, a in tables:
        for period in ("up", "down"):
            spec = getattr(a, period)
            if spec is None:
                raise ScenarioError(f"{key}.{period}", "is required: a delay spec such as "
                                    "{ dist = \"exponential\", mean = 100.0 }")
            model = make_delay(spec, key=f"{key}.{period}", base_dir=base_dir)
            if period == "up" and model.mean == 0:
                raise ScenarioError(f"{key}.up", "must have a positive mean: a learner that "
                                    "is never up for any time never delivers a gradient")
    serial = _serial_schedule(protocol)
    if serial:
        raise ScenarioError("cluster.availability", f"fixed-delay's {serial!r} schedule steps "
                            "its workers one at a time and has no learners to take down; "
                            "remove it or use schedule = \"race\"")


def _serial_schedule(protocol: ProtocolConfig) -> str | None:
    """fixed-delay's schedule when it steps one worker at a time (not ``race``), else None."""
    if protocol.kind != "fixed-delay":
        return None
    schedule = protocol_options(protocol)["schedule"]
    return None if schedule == "race" else schedule


def _bandwidth(key: str, value: float) -> None:
    """A link's bandwidth, private or the PS's shared interface."""
    _checks.positive(key, value, unit="bytes per second (inf = free)")
