"""Name registries open to installed packages through Python entry points.

Every registry a scenario file refers to by name — delay models (``asyncsim.delays``),
protocols (``asyncsim.protocols``), learning-rate rules (``asyncsim.lr_rules``), models
(``asyncsim.models``) and data sets (``asyncsim.datasets``) — is a :class:`PluginRegistry`,
so one set of lookup rules holds for all of them (docs/plugins.md):

* a name registered in Python (built-ins included) wins over an entry point of that name, so
  your own code can override an installed plug-in;
* entry points are read once, on the first name that is not registered, and read again only
  when a name is still not found (an installed-after-import package is still found, while a
  run that only uses registered names never scans them);
* two installed packages that expose one name: the first on ``sys.path`` wins;
* a plug-in that fails to import is a :class:`~asyncsim.errors.ScenarioError` naming the
  scenario key and the entry point, not a traceback.

It also holds the one checker of a plug-in's options (:func:`check_options`,
:func:`call_checked`, :func:`build`): a delay model's parameters, a model's or data set's
options are read from the ``__init__`` or factory signature, so a user's plug-in gets exactly
the checks and one-line errors of a built-in (unknown, missing, wrong-typed, NaN values).
"""

from __future__ import annotations

import collections.abc
import functools
import importlib.metadata
import inspect
import numbers
import os
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar, Union

from asyncsim._checks import choice, finite, int64
from asyncsim.errors import ScenarioError, did_you_mean, first_line

T = TypeVar("T")
_BY_GROUP: dict[str, PluginRegistry] = {}


def callable_value(contract: str) -> Callable[[Any, str], Any]:
    """An ``adapt`` for registries of functions or factories: the loaded object itself,
    TypeError naming ``contract`` (e.g. ``"a factory f(**options) -> Model"``) otherwise."""

    def adapt(obj: Any, name: str) -> Any:
        if not callable(obj):
            raise TypeError(f"must be {contract}, got {obj!r}")
        return obj

    return adapt


