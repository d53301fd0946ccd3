"""Dotted keys of a scenario as a nested dict: ``--set KEY=VALUE`` overrides read, and a
value set at a dotted key (``protocol.n``)."""

from __future__ import annotations

import tomllib
from typing import Any

from asyncsim.errors import ScenarioError


def parse_override(item: str) -> tuple[str, Any]:
    """``"protocol.n=4"`` -> ``("protocol.n", 4)``; the value is read as a TOML value, else text."""
    key, eq, raw = item.partition("=")
    key, raw = key.strip(), raw.strip()
    if not eq or not key:
        raise ScenarioError(item, "an override must look like KEY=VALUE, e.g. protocol.n=4",
                            file="--set")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except RecursionError:
        # tomllib recurses once per bracket: [[[...]]] a thousand deep is a traceback otherwise
        raise ScenarioError(key, "the value is nested too deeply") from None
    return key, value


def set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    """Set ``d["a"]["b"] = value`` for ``key = "a.b"``, creating tables on the way."""
    parts = key.split(".")
    cur = d
    for i, p in enumerate(parts[:-1]):
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise ScenarioError(".".join(parts[: i + 1]), "is not a table, cannot set a key in it")
        cur = nxt
    cur[parts[-1]] = value
