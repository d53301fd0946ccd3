"""``asyncsim run``: the online driver — SimPy timing with real JAX gradients as it goes.

The SimPy run (:mod:`asyncsim.timing.cluster`) calls back after every PS update; the
callback hands the update's timing rows to the one :class:`~asyncsim.drivers.driver.Driver`,
which computes its gradients on the versions they read and applies the shared update core.
Parameter versions are kept only while some outstanding gradient still reads them.

Checkpoints and resume: timing never depends on numerics, so ``--resume`` re-simulates the
timeline (cheap) and restarts the numerics from the checkpoint: the final ``param_hash`` is
the one an uninterrupted run gives.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asyncsim import runs
from asyncsim.config import Scenario
from asyncsim.drivers.build import message_bytes, numerics_for, simulation_for
from asyncsim.drivers.checkpoint import CKPT, check_checkpoint, resume_from
from asyncsim.drivers.driver import Driver, Monitor, RunResult
from asyncsim.drivers.folder_scenario import start_folder
from asyncsim.drivers.run_length import run_length
from asyncsim.numerics.numerics import Numerics


def run(scn: Scenario, *, out: str | Path | None = None, resume: bool = False,
        force: bool = False, progress: bool = False, profile: str | None = None,
        grouping: str = "auto", numerics: Numerics | None = None,
        monitor: Monitor | None = None, extra: Mapping[str, Any] | None = None) -> RunResult:
    """Simulate ``scn`` with real gradients (the online driver) and, with ``out``, write it.

    ``monitor``: what the run measures along the way (:class:`~asyncsim.drivers.driver.Monitor`;
    :func:`asyncsim.api.run` passes the one of the scenario's ``[measure]`` table);
    ``extra``: more ``summary.json`` fields (a sweep point's ``sweep_path``).

    Returns:
        A :class:`RunResult`; ``summary`` has the trace figures plus ``final_test_error``,
        ``diverged``, ``diverged_at``, ``param_hash``, ``wall_time``.
    """
    with runs.opened(out, resume=resume, force=force) as folder:
        return _run(scn, folder, resume, progress, profile, grouping, numerics, monitor,
                    extra)


def _run(scn, folder, resume, progress, profile, grouping, numerics, monitor,
         extra) -> RunResult:
    """:func:`run` once its folder is prepared (and locked)."""
    t0 = time.perf_counter()
    num = numerics or numerics_for(scn, grouping=grouping)
    start = None
    if resume and folder is not None and (folder / CKPT).exists():
        record = check_checkpoint(folder, scn)
        start = resume_from(folder, scn, num, check=False)
    else:
        record = start_folder(folder, scn, profile=profile)
    driver = Driver(scn, num, folder=folder, start=start, monitor=monitor, record=record)
    sim = simulation_for(scn, msg_bytes=message_bytes(scn), track_reads=True,
                         on_update=lambda v, rows: driver.on_update(v, rows,
                                                                    alive=sim.read_refs,
                                                                    now=sim.env.now))
    limits = run_length(scn, n_train=num.n_train)
    if progress:
        driver.show_progress(limits.get("max_updates"))
    try:
        trace = sim.run(**limits)
    finally:
        driver.close_progress()
    return driver.finish(trace, t0, extra=extra)