class PluginRegistry(Generic[T]):
    """``name -> T`` for one entry-point group.

    Args:
        group: the entry-point group, e.g. ``"asyncsim.lr_rules"``.
        what: the kind's noun in every message (``"unknown learning-rate rule 'x'; allowed:
            ..."``, ``"unknown option for learning-rate rule 'hinge'"``).
        key: the scenario key an unknown name is reported under (``"optimizer.lr_rule"``).
        adapt: ``adapt(obj, name) -> T`` turns a loaded entry point into a registry value
            (checks it, wraps it); it raises TypeError/ValueError for an unusable object.
    """

    def __init__(self, group: str, what: str, key: str,
                 adapt: Callable[[Any, str], T] | None = None):
        self.group, self.what, self.key = group, what, key
        self.adapt = adapt or (lambda obj, name: obj)
        self.direct: dict[str, T] = {}  # registered in Python (built-ins included)
        self.plugins: dict[str, T] = {}  # entry points loaded so far
        self._eps: dict[str, importlib.metadata.EntryPoint] | None = None
        _BY_GROUP[group] = self

    def entry_points(self, *, refresh: bool = False) -> dict[str, importlib.metadata.EntryPoint]:
        """The group's entry points by name (scanned on first use, again on ``refresh``)."""
        if self._eps is None or refresh:
            table: dict[str, importlib.metadata.EntryPoint] = {}
            for ep in importlib.metadata.entry_points(group=self.group):
                table.setdefault(ep.name, ep)  # two packages, one name: the first on sys.path
            self._eps = table
        return self._eps

    def names(self) -> list[str]:
        """Every usable name: registered ones and installed entry points, sorted."""
        return sorted(set(self.direct) | set(self.entry_points(refresh=True)))

    def builtin_names(self) -> list[str]:
        """The names asyncsim itself registers (no plug-in, nothing a script added)."""
        return sorted(n for n, v in self.direct.items()
                      if str(getattr(v, "__module__", "")).startswith("asyncsim."))

    def get(self, name: str, key: str | None = None) -> T:
        """The value registered as ``name``, loading its entry point on first use.

        Raises:
            ScenarioError: under ``key`` (default: the registry's key) for an unknown name,
                listing the allowed names with a did-you-mean hint, or for a plug-in that
                cannot be loaded.
        """
        key = key or self.key
        value = self.direct.get(name)
        if value is None:
            value = self.plugins.get(name)
        if value is not None:
            return value
        fresh = self._eps is None
        eps = self.entry_points()
        if name not in eps and not fresh:
            eps = self.entry_points(refresh=True)
        ep = eps.get(name)
        if ep is None:
            choice(key, name, sorted(set(self.direct) | set(eps)), what=self.what)
        try:
            value = self.adapt(ep.load(), name)
        except Exception as e:  # a broken plug-in is the user's scenario problem, not a crash
            raise ScenarioError(key, f"{self.what} plug-in {name!r} ({ep.value}, entry point "
                                f"group {self.group}) could not be loaded: {e}") from e
        self.plugins[name] = value
        return value

    def register(self, name: str, obj: Any, *, replace: bool = False) -> T:
        """Register ``obj`` as ``name``, the one rule of every plug-in kind: checked by the
        registry's ``adapt`` (a delay model's class, a protocol's, a factory, a rule), it wins
        over an entry point of that name. Returns the registered value.

        A name another object holds is refused unless ``replace``; the same definition again
        (same module and qualified name: a reloaded module, a re-run notebook cell) replaces
        it. Anonymous functions (lambdas) are the same only when they are the same object.

        Raises:
            ValueError: ``name`` is not a non-empty string without spaces, or it is taken
                by another object (the message names both) and ``replace`` is false.
            TypeError: ``obj`` is not what the registry holds (``adapt`` refuses it).
        """
        self.check_name(name)
        value = self.adapt(obj, name)
        old = self.direct.get(name)
        if old is not None and not replace and not _same_definition(old, value):
            raise ValueError(f"{self.what} {name!r} is already registered to "
                             f"{origin(old)}; cannot register {origin(value)} "
                             f"(replace=True replaces it)")
        self.direct[name] = value
        return value

    def check_name(self, name: Any) -> str:
        """``name`` if it can name a plug-in: a non-empty string without spaces (a scenario
        key's value); else ValueError."""
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise ValueError(f"a {self.what} name must be a non-empty string without "
                             f"spaces, got {name!r}")
        return name

    def decorator(self, name: str, *, replace: bool = False) -> Callable[[Any], Any]:
        """A decorator :meth:`register`-ing its argument as ``name`` and returning it
        unchanged (``name`` is checked at once)."""
        self.check_name(name)

        def deco(obj: Any) -> Any:
            self.register(name, obj, replace=replace)
            return obj

        return deco

    def snapshot(self) -> tuple[dict[str, T], dict[str, T], Any]:
        """What :meth:`restore` puts back: the registrations and loaded entry points now (a
        test that registers names restores the registry afterwards)."""
        return dict(self.direct), dict(self.plugins), self._eps

    def restore(self, snap: tuple[dict[str, T], dict[str, T], Any]) -> None:
        """The registry as :meth:`snapshot` saw it."""
        direct, plugins, self._eps = snap
        self.direct.clear()
        self.direct.update(direct)
        self.plugins.clear()
        self.plugins.update(plugins)

    def forget_plugins(self) -> None:
        """Drop loaded entry points and the scan (tests that install and remove a plug-in)."""
        self.plugins.clear()
        self._eps = None


def origin(obj: Any) -> str:
    """``module.qualname`` of a registered object (a duck-typed delay model: the user's
    class), for messages and for :meth:`PluginRegistry.register`'s same-definition rule."""
    src = getattr(obj, "_wrapped", obj)
    name = getattr(src, "__qualname__", None) or type(src).__qualname__
    return f"{getattr(src, '__module__', None) or '?'}.{name}"


def _same_definition(old: Any, new: Any) -> bool:
    a, b = getattr(old, "_wrapped", old), getattr(new, "_wrapped", new)
    if a is b:
        return True
    return origin(a) == origin(b) and not origin(a).endswith("<lambda>")


def by_group() -> dict[str, PluginRegistry]:
    """The registries created so far, by entry-point group. (Those of the built-ins exist once
    their modules are imported; :func:`asyncsim.api.registries` imports them all.)"""
    return _BY_GROUP


# ----------------------------------------------------------------------------- options
@functools.cache
def signature_options(fn: Callable[..., Any]
                      ) -> tuple[dict[str, inspect.Parameter], dict[str, Any], bool]:
    """``(keyword parameters, their type hints, takes **kwargs)`` of a factory, or of a
    class's ``__init__`` (``self`` dropped; a wrapped duck-typed class: the user's class).
    A signature that cannot be inspected (a builtin) gives no parameters and ``**kwargs``."""
    src = getattr(fn, "_wrapped", fn)
    target = src.__init__ if isinstance(src, type) else src
    if target is object.__init__:
        return {}, {}, False
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return {}, {}, True
    items = list(sig.parameters.values())
    if isinstance(src, type):
        items = items[1:]  # self
    params = {p.name: p for p in items if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in items)
    return params, _hints(target, params), var_kw


