"""Loading scenario files: TOML -> profile -> ``--set`` overrides -> validated :class:`Scenario`.

A scenario file holds overrides of the defaults in :mod:`asyncsim.config` only. Optional
``[profiles.NAME]`` tables scale it (``smoke`` for CI in seconds, the default in minutes on a
2-core CPU, ``paper`` for the papers' full setup)::

    name = "quickstart"
    [cluster]
    learners = 8
    compute = { dist = "lognormal", mean = 1.0, cv = 0.2 }
    [protocol]
    kind = "softsync"
    n = 4
    [profiles.smoke.run]
    updates = 20

Every problem raises :class:`ScenarioError` naming the file, the key and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import os
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from asyncsim import _checks
from asyncsim._io import MAX_BYTES, SCENARIO_TOML, DamagedFile, read_toml, regular_file, toml_value
from asyncsim.config import (
    DataConfig,
    ModelConfig,
    Scenario,
    flatten,
    from_dict,
    to_dict,
)
from asyncsim.errors import ScenarioError, did_you_mean
from asyncsim.scenario.checks import check
from asyncsim.scenario.dotted import parse_override, set_dotted
from asyncsim.scenario.points import apply_point, sweep_points

PROFILES = ("smoke", "default", "paper")


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge tables; any non-table value (lists included) replaces."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# The keys of [model] and [data] that are not the named model's or data set's options.
_NOT_OPTIONS = {"model": ("name",), "data": ("name", "batch_size")}


def _drop_renamed_options(raw: dict[str, Any], profile: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` without the options of a model or data set that ``profile`` renames: the
    other keys of [model] and [data] are options of the one they name (an MLP's hidden
    sizes, a synthetic set's size), so a paper profile that swaps the MLP for ResNet-44 or
    the synthetic set for CIFAR10 must not inherit them (CIFAR10 cut to the synthetic
    set's 4,096 images)."""
    out = dict(raw)
    defaults = {"model": ModelConfig.name, "data": DataConfig.name}
    for table, keep in _NOT_OPTIONS.items():
        base, over = raw.get(table), profile.get(table)
        if (isinstance(base, Mapping) and isinstance(over, Mapping) and "name" in over
                and over["name"] != base.get("name", defaults[table])):
            out[table] = {k: v for k, v in base.items() if k in keep}
    return out


