"""Norm-Sub smoothed over neighbouring cells: k-RR and OLH over a region's cells."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.estimation import channel_for, project_to_simplex
from aggregator.estimation.smoothing import (
    BANDWIDTHS_CELLS,
    GridSmoother,
    SmoothedProjection,
    kernel_matrix,
)
from scripts.benchlib import equator_grid
from shared.mechanisms import KRR
from shared.oracles import OLH
from simulate.populations import Population
from simulate.sampling import sample

ROWS, COLS = 12, 10


def reports(mechanism, truth: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    users = generator.choice(truth.size, size=n, p=truth)
    counts = np.bincount(sample(mechanism, users, generator), minlength=mechanism.n_outputs)
    return counts.astype(float), np.bincount(users, minlength=truth.size) / n


def city() -> np.ndarray:
    return Population.clustered_city(equator_grid(ROWS, COLS, 150.0), seed=11).probabilities


def test_smoothing_keeps_each_cell_s_mass_inside_the_grid():
    for bandwidth in BANDWIDTHS_CELLS:
        kernel = kernel_matrix(7, bandwidth)
        np.testing.assert_allclose(kernel.sum(axis=1), 1.0)
    p = np.random.default_rng(0).dirichlet(np.ones(ROWS * COLS), size=3)
    smoothed = GridSmoother(ROWS, COLS, 2.0)(p)
    np.testing.assert_allclose(smoothed.sum(axis=1), 1.0)
    assert np.all(smoothed >= 0)
    # Separable: each row of the matrix is smoothed alone.
    np.testing.assert_allclose(smoothed[1], GridSmoother(ROWS, COLS, 2.0)(p[1]))
    np.testing.assert_array_equal(GridSmoother(ROWS, COLS, 0.0)(p), p)


def test_a_clustered_city_is_smoothed_and_closer_to_its_users():
    """k-RR at ln 8 over 120 cells with 3,000 users: cross-validation smooths, and the
    estimate is nearer the users' own distribution than Norm-Sub on every seed."""
    mechanism = KRR(epsilon=float(np.log(8)), domain=[f"c{i}" for i in range(ROWS * COLS)])
    channel = channel_for(mechanism)
    truth = city()
    for seed in range(4):
        counts, users = reports(mechanism, truth, 3000, seed)
        fitted = SmoothedProjection(ROWS, COLS, seed=seed).fit(counts, channel)
        assert fitted.bandwidth_ > 0
        assert fitted.headline().startswith("Norm-Sub smoothed over ")
        plain = SmoothedProjection(ROWS, COLS).fit(counts, channel)
        unsmoothed = plain._fit_width(counts, channel, 0.0)
        error = np.abs(fitted.frequencies_ - users).sum()
        assert error < np.abs(unsmoothed - users).sum(), seed
        np.testing.assert_allclose(fitted.replay(counts, channel), fitted.frequencies_)


def test_no_spatial_structure_chooses_no_smoothing():
    """The city's cell shares shuffled over the grid (the same values, no neighbourhood),
    100,000 reports at ln 30: cross-validation chooses no smoothing, and the estimate is
    Norm-Sub itself. (With 20,000 reports it takes a width of half a cell, 2 nats above none:
    a little shrinkage lowers the noise even without neighbours to borrow from.)"""
    mechanism = KRR(epsilon=float(np.log(30)), domain=[f"c{i}" for i in range(ROWS * COLS)])
    channel = channel_for(mechanism)
    shuffled = np.random.default_rng(5).permutation(city())
    chosen = []
    for seed in range(4):
        counts, _ = reports(mechanism, shuffled, 100_000, seed)
        fitted = SmoothedProjection(ROWS, COLS, seed=seed).fit(counts, channel)
        chosen.append(fitted.bandwidth_)
        if fitted.bandwidth_ == 0:
            assert fitted.headline() == "Norm-Sub, not smoothed (10-fold cross-validation)"
            np.testing.assert_allclose(fitted.frequencies_, project_to_simplex(fitted.unbiased_))
    assert chosen == [0.0] * 4, chosen


def test_olh_over_cells_is_smoothed_through_its_own_channel():
    mechanism = OLH(epsilon=float(np.log(8)), domain_size=ROWS * COLS)
    channel = channel_for(mechanism)
    counts, _ = reports(mechanism, city(), 3000, 0)
    fitted = SmoothedProjection(ROWS, COLS).fit(counts, channel)
    assert fitted.frequencies_.sum() == pytest.approx(1.0)
    assert set(fitted.details()["held_out_log_likelihood"]) == {f"{b:g}" for b in BANDWIDTHS_CELLS}


def test_too_few_reports_are_not_smoothed_and_say_so():
    mechanism = KRR(epsilon=1.0, domain=[f"c{i}" for i in range(ROWS * COLS)])
    counts = np.zeros(ROWS * COLS)
    counts[3] = 1
    fitted = SmoothedProjection(ROWS, COLS).fit(counts, channel_for(mechanism))
    assert fitted.bandwidth_ == 0
    assert "too few reports" in fitted.headline() and fitted.warnings_
    with pytest.raises(ValueError, match="inputs"):
        SmoothedProjection(3, 3).fit(counts, channel_for(mechanism))
