"""Scenario files: TOML -> profile -> ``--set`` overrides -> a validated :class:`Scenario`.

One module per step: :mod:`.load` (reading the file, its profiles and the overrides),
:mod:`.dotted` (``--set KEY=VALUE`` and dotted keys), :mod:`.checks` (the cross-field checks)
and :mod:`.points` (a sweep's points). Every problem raises
:class:`~asyncsim.errors.ScenarioError` naming the file, the key and what is allowed.
"""

from asyncsim.scenario.checks import check
from asyncsim.scenario.dotted import parse_override, set_dotted
from asyncsim.scenario.load import (
    PROFILES,
    attributed,
    load_run_scenario,
    load_scenario,
    read_raw,
    resolve_raw,
)
from asyncsim.scenario.points import apply_point, point_scenarios, sweep_points

__all__ = ["PROFILES", "apply_point", "attributed", "check", "load_run_scenario",
           "load_scenario", "parse_override", "point_scenarios", "read_raw", "resolve_raw",
           "set_dotted", "sweep_points"]
