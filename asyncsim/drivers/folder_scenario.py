"""What a run folder records of its scenario, so that the folder stands alone.

A run folder's ``scenario.toml`` is the resolved scenario with every file it reads made
independent of where the scenario came from (docs/design.md, "Run folders"):

* the small files a scenario's timing reads (an ``empirical`` delay model's CSV, any
  ``Path`` parameter of a plug-in delay model) are copied into ``RUN/inputs/`` under a name
  that carries their SHA-256 (``inputs/3f2a9c01b7de-delays.csv``), and ``scenario.toml``
  names the copy, relative to the folder: replay, resume and a rerun of the folder's
  ``scenario.toml`` read the copy wherever the folder has moved;
* a data set's or model's file options (``data.path`` of ``cifar10``: far too big to copy)
  are written as absolute paths, ``~`` expanded, relative ones resolved against the
  scenario file's folder.

``provenance.json`` lists the copies with their hashes and where they came from
(``inputs``). The same dict is what a checkpoint records as the scenario it belongs to, so
``--resume`` can refuse a folder whose ``scenario.toml`` was edited since
(:func:`check_resume`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asyncsim import runs
from asyncsim._io import DamagedFile, atomic, dump_toml, make_folder, regular_file
from asyncsim._registry import option_defaults, path_options
from asyncsim.config import Scenario, changed_keys, flatten, to_dict
from asyncsim.drivers.plugins import plugins_used
from asyncsim.errors import ScenarioError
from asyncsim.numerics.data import dataset_factory
from asyncsim.numerics.models import model_factory
from asyncsim.timing.delays.base import spec_files
from asyncsim.timing.protocols import drop_defaults

# Where a scenario's cluster holds delay specs (cluster.compute and cluster.availability may
# be one per learner; a learner's availability holds two).
_SPECS = (("compute",), ("network", "pull", "latency"), ("network", "push", "latency"),
          ("ps_service",), ("availability", "up"), ("availability", "down"))


def _spec_sites(cluster: dict[str, Any]):
    """``(dotted key, spec)`` of every delay spec in a cluster dict, per-learner lists
    expanded."""
    for where in _SPECS:
        head = _get(cluster, where[:1])
        if isinstance(head, list):  # one per learner: [i] after the list's own key
            for i, item in enumerate(head):
                spec = _get(item, where[1:]) if len(where) > 1 else item
                if isinstance(spec, dict):
                    yield f"cluster.{where[0]}[{i}]" + "".join(f".{k}" for k in where[1:]), spec
        else:
            spec = _get(cluster, where)
            if isinstance(spec, dict):
                yield "cluster." + ".".join(where), spec


def folder_scenario(scn: Scenario, folder: Path | None = None
                    ) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """``(the dict RUN/scenario.toml holds, the copied inputs by dotted key)``; with
    ``folder``, the inputs are copied there (atomically; a copy already there is kept)."""
    d = runs.scenario_dict(scn)
    base = scn.base_dir or Path.cwd()
    inputs: dict[str, dict[str, str]] = {}
    cluster = d.get("cluster", {})
    for at, one in _spec_sites(cluster):
        for sub, value in spec_files(one):
            key = f"{at}.{'.'.join(sub)}"
            src = _resolve(value, base)
            digest = _sha256(src, key)
            name = f"{runs.INPUTS}/{digest[:12]}-{_original_name(src, digest)}"
            if folder is not None:
                _copy(src, folder / name, digest)
            _set(one, sub, name)
            inputs[key] = {"file": name, "sha256": digest, "from": str(src)}
    for section, lookup in (("data", dataset_factory), ("model", model_factory)):
        sec = d.get(section, {})
        try:
            factory = lookup(sec.get("name"))
        except ScenarioError:
            continue  # not installed here: written as given
        for k in path_options(factory, sec):
            sec[k] = str(_resolve(sec[k], base))
    return d, inputs


def write_scenario(folder: Path, scn: Scenario) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write ``folder/scenario.toml``, its inputs copied in: :func:`folder_scenario`'s pair."""
    d, inputs = folder_scenario(scn, folder)
    runs.atomic_write_text(folder / runs.SCENARIO_TOML, dump_toml(d))
    return d, inputs


def start_folder(folder: Path | None, scn: Scenario, **provenance: Any) -> dict[str, Any]:
    """Write a new run's ``scenario.toml`` (:func:`write_scenario`) and ``provenance.json``
    (with the copied inputs); returns the scenario dict the folder records (what its
    checkpoints keep). ``folder=None``: nothing is written."""
    if folder is None:
        return folder_scenario(scn)[0]
    d, inputs = write_scenario(folder, scn)
    runs.write_provenance(folder, scn, inputs=inputs, plugins=plugins_used(scn), **provenance)
    return d


def scenario_changes(saved: Mapping[str, Any], scn: Scenario, *,
                     now: Mapping[str, Any] | None = None) -> list[str]:
    """The dotted keys where a folder's recorded scenario (``saved``: its scenario.toml or a
    checkpoint's record, as parsed) differs from what ``scn`` would record now, the one
    comparison of "is this the same run" (resume, a sweep point's folder). Both sides go
    through JSON (tuples as lists); a model or data option the record leaves out equals the
    factory's default; a key the record lacks equals the config's default (a field added in
    a later asyncsim does not make an old folder "changed"). What changes no number (the
    ``[figure]`` table, ``description``) is not compared. ``now``: :func:`folder_scenario`
    of ``scn``, when the caller has it."""
    return [k for k, _, _ in scenario_differences(saved, scn, now=now)]


