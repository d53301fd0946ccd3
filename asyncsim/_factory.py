"""Calling a registered factory with a scenario's options: one check shared by the model and
data-set registries (and the scenario validator), so every registry names the unknown option
and the allowed ones the same way."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from asyncsim.errors import did_you_mean


def keyword_options(factory: Callable[..., Any], *, exclude: tuple[str, ...] = ()
                    ) -> tuple[list[str], bool]:
    """(the keyword options ``factory`` takes, in order, less ``exclude``; whether it also
    takes ``**kwargs``)."""
    params = inspect.signature(factory).parameters.values()
    names = [p.name for p in params
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in exclude]
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def build(kind: str, name: str, factory: Callable[..., Any], options: Mapping[str, Any], *,
          fixed: Mapping[str, Any] | None = None,
          reraise: tuple[type[BaseException], ...] = ()) -> Any:
    """``factory(**fixed, **options)``; ValueError naming ``kind`` and ``name``, the unknown
    option(s) and the allowed ones for an option the factory does not take, or the factory's
    own TypeError/ValueError with its options listed. Exceptions in ``reraise`` pass
    through unchanged (e.g. a data set's DataError, which says what file is missing)."""
    fixed = dict(fixed or {})
    names, accepts_any = keyword_options(factory, exclude=tuple(fixed))
    unknown = sorted(set(options) - set(names))
    if unknown and not accepts_any:
        raise ValueError(f"{kind} {name!r}: unknown option(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(names) or '(none)'}"
                         f"{did_you_mean(unknown[0], names)}")
    try:
        return factory(**fixed, **options)
    except reraise:
        raise
    except (TypeError, ValueError) as err:
        raise ValueError(f"{kind} {name!r}: {err} (options: {', '.join(names) or '(none)'})"
                         ) from err
