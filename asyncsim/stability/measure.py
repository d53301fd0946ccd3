"""What a run measures for its figures (a scenario's ``[measure]`` table), stored in its run
folder: the figures read it there and never rerun numerics (analysis/ imports no driver and
no numerics; an import-linter contract).

* :class:`Sharpness`, the run's :class:`~asyncsim.drivers.driver.Monitor`: λ_max of the
  mean training loss on the first ``measure.sharpness_samples`` training samples
  (:func:`asyncsim.stability.sharpness.sharpness`) at the initial weights
  (``initial_sharpness``: power iteration, tolerance 1e-4), of the final weights
  (``final_sharpness``: P2's power iteration, tolerance 1e-6, at most 100 iterations; and
  ``final_sharpness_lanczos``, 40 Lanczos steps, a check when the top eigenvalues are close),
  and ``sharpness_points`` times along the run (30-step Lanczos, residual 1e-4) into the
  folder's ``sharpness.csv``, with the rate the run's rule gives at its delay τ
  (``protocol.tau``; the Driver records it in every such run's summary as ``lr_at_tau``).
* :func:`sweep_edges`: a sweep of fixed-delay traces on a one-dimensional quadratic measures
  each trace's stability edge (:func:`asyncsim.stability.measured.edges_of_traces`) into the
  sweep folder's ``edges.csv``, once the points are complete.
"""

from __future__ import annotations

import dataclasses
import json
import math
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncsim import _io
from asyncsim.config import MeasureConfig, Scenario, to_dict
from asyncsim.drivers.driver import Driver
from asyncsim.drivers.replay import replay
from asyncsim.drivers.trace_only import simulate
from asyncsim.numerics.lr_rules import rate_at_delay, rule_label
from asyncsim.runs import EDGES_CSV, SHARPNESS_CSV
from asyncsim.stability.closed_form import edge
from asyncsim.stability.measured import edges_of_traces
from asyncsim.stability.sharpness import sharpness
from asyncsim.timing.protocols import protocol_options
from asyncsim.trace import Trace

if TYPE_CHECKING:
    import pandas as pd


# Programs (model, data, seed, batch size) -> {samples: lambda_max at the initial weights}.
# The initial weights are a function of the model and the seed only, so every point of a
# sweep that shares them has the same initial sharpness: it is measured once, not once per
# point (0.4 s a run on the remedies study's MLP, 100 power iterations).
_INITIAL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def monitor_for(scn: Scenario) -> Sharpness | None:
    """The monitor of ``scn``'s ``[measure]`` table, or None when it asks for no sharpness."""
    m = scn.measure
    if not (m.initial_sharpness or m.final_sharpness or m.sharpness_points):
        return None
    return Sharpness.of(scn)


def observes_along(scn: Scenario) -> bool:
    """Whether ``scn``'s monitor measures between the run's start and end
    (``measure.sharpness_points``), which a compiled chunk cannot serve: such a run takes the
    loop path (sweeps run its points one at a time)."""
    return bool(scn.measure.sharpness_points)


def rate_at_tau(scn: Scenario) -> float:
    """The per-gradient rate ``scn``'s rule gives at its protocol's delay τ (``lr`` without
    one): the rate a round-robin run uses from its first τ updates on."""
    lr, tau = scn.optimizer.lr, scn.protocol.options.get("tau")
    return lr if tau is None else rate_at_delay(scn.optimizer.lr_rule, lr, tau)


