"""The geometric mechanism: exact samplers, the clamped law, and its d-privacy."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from shared_stats import GOF_ALPHA, chi_square_gof, scalar_counts, small_grid

from aggregator.estimation.ordinal import GeometricChannel, ManhattanGridChannel
from shared.errors import ReportError
from shared.mechanisms import ExponentialGrid, Geometric
from shared.rng import bernoulli_exp_minus, discrete_laplace
from simulate.sampling import sample

N = 100_000


def clamped_row(mechanism: Geometric, x: int) -> np.ndarray:
    """The law stated in the docstring, written out independently of the channel code."""
    a, m = mechanism.alpha, mechanism.n_inputs
    row = np.array([(1 - a) / (1 + a) * a ** abs(y - x) for y in range(m)])
    row[0], row[-1] = a**x / (1 + a), a ** (m - 1 - x) / (1 + a)
    return row


@pytest.mark.parametrize(("numerator", "denominator"), [(0, 1), (3, 10), (1, 1), (5, 2), (7, 3)])
def test_bernoulli_exp_minus_has_the_exact_probability(numerator, denominator):
    rng = random.Random(numerator * 100 + denominator)
    hits = sum(bernoulli_exp_minus(rng, numerator, denominator) for _ in range(N))
    p = math.exp(-numerator / denominator)
    # Five standard errors: a correct sampler fails this with probability below 1e-6.
    assert abs(hits / N - p) <= 5 * math.sqrt(p * (1 - p) / N) + 1e-12


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.7])
def test_discrete_laplace_matches_its_law(epsilon):
    rng = random.Random(int(epsilon * 1000))
    draws = np.array([discrete_laplace(rng, epsilon) for _ in range(N)])
    span = int(np.abs(draws).max())
    support = np.arange(-span - 1, span + 2)
    a = math.exp(-epsilon)
    law = (1 - a) / (1 + a) * a ** np.abs(support)
    law[0] += a ** (span + 2) / (1 + a)  # the tails beyond what was drawn, pooled at the ends
    law[-1] += a ** (span + 2) / (1 + a)
    counts = np.array([(draws == z).sum() for z in support])
    fit = chi_square_gof(counts, law / law.sum())
    assert fit.p_value > GOF_ALPHA, fit
    # and it is symmetric: as many draws above 0 as below, within 5 standard errors
    assert abs((draws > 0).sum() - (draws < 0).sum()) < 5 * math.sqrt(N)


@pytest.mark.parametrize(
    ("epsilon", "lo", "hi", "inputs"),
    [(0.5, 0, 10, (0, 3, 10)), (0.05, -20, 20, (-20, 0, 17)), (4.0, 1, 5, (1, 3))],
)
def test_device_sampler_follows_the_clamped_law(epsilon, lo, hi, inputs):
    mechanism = Geometric(epsilon=epsilon, lo=lo, hi=hi)
    for value in inputs:
        x = mechanism.encode(value)
        counts = scalar_counts(mechanism, x, N, seed=7 + x)
        fit = chi_square_gof(counts, clamped_row(mechanism, x))
        assert fit.p_value > GOF_ALPHA, (value, fit)


def test_vectorised_sampler_follows_the_clamped_law():
    mechanism = Geometric(epsilon=0.3, lo=0, hi=30)
    generator = np.random.default_rng(3)
    for x in (0, 12, 30):
        counts = np.bincount(sample(mechanism, np.full(N, x), generator), minlength=31)
        fit = chi_square_gof(counts, clamped_row(mechanism, x))
        assert fit.p_value > GOF_ALPHA, (x, fit)


def test_a_wrong_epsilon_is_detected():
    # Negative control: the same test refuses draws made with epsilon 10% off.
    truth, wrong = Geometric(epsilon=0.5, lo=0, hi=10), Geometric(epsilon=0.55, lo=0, hi=10)
    counts = scalar_counts(wrong, 3, N, seed=11)
    assert chi_square_gof(counts, clamped_row(truth, 3)).p_value < GOF_ALPHA


@pytest.mark.parametrize(("epsilon", "m"), [(0.3, 2), (0.5, 11), (0.05, 60), (8.0, 40)])
def test_channel_is_the_clamped_law_and_epsilon_per_unit_holds_everywhere(epsilon, m):
    mechanism = Geometric(epsilon=epsilon, lo=100, hi=100 + m - 1)
    dense = GeometricChannel(mechanism).to_dense()
    expected = np.stack([clamped_row(mechanism, x) for x in range(m)])
    np.testing.assert_allclose(dense, expected, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(dense.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(
        GeometricChannel(mechanism).diagonal(), np.diag(expected), rtol=1e-12
    )
    # d-privacy, ends included: log C[x, y] - log C[x', y] <= epsilon |x - x'| for all x, x', y.
    logs = np.log(expected)
    distance = np.abs(np.subtract.outer(np.arange(m), np.arange(m)))
    for y in range(m):
        loss = logs[:, y][:, None] - logs[:, y][None, :]
        assert np.all(loss <= epsilon * distance * (1 + 1e-12) + 1e-12)
    # and the bound is attained (the mechanism gives no more privacy than it says)
    assert np.isclose((logs[0, 0] - logs[1, 0]), epsilon)


def test_channel_products_match_the_matrix_on_batches():
    mechanism = Geometric(epsilon=0.2, lo=0, hi=29)
    channel = GeometricChannel(mechanism)
    dense = channel.to_dense()
    batch = np.random.default_rng(0).random((4, 30))
    np.testing.assert_allclose(channel.forward(batch), batch @ dense, atol=1e-13)
    np.testing.assert_allclose(channel.backward(batch), batch @ dense.T, atol=1e-13)


def test_values_outside_the_range_or_not_integers_are_refused():
    mechanism = Geometric(epsilon=1.0, lo=0, hi=120)
    assert mechanism.encode(120) == 120
    for bad in (-1, 121, 3.0, True, "3"):
        with pytest.raises(ReportError):
            mechanism.encode(bad)
        with pytest.raises(ReportError):
            mechanism.parse_report_value(bad)
    with pytest.raises(ValueError):
        Geometric(epsilon=1.0, lo=5, hi=5)
    with pytest.raises(TypeError):
        Geometric(epsilon=1.0, lo=0.0, hi=5)


# -- the Manhattan exponential mechanism on a grid ----------------------------------------

GRID = small_grid(6, 5, 100.0)  # 6 rows x 5 columns of 100 m cells
GRID_EPSILON = 0.008  # per metre: 0.8 per cell step


def grid_row(mechanism: ExponentialGrid, x: int) -> np.ndarray:
    """The product of the two clamped laws, one per axis, written out."""
    rows, cols = mechanism.grid.rows, mechanism.grid.cols
    step = Geometric(epsilon=float(mechanism.step_epsilon), lo=0, hi=rows - 1)
    across = Geometric(epsilon=float(mechanism.step_epsilon), lo=0, hi=cols - 1)
    i, j = divmod(x, cols)
    return np.outer(clamped_row(step, i), clamped_row(across, j)).ravel()


def test_grid_device_sampler_follows_the_clamped_product_law():
    mechanism = ExponentialGrid(epsilon=GRID_EPSILON, grid=GRID)
    for x in (0, 2, 12, 29):
        counts = scalar_counts(mechanism, x, N, seed=30 + x)
        fit = chi_square_gof(counts, grid_row(mechanism, x))
        assert fit.p_value > GOF_ALPHA, (x, fit)


def test_grid_vectorised_sampler_follows_the_clamped_product_law():
    mechanism = ExponentialGrid(epsilon=GRID_EPSILON, grid=GRID)
    generator = np.random.default_rng(9)
    for x in (0, 12, 29):
        draws = sample(mechanism, np.full(N, x), generator)
        fit = chi_square_gof(np.bincount(draws, minlength=30), grid_row(mechanism, x))
        assert fit.p_value > GOF_ALPHA, (x, fit)


def test_grid_channel_is_the_product_law_and_epsilon_per_metre_of_manhattan_distance_holds():
    mechanism = ExponentialGrid(epsilon=GRID_EPSILON, grid=GRID)
    channel = ManhattanGridChannel(mechanism)
    dense = channel.to_dense()
    expected = np.stack([grid_row(mechanism, x) for x in range(30)])
    np.testing.assert_allclose(dense, expected, rtol=1e-12)
    batch = np.random.default_rng(1).random((3, 30))
    np.testing.assert_allclose(channel.backward(batch), batch @ dense.T, atol=1e-13)
    rows, cols = np.divmod(np.arange(30), GRID.cols)
    metres = 100.0 * (np.abs(np.subtract.outer(rows, rows)) + np.abs(np.subtract.outer(cols, cols)))
    logs = np.log(expected)
    worst = 0.0
    for z in range(30):
        loss = logs[:, z][:, None] - logs[:, z][None, :]
        off = metres > 0
        worst = max(worst, float((loss[off] / metres[off]).max()))
    assert worst <= GRID_EPSILON * (1 + 1e-12)
    assert worst >= GRID_EPSILON * (1 - 1e-9)  # attained: no more privacy than stated


def test_grid_step_epsilon_is_the_exact_product():
    mechanism = ExponentialGrid(epsilon=0.1, grid=small_grid(3, 3, 0.3))
    assert mechanism.step_epsilon == Fraction(0.1) * Fraction(0.3)  # not the rounded 0.1 * 0.3
