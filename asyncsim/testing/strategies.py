"""Hypothesis strategies for asyncsim's inputs: delay specs, clusters, protocols, scenarios,
learning-rate rules (re-exported by :mod:`asyncsim.testing`)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from asyncsim._registry import PluginRegistry, alternatives, by_group, signature_options
from asyncsim.config import ClusterConfig, ProtocolConfig, Scenario, from_dict
from asyncsim.timing import delays  # noqa: F401  (its registry, with the built-ins)
from asyncsim.timing.protocols import FixedDelay

__all__ = [
    "clusters",
    "delay_specs",
    "lr_rule_specs",
    "plugin_specs",
    "protocols",
    "scenarios",
]

# --- strategies ---

_MIN_MEAN = 1e-3  # keep durations away from 0 so runs make progress in simulated time
_MAX_GRADIENTS = 2000  # per generated scenario, so that simulating one takes milliseconds


def _registry(group: str) -> PluginRegistry:
    """The registry of delay models or protocols (the timing layer's: no JAX imported)."""
    return by_group()[group]


def _builtins(group: str, hook: str) -> tuple[str, ...]:
    """The built-in names of ``group`` whose class declares its strategy (``hook``): a new
    built-in is drawn as soon as it declares one, in its own file."""
    reg = _registry(group)
    return tuple(n for n in reg.builtin_names() if callable(getattr(reg.get(n), hook, None)))


# Built-ins the strategies generate: the delay models that declare their strategy on the
# class (``empirical`` needs a CSV file, so it declares none); every protocol (one without
# options_strategy draws options derived from its signature: async and hardsync have none).
DELAY_DISTS = _builtins("asyncsim.delays", "spec_strategy")
PROTOCOL_KINDS = tuple(_registry("asyncsim.protocols").builtin_names())
FIXED_DELAY_MAX_TAU = FixedDelay.MAX_TAU  # fixed-delay's generated tau: 0..16


def _plugins(group: str, builtin: tuple[str, ...]) -> list[str]:
    return [n for n in _registry(group).names() if n not in _registry(group).builtin_names()
            and n not in builtin]


def _check_names(arg: str, given: Sequence[str] | None, known: Sequence[str]) -> tuple[str, ...]:
    if given is None:
        return tuple(known)
    given = tuple(given)
    bad = [g for g in given if g not in known]
    if bad or not given:
        raise InvalidArgument(f"{arg}={given!r}: allowed values are {', '.join(known)}")
    return given


def _dist_names(dists: Sequence[str] | None) -> tuple[str, ...]:
    """``dists`` checked: built-ins with a strategy, and any plug-in (installed or
    registered); by default the built-ins only, so a test's draws do not change with what
    is installed."""
    known = (*DELAY_DISTS, *_plugins("asyncsim.delays", DELAY_DISTS + ("empirical",)))
    return _check_names("dists", dists if dists is not None else DELAY_DISTS, known)


def _kind_names(kinds: Sequence[str] | None) -> tuple[str, ...]:
    """``kinds`` checked: built-ins and plug-ins alike (default: the built-ins)."""
    known = (*PROTOCOL_KINDS, *_plugins("asyncsim.protocols", PROTOCOL_KINDS))
    return _check_names("kinds", kinds if kinds is not None else PROTOCOL_KINDS, known)


def _fraction(lo: float = 0.0, hi: float = 1.0) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def _spec(dist: str, max_mean: float, dists: tuple[str, ...]) -> st.SearchStrategy[dict]:
    """Specs of ``dist`` whose mean lies in [_MIN_MEAN, max_mean]: a built-in's from its
    class's ``spec_strategy``, a plug-in's from :func:`plugin_specs`. A nested spec (a
    straggler's base) is one of the other ``dists`` given."""
    if dist not in DELAY_DISTS:
        return plugin_specs(dist, max_mean)
    own = _registry("asyncsim.delays").get(dist, "dist").spec_strategy
    kw = {}
    inner = tuple(d for d in dists if d != dist)
    if inner and "nested" in inspect.signature(own).parameters:
        kw["nested"] = lambda m: st.sampled_from(inner).flatmap(lambda d: _spec(d, m, inner))
    return own(max_mean, **kw).map(lambda p: {"dist": dist, **p})


def delay_specs(
    *, dists: Sequence[str] | None = None, max_mean: float = 10.0
) -> st.SearchStrategy[dict[str, Any]]:
    """Valid delay-model specs ``{"dist": name, **params}``.

    Args:
        dists: names to draw from (default: every built-in except ``empirical``, which needs
            a file); a plug-in's name (installed or registered) draws :func:`plugin_specs`.
            ``straggler`` nests a spec of one of the other models given (a constant one
            when it is the only one).
        max_mean: upper bound on the mean of a generated model (its lower bound is 1e-3).

    Every spec is accepted by :func:`asyncsim.timing.delays.make_delay`, and the model's analytic
    ``mean`` (untruncated for ``normal``) is at most ``max_mean``.
    """
    names = _dist_names(dists)
    if not max_mean >= _MIN_MEAN:
        raise InvalidArgument(f"max_mean={max_mean!r} must be >= {_MIN_MEAN}")
    return st.sampled_from(names).flatmap(lambda d: _spec(d, max_mean, names))


def _derived(what: str, fn: Any, hook: str, *, skip: tuple[str, ...] = (),
             floats: tuple[float, float] = (_MIN_MEAN, 10.0)) -> st.SearchStrategy[dict]:
    """Option tables derived from ``fn``'s signature (the parameter list asyncsim checks
    scenarios against): a ``float`` in ``floats``, an ``int`` in 0..10, a ``bool``; a
    parameter with a default is sometimes left out; one of another type keeps its default,
    and a required one of another type needs a strategy of its own (``hook``: how to give
    one)."""
    sig, hints, _ = signature_options(fn)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    optional: list[str] = []
    for name, param in sig.items():
        if name in skip:
            continue
        kinds = alternatives(hints.get(name))
        if float in kinds:
            value = _fraction(*floats)
        elif bool in kinds:
            value = st.booleans()
        elif int in kinds:
            value = st.integers(0, 10)
        elif param.default is not param.empty:
            continue  # a type no strategy is derived for: keep its default
        else:
            raise InvalidArgument(f"{what}: no strategy for its required parameter "
                                  f"{name!r}; {hook}")
        fields[name] = value
        if param.default is not param.empty:
            optional.append(name)
    return st.fixed_dictionaries({k: v for k, v in fields.items() if k not in optional},
                                 optional={k: fields[k] for k in optional})


def plugin_specs(dist: str, max_mean: float = 10.0) -> st.SearchStrategy[dict[str, Any]]:
    """Specs ``{"dist": dist, **params}`` of a plug-in delay model, for property tests of
    your own model (docs/plugins.md).

    The model may declare them: a classmethod ``spec_strategy(max_mean)`` returning a
    strategy of parameter dicts. Otherwise they are derived from its ``__init__``
    signature (the parameter list asyncsim checks scenarios against): a ``float`` in
    [1e-3, max_mean], an ``int`` in 0..10, a ``bool``; a parameter with a default is
    sometimes left out. Either way only specs :func:`asyncsim.timing.delays.make_delay` accepts
    and whose model's ``mean`` (when it knows one) is at most ``max_mean`` are drawn (a
    ``mean`` that overflows counts as above it); a
    required parameter of another type (a file path) needs ``spec_strategy``.
    """
    from asyncsim.errors import ScenarioError
    from asyncsim.timing.delays import make_delay

    cls = _registry("asyncsim.delays").get(dist, "dist")
    own = getattr(getattr(cls, "_wrapped", cls), "spec_strategy", None)
    params = (own(max_mean) if own is not None else
              _derived(f"delay model {dist!r}", cls,
                       "give the class a classmethod spec_strategy(max_mean)",
                       floats=(_MIN_MEAN, max_mean)))

    def usable(spec: dict[str, Any]) -> bool:
        try:
            mean = make_delay(spec).mean
        except ScenarioError:
            return False
        except ArithmeticError:
            return False  # a mean too large to compute (math.gamma's OverflowError) is above
        return mean is None or mean <= max_mean

    return params.map(lambda p: {"dist": dist, **p}).filter(usable)


def lr_rule_specs(names: Sequence[str] | None = None, *, max_param: float = 10.0
                  ) -> st.SearchStrategy[str | dict[str, Any]]:
    """Valid ``optimizer.lr_rule`` values, for property tests of learning-rate rules: a rule's
    name, or a table ``{"name": name, **parameters}``.

    Args:
        names: rules to draw from (default: every built-in); a plug-in's name (installed or
            registered) works too.
        max_param: upper bound of a drawn ``float`` parameter (its lower bound is 0).

    A rule may declare its parameters' strategy: an attribute ``params_strategy``, a
    function returning a strategy of parameter dicts. Otherwise they are derived from its
    signature (the keyword parameters after the three inputs, which asyncsim checks
    scenarios against): a ``float`` in [0, max_param], an ``int`` in 0..10, a ``bool``; a
    parameter with a default is sometimes left out, and a rule whose parameters all have
    defaults is sometimes given by its name alone. Only values
    :func:`asyncsim.numerics.lr_rules.make_lr_rule` accepts are drawn. Evaluate one with
    :func:`asyncsim.numerics.lr_rules.rate_at_delay` (float64, at a constant delay).
    """
    from asyncsim.errors import ScenarioError
    from asyncsim.numerics.lr_rules import RULE_INPUTS, available_lr_rules, make_lr_rule

    reg = by_group()["asyncsim.lr_rules"]
    rules = _check_names("names", names if names is not None else reg.builtin_names(),
                         available_lr_rules())
    if not max_param >= 0:
        raise InvalidArgument(f"max_param={max_param!r} must be >= 0")

    def specs(name: str) -> st.SearchStrategy[str | dict[str, Any]]:
        fn = reg.get(name)
        inputs = tuple(signature_options(fn)[0])[:len(RULE_INPUTS)]
        own = getattr(fn, "params_strategy", None)
        params = (own() if own is not None else
                  _derived(f"learning-rate rule {name!r}", fn,
                           "give the rule an attribute params_strategy, a function "
                           "returning a strategy of parameter dicts",
                           skip=inputs, floats=(0.0, max_param)))
        tables = params.map(lambda p: {"name": name, **p})
        return st.one_of(st.just(name), tables) if _all_defaults(fn, inputs) else tables

    def usable(spec: str | dict[str, Any]) -> bool:
        try:
            make_lr_rule(spec)
        except ScenarioError:
            return False
        return True

    return st.sampled_from(rules).flatmap(specs).filter(usable)


def _all_defaults(fn: Any, skip: tuple[str, ...]) -> bool:
    params = signature_options(fn)[0]
    return all(p.default is not p.empty for n, p in params.items() if n not in skip)


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
    draw: st.DrawFn, min_learners: int, max_learners: int, dists: Sequence[str] | None,
    availability: bool | None = None,
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
    if availability or (availability is None and draw(st.booleans())):
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
    *, min_learners: int = 1, max_learners: int = 64, dists: Sequence[str] | None = None,
    availability: bool | None = None,
) -> st.SearchStrategy[ClusterConfig]:
    """:class:`~asyncsim.config.ClusterConfig` values with ``min_learners..max_learners``
    learners: one compute spec for all or one per learner (from :func:`delay_specs` with
    ``dists``, plug-ins included), optional speed factors in [0.25, 4], pull/push latencies
    (often exactly zero, sometimes with a finite bandwidth), optional shared PS links, an
    optional PS service time and availability (up periods of 1..10 times the slowest
    learner's mean compute time, down periods of 0..3 times it; exponential, constant or
    gamma): ``availability`` True always, False never, None (default) sometimes."""
    _check_learners(min_learners, max_learners)
    _dist_names(dists)
    return _cluster_dict(min_learners, max_learners, dists, availability).map(
        lambda d: from_dict(ClusterConfig, d, prefix="cluster")
    )