class Sharpness:
    """The sharpness measurements of a scenario's ``[measure]`` part (module docstring), as
    a Driver monitor.

    Args:
        measure: what to measure (``[measure]``).
        lr: the per-gradient rate at the protocol's delay (:func:`rate_at_tau`).
        tau: the protocol's delay τ (None: it has none).
        lr_rule: the optimizer's rule (its label goes into each row).
        every: updates between measurements along the run (0: none, only the initial and
            final ones).
        samples, method, max_iter, tol: of the measurements along the run (``samples``
            default: ``measure.sharpness_samples``).
    """

    def __init__(self, measure: MeasureConfig, *, lr: float, tau: int | None,
                 lr_rule: Any, every: int = 0, samples: int | None = None,
                 method: str = "lanczos", max_iter: int = 30, tol: float = 1e-4):
        self.measure = measure
        self.every = every
        self.samples = samples or measure.sharpness_samples
        self.method, self.max_iter, self.tol = method, max_iter, tol
        self.lr, self.tau, self.lr_rule = lr, tau, lr_rule
        self.rows: list[dict[str, Any]] = []

    @classmethod
    def of(cls, scn: Scenario, *, every: int | None = None, **kw: Any) -> Sharpness:
        """The monitor of ``scn``'s parts; ``every`` defaults to ``run.updates //
        measure.sharpness_points`` (0 without points)."""
        m = scn.measure
        if every is None:  # the scenario validator requires run.updates with points
            every = max(1, scn.run.updates // m.sharpness_points) if observes_along(scn) else 0
        return cls(m, lr=rate_at_tau(scn), tau=scn.protocol.options.get("tau"),
                   lr_rule=scn.optimizer.lr_rule, every=every, **kw)

    def _batch(self, driver: Driver):
        num = driver.num
        return num.x_train[:self.samples], num.y_train[:self.samples]

    def observe(self, driver: Driver, version: int) -> None:
        if not self.every:
            return  # no measurements along the run: only initial_sharpness / final_sharpness
        x, y = self._batch(driver)
        params = driver.state.params
        loss = float(driver.num.model.loss(params, x, y))
        sh = (sharpness(driver.num.model, params, x, y, method=self.method,
                        max_iter=self.max_iter, tol=self.tol) if math.isfinite(loss) else math.nan)
        e = edge(self.tau) if self.tau is not None else math.nan
        self.rows.append({"update": version, "sharpness": sh, "train_loss": loss, "lr": self.lr,
                          "tau": self.tau, "lr_rule": rule_label(self.lr_rule),
                          "edge": e,
                          "bound": e / self.lr, "sync_bound": 2.0 / self.lr,
                          "eta_lambda": self.lr * sh, "diverged": False})

    def state(self) -> list[dict[str, Any]]:
        """The measurements so far (a checkpoint keeps them)."""
        return [dict(r) for r in self.rows]

    def restore(self, state: list[dict[str, Any]]) -> None:
        self.rows = [dict(r) for r in state]

    @property
    def table(self) -> pd.DataFrame:
        """The measurements along the run, one row per measurement (``sharpness.csv``)."""
        import pandas as pd  # here: a run never imports pandas (docs/design.md)

        return pd.DataFrame(self.rows)

    def finish(self, driver: Driver) -> dict[str, Any]:
        m, model = self.measure, driver.num.model
        x, y = self._batch(driver)
        out: dict[str, Any] = {}
        if m.initial_sharpness:
            known = _INITIAL.setdefault(driver.num.programs, {})
            if self.samples not in known:
                known[self.samples] = sharpness(model, driver.num.init_params(), x, y,
                                                max_iter=100, tol=1e-4)
            out["initial_sharpness"] = known[self.samples]
        if m.final_sharpness:
            ok = driver.diverged_at is None
            out["final_sharpness"] = sharpness(model, driver.state.params, x, y) if ok else None
            out["final_sharpness_lanczos"] = (sharpness(model, driver.state.params, x, y,
                                                        method="lanczos", max_iter=40)
                                              if ok else None)
        if self.rows:
            self.rows[-1]["diverged"] = driver.diverged_at is not None
            if driver.folder is not None:
                _io.write_text(driver.folder / SHARPNESS_CSV, self.table.to_csv(index=False))
        return out


def sharpness_trajectory(scn: Scenario, *, every: int = 50, samples: int = 512,
                         max_iter: int = 50, tol: float = 1e-4) -> pd.DataFrame:
    """Train ``scn`` (its trace, replayed update by update) and log sharpness every ``every``
    updates: P2's HVP power iteration (:func:`asyncsim.stability.sharpness.sharpness`) on
    the mean loss over the first ``samples`` training examples, a fixed batch so the curve is
    not batch noise. A diverged run stops at its diverged update, logged last.

    Returns:
        The :class:`Sharpness` table: update, sharpness, train_loss (on those samples), lr
        (the rate at the protocol's delay τ), tau, lr_rule, edge (2 sin(π/(4τ+2))), bound
        (edge / lr), sync_bound (2 / lr), eta_lambda (lr · sharpness), diverged.
    """
    monitor = Sharpness.of(scn, every=every, samples=samples, method="power",
                           max_iter=max_iter, tol=tol)
    replay(scn, simulate(scn), monitor=monitor)
    return monitor.table


# ----------------------------------------------------------------------------- sweeps
def _edge_group(scn: Scenario) -> str:
    """Traces measured in one program: everything but the delay (τ and the worker count)."""
    d = to_dict(scn)
    for k in ("name", "source", "sweep", "figure"):
        d.pop(k, None)
    d["protocol"] = {k: v for k, v in d["protocol"].items() if k != "tau"}
    d["cluster"] = {k: v for k, v in d["cluster"].items() if k != "learners"}
    return json.dumps(d, sort_keys=True, default=str)


def sweep_edges(out: Path, points: Sequence[Mapping[str, Any]]) -> Path:
    """Measure the stability edge of every point's trace into ``out/edges.csv``.

    ``points``: the sweep's points (``{"point", "scenario"}``, all complete). Traces that
    differ only in their delay are measured together, in one program, under the largest
    delay's scenario (so shifted momentum has a buffer for every worker), once per momentum
    kind of ``measure.edge_momenta`` (β of the scenario; 0 for ``none``). Columns: point,
    tau, schedule, momentum, beta, measured (the largest stable η·λ), closed_form (the
    round-robin closed form of that kind, whatever the schedule), staleness_mean,
    staleness_max.
    """
    import pandas as pd  # here: a run never imports pandas (docs/design.md)

    groups: dict[str, list[tuple[str, Scenario, Trace]]] = {}
    for p in points:
        scn = p["scenario"]
        groups.setdefault(_edge_group(scn), []).append(
            (p["point"], scn, Trace.load(out / p["point"])))
    rows = []
    for members in groups.values():
        big = max(members, key=lambda m: m[1].protocol.options["tau"])[1]
        kinds = big.measure.edge_momenta or (big.optimizer.momentum.kind,)
        own = big.optimizer.momentum
        for kind in kinds:
            beta = 0.0 if kind == "none" else own.beta
            # The scenario's style and (for its own kind) dampening carry over; the edge of
            # a dampened buffer is the undampened one / (1 - d).
            damp = own.dampening if kind == own.kind else None
            opt = dataclasses.replace(big.optimizer, momentum=dataclasses.replace(
                own, kind=kind, beta=beta, dampening=damp))
            measured = edges_of_traces(dataclasses.replace(big, optimizer=opt),
                                       [t for _, _, t in members])
            for (point, scn, trace), x in zip(members, measured, strict=True):
                tau = int(scn.protocol.options["tau"])
                closed = float(edge(tau, kind, beta, dampening=damp or 0.0))
                schedule = protocol_options(scn.protocol)["schedule"]
                rows.append({"point": point, "tau": tau, "schedule": schedule,
                             "momentum": kind, "beta": beta, "measured": float(x),
                             "closed_form": closed,
                             "staleness_mean": float(trace.staleness.mean()),
                             "staleness_max": int(trace.staleness.max())})
    path = out / EDGES_CSV
    _io.write_text(path, pd.DataFrame(rows).to_csv(index=False))
    return path


__all__ = ["EDGES_CSV", "SHARPNESS_CSV", "Sharpness", "monitor_for", "observes_along",
           "rate_at_tau", "sharpness_trajectory", "sweep_edges"]
