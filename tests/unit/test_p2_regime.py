"""P2's official regime in scenarios: the nominal eta_tau, the train error behind P2's
generalization gap, the official "normal" schedule, and paper profiles that swap the model
or the data set without inheriting the options of the one they replace.

The update loop itself is checked against a transcription of the official code in
tests/unit/test_p2_parity.py; the core's arithmetic in tests/unit/test_core.py.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY, merged

import asyncsim
from asyncsim.drivers.build import numerics_for
from asyncsim.scenario import load_scenario

FIXED4 = {**TINY, "protocol": {"kind": "fixed-delay", "tau": 4}, "cluster": {},
          "run": {"updates": 24, "eval_every": 0}}


def test_nominal_eta_tau_is_constant_from_the_first_update():
    """P2's official regimes set eta_tau by hand: with lr_staleness = "nominal" every
    gradient, the first tau (staleness 0..3) included, takes eta0 sin(pi/18): the run equals
    a constant-rule run at that rate (to float32 rounding of the rate), and differs from the
    per-gradient rule, whose first four updates take larger rates. 8 updates: staleness
    0, 1, 2, 3, 4, 4, 4, 4, mean 2.75, so the rate at the mean staleness tells them apart."""
    eta0 = 0.05
    short = merged(FIXED4, run={"updates": 8})
    nominal = asyncsim.run(load_scenario(merged(short, optimizer={
        "lr": eta0, "lr_rule": "stability-edge", "lr_staleness": "nominal"})))
    eta4 = eta0 * math.sin(math.pi / 18)
    by_hand = asyncsim.run(load_scenario(merged(short, optimizer={"lr": eta4})))
    actual = asyncsim.run(load_scenario(merged(short, optimizer={
        "lr": eta0, "lr_rule": "stability-edge"})))
    for a, b in zip(jnp.asarray(nominal.params["fc"]["w"]).ravel(),
                    jnp.asarray(by_hand.params["fc"]["w"]).ravel(), strict=True):
        assert float(a) == pytest.approx(float(b), rel=1e-5, abs=1e-7)
    assert actual.trace.staleness.tolist() == [0, 1, 2, 3, 4, 4, 4, 4]
    assert nominal.summary["lr_at_mean_tau"] == pytest.approx(eta4)
    assert actual.summary["lr_at_mean_tau"] == pytest.approx(eta0 * math.sin(math.pi / 14))
    worst = max(abs(float(a) - float(b)) for a, b in zip(
        jnp.asarray(actual.params["fc"]["w"]).ravel(),
        jnp.asarray(nominal.params["fc"]["w"]).ravel(), strict=True))
    assert worst > 1e-4  # the first updates' larger rates moved the weights


def test_eval_train_is_the_error_on_the_whole_train_set():
    """run.eval_train: summary.json's final_train_error is the fraction of the train set
    (labels as trained on, noise included) the final parameters misclassify."""
    scn = load_scenario(merged(TINY, run={"eval_train": True}))
    res = asyncsim.run(scn)
    num = numerics_for(scn)
    logits = np.asarray(num.model.apply(res.params, num.x_train))
    wrong = float(np.mean(np.argmax(logits, axis=1) != np.asarray(num.y_train)))
    assert res.summary["final_train_error"] == pytest.approx(wrong, abs=1e-6)
    assert 0 < wrong < 0.9  # a real, partly trained network: not all right, not all wrong
    assert "final_train_error" not in asyncsim.run(load_scenario(TINY)).summary


def test_the_official_normal_schedule_favours_the_stalest():
    """Phi((s - loc)/scale): a worker that has waited longer is more likely to be drawn, so
    the staleness concentrates near W - 1 (P2's trainer.py; std 3.3 at W = 16, where random's
    geometric staleness has 15.5 and round robin none). loc far above every staleness
    (every Phi below 1e-300) always draws the stalest worker: round robin's staleness; a huge
    scale flattens the weights to the random schedule's."""
    def staleness(**protocol):
        return asyncsim.simulate(load_scenario(merged(
            FIXED4, protocol={"tau": 15, **protocol}, run={"updates": 6000}))).staleness[500:]

    s, r = staleness(schedule="normal"), staleness(schedule="random")
    assert abs(s.mean() - 15) < 0.5 and abs(r.mean() - 15) < 1.5  # mean W - 1 for both
    assert 2.0 < s.std() < 5.0 and r.std() > 12.0
    assert np.mean(s < 5) < 0.02 < np.mean(r < 5)
    assert (staleness(schedule="normal", loc=1000.0, scale=1.0) == 15).all()
    assert staleness(schedule="normal", scale=1e6).std() > 12.0
    trace = asyncsim.simulate(load_scenario(merged(FIXED4, protocol={"schedule": "normal"})))
    assert trace.meta["timing_revision"] == "normal=phi-draw"


