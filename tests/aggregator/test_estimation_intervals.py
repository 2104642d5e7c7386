"""Confidence intervals cover the truth at about their stated rate.

Each test simulates ``REPS`` independent surveys: true values drawn i.i.d.
from ``p``, perturbed by the mechanism's vectorised sampler, estimated with
95 % intervals. Tolerances: with ``R`` repetitions the coverage of one
category has standard error ``sqrt(0.95 * 0.05 / R)`` (0.0126 at R = 300),
so a correct 95 % interval covers in 90-99 % of them except with
probability below 1e-4 (the band is more than 3.7 standard errors wide on
either side). The coverage pooled over all categories has a smaller
standard error and must lie in 92-98 %.
"""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.estimation import PlanarLaplaceChannel, channel_for, estimate
from aggregator.estimation.channels import DENSE_SOLVE_LIMIT
from aggregator.estimation.intervals import inversion_variance
from shared.geo import EARTH_RADIUS_M, Grid, Region
from shared.mechanisms import KRR, PlanarLaplace

CONFIDENCE = 0.95
PER_CATEGORY = (0.90, 0.99)
POOLED = (0.92, 0.98)
N_BOOTSTRAP = 100


def grid_3x3() -> Grid:
    """Three by three cells of 100 m (the region is a little short of 300 m each way)."""
    per_deg = EARTH_RADIUS_M * np.pi / 180
    span = 250.0 / per_deg
    grid = Grid(Region(0.0, span, 0.0, span), 100.0)
    assert (grid.rows, grid.cols) == (3, 3)
    return grid


def coverage(mechanism, p, n, reps, method, seed, **kwargs) -> np.ndarray:
    """Per repetition and category: did the interval cover ``p``?"""
    generator = np.random.default_rng(seed)
    channel = channel_for(mechanism)
    covered = np.empty((reps, p.size), dtype=bool)
    for rep in range(reps):
        x = generator.choice(p.size, size=n, p=p)
        counts = np.bincount(mechanism.sample(x, generator), minlength=mechanism.n_outputs)
        result = estimate(
            mechanism,
            counts,
            method=method,
            confidence=CONFIDENCE,
            seed=rep,
            channel=channel,
            **kwargs,
        )
        covered[rep] = (result.ci_low <= p) & (p <= result.ci_high)
    return covered


def assert_coverage(covered: np.ndarray) -> None:
    per_category = covered.mean(axis=0)
    assert np.all(per_category >= PER_CATEGORY[0]), per_category
    assert np.all(per_category <= PER_CATEGORY[1]), per_category
    assert POOLED[0] <= covered.mean() <= POOLED[1], covered.mean()


def test_analytic_interval_coverage_krr():
    mechanism = KRR(epsilon=1.0, domain=["a", "b", "c", "d"])
    p = np.array([0.4, 0.3, 0.2, 0.1])
    assert_coverage(coverage(mechanism, p, n=5000, reps=400, method="inversion", seed=1))


def test_analytic_interval_coverage_planar():
    mechanism = PlanarLaplace(epsilon=0.015, grid=grid_3x3())  # epsilon * cell = 1.5
    p = np.array([0.25, 0.15, 0.05, 0.12, 0.1, 0.08, 0.05, 0.1, 0.1])
    assert_coverage(coverage(mechanism, p, n=20_000, reps=300, method="inversion", seed=2))


@pytest.mark.parametrize("method", ["clip", "projection", "ibu"])
def test_bootstrap_interval_coverage_krr(method):
    # Every category well above zero, so clipping and projection are rarely active.
    mechanism = KRR(epsilon=2.0, domain=["a", "b", "c"])
    p = np.array([0.5, 0.3, 0.2])
    covered = coverage(
        mechanism, p, n=3000, reps=300, method=method, seed=3, n_bootstrap=N_BOOTSTRAP
    )
    assert_coverage(covered)


def test_analytic_variance_matches_the_simulated_variance():
    # The formula itself: the inversion estimate's variance over 2000 surveys
    # matches the analytic one (variance of a sample variance: relative sd sqrt(2 / 2000),
    # about 3 %; 15 % is 4.7 of them).
    mechanism = PlanarLaplace(epsilon=0.015, grid=grid_3x3())
    channel = channel_for(mechanism)
    assert isinstance(channel, PlanarLaplaceChannel)
    p = np.array([0.25, 0.15, 0.05, 0.12, 0.1, 0.08, 0.05, 0.1, 0.1])
    n = 20_000
    q = channel.forward(p)
    generator = np.random.default_rng(4)
    estimates = np.array([channel.solve(generator.multinomial(n, q) / n) for _ in range(2000)])
    analytic = inversion_variance(n * q, channel, p)
    np.testing.assert_allclose(estimates.var(axis=0), analytic, rtol=0.15)
    np.testing.assert_allclose(estimates.mean(axis=0), p, atol=4 * np.sqrt(analytic / 2000).max())


@pytest.mark.slow
def test_probe_variance_matches_the_exact_variance_on_a_large_grid():
    # Above DENSE_SOLVE_LIMIT the variance comes from 64 random-sign probes, each a GMRES
    # solve. Each cell's estimate is an average of 64 squares, relative sd at most
    # sqrt(2 / 64) = 0.18: every ratio to the exact variance lies in [0.3, 2] (about 4 sd),
    # and the mean ratio over 2550 cells is within 10 % of 1.
    rows, cols = 51, 50
    channel = PlanarLaplaceChannel(epsilon=1.0, cell_size_m=1.0, rows=rows, cols=cols)
    assert rows * cols > DENSE_SOLVE_LIMIT
    p = np.random.default_rng(5).dirichlet(np.full(rows * cols, 2.0))
    n = 1e6
    q = channel.forward(p)
    probed = inversion_variance(n * q, channel, p, seed=0)
    inverse = np.linalg.inv(channel.dense_reference())
    # p = q C^-1, so p_x = sum_y q_y (C^-1)[y, x].
    exact = (np.square(inverse.T) @ q - p**2) / n
    ratio = probed / exact
    assert ratio.min() >= 0.3 and ratio.max() <= 2.0, (ratio.min(), ratio.max())
    assert abs(ratio.mean() - 1) <= 0.1, ratio.mean()
