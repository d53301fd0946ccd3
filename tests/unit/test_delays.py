"""Delay models, their registry and plug-ins, DelayStream, and the hypothesis strategies."""

from __future__ import annotations

import importlib.metadata
import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import load_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from asyncsim.config import ClusterConfig, ProtocolConfig, Scenario, from_dict, to_dict
from asyncsim.errors import ScenarioError
from asyncsim.testing import DELAY_DISTS, clusters, delay_specs, protocols, scenarios
from asyncsim.timing import delays
from asyncsim.timing.delays import DelayModel, DelayStream, make_delay, register_delay
from asyncsim.timing.protocols import make_protocol

SEED = 20160101

# One table of rules, one set of checks: every built-in with its analytic mean.
BUILTINS = {
    "constant": ({"dist": "constant", "value": 2.5}, 2.5),
    "uniform": ({"dist": "uniform", "low": 1.0, "high": 3.0}, 2.0),
    # mean = 1, std = 1: heavy truncation, so the rejection sampler's mean is checked too.
    "normal": ({"dist": "normal", "mean": 1.0, "std": 1.0}, 1.2875999709391783),
    "lognormal": ({"dist": "lognormal", "mean": 1.5, "cv": 0.5}, 1.5),
    "exponential": ({"dist": "exponential", "mean": 0.7}, 0.7),
    "gamma": ({"dist": "gamma", "mean": 2.0, "cv": 0.3}, 2.0),
    "shifted-exponential": ({"dist": "shifted-exponential", "shift": 1.0, "mean_excess": 0.5}, 1.5),
    "straggler": (
        {
            "dist": "straggler",
            "p": 0.1,
            "factor": 5.0,
            "base": {"dist": "lognormal", "mean": 1.0, "cv": 0.1},
        },
        1.4,
    ),
}
CASES = list(BUILTINS.values())
IDS = list(BUILTINS)


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / a.size
    cdf_b = np.searchsorted(b, grid, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


# ----------------------------------------------------------------------------- built-ins
def builtin_names(registry) -> set[str]:
    """The names asyncsim itself registers (not a test's or an installed plug-in's)."""
    return {n for n, v in registry.direct.items()
            if getattr(v, "__module__", "").startswith("asyncsim.")}


def test_every_builtin_delay_model_has_a_strategy_and_a_test_case():
    """The contract table is the registry: a new built-in delay model fails here until the
    hypothesis strategies (asyncsim.testing) and this file's cases cover it."""
    names = delays.available_delays()
    assert names == sorted(names)
    builtin = builtin_names(delays.base._registry)
    assert builtin - {"empirical"} == set(DELAY_DISTS) == set(BUILTINS)  # needs a file


def test_every_builtin_protocol_has_a_strategy():
    from asyncsim.testing import PROTOCOL_KINDS
    from asyncsim.timing import protocols

    assert builtin_names(protocols.base._registry) == set(PROTOCOL_KINDS)


@pytest.mark.parametrize("spec,mean", CASES, ids=IDS)
def test_builtin_mean_and_support(spec, mean):
    model = make_delay(spec)
    assert model.mean == pytest.approx(mean, rel=1e-12)
    x = model.sample_block(np.random.default_rng(SEED), 0, 200_000)
    assert x.shape == (200_000,) and x.dtype == np.float64
    assert np.all(np.isfinite(x)) and np.all(x >= 0)
    # Five standard errors: with the fixed seed this is deterministic, and still meaningful.
    tol = 5 * x.std() / math.sqrt(x.size) + 1e-12
    assert abs(x.mean() - mean) <= tol


@pytest.mark.parametrize("spec,mean", CASES, ids=IDS)
def test_sample_and_sample_block_agree_in_distribution(spec, mean):
    model = make_delay(spec)
    n = 20_000
    rng = np.random.default_rng(SEED)
    one_by_one = np.array([model.sample(rng, 3, 0.0) for _ in range(n)])
    block = model.sample_block(np.random.default_rng(SEED + 1), 3, n)
    assert all(isinstance(model.sample(rng, 0, 0.0), float) for _ in range(3))
    assert np.all(one_by_one >= 0)
    # KS critical value at alpha = 1e-3 is 1.95 * sqrt(2 / n); constant gives 0.
    assert _ks(one_by_one, block) < 1.95 * math.sqrt(2 / n)


@pytest.mark.parametrize("spec,mean", CASES, ids=IDS)
def test_same_seed_same_stream(spec, mean):
    model = make_delay(spec)
    a, b = np.random.default_rng(SEED), np.random.default_rng(SEED)
    np.testing.assert_array_equal(model.sample_block(a, 0, 100), model.sample_block(b, 0, 100))
    assert [model.sample(a, 0, 1.0) for _ in range(50)] == [
        model.sample(b, 0, 1.0) for _ in range(50)
    ]


def test_draws_use_only_the_given_generator():
    """No draw touches ``random`` or numpy's global state (docs/design.md, "Determinism")."""
    np_state, py_state = np.random.get_state(), random.getstate()  # noqa: NPY002
    for spec, _ in CASES:
        model = make_delay(spec)
        rng = np.random.default_rng(SEED)
        model.sample_block(rng, 0, 1000)
        [model.sample(rng, 0, 0.0) for _ in range(100)]
    after = np.random.get_state()  # noqa: NPY002
    assert all(np.array_equal(x, y) for x, y in zip(np_state, after, strict=True))
    assert random.getstate() == py_state


@pytest.mark.parametrize("spec,mean", CASES, ids=IDS)
def test_per_learner_streams_independent_of_other_learners(spec, mean):
    """Learner i's draws depend only on its own spawned Generator: adding learners or
    interleaving their draws differently leaves them unchanged."""
    model = make_delay(spec)

    def run(n_learners: int, order: list[int]) -> dict[int, list[float]]:
        children = np.random.SeedSequence(SEED).spawn(n_learners)
        streams = {
            i: DelayStream(model, np.random.default_rng(c), i, block=16)
            for i, c in enumerate(children)
        }
        out: dict[int, list[float]] = {i: [] for i in streams}
        for i in order:
            out[i].append(streams[i].next(0.0))
        return out

    base = run(4, [0, 1, 2, 3] * 40)
    more = run(31, [30, 3, 2, 1, 0, 5] * 40 + [0, 1, 2, 3] * 10)  # one learner more, reordered
    for i in range(4):
        assert more[i][:40] == base[i][:40]
    if spec["dist"] != "constant":
        assert base[0] != base[1]


def test_normal_truncation_by_rejection():
    # mean 0.5, std 1: 31% of raw draws are negative; clipping would put them at 0.
    model = make_delay({"dist": "normal", "mean": 0.5, "std": 1.0})
    x = model.sample_block(np.random.default_rng(SEED), 0, 100_000)
    assert x.min() > 0
    assert np.mean(x < 1e-3) < 0.002  # no point mass at zero


def test_gamma_cv_zero_and_lognormal_cv_zero_are_constant():
    for dist in ("gamma", "lognormal"):
        for cv in (0.0, 1e-200, 1e-120):  # tiny cv: 1/cv^2 would overflow
            model = make_delay({"dist": dist, "mean": 2.0, "cv": cv})
            x = model.sample_block(np.random.default_rng(0), 0, 10)
            np.testing.assert_allclose(x, 2.0, rtol=1e-12)
            assert model.sample(np.random.default_rng(0), 0, 0.0) == pytest.approx(2.0)


def test_straggler_builds_from_python_with_a_spec():
    m = delays.Straggler({"dist": "constant", "value": 1.0}, p=0.25, factor=3.0)
    x = m.sample_block(np.random.default_rng(SEED), 0, 40_000)
    assert set(np.unique(x)) == {1.0, 3.0}
    assert np.mean(x == 3.0) == pytest.approx(0.25, abs=0.01)


# ----------------------------------------------------------------------------- empirical
def test_empirical_from_csv_relative_to_base_dir(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "times.csv").write_text("step,seconds\n1,0.5\n2,1.5\n3,\n4,4.0\n")
    model = make_delay(
        {"dist": "empirical", "path": "sub/times.csv", "column": "seconds"}, base_dir=tmp_path
    )
    assert model.mean == pytest.approx(2.0)
    x = model.sample_block(np.random.default_rng(SEED), 0, 30_000)
    assert set(np.unique(x)) == {0.5, 1.5, 4.0}
    assert np.mean(x == 4.0) == pytest.approx(1 / 3, abs=0.02)  # uniform resampling
    assert {model.sample(np.random.default_rng(i), 0, 0.0) for i in range(50)} <= {0.5, 1.5, 4.0}


def test_empirical_single_column_needs_no_column(tmp_path):
    (tmp_path / "t.csv").write_text("seconds\n1.0\n3.0\n")
    assert make_delay({"dist": "empirical", "path": str(tmp_path / "t.csv")}).mean == 2.0


# ----------------------------------------------------------------------------- errors
def _csv(tmp_path: Path, text: str) -> str:
    (tmp_path / "d.csv").write_text(text)
    return str(tmp_path / "d.csv")


# (spec, key, words the message must contain); key prefix is "cluster.compute".
INVALID = [
    ("fast", "cluster.compute", ["must be a table"]),
    ({"mean": 1.0}, "cluster.compute.dist", ["missing", "lognormal", "constant"]),
    ({"dist": 3}, "cluster.compute.dist", ["must be a string", "lognormal"]),
    ({"dist": "gama"}, "cluster.compute.dist", ["unknown delay model 'gama'", "gamma", "normal"]),
    ({"dist": "lognormal", "mean": 1.0}, "cluster.compute.cv", ["missing", "mean, cv"]),
    (
        {"dist": "lognormal", "mean": 1.0, "cv": 0.1, "sigma": 1},
        "cluster.compute.sigma",
        ["unknown option for delay model 'lognormal'; allowed: dist, mean, cv"],
    ),
    ({"dist": "exponential", "mean": "1s"}, "cluster.compute.mean", ["finite number", "'1s'"]),
    ({"dist": "exponential", "mean": True}, "cluster.compute.mean", ["finite number"]),
    ({"dist": "exponential", "mean": math.nan}, "cluster.compute.mean", ["finite number", "nan"]),
    ({"dist": "constant", "value": math.inf}, "cluster.compute.value", ["finite number"]),
    ({"dist": "exponential", "mean": -1}, "cluster.compute.mean", ["positive number", "-1.0"]),
    ({"dist": "constant", "value": -0.5}, "cluster.compute.value", [">= 0", "-0.5"]),
    ({"dist": "uniform", "low": 2, "high": 1}, "cluster.compute.high", [">= low"]),
    ({"dist": "uniform", "low": -1, "high": 1}, "cluster.compute.low", [">= 0"]),
    ({"dist": "normal", "mean": 1, "std": -1}, "cluster.compute.std", [">= 0"]),
    ({"dist": "normal", "mean": 0, "std": 1}, "cluster.compute.mean", ["positive"]),
    ({"dist": "lognormal", "mean": 1, "cv": -0.1}, "cluster.compute.cv", ["[0, 100]"]),
    ({"dist": "gamma", "mean": 1, "cv": -1}, "cluster.compute.cv", ["[0, 100]"]),
    ({"dist": "gamma", "mean": 1, "cv": 1e200}, "cluster.compute.cv", ["[0, 100]"]),
    (
        {"dist": "shifted-exponential", "shift": -1, "mean_excess": 1},
        "cluster.compute.shift",
        [">= 0"],
    ),
    (
        {"dist": "shifted-exponential", "shift": 1, "mean_excess": 0},
        "cluster.compute.mean_excess",
        ["positive"],
    ),
    (
        {"dist": "straggler", "base": {"dist": "constant", "value": 1}, "p": 1.5, "factor": 2},
        "cluster.compute.p",
        ["[0, 1]"],
    ),
    (
        {"dist": "straggler", "base": {"dist": "constant", "value": 1}, "p": 0.1, "factor": 0.5},
        "cluster.compute.factor",
        [">= 1"],
    ),
    (
        {"dist": "straggler", "base": {"dist": "exponential", "mean": -2}, "p": 0.1, "factor": 2},
        "cluster.compute.base.mean",
        ["positive"],
    ),
    (
        {"dist": "straggler", "base": 1.0, "p": 0.1, "factor": 2},
        "cluster.compute.base",
        ["delay-model table"],
    ),
    (
        {"dist": "straggler", "base": {"dist": "nope"}, "p": 0.1, "factor": 2},
        "cluster.compute.base.dist",
        ["unknown delay model", "constant"],
    ),
    ({"dist": "empirical", "path": "missing.csv"}, "cluster.compute.path", ["cannot read"]),
    ({"dist": "empirical", "path": 3}, "cluster.compute.path", ["file path"]),
]


@pytest.mark.parametrize(
    "spec,key,words", INVALID, ids=[i[1] + str(n) for n, i in enumerate(INVALID)]
)
def test_make_delay_errors_name_key_and_allowed(spec, key, words, tmp_path):
    with pytest.raises(ScenarioError) as err:
        make_delay(spec, key="cluster.compute", base_dir=tmp_path)
    assert err.value.key == key
    for w in words:
        assert w in err.value.message
    assert str(err.value).startswith(f"<scenario>: {key}: ")


@pytest.mark.parametrize(
    "text,column,key,word",
    [
        ("a,b\n1,2\n", "c", "cluster.compute[3].column", "allowed: a, b"),
        ("a,b\n1,2\n", None, "cluster.compute[3].column", "columns: a, b"),
        ("a\n1\nx\n", "a", "cluster.compute[3].column", "line 3"),
        ("a\n1\n-2\n", "a", "cluster.compute[3].column", ">= 0"),
        ("a\n1\nnan\n", "a", "cluster.compute[3].column", "finite"),
        ("a\n\n", "a", "cluster.compute[3].column", "no values"),
    ],
)
def test_empirical_errors(tmp_path, text, column, key, word):
    spec = {"dist": "empirical", "path": _csv(tmp_path, text)}
    if column is not None:
        spec["column"] = column
    with pytest.raises(ScenarioError) as err:
        make_delay(spec, key="cluster.compute[3]")
    assert err.value.key == key and word in err.value.message


def test_empty_key_prefix():
    with pytest.raises(ScenarioError) as err:
        make_delay({"dist": "exponential", "mean": 0})
    assert err.value.key == "mean"


def test_make_delay_passes_models_through():
    m = delays.Exponential(mean=1.0)
    assert make_delay(m) is m


# ----------------------------------------------------------------------------- DelayStream
@pytest.mark.parametrize("spec,mean", CASES, ids=IDS)
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_stream_equals_block_loop(spec, mean, scale):
    model = make_delay(spec)
    block = 200
    stream = DelayStream(model, np.random.default_rng(SEED), 2, scale=scale, block=block)
    got = [stream.next(float(t)) for t in range(64 + 128 + 3 * block + 5)]
    rng = np.random.default_rng(SEED)
    want = np.concatenate(
        [scale * model.sample_block(rng, 2, n) for n in (64, 128, block, block, block, block)]
    )
    assert got == want[: len(got)].tolist()
    assert all(type(x) is float for x in got)


def test_stream_small_block():
    model = make_delay({"dist": "exponential", "mean": 1.0})
    stream = DelayStream(model, np.random.default_rng(SEED), 0, block=3)
    rng = np.random.default_rng(SEED)
    want = np.concatenate([model.sample_block(rng, 0, 3) for _ in range(4)])
    assert [stream.next(0.0) for _ in range(11)] == want[:11].tolist()


class Ramp(DelayModel):
    """Time-dependent test model: duration grows with the simulated time."""

    time_dependent = True

    def __init__(self, slope: float = 0.1) -> None:
        self.slope = slope

    def sample(self, rng, learner, now):
        return (1.0 + self.slope * now) * rng.exponential()


def test_stream_time_dependent_calls_sample_with_now():
    model = Ramp(0.5)
    stream = DelayStream(model, np.random.default_rng(SEED), 1, scale=2.0)
    times = [0.0, 1.0, 10.0, 100.0, 100.0]
    got = [stream.next(t) for t in times]
    rng = np.random.default_rng(SEED)
    assert got == [2.0 * model.sample(rng, 1, t) for t in times]


class Broken(DelayModel):
    def __init__(self, value: float = -1.0) -> None:
        self.value = value

    def sample(self, rng, learner, now):
        return self.value


@pytest.mark.parametrize("td", [False, True])
@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_stream_rejects_bad_durations(td, value):
    model = Broken(value)
    model.time_dependent = td
    with pytest.raises(ValueError, match="finite and >= 0"):
        DelayStream(model, np.random.default_rng(0), 5, block=4).next(0.0)


@pytest.mark.parametrize("kw", [{"scale": 0.0}, {"scale": math.inf}, {"block": 0}])
def test_stream_rejects_bad_arguments(kw):
    with pytest.raises(ValueError):
        DelayStream(delays.Constant(1.0), np.random.default_rng(0), 0, **kw)


# ----------------------------------------------------------------------------- registry
def test_registered_user_class_gets_the_same_checks(fresh_registries):
    @register_delay("ramp-test")
    class UserRamp(Ramp):
        def __init__(self, slope: float, floor: float = 0.0) -> None:
            if slope < 0:
                raise ValueError(f"slope: must be >= 0, got {slope!r}")
            self.slope, self.floor = slope, floor

    assert "ramp-test" in delays.available_delays()
    m = make_delay({"dist": "ramp-test", "slope": 1}, key="k")
    assert isinstance(m, UserRamp) and m.slope == 1.0 and isinstance(m.slope, float)
    assert m.time_dependent and m.mean is None
    for spec, key, word in [
        ({"dist": "ramp-test"}, "k.slope", "missing"),
        ({"dist": "ramp-test", "slope": 1, "x": 1}, "k.x", "allowed: dist, slope, floor"),
        ({"dist": "ramp-test", "slope": "steep"}, "k.slope", "finite number"),
        ({"dist": "ramp-test", "slope": -1}, "k.slope", "must be >= 0"),
    ]:
        with pytest.raises(ScenarioError) as err:
            make_delay(spec, key="k")
        assert err.value.key == key and word in err.value.message


def test_duck_typed_class_is_wrapped_and_mean_settable(fresh_registries):
    class Plain:
        def __init__(self, mean: float) -> None:
            self.mean = mean

        def sample(self, rng, learner, now):
            return rng.exponential(self.mean)

    assert register_delay("plain-test")(Plain) is Plain
    m = make_delay({"dist": "plain-test", "mean": 2})
    assert isinstance(m, DelayModel) and not m.time_dependent and m.mean == 2.0
    assert m.sample_block(np.random.default_rng(0), 0, 5).shape == (5,)

    class Sub(DelayModel):  # ``self.mean = ...`` on a DelayModel subclass must work too
        def __init__(self, mean: float) -> None:
            self.mean = mean

    assert Sub(3.0).mean == 3.0


def test_register_conflicts(fresh_registries):
    with pytest.raises(ValueError, match="already registered"):
        register_delay("lognormal")(Ramp)
    with pytest.raises(ValueError):
        register_delay("has space")
    with pytest.raises(TypeError):
        register_delay("no-sample")(object)
    register_delay("ramp2")(Ramp)
    register_delay("ramp2")(Ramp)  # same class again (a reloaded module): fine


# ----------------------------------------------------------------------------- entry points
def test_entry_point_plugin(installed_plugin):
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="asyncsim.delays")}
    assert eps["weibull-test"].value == "asyncsim_plugin_example:Weibull"
    assert eps["weibull-test"].dist.name == "asyncsim-plugin-example"
    assert {"weibull-test", "diurnal-test"} <= set(delays.available_delays())

    m = make_delay({"dist": "weibull-test", "shape": 2, "scale": 3}, key="cluster.compute")
    # Loaded through the entry point from the installed copy, not from the source folder.
    assert Path(sys.modules[type(m).__module__].__file__).parent == installed_plugin
    assert m.mean == pytest.approx(3 * math.gamma(1.5))
    x = DelayStream(m, np.random.default_rng(SEED), 0).next(0.0)
    assert x >= 0
    with pytest.raises(ScenarioError) as err:
        make_delay({"dist": "weibull-test", "shape": -2}, key="cluster.compute")
    assert err.value.key == "cluster.compute.shape"
    with pytest.raises(ScenarioError) as err:
        make_delay({"dist": "weibull-test", "shap": 2}, key="cluster.compute")
    assert "allowed: dist, shape, scale" in err.value.message

    # A duck-typed, time-dependent plug-in is wrapped; its checks still name the key.
    d = make_delay({"dist": "diurnal-test", "base": 1.0, "period": 10.0})
    assert isinstance(d, DelayModel) and d.time_dependent
    # Hand-checked: load 1 + 0.5 sin(2 pi t / 10) is 1 at t = 0 and 1.5 at t = 2.5.
    s = DelayStream(d, np.random.default_rng(SEED), 0)
    e = np.random.default_rng(SEED).exponential(size=2)
    assert [s.next(t) for t in (0.0, 2.5)] == pytest.approx([e[0], 1.5 * e[1]], rel=1e-12)
    with pytest.raises(ScenarioError) as err:
        make_delay({"dist": "diurnal-test", "base": 1.0, "amplitude": 2.0}, key="x")
    assert err.value.key == "x.amplitude"


