"""The points of a scenario's ``[sweep]``: the grid of its axes (:func:`sweep_points`), the
scenario of one point (:func:`apply_point`) and of every point in order
(:func:`point_scenarios`)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

from asyncsim.config import (
    Scenario,
    from_dict,
    to_dict,
)
from asyncsim.errors import ScenarioError
from asyncsim.scenario.checks import check_sweep_key
from asyncsim.scenario.dotted import set_dotted


def sweep_points(scn: Scenario) -> list[dict[str, Any]]:
    """The cartesian product of ``scn.sweep`` as a list of {dotted key: value} (sorted keys).

    Zipped keys: a sweep entry with a plain (undotted) name whose list holds tables is one
    axis of explicit settings that vary together (coupled keys, e.g. learners and batch size);
    each table maps dotted keys to values, and the entry's own name is only a label. (A dotted
    entry such as ``"cluster.compute"`` whose values are tables is an ordinary axis.)::

        [sweep]
        setup = [{ "cluster.learners" = 1, "data.batch_size" = 128 },
                 { "cluster.learners" = 2, "data.batch_size" = 64 }]
        seed = [0, 1]

    The tables' keys are merged into the point (so the index has ordinary columns); a key a
    table leaves out keeps the scenario's value.

    Whole tables: an entry named after a table of the scenario (``protocol``,
    ``optimizer.momentum``, ``cluster.compute``, ...) whose values are tables replaces that
    table at each point, keys the listed table leaves out taking their defaults::

        [sweep]
        protocol = [{ kind = "async" }, { kind = "softsync", n = 4 }]
    """
    if not scn.sweep:
        return []
    keys = sorted(scn.sweep)
    out = []
    for combo in itertools.product(*(scn.sweep[k] for k in keys)):
        point: dict[str, Any] = {}
        for k, v in zip(keys, combo, strict=True):
            if isinstance(v, Mapping) and "." not in k and k not in TABLES:
                for kk, vv in v.items():
                    if "." not in kk and kk != "seed":
                        raise ScenarioError(f"sweep.{k}", f"sets {kk!r}: a table of keys that "
                                            "vary together maps dotted keys (such as "
                                            "protocol.kind); to replace a whole table at each "
                                            "point, name the table: [sweep] protocol = "
                                            "[{ kind = ... }, ...]")
                    if kk in point:
                        raise ScenarioError(f"sweep.{k}", f"sets {kk!r}, also set by another "
                                            "sweep entry")
                    point[kk] = vv
            else:
                point[k] = v
        out.append(point)
    return out


# The scenario's tables by their top-level names: a sweep entry so named replaces the table.
TABLES = frozenset(f.name for f in dataclasses.fields(Scenario)
                   if f.default_factory is not dataclasses.MISSING
                   and dataclasses.is_dataclass(f.default_factory()))


def apply_point(scn: Scenario, point: Mapping[str, Any]) -> Scenario:
    """The scenario of one sweep point (without its ``sweep`` table)."""
    raw = to_dict(scn)
    raw.pop("sweep", None)
    for k, v in point.items():
        check_sweep_key(k)
        if k == "seed" or "." in k or k in TABLES:
            set_dotted(raw, k, v)
        else:
            raise ScenarioError(f"sweep.{k}", "must be a dotted key such as optimizer.lr, or "
                                f"a table's name ({', '.join(sorted(TABLES))})")
    # fixed-delay runs tau + 1 workers: a tau sweep moves the worker count along with it
    # unless the point sets cluster.learners itself.
    proto = raw.get("protocol", {})
    tau = scn.protocol.options.get("tau")
    tau_set = "protocol.tau" in point or "tau" in (point.get("protocol") or {})
    if (proto.get("kind") == "fixed-delay" and tau_set and "cluster.learners" not in point
            and isinstance(tau, int) and scn.cluster.learners == tau + 1):
        raw["cluster"]["learners"] = proto["tau"] + 1
    try:
        return from_dict(Scenario, raw)
    except ScenarioError as e:
        raise ScenarioError(f"sweep.{e.key}", e.message) from None


def point_scenarios(scn: Scenario) -> list[tuple[str, dict[str, Any], Scenario]]:
    """``(name, keys, scenario)`` of every point of ``scn``'s sweep, in order (``p000``,
    ``p001``, ...; ``scn`` itself, as ``p000``, without a sweep): each point's scenario has
    no ``sweep`` table and keeps ``scn``'s source file. The names of a sweep's point folders
    and the scenarios their ``scenario.toml`` record."""
    points = sweep_points(scn) or [{}]
    return [(f"p{i:03d}", p, dataclasses.replace(apply_point(scn, p) if p else scn, sweep={},
                                                 source=scn.source))
            for i, p in enumerate(points)]