def _hints(target: Callable[..., Any], params: Mapping[str, inspect.Parameter]) -> dict[str, Any]:
    """The resolved annotation of each parameter; one that cannot be resolved (a name only
    a user's ``TYPE_CHECKING`` block imports) is ``Any``: that parameter's values are not
    checked, and the others keep their checks."""
    try:
        return typing.get_type_hints(target)
    except Exception:
        pass
    namespace = getattr(target, "__globals__", {})
    hints: dict[str, Any] = {}
    for name, p in params.items():
        if p.annotation is p.empty:
            continue
        try:
            hints[name] = typing.get_type_hints(
                _Annotated(p.annotation, name), globalns=namespace)[name]
        except Exception:
            hints[name] = Any
    return hints


class _Annotated:
    """One annotation as an object :func:`typing.get_type_hints` resolves alone."""

    def __init__(self, annotation: Any, name: str):
        self.__annotations__ = {name: annotation}


def option_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """The options of ``fn`` that have a default, with it (a factory's ``n_train = 10000``)."""
    params, _, _ = signature_options(fn)
    return {n: p.default for n, p in params.items() if p.default is not p.empty}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


_NONE = type(None)
# A parameter type built from a nested table: type -> (what the message calls it, builder).
Nested = Mapping[type, tuple[str, Callable[[Any, str, Any], Any]]]


def check_options(fn: Callable[..., Any], options: Mapping[str, Any], *, key: str, what: str,
                  name: str, exclude: tuple[str, ...] = (),
                  also: tuple[str, ...] = (), base_dir: str | os.PathLike | None = None,
                  nested: Nested | None = None) -> dict[str, Any]:
    """``options`` checked against ``fn``'s keyword parameters: the keyword arguments to call
    it with.

    Unknown names (unless ``fn`` takes ``**kwargs``), missing required ones and values that do
    not fit a parameter's annotation (``float``: a finite number; ``int``, ``bool``, ``str``;
    ``Path``: a path, relative ones resolved against ``base_dir``; a type in ``nested``:
    built from a table by ``nested[type][1](value, key, base_dir)``) raise a
    :class:`ScenarioError` under ``key.option``. An unannotated parameter is checked against
    its default's type; any other annotation passes the value through. ``also`` lists names
    that are allowed in the table but are not options (``name``, ``batch_size``), for the
    message; ``exclude`` names parameters the caller supplies itself (a data set's ``seed``).
    ``what`` is the kind's noun, its registry's (``"delay model"``): every kind's messages
    read ``unknown option for delay model 'lognormal'; allowed: dist, mean, cv``.
    """
    params, hints, var_kw = signature_options(fn)
    params = {k: p for k, p in params.items() if k not in exclude}
    allowed = [*also, *params]
    kwargs: dict[str, Any] = {}
    for k, v in options.items():
        if k not in params and not var_kw:
            raise ScenarioError(_join(key, k), f"unknown option for {what} {name!r}; allowed: "
                                f"{', '.join(allowed) or 'none'}{did_you_mean(k, params)}")
        p = params.get(k)
        hint = hints.get(k, inspect.Parameter.empty)
        if (p is not None and p.annotation is p.empty and p.default not in (p.empty, None)):
            hint = type(p.default)  # unannotated: infer from the default's type
        kwargs[k] = coerce(hint, v, _join(key, k), base_dir, nested or {})
    required = [n for n, p in params.items() if p.default is p.empty]
    for n in required:
        if n not in kwargs:
            raise ScenarioError(_join(key, n), f"missing; {what} {name!r} requires: "
                                f"{', '.join(required)}")
    return kwargs


