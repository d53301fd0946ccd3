"""Name registries open to installed packages through Python entry points.

Every registry a scenario file refers to by name — delay models (``asyncsim.delays``),
protocols (``asyncsim.protocols``), learning-rate rules (``asyncsim.lr_rules``), models
(``asyncsim.models``) and data sets (``asyncsim.datasets``) — is a :class:`PluginRegistry`,
so one set of lookup rules holds for all of them (docs/plugins.md):

* a name registered in Python (built-ins included) wins over an entry point of that name, so
  your own code can override an installed plug-in;
* entry points are read once, on the first name that is not registered, and read again only
  when a name is still not found (an installed-after-import package is still found, while a
  run that only uses registered names never scans them);
* two installed packages that expose one name: the first on ``sys.path`` wins;
* a plug-in that fails to import is a :class:`~asyncsim.errors.ScenarioError` naming the
  scenario key and the entry point, not a traceback.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from asyncsim.errors import ScenarioError, did_you_mean

if TYPE_CHECKING:  # pragma: no cover
    from asyncsim.config import Scenario

T = TypeVar("T")
_BY_GROUP: dict[str, PluginRegistry] = {}


def callable_value(contract: str) -> Callable[[Any, str], Any]:
    """An ``adapt`` for registries of functions or factories: the loaded object itself,
    TypeError naming ``contract`` (e.g. ``"a factory f(**options) -> Model"``) otherwise."""

    def adapt(obj: Any, name: str) -> Any:
        if not callable(obj):
            raise TypeError(f"must be {contract}, got {obj!r}")
        return obj

    return adapt


class PluginRegistry(Generic[T]):
    """``name -> T`` for one entry-point group.

    Args:
        group: the entry-point group, e.g. ``"asyncsim.lr_rules"``.
        what: the noun in messages (``"unknown rule 'x'; allowed: ..."``).
        key: the scenario key an unknown name is reported under (``"optimizer.lr_rule"``).
        adapt: ``adapt(obj, name) -> T`` turns a loaded entry point into a registry value
            (checks it, wraps it); it raises TypeError/ValueError for an unusable object.
    """

    def __init__(self, group: str, what: str, key: str,
                 adapt: Callable[[Any, str], T] | None = None):
        self.group, self.what, self.key = group, what, key
        self.adapt = adapt or (lambda obj, name: obj)
        self.direct: dict[str, T] = {}  # registered in Python (built-ins included)
        self.plugins: dict[str, T] = {}  # entry points loaded so far
        self._eps: dict[str, importlib.metadata.EntryPoint] | None = None
        _BY_GROUP[group] = self

    def entry_points(self, *, refresh: bool = False) -> dict[str, importlib.metadata.EntryPoint]:
        """The group's entry points by name (scanned on first use, again on ``refresh``)."""
        if self._eps is None or refresh:
            table: dict[str, importlib.metadata.EntryPoint] = {}
            for ep in importlib.metadata.entry_points(group=self.group):
                table.setdefault(ep.name, ep)  # two packages, one name: the first on sys.path
            self._eps = table
        return self._eps

    def names(self) -> list[str]:
        """Every usable name: registered ones and installed entry points, sorted."""
        return sorted(set(self.direct) | set(self.entry_points(refresh=True)))

    def get(self, name: str, key: str | None = None) -> T:
        """The value registered as ``name``, loading its entry point on first use.

        Raises:
            ScenarioError: under ``key`` (default: the registry's key) for an unknown name,
                listing the allowed names with a did-you-mean hint, or for a plug-in that
                cannot be loaded.
        """
        key = key or self.key
        value = self.direct.get(name)
        if value is None:
            value = self.plugins.get(name)
        if value is not None:
            return value
        fresh = self._eps is None
        eps = self.entry_points()
        if name not in eps and not fresh:
            eps = self.entry_points(refresh=True)
        ep = eps.get(name)
        if ep is None:
            allowed = sorted(set(self.direct) | set(eps))
            raise ScenarioError(key, f"unknown {self.what} {name!r}; allowed: "
                                f"{', '.join(allowed)}{did_you_mean(name, allowed)}")
        try:
            value = self.adapt(ep.load(), name)
        except Exception as e:  # a broken plug-in is the user's scenario problem, not a crash
            raise ScenarioError(key, f"{self.what} plug-in {name!r} ({ep.value}, entry point "
                                f"group {self.group}) could not be loaded: {e}") from e
        self.plugins[name] = value
        return value

    def decorator(self, name: str) -> Callable[[T], T]:
        """A decorator registering its argument as ``name`` (direct: it wins over an entry
        point of that name) and returning it unchanged."""

        def deco(value: T) -> T:
            self.direct[name] = value
            return value

        return deco

    def forget_plugins(self) -> None:
        """Drop loaded entry points and the scan (tests that install and remove a plug-in)."""
        self.plugins.clear()
        self._eps = None


def registries() -> dict[str, PluginRegistry]:
    """Every registry by entry-point group (importing the modules that define them)."""
    from asyncsim import core, data, delays, models, protocols  # noqa: F401  (registries)

    return _BY_GROUP


# ------------------------------------------------------------- other processes (Ray actors)
def _names_used(scn: Scenario) -> list[tuple[str, str]]:
    """``(group, name)`` of every registry name ``scn`` refers to."""
    from asyncsim.config import to_dict

    used = [("asyncsim.protocols", scn.protocol.kind),
            ("asyncsim.lr_rules", scn.optimizer.lr_rule),
            ("asyncsim.models", scn.model.name), ("asyncsim.datasets", scn.data.name)]

    def walk(x: Any) -> None:  # delay specs nest (a straggler's base), in lists per learner
        if isinstance(x, dict):
            if isinstance(x.get("dist"), str):
                used.append(("asyncsim.delays", x["dist"]))
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)

    walk(to_dict(scn.cluster))
    return used


def python_registrations(scenarios: Scenario | list[Scenario]) -> list[tuple[str, str, Any]]:
    """``(group, name, object)`` for each name the scenario(s) use that was registered in
    Python by the user (``register_lr_rule`` in a script or notebook, say): not a built-in
    and not an entry point. A Ray actor or task is a fresh process that never ran that
    registering code, so :mod:`asyncsim.real` ships these (``pack_plugins`` pickles them by
    value) and the process calls :func:`install_registrations` before it builds the
    scenario's numerics. Entry points need nothing: every process finds them itself.
    """
    by_group = registries()
    out: dict[tuple[str, str], Any] = {}
    for scn in scenarios if isinstance(scenarios, list) else [scenarios]:
        for group, name in _names_used(scn):
            obj = by_group[group].direct.get(name)
            if obj is None:
                continue
            obj = getattr(obj, "_wrapped", obj)  # a duck-typed delay model: the user's class
            module = getattr(obj, "__module__", None) or ""
            if module == "asyncsim" or module.startswith("asyncsim."):
                continue  # built-in: registered on import everywhere
            out[group, name] = obj
    return [(g, n, o) for (g, n), o in out.items()]


def install_registrations(regs: list[tuple[str, str, Any]]) -> None:
    """Register what :func:`python_registrations` collected in another process (replacing a
    registration of the same name: the scenario means the driver's object)."""
    by_group = registries()
    for group, name, obj in regs:
        reg = by_group[group]
        reg.direct[name] = reg.adapt(obj, name)
