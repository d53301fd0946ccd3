"""`kill -9` of `asyncsim run` at a random point of its update loop, then `run --resume`:
the same parameters and trace as the run that was never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from asyncsim.drivers.checkpoint import CKPT, checkpoint_meta

SCRIPT = """
import sys
from asyncsim.cli import main
sys.exit(main(sys.argv[1:]))
"""


# The run to be killed: the `asyncsim` command whose last update never ends (it waits before
# the Driver's checks after update 600), so the kill always lands before the run finishes.
KILLED_SCRIPT = """
import sys, time
from asyncsim.cli import main
from asyncsim.drivers import driver as drv

real = drv.Driver._after

def after(self, done, **kw):
    if done == 600:
        time.sleep(600)
    return real(self, done, **kw)

drv.Driver._after = after
sys.exit(main(sys.argv[1:]))
"""


def test_resume_after_a_kill_gives_the_same_hash(tmp_path):
    scn_file = tmp_path / "s.toml"
    scn_file.write_text("""
name = "resume"
seed = 3
[model]
name = "mlp"
hidden = [16]
[data]
name = "synthetic-cifar"
batch_size = 8
n_train = 256
n_test = 64
[cluster]
learners = 3
compute = { dist = "exponential", mean = 1.0 }
[protocol]
kind = "softsync"
n = 3
[optimizer]
lr = 0.005
momentum = { kind = "heavy-ball", beta = 0.9 }
[run]
updates = 600
checkpoint_every = 20
""")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    full = tmp_path / "full"
    # The uninterrupted reference runs beside the run to be killed (each is mostly JAX import
    # and compile time, which two cores overlap).
    ref = subprocess.Popen([sys.executable, "-c", SCRIPT, "run", str(scn_file), "--out",
                            str(full), "--quiet"], env=env)
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT, "run", str(scn_file),
                             "--out", str(killed), "--quiet"], env=env)
    try:
        # Kill at a random point: after a random checkpoint (version 20..500 of 600), plus a
        # random fraction of a second, so the kill can land anywhere in the update loop.
        rng = np.random.default_rng()
        target = int(rng.integers(1, 26)) * 20
        deadline = time.time() + 180
        while time.time() < deadline and _ckpt_version(killed) < target:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.1))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        assert _ckpt_version(killed) >= target and not (killed / "summary.json").exists(), target
        r = subprocess.run([sys.executable, "-c", SCRIPT, "run", "--resume", str(killed),
                            "--quiet"], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert ref.wait() == 0
        a = json.loads((full / "summary.json").read_text())
        b = json.loads((killed / "summary.json").read_text())
        assert not a["diverged"] and a["updates"] == 600
        assert a["param_hash"] == b["param_hash"], target
        assert a["trace_hash"] == b["trace_hash"], target
    finally:  # a test that failed early leaves no run waiting
        for p in (proc, ref):
            if p.poll() is None:
                p.kill()
                p.wait()


def _ckpt_version(folder) -> int:
    """The version of ``folder``'s checkpoint (written atomically), -1 while it has none."""
    return checkpoint_meta(folder)["version"] if (folder / CKPT).exists() else -1