def test_a_trace_or_checkpoint_of_the_old_normal_schedule_is_not_reused(tmp_path):
    """Before asyncsim 0.3 "normal" was the racing model: a sweep's points and shared trace
    without the mark are run again, and a checkpoint without it is refused in one line."""
    import json

    from asyncsim._io import dump_toml
    from asyncsim.cli import main
    from asyncsim.trace import Trace

    raw = merged(FIXED4, protocol={"schedule": "normal"},
                run={"updates": 30, "checkpoint_every": 10})
    path = tmp_path / "s.toml"
    path.write_text(dump_toml({**raw, "sweep": {"optimizer.lr": [0.01, 0.02]}}))
    out = tmp_path / "sw"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    shared = next(out.glob("trace_g*"))
    for folder in (shared, out / "p000", out / "p001"):
        meta = json.loads((folder / "trace_meta.json").read_text())
        del meta["timing_revision"]  # as the racing model's traces were saved
        (folder / "trace_meta.json").write_text(json.dumps(meta))
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    for folder in (shared, out / "p000", out / "p001"):
        assert Trace.load(folder).meta["timing_revision"] == "normal=phi-draw"
    # A checkpoint made before the mark existed is refused; one with it resumes.
    from asyncsim.drivers.checkpoint import check_checkpoint, save_checkpoint
    from asyncsim.drivers.folder_scenario import folder_scenario
    from asyncsim.drivers.metrics import Recorder

    scn = load_scenario(raw)
    num = numerics_for(scn)
    record = folder_scenario(scn)[0]
    save_checkpoint(tmp_path, 0, num.init_state(), {}, Recorder(), {"scenario": record})
    with pytest.raises(ValueError, match="before asyncsim 0.3 it was the racing model"):
        check_checkpoint(tmp_path, scn)
    save_checkpoint(tmp_path, 0, num.init_state(), {}, Recorder(),
                    {"scenario": record, "timing_revision": "normal=phi-draw"})
    assert check_checkpoint(tmp_path, scn) == record
    # A checkpoint of the new normal schedule under a protocol without a schedule (made for
    # another scenario) is refused in one line too, under protocol.kind.
    soft = load_scenario({**raw, "protocol": {"kind": "softsync", "n": 1}})
    with pytest.raises(ValueError, match="protocol.kind: .*made under another timing model; "
                                         "pass --force"):
        check_checkpoint(tmp_path, soft)


def test_a_profile_that_renames_the_model_or_data_set_drops_their_options():
    """P2-F1's paper profile swaps the MLP and the 4,096-image synthetic set for ResNet-44
    and CIFAR10: it must train on all of CIFAR10, not on 4,096 images of it."""
    paper = load_scenario("scenarios/p2_f1.toml", profile="paper")
    assert paper.data.name == "cifar10" and "n_train" not in paper.data.options
    assert paper.data.batch_size == 128
    assert paper.model.name == "resnet44" and dict(paper.model.options) == {"norm": "batch"}
    f4 = load_scenario("scenarios/p2_f4.toml", profile="paper")
    assert "hidden" not in f4.model.options and "input_pool" not in f4.model.options
    # Same name: the profile's keys are laid over the file's, options kept.
    smoke = load_scenario("scenarios/p2_f4.toml", profile="smoke")
    assert smoke.model.options["hidden"] == [16] and smoke.model.options["input_pool"] == 4
    # The same model named only by the profile (the file takes the default, mlp) keeps them.
    same = load_scenario({"model": {"hidden": [8]}, "profiles": {"paper": {"model": {
        "name": "mlp", "activation": "tanh"}}}}, profile="paper")
    assert dict(same.model.options) == {"hidden": [8], "activation": "tanh"}