def test_direct_registration_wins_over_entry_point(installed_plugin, fresh_registries):
    register_delay("weibull-test")(Ramp)
    assert isinstance(make_delay({"dist": "weibull-test"}), Ramp)


# ----------------------------------------------------------------------------- strategies
@settings(max_examples=150, deadline=None)
@given(delay_specs())
def test_generated_delay_specs_make_sane_models(spec):
    model = make_delay(spec, key="spec")
    x = model.sample_block(np.random.default_rng(0), 0, 64)
    assert np.all(np.isfinite(x)) and np.all(x >= 0)
    d = model.sample(np.random.default_rng(1), 0, 0.0)
    assert math.isfinite(d) and d >= 0
    # max_mean bounds the untruncated mean; truncation at 0 adds at most 0.288 std <= 0.288 mean.
    assert model.mean is not None and 0 < model.mean <= 10.0 * 1.2876


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(max_learners=16))
def test_generated_clusters_are_valid(c):
    assert isinstance(c, ClusterConfig) and 1 <= c.learners <= 16
    specs = c.compute if isinstance(c.compute, tuple) else (c.compute,)
    assert len(specs) in (1, c.learners)
    for s in (*specs, c.network.pull.latency, c.network.push.latency):
        make_delay(s)
    assert c.speed is None or (len(c.speed) == c.learners and min(c.speed) > 0)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), protocols(n))))
