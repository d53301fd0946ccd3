"""Plug-ins registered in Python travel with a real run's jobs to its Ray processes.

A Ray actor or task is a fresh process: it finds entry-point plug-ins itself, but not a
``register_lr_rule`` a user ran in a script or notebook. :func:`pack_plugins` pickles those
registrations (by value) with the job and :func:`install_plugins` registers them in the
actor before it builds the scenario's numerics.
"""

from __future__ import annotations

import importlib.metadata
import pickle
import sys
from typing import Any

from asyncsim._registry import PluginRegistry, by_group, origin
from asyncsim.config import Scenario, to_dict
from asyncsim.numerics import core, data, models  # noqa: F401  (their registries)
from asyncsim.numerics.lr_rules import rule_spec
from asyncsim.timing import delays, protocols  # noqa: F401


def registries() -> dict[str, PluginRegistry]:
    """Every registry by entry-point group, the built-ins' included."""
    return by_group()


def _names_used(scn: Scenario) -> list[tuple[str, str]]:
    """``(group, name)`` of every registry name ``scn`` refers to."""
    used = [("asyncsim.protocols", scn.protocol.kind),
            ("asyncsim.lr_rules", rule_spec(scn.optimizer.lr_rule)[0]),
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


def plugins_used(scn: Scenario) -> list[dict[str, Any]]:
    """Every plug-in ``scn`` uses, as ``provenance.json`` records it: ``{"group", "name",
    "object"`` (``module.qualname``), ``"package", "version"}`` (the installed distribution
    that provides it: the entry point's, else the one that holds the object's top-level
    module; both None for a script's or notebook's own code). Built-ins are not listed."""
    groups = registries()
    out: list[dict[str, Any]] = []
    for group, name in dict.fromkeys(_names_used(scn)):
        registry = groups[group]
        obj = registry.direct.get(name)  # registered in Python wins over an entry point
        ep = registry.entry_points().get(name) if obj is None else None
        obj = obj if obj is not None else registry.get(name)
        module = getattr(getattr(obj, "_wrapped", obj), "__module__", None) or ""
        if module == "asyncsim" or module.startswith("asyncsim."):
            continue
        dist = ep.dist if ep is not None else None
        if dist is None:
            dist = _distribution(module.split(".")[0])
        out.append({"group": group, "name": name, "object": origin(obj),
                    "package": dist.name if dist is not None else None,
                    "version": dist.version if dist is not None else None})
    return out


def _distribution(top_module: str) -> importlib.metadata.Distribution | None:
    """The installed distribution that holds the top-level module ``top_module`` (None for
    a script, a notebook, a test file)."""
    names = importlib.metadata.packages_distributions().get(top_module, [])
    try:
        return importlib.metadata.distribution(names[0]) if names else None
    except importlib.metadata.PackageNotFoundError:
        return None


def python_registrations(scenarios: Scenario | list[Scenario]) -> list[tuple[str, str, Any]]:
    """``(group, name, object)`` for each name the scenario(s) use that was registered in
    Python by the user (``register_lr_rule`` in a script or notebook, say): not a built-in
    and not an entry point. A Ray actor or task is a fresh process that never ran that
    registering code, so :mod:`asyncsim.drivers.real` ships these (:func:`pack_plugins` pickles
    them by value) and the process calls :func:`install_registrations` before it builds the
    scenario's numerics. Entry points need nothing: every process finds them itself.
    """
    groups = registries()
    out: dict[tuple[str, str], Any] = {}
    for scn in scenarios if isinstance(scenarios, list) else [scenarios]:
        for group, name in _names_used(scn):
            obj = groups[group].direct.get(name)
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
    groups = registries()
    for group, name, obj in regs:
        groups[group].register(name, obj, replace=True)


def pack_plugins(scenarios: list[Scenario]) -> bytes | None:
    """The plug-ins ``scenarios`` use that were registered in this process, pickled for a Ray
    actor or task (:func:`python_registrations`); None if there are none.

    Pickled by value, module included: a rule defined in a script's helper module, a notebook
    or a test file need not be importable where the actor runs.
    """
    from ray import cloudpickle  # Ray is an optional extra: imported when a run needs it

    regs = python_registrations(scenarios)
    if not regs:
        return None
    mods = {sys.modules.get(getattr(o, "__module__", None) or "") for _, _, o in regs}
    mods = {m for m in mods if m is not None and m.__name__ != "__main__"
            and m.__name__ not in cloudpickle.list_registry_pickle_by_value()}
    for m in mods:
        cloudpickle.register_pickle_by_value(m)
    try:
        return cloudpickle.dumps(regs)
    finally:
        for m in mods:
            cloudpickle.unregister_pickle_by_value(m)


def install_plugins(blob: bytes | None) -> None:
    """Register what :func:`pack_plugins` packed (in the actor or task)."""
    if blob is not None:
        install_registrations(pickle.loads(blob))
