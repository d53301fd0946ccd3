"""Stability edges (P2) against numeric roots, closed forms and docs/papers.md's numbers."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncsim.stability import (
    MOMENTUM_KINDS,
    asymptote,
    char_poly,
    edge,
    edge_table,
    effective_edge,
    lr_for_delay,
    spectral_radius,
)

taus = st.integers(min_value=0, max_value=256)
betas = st.floats(min_value=0.0, max_value=0.99, exclude_max=True)


# Few examples: np.roots at degree ~258 costs 0.1-1 s on a loaded 2-core runner.
@settings(max_examples=12, deadline=None)
@given(tau=taus, beta=betas, kind=st.sampled_from(MOMENTUM_KINDS))
def test_edge_is_where_a_root_crosses(tau, beta, kind):
    # A root moves by about (Δx/x)/τ² in modulus near the edge, so ±1e-3 relative is still
    # ~1e-8 from the circle at τ = 256, well above np.roots' error for these polynomials.
    e = edge(tau, kind, beta)
    assert spectral_radius(tau, e * (1 - 1e-3), kind, beta) < 1
    assert spectral_radius(tau, e * (1 + 1e-3), kind, beta) > 1


@settings(max_examples=15, deadline=None)
@given(tau=st.integers(min_value=0, max_value=12), beta=st.floats(-0.95, 0.97),
       kind=st.sampled_from(MOMENTUM_KINDS))
def test_no_earlier_crossing(tau, beta, kind):
    """The edge is the *first* instability: stable on the whole of (0, edge)."""
    e = edge(tau, kind, beta)
    xs = np.linspace(1e-6, e * (1 - 1e-4), 200)
    assert np.all(spectral_radius(tau, xs, kind, beta) < 1)


def _step(kind, w, m, tau, x, beta):
    """One update of the scalar recurrence (module docstring of asyncsim.stability)."""
    if kind == "none":
        return w[-1] - x * w[-1 - tau], m
    if kind == "shifted":
        return w[-1] - x * w[-1 - tau] + beta * (w[-1 - tau] - w[-2 - tau]), m
    if kind == "nesterov":  # the core's: m <- beta m + d; w <- w - (d + beta m)
        g = x * w[-1 - tau]
        m = beta * m + g
        return w[-1] - (g + beta * m), m
    g = x * w[-1 - tau] * ((1 - beta) if kind == "dampened" else 1.0)
    m = beta * m + g
    return w[-1] - m, m


@pytest.mark.parametrize("kind", MOMENTUM_KINDS)
@pytest.mark.parametrize("tau", [0, 1, 3])
def test_char_poly_matches_recurrence(kind, tau):
    """Each nonzero root z makes w_t = z^t an exact solution of the update recurrence."""
    x, beta = 0.3, 0.6
    for z in np.roots(char_poly(tau, x, kind, beta)):
        if abs(z) < 1e-8:
            continue  # the spurious z = 0 root of the momentum polynomials
        w = [z**t for t in range(tau + 2)]
        m = w[-2] - w[-1]  # momentum consistent with w_{t+1} = w_t − m_{t+1}
        if kind == "nesterov":  # m_t = c z^t with c z = β c + x z^{−τ}
            m = x * w[-1 - tau] / (z - beta)
        for _ in range(5):
            nxt, m = _step(kind, w, m, tau, x, beta)
            assert abs(nxt - z * w[-1]) < 1e-9 * abs(z * w[-1])
            w.append(nxt)


@given(beta=betas)
def test_small_tau_closed_forms(beta):
    assert edge(0, "none") == pytest.approx(2.0, rel=1e-12)
    assert edge(1, "none") == pytest.approx(1.0, rel=1e-12)
    assert edge(0, "heavy-ball", beta) == pytest.approx(2 * (1 + beta), rel=1e-9)
    assert edge(0, "shifted", beta) == pytest.approx(2 * (1 + beta), rel=1e-9)
    assert edge(1, "heavy-ball", beta) == pytest.approx(1 - beta, rel=1e-9)
    # Found while deriving: shifted momentum at τ = 1 has edge 1 − β².
    assert edge(1, "shifted", beta) == pytest.approx(1 - beta**2, rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(tau=taus, beta=betas)
def test_dampened_is_heavy_ball_rescaled(tau, beta):
    hb = edge(tau, "heavy-ball", beta)
    assert edge(tau, "dampened", beta) == pytest.approx(hb / (1 - beta), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(tau=taus)
def test_beta_zero_is_plain(tau):
    plain = 2 * np.sin(np.pi / (4 * tau + 2))
    for kind in MOMENTUM_KINDS:
        assert edge(tau, kind, 0.0) == pytest.approx(plain, rel=1e-9)


def test_edge_exact_to_1e9():
    """Refine with np.roots-free bisection on spectral_radius: agrees to 1e-9 relative."""
    for kind, tau, beta in [("heavy-ball", 7, 0.9), ("shifted", 32, 0.9), ("shifted", 5, 0.3)]:
        e = edge(tau, kind, beta)
        assert spectral_radius(tau, e * (1 - 1e-8), kind, beta) < 1
        assert spectral_radius(tau, e * (1 + 1e-8), kind, beta) > 1


def test_reference_numbers():
    """docs/papers.md, P2 momentum section (effective-rate thresholds)."""
    assert effective_edge(32, "none") == pytest.approx(0.0483, abs=5e-5)
    assert effective_edge(32, "heavy-ball", 0.9) == pytest.approx(0.0406, abs=5e-5)
    assert effective_edge(32, "shifted", 0.9) == pytest.approx(0.0614, abs=5e-5)
    assert effective_edge(4, "heavy-ball", 0.9) == pytest.approx(0.265, abs=5e-4)
    assert effective_edge(4, "none") == pytest.approx(0.347, abs=5e-4)
    assert effective_edge(4, "dampened", 0.9) == pytest.approx(0.265, abs=5e-4)


@pytest.mark.parametrize("kind,beta", [("none", 0.0), ("heavy-ball", 0.0), ("heavy-ball", 0.5),
                                       ("heavy-ball", 0.9), ("dampened", 0.9),
                                       ("shifted", 0.5), ("shifted", 0.9), ("shifted", 0.98)])
def test_large_tau_asymptotes(kind, beta):
    ratio = edge(256, kind, beta) / asymptote(256, kind, beta)
    assert ratio == pytest.approx(1.0, rel=0.04)
    # ... and the approximation improves with τ.
    assert abs(edge(4096, kind, beta) / asymptote(4096, kind, beta) - 1) < abs(ratio - 1) + 1e-12


def test_vectorised_broadcast():
    t = np.arange(5)[:, None]
    b = np.array([0.0, 0.5, 0.9])[None, :]
    out = edge(t, "shifted", b)
    assert out.shape == (5, 3)
    for i in range(5):
        for j in range(3):
            assert out[i, j] == edge(i, "shifted", b[0, j])
    assert isinstance(edge(3, "heavy-ball", 0.5), float)
    assert spectral_radius(np.arange(3), 0.1).shape == (3,)


def test_lr_for_delay():
    assert lr_for_delay(0.1, 0, "constant") == 0.1
    assert lr_for_delay(0.1, 7, "constant") == 0.1
    assert lr_for_delay(0.1, 0, "inverse-staleness") == 0.1
    assert lr_for_delay(0.1, 4, "inverse-staleness") == pytest.approx(0.025)
    assert lr_for_delay(0.1, 0) == pytest.approx(0.1)
    assert lr_for_delay(0.1, 1) == pytest.approx(0.05)
    assert lr_for_delay(0.1, 4) == pytest.approx(0.1 * np.sin(np.pi / 18))
    # Same reachable minima: the largest stable λ, edge(τ)/η_τ, stays at 2/η0 (P2).
    taus_ = np.arange(64)
    assert np.allclose(edge(taus_) / lr_for_delay(0.1, taus_), 2.0 / 0.1)
    with pytest.raises(ValueError):
        lr_for_delay(0.1, 3, "bogus")


def test_invalid_inputs():
    with pytest.raises(ValueError):
        edge(3, "bogus")
    with pytest.raises(ValueError):
        edge(3, "heavy-ball", 1.0)
    with pytest.raises(ValueError):
        edge(-1)
    assert char_poly(0, 0.5).tolist() == [1.0, -0.5]


def test_table_columns_and_values():
    # (its speed, 257 taus x 3 kinds x 10 betas, is benchmarks/bench_edges.py's first row)
    df = edge_table([0, 1, 4, 32], betas=(0.0, 0.9))
    assert list(df.columns) == ["tau", "momentum", "beta", "edge", "effective_edge", "asymptote"]
    assert len(df) == 4 + 4 * 4 * 2  # none once; heavy-ball, dampened, shifted, nesterov
    row = df[(df.tau == 32) & (df.momentum == "shifted") & (df.beta == 0.9)].iloc[0]
    assert row.effective_edge == pytest.approx(0.0614, abs=5e-5)


@given(beta=betas)
def test_nesterov_edges(beta):
    """Nesterov (the core's form): at τ = 0 the classic quadratic's edge 1 + 1/(1 + 2β) (the
    root leaves through z = −1); its effective edge is edge/(1 − β); at large τ it tends
    to heavy ball's (1 − β)π/(2τ), like heavy ball (0.97 of it at β = 0.9, τ = 256)."""
    assert edge(0, "nesterov", beta) == pytest.approx(1 + 1 / (1 + 2 * beta), rel=1e-9)
    assert effective_edge(5, "nesterov", beta) == pytest.approx(
        edge(5, "nesterov", beta) / (1 - beta), rel=1e-12)
    assert edge(0, "nesterov", 0.0) == pytest.approx(2.0, rel=1e-12)  # β = 0: plain SGD
    assert edge(7, "nesterov", 0.0) == pytest.approx(edge(7, "none"), rel=1e-9)


def test_nesterov_large_tau_and_asymptote_at_zero():
    ratio = edge(256, "nesterov", 0.9) / asymptote(256, "nesterov", 0.9)
    assert 0.95 < ratio < 1.0
    # A large-τ form says nothing at τ = 0: NaN for every momentum kind (not inf for heavy
    # ball and a finite, unrelated number for shifted); plain SGD keeps π/(2τ + 1).
    for kind in MOMENTUM_KINDS:
        if kind != "none":
            assert np.isnan(asymptote(0, kind, 0.9))
    assert asymptote(0, "none") == pytest.approx(np.pi)