def _options(kind: str, learners: int) -> st.SearchStrategy[dict[str, Any]] | None:
    """Option tables of protocol ``kind`` valid for ``learners`` learners (None: it cannot
    run on that many): the class's own ``options_strategy``, else derived from its
    signature and kept where :func:`~asyncsim.timing.protocols.make_protocol` accepts them."""
    from asyncsim.errors import ScenarioError
    from asyncsim.timing.protocols import make_protocol

    cls = _registry("asyncsim.protocols").get(kind, "protocol.kind")
    own = getattr(cls, "options_strategy", None)
    if own is not None:
        return own(learners)

    def usable(options: dict[str, Any]) -> bool:
        try:
            make_protocol(ProtocolConfig(kind, options), learners)
        except ScenarioError:
            return False
        return True

    params, _, _ = signature_options(cls)
    if not any(p.default is p.empty for n, p in params.items() if n != "learners") \
            and not usable({}):
        return None  # no required option, and its defaults refuse this many learners
    return _derived(f"protocol {kind!r}", cls,
                    "give the class a classmethod options_strategy(learners)",
                    skip=("learners",)).filter(usable)


def _protocol_dict(kind: str, learners: int) -> st.SearchStrategy[dict[str, Any]]:
    options = _options(kind, learners)
    if options is None:  # pragma: no cover - callers draw only kinds that fit
        raise InvalidArgument(f"protocol {kind!r} cannot run on {learners} learners")
    return options.map(lambda o: {"kind": kind, **o})


