"""k-RR over a grid: the spatial smoothing estimator (measured, not the default).

Reports come from fixed seeds, so every assertion is a fixed computation; the
margins are those measured on these seeds (``scripts/bench_krr_grid.py`` gives
the wider comparison).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.ndimage import gaussian_filter1d

from aggregator.estimation import budget, channel_for
from aggregator.estimation.estimators import empirical_bayes
from scripts.benchlib import spiky_city
from scripts.krr_grid import KRRGridSmoothing, smooth
from shared.geo import Grid
from shared.mechanisms import KRR
from simulate.metrics import earth_movers_distance
from simulate.populations import Population, cell_labels
from simulate.reproduce import square_region
from simulate.sampling import sample


def planar_grid(side_m: float, cell_m: float) -> Grid:
    # A hair under the side, so that rounding cannot add a row of cells.
    return Grid(square_region(37.7749, -122.4194, side_m - 0.01), cell_m)


def grid_reports(side: int, epsilon: float, n: int, seed: int):
    """k-RR reports over a ``side x side`` clustered city of 100 m cells."""
    grid = planar_grid(side * 100.0, 100.0)
    truth = Population.clustered_city(grid, seed=2024).probabilities
    mechanism = KRR(epsilon=epsilon, domain=list(cell_labels(grid)))
    generator = np.random.default_rng(seed)
    users = np.repeat(np.arange(truth.size), generator.multinomial(n, truth))
    counts = np.bincount(sample(mechanism, users, generator), minlength=truth.size)
    return (
        grid,
        channel_for(mechanism),
        counts.astype(float),
        np.bincount(users, minlength=truth.size) / n,
    )


@pytest.mark.parametrize(("rows", "cols", "bandwidth"), [(7, 5, 1.5), (20, 20, 2.0), (4, 9, 6.0)])
def test_smoothing_keeps_the_mass_and_is_the_renormalised_kernel(rows, cols, bandwidth):
    p = np.random.default_rng(1).random(rows * cols)
    smoothed = smooth(p, rows, cols, bandwidth)
    assert smoothed.sum() == pytest.approx(p.sum(), rel=1e-12)

    def axis(size):  # column i: where cell i's mass goes
        spread = gaussian_filter1d(np.eye(size), bandwidth, axis=0, mode="constant", truncate=4)
        return spread / spread.sum(axis=0, keepdims=True)

    np.testing.assert_allclose(smoothed, np.kron(axis(rows), axis(cols)) @ p, atol=1e-15)


def test_without_structure_it_is_the_default_exactly():
    """A uniform truth at epsilon ln 2: no bandwidth passes the test; the estimate is
    k-RR's empirical Bayes default, bit for bit."""
    grid = planar_grid(2000.0, 100.0)
    mechanism = KRR(epsilon=math.log(2), domain=list(cell_labels(grid)))
    generator = np.random.default_rng(3)
    users = generator.integers(0, grid.n_cells, 1000)
    counts = np.bincount(sample(mechanism, users, generator), minlength=grid.n_cells)
    channel = channel_for(mechanism)
    fitted = KRRGridSmoothing(grid.rows, grid.cols).fit(counts, channel)
    assert fitted.bandwidth_ == 0.0 and fitted.weight_ is None
    default = empirical_bayes(channel).fit(counts, channel).frequencies_
    np.testing.assert_array_equal(fitted.frequencies_, default)
    assert "no spatial structure" in fitted.describe()
    assert np.all(fitted.p_values_ > 0.01)


def test_with_spatial_structure_it_smooths_and_beats_the_raw_shares():
    """Clustered city over 20 x 20 cells, epsilon ln 8, 10^5 reports, seed 0: the test finds
    structure at 1.5 cells (p = 1e-4) and the estimate's EMD is 0.888 of the raw shares'
    (measured; asserted below 0.92)."""
    grid, channel, counts, users = grid_reports(20, math.log(8), 100_000, 0)
    fitted = KRRGridSmoothing(grid.rows, grid.cols).fit(counts, channel)
    assert fitted.bandwidth_ == 1.5
    assert 0 < fitted.weight_ < 1
    assert fitted.frequencies_.sum() == pytest.approx(1.0)
    assert np.all(fitted.frequencies_ >= 0)
    smoothed = earth_movers_distance(users, fitted.frequencies_, grid)
    raw = earth_movers_distance(users, counts / counts.sum(), grid)
    assert smoothed is not None and raw is not None
    assert smoothed < 0.92 * raw
    assert "Gaussian of 1.5 cells" in fitted.describe()


def test_cross_validated_selection_runs_and_reports_its_scores():
    grid, channel, counts, _ = grid_reports(20, math.log(8), 10_000, 0)
    fitted = KRRGridSmoothing(grid.rows, grid.cols, selection="cv", bandwidths=(1.0, 2.0))
    fitted.fit(counts, channel)
    assert fitted.cv_scores_.shape == (3,)
    assert fitted.bandwidth_ in (0.0, 1.0, 2.0)
    assert fitted.frequencies_.sum() == pytest.approx(1.0)


def test_the_work_is_charged_to_the_budget():
    """The smoothing's work is charged beyond the default's, and a cap stops it."""
    grid, channel, counts, _ = grid_reports(20, math.log(8), 10_000, 0)
    with budget.limited():  # empirical Bayes as the smoothing runs it (without the check)
        empirical_bayes(channel).make().fit(counts, channel)
        default_work = budget.spent()
    with budget.limited():
        KRRGridSmoothing(grid.rows, grid.cols).fit(counts, channel)
        grid_work = budget.spent()
    assert grid_work > default_work + 7 * grid.n_cells
    with budget.limited(max_work=default_work + 1), pytest.raises(budget.WorkLimitExceeded):
        KRRGridSmoothing(grid.rows, grid.cols).fit(counts, channel)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rows": 0, "cols": 4},
        {"rows": 4, "cols": 4, "bandwidths": (0.0,)},
        {"rows": 4, "cols": 4, "selection": "best"},
        {"rows": 4, "cols": 4, "alpha": 1.0},
        {"rows": 4, "cols": 4, "margin": -1.0},
    ],
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        KRRGridSmoothing(**kwargs)


def test_counts_must_match_the_grid():
    channel = channel_for(KRR(epsilon=1.0, domain=[f"c{i}" for i in range(12)]))
    with pytest.raises(ValueError, match="3 x 3"):
        KRRGridSmoothing(3, 3).fit(np.ones(12), channel)


def test_where_the_label_only_default_finds_structure_it_is_kept():
    """A spiky city (40 hotspots of 20-60 m over 100 m cells), epsilon ln 8, 10^5 reports:
    the empirical Bayes prior is supported and the reports resolve single cells, so nothing
    is smoothed (smoothing there doubled the EMD of the default in the benchmark)."""
    grid = planar_grid(2000.0, 100.0)
    truth = spiky_city(grid, seed=2024).probabilities
    mechanism = KRR(epsilon=math.log(8), domain=list(cell_labels(grid)))
    generator = np.random.default_rng(0)
    users = np.repeat(np.arange(truth.size), generator.multinomial(100_000, truth))
    counts = np.bincount(sample(mechanism, users, generator), minlength=truth.size)
    channel = channel_for(mechanism)
    fitted = KRRGridSmoothing(grid.rows, grid.cols).fit(counts, channel)
    assert fitted.default_.weight_ == 1.0
    assert fitted.bandwidth_ == 0.0 and fitted.p_values_ is None
    np.testing.assert_array_equal(fitted.frequencies_, fitted.default_.frequencies_)
    assert "resolve single cells" in fitted.describe()