def coerce(hint: Any, value: Any, key: str, base_dir: Any = None,
           nested: Nested | None = None) -> Any:
    """``value`` checked (and converted) against the annotation ``hint`` (see
    :func:`check_options`)."""
    nested = nested or {}
    alts = alternatives(hint)
    if value is None and _NONE in alts:
        return None
    wants = []
    for t in alts:
        if t is float:
            wants.append("a finite number")
            if isinstance(value, int | float) and not isinstance(value, bool):
                return finite(key, value)
        elif t is int:
            wants.append("an integer")
            if isinstance(value, int) and not isinstance(value, bool):
                return int64(key, value)
        elif t is bool:
            wants.append("true or false")
            if isinstance(value, bool):
                return value
        elif t is str:
            wants.append("a string")
            if isinstance(value, str):
                return value
        elif t in (Path, os.PathLike):
            wants.append("a file path")
            if isinstance(value, str | os.PathLike):
                path = Path(value).expanduser()
                if not path.is_absolute() and base_dir is not None:
                    path = Path(base_dir) / path
                return path
        elif _homogeneous(t) in (int, float):
            # Sequence[int] (an MLP's hidden widths): checked here, when the scenario loads,
            # so `asyncsim trace`, which never builds the model, refuses it too.
            elem = _homogeneous(t)
            wants.append(f"a list of {'integers' if elem is int else 'numbers'}")
            kind = numbers.Integral if elem is int else numbers.Real
            if (isinstance(value, collections.abc.Iterable)
                    and not isinstance(value, str | bytes | Mapping)
                    and all(isinstance(x, kind) and not isinstance(x, bool) for x in value)):
                return value  # as given (a tuple, a list, a numpy array from Python)
        elif isinstance(t, type) and t in nested:
            wants.append(nested[t][0])
            if isinstance(value, t):
                return value
            if isinstance(value, Mapping):
                return nested[t][1](value, key, base_dir)
        elif t is not _NONE:
            return value  # an annotation we do not check (Any, a user's type): pass through
    raise ScenarioError(key, f"must be {' or '.join(wants)}, got {value!r}")


def _homogeneous(hint: Any) -> Any:
    """``X`` for ``Sequence[X]``, ``list[X]`` or ``tuple[X, ...]`` (one element type); else
    None (``tuple[int, float]`` is a record, not a list)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (list, collections.abc.Sequence) and len(args) == 1:
        return args[0]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def alternatives(hint: Any) -> tuple[Any, ...]:
    """The types an annotation admits: ``Path | None`` -> ``(Path, NoneType)``."""
    return typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)


def path_options(fn: Callable[..., Any], options: Mapping[str, Any]) -> list[str]:
    """The names in ``options`` that ``fn`` annotates as file paths (``Path``): the files a
    scenario makes a run read (an empirical delay's CSV, a data set's ``path``)."""
    _, hints, _ = signature_options(fn)
    return [k for k, v in options.items() if isinstance(v, str)
            and any(t in (Path, os.PathLike) for t in alternatives(hints.get(k)))]


def call_checked(fn: Callable[..., Any], kwargs: Mapping[str, Any], *, key: str, what: str,
                 name: str, reraise: tuple[type[BaseException], ...] = (),
                 failure: str = "invalid parameters for {whose}") -> Any:
    """``fn(**kwargs)``, its refusals as :class:`ScenarioError` under ``key``.

    The plug-in contract: a factory raises ``ValueError("<option>: <what is allowed>")`` (the
    checks of :mod:`asyncsim._checks` do) and the error is reported under ``key.option``; a
    ScenarioError it raises with a relative key is nested under ``key``; any other
    ValueError/TypeError is reported under ``key`` itself (``failure``, its ``{whose}``
    the plug-in, then the error's first line); a file that cannot be opened (not there, a
    folder, no permission) is reported under the option that gave its path. ``reraise``
    passes exceptions through unchanged (a data set's DataError, which says what file is
    missing)."""
    try:
        return fn(**kwargs)
    except reraise:
        raise
    except ScenarioError as e:
        raise (e.under(key) if e.file is None and key else e) from None
    except (TypeError, ValueError) as e:
        params, _, _ = signature_options(fn)
        option, sep, message = str(e).partition(": ")
        if sep and (option in kwargs or option in params):
            raise ScenarioError(_join(key, option), first_line(message)) from e
        raise ScenarioError(key, f"{failure.format(whose=f'{what} {name!r}')}: "
                            f"{first_line(e)}") from e
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        # A file option the plug-in could not open (asyncsim checks paths' form, not that
        # the file is there: a data set may download into its path). Other OSErrors (a full
        # disk, a network's) are not the scenario's and pass through.
        name = None if e.filename is None else os.fspath(e.filename)
        given = [k for k, v in kwargs.items()
                 if name is not None and isinstance(v, str | os.PathLike) and os.fspath(v) == name]
        raise ScenarioError(_join(key, given[0]) if given else key,
                            f"cannot read {name!r}: {e.strerror or first_line(e)}"
                            if name is not None else first_line(e)) from e


def build(fn: Callable[..., Any], options: Mapping[str, Any], *, key: str, what: str,
          name: str, fixed: Mapping[str, Any] | None = None, **kw: Any) -> Any:
    """:func:`check_options` then :func:`call_checked`: ``fn(**fixed, **options)``."""
    fixed = dict(fixed or {})
    reraise = kw.pop("reraise", ())
    kwargs = check_options(fn, options, key=key, what=what, name=name, exclude=tuple(fixed),
                           **kw)
    return call_checked(fn, {**fixed, **kwargs}, key=key, what=what, name=name,
                        reraise=reraise)
