"""What a recorded ``[protocol]`` table means: run folders spell out defaults that a scenario
may leave out (:func:`drop_defaults`), and a timing model whose meaning changed between
versions is marked so that a trace or checkpoint made before is not reused under the new one
(:func:`timing_revision`)."""

from __future__ import annotations

from typing import Any

from asyncsim._registry import option_defaults, signature_options
from asyncsim.config import ProtocolConfig
from asyncsim.errors import ScenarioError
from asyncsim.timing.protocols.base import get_protocol_class
from asyncsim.timing.protocols.fixed_delay import FixedDelay


def drop_defaults(d: dict[str, Any]) -> dict[str, Any]:
    """``d``, a scenario as a nested dict (a run folder's scenario.toml), without the
    ``[protocol]`` options at their defaults, so a record that spells out a default equals
    one that leaves it out: the protocol's own defaults, and fixed-delay's ``schedule`` and
    ``cv`` defaults under a protocol that takes neither (run folders of asyncsim <= 0.3
    record them). A kind not installed here keeps its table as written. Changes ``d``."""
    proto = d.get("protocol")
    if not isinstance(proto, dict):
        return d
    try:
        cls = get_protocol_class(proto.get("kind", ProtocolConfig.kind))
    except ScenarioError:
        return d
    own, legacy = option_defaults(cls), option_defaults(FixedDelay)
    params = signature_options(cls)[0]
    for k in [k for k in proto if k != "kind"]:
        default = own.get(k, _NONE) if k in params else legacy.get(k, _NONE)
        if default is not None and proto[k] == default:
            del proto[k]
    return d


_NONE = object()


def timing_revision(cfg: ProtocolConfig) -> str | None:
    """A mark for timing whose meaning changed between asyncsim versions, so a sweep's
    shared trace or a checkpoint made before is not reused under the new meaning: fixed-delay
    ``schedule = "normal"`` is P2's Phi draw since asyncsim 0.3 (before, the racing model now
    called ``race``). None where nothing changed."""
    if cfg.kind == "fixed-delay" and cfg.options.get("schedule") == "normal":
        return "normal=phi-draw"
    return None