def test_generated_protocols_fit_the_cluster(args):
    n, p = args
    assert isinstance(p, ProtocolConfig)
    make_protocol(p, n)  # every draw builds: its options fit the signature and the cluster
    if p.kind == "softsync":
        assert 1 <= p.options["n"] <= n
    if p.kind == "fixed-delay":
        assert p.options["tau"] + 1 == n and 0 <= p.options["tau"] <= 16
    if p.kind == "ssp":
        assert 0 <= p.options["s"] <= 5
    if p.kind in ("async", "hardsync"):
        assert p.options == {}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(max_learners=24, max_updates=50))
def test_generated_scenarios_are_valid(scn):
    assert isinstance(scn, Scenario)
    assert scn.run.trace_only and 1 <= scn.run.updates <= 50
    assert from_dict(Scenario, to_dict(scn)) == scn  # survives a TOML round trip
    c = scn.cluster
    if scn.protocol.kind == "fixed-delay":
        assert c.learners == scn.protocol.options["tau"] + 1
    if scn.protocol.kind == "softsync":
        assert scn.protocol.options["n"] <= c.learners
    if scn.protocol.kind == "hardsync":  # the gradient budget that keeps runs fast
        assert scn.run.updates * c.learners <= max(2000, c.learners)
    specs = c.compute if isinstance(c.compute, tuple) else (c.compute,)
    for i, s in enumerate(specs):
        make_delay(s, key=f"cluster.compute[{i}]")


