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
import itertools
import math
import os
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from asyncsim import _checks
from asyncsim._io import MAX_BYTES, DamagedFile, dump_toml, read_toml, regular_file
from asyncsim._registry import check_options
from asyncsim.config import (
    FLOAT32_MAX,
    NOMINAL_NEEDS,
    SWEEP_PATHS,
    DataConfig,
    ModelConfig,
    Scenario,
    check_float32,
    check_momentum_kind,
    flatten,
    from_dict,
    optimizer_choices,
    to_dict,
)
from asyncsim.errors import ScenarioError, did_you_mean

PROFILES = ("smoke", "default", "paper")


def parse_override(item: str) -> tuple[str, Any]:
    """``"protocol.n=4"`` -> ``("protocol.n", 4)``; the value is read as a TOML value, else text."""
    if "=" not in item:
        raise ScenarioError(item, "an override must look like KEY=VALUE, e.g. protocol.n=4")
    key, raw = item.split("=", 1)
    key, raw = key.strip(), raw.strip()
    if not key:
        raise ScenarioError(item, "an override must look like KEY=VALUE, e.g. protocol.n=4")
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
    return raw


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
    pristine = copy.deepcopy(raw) if others else raw
    try:
        raw = resolve_raw(raw, profile=profile, overrides=overrides, seed=seed)
        scn = _resolved_scenario(raw, bdir, validate)
    except ScenarioError as e:
        raise attributed(e, file, overrides) from None
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


def _in_profile(e: ScenarioError, name: str | None, raw: Mapping[str, Any]) -> ScenarioError:
    """``e`` of profile ``name`` (None: the default) under the profile's key if it sets it."""
    table = raw.get("profiles", {}).get(name) if name else None
    if isinstance(table, Mapping) and any(
            e.key == k or e.key.startswith((f"{k}.", f"{k}[")) or k.startswith(f"{e.key}.")
            for k in flatten(table)):
        return ScenarioError(f"profiles.{name}.{e.key}", e.message)
    where = f"profile {name!r}" if name else "the default profile (no --profile)"
    return ScenarioError(e.key, f"{e.message} (in {where})")


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
    """A --set value as the user would write it (TOML), or its repr when TOML has none."""
    if isinstance(value, str):
        return value
    try:
        return dump_toml({"v": value}).split("=", 1)[1].strip()
    except TypeError:
        return repr(value)


def load_run_scenario(folder: str | os.PathLike, **kw: Any) -> Scenario:
    """A run folder's ``scenario.toml`` (:func:`load_scenario`'s keywords). asyncsim always
    writes it whole, so an empty or undecodable one is damaged: a one-line
    :class:`asyncsim._io.DamagedFile`, not the defaults an empty scenario file means."""
    path = Path(folder) / "scenario.toml"
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


# ----------------------------------------------------------------------------- checks
# A scenario's name is one folder under runs/: no separator, no "." or "..", nothing hidden.
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
_LOG_F32 = math.log(FLOAT32_MAX)


def _positive(key: str, value: float | None, *, allow_zero: bool = False) -> None:
    if value is not None:
        (_checks.nonneg if allow_zero else _checks.positive)(key, value, finite=True)


def check(scn: Scenario, *, base_dir: Path | None = None) -> None:
    """Cross-field checks: registries, ranges, protocol parameters against the cluster."""
    # The registries are imported here, not at the top: the models', data sets' and rules'
    # modules import JAX (~1.5 s), and a file with a misspelt key (caught by from_dict before
    # this runs) should be reported at once (tests/cli/test_cli.py).
    from asyncsim.numerics.data import check_batch_size, declared_train_size
    from asyncsim.timing.checks import check_cluster
    from asyncsim.timing.protocols import make_protocol

    if not _NAME.fullmatch(scn.name):
        raise ScenarioError("name", "names the run folder (runs/NAME/seedN): must be 1 to 100 "
                            f"letters, digits, . _ -, not starting with '.', got {scn.name!r}")
    for key, seed in (("seed", scn.seed), ("cluster.seed", scn.cluster.seed)):
        # numpy's SeedSequence takes no negative seed, and JAX keys keep 32 bits: seed 2**32
        # would silently give seed 0's batches.
        if seed is not None:
            _checks.integer(key, seed, low=0, high=2**32 - 1)
    check_cluster(scn.cluster, scn.protocol, base_dir)
    make_protocol(scn.protocol, scn.cluster.learners)  # its options, checked as it is built
    _check_optimizer(scn)
    _check_factory("model", scn.model.name, scn.model.options)
    _check_factory("data", scn.data.name, scn.data.options)
    _checks.integer("data.batch_size", scn.data.batch_size)
    n_train = declared_train_size(scn.data.name, scn.data.options)
    if n_train is not None:
        check_batch_size(scn.data.batch_size, n_train, scn.data.name)
    _check_run(scn)
    _check_measure(scn)
    for k, values in scn.sweep.items():
        _sweep_key(k)
        if not isinstance(values, tuple) or not values:
            raise ScenarioError(f"sweep.{k}", "must be a non-empty list of values")
        for i, v in enumerate(values):
            if v in values[:i]:
                raise ScenarioError(f"sweep.{k}", f"lists {v!r} twice: give each value once")


