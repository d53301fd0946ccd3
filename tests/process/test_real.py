"""Real (Ray) runs: trace invariants, exact replay, learner/PS faults, calibration, sweeps.

One local Ray instance (2 CPUs) and one set of learner/PS actors serve the whole module, so
each actor process starts and compiles the tiny model's gradient once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

ray = pytest.importorskip("ray")

from asyncsim import runs  # noqa: E402
from asyncsim.api import (  # noqa: E402
    replay,
    replay_folder,
    trace_run,  # noqa: E402
)
from asyncsim.calibrate import calibrate, compare  # noqa: E402
from asyncsim.drivers.real import (  # noqa: E402
    RealCluster,
    RealRunError,
    ensure_ray,
    ray_executor,
    real_run,
    shutdown_ray,
    watchdog,
)
from asyncsim.drivers.real.run import numerics_env  # noqa: E402
from asyncsim.machine import thread_counts  # noqa: E402
from asyncsim.numerics import core  # noqa: E402
from asyncsim.results import SUMMARY_FIELDS, RunFolder, read_summary  # noqa: E402
from asyncsim.scenario import load_scenario  # noqa: E402
from asyncsim.sweep import run_sweep  # noqa: E402
from asyncsim.testing import check_trace  # noqa: E402
from asyncsim.timing.delays import DelayModel, register_delay  # noqa: E402
from asyncsim.trace import Trace  # noqa: E402

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[2]



@pytest.fixture(scope="session")
def tiny(tiny):
    """This module's tiny scenarios (named so that their folders say real)."""
    return tiny.with_defaults(name="tiny-real")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    import os

    # A restarted learner loads its compiled gradient from this cache instead of compiling.
    # Set only while Ray and the actors start (they keep it), not for the rest of the session.
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("xla")),
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    saved = {k: os.environ.get(k) for k in cache}
    os.environ.update({k: v for k, v in cache.items() if saved[k] is None})
    try:
        started = not ray.is_initialized()
        if started:
            ensure_ray(num_cpus=2)  # the library's own start (local Ray, no dashboard)
        c = RealCluster(3)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
    yield c
    c.close()
    if started:
        shutdown_ray()


@pytest.fixture(scope="module")
def async_run(cluster, tmp_path_factory, tiny):
    out = tmp_path_factory.mktemp("real") / "async"
    scn = tiny()
    summary = real_run(scn, out=out, cluster=cluster)
    return scn, out, summary


def _applied(trace):
    return list(zip(trace.grads["learner"].tolist(), trace.grads["batch"].tolist(),
                    strict=True))


def test_real_async_run_trace_and_folder(async_run):
    scn, out, s = async_run
    trace = Trace.load(out)
    check_trace(trace, scn)
    assert trace.num_updates == 30 and s["updates"] == 30
    assert not s["diverged"] and np.isfinite(s["final_test_error"])
    for f in ("scenario.toml", "trace_grads.parquet", "trace_updates.parquet",
              "trace_meta.json", "eval.csv", "updates.parquet", "summary.json",
              "provenance.json", "params.npz", "restarts.csv"):
        assert (out / f).exists(), f
    assert not (out / "checkpoint.npz").exists()
    saved = read_summary(out)
    assert saved["kind"] == "real" and saved["trace_hash"] == trace.hash()
    # Every field of a real run's summary is one the run-folder reader checks, and passes.
    assert set(saved) <= set(SUMMARY_FIELDS) and RunFolder(out).summary["restarts"] == 0
    assert set(trace.grads["learner"].tolist()) == {0, 1, 2}
    assert (trace.grads["t_start"] >= trace.grads["t_pull"]).all()
    assert s["updates_per_s"] > 0


def test_the_timeline_of_a_real_run(async_run, tmp_path):
    # A real trace records when each learner started computing: pull and compute apart.
    from asyncsim.timeline import intervals, utilisation

    _, out, _ = async_run
    iv = intervals(Trace.load(out))
    assert {"pull", "compute", "push"} <= set(iv["kind"])
    use = utilisation(iv)
    assert np.allclose(use.drop(columns="learner").sum(axis=1), 1.0)