@settings(max_examples=30, deadline=None)
@given(scenarios(kinds=["fixed-delay"], min_learners=3))
def test_fixed_delay_scenarios(scn):
    assert scn.protocol.kind == "fixed-delay"
    assert 3 <= scn.cluster.learners == scn.protocol.options["tau"] + 1 <= 17


def test_strategy_argument_errors():
    from hypothesis.errors import InvalidArgument

    for bad in (
        lambda: delay_specs(dists=["empirical"]),
        lambda: delay_specs(max_mean=0),
        lambda: clusters(min_learners=5, max_learners=2),
        lambda: protocols(30, kinds=["fixed-delay"]),
        lambda: scenarios(kinds=["fixed-delay"], min_learners=18),
        lambda: scenarios(kinds=["paxos"]),
    ):
        with pytest.raises(InvalidArgument):
            bad()


class _Scaled(DelayModel):
    """A plug-in delay model with a required and an optional float: scale × (1 + jitter)."""

    def __init__(self, scale: float, jitter: float = 0.0):
        if jitter > 0.5:
            raise ValueError("jitter: must be at most 0.5")
        self.scale, self.jitter = scale, jitter

    def sample(self, rng, learner, now):
        return self.scale * (1.0 + self.jitter * rng.random())

    @property
    def mean(self):
        return self.scale * (1.0 + self.jitter / 2)


