"""The exponential mechanism on a grid: the Euclidean sampler's integer arithmetic, the
vectorised samplers and the channels as operators (the privacy audit is in
test_shared_exponential_grid_privacy.py)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from shared_stats import GOF_ALPHA, chi_square_gof, small_grid
from test_shared_exponential_grid_privacy import log_law

from aggregator.estimation import GridKernelChannel, ManhattanKernelChannel, channel_for
from aggregator.estimation.grid_kernel import euclidean_kernel, mean_displacement_cells
from aggregator.estimation.ordinal import ManhattanGridChannel
from shared.mechanisms import INV_SQRT2_BELOW, ROOT_BITS, ExponentialGrid, ceil_root
from shared.spec import EUCLIDEAN, GRID_METRICS, MANHATTAN
from simulate.sampling import sample


@pytest.mark.parametrize("square", [0, 1, 2, 3, 4, 5, 8, 9, 10**6, 10**12 + 1, 2**61 - 1])
def test_ceil_root_is_the_least_multiple_of_its_unit_at_or_above_the_root(square):
    root = ceil_root(square)
    unit = Fraction(1, 1 << ROOT_BITS)
    assert root * root >= square
    assert (root - unit) < 0 or (root - unit) ** 2 < square
    if math.isqrt(square) ** 2 == square:
        assert root == math.isqrt(square)


def test_the_proposal_rate_is_below_a_over_sqrt_2_so_every_acceptance_exponent_is_non_negative():
    assert Fraction(1, 2) >= INV_SQRT2_BELOW**2
    assert Fraction(1, 2) - INV_SQRT2_BELOW**2 < Fraction(1, 1 << (ROOT_BITS - 1))
    mechanism = ExponentialGrid(epsilon=0.0071, grid=small_grid(3, 3, 137.0), metric=EUCLIDEAN)
    for di in range(-30, 31):
        for dj in range(-30, 31):
            excess = mechanism.sample_step * ceil_root(di * di + dj * dj)
            excess -= mechanism.proposal_step * (abs(di) + abs(dj))
            assert excess >= 0
    # The sampler's step is paid for the rounding: a_s (1 + 2**-64) is exactly a.
    scale = Fraction(1 << ROOT_BITS)
    assert mechanism.sample_step * (1 + 1 / scale) == mechanism.step_epsilon


def test_euclidean_offsets_follow_the_lattice_law_near_the_origin():
    mechanism = ExponentialGrid(epsilon=0.008, grid=small_grid(3, 3, 100.0), metric=EUCLIDEAN)
    rng = random.Random(3)
    n, reach = 40_000, 3
    counts = np.zeros((2 * reach + 1, 2 * reach + 1))
    for _ in range(n):
        di, dj = mechanism.offset(rng)
        counts[min(max(di, -reach), reach) + reach, min(max(dj, -reach), reach) + reach] += 1
    law = euclidean_kernel(0.8, reach, reach)  # the lattice law folded at `reach` cells
    assert chi_square_gof(counts.ravel(), law.ravel()).p_value > GOF_ALPHA


@pytest.mark.parametrize("metric", GRID_METRICS)
def test_vectorised_sampler_follows_the_clamped_law(metric):
    grid = small_grid(4, 3, 100.0)
    mechanism = ExponentialGrid(epsilon=0.006, grid=grid, metric=metric)
    law = np.exp(log_law(0.6, 4, 3, metric))
    generator = np.random.default_rng(11)
    for x in (0, 4, 11):
        draws = sample(mechanism, np.full(40_000, x), generator)
        fit = chi_square_gof(np.bincount(draws, minlength=12), law[x])
        assert fit.p_value > GOF_ALPHA, (x, fit)


def test_euclidean_channel_products_match_the_dense_reference_on_a_larger_grid():
    mechanism = ExponentialGrid(epsilon=0.004, grid=small_grid(9, 7, 150.0), metric=EUCLIDEAN)
    channel = channel_for(mechanism)
    assert isinstance(channel, GridKernelChannel)
    dense = channel.dense_reference()
    np.testing.assert_allclose(dense.sum(axis=1), 1.0, atol=1e-12)
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.ones(63))
    u = rng.random(63)
    np.testing.assert_allclose(channel.forward(p), p @ dense, atol=1e-14)
    np.testing.assert_allclose(channel.backward(u), dense @ u, atol=1e-13)
    np.testing.assert_allclose(channel.row_of(17), dense[17], atol=1e-16)


def test_euclidean_kernel_needs_no_more_than_its_radius():
    # The mass summed beyond 46 / a cells is below 1e-18: a wider sum changes nothing.
    kernel = euclidean_kernel(0.3, 5, 4)
    assert kernel.sum() == pytest.approx(1.0, abs=1e-15)
    assert kernel[5, 4] == pytest.approx(
        1.0
        / sum(
            math.exp(-0.3 * math.hypot(i, j)) for i in range(-400, 401) for j in range(-400, 401)
        ),
        rel=1e-12,
    )


def test_manhattan_channel_inverts_exactly_with_its_variance():
    mechanism = ExponentialGrid(epsilon=0.005, grid=small_grid(6, 5, 100.0), metric=MANHATTAN)
    channel = channel_for(mechanism)
    assert isinstance(channel, ManhattanKernelChannel)
    dense = channel.to_dense()
    # The FFT products on the product kernel are the separable filters' products.
    separable = ManhattanGridChannel(mechanism)
    np.testing.assert_allclose(dense, separable.to_dense(), atol=1e-15)
    p = np.random.default_rng(5).dirichlet(np.ones(30))
    np.testing.assert_allclose(channel.forward(p), separable.forward(p), atol=1e-15)
    np.testing.assert_allclose(channel.backward(p), separable.backward(p), atol=1e-15)
    q = np.random.default_rng(4).dirichlet(np.ones(30))
    solution, converged = channel.solve_with_info(q)
    assert converged
    np.testing.assert_allclose(solution @ dense, q, atol=1e-13)
    inverse_t = np.linalg.inv(dense).T  # M = C^-T: M[x, y] = (C^-1)[y, x]
    np.testing.assert_allclose(channel.inversion_second_moment(q), (inverse_t**2) @ q, rtol=1e-9)


def test_a_single_row_grid_is_one_axis():
    mechanism = ExponentialGrid(epsilon=0.01, grid=small_grid(1, 6, 100.0), metric=MANHATTAN)
    dense = channel_for(mechanism).to_dense()
    np.testing.assert_allclose(dense.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(dense, np.exp(log_law(1.0, 1, 6, MANHATTAN)), rtol=1e-12)


def test_metric_is_checked():
    with pytest.raises(ValueError, match="metric"):
        ExponentialGrid(epsilon=0.01, grid=small_grid(2, 2, 100.0), metric="chebyshev")


@pytest.mark.parametrize("metric", GRID_METRICS)
@pytest.mark.parametrize("step", [0.05, 0.75, 3.0])
def test_mean_displacement_is_the_lattice_laws_mean_distance(metric, step):
    radius = math.ceil(60 / step)
    offsets = np.arange(-radius, radius + 1)
    di, dj = np.meshgrid(offsets, offsets, indexing="ij")
    euclidean = np.hypot(di, dj)
    score = euclidean if metric == EUCLIDEAN else np.abs(di) + np.abs(dj)
    weights = np.exp(-step * score)
    expected = float((weights * euclidean).sum() / weights.sum())
    assert mean_displacement_cells(step, metric) == pytest.approx(expected, rel=1e-9)
    if metric == EUCLIDEAN and step == 0.05:
        assert mean_displacement_cells(step, metric) == pytest.approx(2 / step, rel=0.01)