def test_replay_of_real_run_is_bit_identical(async_run, tmp_path):
    _, out, s = async_run
    res = replay_folder(out, out=tmp_path / "replay")
    assert res.summary["param_hash"] == s["param_hash"]
    assert res.summary["trace_hash"] == s["trace_hash"]


def test_real_cifar10_full_replays_bit_for_bit(cluster, tmp_path):
    """The PS applies each update with the update program online runs and replays use
    (Numerics.apply_given): P1's network replays bit for bit, not only a tiny MLP (a
    separately compiled apply had differed by 3e-8 here)."""
    scn = load_scenario(REPO / "scenarios" / "quickstart.toml", profile="smoke",
                        overrides=["cluster.learners=2", 'protocol={kind="async"}',
                                   "run={updates=12, eval_every=0}"])
    s = real_run(scn, out=tmp_path / "real", cluster=cluster)
    res = replay_folder(tmp_path / "real", out=tmp_path / "replay")
    assert res.summary["param_hash"] == s["param_hash"] and res.summary["matches_source"]


@pytest.mark.parametrize("optimizer", [
    {"lr": 0.05, "compensation": {"kind": "dc-asgd-a"}},
    {"lr": 0.01, "transform": {"name": "adam"}, "lr_rule": {"name": "polynomial", "a": 0.5},
     "compensation": {"kind": "gap-aware"}},
], ids=["dc-asgd-a", "adam-polynomial-gap-aware"])
def test_real_runs_with_remedies_replay_bit_for_bit(cluster, tmp_path, tiny, optimizer):
    # The real PS keeps the versions it served (compensation reads them) and steps the
    # transform through the same update program as online and replay.
    scn = tiny(optimizer=optimizer, protocol={"kind": "softsync", "n": 1},
               run={"updates": 12, "eval_every": 0})
    s = real_run(scn, out=tmp_path / "real", cluster=cluster)
    trace = Trace.load(tmp_path / "real")
    assert trace.grads["staleness"].max() > 0  # something to compensate
    res = replay_folder(tmp_path / "real", out=tmp_path / "replay")
    assert res.summary["param_hash"] == s["param_hash"] and res.summary["matches_source"]
    # The versions the PS kept for compensation, reported like a replay's version store:
    # at least two (a gradient was stale), at most one per gradient that can be out at once
    # (one computing per learner, c - 1 = lam - 1 waiting in the 1-softsync buffer). Not the
    # trace's largest staleness + 1: a gradient still out when the run stops was served (its
    # version kept) but is never applied, so the trace has no staleness for it (a CI run held
    # 3 versions with a largest staleness of 1).
    lam = scn.cluster.learners
    assert 1 < s["ps_versions_held"] <= lam + (lam - 1)
    assert s["ps_version_bytes"] == s["ps_versions_held"] * 4 * 49_338  # mlp [16]


def test_a_diverging_real_run_stops_where_its_replay_stops(cluster, tmp_path, tiny):
    """The one Driver on Ray too: the PS stops at the diverged update (rolled back if it
    was found late), and the replay of its trace stops there."""
    s = real_run(tiny(optimizer={"lr": 3.0}, run={"updates": 60, "eval_every": 20}),
                 out=tmp_path / "real", cluster=cluster)
    assert s["diverged"] and s["updates"] == s["diverged_at"] + 1
    assert s["stop_reason"] == "diverged"
    res = replay_folder(tmp_path / "real", out=tmp_path / "replay")
    for k in ("diverged_at", "updates", "stop_reason", "param_hash"):
        assert res.summary[k] == s[k], k


def test_real_softsync_hardsync_ssp(cluster, tmp_path, tiny):
    for proto in ({"kind": "softsync", "n": 1}, {"kind": "hardsync"}, {"kind": "ssp", "s": 0}):
        scn = tiny(protocol=proto, run={"updates": 6, "eval_every": 0})
        out = tmp_path / proto["kind"]
        s = real_run(scn, out=out, cluster=cluster)
        trace = Trace.load(out)
        check_trace(trace, scn)
        c = 1 if proto["kind"] == "ssp" else 3
        assert trace.num_updates == 6 and trace.num_gradients == 6 * c
        assert replay_folder(out, out=tmp_path / f"r-{proto['kind']}").summary[
            "param_hash"] == s["param_hash"]


