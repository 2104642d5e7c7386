"""The planar Laplace channel: kernel masses, the remapping, and the FFT operator.

Units: cells of 1 m, so ``epsilon`` is epsilon * cell. Reference integrals
are computed with ``scipy.integrate.dblquad`` directly on the density
``epsilon^2 / (2 pi) exp(-epsilon r)``, with the cusp at the noise centre put
on the corner of the integration rectangles; they are accurate to ~1e-12,
so the kernel (Gauss-Legendre in another variable) must agree to 1e-9
relative (1e-13 absolute for masses below 1e-4).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy import integrate, special

from aggregator.estimation import (
    IBU,
    MatrixInversion,
    MaximumLikelihood,
    PlanarLaplaceChannel,
    budget,
    channel_for,
    estimate,
    fftw,
    planar_steps,
)
from aggregator.estimation.channels import DENSE_SOLVE_LIMIT
from aggregator.estimation.ibu import IBUSteps
from aggregator.estimation.planar_kernel import kernel, quadrant_mass
from scripts.benchlib import equator_grid
from shared.geo import Grid, Region
from shared.mechanisms import PlanarLaplace

FFT_TOL = 1e-10
REL_TOL = 1e-9
ABS_TOL = 1e-13


def density_mass(epsilon: float, x0: float, x1: float, y0: float, y1: float) -> float:
    """Planar Laplace mass of ``[x0, x1] x [y0, y1]`` (centred at the origin), by dblquad.

    The rectangle is split on the axes so the density's cusp is only ever at a corner.
    """

    def density(y, x):
        return epsilon**2 / (2 * math.pi) * math.exp(-epsilon * math.hypot(x, y))

    def pieces(lo, hi):
        if lo < 0 < hi:
            return [(lo, 0.0), (0.0, hi)]
        return [(lo, hi)]

    total = 0.0
    for a, b in pieces(x0, x1):
        for c, d in pieces(y0, y1):
            value, _ = integrate.dblquad(density, a, b, c, d, epsabs=1e-15, epsrel=1e-12)
            total += value
    return total


def assert_mass_close(actual: float, expected: float) -> None:
    assert abs(actual - expected) <= max(REL_TOL * expected, ABS_TOL), (actual, expected)


# -- the kernel ----------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
@pytest.mark.parametrize(("di", "dj"), [(0, 0), (0, 1), (1, 1), (2, -1), (-3, 2)])
def test_kernel_cell_masses_match_direct_integration(epsilon, di, dj):
    rows, cols = 5, 4
    k = kernel(epsilon, 1.0, rows, cols)
    expected = density_mass(epsilon, dj - 0.5, dj + 0.5, di - 0.5, di + 0.5)
    assert_mass_close(k[di + rows, dj + cols], expected)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_kernel_tails_hold_everything_beyond_the_grid(epsilon):
    rows, cols = 3, 4
    k = kernel(epsilon, 1.0, rows, cols)
    inf = math.inf
    # Offset rows + (anything at or beyond `rows` cells north), column offset 0.
    assert_mass_close(k[2 * rows, cols], density_mass(epsilon, -0.5, 0.5, rows - 0.5, inf))
    # West tail, row offset -1.
    assert_mass_close(k[rows - 1, 0], density_mass(epsilon, -inf, -cols + 0.5, -1.5, -0.5))
    # A corner: both beyond.
    corner = density_mass(epsilon, cols - 0.5, inf, rows - 0.5, inf)
    assert_mass_close(k[2 * rows, 2 * cols], corner)
    assert_mass_close(k[0, 0], corner)


def marginal_tail(alpha: float) -> float:
    """``P(X >= alpha)`` for the unit planar Laplace, from its Bessel-function marginal.

    The density of ``X`` is ``(1 / pi) |x| K_1(|x|)`` (integrate ``exp(-r) / (2 pi)``
    over ``y``); its tail is a 1-D integral of a smooth function.
    """
    value, _ = integrate.quad(
        lambda x: x * special.k1(x) / math.pi, alpha, math.inf, epsabs=1e-15, epsrel=1e-13
    )
    return value


def test_quadrant_mass_matches_the_bessel_marginal():
    # S(0, 0) = 1/4 by symmetry; S(a, 0) is half of the marginal tail P(X >= a).
    assert quadrant_mass(0.0, 0.0) == pytest.approx(0.25, abs=1e-15)
    assert marginal_tail(0.0) == pytest.approx(0.5, abs=1e-12)
    for alpha in (0.1, 1.0, 4.0, 20.0):
        half = marginal_tail(alpha) / 2
        assert quadrant_mass(alpha, 0.0) == pytest.approx(half, rel=1e-10, abs=1e-16)
        assert quadrant_mass(0.0, alpha) == pytest.approx(half, rel=1e-10, abs=1e-16)
    assert quadrant_mass(math.inf, 1.0) == 0.0
    assert quadrant_mass(2.0, 3.0) == pytest.approx(quadrant_mass(3.0, 2.0), rel=1e-13)


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 5), (7, 4), (1, 9), (20, 20)])
@pytest.mark.parametrize("epsilon", [0.05, 0.3, 1.0, 5.0])
def test_kernel_is_a_symmetric_distribution(rows, cols, epsilon):
    k = kernel(epsilon, 1.0, rows, cols)
    assert k.shape == (2 * rows + 1, 2 * cols + 1)
    assert k.min() >= 0
    assert k.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(k, k[::-1, :], atol=1e-16)
    np.testing.assert_allclose(k, k[:, ::-1], atol=1e-16)
    if rows == cols:
        np.testing.assert_allclose(k, k.T, atol=1e-15)
    # Inside the tails the mass falls with distance along each axis.
    centre_row = k[rows, cols : 2 * cols]
    assert np.all(np.diff(centre_row) < 0) or cols == 1


# -- the channel: rows, remapping, FFT -----------------------------------------------------

SHAPES = [(3, 5), (7, 4), (1, 9), (9, 1), (6, 6), (1, 1), (2, 13), (2, 2), (31, 17)]


@pytest.fixture(params=["fftw", "scipy"])
def fft_backend(request, monkeypatch):
    """Both transform paths: scipy.fft (the default), and FFTW plans run by compiled loops
    (the ``fast`` extra, which the ``test`` extra installs)."""
    if request.param == "fftw":
        if fftw.load() is None:
            pytest.skip("the fast extra (pyFFTW, numba) is not installed")
    else:
        monkeypatch.setattr(fftw, "load", lambda: None)
    return request.param


@pytest.mark.parametrize(("rows", "cols"), SHAPES)
@pytest.mark.parametrize("epsilon", [0.3, 1.0, 3.0])
def test_fft_operator_equals_the_dense_reference(rows, cols, epsilon, fft_backend):
    channel = PlanarLaplaceChannel(epsilon=epsilon, cell_size_m=1.0, rows=rows, cols=cols)
    dense = channel.dense_reference()
    assert dense.shape == (rows * cols, rows * cols)
    np.testing.assert_allclose(dense.sum(axis=1), 1.0, atol=1e-9)
    rng = np.random.default_rng(rows * 100 + cols)
    for _ in range(3):
        p = rng.dirichlet(np.ones(rows * cols))
        u = rng.normal(size=rows * cols)
        np.testing.assert_allclose(channel.forward(p), p @ dense, rtol=0, atol=FFT_TOL)
        np.testing.assert_allclose(channel.backward(u), dense @ u, rtol=0, atol=FFT_TOL)
    # Unit vectors: every single row and column.
    eye = np.eye(rows * cols)
    for x in range(rows * cols):
        np.testing.assert_allclose(channel.forward(eye[x]), dense[x], atol=FFT_TOL)
        np.testing.assert_allclose(channel.backward(eye[x]), dense[:, x], atol=FFT_TOL)


def test_one_channel_serves_several_threads_at_once(fft_backend):
    # Estimates of one campaign may run in several threads of a worker, sharing its channel.
    channel = PlanarLaplaceChannel(epsilon=0.5, cell_size_m=1.0, rows=24, cols=17)
    rng = np.random.default_rng(5)
    vectors = list(rng.dirichlet(np.ones(24 * 17), size=12))

    def both(v):
        return channel.forward(v), channel.backward(v)

    expected = [both(v) for v in vectors]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(both, vectors * 25))
    for (forward, backward), (want_forward, want_backward) in zip(
        results, expected * 25, strict=True
    ):
        np.testing.assert_array_equal(forward, want_forward)
        np.testing.assert_array_equal(backward, want_backward)


def noisy_counts(channel: PlanarLaplaceChannel, users: int, seed: int) -> np.ndarray:
    """Report counts of a clustered population, with a fifth of the cells never reported."""
    rng = np.random.default_rng(seed)
    truth = rng.dirichlet(np.full(channel.n_inputs, 0.3))
    counts = rng.multinomial(users, channel.forward(truth)).astype(float)
    counts[rng.random(counts.size) < 0.2] = 0.0
    return counts


@pytest.mark.parametrize(("rows", "cols"), [(r, c) for r, c in SHAPES if r > 1 and c > 1])
@pytest.mark.parametrize("epsilon", [0.3, 2.0])
def test_channel_ibu_steps_equal_the_operator_steps(rows, cols, epsilon, fft_backend):
    # The fused steps redo forward and backward's arithmetic; only summation order differs.
    channel = PlanarLaplaceChannel(epsilon=epsilon, cell_size_m=1.0, rows=rows, cols=cols)
    counts = noisy_counts(channel, 5_000, seed=rows * 100 + cols)
    compiled, generic = channel.ibu_steps(counts), IBUSteps(channel, counts)
    assert compiled is not None
    np.testing.assert_allclose(compiled.predicted, generic.predicted, rtol=0, atol=1e-15)
    for steps in (1, 1, 7, 40):
        taken, change = compiled.advance(steps, 0.0)
        assert (taken, change) == pytest.approx(generic.advance(steps, 0.0), rel=1e-9)
        np.testing.assert_allclose(compiled.p, generic.p, rtol=1e-11, atol=1e-15)
        np.testing.assert_allclose(compiled.predicted, generic.predicted, rtol=1e-11, atol=1e-15)
    # The tolerance stops both after the same step.
    assert compiled.advance(10_000, 1e-6) == pytest.approx(generic.advance(10_000, 1e-6), rel=1e-6)
    np.testing.assert_allclose(compiled.p, generic.p, rtol=1e-9, atol=1e-14)


def test_ibu_on_the_compiled_steps_matches_the_default_scipy_steps(monkeypatch):
    if fftw.load() is None:
        pytest.skip("the fast extra (pyFFTW, numba) is not installed")
    channel = PlanarLaplaceChannel(epsilon=0.5, cell_size_m=1.0, rows=12, cols=9)
    counts = noisy_counts(channel, 3_000, seed=3)
    fitted = IBU().fit(counts, channel)
    fixed = MaximumLikelihood(tol=1e-8, max_iter=20_000).fit(counts, channel)
    monkeypatch.setattr(fftw, "load", lambda: None)
    plain = PlanarLaplaceChannel(epsilon=0.5, cell_size_m=1.0, rows=12, cols=9)
    assert isinstance(plain.ibu_steps(counts), planar_steps.IBUSteps)
    assert not isinstance(channel.ibu_steps(counts), planar_steps.IBUSteps)
    fitted_plain = IBU().fit(counts, plain)
    assert fitted.n_iter_ == fitted_plain.n_iter_
    np.testing.assert_allclose(fitted.frequencies_, fitted_plain.frequencies_, atol=1e-13)
    again = MaximumLikelihood(tol=1e-8, max_iter=20_000).fit(counts, plain)
    assert fixed.converged_
    assert (fixed.n_iter_, fixed.converged_) == (again.n_iter_, again.converged_)
    np.testing.assert_allclose(fixed.frequencies_, again.frequencies_, atol=1e-12)
    assert fixed.log_likelihood_ == pytest.approx(again.log_likelihood_, rel=1e-12)


@pytest.mark.parametrize(("rows", "cols"), [(1, 9), (9, 1), (1, 1)])
def test_single_row_or_column_grids_take_the_operator_steps(rows, cols):
    channel = PlanarLaplaceChannel(epsilon=1.0, cell_size_m=1.0, rows=rows, cols=cols)
    assert channel.ibu_steps(np.ones(rows * cols)) is None


def test_channel_ibu_steps_run_in_several_threads_at_once(fft_backend):
    channel = PlanarLaplaceChannel(epsilon=0.4, cell_size_m=1.0, rows=21, cols=15)
    samples = [noisy_counts(channel, 2_000, seed=seed) for seed in range(8)]

    def run(counts):
        steps = channel.ibu_steps(counts)
        steps.advance(60, 0.0)
        return steps.p.copy()

    expected = [run(counts) for counts in samples]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run, samples * 6))
    for result, want in zip(results, expected * 6, strict=True):
        np.testing.assert_array_equal(result, want)


@pytest.mark.parametrize(("x", "y"), [(0, 0), (0, 11), (0, 5), (5, 6), (6, 0), (11, 11), (4, 7)])
def test_channel_entries_match_direct_integration_with_remapping(x, y):
    # An independent construction of C[x, y] on a 3 x 4 grid, epsilon * cell = 1: integrate
    # the density, centred on x's centre, over the set of points remapped into cell y
    # (edge cells reach to infinity).
    rows, cols, epsilon = 3, 4, 1.0
    channel = PlanarLaplaceChannel(epsilon=epsilon, cell_size_m=1.0, rows=rows, cols=cols)
    xr, xc = divmod(x, cols)
    yr, yc = divmod(y, cols)
    centre_x, centre_y = xc + 0.5, xr + 0.5
    x0 = -math.inf if yc == 0 else yc
    x1 = math.inf if yc == cols - 1 else yc + 1
    y0 = -math.inf if yr == 0 else yr
    y1 = math.inf if yr == rows - 1 else yr + 1
    expected = density_mass(epsilon, x0 - centre_x, x1 - centre_x, y0 - centre_y, y1 - centre_y)
    assert_mass_close(channel.dense_reference()[x, y], expected)


def test_channel_for_a_planar_mechanism_uses_its_grid():
    grid = Grid(Region(45.0, 45.004, 7.0, 7.006), 100.0)
    mechanism = PlanarLaplace(epsilon=0.01, grid=grid)
    channel = channel_for(mechanism)
    assert isinstance(channel, PlanarLaplaceChannel)
    assert (channel.rows, channel.cols) == (grid.rows, grid.cols)
    reference = PlanarLaplaceChannel(epsilon=1.0, cell_size_m=1.0, rows=grid.rows, cols=grid.cols)
    # Only epsilon * cell matters.
    np.testing.assert_allclose(channel.kernel, reference.kernel, atol=1e-15)


@pytest.mark.parametrize(("rows", "cols"), [(4, 6), (30, 20)])
def test_operator_is_linear_on_signed_vectors(rows, cols):
    # GMRES and the variance probes apply the operator to vectors with negative entries.
    channel = PlanarLaplaceChannel(epsilon=1.0, cell_size_m=1.0, rows=rows, cols=cols)
    rng = np.random.default_rng(rows)
    a, b = rng.normal(size=(2, rows * cols))
    for apply in (channel.forward, channel.backward):
        np.testing.assert_allclose(apply(a - 2 * b), apply(a) - 2 * apply(b), atol=FFT_TOL)
        np.testing.assert_allclose(apply(-a), -apply(a), atol=FFT_TOL)
    # A distribution's image is a distribution: no negative round-off.
    p = rng.dirichlet(np.full(rows * cols, 0.1))
    assert channel.forward(p).min() >= 0


def test_large_grid_is_solved_by_gmres_on_the_operator():
    rows, cols = 55, 50
    assert rows * cols > DENSE_SOLVE_LIMIT  # the iterative path, never a dense matrix
    channel = PlanarLaplaceChannel(epsilon=1.0, cell_size_m=1.0, rows=rows, cols=cols)
    calls = []
    forward = channel.forward
    channel.forward = lambda v: calls.append(1) or forward(v)
    rng = np.random.default_rng(21)
    p = rng.dirichlet(np.full(rows * cols, 2.0))
    q = forward(p)
    # GMRES stops at a relative residual of 1e-12; this channel's condition number is
    # about (1 + pi^2)^1.5 ~ 36, so the error is below 1e-10, within a few hundred products.
    np.testing.assert_allclose(channel.solve(q), p, atol=1e-10)
    assert len(calls) < 1000
    fitted = MatrixInversion().fit(1e6 * q, channel)
    np.testing.assert_allclose(fitted.unbiased_, p, atol=1e-10)


def test_ibu_steps_are_plain_em_for_30_steps_then_over_relaxed_to_the_same_fit(monkeypatch):
    channel = PlanarLaplaceChannel(epsilon=0.5, cell_size_m=1.0, rows=12, cols=10)
    counts = noisy_counts(channel, 20_000, seed=11)
    relaxed = channel.ibu_steps(counts)
    monkeypatch.setattr(PlanarLaplaceChannel, "ibu_relax_after", None)
    plain = IBUSteps(channel, counts)
    relaxed.advance(30, 0.0)
    plain.advance(30, 0.0)
    np.testing.assert_allclose(relaxed.p, plain.p, rtol=1e-11, atol=1e-15)
    relaxed.advance(1, 0.0)
    plain.advance(1, 0.0)
    assert np.max(np.abs(relaxed.p - plain.p)) > 1e-6
    # Towards the same maximum-likelihood fit, in fewer steps.
    relaxed_taken, _ = relaxed.advance(100_000, 1e-7)
    plain_taken, _ = plain.advance(100_000, 1e-7)
    assert relaxed_taken < 0.8 * plain_taken
    seen = counts > 0

    def log_likelihood(steps) -> float:
        return float(np.sum(counts[seen] * np.log(steps.predicted[seen])))

    # As far up the likelihood (both crawl towards the same maximum by then).
    assert log_likelihood(relaxed) >= log_likelihood(plain) - 1e-6


def test_ibu_never_leaves_a_negative_frequency_from_round_off(fft_backend):
    # Ten reports on 64 x 64 cells at ln 8 per 100 m: the EM factor of cells far from every
    # report is 0 in exact arithmetic and about -1e-17 after the transforms; multiplied into
    # p it left 226 frequencies at -8e-253.
    channel = PlanarLaplaceChannel(epsilon=math.log(8) / 100, cell_size_m=150.0, rows=64, cols=64)
    counts = np.zeros(channel.n_inputs)
    np.add.at(counts, np.random.default_rng(1).integers(0, channel.n_inputs, 10), 1)
    for steps in (channel.ibu_steps(counts), IBUSteps(channel, counts)):
        steps.advance(200, 1e-12)
        assert steps.p.min() >= 0.0
        assert steps.p.sum() == pytest.approx(1.0)


def test_an_inversion_stops_at_the_time_limit_within_a_product():
    # One GMRES solve over 256 x 256 cells of 50 m at ln 2 per 100 m took 39 s here, and its
    # products were not charged: a 30 s limit stopped a 512 x 512 campaign's inversion after
    # 190 s. Each product is charged now, so the limit is checked between them.
    mechanism = PlanarLaplace(epsilon=math.log(2) / 100, grid=equator_grid(256, 256, 50.0))
    channel = channel_for(mechanism)
    counts = np.full(channel.n_outputs, 2.0)
    started = time.perf_counter()
    with pytest.raises(budget.EstimateTimedOut), budget.limited(timeout_s=0.3):
        estimate(mechanism, counts, method="inversion", channel=channel)
    assert time.perf_counter() - started < 2.0