def read_raw(source: str | os.PathLike | Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The raw mapping of a scenario and the file it came from (None for a dict)."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source)), None
    path = Path(source)
    try:
        text = _scenario_text(path)
    except FileNotFoundError:
        raise ScenarioError("", "no such file", file=str(path)) from None
    except DamagedFile as e:
        raise ScenarioError("", str(e).removeprefix(f"{path}: "), file=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError("", f"cannot read the file ({e.__class__.__name__}: {e})",
                            file=str(path)) from None
    try:
        return tomllib.loads(text), str(path)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError("", f"not valid TOML: {e}{_toml_line(text, str(e))}",
                            file=str(path)) from None
    except RecursionError:
        raise ScenarioError("", "not valid TOML: nested too deeply", file=str(path)) from None


def _scenario_text(path: Path) -> str:
    """A scenario file's text: a regular file (not a device such as /dev/zero, nor a folder)
    or a pipe (``asyncsim run /dev/stdin < s.toml``: read once), of at most
    ``MAX_BYTES["toml"]`` (a larger pipe is refused once that much has come)."""
    if not stat.S_ISFIFO(os.stat(path).st_mode):
        regular_file(path, "toml")
        return path.read_text()
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES["toml"] + 1)
    if len(data) > MAX_BYTES["toml"]:
        raise DamagedFile(f"{path}: a pipe of more than {MAX_BYTES['toml'] // 2**20} MiB; "
                          "allowed: a toml file of at most that")
    return data.decode()


def _toml_line(text: str, message: str) -> str:
    """The offending line, quoted: tomllib names only its number (a duplicate key: "Cannot
    overwrite a value (at line 3, column 8)")."""
    m = re.search(r"at line (\d+)", message)
    lines = text.splitlines()
    if not m or not 0 < int(m.group(1)) <= len(lines):
        return ""
    return f": {lines[int(m.group(1)) - 1].strip()[:80]!r}"


def resolve_raw(
    raw: Mapping[str, Any],
    *,
    profile: str | None = None,
    overrides: Iterable[str | tuple[str, Any]] = (),
    seed: int | None = None,
) -> dict[str, Any]:
    """Apply a profile, ``--set`` overrides and ``--seed`` to a raw scenario mapping."""
    raw = dict(raw)
    profiles = raw.pop("profiles", {})
    _checks.table("profiles", profiles, "of profile tables (smoke, paper)")
    tables = [f.name for f in dataclasses.fields(Scenario) if f.name != "source"]
    for name, table in profiles.items():
        _checks.choice(f"profiles.{name}", name, PROFILES, what="profile")
        _checks.table(f"profiles.{name}", table, "of scenario tables")
        for k in table:  # a profile overrides the scenario's own keys: the same names
            if k not in tables:
                raise ScenarioError(f"profiles.{name}.{k}", f"unknown key; allowed here: "
                                    f"{', '.join(tables)}{did_you_mean(k, tables)}")
    if profile is not None:
        _checks.choice("--profile", profile, PROFILES, what="profile")
        if profile != "default":
            if profile not in profiles:
                # Silently running the default scale would start a long job for a user who
                # asked for a smoke test.
                have = ", ".join(["default", *profiles])
                raise ScenarioError("--profile", f"this scenario defines no {profile!r} "
                                    f"profile; its profiles: {have}")
            raw = _merge(_drop_renamed_options(raw, profiles[profile]), profiles[profile])
    for item in overrides:
        key, value = parse_override(item) if isinstance(item, str) else item
        if key.split(".")[0] == "source":
            raise ScenarioError("source", _SOURCE)
        if key.startswith("sweep.") and len(key) > len("sweep."):
            # The rest is one sweep key, dots and all: --set sweep.protocol.n=[1,2] (or
            # sweep."protocol.n", as in TOML) adds the grid "protocol.n" = [1, 2].
            sweep = raw.get("sweep")
            sweep = dict(sweep) if isinstance(sweep, Mapping) else {}
            sweep[key[len("sweep."):].strip('"')] = value
            raw["sweep"] = sweep
            continue
        set_dotted(raw, key, value)
    if seed is not None:
        raw["seed"] = seed
    _no_dates(raw)
    return raw


def _no_dates(node: Any, key: str = "") -> None:
    """Refuse TOML's dates and times anywhere (a ``[figure]`` option included): no scenario
    value is one, and a run folder's scenario.toml could not record it."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            _no_dates(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for v in node:
            _no_dates(v, key)
    elif isinstance(node, datetime.date | datetime.time):
        raise ScenarioError(key, f"is a TOML date or time ({node}); allowed: numbers, "
                            "strings, booleans, arrays and tables")


def load_scenario(
    source: str | os.PathLike | Mapping[str, Any] | Scenario,
    *,
    profile: str | None = None,
    overrides: Iterable[str | tuple[str, Any]] = (),
    seed: int | None = None,
    validate: bool = True,
) -> Scenario:
    """Read, resolve and validate a scenario from a TOML path, a dict or a Scenario.

    ``validate=False`` skips the cross-field checks against the plug-in registries (keys and
    types are still checked): for reading what a scenario resolves to, as the figures do to
    caption their runs, without importing the numerics.

    Raises:
        ScenarioError: naming the file, the key and what is allowed.
    """
    if isinstance(source, Scenario):
        if profile in (None, "default") and not overrides and seed is None:
            return source
        source = to_dict(source)
    raw, file = read_raw(source)
    if file is not None and "source" in raw:
        raise ScenarioError("source", _SOURCE, file=file)
    bdir = Path(file).parent if file else None
    # The profiles not selected are checked too, on the file as written (from a copy:
    # resolving changes tables in place).
    others = _other_profiles(raw, profile) if validate else []
    pristine = copy.deepcopy(raw) if others else {"profiles": copy.deepcopy(raw.get("profiles"))}
    try:
        raw = resolve_raw(raw, profile=profile, overrides=overrides, seed=seed)
        scn = _resolved_scenario(raw, bdir, validate)
    except ScenarioError as e:
        if seed is not None and e.key == "seed":
            e = e.with_file(f"--seed {seed}")  # the seed given applies after every --set
        named = attributed(e, file, overrides)
        if profile not in (None, "default") and not str(named.file).startswith("--set"):
            # Not a --set's value: the selected profile's, where its table sets the key.
            named = (_set_by_profile(e, profile, pristine) or named).with_file(file)
        raise named from None
    for other in others:
        try:
            _resolved_scenario(resolve_raw(copy.deepcopy(pristine), profile=other), bdir, True)
        except ScenarioError as e:
            raise _in_profile(e, other, pristine).with_file(file) from None
    if file is not None:
        scn = dataclasses.replace(scn, source=str(file))
    return scn


_SOURCE = "is set by asyncsim to the file's path; remove it"  # in a file and in --set


def _resolved_scenario(raw: dict[str, Any], bdir: Path | None, validate: bool) -> Scenario:
    """The Scenario of a resolved mapping, checked with its sweep points (``validate``)."""
    _fill_protocol_defaults(raw)
    scn = from_dict(Scenario, raw)
    for checked in ([scn, *(apply_point(scn, p) for p in sweep_points(scn))]
                    if validate else ()):
        check(checked, base_dir=bdir)
    return scn


def _other_profiles(raw: Mapping[str, Any], profile: str | None) -> list[str | None]:
    """The profiles of a file other than ``profile`` (None: the default scale)."""
    profiles = raw.get("profiles")
    if not isinstance(profiles, Mapping) or not profiles:
        return []
    names = [None, *(n for n in profiles if n in PROFILES and n != "default")]
    return [n for n in names if n != (None if profile == "default" else profile)]


def _set_by_profile(e: ScenarioError, name: str | None,
                    raw: Mapping[str, Any]) -> ScenarioError | None:
    """``e`` under the key of profile ``name`` (``profiles.smoke.run.updatez``) if that
    profile's table sets ``e``'s key, else None."""
    profiles = raw.get("profiles")
    table = profiles.get(name) if name and isinstance(profiles, Mapping) else None
    if isinstance(table, Mapping) and any(
            e.key == k or e.key.startswith((f"{k}.", f"{k}[")) or k.startswith(f"{e.key}.")
            for k in flatten(table)):
        return ScenarioError(f"profiles.{name}.{e.key}", e.message)
    return None


def _in_profile(e: ScenarioError, name: str | None, raw: Mapping[str, Any]) -> ScenarioError:
    """``e`` of profile ``name`` (None: the default) under the profile's key if it sets it,
    else said to be found in that profile."""
    where = f"profile {name!r}" if name else "the default profile (no --profile)"
    return (_set_by_profile(e, name, raw)
            or ScenarioError(e.key, f"{e.message} (in {where})"))


def attributed(e: ScenarioError, file: str | None,
               overrides: Iterable[str | tuple[str, Any]]) -> ScenarioError:
    """``e`` attributed to what set its key: the last ``--set KEY=VALUE`` that set it (the
    last one wins when they are applied), else the file (also for a check made after the
    load: ``asyncsim run``'s of ``[figure]``). A refused parameter the file set,
    after ``--set TABLE.kind=...`` (the file's parameters of the old kind stay), says how to
    replace the whole table."""
    items = [parse_override(o) if isinstance(o, str) else tuple(o) for o in overrides]
    for key, value in reversed(items):
        if e.key == key or e.key.startswith((f"{key}.", f"{key}[")):
            return e.with_file(f"--set {key}={_show(value)}")
    for key, value in reversed(items):
        table, _, leaf = key.rpartition(".")
        if leaf == "kind" and table and e.key.startswith(f"{table}."):
            hint = (f" (--set {key}={_show(value)} keeps the file's other {table}.* keys; "
                    f"to replace the table: --set '{table}={{kind=\"{_show(value)}\"}}')")
            return ScenarioError(e.key, e.message + hint, file=e.file or file)
    return e.with_file(file)


def _show(value: Any) -> str:
    """A --set value as the user would write it (TOML, a table inline, on one line), or its
    repr when TOML has none."""
    if isinstance(value, str):
        return value
    try:
        return toml_value(value)
    except TypeError:
        return repr(value)


def load_run_scenario(folder: str | os.PathLike, **kw: Any) -> Scenario:
    """A run folder's ``scenario.toml`` (:func:`load_scenario`'s keywords). asyncsim always
    writes it whole, so an empty or undecodable one is damaged: a one-line
    :class:`asyncsim._io.DamagedFile`, not the defaults an empty scenario file means."""
    path = Path(folder) / SCENARIO_TOML
    read_toml(path, what="the run's scenario")
    return load_scenario(path, **kw)


def _fill_protocol_defaults(raw: dict[str, Any]) -> None:
    """fixed-delay runs tau + 1 workers (P2's round robin); fill learners when not given."""
    proto = raw.get("protocol")
    if isinstance(proto, Mapping) and proto.get("kind") == "fixed-delay":
        tau = proto.get("tau")
        cluster = raw.setdefault("cluster", {})
        if isinstance(tau, int) and isinstance(cluster, dict) and "learners" not in cluster:
            cluster["learners"] = tau + 1