def test_fixed_delay_is_rejected(cluster, tmp_path, tiny):
    from asyncsim.errors import ScenarioError

    with pytest.raises(ScenarioError, match="protocol.kind"):
        real_run(tiny(protocol={"kind": "fixed-delay", "tau": 2}, cluster={"learners": 3}),
                 out=tmp_path / "fd", cluster=cluster)


def test_killed_learner_hardsync_goes_on_with_live_learners(cluster, tmp_path, tiny):
    # hardsync waits for live learners only: the round learner 1 dies in (2), and the next
    # ones until Ray has restarted it, complete with the others' gradients; it rejoins at a
    # round start (a fresh pull of the current version: staleness 0).
    from asyncsim.testing import TraceInvariantError

    scn = tiny(protocol={"kind": "hardsync"}, run={"updates": 8, "eval_every": 0})
    out = tmp_path / "kill"
    s = real_run(scn, out=out, cluster=cluster, faults={"kill_learner": [1, 2]})
    trace = Trace.load(out)
    check_trace(trace, scn)  # staleness 0, distinct learners per update, program order
    n = trace.updates["n_grads"]
    assert trace.num_updates == 8 == s["updates"]
    assert trace.updates["version"].tolist() == list(range(8))  # none lost or duplicated
    assert n[:2].tolist() == [3, 3] and n[2] == 2 and (n >= 2).all()
    short = np.flatnonzero(n < 3).tolist()
    assert trace.meta["short_rounds"] == short and s["short_rounds"] == len(short)
    for v in short:
        assert 1 not in trace.grads["learner"][trace.update_slice(v)].tolist()
    assert (trace.grads["staleness"] == 0).all()
    assert len(set(_applied(trace))) == trace.num_gradients  # no gradient applied twice
    r = pd.read_csv(out / "restarts.csv")
    assert (r["learner"] == 1).all() and s["lost_gradients"] == 1
    assert r["event"].tolist()[:2] == ["lost", "away"] and (r["version"][:2] == 2).all()
    mine = trace.grads["learner"] == 1
    if "rejoined" in set(r["event"]):  # Ray restarted it before the run ended
        w = int(r.loc[r["event"] == "rejoined", "version"].iloc[0])
        assert short == list(range(2, w)) and s["restarts"] == 1
        assert trace.grads["batch"][mine].tolist()[2] == 2  # its lost batch, recomputed
        assert trace.grads["apply_version"][mine].tolist()[2] == w
    else:
        assert short == list(range(2, 8)) and trace.grads["batch"][mine].tolist() == [0, 1]
    # Short rounds pass check_trace only with the real run's marker.
    meta = {k: v for k, v in trace.meta.items() if k != "short_rounds_allowed"}
    with pytest.raises(TraceInvariantError, match="must take 3 gradients"):
        check_trace(Trace(trace.grads, trace.updates, meta), scn)
    assert replay_folder(out, out=tmp_path / "replay").summary["param_hash"] == s["param_hash"]


def test_killed_learner_under_ssp_holds_nobody_back(cluster, tmp_path, tiny):
    # SSP bounds clocks over the live learners (Protocol.on_lost): with s = 0 the others
    # would wait for learner 1's clock while Ray restarts it; they go on, and it rejoins the
    # bound once it is back. The run completes, passes the invariants and replays.
    scn = tiny(protocol={"kind": "ssp", "s": 0}, run={"updates": 12, "eval_every": 0})
    out = tmp_path / "kill-ssp"
    s = real_run(scn, out=out, cluster=cluster, faults={"kill_learner": [1, 2]})
    trace = Trace.load(out)
    check_trace(trace, scn)
    assert trace.num_updates == 12 == s["updates"] and s["lost_gradients"] == 1
    # Every SSP update takes one gradient: none is a hardsync round that went short.
    assert s["short_rounds"] == 0 and "short_rounds" not in trace.meta
    r = pd.read_csv(out / "restarts.csv")
    assert r["event"].tolist()[:2] == ["lost", "away"]
    assert replay_folder(out, out=tmp_path / "replay").summary["param_hash"] == s["param_hash"]


