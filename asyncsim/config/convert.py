"""The schema's conversion from and to plain nested dicts (parsed TOML).

:func:`from_dict` builds a schema dataclass (:mod:`asyncsim.config.schema`) from a mapping and
rejects unknown keys and wrong types with a :class:`ScenarioError` naming the dotted key and
what is allowed; :func:`to_dict` is its inverse, TOML-ready; :func:`flatten` and
:func:`changed_keys` compare scenarios by dotted key. Cross-field rules (``n <= learners``,
known delay models, protocol options) are checked by :func:`asyncsim.scenario.check`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

from asyncsim._checks import flag, int64, string, table
from asyncsim.config.schema import OPEN_TABLES
from asyncsim.errors import ScenarioError, did_you_mean


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "nothing"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        return "a list" if inner is Any else f"a list of {_describe(inner)}"
    if origin in (Mapping, dict) or tp is Mapping:
        return "a table"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, str(tp)
    )


def _shape(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) or origin in (Mapping, dict) or tp is Mapping:
        return "table"
    return "list" if origin is tuple else "value"


def _shape_of(value: Any) -> str:
    if isinstance(value, Mapping):
        return "table"
    return "list" if isinstance(value, list | tuple) else "value"


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, key)
            except ScenarioError as e:
                errors.append((a, e))
        # Report the most specific failure when only one alternative could apply: the only
        # one, or the only one of the value's shape (a table for a table, a list for a list).
        shaped = [e for a, e in errors if _shape(a) == _shape_of(value)]
        if len(errors) == 1 or len(shaped) == 1:
            raise (errors[0][1] if len(errors) == 1 else shaped[0])
        raise ScenarioError(key, f"must be {_describe(tp)}, got {value!r}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, table(key, value), prefix=key)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ScenarioError(key, f"must be {_describe(tp)}, got {value!r}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or tp is Mapping:
        table(key, value)
        args = typing.get_args(tp)
        vt = args[1] if len(args) == 2 else Any
        if vt is Any:
            return dict(value)
        if typing.get_origin(vt) is tuple:
            # sweep grids: each value a list
            return {k: _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
        return {k: _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        return flag(key, value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(key, f"must be an integer, got {value!r}")
        return int64(key, value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ScenarioError(key, f"must be a number, got {value!r}")
        try:
            value = float(value)
        except OverflowError:  # TOML's integers are unbounded
            raise ScenarioError(key, f"must be a number, got an integer of {len(str(value))} "
                                "digits, beyond float range") from None
        if math.isnan(value):
            raise ScenarioError(key, "must be a number, got NaN")
        return value
    if tp is str:
        return string(key, value)
    return value


def from_dict(cls: type, data: Mapping[str, Any], *, prefix: str = "") -> Any:
    """Build the frozen dataclass ``cls`` from ``data``, rejecting unknown keys.

    Raises:
        ScenarioError: naming the dotted key and the allowed keys or type.
    """
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    open_field = OPEN_TABLES.get(cls)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in names or k == open_field:
            if open_field is not None:
                extra[k] = v
                continue
            allowed = ", ".join(n for n in names)
            raise ScenarioError(key, f"unknown key; allowed here: {allowed}"
                                     f"{did_you_mean(k, names)}")
        kwargs[k] = _convert(hints[k], v, key)
    if open_field is not None:
        kwargs[open_field] = extra
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """The plain nested-dict form of a config (inverse of :func:`from_dict`), TOML-ready."""
    if dataclasses.is_dataclass(obj):
        out: dict[str, Any] = {}
        open_field = OPEN_TABLES.get(type(obj))
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.name == open_field:
                out.update({k: to_dict(x) for k, x in v.items()})
            elif v is not None:
                out[f.name] = to_dict(v)
        return out
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    return obj


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: a nested scenario dict by dotted key (leaves,
    lists and empty tables keep their values)."""
    if not isinstance(d, Mapping) or not d:
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def changed_keys(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two nested scenario dicts, sorted."""
    b, a = flatten(before), flatten(after)
    return sorted(k for k in b.keys() | a.keys() if b.get(k, _MISSING) != a.get(k, _MISSING))


_MISSING = object()
