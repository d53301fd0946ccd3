"""Plug-ins from installed packages: every registry a scenario names (delay models,
protocols, learning-rate rules, models, data sets) reads its entry-point group, so a package
that exposes all five runs from a TOML file through the CLI with no change to asyncsim."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from asyncsim.api import run, simulate
from asyncsim.cli import main
from asyncsim.errors import ScenarioError
from asyncsim.numerics import core, data, models
from asyncsim.scenario import load_scenario
from asyncsim.timing import delays, protocols

PLUGGED = """
name = "plugged"
seed = 3
[cluster]
learners = 4
compute = { dist = "weibull-test", shape = 2.0, scale = 1.0 }
[protocol]
kind = "pairs-test"
[optimizer]
lr = 0.05
lr_rule = "sqrt-staleness-test"
[model]
name = "affine-test"
dim = 3
[data]
name = "ramp-test"
dim = 3
batch_size = 8
[run]
updates = 40
eval_every = 20
"""


def plugged(**over):
    raw = {"seed": 3, "cluster": {"learners": 4,
                                  "compute": {"dist": "weibull-test", "shape": 2.0}},
           "protocol": {"kind": "pairs-test"},
           "optimizer": {"lr": 0.05, "lr_rule": "sqrt-staleness-test"},
           "model": {"name": "affine-test", "dim": 3},
           "data": {"name": "ramp-test", "dim": 3, "batch_size": 8},
           "run": {"updates": 40}}
    for k, v in over.items():
        raw[k] = {**raw[k], **v}
    return load_scenario(raw)


def test_every_registry_lists_and_loads_its_entry_points(installed_plugin):
    assert "weibull-test" in delays.available_delays()
    assert "pairs-test" in protocols.available_protocols()
    assert "sqrt-staleness-test" in core.available_lr_rules()
    assert "affine-test" in models.available_models()
    assert "ramp-test" in data.available_datasets()

    assert protocols.get_protocol_class("pairs-test").name == "pairs-test"
    rule = core.get_lr_rule("sqrt-staleness-test")
    np.testing.assert_allclose(rule(1.0, jnp.array([0.0, 1.0, 4.0]), 2.0), [1.0, 1.0, 0.5])
    m = models.get_model("affine-test", dim=2, scale=2.0)
    assert m.apply({"w": jnp.ones(2), "b": jnp.zeros(())}, jnp.ones((1, 2)))[0] == 4.0
    ds = data.get_dataset("ramp-test", seed=0, dim=2, n_train=5, n_test=1)
    np.testing.assert_allclose(ds.y_train, ds.x_train @ np.array([1.0, 2.0]), rtol=1e-6)
    with pytest.raises(ValueError, match="dim: must be >= 1"):  # the factory's own check
        models.get_model("affine-test", dim=0)
    with pytest.raises(ValueError, match="unknown option"):
        models.get_model("affine-test", width=2)


def test_a_scenario_of_plugins_runs_from_the_cli_and_replays(installed_plugin, tmp_path,
                                                              capsys):
    path = tmp_path / "plugged.toml"
    path.write_text(PLUGGED)
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 40 and not summary["diverged"]
    # provenance.json names every plug-in the run used, with its package and version.
    prov = json.loads((out / "provenance.json").read_text())
    pkg = {"package": "asyncsim-plugin-example", "version": "0.1.0"}
    assert prov["plugins"] == [
        {"group": "asyncsim.protocols", "name": "pairs-test",
         "object": "asyncsim_plugin_example.Pairs", **pkg},
        {"group": "asyncsim.lr_rules", "name": "sqrt-staleness-test",
         "object": "asyncsim_plugin_example.sqrt_staleness", **pkg},
        {"group": "asyncsim.models", "name": "affine-test",
         "object": "asyncsim_plugin_example.affine", **pkg},
        {"group": "asyncsim.datasets", "name": "ramp-test",
         "object": "asyncsim_plugin_example.ramp", **pkg},
        {"group": "asyncsim.delays", "name": "weibull-test",
         "object": "asyncsim_plugin_example.Weibull", **pkg}]
    # The plug-in protocol's shape: every update takes two gradients.
    trace = simulate(load_scenario(path))
    assert np.all(trace.updates["n_grads"] == 2)
    # Replay finds the same plug-ins through the recorded scenario.
    capsys.readouterr()
    assert main(["replay", str(out), "--out", str(tmp_path / "again"), "--path", "loop"]) == 0
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["param_hash"] == summary["param_hash"]


def test_plugin_rule_equals_the_same_rule_registered_in_python(installed_plugin,
                                                               fresh_registries):
    core.register_lr_rule("sqrt-staleness-here", lambda lr, tau, mean:
                          lr / jnp.sqrt(jnp.maximum(tau, 1.0)))
    a = run(plugged()).summary["param_hash"]
    b = run(plugged(optimizer={"lr_rule": "sqrt-staleness-here"}))
    c = run(plugged(optimizer={"lr_rule": "constant"}))
    assert a == b.summary["param_hash"]
    assert a != c.summary["param_hash"]  # the rule is applied: staleness > 1 occurs
    assert b.trace.max_staleness > 1


def test_direct_registration_wins_over_an_entry_point(installed_plugin, fresh_registries):
    saved = {g: r.snapshot() for g, r in fresh_registries.items()}
    core.register_lr_rule("sqrt-staleness-test", lambda lr, tau, mean: lr * 0 + 7.0)
    assert float(core.get_lr_rule("sqrt-staleness-test")(1.0, jnp.zeros(()), 1.0)) == 7.0
    fresh_registries["asyncsim.lr_rules"].restore(saved["asyncsim.lr_rules"])
    assert float(core.get_lr_rule("sqrt-staleness-test")(1.0, jnp.full((), 4.0), 1.0)) == 0.5


@pytest.mark.parametrize("rule,why", [
    ("broken-test", "must be a function"),
    ("missing-test", "No module named 'asyncsim_plugin_example_missing'"),
])
def test_a_broken_plugin_is_a_scenario_error_naming_the_key(installed_plugin, tmp_path,
                                                           capsys, rule, why):
    path = tmp_path / "broken.toml"
    path.write_text(PLUGGED.replace("sqrt-staleness-test", rule))
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for part in (str(path), "optimizer.lr_rule", f"plug-in {rule!r}", "asyncsim.lr_rules",
                 "could not be loaded", why):
        assert part in err, err
    assert not out.exists()  # nothing half-written


def test_unknown_names_list_installed_plugins(installed_plugin):
    with pytest.raises(ScenarioError) as err:
        plugged(optimizer={"lr_rule": "sqrt-staleness-tst"})
    assert err.value.key == "optimizer.lr_rule"
    assert "sqrt-staleness-test, stability-edge" in err.value.message
    assert "(did you mean 'sqrt-staleness-test'?)" in err.value.message
    for section, name, key in (("model", "afine-test", "model.name"),
                               ("data", "ramp-tst", "data.name")):
        with pytest.raises(ScenarioError) as err:
            plugged(**{section: {"name": name}})
        assert err.value.key == key and "-test'?)" in err.value.message
    with pytest.raises(ScenarioError) as err:
        plugged(protocol={"kind": "pair-test"})
    assert err.value.key == "protocol.kind" and "pairs-test" in err.value.message
    with pytest.raises(ScenarioError) as err:  # the plug-in's own check names its key
        plugged(cluster={"learners": 1})
    assert err.value.key == "cluster.learners" and "needs >= 2" in err.value.message


def test_python_registrations_are_what_another_process_needs(fresh_registries):
    """What a Ray actor must be sent: the names a scenario uses that were registered in
    Python outside asyncsim (nested delay specs included; a duck-typed delay model as the
    user's own class), never built-ins or entry points; installing them registers them."""
    from asyncsim.drivers.plugins import (
        install_registrations,
        plugins_used,
        python_registrations,
    )

    class Ticks:  # duck-typed: asyncsim wraps it
        def sample(self, rng, learner, now):
            return 1.0

    def rule(lr, tau, mean):
        return lr + 0.0 * tau

    saved = {g: r.snapshot() for g, r in fresh_registries.items()}
    delays.register_delay("test-ticks")(Ticks)
    core.register_lr_rule("test-rule", rule)
    scn = load_scenario({
        "cluster": {"learners": 2, "compute": {"dist": "straggler", "p": 0.5, "factor": 2.0,
                                               "base": {"dist": "test-ticks"}}},
        "optimizer": {"lr_rule": "test-rule"}})
    regs = python_registrations(scn)
    assert sorted((g, n) for g, n, _ in regs) == [("asyncsim.delays", "test-ticks"),
                                                  ("asyncsim.lr_rules", "test-rule")]
    assert dict(((g, n), o) for g, n, o in regs)["asyncsim.delays", "test-ticks"] is Ticks
    assert python_registrations(load_scenario({})) == []  # built-ins only
    # provenance.json lists them too: a test file's objects belong to no installed package.
    used = plugins_used(scn)
    assert [(p["group"], p["name"], p["package"], p["version"]) for p in used] == [
        ("asyncsim.lr_rules", "test-rule", None, None),
        ("asyncsim.delays", "test-ticks", None, None)]
    assert used[1]["object"].endswith("Ticks")
    assert plugins_used(load_scenario({})) == []
    for g, r in fresh_registries.items():  # as in a fresh process
        r.restore(saved[g])
    install_registrations(regs)
    assert core.get_lr_rule("test-rule") is rule
    assert delays.make_delay({"dist": "test-ticks"}).sample(None, 0, 0.0) == 1.0


def test_a_plugin_protocol_takes_an_option_from_its_signature(installed_plugin, tmp_path,
                                                              capsys):
    """``protocol = { kind = "every-k-test", k = 3 }``: the option reaches the plug-in's
    ``__init__`` through ``asyncsim run``, the run folder records it, and ``asyncsim replay``
    of the folder ends with the same parameters."""
    path = tmp_path / "every3.toml"
    path.write_text(PLUGGED.replace('kind = "pairs-test"', 'kind = "every-k-test"\nk = 3'))
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 40 and summary["gradients"] == 120  # 3 per update
    trace = simulate(load_scenario(path))
    assert np.all(trace.updates["n_grads"] == 3)
    recorded = load_scenario(out / "scenario.toml").protocol
    assert (recorded.kind, dict(recorded.options)) == ("every-k-test", {"k": 3})
    capsys.readouterr()
    assert main(["replay", str(out), "--out", str(tmp_path / "again"), "--path", "loop",
                 "--quiet"]) == 0
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["param_hash"] == summary["param_hash"]
    # The default (k = 2) is the signature's: two gradients per update.
    assert np.all(simulate(plugged(protocol={"kind": "every-k-test"})).updates["n_grads"] == 2)


@pytest.mark.parametrize("line,key,says", [
    ("k = 3\nj = 1", "protocol.j", "unknown option for protocol 'every-k-test'; allowed: kind, k"),
    ('k = "3"', "protocol.k", "must be an integer, got '3'"),
    ("k = 0", "protocol.k", "must be >= 1, got 0"),
])
def test_a_plugin_protocol_refuses_a_bad_option_in_one_line(installed_plugin, tmp_path,
                                                            capsys, line, key, says):
    path = tmp_path / "bad.toml"
    path.write_text(PLUGGED.replace('kind = "pairs-test"', f'kind = "every-k-test"\n{line}'))
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"asyncsim: error: {path}: {key}: {says}", err
    assert not (tmp_path / "run").exists()


def _kinds():
    """One object of each plug-in kind, its registry, its door and a second object."""
    from asyncsim.numerics.data import register_dataset
    from asyncsim.numerics.models import register_model

    class Ticks(delays.DelayModel):
        def sample(self, rng, learner, now):
            return 1.0

    class Tocks(Ticks):
        pass

    class Mine(protocols.Async):
        pass

    class Yours(protocols.Async):
        pass

    def rule_a(lr, tau, mean):
        return lr

    def rule_b(lr, tau, mean):
        return lr

    def model_a():
        return None

    def model_b():
        return None

    return [("asyncsim.delays", delays.register_delay, Ticks, Tocks),
            ("asyncsim.protocols", protocols.register_protocol, Mine, Yours),
            ("asyncsim.lr_rules", core.register_lr_rule, rule_a, rule_b),
            ("asyncsim.models", register_model, model_a, model_b),
            ("asyncsim.datasets", register_dataset, model_a, model_b)]


@pytest.mark.parametrize("index", range(5), ids=["delays", "protocols", "lr_rules", "models",
                                                 "datasets"])
def test_every_kind_refuses_a_taken_name_naming_both(fresh_registries, index):
    """One rule for every registry: a name another object holds is a ValueError naming
    both, through the public door and the registry's own ``register``; the same object
    again is fine; ``replace=True`` replaces."""
    group, door, first, second = _kinds()[index]
    reg = fresh_registries[group]
    door("dup-test")(first)
    door("dup-test")(first)  # the same definition again (a reloaded module)
    for attempt in (lambda: door("dup-test")(second),
                    lambda: reg.register("dup-test", second)):
        with pytest.raises(ValueError, match="already registered") as err:
            attempt()
        assert first.__qualname__ in str(err.value) and second.__qualname__ in str(err.value)
    assert getattr(reg.get("dup-test"), "_wrapped", reg.get("dup-test")) is first
    reg.register("dup-test", second, replace=True)
    assert reg.get("dup-test") is second
    with pytest.raises(ValueError, match="already registered"):  # built-ins are guarded too
        reg.register(reg.builtin_names()[0], second)


def test_the_ray_transport_registers_through_the_one_rule(fresh_registries):
    """install_registrations replaces (the driver's object is what the scenario means) and
    adapts what it installs like any registration (a protocol gets its name)."""
    from asyncsim.drivers.plugins import install_registrations

    class Mine(protocols.Async):
        pass

    protocols.register_protocol("ray-test")(protocols.Hardsync)
    install_registrations([("asyncsim.protocols", "ray-test", Mine)])
    assert protocols.get_protocol_class("ray-test") is Mine and Mine.name == "ray-test"


def _misbehaving():
    """Plug-ins (registered in Python) that break their contract, each used by a tiny
    scenario: ``(name, what to register, the scenario's changes, the key and the words of
    its one line, whether trace-only meets it)``."""
    from pathlib import Path

    from asyncsim.numerics.data import register_dataset  # noqa: F401  (kinds' doors)
    from asyncsim.numerics.models import get_model, register_model

    def floored(lr, staleness, mean_staleness, *, floor: float = 0.1):
        if not floor > 0:
            raise ValueError(f"floor: must be a positive number, got {floor!r}")
        return jnp.maximum(lr / jnp.maximum(staleness, 1.0), floor * lr)

    def branches(lr, staleness, mean_staleness):
        return lr if lr > 0 else 0.0 * lr  # Python control flow on a traced rate

    def three_rates(lr, staleness, mean_staleness):
        return jnp.ones((3,)) * lr

    class NoSuper(protocols.Protocol):
        def __init__(self, learners, *, k: int = 2):
            self.k = k

    class Empty(protocols.Async):
        def on_arrival(self, sim, grad):
            sim.apply_update([])

    class Short(delays.DelayModel):
        def sample(self, rng, learner, now):
            return 1.0

        def sample_block(self, rng, learner, size):
            return np.ones(size - 1)

    def from_table(*, path: Path):
        np.loadtxt(path)
        return get_model("linear", input_shape=[10], num_classes=0)

    rules = core.register_lr_rule
    return [
        ("rule refuses", lambda: rules("floored-t", floored),
         {"optimizer": {"lr_rule": {"name": "floored-t", "floor": -1.0}}},
         "optimizer.lr_rule.floor", "must be a positive number, got -1.0", True),
        ("rule not traceable", lambda: rules("branches-t", branches),
         {"optimizer": {"lr_rule": "branches-t"}},
         "optimizer.lr_rule", "learning-rate rule 'branches-t' cannot be traced", True),
        ("rule's shape", lambda: rules("three-t", three_rates),
         {"optimizer": {"lr_rule": "three-t"}},
         "optimizer.lr_rule", "returned (3,) for the rates of 4 gradients", True),
        ("protocol skips its base", lambda: protocols.register_protocol("nosuper-t")(NoSuper),
         {"protocol": {"kind": "nosuper-t"}},
         "protocol.kind", "must call super().__init__(learners)", True),
        ("protocol's empty update", lambda: protocols.register_protocol("empty-t")(Empty),
         {"protocol": {"kind": "empty-t"}},
         "protocol.kind", "applied an update without gradients", True),
        ("delay's short block", lambda: delays.register_delay("short-t")(Short),
         {"cluster": {"compute": {"dist": "short-t"}}},
         "cluster.compute", "sample_block returned shape (63,) for learner 0", True),
        ("model's missing file", lambda: register_model("table-t")(from_table),
         {"model": {"name": "table-t", "path": "missing.csv"}},
         "model", "missing.csv", True),
        ("model's input", lambda: None, {"model": {"name": "linear", "input_shape": [3]}},
         "model", "cannot take data set 'gaussian': its examples have shape (10,)", False),
        ("model's classes", lambda: None,
         {"model": {"name": "mlp", "hidden": [4]},
          "data": {"name": "synthetic-cifar", "num_classes": 12, "n_train": 64, "n_test": 32}},
         "model", "it has 12 classes, the model outputs 10", False),
    ]


@pytest.mark.parametrize("case", range(len(_misbehaving())),
                         ids=[c[0] for c in _misbehaving()])
def test_a_plugin_that_breaks_its_contract_stops_in_one_line(fresh_registries, tmp_path,
                                                             capsys, case):
    """Every kind's contract is checked where asyncsim meets the plug-in, before or as the
    run starts: one line naming the file and the key, no folder left behind, from `run`
    and (where the timing meets it) from `trace` alike."""
    from asyncsim._io import dump_toml

    _, register, changes, key, says, in_trace = _misbehaving()[case]
    register()
    raw = {"seed": 0, "cluster": {"learners": 2},
           "protocol": {"kind": "async"}, "optimizer": {"lr": 0.01},
           "model": {"name": "linear", "input_shape": [10], "num_classes": 0},
           "data": {"name": "gaussian", "n_train": 64, "n_test": 16, "batch_size": 4},
           "run": {"updates": 4, "eval_every": 0}}
    for k, v in changes.items():
        raw[k] = {**raw[k], **v} if k != "model" and k != "data" else v
    path = tmp_path / "s.toml"
    path.write_text(dump_toml(raw))
    verbs = ("run", "trace") if in_trace else ("run",)
    for verb in verbs:
        out = tmp_path / verb
        assert main([verb, str(path), "--out", str(out)]) == 2, verb
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"asyncsim: error: {path}: {key}: ") and says in err, err
        assert "\n" not in err and not out.exists(), verb
