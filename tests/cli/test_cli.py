"""The CLI: invalid input exits 2 with one line naming file, key and what is allowed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tomllib

import pytest

from asyncsim.cli import main

GOOD = """
name = "ok"
seed = 1
[cluster]
learners = 4
compute = { dist = "exponential", mean = 1.0 }
[protocol]
kind = "softsync"
n = 2
[run]
updates = 50
"""

# GOOD with P2's fixed delay (tau + 1 = 4 workers, its learners).
FIXED = GOOD.replace('kind = "softsync"\nn = 2', 'kind = "fixed-delay"\ntau = 3')


def write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("text,key,allowed", [
    ("bogus = 1\n" + GOOD, "bogus", "allowed here: name"),
    (GOOD + "\nbogus = 1\n", "run.bogus", "allowed here: updates"),
    (GOOD.replace("learners = 4", "learners = \"four\""), "cluster.learners", "an integer"),
    (GOOD.replace("n = 2", "n = 12"), "protocol.n", "1..4"),
    (GOOD.replace("mean = 1.0", "mean = -1.0"), "cluster.compute.mean", "positive"),
    (GOOD + "\n[optimizer]\nlr = nan\n", "optimizer.lr", "NaN"),
    (GOOD.replace('"exponential"', '"gama"'), "cluster.compute.dist", "allowed: "),
    (GOOD.replace('"softsync"', '"sofsync"'), "protocol.kind", "allowed: async"),
    (GOOD.replace("updates = 50", "updates = -5"), "run.updates", "positive"),
    (GOOD.replace("seed = 1", "seed = -1"), "seed", "0..4294967295"),
    (GOOD.replace("learners = 4", "learners = 4\nseed = 4294967296"), "cluster.seed",
     "0..4294967295"),  # JAX keys keep 32 bits: it would collide with seed 0
    (GOOD + "\n[cluster.network.push]\nbandwidth = 0.0\n", "cluster.network.push.bandwidth",
     "positive"),
    (GOOD.replace("[run]", "[run]\ngradients = 4"), "run.", "one run length"),
    (GOOD + "\n[model]\nname = \"mlp\"\nwidth = 3\n", "model.width", "allowed: name"),
    (GOOD.replace('kind = "softsync"\nn = 2', 'kind = "fixed-delay"\ntau = 2'),
     "cluster.learners", "tau + 1 = 3"),
    (GOOD.replace('kind = "softsync"\nn = 2', 'kind = "ssp"'), "protocol.s", "'ssp' requires: s"),
    (GOOD + "\n[profiles.fast.run]\nupdates = 3\n", "profiles.fast", "smoke, default, paper"),
    (GOOD + "\n[measure]\nsharpness_points = -1\n", "measure.sharpness_points",
     "an integer >= 0"),
    (GOOD + "\n[model]\nname = \"quadratic\"\neigenvalues = [1.0]\n[measure]\nedges = true\n",
     "measure.edges", "needs protocol.kind = \"fixed-delay\""),
    # issue 20's keys: PyTorch's SGD, P2's official schedule, the nominal eta_tau
    (GOOD + '\n[optimizer]\nmomentum = { kind = "heavy-ball", style = "pytorch" }\n',
     "optimizer.momentum.style", "allowed: caffe, torch"),
    (GOOD + '\n[optimizer]\nmomentum = { kind = "dampened", dampening = 0.5 }\n',
     "optimizer.momentum.dampening", "shorthand for dampening = beta"),
    (GOOD + '\n[optimizer]\nmomentum = { kind = "nesterov", dampening = 0.5 }\n',
     "optimizer.momentum.dampening", "no dampening"),
    (GOOD + '\n[optimizer]\nmomentum = { kind = "heavy-ball", dampening = 1.0 }\n',
     "optimizer.momentum.dampening", "[0, 1)"),
    (GOOD + '\n[optimizer]\nweight_decay_scope = "matrices"\n',
     "optimizer.weight_decay_scope", "allowed: all, weights"),
    (GOOD + '\n[optimizer]\nlr_staleness = "nominal"\n', "optimizer.lr_staleness",
     "'softsync' has none"),
    (FIXED.replace("tau = 3", 'tau = 3\nschedule = "normal"\ncv = 0.3'), "protocol.cv",
     "\"race\" schedule only"),
    (FIXED.replace("tau = 3", 'tau = 3\nschedule = "random"\nloc = 2.0'), "protocol.loc",
     "\"normal\" schedule only"),
    (FIXED.replace("tau = 3", 'tau = 3\nschedule = "normal"\nscale = 0.0'), "protocol.scale",
     "finite number > 0"),
    # a TOML date, even in the free-form [figure] table: a run folder could not record it
    (GOOD + "\n[figure]\nwhen = [1979-05-27]\n", "figure.when",
     "is a TOML date or time (1979-05-27); allowed: numbers, strings, booleans"),
])
def test_invalid_scenarios_exit_2_with_one_line(tmp_path, capsys, text, key, allowed):
    path = write(tmp_path, text)
    out = tmp_path / "run"
    code = main(["trace", str(path), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert str(path) in err and key in err and allowed in err, err
    assert "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("verb", ["trace", "run"])
def test_a_misspelt_key_is_reported_before_jax_is_imported(tmp_path, verb):
    # The error a scenario author meets most: it should not wait for JAX and pandas to load.
    path = write(tmp_path, GOOD + "\nbogus = 1\n")
    code = ("import sys; from asyncsim.cli import main; "
            f"rc = main([{verb!r}, {str(path)!r}, '--out', {str(tmp_path / 'o')!r}]); "
            "print(rc, 'jax' in sys.modules, 'pandas' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.split() == ["2", "False", "False"], (r.stdout, r.stderr)
    assert "run.bogus" in r.stderr


@pytest.mark.parametrize("text,key,hint", [
    (GOOD.replace("[run]", "[run]\nupdate = 5\n#"), "run.update", "'updates'"),
    (GOOD.replace('"softsync"', '"soft_sync"'), "protocol.kind", "'softsync'"),
    (GOOD.replace('"exponential"', '"Exponential"'), "cluster.compute.dist", "'exponential'"),
    (GOOD + '\n[optimizer]\nlr_rule = "inverse_staleness"\n', "optimizer.lr_rule",
     "'inverse-staleness'"),
    (GOOD + '\n[optimizer]\nmomentum = { kind = "heavyball" }\n',
     "optimizer.momentum.kind", "'heavy-ball'"),
    (GOOD + '\n[model]\nname = "mlp"\nhiden = [8]\n', "model.hiden", "'hidden'"),
    (GOOD + '\n[model]\nname = "cifar10_full"\n', "model.name", "'cifar10-full'"),
])
def test_misspelt_names_get_a_suggestion(tmp_path, capsys, text, key, hint):
    path = write(tmp_path, text)
    assert main(["trace", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert key in err and f"(did you mean {hint}?)" in err, err


def test_did_you_mean_prefers_a_unique_prefix_and_stays_quiet_when_nothing_is_close():
    from asyncsim.errors import did_you_mean

    figures = ["p1_beyond", "p1_f3_lr_modulation", "p2_f3", "quickstart"]
    assert did_you_mean("p1-f3", figures) == " (did you mean 'p1_f3_lr_modulation'?)"
    assert did_you_mean("zzz", figures) == ""
    assert did_you_mean("p2_f3", figures) == ""  # an allowed name needs no hint
    assert did_you_mean(3, figures) == ""


@pytest.mark.parametrize("verb", ["trace", "run"])
def test_a_delay_whose_draws_overflow_is_a_one_line_error_and_leaves_no_folder(
        tmp_path, capsys, verb):
    # A valid mean, but exponential draws of mean 1e308 overflow to inf at the first sample.
    path = write(tmp_path, GOOD.replace("mean = 1.0", "mean = 1e308")
                 + '\n[model]\nname = "mlp"\nhidden = [4]\n[data]\nbatch_size = 4\n'
                 'n_train = 64\nn_test = 16\n')
    out = tmp_path / "out"
    assert main([verb, str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: cluster.compute: delay model Exponential returned inf" in err, err
    assert not out.exists()


@pytest.mark.parametrize("verb", ["trace", "run"])
def test_a_model_option_the_factory_refuses_leaves_no_folder(tmp_path, capsys, verb):
    # Option names are checked on load; values by the model's factory, when it is built
    # (for `trace`, only when a finite bandwidth needs the model's size).
    path = write(tmp_path, GOOD + '\n[cluster.network.push]\nbandwidth = 1e9\n'
                 '[model]\nname = "mlp"\nhidden = [-1]\n[data]\nbatch_size = 4\n'
                 'n_train = 64\nn_test = 16\n')
    out = tmp_path / "out"
    assert main([verb, str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and (
        f"{path}: model.hidden: must be a list of positive integers, got [-1]" in err), err
    assert not out.exists()


def test_a_plugin_delay_that_turns_nan_mid_run_names_its_key_and_keeps_the_checkpoints(
        tmp_path, capsys, fresh_registries):
    from asyncsim.timing import delays

    class SpoilsAfter5(delays.DelayModel):  # a user's model with a bug that shows at t > 5
        time_dependent = True

        def sample(self, rng, learner, now):
            return math.nan if now > 5.0 else 0.01

    delays.register_delay("spoils-test")(SpoilsAfter5)
    path = write(tmp_path, GOOD.replace("updates = 50", "updates = 50\ncheckpoint_every = 2")
                 + '\n[cluster.network.push]\nlatency = { dist = "spoils-test" }\n'
                 '[model]\nname = "mlp"\nhidden = [4]\n[data]\nbatch_size = 4\n'
                 'n_train = 64\nn_test = 16\n')
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{path}: cluster.network.push.latency: delay model SpoilsAfter5 returned nan" in err
    # Updates before the bad draw were checkpointed: the folder is kept, unfinished.
    assert out.is_dir() and not (out / "summary.json").exists()
    assert set(p.name for p in out.iterdir()) - {"scenario.toml", "provenance.json"}


def test_scenario_errors_survive_being_rebuilt_from_their_args_and_pickled():
    # SimPy re-raises a process's exception as type(e)(*e.args); Ray pickles it.
    import pickle

    from asyncsim.errors import ScenarioError

    e = ScenarioError("protocol.n", "too big", file="x.toml")
    for again in (type(e)(*e.args), pickle.loads(pickle.dumps(e))):
        assert str(again) == str(e) == "x.toml: protocol.n: too big"
        assert (again.key, again.message, again.file) == ("protocol.n", "too big", "x.toml")
    assert str(ScenarioError("", "no key")) == "<scenario>: no key"


def test_unreadable_files(tmp_path, capsys):
    assert main(["trace", str(tmp_path / "missing.toml")]) == 2
    assert "missing.toml: no such file" in capsys.readouterr().err
    bad = write(tmp_path, "name = [unclosed\n")
    assert main(["trace", str(bad)]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    binary = tmp_path / "b.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["trace", str(binary)]) == 2
    assert "b.toml" in capsys.readouterr().err


def test_console_script_exit_status_and_single_line(tmp_path):
    path = write(tmp_path, GOOD.replace("n = 2", "n = 0"))
    r = subprocess.run([sys.executable, "-m", "asyncsim.cli", "trace", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "protocol.n" in r.stderr and "1..4" in r.stderr


def test_the_console_exit_keeps_status_output_and_files(tmp_path):
    # `asyncsim` ends with os._exit after its exit handlers (asyncsim.cli.console): what it
    # printed into a pipe, its exit status and the run folder must all be there.
    path = write(tmp_path, GOOD)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "asyncsim.cli", "trace", str(path), "--out",
                        str(out), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    summary = json.loads((out / "summary.json").read_text())
    r = subprocess.run([sys.executable, "-m", "asyncsim.cli", "trace", str(path), "--out",
                        str(tmp_path / "again")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].split() == ["trace_hash", summary["trace_hash"]]
    # An exit that did not come from a verb's return (argparse) keeps its own status.
    r = subprocess.run([sys.executable, "-m", "asyncsim.cli", "--version"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip(), r
    r = subprocess.run([sys.executable, "-m", "asyncsim.cli", "trace", "--bogus"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "required: scenario" in r.stderr


def test_the_command_tunes_the_garbage_collector_and_main_leaves_it(tmp_path):
    # The `asyncsim` process collects reference cycles less often than CPython's default
    # (asyncsim._process: 0.12 s of a warm smoke quickstart); an in-process caller of main()
    # keeps its own settings.
    import gc

    from asyncsim._process import GC_THRESHOLDS

    assert GC_THRESHOLDS != (700, 10, 10)
    code = ("import gc, asyncsim.cli as c; c.main = lambda: print(*gc.get_threshold()) or 0; "
            "c.console()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tuple(int(v) for v in r.stdout.split()) == GC_THRESHOLDS
    before = gc.get_threshold()
    assert main(["trace", str(write(tmp_path, GOOD)), "--out", str(tmp_path / "r"),
                 "--quiet"]) == 0
    assert gc.get_threshold() == before


def test_trace_writes_the_run_folder(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    out = tmp_path / "run"
    assert main(["trace", str(path), "--out", str(out), "--set", "protocol.n=4",
                 "--seed", "5"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for k in ("gradients", "updates", "sim_time", "staleness_mean", "staleness_max",
              "staleness_p99", "trace_hash"):
        assert k in summary
    assert summary["updates"] == 50 and summary["gradients"] == 50
    resolved = tomllib.loads((out / "scenario.toml").read_text())
    assert resolved["protocol"]["n"] == 4 and resolved["seed"] == 5
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["seed"] == 5 and "versions" in prov and "git_revision" in prov
    # A complete folder is not overwritten silently.
    assert main(["trace", str(path), "--out", str(out)]) == 2
    assert "already holds a complete run" in capsys.readouterr().err
    # The same scenario and seed give the same trace hash.
    out2 = tmp_path / "run2"
    assert main(["trace", str(path), "--out", str(out2), "--set", "protocol.n=4",
                 "--seed", "5", "--quiet"]) == 0
    assert json.loads((out2 / "summary.json").read_text())["trace_hash"] == summary["trace_hash"]


def test_override_errors_name_the_key(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    assert main(["trace", str(path), "--set", "protocol.q=3"]) == 2
    assert ("protocol.q: unknown option for protocol 'softsync'; allowed: kind, n"
            in capsys.readouterr().err)
    # Named by the --set, not by the file (which holds no such line).
    assert main(["trace", str(path), "--set", "novalue"]) == 2
    assert ("asyncsim: error: --set: novalue: an override must look like KEY=VALUE"
            in capsys.readouterr().err)
    assert main(["trace", str(path), "--set", "=3"]) == 2
    assert "--set: =3: an override must look like KEY=VALUE" in capsys.readouterr().err
    assert main(["trace", str(path), "--seed", "-1"]) == 2
    assert ("asyncsim: error: --seed -1: seed: must be an integer in 0..4294967295, got -1"
            in capsys.readouterr().err)
    assert main(["trace", str(path), "--set", "sweep.seed=x"]) == 2
    assert "sweep.seed: must be a list, got 'x'" in capsys.readouterr().err


def test_set_adds_a_sweep_grid_whose_key_has_dots():
    from asyncsim.scenario import load_scenario
    from asyncsim.sweep import plan

    for item in ("sweep.protocol.n=[1, 2]", 'sweep."protocol.n"=[1, 2]'):
        scn = load_scenario(tomllib.loads(GOOD), overrides=[item, "sweep.seed=[3]"])
        assert dict(scn.sweep) == {"protocol.n": (1, 2), "seed": (3,)}
        assert [(it["scenario"].protocol.options["n"], it["scenario"].seed)
                for it in plan(scn)] == [(1, 3), (2, 3)]


def test_trace_sweep_and_figure(tmp_path, capsys):
    from pathlib import Path

    scn = Path(__file__).resolve().parents[2] / "scenarios" / "p1_f1_staleness.toml"
    out = tmp_path / "f1"
    assert main(["run", str(scn), "--profile", "smoke", "--out", str(out), "--quiet"]) == 0
    assert (out / "index.csv").exists()
    assert (out / "figures" / "p1_f1_staleness.png").exists()
    assert (out / "figures" / "p1_f1_staleness.csv").exists()
    # Figures redraw from existing runs only.
    assert main(["figures", "p1_f1_staleness", "--runs", str(tmp_path / "nothing")]) == 2
    assert "run `asyncsim run scenarios/p1_f1_staleness.toml` first" in capsys.readouterr().err
    # Another profile's runs: the command that makes them names the profile.
    assert main(["figures", "p1_f1_staleness", "--runs", str(tmp_path / "nothing"),
                 "--profile", "paper"]) == 2
    assert ("run `asyncsim run scenarios/p1_f1_staleness.toml --profile paper` first"
            in capsys.readouterr().err)
    assert main(["figures", "p1_f1_stalenes"]) == 2  # a typo is not a missing run
    assert ("unknown figure 'p1_f1_stalenes'; figures: churn_staleness, p1_beyond, "
            "p1_f1_staleness") in (
        capsys.readouterr().err)


TINY_RUN = GOOD.replace("updates = 50", "updates = 6") + """
[model]
name = "mlp"
hidden = [8]
[data]
name = "synthetic-cifar"
batch_size = 4
n_train = 64
n_test = 32
"""


def test_an_unfinished_folder_says_how_to_go_on_for_what_wrote_it(tmp_path, capsys):
    from asyncsim import runs

    path = write(tmp_path, TINY_RUN)
    folders = {}
    for kind, argv in (("trace", ["trace", str(path)]), ("run", ["run", str(path)])):
        out = folders[kind] = tmp_path / kind
        assert main([*argv, "--out", str(out), "--quiet"]) == 0
        (out / "summary.json").unlink()  # as a run killed before its end leaves it
    assert main(["replay", str(folders["run"]), "--out", str(tmp_path / "rep"), "--quiet"]) == 0
    (tmp_path / "rep" / "summary.json").unlink()
    capsys.readouterr()
    # A timing-only trace has no gradients to resume: redo it (not an online run in its place).
    assert main(["trace", str(path), "--out", str(folders["trace"])]) == 2
    assert "holds an unfinished timing-only trace; a trace is quick to redo: pass --force" in \
        capsys.readouterr().err
    assert main(["run", "--resume", str(folders["trace"])]) == 2
    assert "an unfinished timing-only trace; a trace is quick to redo" in capsys.readouterr().err
    # An online run resumes with `run`, not `real`; a replay is redone by `replay --force`.
    assert main(["run", str(path), "--out", str(folders["run"])]) == 2
    assert (f"holds an unfinished simulated run; continue it with asyncsim run --resume "
            f"{folders['run']}, or pass --force") in capsys.readouterr().err
    with pytest.raises(runs.RunFolderError, match="continue it with asyncsim run --resume"):
        runs.resume_folder(folders["run"], driver="real")
    assert main(["replay", str(folders["run"]), "--out", str(tmp_path / "rep")]) == 2
    assert "holds an unfinished replay; a replay has no checkpoints: rerun asyncsim replay " \
        "with --force" in capsys.readouterr().err
    assert main(["trace", str(path), "--out", str(folders["trace"]), "--force", "--quiet"]) == 0


def test_replay_says_how_it_compares_with_the_source_run(tmp_path, capsys):
    """`asyncsim replay` checks its result against the run it replayed: the loop path is
    bit-identical, the scan path agrees to tolerance, --set changes the numerics, and an
    unfinished source has nothing to compare."""
    src = tmp_path / "run"
    assert main(["run", str(write(tmp_path, TINY_RUN)), "--out", str(src), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", str(src)]) == 2
    assert "the run is complete; nothing to resume" in capsys.readouterr().err
    for cmd in ("run", "real"):
        assert main([cmd, "--resume", str(tmp_path / "nowhere")]) == 2
        assert "nowhere: no such run folder to resume" in capsys.readouterr().err

    def replay(*extra):
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        assert main(["replay", str(src), "--out", str(out), *extra]) == 0
        return capsys.readouterr().out.strip().splitlines()[-1], json.loads(
            (out / "summary.json").read_text())

    source_hash = json.loads((src / "summary.json").read_text())["param_hash"]
    line, s = replay()
    assert line.startswith("same param_hash as the source run")
    assert s["matches_source"] and s["max_abs_diff_to_source"] == 0.0
    assert s["source_param_hash"] == source_hash

    line, s = replay("--path", "scan")
    assert s["source_param_hash"] == source_hash and s["max_abs_diff_to_source"] < 1e-5
    if not s["matches_source"]:
        assert "--path loop reproduces the hash" in line

    line, s = replay("--set", "optimizer.lr=0.5")
    assert not s["matches_source"] and s["max_abs_diff_to_source"] > 1e-4
    assert line.endswith("(--set changed the numerics)")

    line, s = replay("--set", "optimizer.lr=1e4")  # diverges: no finite distance to report
    assert s["diverged"] and s["max_abs_diff_to_source"] is None
    assert "(the replay diverged: see diverged_at)" in line

    # The trace fixes the timing: a replay refuses to change it, and writes nothing.
    for item in ("protocol.n=1", "cluster.learners=2", "run.updates=5"):
        out = tmp_path / "refused"
        assert main(["replay", str(src), "--out", str(out), "--set", item]) == 2
        err = capsys.readouterr().err.strip()
        assert f"{item.split('=')[0]}: is timing, which the recorded trace fixes" in err, err
        assert f"asyncsim run {src / 'scenario.toml'} --set {item}" in err
        assert not out.exists()
    # Compared on the resolved scenario, so a whole-table override is caught too.
    assert main(["replay", str(src), "--out", str(out), "--set", "run={updates=5}"]) == 2
    assert "run.updates: is timing" in capsys.readouterr().err and not out.exists()
    assert main(["replay", str(src), "--out", str(out), "--set", "sweep.seed=[1,2]"]) == 2
    assert "sweep: a replay re-executes one run's trace" in capsys.readouterr().err
    assert not out.exists()

    (src / "summary.json").unlink()  # as a killed run leaves it
    line, s = replay()
    assert "did not finish" in line and s["source_param_hash"] is None

    trace_only = tmp_path / "trace"
    assert main(["trace", str(write(tmp_path, TINY_RUN)), "--out", str(trace_only),
                 "--quiet"]) == 0
    capsys.readouterr()
    src = trace_only
    line, s = replay()
    assert "timing-only trace" in line and s["matches_source"] is None


def test_replay_scan_of_uneven_updates_is_refused_in_one_line(tmp_path, capsys,
                                                              fresh_registries):
    from asyncsim.timing import protocols

    class OneThenTwo(protocols.Protocol):  # updates of 1, 2, 1, 2, ... gradients
        def __init__(self, learners):
            super().__init__(learners)
            self.buffer, self.take = [], 1

        def updates_per_gradient(self):
            return 2 / 3

        def on_arrival(self, sim, grad):
            self.buffer.append(grad)
            if len(self.buffer) == self.take:
                batch, self.buffer, self.take = self.buffer, [], 3 - self.take
                sim.apply_update(batch)

    protocols.register_protocol("one-then-two-test")(OneThenTwo)
    path = write(tmp_path, GOOD.replace('kind = "softsync"\nn = 2', 'kind = "one-then-two-test"')
                 .replace("updates = 50", "updates = 6")
                 + '\n[model]\nname = "mlp"\nhidden = [4]\n[data]\nbatch_size = 4\n'
                 'n_train = 64\nn_test = 16\n')
    src = tmp_path / "src"
    assert main(["run", str(path), "--out", str(src), "--quiet"]) == 0
    from asyncsim.trace import Trace

    assert Trace.load(src).uniform_n_grads is None
    assert main(["replay", str(src), "--path", "scan", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--path: scan needs the same number of gradients in " \
        "every update; this trace's updates take 1 to 2: use --path loop (or auto)" in err, err
    assert not (src / "replay").exists()
    assert main(["replay", str(src), "--path", "auto", "--quiet"]) == 0
    assert json.loads((src / "replay" / "summary.json").read_text())["matches_source"]


def test_commands_on_what_is_not_a_run_folder_say_so_in_one_line(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    (sweep / "p000").mkdir(parents=True)
    (sweep / "index.csv").write_text("point\n")
    (sweep / "p000" / "scenario.toml").write_text(GOOD)
    for f in ("trace_grads.parquet", "trace_updates.parquet", "trace_meta.json"):
        (sweep / "p000" / f).write_text("")  # only their presence matters to the check
    (sweep / "p001").mkdir()
    (sweep / "p001" / "scenario.toml").write_text(GOOD)
    cases = [(tmp_path / "nowhere", "no such run folder"),
             (sweep, f"a sweep folder; use one of its points (e.g. {sweep / 'p000'})"),
             (sweep / "p001", "missing trace_grads.parquet")]
    for folder, says in cases:
        for argv in (["replay", str(folder)], ["calibrate", str(folder)],
                     ["compare", str(folder), str(sweep / "p000")]):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and says in err, (argv, err)


def test_python_dash_m_asyncsim_is_the_command(tmp_path):
    path = write(tmp_path, GOOD)
    for module in ("asyncsim", "asyncsim.cli"):
        r = subprocess.run([sys.executable, "-m", module, "trace", str(path), "--out",
                            str(tmp_path / module), "--quiet"], capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert (tmp_path / module / "summary.json").is_file()


def test_compare_cuts_its_table_and_a_closed_pipe_is_no_traceback(tmp_path, capsys):
    """`asyncsim compare A B | head`: the reader may go away; and the staleness table stops
    at --rows (20 by default) with a line saying how many rows it left out."""
    import os

    path = write(tmp_path, GOOD.replace('kind = "softsync"\nn = 2', 'kind = "async"')
                 .replace("learners = 4", "learners = 40").replace("updates = 50",
                                                                   "updates = 2000"))
    a = tmp_path / "a"
    assert main(["trace", str(path), "--out", str(a), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(a)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ln for ln in lines if ln.split() and ln.split()[0].isdigit()]
    assert len(rows) == 20 and lines[-1].startswith("  ... ") and "(--rows 0 prints" in lines[-1]
    assert main(["compare", str(a), str(a), "--rows", "0"]) == 0
    assert not any(ln.startswith("  ... ") for ln in capsys.readouterr().out.splitlines())
    # A count below 0 is refused, not taken for 0 (all rows).
    for bad in ("-5", "x"):
        with pytest.raises(SystemExit) as e:
            main(["compare", str(a), str(a), "--rows", bad])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert f"argument --rows: must be a whole number >= 0, got '{bad}'" in err
    # A pipe whose reader has gone: every write fails (EPIPE).
    read, write_end = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "asyncsim", "compare", str(a), str(a)],
                           stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert r.returncode == 141 and r.stderr == "", r.stderr


def test_a_broken_pipe_other_than_stdout_is_not_swallowed(monkeypatch, capsys):
    """Exit 141 without a word is for a reader of our output that has gone; a broken pipe
    elsewhere (a worker's, a subprocess's) is a failure and keeps its traceback."""
    import asyncsim.cli.commands as commands

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(commands, "cmd_show", broken)
    with pytest.raises(BrokenPipeError):
        main(["show", "anywhere"])


def test_a_broken_pipe_elsewhere_with_a_live_reader_keeps_its_traceback(tmp_path):
    """Standard output a pipe whose reader is still there: a BrokenPipeError from elsewhere
    is a failure (exit 1, traceback), not the quiet exit of `asyncsim compare | head`."""
    script = tmp_path / "broken.py"
    script.write_text(
        "import sys\n"
        "import asyncsim.cli.commands as commands\n"
        "from asyncsim.cli import main\n"
        "def broken(args):\n"
        "    raise BrokenPipeError(32, 'Broken pipe')\n"
        "commands.cmd_show = broken\n"
        "sys.exit(main(['show', 'anywhere']))\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "BrokenPipeError" in r.stderr, (r.returncode, r.stderr)