def test_killed_ps_resumes_from_checkpoint(cluster, tmp_path, tiny):
    scn = tiny(run={"updates": 24, "eval_every": 4, "checkpoint_every": 5})
    out = tmp_path / "crash"
    with pytest.raises(RealRunError, match="resume"):
        real_run(scn, out=out, cluster=cluster, faults={"crash_ps_at": 12})
    assert not runs.is_complete(out) and (out / "checkpoint.npz").exists()
    with np.load(out / "checkpoint.npz") as z:
        meta = json.loads(bytes(z["meta"]).decode())
    assert meta["version"] == 10
    before = meta["extra"]["trace"]["grads"]
    # The checkpoint belongs to its scenario: another one is refused by the driver, in one
    # line (raised in the PS actor, Ray would wrap it in a remote traceback).
    edited = tiny(run={"updates": 30, "eval_every": 4, "checkpoint_every": 5})
    with pytest.raises(runs.RunFolderError,
                       match=r"scenario.toml changed since the checkpoint \(run.updates\)"):
        real_run(edited, out=out, cluster=cluster, resume=True)
    s = real_run(scn, out=out, cluster=cluster, resume=True)
    trace = Trace.load(out)
    check_trace(trace, scn)
    assert trace.num_updates == 24 == s["updates"] and s["resumes"] == 1
    # The checkpointed updates are kept verbatim; no gradient applied twice.
    n0 = len(before["learner"])
    assert trace.grads["batch"][:n0].tolist() == before["batch"]
    assert trace.grads["t_apply"][:n0].tolist() == before["t_apply"]
    assert len(set(_applied(trace))) == trace.num_gradients
    ev = pd.read_csv(out / "eval.csv")
    assert ev["version"].tolist() == [0, 4, 8, 12, 16, 20, 24]
    assert replay_folder(out, out=tmp_path / "replay").summary["param_hash"] == s["param_hash"]


def test_calibrate_simulate_compare(async_run, tmp_path):
    _, out, _ = async_run
    for kind in ("empirical", "parametric"):
        path = calibrate(out, out=tmp_path / kind / "calibrated.toml", kind=kind)
        scn = load_scenario(path)
        assert scn.run.updates == 30
        sim = trace_run(scn, tmp_path / kind / "sim")
        check_trace(sim.trace, scn)
        res = compare(out, tmp_path / kind / "sim", figure=tmp_path / kind / "cmp.png")
        # The total variation distance, by hand from the two saved traces.
        pa, pb = (np.bincount(Trace.load(d).staleness, minlength=64)[:64]
                  for d in (out, tmp_path / kind / "sim"))
        assert res["tv_distance"] == pytest.approx(0.5 * np.abs(pa / pa.sum()
                                                                - pb / pb.sum()).sum())
        assert res["mean_b"] == pytest.approx(sim.trace.staleness.mean())
        assert compare(out, out)["tv_distance"] == 0.0
        assert plt.imread(tmp_path / kind / "cmp.png").shape[:2] == (420, 720)  # 6x3.5 in
    assert (tmp_path / "empirical" / "calib_compute_0.csv").exists()


class HalfOrOne(DelayModel):
    """0.5 for even learners, 1.0 for odd ones (a delay model registered only in Python)."""

    def sample(self, rng, learner, now):
        return 0.5 if learner % 2 == 0 else 1.0


@pytest.fixture
def python_plugins(fresh_registries):
    """A learning-rate rule and a delay model registered in this process only, the way a
    script or notebook registers them: Ray actors and tasks never import this file."""
    core.register_lr_rule("test-real-halved", lambda lr, tau, mean: 0.5 * lr + 0.0 * tau)
    register_delay("test-real-half-or-one")(HalfOrOne)


def test_python_registered_plugins_reach_the_actors(cluster, tmp_path, python_plugins, tiny):
    scn = tiny(optimizer={"lr": 0.05, "lr_rule": "test-real-halved"},
               run={"updates": 6, "eval_every": 0})
    s = real_run(scn, out=tmp_path / "real", cluster=cluster)
    # The PS actor applied the rule: lr 0.05 halved is lr 0.025 (a power of two: exact).
    same = tiny(optimizer={"lr": 0.025}, run={"updates": 6, "eval_every": 0})
    assert replay(same, Trace.load(tmp_path / "real")).summary["param_hash"] == s["param_hash"]
    assert replay(tiny(run={"updates": 6, "eval_every": 0}), Trace.load(tmp_path / "real")
                  ).summary["param_hash"] != s["param_hash"]