def _check_optimizer(scn: Scenario) -> None:
    from asyncsim.numerics.compensation import compensation_spec  # see check
    from asyncsim.numerics.lr_rules import make_lr_rule

    o = scn.optimizer
    _positive("optimizer.lr", o.lr)
    check_float32("optimizer.lr", o.lr)
    make_lr_rule(o.lr_rule)  # an unknown rule or a refused parameter names optimizer.lr_rule
    choices = optimizer_choices(o)
    if o.transform is not None:
        from asyncsim.numerics.transforms import make_transform

        make_transform(o.transform)  # built and stepped once: optax's refusals, in one line
    if o.compensation is not None:
        compensation_spec(o.compensation)
    _checks.unit_interval("optimizer.momentum.beta", o.momentum.beta)
    if choices.lr_staleness == "nominal":
        from asyncsim.timing.protocols import make_protocol  # see check

        proto = make_protocol(scn.protocol, scn.cluster.learners)
        if proto.nominal_staleness() is None:
            raise ScenarioError("optimizer.lr_staleness",
                                f"{NOMINAL_NEEDS}; {scn.protocol.kind!r} has none")
    _positive("optimizer.weight_decay", o.weight_decay, allow_zero=True)
    check_float32("optimizer.weight_decay", o.weight_decay)
    for k, m in o.weight_decay_mult.items():
        _positive(f"optimizer.weight_decay_mult.{k}", m, allow_zero=True)
        check_float32(f"optimizer.weight_decay_mult.{k}", m)
    s = o.schedule
    for i, e in enumerate(s.decay_epochs):
        _positive(f"optimizer.schedule.decay_epochs[{i}]", e)
    _positive("optimizer.schedule.decay_factor", s.decay_factor)
    if math.log(o.lr) + len(s.decay_epochs) * math.log(max(s.decay_factor, 1.0)) > _LOG_F32:
        raise ScenarioError("optimizer.schedule.decay_factor", f"optimizer.lr x "
                            f"{s.decay_factor}^{len(s.decay_epochs)} overflows float32 (at most "
                            f"{FLOAT32_MAX:.4g}: the update core's precision)")
    _positive("optimizer.schedule.warmup_epochs", s.warmup_epochs, allow_zero=True)
    _checks.integer("optimizer.schedule.warmup_updates", s.warmup_updates, low=0)


def _check_run(scn: Scenario) -> None:
    r = scn.run
    given = [k for k in ("updates", "gradients", "epochs", "sim_time") if getattr(r, k) is not None]
    if len(given) > 1:
        raise ScenarioError(f"run.{given[1]}", f"give one run length only; got {', '.join(given)}")
    for k in ("updates", "gradients", "epochs", "sim_time"):
        v = getattr(r, k)
        if v is not None:
            _positive(f"run.{k}", float(v))
    for k in ("eval_every", "checkpoint_every"):
        _checks.integer(f"run.{k}", getattr(r, k), low=0)
    if r.eval_samples is not None:
        _checks.integer("run.eval_samples", r.eval_samples)
    _checks.choice("run.sweep_path", r.sweep_path, SWEEP_PATHS, what="sweep path")


def _check_measure(scn: Scenario) -> None:
    m = scn.measure
    _checks.integer("measure.sharpness_samples", m.sharpness_samples)
    _checks.integer("measure.sharpness_points", m.sharpness_points, low=0)
    if m.sharpness_points and scn.run.updates is None:
        raise ScenarioError("measure.sharpness_points", "spaces the measurements over the "
                            "run's updates: give the run's length as run.updates")
    for i, kind in enumerate(m.edge_momenta):
        try:
            check_momentum_kind(kind)
        except ScenarioError as e:
            raise ScenarioError(f"measure.edge_momenta[{i}]", e.message) from None
    if m.edges and scn.protocol.kind != "fixed-delay":
        raise ScenarioError("measure.edges", "measures the stability edge of a constant delay: "
                            "needs protocol.kind = \"fixed-delay\" (P2's tau + 1 workers), got "
                            f"{scn.protocol.kind!r}")
    if m.edges and (scn.model.name != "quadratic"
                    or len(scn.model.options.get("eigenvalues", [])) != 1):
        raise ScenarioError("measure.edges", "measures the stability edge of a "
                            "one-dimensional quadratic: needs model.name = \"quadratic\" "
                            "with one eigenvalue (model.eigenvalues = [1.0])")


