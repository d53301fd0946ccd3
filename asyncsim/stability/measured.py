"""Measured stability edges of delayed SGD on quadratics, and sharpness during training (P2).

P2 (Giladi, Shpigel Nacson, Hoffer, Soudry, ICLR 2020, arXiv 1909.12340) predicts that SGD
with a constant delay τ is linearly stable at a minimum iff ``η λ_max < 2 sin(π/(4τ+2))``
(:mod:`asyncsim.stability` has the closed forms for every momentum kind). This module
*measures* that edge by running the real simulator, so that the closed forms, the protocol
code and the update core check each other:

1. timing: a ``fixed-delay`` scenario (N = τ + 1 workers; schedule ``round-robin``, ``random``
   or ``normal``) is simulated by the timing layer, so the staleness pattern is the
   protocol's, not a formula's;
2. numerics: the trace is executed by the one compiled-chunk executor of replay
   (:mod:`asyncsim.drivers.scan`: each update applied by the shared core with the parameter
   versions its gradient read), vmapped over a grid of learning rates through the state's
   ``hyper["lr"]`` and over several traces, all in one compiled program
   (:func:`asyncsim.drivers.scan.growth_windows`);
3. :func:`find_edge` brackets the largest stable ``x = η·λ`` on a log grid, then refines it
   on linear grids until the bracket is narrower than ``rel_tol``.

Divergence criterion. The recurrence is linear (with ``noise = 0``), so ``|w_t|`` behaves like
``ρ^t`` once the non-dominant modes have died out, ρ the spectral radius. We record the
largest ``|w|²`` over the second quarter of the run (window A) and over the last quarter
(window B): the run is *stable* iff B < A (or B = 0 after underflow), i.e. ``|w|`` shrank over
half the run. Windows rather than points make the test immune to the rotation of the complex
dominant root (its period is about ``4τ + 2`` updates, far below a quarter-run). Starting at
the second quarter lets the faster modes decay first. Near the edge ``1 − ρ`` is only
``O(ε/τ)`` for ``x = (1 − ε)·edge``, so the run length grows with τ (:func:`default_steps`);
with these lengths the measured edges match the closed forms to well under 1% for
τ ≤ 32 and every momentum kind (``tests/unit/test_edges.py``). With gradient noise the iterate
settles at a noise floor instead of shrinking, so a noisy run counts as unstable only if
``|w|²`` more than doubles between the windows (``noise_slack``); this biases the noisy edge
slightly upwards, and is documented where it is used.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncsim.config import Scenario
from asyncsim.drivers.build import numerics_for
from asyncsim.drivers.scan import growth_inputs, growth_windows
from asyncsim.drivers.trace_only import simulate
from asyncsim.numerics.numerics import Numerics
from asyncsim.scenario import load_scenario
from asyncsim.stability.closed_form import edge
from asyncsim.trace import Trace

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "default_steps",
    "find_edge",
    "edges_of_traces",
    "find_edges",
    "growth",
    "quadratic_scenario",
    "check_run_trace",
    "run_edges",
    "stable_mask",
]

# Initial log grid of x = η·λ. It is shifted up or down (whole decades) when the edge is not
# inside it: the dampened edge at τ = 0, β = 0.9 is 38, the heavy-ball edge at τ = 256 is ~6e-4.
_X_LO, _X_HI = 1e-4, 8.0
NOISE_SLACK = 1.0  # noisy runs: unstable iff |w|² grows by more than (1 + slack)


def default_steps(tau: int, schedule: str = "round-robin") -> int:
    """Run length deciding a 0.1% margin from the edge reliably at delay ``tau``.

    ``1 − ρ`` at ``x = (1 − ε)·edge`` scales like ``ε/τ`` (the critical root moves by
    ``dx/|p'(z)|`` with ``|p'(z)| = O(1)``), so the log-growth over half a run of length
    ``n`` is ``O(ε n / τ)``: ``n ∝ τ`` keeps it fixed. The constant was chosen by comparing
    with the closed forms (``tests/unit/test_edges.py``); random schedules get twice as long
    because their staleness has a heavy tail and the growth rate is itself random.
    """
    n = 2000 + 600 * (int(tau) + 1)
    return 2 * n if schedule != "round-robin" else n


def quadratic_scenario(tau: int, momentum: str = "none", beta: float = 0.0, *,
                       schedule: str = "round-robin", eigenvalue: float = 1.0,
                       noise: float = 0.0, steps: int | None = None, seed: int = 0,
                       lr: float | None = None, batch_size: int = 1,
                       optimizer: Mapping[str, Any] | None = None,
                       protocol: Mapping[str, Any] | None = None,
                       learners: int | None = None) -> Scenario:
    """The fixed-delay scenario of one edge measurement (P2's one-device simulation).

    One-dimensional quadratic ``L(w) = λ w²/2`` (plus ``noise·mean_b(x_b w)`` on the
    ``gaussian`` data when ``noise > 0``), N = τ + 1 workers with unit compute times, the
    given momentum kind and β, constant learning-rate rule, ``steps`` updates.
    ``optimizer``: further ``[optimizer]`` keys -- any remedy (an ``lr_rule`` table, a
    ``transform``, a ``compensation``): the measured edge is then that remedy's, with or
    without a closed form (:func:`asyncsim.stability.closed_form_applies`).
    ``protocol`` and ``learners``: another protocol table and cluster size in place of the
    fixed delay (a recorded run's, whose trace the measurement then executes:
    :func:`run_edges`).
    """
    steps = default_steps(tau, schedule) if steps is None else int(steps)
    raw: dict[str, Any] = {
        "name": f"edge-tau{tau}-{momentum}-{schedule}",
        "seed": int(seed),
        "protocol": dict(protocol) if protocol is not None else
        {"kind": "fixed-delay", "tau": int(tau), "schedule": schedule},
        "optimizer": {"lr": float(lr if lr is not None else 0.1 / eigenvalue),
                      **dict(optimizer or {}),
                      # the momentum arguments, with any momentum keys ``optimizer`` adds
                      "momentum": {"kind": momentum, "beta": float(beta),
                                   **dict((optimizer or {}).get("momentum", {}))}},
        "model": {"name": "quadratic", "eigenvalues": [float(eigenvalue)],
                  "noise": float(noise)},
        "data": {"name": "gaussian", "dim": 1, "batch_size": int(batch_size),
                 "n_train": 1000, "n_test": 10},
        "run": {"updates": steps},
    }
    if learners is not None:
        raw["cluster"] = {"learners": int(learners)}
    return load_scenario(raw)


# ------------------------------------------------------------------------------ executing
def growth(traces: Sequence[Trace], scn: Scenario, lrs: np.ndarray,
           numerics: Numerics | None = None, inputs=None) -> tuple[np.ndarray, np.ndarray]:
    """Windows A and B (module docstring) of every trace under every rate of ``lrs`` ([T, K]),
    by the compiled-chunk executor (:func:`asyncsim.drivers.scan.growth_windows`): the
    protocol's traces, the scenario's update core, one program for all T x K runs
    (``inputs``: the traces' :func:`~asyncsim.drivers.scan.growth_inputs`, when reused)."""
    m = traces[0].num_updates
    q = (m // 4, m // 2, (3 * m) // 4)
    return growth_windows(numerics or numerics_for(scn), inputs or growth_inputs(traces), lrs,
                          growth=q)


def stable_mask(window_a: np.ndarray, window_b: np.ndarray, *, noise: bool = False) -> np.ndarray:
    """Stable iff ``|w|²`` shrank between the windows (module docstring); NaN/inf: unstable."""
    slack = 1.0 + (NOISE_SLACK if noise else 0.0)
    finite = np.isfinite(window_a) & np.isfinite(window_b)
    return finite & ((window_b < window_a * slack) | (window_b == 0.0))


# ------------------------------------------------------------------------------ edges
def _bracket(stable: np.ndarray, xs: np.ndarray):
    """(last stable x before the first unstable one, first unstable x) or a shift hint."""
    bad = np.flatnonzero(~stable)
    if bad.size == 0:
        return None, "up"
    i = int(bad[0])
    if i == 0:
        return None, "down"
    return (float(xs[i - 1]), float(xs[i])), None


def _search(measure, n_lr: int, rel_tol: float, x_lo: float, x_hi: float,
            max_shifts: int = 6) -> np.ndarray:
    """Vectorised bracketing over ``T`` problems: ``measure(xs [T, K]) -> stable [T, K]``."""
    t = measure.n_problems
    lo_hi = np.tile(np.geomspace(x_lo, x_hi, n_lr), (t, 1))
    brackets: list[tuple[float, float] | None] = [None] * t
    span = x_hi / x_lo
    for _ in range(max_shifts + 1):
        st = measure(lo_hi)
        pending = False
        for j in range(t):
            if brackets[j] is not None:
                continue
            br, hint = _bracket(st[j], lo_hi[j])
            if br is not None:
                brackets[j] = br
                continue
            pending = True
            # Shift this problem's grid a whole span up or down (rare: τ = 0 dampened, ...).
            lo = lo_hi[j, 0] * (span if hint == "up" else 1 / span)
            lo_hi[j] = np.geomspace(lo, lo * span, n_lr)
        if not pending:
            break
    if any(b is None for b in brackets):
        raise RuntimeError("could not bracket the edge; widen the grid")
    lo = np.array([b[0] for b in brackets])
    hi = np.array([b[1] for b in brackets])
    while np.any((hi - lo) / lo > rel_tol):
        grid = lo[:, None] + (hi - lo)[:, None] * np.linspace(0, 1, n_lr + 2)[None, 1:-1]
        st = measure(grid)
        for j in range(t):
            bad = np.flatnonzero(~st[j])
            if bad.size == 0:
                lo[j] = grid[j, -1]
            else:
                i = int(bad[0])
                hi[j] = grid[j, i]
                if i > 0:
                    lo[j] = grid[j, i - 1]
    return lo


class _Measure:
    """``xs [T, K] -> stable [T, K]``: one call of the executor over T traces, rates x/λ."""

    def __init__(self, num: Numerics, scn: Scenario, traces: list[Trace], eigenvalue: float,
                 noise: bool):
        self.num, self.scn, self.traces, self.lam, self.noise = num, scn, traces, eigenvalue, noise
        self.inputs = growth_inputs(traces)  # once for every call of the search
        self.n_problems = len(traces)
        self.calls = 0

    def __call__(self, xs: np.ndarray) -> np.ndarray:
        self.calls += 1
        wa, wb = growth(self.traces, self.scn, np.asarray(xs) / self.lam, self.num, self.inputs)
        return stable_mask(wa, wb, noise=self.noise)


def find_edge(tau: int, momentum: str = "none", beta: float = 0.0, *,
              schedule: str = "round-robin", eigenvalue: float = 1.0, noise: float = 0.0,
              n_lr: int = 256, steps: int | None = None, rel_tol: float = 1e-3,
              seed: int = 0, optimizer: Mapping[str, Any] | None = None) -> float:
    """Largest stable ``η·λ`` at delay τ, measured by simulation (P2, Sec. 3).

    Simulates the fixed-delay scenario (:func:`quadratic_scenario`), runs its trace for a
    grid of ``n_lr`` learning rates in one vmapped program (:func:`growth`), and refines
    the bracket [last stable, first unstable] on linear grids until its relative width is
    below ``rel_tol``. For ``schedule = "round-robin"`` this reproduces
    :func:`asyncsim.stability.edge` (``2 sin(π/(4τ+2))`` for plain SGD); for ``random`` and
    ``normal`` there is no closed form and the answer is the edge of that seed's trace.
    ``optimizer`` adds ``[optimizer]`` keys (a remedy), as :func:`quadratic_scenario`.

    Returns:
        The largest ``x = η·λ`` measured stable (within ``rel_tol`` below the first
        unstable one).
    """
    return float(find_edges([tau], momentum, beta, schedule=schedule, eigenvalue=eigenvalue,
                            noise=noise, n_lr=n_lr, steps=steps, rel_tol=rel_tol,
                            seed=seed, optimizer=optimizer)[0])


def find_edges(taus: Sequence[int], momentum: str = "none", beta: float = 0.0, *,
               schedule: str = "round-robin", eigenvalue: float = 1.0, noise: float = 0.0,
               n_lr: int = 256, steps: int | None = None, rel_tol: float = 1e-3,
               seed: int = 0, optimizer: Mapping[str, Any] | None = None) -> np.ndarray:
    """:func:`find_edge` for several delays in one compiled program (vmapped over traces).

    Every trace gets the run length of the largest τ (shapes must match), and the ring
    buffer and shifted momentum's buffers are sized for the largest τ; a smaller trace just
    leaves the extra slots unused, so the numbers equal separate runs of that length.
    """
    taus = [int(t) for t in taus]
    tmax = max(taus)
    steps = default_steps(tmax, schedule) if steps is None else int(steps)
    scns = [quadratic_scenario(t, momentum, beta, schedule=schedule, eigenvalue=eigenvalue,
                               noise=noise, steps=steps, seed=seed, optimizer=optimizer)
            for t in taus]
    traces = [simulate(s) for s in scns]
    return edges_of_traces(scns[taus.index(tmax)], traces, n_lr=n_lr, rel_tol=rel_tol)


def edges_of_traces(scn: Scenario, traces: Sequence[Trace], *, n_lr: int = 256,
                    rel_tol: float = 1e-3) -> np.ndarray:
    """Measured edges ``η·λ`` of recorded traces (equal lengths) under ``scn``'s numerics.

    ``scn`` is a quadratic scenario (:func:`quadratic_scenario` or a file like
    ``scenarios/p2_f2.toml``) whose optimizer (momentum kind, β) applies to every trace; its
    ``cluster.learners`` must be at least every trace's worker count (shifted momentum keeps
    one buffer per worker). Used by the figure code, which reads saved traces.
    """
    lam = scn.model.options.get("eigenvalues", [1.0])
    if len(lam) != 1:
        raise ValueError("edges_of_traces needs a one-dimensional quadratic (one eigenvalue)")
    n_workers = max(int(t.grads["learner"].max(initial=0)) + 1 for t in traces)
    # Shifted momentum keeps one buffer per worker: size the core for the most workers.
    scn = dataclasses.replace(scn, cluster=dataclasses.replace(
        scn.cluster, learners=max(n_workers, scn.cluster.learners)))
    noise = float(scn.model.options.get("noise", 0.0)) > 0
    measure = _Measure(numerics_for(scn), scn, list(traces), float(lam[0]), noise)
    return _search(measure, n_lr, rel_tol, _X_LO, _X_HI)


def check_run_trace(trace: Trace) -> None:
    """Refuse (ValueError, one line) a trace :func:`run_edges` cannot measure: one whose
    updates take different numbers of gradients (the compiled program takes a constant
    number per update), or one too short for its growth windows to span ten delay periods
    (at least ``20 (τ_max + 1)`` updates, and 200): a floor below which the verdicts are
    noise, not a guarantee of :func:`default_steps`' 0.1% margin."""
    if trace.num_updates and trace.uniform_n_grads is None:
        raise ValueError("its updates take different numbers of gradients; the edge is "
                         "measured on traces whose updates all take the same number")
    need = max(200, 20 * (int(trace.max_staleness) + 1))
    if trace.num_updates < need:
        raise ValueError(f"it has {trace.num_updates} updates, and measuring the edge of its "
                         f"staleness (max {int(trace.max_staleness)}) needs at least {need}")


def run_edges(scn: Scenario, trace: Trace, momenta: Sequence[str] = ("none",),
              betas: Sequence[float] = (0.9,), **kw: Any) -> pd.DataFrame:
    """The stability edge of a recorded run's own staleness: delayed gradient descent on a
    one-dimensional quadratic, driven update by update by the run's trace (which version
    each gradient read, how many gradients each update took: ``scn``'s protocol and
    learners), for each momentum kind and β; beside it the closed forms at the trace's mean
    and largest staleness, the constant delays that bound a random one.

    Random staleness is not a constant delay: P2's closed form is exact for a constant τ
    (fixed-delay round robin), and for a run's random staleness this measurement is the edge
    that applies. Columns: momentum, beta, measured, staleness_mean, staleness_max,
    closed_form_at_mean (τ = the mean, rounded), closed_form_at_max, measured_over_mean
    (measured / closed_form_at_mean).
    """
    import pandas as pd  # here: a run never imports pandas (docs/design.md)

    from asyncsim.config import to_dict

    check_run_trace(trace)
    tau = trace.staleness
    mean, most = float(tau.mean()) if tau.size else 0.0, int(trace.max_staleness)
    rows = []
    for kind in momenta:
        for beta in ((0.0,) if kind == "none" else tuple(betas)):
            quad = quadratic_scenario(0, kind, beta, protocol=to_dict(scn)["protocol"],
                                      learners=scn.cluster.learners, steps=trace.num_updates)
            measured = float(edges_of_traces(quad, [trace], **kw)[0])
            at_mean = float(edge(round(mean), kind, beta))
            rows.append({"momentum": kind, "beta": float(beta), "measured": measured,
                         "staleness_mean": mean, "staleness_max": most,
                         "closed_form_at_mean": at_mean,
                         "closed_form_at_max": float(edge(most, kind, beta)),
                         "measured_over_mean": measured / at_mean})
    return pd.DataFrame(rows)


def edge_comparison(taus: Sequence[int], momenta: Sequence[str] = ("none",),
                    betas: Sequence[float] = (0.9,), **kw: Any) -> pd.DataFrame:
    """Closed form against measured edge for every (τ, momentum, β): the CLI's table.

    Columns: tau, momentum, beta, closed_form, measured, rel_error, seconds.
    """
    import pandas as pd  # here: a run never imports pandas (docs/design.md)

    rows = []
    for kind in momenta:
        for beta in ((0.0,) if kind == "none" else tuple(betas)):
            t0 = time.perf_counter()
            meas = find_edges(list(taus), kind, beta, **kw)
            dt = time.perf_counter() - t0
            for tau, m in zip(taus, meas, strict=True):
                cf = float(edge(tau, kind, beta))
                rows.append({"tau": int(tau), "momentum": kind, "beta": float(beta),
                             "closed_form": cf, "measured": float(m),
                             "rel_error": float(m / cf - 1.0), "seconds": dt / len(taus)})
    return pd.DataFrame(rows)