class _FromFile(DelayModel):
    """A plug-in whose required parameter is a file: it declares its own strategy."""

    def __init__(self, path: Path, factor: float = 1.0):
        self.factor = factor

    @classmethod
    def spec_strategy(cls, max_mean):
        return st.fixed_dictionaries({"path": st.just(__file__),
                                      "factor": st.floats(0.5, 2.0)})

    def sample(self, rng, learner, now):
        return self.factor


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_delay_specs_cover_plug_in_models(fresh_registries, data):
    """`delay_specs` draws specs of a user's delay model too, derived from its signature (or
    from its own `spec_strategy`), each one accepted by make_delay and within max_mean; a
    required parameter no strategy can be derived for is a clear error."""
    from asyncsim.testing import plugin_specs

    register_delay("scaled-test")(_Scaled)
    register_delay("from-file-test")(_FromFile)
    spec = data.draw(delay_specs(dists=["scaled-test", "from-file-test", "constant"],
                                 max_mean=2.0))
    model = make_delay(spec)
    if spec["dist"] == "scaled-test":
        assert 1e-3 <= spec["scale"] <= 2.0 and model.mean <= 2.0
        assert set(spec) <= {"dist", "scale", "jitter"}
    elif spec["dist"] == "from-file-test":
        assert spec["path"] == __file__ and 0.5 <= spec["factor"] <= 2.0
    for _ in range(3):
        assert make_delay(data.draw(plugin_specs("scaled-test", 1.0))).mean <= 1.0

    class _NeedsText(DelayModel):
        def __init__(self, label: str):
            pass

        def sample(self, rng, learner, now):
            return 1.0

    register_delay("needs-text-test")(_NeedsText)
    with pytest.raises(InvalidArgument, match="no strategy for its required parameter 'label'"):
        data.draw(delay_specs(dists=["needs-text-test"]))


