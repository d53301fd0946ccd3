"""The reference of every scenario key, generated from the typed config
(:mod:`asyncsim.config.schema`) and the built-in protocols' signatures
so that it cannot drift from the code: ``python -m asyncsim.keys > docs/keys.md``
(tests/cli/test_bad_input.py checks that the committed file is what this writes).

Each key is listed with its type, its default and, where a registry or a fixed list decides,
the built-in values (plug-ins add their own); the text is the comment the field carries in
:mod:`asyncsim.config.schema` (a protocol option's: the ``Args:`` of its ``__init__``).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing

from asyncsim import config
from asyncsim._io import toml_value


def _allowed() -> dict[str, list[str]]:
    """The built-in values of the keys whose values a registry or a fixed list decides
    (plug-ins add names: ``asyncsim.api.registries()``)."""
    from asyncsim.drivers.plugins import registries
    from asyncsim.numerics.compensation import KINDS
    from asyncsim.timing.protocols import FixedDelay

    names = {g.split(".")[1]: r.builtin_names() for g, r in registries().items()}
    delays = [f"{{dist = ...}} with dist one of: {', '.join(names['delays'])}"]
    return {"protocol.kind": names["protocols"], "optimizer.lr_rule": names["lr_rules"],
            "optimizer.momentum.kind": list(config.MOMENTUM_KINDS),
            "optimizer.momentum.style": list(config.MOMENTUM_STYLES),
            "optimizer.lr_staleness": list(config.LR_STALENESS),
            "optimizer.weight_decay_scope": list(config.WEIGHT_DECAY_SCOPES),
            # The aliases are the installed optax's: named by the rule, not listed.
            "optimizer.transform": ["{name = ...} with name an optax optimizer alias that "
                                    "takes a learning_rate (transform_names(), e.g. adam, "
                                    "rmsprop, sgd)"],
            "optimizer.compensation": [
                f'{{kind = "{k}"{"".join(f", {p} = {d}" for p, (d, _) in ps.items())}}}'
                for k, ps in KINDS.items()],
            "model.name": names["models"], "data.name": names["datasets"],
            "run.sweep_path": list(config.SWEEP_PATHS),
            "protocol.schedule": list(FixedDelay.SCHEDULES),
            "cluster.compute": delays + ["or a list of one such table per learner"],
            "cluster.network.pull.latency": delays, "cluster.network.push.latency": delays,
            "cluster.ps_service": delays, "cluster.availability.up": delays,
            "cluster.availability.down": delays,
            "measure.edge_momenta": list(config.MOMENTUM_KINDS),
            "cluster.network.ps_ingress.sharing": list(config.SHARINGS),
            "cluster.network.ps_egress.sharing": list(config.SHARINGS)}


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment in the source: the lines above it and the one after it."""
    lines = inspect.getsource(cls).splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = re.match(r"\s+(\w+): [^=]+(?:=.*?)?(?:#\s*(.*))?$", line)
        if not m or m.group(1) not in {f.name for f in dataclasses.fields(cls)}:
            continue
        above = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            above.insert(0, lines[j].strip().lstrip("#").strip())
            j -= 1
        out[m.group(1)] = " ".join([*above, m.group(2) or ""]).strip()
    return out


def _type(hint: object) -> str:
    text = str(hint).replace("typing.", "").replace("collections.abc.", "")
    return re.sub(r"<class '(\w+)'>", r"\1", text).replace("NoneType", "None")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return "(table)"
    return "none" if value is None else f"`{toml_value(config.to_dict(value))}`"


def _rows(cls: type, prefix: str, allowed: dict[str, list[str]]):
    hints = typing.get_type_hints(cls)
    notes = _comments(cls)
    for f in dataclasses.fields(cls):
        if f.name == "source":
            continue  # set by the loader, never by a file
        key = f"{prefix}{f.name}"
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from _rows(hint, f"{key}.", allowed)
            continue
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if inner and dataclasses.is_dataclass(inner[0]) and all(
                a is inner[0] or typing.get_args(a)[:1] == (inner[0],) for a in inner):
            # An optional table (the PS's shared interface), or a table or a list of them (a
            # learner's availability): its keys, and what absent means.
            yield (key, "table, list of tables or none" if len(inner) > 1 else
                   "table or none", "none", notes.get(f.name, ""))
            yield from _rows(inner[0], f"{key}.", allowed)
            continue
        if cls is config.ProtocolConfig and f.name == "options":
            yield from _protocol_rows(prefix, allowed)
            continue
        if cls in config.OPEN_TABLES and f.name == config.OPEN_TABLES[cls]:
            yield (f"{prefix}*", "any", "", "the options of the named factory, checked "
                   "against its signature (see `asyncsim.api.registries()`)")
            continue
        text = notes.get(f.name, "")
        if key in allowed:
            text += (" " if text else "") + "Built in: " + ", ".join(allowed[key]) + "."
        yield key, _type(hint), _default(f), text


def _arg_docs(cls: type) -> dict[str, str]:
    """The ``Args:`` section of ``cls.__init__``'s docstring, by parameter (one line each)."""
    doc = inspect.getdoc(cls.__init__) or ""
    out: dict[str, str] = {}
    name, indent = None, None
    for line in doc.partition("Args:")[2].splitlines():
        if not line.strip():
            continue
        lead = len(line) - len(line.lstrip())
        indent = lead if indent is None else indent
        m = re.match(r"(\w+): (.*)", line.strip())
        if lead == indent and m:
            name, out[m.group(1)] = m.group(1), m.group(2)
        elif name and lead > indent:
            out[name] += " " + line.strip()
        else:
            break
    return out


def _protocol_rows(prefix: str, allowed: dict[str, list[str]]):
    """The options of the built-in protocols, read from their classes' signatures (a
    plug-in's are its own: ``protocol.*``)."""
    from asyncsim._registry import signature_options
    from asyncsim.drivers.plugins import registries

    reg = registries()["asyncsim.protocols"]
    for kind in reg.builtin_names():
        params, hints, _ = signature_options(reg.get(kind))
        for name, p in params.items():
            if name == "learners":
                continue  # cluster.learners
            key = f"{prefix}{name}"
            default = ("required" if p.default is p.empty else "none" if p.default is None
                       else f"`{toml_value(p.default)}`")
            text = f"{kind}: {_arg_docs(reg.get(kind)).get(name, '')}".strip()
            if key in allowed:
                text += " Built in: " + ", ".join(allowed[key]) + "."
            yield key, _type(hints.get(name, "any")), default, text
    yield (f"{prefix}*", "any", "", "the options of a plug-in protocol, checked against its "
           "class's signature")


def key_reference() -> str:
    """docs/keys.md: one table row per scenario key."""
    allowed = _allowed()
    out = ["# Scenario keys", "",
           "Generated by `python -m asyncsim.keys` from `asyncsim/config/schema.py` and the "
           "built-in protocols' signatures (do not edit: "
           "tests/cli/test_bad_input.py checks it). Every key is optional: an empty file runs "
           "the defaults (an MLP on synthetic-cifar, 4 async learners, batch 32, 100 "
           "updates). `[profiles.smoke|default|paper]` tables hold the same keys and are laid "
           "over the file with `--profile`; `source` is set by the loader, never by a file.",
           "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for key, kind, default, text in _rows(config.Scenario, "", allowed):
        out.append(f"| `{key}` | `{kind}` | {default} | {text.replace('|', '/')} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(key_reference(), end="")
