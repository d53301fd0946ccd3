"""Old module paths of asyncsim 0.1, kept importing for one release (0.2).

Each old module (``asyncsim.engine``, ``asyncsim.replayer``, ...) is a few lines calling
:func:`forward`: importing it warns with a DeprecationWarning naming the new home, and its
attributes are looked up in the new modules, in order.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from typing import Any


def forward(old: str, targets: tuple[str, ...], namespace: dict[str, Any], *,
            renamed: Mapping[str, str] | None = None) -> None:
    """Make module ``old`` (whose globals are ``namespace``) a deprecated alias of
    ``targets``; ``renamed`` maps old attribute names to new ones (``_INIT_TAG`` ->
    ``INIT_TAG``)."""
    warnings.warn(f"{old} is deprecated since asyncsim 0.2 and will be removed; import from "
                  f"{' / '.join(targets)} instead (docs/design.md lists where each name lives)",
                  DeprecationWarning, stacklevel=3)
    renamed = dict(renamed or {})

    def __getattr__(name: str) -> Any:
        new = renamed.get(name, name)
        for target in targets:
            module = importlib.import_module(target)
            if hasattr(module, new):
                return getattr(module, new)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    namespace["__getattr__"] = __getattr__


def deprecated_names(module: str, namespace: dict[str, Any],
                     names: Mapping[str, str | tuple[str, str]]) -> None:
    """Give module ``module`` (globals ``namespace``) the 0.1 names ``names``, looked up on use
    with a DeprecationWarning. Each maps to ``"module:attribute"``, its implementation, or to
    ``("module:attribute", advice)`` where the implementation is private and the warning
    should say what to call instead."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        spec = names[name]
        where, advice = (spec, None) if isinstance(spec, str) else spec
        target, _, attr = where.partition(":")
        warnings.warn(f"{module}.{name} is deprecated since asyncsim 0.2 and will be removed; "
                      f"use {advice or f'{target}.{attr}'}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(target), attr)

    namespace["__getattr__"] = __getattr__