class _Weibull(DelayModel):
    """docs/plugins.md's example: its mean overflows math.gamma at a small shape."""

    def __init__(self, shape: float, scale: float = 1.0):
        self.shape, self.scale = shape, scale

    @classmethod
    def spec_strategy(cls, max_mean):
        return st.sampled_from([{"shape": 1e-3}, {"shape": 1.5, "scale": 2.0}])

    def sample(self, rng, learner, now):
        return self.scale * float(rng.weibull(self.shape))

    @property
    def mean(self):
        return self.scale * math.gamma(1.0 + 1.0 / self.shape)


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mean_too_large_to_compute_is_not_drawn(fresh_registries, data):
    """A plug-in whose `mean` overflows (math.gamma(1001) at shape 1e-3) is drawn only where
    the mean is computable and within max_mean, not raised out of the strategy."""
    from asyncsim.testing import plugin_specs

    register_delay("weibull-doc-test")(_Weibull)
    spec = data.draw(plugin_specs("weibull-doc-test", 5.0))
    assert spec == {"dist": "weibull-doc-test", "shape": 1.5, "scale": 2.0}


def _plugin_example():
    """The example plug-in package's module (tests/plugin_pkg), loaded from its file: its
    protocol registered in Python here, not through its entry point."""
    path = Path(__file__).resolve().parents[1] / "plugin_pkg" / "asyncsim_plugin_example.py"
    return load_file(path, "_asyncsim_plugin_example")


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_scenarios_and_clusters_take_plug_in_names(fresh_registries, data):
    """`scenarios(dists=[<plug-in>])`, `clusters(dists=...)` and `scenarios(kinds=[...])`
    take what `delay_specs` takes (plug-ins, installed or registered), and every scenario
    drawn loads and simulates; a plug-in protocol's options are derived from its
    signature and fit the cluster."""
    from asyncsim.api import simulate
    from asyncsim.scenario import load_scenario
    from asyncsim.timing import protocols as protocol_registry

    register_delay("scaled-test")(_Scaled)
    protocol_registry.register_protocol("every-k-strategy-test")(_plugin_example().EveryK)
    scn = data.draw(scenarios(dists=["scaled-test"], kinds=["every-k-strategy-test"],
                              max_learners=6, max_updates=10))
    specs = scn.cluster.compute if isinstance(scn.cluster.compute, tuple) else (
        scn.cluster.compute,)
    assert {s["dist"] for s in specs} == {"scaled-test"}
    assert scn.protocol.kind == "every-k-strategy-test"
    assert set(scn.protocol.options) <= {"k"}
    k = scn.protocol.options.get("k", 2)
    trace = simulate(load_scenario(to_dict(scn)))
    assert np.all(trace.updates["n_grads"] == k)
    c = data.draw(clusters(dists=["scaled-test"], max_learners=4))
    specs = c.compute if isinstance(c.compute, tuple) else (c.compute,)
    assert {s["dist"] for s in specs} == {"scaled-test"}


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_the_availability_switch(data):
    for flag in (True, False):
        c = data.draw(clusters(max_learners=4, availability=flag))
        assert (c.availability is not None) == flag
        scn = data.draw(scenarios(kinds=["async", "softsync"], max_learners=4,
                                  max_updates=5, availability=flag))
        assert (scn.cluster.availability is not None) == flag


def test_building_a_cluster_scans_no_entry_points(monkeypatch):
    """A built-in delay name is found in the registry as it is: the installed packages'
    entry points (milliseconds a scan, with Ray installed) are read only for a name that is
    not registered, or to list the allowed names in an error; not once per learner's spec
    (a lambda = 1000 cluster builds 2,000 of them)."""
    from asyncsim.api import simulate
    from asyncsim.scenario import load_scenario

    scans = []
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda *a, **k: scans.append(k) or real(*a, **k))
    scn = load_scenario({"cluster": {"learners": 50, "compute": {"dist": "exponential",
                                                                  "mean": 1.0}},
                         "protocol": {"kind": "async"}, "run": {"gradients": 200}})
    assert simulate(scn).num_gradients == 200
    assert scans == []
    # The names are still listed where a spec lacks its dist.
    with pytest.raises(ScenarioError, match="cluster.compute.dist: missing; allowed: .*"
                                            "exponential"):
        make_delay({"mean": 1.0}, key="cluster.compute")
