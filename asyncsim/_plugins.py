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
from typing import Any, Generic, TypeVar

from asyncsim.errors import ScenarioError, did_you_mean

T = TypeVar("T")

GROUPS = ("asyncsim.delays", "asyncsim.protocols", "asyncsim.lr_rules", "asyncsim.models",
          "asyncsim.datasets")


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

    def forget_plugins(self) -> None:
        """Drop loaded entry points and the scan (tests that install and remove a plug-in)."""
        self.plugins.clear()
        self._eps = None
