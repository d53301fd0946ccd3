"""Dotted keys of a scenario as a nested dict: ``--set KEY=VALUE`` overrides read, and a
value set at a dotted key (``protocol.n``)."""

from __future__ import annotations

import re
import tomllib
from typing import Any

from asyncsim.errors import ScenarioError

# A key of --set: dotted bare TOML keys (``protocol.n``, ``cluster.network.push.bytes``),
# and a sweep grid's key quoted as in TOML (``sweep."protocol.n"``).
_DOTTED = r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*"
_KEY = re.compile(rf'{_DOTTED}|sweep\."{_DOTTED}"')


def parse_override(item: str) -> tuple[str, Any]:
    """``"protocol.n=4"`` -> ``("protocol.n", 4)``; the value is read as a TOML value, else
    text (an array may span lines). One key and one value: anything else is a one-line
    ScenarioError naming ``--set`` (what follows a value on another line would be a table
    of its own, which no key reads)."""
    key, eq, raw = item.partition("=")
    key, raw = key.strip(), raw.strip()
    if not eq or not key:
        raise ScenarioError(item, "an override must look like KEY=VALUE, e.g. protocol.n=4",
                            file="--set")
    if not _KEY.fullmatch(key):
        raise ScenarioError(key, "must be a dotted key of letters, digits, _ and -, e.g. "
                            "optimizer.lr (no empty part; quotes only around a sweep grid's "
                            "key, sweep.\"protocol.n\")", file="--set")
    try:
        doc = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        doc = {"v": raw}
    except RecursionError:
        # tomllib recurses once per bracket: [[[...]]] a thousand deep is a traceback otherwise
        raise ScenarioError(key, "the value is nested too deeply", file="--set") from None
    if set(doc) != {"v"}:
        raise ScenarioError(key, "one value only: give each key its own --set (the value "
                            f"went on to set {', '.join(sorted(set(doc) - {'v'}))})",
                            file="--set")
    return key, doc["v"]


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
