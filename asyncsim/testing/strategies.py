"""Hypothesis strategies for asyncsim's inputs: delay specs, clusters, protocols, scenarios
(re-exported by :mod:`asyncsim.testing`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from asyncsim.config import ClusterConfig, ProtocolConfig, Scenario, from_dict

__all__ = [
    "clusters",
    "delay_specs",
    "plugin_specs",
    "protocols",
    "scenarios",
]

# --- strategies ---

# Built-ins the strategies can generate; ``empirical`` needs a CSV file, so it is not here.
DELAY_DISTS = (
    "constant",
    "exponential",
    "gamma",
    "lognormal",
    "normal",
    "shifted-exponential",
    "straggler",
    "uniform",
)
PROTOCOL_KINDS = ("async", "softsync", "hardsync", "ssp", "fixed-delay")
FIXED_DELAY_MAX_TAU = 16
_MIN_MEAN = 1e-3  # keep durations away from 0 so runs make progress in simulated time
_MAX_GRADIENTS = 2000  # per generated scenario, so that simulating one takes milliseconds


def _check_names(arg: str, given: Sequence[str] | None, known: Sequence[str]) -> tuple[str, ...]:
    if given is None:
        return tuple(known)
    given = tuple(given)
    bad = [g for g in given if g not in known]
    if bad or not given:
        raise InvalidArgument(f"{arg}={given!r}: allowed values are {', '.join(known)}")
    return given


def _fraction(lo: float = 0.0, hi: float = 1.0) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


@st.composite
def _spec(draw: st.DrawFn, dist: str, max_mean: float, dists: tuple[str, ...]) -> dict[str, Any]:
    """One spec of ``dist`` whose mean lies in [_MIN_MEAN, max_mean]."""
    if dist == "straggler":
        p = draw(_fraction(0.0, 0.5))
        factor = draw(_fraction(1.0, 10.0))
        base_dists = tuple(d for d in dists if d in DELAY_DISTS and d != "straggler") or (
            "constant",)
        base_max = max_mean / (1.0 - p + p * factor)
        if base_max < _MIN_MEAN:  # no room for a slowdown under a tiny max_mean
            p, base_max = 0.0, max_mean
        base = draw(st.sampled_from(base_dists).flatmap(lambda d: _spec(d, base_max, dists)))
        return {"dist": "straggler", "base": base, "p": p, "factor": factor}
    m = draw(_fraction(_MIN_MEAN, max_mean))
    if dist == "constant":
        return {"dist": "constant", "value": m}
    if dist == "uniform":
        low = m * draw(_fraction())
        return {"dist": "uniform", "low": low, "high": max(2.0 * m - low, low)}
    if dist == "normal":
        return {"dist": "normal", "mean": m, "std": m * draw(_fraction())}
    if dist in ("lognormal", "gamma"):
        return {"dist": dist, "mean": m, "cv": draw(_fraction(0.0, 2.0))}
    if dist == "exponential":
        return {"dist": "exponential", "mean": m}
    if dist == "shifted-exponential":
        f = draw(_fraction(0.0, 0.99))
        return {"dist": dist, "shift": m * f, "mean_excess": m * (1.0 - f)}
    raise InvalidArgument(f"no strategy for delay model {dist!r}")  # pragma: no cover


def delay_specs(
    *, dists: Sequence[str] | None = None, max_mean: float = 10.0
) -> st.SearchStrategy[dict[str, Any]]:
    """Valid delay-model specs ``{"dist": name, **params}``.

    Args:
        dists: names to draw from (default: every built-in except ``empirical``, which needs
            a file); a plug-in's name (installed or registered) draws :func:`plugin_specs`.
            ``straggler`` nests a spec of one of the other built-ins given.
        max_mean: upper bound on the mean of a generated model (its lower bound is 1e-3).

    Every spec is accepted by :func:`asyncsim.delays.make_delay`, and the model's analytic
    ``mean`` (untruncated for ``normal``) is at most ``max_mean``.
    """
    from asyncsim.timing.delays import available_delays

    plugins = [d for d in available_delays() if d not in DELAY_DISTS and d != "empirical"]
    # By default the built-ins only, so a test's draws do not change with what is installed.
    names = _check_names("dists", dists if dists is not None else DELAY_DISTS,
                         (*DELAY_DISTS, *plugins))
    if not max_mean >= _MIN_MEAN:
        raise InvalidArgument(f"max_mean={max_mean!r} must be >= {_MIN_MEAN}")
    return st.sampled_from(names).flatmap(
        lambda d: _spec(d, max_mean, names) if d in DELAY_DISTS else plugin_specs(d, max_mean))


def plugin_specs(dist: str, max_mean: float = 10.0) -> st.SearchStrategy[dict[str, Any]]:
    """Specs ``{"dist": dist, **params}`` of a plug-in delay model, for property tests of
    your own model (docs/plugins.md).

    The model may declare them: a classmethod ``spec_strategy(max_mean)`` returning a
    strategy of parameter dicts. Otherwise they are derived from its ``__init__``
    signature (the parameter list asyncsim checks scenarios against): a ``float`` in
    [1e-3, max_mean], an ``int`` in 0..10, a ``bool``; a parameter with a default is
    sometimes left out. Either way only specs :func:`asyncsim.delays.make_delay` accepts
    and whose model's ``mean`` (when it knows one) is at most ``max_mean`` are drawn; a
    required parameter of another type (a file path) needs ``spec_strategy``.
    """
    from asyncsim._registry import alternatives, signature_options
    from asyncsim.drivers.plugins import registries
    from asyncsim.errors import ScenarioError
    from asyncsim.timing.delays import make_delay

    cls = registries()["asyncsim.delays"].get(dist, "dist")
    own = getattr(getattr(cls, "_wrapped", cls), "spec_strategy", None)
    if own is not None:
        params = own(max_mean)
    else:
        sig, hints, _ = signature_options(cls)
        fields: dict[str, st.SearchStrategy[Any]] = {}
        optional: list[str] = []
        for name, param in sig.items():
            kinds = alternatives(hints.get(name))
            if float in kinds:
                value = _fraction(_MIN_MEAN, max_mean)
            elif bool in kinds:
                value = st.booleans()
            elif int in kinds:
                value = st.integers(0, 10)
            elif param.default is not param.empty:
                continue  # a type no strategy is derived for: keep its default
            else:
                raise InvalidArgument(f"delay model {dist!r}: no strategy for its required "
                                      f"parameter {name!r}; give the model a classmethod "
                                      "spec_strategy(max_mean)")
            fields[name] = value
            if param.default is not param.empty:
                optional.append(name)
        params = st.fixed_dictionaries(
            {k: v for k, v in fields.items() if k not in optional},
            optional={k: fields[k] for k in optional})

    def usable(spec: dict[str, Any]) -> bool:
        try:
            mean = make_delay(spec).mean
        except ScenarioError:
            return False
        return mean is None or mean <= max_mean

    return params.map(lambda p: {"dist": dist, **p}).filter(usable)


def _latencies() -> st.SearchStrategy[dict[str, Any]]:
    # Zero latency is the common case in the papers' setups, so draw it often.
    zero = st.just({"dist": "constant", "value": 0.0})
    return st.one_of(zero, delay_specs(max_mean=1.0))


@st.composite
def _link(draw: st.DrawFn) -> dict[str, Any]:
    link: dict[str, Any] = {"latency": draw(_latencies())}
    if draw(st.booleans()):
        # A finite bandwidth with an explicit size, so no model parameter count is needed.
        link["bandwidth"] = draw(_fraction(1e6, 1e9))
        link["bytes"] = draw(st.integers(0, 1_000_000))
    return link


@st.composite
def _cluster_dict(
    draw: st.DrawFn, min_learners: int, max_learners: int, dists: Sequence[str] | None
) -> dict[str, Any]:
    lam = draw(st.integers(min_learners, max_learners))
    specs = delay_specs(dists=dists)
    d: dict[str, Any] = {"learners": lam}
    if draw(st.booleans()):
        d["compute"] = draw(specs)
    else:
        d["compute"] = draw(st.lists(specs, min_size=lam, max_size=lam))
    if draw(st.booleans()):
        d["speed"] = draw(st.lists(_fraction(0.25, 4.0), min_size=lam, max_size=lam))
    d["network"] = {"pull": draw(_link()), "push": draw(_link())}
    for shared, link in (("ps_ingress", "push"), ("ps_egress", "pull")):
        if draw(st.booleans()):
            # The PS's shared interface (timing/links.py), with an explicit message size.
            d["network"][shared] = {"bandwidth": draw(_fraction(1e6, 1e9)),
                                    "sharing": draw(st.sampled_from(["fair", "fifo"]))}
            d["network"][link].setdefault("bytes", draw(st.integers(1, 1_000_000)))
    if draw(st.booleans()):
        d["ps_service"] = draw(delay_specs(dists=dists, max_mean=0.1))
    if draw(st.booleans()):
        d["availability"] = draw(_availability(d))
    return d


def _period(mean: float) -> st.SearchStrategy[dict[str, Any]]:
    if mean == 0.0:
        return st.just({"dist": "constant", "value": 0.0})
    return st.one_of(st.just({"dist": "exponential", "mean": mean}),
                     st.just({"dist": "constant", "value": mean}),
                     _fraction(0.1, 1.0).map(lambda cv: {"dist": "gamma", "mean": mean,
                                                          "cv": cv}))


@st.composite
def _availability(draw: st.DrawFn, cluster: dict[str, Any]) -> Any:
    """Up and down periods on the scale of the slowest learner's compute time (up: 1..10 of
    them, so gradients get through; down: 0..3), for all learners or one table each."""
    from asyncsim.timing.delays import make_delay

    def mean(spec: dict[str, Any]) -> float:
        m = make_delay(spec).mean
        return 10.0 if m is None else m

    specs = cluster["compute"] if isinstance(cluster["compute"], list) else [cluster["compute"]]
    unit = max(mean(s) for s in specs) / min(cluster.get("speed") or [1.0])
    # Plus a step's network and PS time, every learner queueing at the PS's interface.
    lam, net = cluster["learners"], cluster["network"]
    for direction, shared in (("pull", "ps_egress"), ("push", "ps_ingress")):
        link = net[direction]
        unit += mean(link["latency"]) + link.get("bytes", 0) / link.get("bandwidth", math.inf)
        if shared in net:
            unit += lam * link.get("bytes", 0) / net[shared]["bandwidth"]
    if "ps_service" in cluster:
        unit += 2 * lam * mean(cluster["ps_service"])
    unit = max(unit, _MIN_MEAN)

    def one(draw: st.DrawFn) -> dict[str, Any]:
        up = draw(_period(unit * draw(_fraction(1.0, 10.0))))
        down = draw(_period(unit * draw(st.one_of(st.just(0.0), _fraction(0.01, 3.0)))))
        return {"up": up, "down": down}

    if draw(st.booleans()):
        return one(draw)
    return [one(draw) for _ in range(cluster["learners"])]


def _check_learners(min_learners: int, max_learners: int) -> None:
    if not 1 <= min_learners <= max_learners:
        raise InvalidArgument(
            f"need 1 <= min_learners <= max_learners, got {min_learners}, {max_learners}"
        )


def clusters(
    *, min_learners: int = 1, max_learners: int = 64, dists: Sequence[str] | None = None
) -> st.SearchStrategy[ClusterConfig]:
    """:class:`~asyncsim.config.ClusterConfig` values with ``min_learners..max_learners``
    learners: one compute spec for all or one per learner (from :func:`delay_specs` with
    ``dists``), optional speed factors in [0.25, 4], pull/push latencies (often exactly zero,
    sometimes with a finite bandwidth), optional shared PS links, an optional PS service
    time and optional availability (up periods of 1..10 times the slowest learner's mean
    compute time, down periods of 0..3 times it; exponential, constant or gamma)."""
    _check_learners(min_learners, max_learners)
    _check_names("dists", dists, DELAY_DISTS)
    return _cluster_dict(min_learners, max_learners, dists).map(
        lambda d: from_dict(ClusterConfig, d, prefix="cluster")
    )


def _protocol_kinds(learners: int, kinds: Sequence[str] | None) -> tuple[str, ...]:
    names = _check_names("kinds", kinds, PROTOCOL_KINDS)
    # fixed-delay runs exactly tau + 1 workers (P2's simulation), tau in 0..16.
    return tuple(k for k in names if k != "fixed-delay" or 1 <= learners <= FIXED_DELAY_MAX_TAU + 1)


@st.composite
def _protocol_dict(draw: st.DrawFn, learners: int, kinds: tuple[str, ...]) -> dict[str, Any]:
    kind = draw(st.sampled_from(kinds))
    d: dict[str, Any] = {"kind": kind}
    if kind == "softsync":
        d["n"] = draw(st.integers(1, learners))
    elif kind == "ssp":
        d["s"] = draw(st.integers(0, 5))
    elif kind == "fixed-delay":
        d["tau"] = learners - 1
        d["schedule"] = draw(st.sampled_from(["round-robin", "random", "normal", "race"]))
        if d["schedule"] == "race":
            d["cv"] = draw(_fraction(0.01, 0.5))
    return d


def protocols(
    learners: int, kinds: Sequence[str] | None = None
) -> st.SearchStrategy[ProtocolConfig]:
    """:class:`~asyncsim.config.ProtocolConfig` values valid for ``learners`` learners.

    ``async``; ``softsync`` with n in 1..learners (P1); ``hardsync``; ``ssp`` with s in 0..5;
    ``fixed-delay`` (P2) with ``tau = learners - 1`` — it runs exactly tau + 1 workers, so it
    is only generated for 1..17 learners — and a round-robin, random or normal schedule.

    Raises:
        InvalidArgument: if none of ``kinds`` is possible for ``learners``.
    """
    possible = _protocol_kinds(learners, kinds)
    if not possible:
        raise InvalidArgument(f"no protocol of kinds={kinds!r} is valid for {learners} learners")
    return _protocol_dict(learners, possible).map(
        lambda d: from_dict(ProtocolConfig, d, prefix="protocol")
    )


@st.composite
def _scenario_dict(
    draw: st.DrawFn,
    kinds: tuple[str, ...],
    min_learners: int,
    max_learners: int,
    dists: Sequence[str] | None,
    max_updates: int,
) -> dict[str, Any]:
    kind = draw(st.sampled_from(kinds))
    if kind == "fixed-delay":  # the cluster size follows from tau
        max_learners = min(max_learners, FIXED_DELAY_MAX_TAU + 1)
    cluster = draw(_cluster_dict(min_learners, max_learners, dists))
    lam = cluster["learners"]
    protocol = draw(_protocol_dict(lam, (kind,)))
    if kind == "fixed-delay" and protocol["schedule"] == "race" and "availability" in cluster:
        # Its workers step with normal times of mean 1 whatever cluster.compute says: size
        # the up periods to those.
        steps = {"dist": "normal", "mean": 1.0, "std": protocol.get("cv", 0.1)}
        cluster["availability"] = draw(_availability({**cluster, "compute": steps,
                                                      "speed": None}))
    if kind == "fixed-delay" and protocol["schedule"] != "race":
        # Its serial schedules step one worker at a time: no network to share, no learner
        # to take down (scenario.check refuses both).
        cluster.pop("availability", None)
        cluster["network"].pop("ps_ingress", None)
        cluster["network"].pop("ps_egress", None)
    # Gradients per update: hardsync takes all learners, n-softsync floor(lam / n) (P1).
    per_update = {"hardsync": lam, "softsync": lam // protocol.get("n", lam)}.get(kind, 1)
    updates = draw(st.integers(1, max(1, min(max_updates, _MAX_GRADIENTS // per_update))))
    return {
        "name": "hypothesis",
        "seed": draw(st.integers(0, 2**32 - 1)),
        "cluster": cluster,
        "protocol": protocol,
        "run": {"updates": updates, "trace_only": True},
    }


def scenarios(
    *,
    kinds: Sequence[str] | None = None,
    min_learners: int = 1,
    max_learners: int = 64,
    dists: Sequence[str] | None = None,
    max_updates: int = 200,
) -> st.SearchStrategy[Scenario]:
    """Trace-only :class:`~asyncsim.config.Scenario` values, built with ``from_dict``.

    A cluster from :func:`clusters`, a protocol from :func:`protocols` valid for it
    (``fixed-delay`` gets ``cluster.learners = tau + 1``), ``run.updates`` in
    1..``max_updates`` but at most 2000 gradients in all (hardsync takes one per learner per
    update), a random 32-bit seed, ``run.trace_only = true``; everything else at its default.
    """
    _check_learners(min_learners, max_learners)
    _check_names("dists", dists, DELAY_DISTS)
    if not (isinstance(max_updates, int) and max_updates >= 1):
        raise InvalidArgument(f"max_updates={max_updates!r} must be an integer >= 1")
    names = _check_names("kinds", kinds, PROTOCOL_KINDS)
    possible = tuple(
        k for k in names if k != "fixed-delay" or min_learners <= FIXED_DELAY_MAX_TAU + 1
    )
    if not possible:
        raise InvalidArgument(
            f"kinds={kinds!r}: fixed-delay needs min_learners <= {FIXED_DELAY_MAX_TAU + 1}"
        )
    return _scenario_dict(possible, min_learners, max_learners, dists, max_updates).map(
        lambda d: from_dict(Scenario, d)
    )