def _check_factory(section: str, name: str, options: Mapping[str, Any]) -> None:
    """Model/data names against their registries; options against the factory signature
    (the one option checker, :func:`asyncsim._registry.check_options`)."""
    from asyncsim.numerics.data import dataset_factory  # see check
    from asyncsim.numerics.models import model_factory

    factory = (model_factory if section == "model" else dataset_factory)(name)
    data = section == "data"  # a data set's factory gets the scenario's seed from asyncsim
    check_options(factory, options, key=section, what=section, name=name, noun="option",
                  exclude=("seed",) if data else (), also=("name", "batch_size") if data
                  else ("name",), base_dir=None)


# ----------------------------------------------------------------------------- sweeps
def sweep_points(scn: Scenario) -> list[dict[str, Any]]:
    """The cartesian product of ``scn.sweep`` as a list of {dotted key: value} (sorted keys).

    Zipped keys: a sweep entry with a plain (undotted) name whose list holds tables is one
    axis of explicit settings that vary together (coupled keys, e.g. learners and batch size);
    each table maps dotted keys to values, and the entry's own name is only a label. (A dotted
    entry such as ``"cluster.compute"`` whose values are tables is an ordinary axis.)::

        [sweep]
        setup = [{ "cluster.learners" = 1, "data.batch_size" = 128 },
                 { "cluster.learners" = 2, "data.batch_size" = 64 }]
        seed = [0, 1]

    The tables' keys are merged into the point (so the index has ordinary columns); a key a
    table leaves out keeps the scenario's value.
    """
    if not scn.sweep:
        return []
    keys = sorted(scn.sweep)
    out = []
    for combo in itertools.product(*(scn.sweep[k] for k in keys)):
        point: dict[str, Any] = {}
        for k, v in zip(keys, combo, strict=True):
            if isinstance(v, Mapping) and "." not in k:
                for kk, vv in v.items():
                    if kk in point:
                        raise ScenarioError(f"sweep.{k}", f"sets {kk!r}, also set by another "
                                            "sweep entry")
                    point[kk] = vv
            else:
                point[k] = v
        out.append(point)
    return out


def apply_point(scn: Scenario, point: Mapping[str, Any]) -> Scenario:
    """The scenario of one sweep point (without its ``sweep`` table)."""
    raw = to_dict(scn)
    raw.pop("sweep", None)
    for k, v in point.items():
        _sweep_key(k)
        if k == "seed" or "." in k:
            set_dotted(raw, k, v)
        else:
            raise ScenarioError(f"sweep.{k}", "must be a dotted key such as optimizer.lr")
    # fixed-delay runs tau + 1 workers: a tau sweep moves the worker count along with it
    # unless the point sets cluster.learners itself.
    proto = raw.get("protocol", {})
    tau = scn.protocol.options.get("tau")
    if (proto.get("kind") == "fixed-delay" and "protocol.tau" in point
            and "cluster.learners" not in point and isinstance(tau, int)
            and scn.cluster.learners == tau + 1):
        raw["cluster"]["learners"] = proto["tau"] + 1
    try:
        return from_dict(Scenario, raw)
    except ScenarioError as e:
        raise ScenarioError(f"sweep.{e.key}", e.message) from None


def _sweep_key(key: str) -> None:
    """A sweep varies its points' scenario, not the sweep itself nor its one figure (the
    [figure] table describes the figure drawn from all the points)."""
    top = key.split(".")[0]
    if top == "sweep":
        raise ScenarioError(f"sweep.{key}", "a sweep cannot vary the sweep itself; give its "
                            "axes as keys of [sweep]")
    if top == "figure":
        raise ScenarioError(f"sweep.{key}", "[figure] describes the one figure drawn from all "
                            "the points; it cannot vary between them")


def point_scenarios(scn: Scenario) -> list[tuple[str, dict[str, Any], Scenario]]:
    """``(name, keys, scenario)`` of every point of ``scn``'s sweep, in order (``p000``,
    ``p001``, ...; ``scn`` itself, as ``p000``, without a sweep): each point's scenario has
    no ``sweep`` table and keeps ``scn``'s source file. The names of a sweep's point folders
    and the scenarios their ``scenario.toml`` record."""
    points = sweep_points(scn) or [{}]
    return [(f"p{i:03d}", p, dataclasses.replace(apply_point(scn, p) if p else scn, sweep={},
                                                 source=scn.source))
            for i, p in enumerate(points)]
