"""The protocol's contract (:class:`Protocol`), the registry of protocols and how a scenario's
``[protocol]`` table becomes one (:func:`make_protocol`: the options are the keyword
parameters of the protocol's ``__init__``, checked by the one option checker of every plug-in
kind)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from asyncsim._registry import PluginRegistry, build, check_options, option_defaults, origin
from asyncsim.config import ProtocolConfig
from asyncsim.errors import ScenarioError

if TYPE_CHECKING:  # pragma: no cover
    from asyncsim.timing.cluster import Simulation


def _adapt(obj: object, name: str) -> type[Protocol]:
    if not (isinstance(obj, type) and issubclass(obj, Protocol)):
        raise TypeError(f"a protocol must be a subclass of asyncsim.Protocol, "
                        f"got {obj!r}")
    obj.name = name
    return obj


_registry: PluginRegistry[type[Protocol]] = PluginRegistry(
    "asyncsim.protocols", "protocol", "protocol.kind", adapt=_adapt)


def register_protocol(name: str, *, replace: bool = False
                      ) -> Callable[[type[Protocol]], type[Protocol]]:
    """Class decorator: make a :class:`Protocol` usable as ``protocol.kind = name``.

    Installed packages can also expose a Protocol subclass under the entry-point group
    ``asyncsim.protocols`` (docs/plugins.md); a name registered here wins over it. A name
    taken by another class is a ValueError naming both unless ``replace``
    (:meth:`asyncsim._registry.PluginRegistry.register`, the rule of every plug-in kind).
    """
    return _registry.decorator(name, replace=replace)


def available_protocols() -> list[str]:
    """Names of all protocols: built-ins, registered classes and entry points, sorted."""
    return _registry.names()


def get_protocol_class(kind: str) -> type[Protocol]:
    """The protocol class of ``protocol.kind``; ScenarioError for an unknown name."""
    return _registry.get(kind)


def make_protocol(cfg: ProtocolConfig, learners: int) -> Protocol:
    """The protocol ``[protocol]`` describes, for ``learners`` learners (``cluster.learners``).

    The options (every key of the table but ``kind``) are checked against the class's
    ``__init__(self, learners, *, ...)`` signature by the one option checker of every
    plug-in kind (:func:`asyncsim._registry.build`: unknown keys listed, annotated types
    checked); ``__init__`` refuses values with ``ValueError("<option>: ...")``, reported as
    ``protocol.<option>``, and a cluster size it cannot run with as
    ``ValueError("learners: ...")``, reported as ``cluster.learners``.

    Raises:
        ScenarioError: an unknown kind, an unknown, missing or wrong-typed option, a value
            the protocol refuses, a plug-in whose ``__init__`` skips the base class's;
            one line naming the key.
    """
    cls = get_protocol_class(cfg.kind)
    try:
        proto = build(cls, cfg.options, key="protocol", what=_registry.what, name=cfg.kind,
                      also=("kind",), fixed={"learners": learners})
    except ScenarioError as e:
        if e.key == "protocol.learners":
            raise ScenarioError("cluster.learners", e.message, file=e.file) from None
        raise
    if getattr(proto, "learners", None) != learners:
        # The base class's state (the default start() runs one loop per learner).
        raise ScenarioError("protocol.kind", f"protocol {cfg.kind!r} ({origin(cls)}): its "
                            "__init__ must call super().__init__(learners)")
    return proto


def protocol_options(cfg: ProtocolConfig) -> dict[str, Any]:
    """The options of ``cfg`` with the defaults of its protocol's signature filled in
    (fixed-delay's ``schedule = "round-robin"`` where the file gives none), checked."""
    cls = get_protocol_class(cfg.kind)
    given = check_options(cls, cfg.options, key="protocol", what=_registry.what,
                          name=cfg.kind, also=("kind",), exclude=("learners",))
    return {**option_defaults(cls), **given}


class Protocol:
    """Base class. The simulation calls the hooks; a protocol calls ``sim.apply_update``.

    A pending gradient is a tuple ``(learner, batch, read_version, t_pull, t_push, t_arrive)``.

    A protocol may declare ``options_strategy(learners)``, a classmethod returning a
    hypothesis strategy of option tables valid for ``learners`` learners, or None where it
    cannot run on that many; :func:`asyncsim.testing.protocols` draws from it (without it,
    from strategies derived from the ``__init__`` signature).
    """

    name: ClassVar[str] = "base"

    def __init__(self, learners: int):
        """Options of a protocol are the keyword-only parameters of its ``__init__``, after
        ``learners`` (``cluster.learners``): ``protocol = { kind = "every-k", k = 3 }`` calls
        ``EveryK(learners, k=3)`` (:func:`make_protocol` checks the table against the
        signature first). Refuse a value with ``ValueError("<option>: ...")``."""
        self.learners = learners

    def updates_per_gradient(self) -> float:
        """Expected updates per gradient (used to convert run lengths and epochs)."""
        return 1.0

    def nominal_staleness(self) -> float | None:
        """The delay this protocol is named for, or None where it has none: the staleness
        ``optimizer.lr_staleness = "nominal"`` gives every gradient's rate (P2's official
        regimes set eta_tau from the nominal delay, by hand)."""
        return None

    def start(self, sim: Simulation) -> None:
        """Start the SimPy processes. Default: every learner runs the pull/compute/push loop."""
        for learner in range(self.learners):
            sim.env.process(sim.learner_loop(learner))

    def may_pull(self, sim: Simulation, learner: int, batch: int):
        """An event to wait for before learner's ``batch``-th pull, or None to go ahead."""
        return None

    def on_arrival(self, sim: Simulation, grad: tuple) -> None:
        """A gradient reached the PS; call ``sim.apply_update([...])`` when an update is due.

        In a simulation it is called from the learner's SimPy process
        (``sim.env.active_process`` is that learner's); an exception raised here fails that
        process, and SimPy re-raises it out of ``sim.run`` (a copy of it, with the original
        as its ``__cause__``). In a real run the PS actor calls it as gradients arrive."""
        raise NotImplementedError

    def on_lost(self, sim: Simulation, learner: int) -> bool:
        """``learner`` is gone: a real run's actor died, or a simulated learner went down
        (``cluster.availability``). The gradient it had pulled, if any, is lost; it may
        also be waiting to pull (its last gradient already delivered).

        Return True if the protocol goes on without that learner until :meth:`on_back`
        (called once the restarted actor answers, or the learner is up again; it then pulls
        through :meth:`may_pull`), False (default) if it still expects the learner's next
        gradient (a real PS re-sends the same batch to the restarting actor at once).
        """
        return False

    def on_back(self, sim: Simulation, learner: int) -> None:
        """``learner``, gone (``on_lost`` returned True), is back."""