def test_ray_executor_sweep_equals_local(cluster, tmp_path, python_plugins, tiny):
    # The points use a rule and a delay model that only this process registered.
    raw = _raw_tiny(tiny)
    raw["cluster"] = {**raw["cluster"], "compute": {"dist": "test-real-half-or-one"}}
    raw["optimizer"] = {**raw["optimizer"], "lr_rule": "test-real-halved"}
    scn = load_scenario({**raw, "sweep": {"protocol.kind": ["async", "hardsync"]}})
    local = run_sweep(scn, tmp_path / "local")
    remote = run_sweep(scn, tmp_path / "ray", executor=ray_executor())
    cols = ["point", "param_hash", "trace_hash", "final_test_error", "status"]
    pd.testing.assert_frame_equal(local[cols], remote[cols])
    assert (remote["status"] == "complete").all()


def _raw_tiny(tiny):
    # Seed and data as tiny(): the workers' persistent compile cache then already holds the
    # gradient function (the seed is a constant inside it).
    return {"name": "tiny-sweep", "seed": 7, "model": tiny.base["model"],
            "data": tiny.base["data"],
            "cluster": {"learners": 2, "compute": {"dist": "lognormal", "mean": 1.0,
                                                   "cv": 0.5}},
            "optimizer": {"lr": 0.05}, "run": {"updates": 6}}