def protocols(
    learners: int, kinds: Sequence[str] | None = None
) -> st.SearchStrategy[ProtocolConfig]:
    """:class:`~asyncsim.config.ProtocolConfig` values valid for ``learners`` learners.

    ``kinds``: built-ins (default) or plug-ins, each drawn from its class's
    ``options_strategy`` (or from its signature): ``async``; ``softsync`` with n in
    1..learners (P1); ``hardsync``; ``ssp`` with s in 0..5; ``fixed-delay`` (P2) with
    ``tau = learners - 1`` — it runs exactly tau + 1 workers, so it is only generated for
    1..17 learners — and a round-robin, random, normal or race schedule.

    Raises:
        InvalidArgument: if none of ``kinds`` is possible for ``learners``.
    """
    possible = [k for k in _kind_names(kinds) if _options(k, learners) is not None]
    if not possible:
        raise InvalidArgument(f"no protocol of kinds={kinds!r} is valid for {learners} learners")
    return st.sampled_from(possible).flatmap(lambda k: _protocol_dict(k, learners)).map(
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
    availability: bool | None,
) -> dict[str, Any]:
    from asyncsim.timing.protocols import make_protocol

    kind = draw(st.sampled_from(kinds))
    sizes = [n for n in range(min_learners, max_learners + 1) if _options(kind, n) is not None]
    lam = draw(st.sampled_from(sizes))
    cluster = draw(_cluster_dict(lam, lam, dists, availability))
    protocol = draw(_protocol_dict(kind, lam))
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
    proto = make_protocol(from_dict(ProtocolConfig, protocol, prefix="protocol"), lam)
    per_update = max(1, round(1.0 / proto.updates_per_gradient()))
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
    availability: bool | None = None,
) -> st.SearchStrategy[Scenario]:
    """Trace-only :class:`~asyncsim.config.Scenario` values, built with ``from_dict``.

    A cluster from :func:`clusters` (``dists`` and ``availability`` as there; fixed-delay's
    serial schedules get no availability and no shared links, which they cannot model), a
    protocol from :func:`protocols` valid for it (``kinds``, plug-ins included;
    ``fixed-delay`` gets ``cluster.learners = tau + 1``), ``run.updates`` in
    1..``max_updates`` but at most 2000 gradients in all (hardsync takes one per learner per
    update), a random 32-bit seed, ``run.trace_only = true``; everything else at its default.
    """
    _check_learners(min_learners, max_learners)
    _dist_names(dists)
    if not (isinstance(max_updates, int) and max_updates >= 1):
        raise InvalidArgument(f"max_updates={max_updates!r} must be an integer >= 1")
    names = _kind_names(kinds)
    possible = tuple(k for k in names if any(_options(k, n) is not None
                                             for n in range(min_learners, max_learners + 1)))
    if not possible:
        raise InvalidArgument(f"kinds={kinds!r}: none can run on {min_learners}.."
                              f"{max_learners} learners (fixed-delay needs min_learners <= "
                              f"{FIXED_DELAY_MAX_TAU + 1})")
    return _scenario_dict(possible, min_learners, max_learners, dists, max_updates,
                          availability).map(lambda d: from_dict(Scenario, d))