def scenario_differences(saved: Mapping[str, Any], scn: Scenario, *,
                         now: Mapping[str, Any] | None = None) -> list[tuple[str, Any, Any]]:
    """:func:`scenario_changes` with the values: ``(key, the record's, scn's)``, a value
    either side leaves out being its default, or :data:`NOT_SET` where there is none (a
    protocol's option that the other protocol lacks)."""
    now = _with_option_defaults(drop_defaults(
        _plain(now if now is not None else folder_scenario(scn)[0])))
    then = _with_option_defaults(drop_defaults(_plain(dict(saved))))
    for d in (now, then):
        d.pop("figure", None)
        d.pop("description", None)
    defaults = flatten(_plain(to_dict(Scenario())))
    flat_then, flat_now = flatten(then), flatten(now)
    # A key one side leaves out and the other holds at its default is the same setting
    # (a field added by a later asyncsim; a default an older one recorded).
    return [(k, flat_then.get(k, defaults.get(k, NOT_SET)),
             flat_now.get(k, defaults.get(k, NOT_SET)))
            for k in changed_keys(then, now)
            if not (k not in flat_then and flat_now.get(k) == defaults.get(k, _NONE))
            and not (k not in flat_now and flat_then.get(k) == defaults.get(k, _NONE))]


_NONE = object()


class _NotSet:
    def __repr__(self) -> str:
        return "not set"


#: A key that one side of :func:`scenario_differences` does not set, and that has no default.
NOT_SET = _NotSet()


def _with_option_defaults(d: dict[str, Any]) -> dict[str, Any]:
    """Fill the model's and data set's unstated options with their factories' defaults, so
    a record that spells out a default equals one that leaves it out."""
    for section, lookup in (("model", model_factory), ("data", dataset_factory)):
        sec = d.get(section)
        if not isinstance(sec, dict):
            continue
        try:
            factory = lookup(sec.get("name"))
        except ScenarioError:  # not installed here: compare the options as written
            continue
        for name, default in option_defaults(factory).items():
            if name in sec or (name == "seed" and section == "data") or default is None:
                continue
            try:  # as a record holds it: a default tuple compares equal to a saved list
                sec[name] = _plain({"v": default})["v"]
            except (TypeError, ValueError):  # not a value a scenario file can hold
                continue
    return d


def check_resume(folder: Path, saved: dict[str, Any] | None, scn: Scenario) -> dict[str, Any]:
    """Refuse, in one line naming the keys, to resume ``folder`` when its ``scenario.toml``
    (loaded as ``scn``) no longer resolves to the scenario its checkpoint belongs to
    (``saved``): the numbers would come from one run and the rest from another. Returns
    what the folder records of ``scn`` (:func:`folder_scenario`)."""
    if saved is None:
        raise runs.RunFolderError(f"{folder}: its checkpoint does not record the scenario it "
                                  "belongs to (written by an older asyncsim), so it cannot "
                                  "be checked against scenario.toml: pass --force to start "
                                  "over")
    now = folder_scenario(scn)[0]
    changed = scenario_changes(saved, scn, now=now)
    if changed:
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6
                                         else "")
        raise runs.RunFolderError(f"{folder}: scenario.toml changed since the checkpoint "
                                  f"({shown}); the checkpoint belongs to the scenario as it "
                                  "was: restore it, or pass --force to start over")
    return now


def _plain(d: Mapping[str, Any]) -> dict[str, Any]:
    """Through JSON, as a checkpoint stores it (tuples as lists)."""
    return json.loads(json.dumps(d))


def _original_name(src: Path, digest: str) -> str:
    """The file name a copy was made from: a run folder's own copy
    (``inputs/<digest[:12]>-delays.csv``, read again on resume or replay) keeps its name,
    so it is not copied a second time under a longer one."""
    name = src.name
    if src.parent.name == runs.INPUTS and name[:13] == f"{digest[:12]}-":
        return name[13:]
    return name


def _get(d: Any, where: tuple[str, ...]) -> Any:
    for k in where:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _set(d: dict[str, Any], where: tuple[str, ...], value: Any) -> None:
    for k in where[:-1]:
        d = d[k]
    d[where[-1]] = value


def _resolve(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return (path if path.is_absolute() else base / path).resolve()


def _sha256(path: Path, key: str) -> str:
    try:
        regular_file(path, "csv")  # a FIFO or /dev/zero: refused, not read
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except DamagedFile as e:
        raise ScenarioError(key, str(e)) from None
    except OSError as e:
        raise ScenarioError(key, f"cannot read {str(path)!r}: {e.strerror or e}") from None


def _copy(src: Path, dest: Path, digest: str) -> None:
    if dest.exists() and _sha256(dest, str(dest)) == digest:
        return  # already the folder's copy (a resume, a replay of this folder)
    make_folder(dest.parent)
    with atomic(dest) as tmp:
        shutil.copyfile(src, tmp)