# ----------------------------------------------------------------------------- threads
def test_thread_counts_follow_xla_and_openblas(monkeypatch):
    """XLA's pool: PJRT_NPROC, else NPROC, else the affinity (not OMP_NUM_THREADS); BLAS:
    OPENBLAS_NUM_THREADS, else GOTO_NUM_THREADS, else OMP_NUM_THREADS, capped at it."""
    cpus = len(os.sched_getaffinity(0))
    assert thread_counts({}) == {"xla": cpus, "blas": cpus}
    assert thread_counts({"OMP_NUM_THREADS": "1"}) == {"xla": cpus, "blas": 1}
    assert thread_counts({"PJRT_NPROC": "3", "NPROC": "5"})["xla"] == 3
    assert thread_counts({"NPROC": "5"})["xla"] == 5
    assert thread_counts({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "64"})["blas"] == 1
    assert thread_counts({"GOTO_NUM_THREADS": "1", "OMP_NUM_THREADS": "64"})["blas"] == 1
    assert thread_counts({"OMP_NUM_THREADS": "64"})["blas"] == cpus
    for k in ("PJRT_NPROC", "NPROC", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
              "OMP_NUM_THREADS", "XLA_FLAGS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    env = numerics_env()
    assert env["PJRT_NPROC"] == str(cpus) and env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["OMP_NUM_THREADS"] == "1" and env["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
    one = numerics_env(1)
    assert (one["PJRT_NPROC"], one["OMP_NUM_THREADS"], one["OPENBLAS_NUM_THREADS"]) == ("1",) * 3


def test_actors_get_this_processs_thread_counts(cluster, async_run):
    want = thread_counts()
    assert cluster.counts == want and cluster.threads == want["xla"]
    assert ray.get([a.thread_counts.remote() for a in cluster.learners]) == [want] * 3
    s = async_run[2]
    assert (s["threads"], s["blas_threads"]) == (want["xla"], want["blas"])


# ----------------------------------------------------------------------------- processes
def _proc_alive(p) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill_all(procs) -> None:
    import psutil

    for p in procs:
        try:
            if _proc_alive(p):
                p.kill()
        except psutil.Error:
            pass


def test_watchdog_ends_the_session_when_its_driver_is_killed(tmp_path):
    """The watchdog alone (no Ray): a driver holding the pipe is SIGKILLed; the processes
    with the session's marker, or with a file open in the session folder while running
    this Python, end; a ``tail -f`` of a file there and an unrelated process do not."""
    psutil = pytest.importorskip("psutil")
    session = tmp_path / "session_x"
    (session / "logs").mkdir(parents=True)
    log = session / "logs" / "worker.out"
    log.write_text("")
    driver = tmp_path / "driver.py"
    driver.write_text(f"""
import os, subprocess, sys, time
sys.path.insert(0, {str(REPO / "asyncsim" / "drivers" / "real")!r})
import watchdog
g = watchdog.guard()
g.session({str(session)!r})
sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
marked = subprocess.Popen(sleeper, env={{**os.environ, **g.env()}})
holder = subprocess.Popen(sleeper, stdout=open({str(log)!r}, "a"))
print(g.proc.pid, marked.pid, holder.pid, flush=True)
time.sleep(300)
""")
    strangers = [subprocess.Popen(["tail", "-f", str(log)], stdout=subprocess.DEVNULL),
                 subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])]
    p = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
    procs = []
    try:
        procs = [psutil.Process(int(x)) for x in p.stdout.readline().split()]
        assert len(procs) == 3 and all(_proc_alive(q) for q in procs)
        time.sleep(0.5)
        assert all(_proc_alive(q) for q in procs)  # the watchdog waits for its driver
        p.send_signal(signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 15
        while any(_proc_alive(q) for q in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [q.pid for q in procs if _proc_alive(q)]
        assert all(q.poll() is None for q in strangers)
        assert "ended" in (session / "logs" / "asyncsim_watchdog.log").read_text()
    finally:
        p.kill()
        _kill_all(procs)
        for q in strangers:
            q.kill()
            q.wait()


def _cmd(p) -> str:
    import psutil

    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _ray_session(driver) -> tuple[dict, str | None]:
    """The driver's descendants now (pid: Process) and its watchdog's session token."""
    import psutil

    found, token = {}, None
    try:
        kids = driver.children(recursive=True)
    except psutil.Error:
        return found, token
    for c in kids:
        try:
            cmd = c.cmdline()
        except psutil.Error:
            continue
        found[c.pid] = c
        if len(cmd) > 4 and cmd[3].endswith("watchdog.py"):
            token = cmd[4]
    return found, token


def test_kill_9_of_a_real_driver_takes_its_local_ray_along(tmp_path, tiny):
    """``kill -9`` of ``asyncsim real``: every process of the Ray session it started (the
    GCS, the raylet, the agents, the learner and PS workers, the watchdog) is gone within
    30 s, and no process carries the session's marker."""
    psutil = pytest.importorskip("psutil")
    from asyncsim._io import dump_toml

    scn = tmp_path / "long.toml"
    scn.write_text(dump_toml(tiny.with_defaults(
        cluster={"learners": 2}, run={"updates": 10_000_000, "eval_every": 0}).base))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(tmp_path / "driver.log", "w") as log:
        p = subprocess.Popen([sys.executable, "-m", "asyncsim.cli", "real", str(scn), "--out",
                              str(tmp_path / "run"), "--quiet"], env=env, cwd=tmp_path,
                             stdout=log, stderr=subprocess.STDOUT)
    driver = psutil.Process(p.pid)
    seen: dict = {}
    token = None
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and p.poll() is None:
            now, tok = _ray_session(driver)
            seen.update(now)
            token = token or tok
            names = [_cmd(c) for c in now.values()]
            if any("PSHost.run" in n for n in names) and any("LearnerImpl" in n for n in names):
                break
            time.sleep(0.5)
        assert p.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        assert token is not None and any("PSHost.run" in _cmd(c) for c in seen.values())
        time.sleep(1.0)
        seen.update(_ray_session(driver)[0])
        names = {_cmd(c).split(" ")[0].rsplit("/", 1)[-1] for c in seen.values()}
        assert {"raylet", "gcs_server"} <= names, names
        p.send_signal(signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = [c for c in seen.values() if _proc_alive(c)]
            marked = watchdog.session_pids(token)
            if not left and not marked:
                break
            time.sleep(0.2)
        assert not left and not marked, [(c.pid, c.name()) for c in left] + marked
    finally:
        p.kill()
        _kill_all(seen.values())
        if token:
            _kill_all(psutil.Process(q) for q in watchdog.session_pids(token))

