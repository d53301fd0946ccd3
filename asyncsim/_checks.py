"""The value checks every layer shares: one wording for "must be a positive number" & co.

Each check returns the value (converted where that is the point, e.g. ``integer`` returns an
``int``) or raises :class:`~asyncsim.errors.ScenarioError` under ``name``. Inside a plug-in
factory (a delay model's ``__init__``, a model or data-set factory) ``name`` is the option's
own name; :func:`asyncsim._registry.call_checked` nests it under the scenario key the factory
was built for (``mean`` -> ``cluster.compute.mean``), so the same check reads right in a
scenario validator (which passes the full dotted key) and in a factory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from numbers import Integral, Real
from typing import Any

from asyncsim.errors import ScenarioError, did_you_mean


def _is_number(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def is_finite(v: Any) -> bool:
    """Whether ``v`` is a finite number; an integer beyond float range (TOML's integers are
    unbounded) is not."""
    try:
        return math.isfinite(float(v))
    except (OverflowError, TypeError, ValueError):
        return False


def finite(name: str, v: Any) -> float:
    """A finite number (not a bool, not NaN or inf, an integer within float range), as a
    float."""
    if not _is_number(v) or not is_finite(v):
        raise ScenarioError(name, f"must be a finite number, got {v!r}")
    return float(v)


def positive(name: str, v: Any, *, finite: bool = False, unit: str = "") -> float:
    """``v > 0`` (and finite with ``finite``), as a float; ``unit`` says what it counts, for
    the message (``bytes per second``: "a positive number of bytes per second")."""
    what = "a positive finite number" if finite else "a positive number"
    if unit:
        what = f"{what} of {unit}"
    if not _is_number(v) or not v > 0 or (finite and not is_finite(v)):
        raise ScenarioError(name, f"must be {what}, got {v!r}")
    return float(v)


def nonneg(name: str, v: Any, *, finite: bool = True) -> float:
    """``v >= 0`` (and finite, by default), as a float."""
    what = "a finite number >= 0" if finite else "a number >= 0"
    if not _is_number(v) or not v >= 0 or (finite and not is_finite(v)):
        raise ScenarioError(name, f"must be {what}, got {v!r}")
    return float(v)


# TOML's integers are 64-bit (tomllib reads any): numpy, JAX and the run folder's files hold
# no more.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def int64(name: str, v: int) -> int:
    """An integer TOML, numpy and JAX hold: in ``INT64_MIN..INT64_MAX``."""
    if not INT64_MIN <= v <= INT64_MAX:
        raise ScenarioError(name, f"must be a 64-bit integer ({INT64_MIN}..{INT64_MAX}), "
                            f"got {v}")
    return v


def unit_interval(name: str, v: Any) -> float:
    """``0 <= v < 1`` (a momentum coefficient, a dampening), as a float."""
    if not _is_number(v) or not 0.0 <= v < 1.0:
        raise ScenarioError(name, f"must be in [0, 1), got {v!r}")
    return float(v)


def integer(name: str, v: Any, *, low: int = 1, high: int | None = None,
            bound: str = "") -> int:
    """An integer in ``low..high`` (``high`` None: no upper bound), as an ``int``; ``bound``
    names the key ``high`` comes from, for the message (``cluster.learners``)."""
    ok = isinstance(v, Integral) and not isinstance(v, bool) and v >= low
    if ok and high is not None:
        ok = v <= high
    if not ok:
        if high is not None:
            what = f"an integer in {low}..{high}" + (f" ({bound})" if bound else "")
        else:
            what = {1: "a positive integer", 0: "an integer >= 0"}.get(low, f"an integer >= {low}")
        raise ScenarioError(name, f"must be {what}, got {v!r}")
    return int(v)


def choice(name: str, v: Any, allowed: Sequence[str], *, what: str = "value") -> str:
    """One of ``allowed``: the one choice check (names in a registry are refused in the same
    words, :meth:`asyncsim._registry.PluginRegistry.get`), with a did-you-mean hint for a
    near miss: ``unknown {what} 'x'; allowed: a, b``."""
    if v not in allowed:
        raise ScenarioError(name, f"unknown {what} {v!r}; allowed: {', '.join(allowed)}"
                            f"{did_you_mean(v, allowed)}")
    return v


def flag(name: str, v: Any) -> bool:
    """``true`` or ``false`` (TOML booleans only: 1 and "yes" are refused)."""
    if not isinstance(v, bool):
        raise ScenarioError(name, f"must be true or false, got {v!r}")
    return v


def string(name: str, v: Any) -> str:
    """A string (a name, a label): anything else is refused, not converted."""
    if not isinstance(v, str):
        raise ScenarioError(name, f"must be a string, got {v!r}")
    return v


def table(name: str, v: Any, detail: str = "") -> Mapping[str, Any]:
    """A table (any mapping: a TOML table, a dict from Python); ``detail`` follows "a
    table" in the message, to say what it holds (``{ name = "adam", ... }``, ``of scenario
    tables``)."""
    if not isinstance(v, Mapping):
        what = f"a table {detail}" if detail else "a table"
        raise ScenarioError(name, f"must be {what}, got {v!r}")
    return v


def required(name: str, spec: Mapping[str, Any], key: str,
             allowed: Sequence[str] | Callable[[], Sequence[str]]) -> Any:
    """``spec[key]``, the entry that says which kind a table is (``dist``, ``kind``); a table
    without it is refused under ``name``, listing the allowed values. ``allowed`` may be a
    function that lists them, called only for that message: a registry's list scans the
    installed packages' entry points (milliseconds each, for every delay spec built)."""
    if key not in spec:
        names = allowed() if callable(allowed) else allowed
        raise ScenarioError(name, f"missing; allowed: {', '.join(names)}")
    return spec[key]


def shape(name: str, v: Any) -> tuple[int, ...]:
    """A list of positive integers (a single integer is a list of one)."""
    if isinstance(v, Integral) and not isinstance(v, bool):
        v = (v,)
    if (not isinstance(v, Sequence) or isinstance(v, str)
            or not all(isinstance(x, Integral) and not isinstance(x, bool) and x > 0 for x in v)):
        raise ScenarioError(name, f"must be a list of positive integers, got {v!r}")
    return tuple(int(x) for x in v)


def physical_memory() -> int | None:
    """This machine's memory in bytes; None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _bytes(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def memory(name: str, need: float, what: str, detail: str = "", *,
           allowed: float | None = None, allowed_by: str = "") -> None:
    """The one memory check: refuse, before anything is built, what needs more than
    ``allowed`` bytes (None: this machine's memory; not known: nothing is refused), in one
    line under ``name``: ``{what} about N GiB{detail}; this machine has M GiB``, or ``...;
    more than the M GiB allowed ({allowed_by})`` for a limit the caller sets."""
    have = physical_memory() if allowed is None else allowed
    if have is not None and not need <= have:
        need = min(need, 1e300)  # an integer beyond float range (TOML's are unbounded)
        limit = (f"this machine has {_bytes(have)}" if allowed is None else
                 f"more than the {_bytes(have)} allowed ({allowed_by or name})")
        raise ScenarioError(name, f"{what} about {_bytes(need)}{detail}; {limit}")