@pytest.mark.parametrize("name", ["p2_f1", "p2_f4"])
def test_the_p2_paper_profiles_use_the_official_regime(name):
    """torch-style SGD with momentum 0.9 at eta0 = 0.1, weight decay 1e-4 on weights only,
    x0.1 at epochs 81/122/164 (x3 for the long regime), eta_tau from the nominal delay."""
    scn = load_scenario(f"scenarios/{name}.toml", profile="paper")
    o = scn.optimizer
    assert (o.lr, o.momentum.style, o.momentum.beta) == (0.1, "torch", 0.9)
    assert (o.weight_decay, o.weight_decay_scope, o.lr_staleness) == (1e-4, "weights",
                                                                      "nominal")
    assert tuple(o.schedule.decay_epochs) == (81, 122, 164) and o.schedule.decay_factor == 0.1
    from asyncsim.scenario import apply_point, sweep_points

    points = [apply_point(scn, p) for p in sweep_points(scn)]
    assert {p.protocol.options["tau"] for p in points} == {0, 4, 8, 16, 32}
    assert {p.optimizer.lr_rule for p in points} == {"constant", "stability-edge"}
    if name == "p2_f1":
        assert {p.optimizer.momentum.kind for p in points} == {"none", "heavy-ball", "shifted"}
        regimes = {(p.optimizer.lr_rule, p.run.epochs, tuple(p.optimizer.schedule.decay_epochs))
                   for p in points}
        assert regimes == {("constant", 200, (81, 122, 164)),
                           ("stability-edge", 600, (243, 366, 492))}


def test_torch_style_runs_through_every_executor(tmp_path):
    """The torch style's state (buffers started or not, per learner for shifted) goes
    through replay (bit for bit), the compiled scan, the vmapped sweep and a checkpoint."""
    from asyncsim.cli import main
    from asyncsim.drivers.scan import replay_scan
    from asyncsim.results import read_summary

    raw = merged(TINY, optimizer={"lr": 0.02, "momentum": {
        "kind": "shifted", "beta": 0.9, "style": "torch", "dampening": 0.5}},
        run={"updates": 40, "eval_every": 0, "checkpoint_every": 10})
    scn = load_scenario(raw)
    online = asyncsim.run(scn)
    assert asyncsim.replay(scn, online.trace).summary["param_hash"] == online.summary[
        "param_hash"]
    scan = replay_scan(scn, online.trace)
    np.testing.assert_allclose(np.asarray(scan.params["fc"]["w"]),
                               np.asarray(online.params["fc"]["w"]), rtol=1e-5, atol=1e-7)
    # A sweep over lr through the vmapped path agrees with the exact points.
    from asyncsim._io import dump_toml

    path = tmp_path / "s.toml"
    path.write_text(dump_toml({**raw, "sweep": {"optimizer.lr": [0.01, 0.02]}}))
    for sweep_path in ("exact", "vmapped"):
        assert main(["run", str(path), "--out", str(tmp_path / sweep_path), "--quiet",
                     "--set", f"run.sweep_path={sweep_path}"]) == 0
    for p in ("p000", "p001"):
        exact = np.load(tmp_path / "exact" / p / "params.npz")
        vm = np.load(tmp_path / "vmapped" / p / "params.npz")
        for k in exact.files:  # float32 rounding over 40 updates of weights up to ~0.3
            np.testing.assert_allclose(vm[k], exact[k], rtol=1e-5, atol=1e-6)
    assert read_summary(tmp_path / "exact" / "p001")["param_hash"] == online.summary[
        "param_hash"]
    # The checkpoint keeps which buffers have started (learners 0..2 here, all of them).
    from asyncsim.drivers.checkpoint import load_checkpoint, save_checkpoint
    from asyncsim.drivers.metrics import Recorder

    num = numerics_for(scn)
    state = num.init_state()
    for v in range(3):
        state, _ = num.update(state, {0: num.init_params()}, v, [(v, 0, 0, v)])
    assert np.asarray(state.started).tolist() == [True, True, True]
    rec = Recorder()
    rec.losses = [np.zeros(1, np.float32)] * 3  # one entry per update, as a run records
    save_checkpoint(tmp_path, 3, state, {}, rec, {})
    _, back, _, _, _ = load_checkpoint(tmp_path, num.init_state(), num.init_params())
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(state),
                    strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
