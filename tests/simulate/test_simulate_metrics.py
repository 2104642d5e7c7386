"""Accuracy metrics; the earth mover's distance against an independent LP solution."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.optimize
import scipy.stats

from aggregator.estimation.distance import cell_centres_m, earth_movers_distance
from shared.geo import Grid, Region
from simulate.metrics import kl_divergence, score

GRID = Grid(Region(48.10, 48.13, 11.50, 11.54), 500.0)


def test_distances_between_two_distributions_follow_their_definitions():
    truth = np.array([0.5, 0.5, 0.0])
    estimate = np.array([0.7, 0.1, 0.2])
    s = score(truth, estimate)
    assert math.isclose(s.tv, (0.2 + 0.4 + 0.2) / 2)
    assert math.isclose(s.mse, (0.04 + 0.16 + 0.04) / 3)
    assert math.isclose(s.max_abs, 0.4)
    assert math.isclose(s.kl, scipy.stats.entropy(truth, estimate))
    assert s.emd_m is None  # no grid


def test_kl_is_undefined_where_the_estimate_misses_the_truth():
    assert kl_divergence(np.array([0.5, 0.5]), np.array([1.0, 0.0])) is None
    assert kl_divergence(np.array([0.5, 0.5]), np.array([1.2, -0.2])) is None
    # Zero truth where the estimate is positive is fine.
    assert kl_divergence(np.array([1.0, 0.0]), np.array([0.5, 0.5])) == pytest.approx(math.log(2))


def point_mass(index: int) -> np.ndarray:
    v = np.zeros(GRID.n_cells)
    v[index] = 1.0
    return v


def test_emd_of_point_masses_is_the_distance_between_cell_centres():
    a, b = 0, GRID.cols * 2 + 3  # two rows up, three columns right
    expected = GRID.cell_size_m * math.hypot(2, 3)
    assert earth_movers_distance(point_mass(a), point_mass(b), GRID) == pytest.approx(expected)
    assert earth_movers_distance(point_mass(a), point_mass(a), GRID) == pytest.approx(0.0)


def lp_emd(p: np.ndarray, q: np.ndarray) -> float:
    """The transport LP solved by HiGHS, as an independent reference."""
    centres = cell_centres_m(GRID)
    cost = np.linalg.norm(centres[:, None, :] - centres[None, :, :], axis=2)
    k = p.size
    rows = np.kron(np.eye(k), np.ones(k))
    cols = np.kron(np.ones(k), np.eye(k))
    solution = scipy.optimize.linprog(
        cost.ravel(),
        A_eq=np.vstack([rows, cols]),
        b_eq=np.concatenate([p, q]),
        bounds=(0, None),
        method="highs",
    )
    assert solution.success
    return float(solution.fun)


def test_emd_matches_an_independent_linear_program():
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.full(GRID.n_cells, 0.3))
    q = rng.dirichlet(np.full(GRID.n_cells, 0.3))
    assert earth_movers_distance(p, q, GRID) == pytest.approx(lp_emd(p, q), rel=1e-7)
    assert earth_movers_distance(p, q, GRID) == pytest.approx(earth_movers_distance(q, p, GRID))


def test_emd_is_undefined_for_non_distributions_and_too_large_problems():
    p = np.full(GRID.n_cells, 1.0 / GRID.n_cells)
    negative = p.copy()
    negative[0] -= 0.01
    negative[1] += 0.01 + 1 / GRID.n_cells  # sums to 1 + 1/k: not a distribution either
    assert earth_movers_distance(p, negative, GRID) is None
    signed = p.copy()
    signed[0], signed[1] = -0.01, signed[1] + signed[0] + 0.01
    assert earth_movers_distance(p, signed, GRID) is None
    # Only the cells where one exceeds the other enter the transport problem.
    alternating = p + np.where(np.arange(GRID.n_cells) % 2 == 0, 0.5, -0.5) / GRID.n_cells
    pairs = (GRID.n_cells // 2) * (GRID.n_cells - GRID.n_cells // 2)
    assert earth_movers_distance(p, alternating, GRID, max_pairs=pairs - 1) is None
    assert earth_movers_distance(p, alternating, GRID, max_pairs=pairs) > 0
    assert earth_movers_distance(p, p, GRID, max_pairs=0) == 0.0
    assert score(p, signed, GRID).emd_m is None
    assert score(p, p, GRID).emd_m == pytest.approx(0.0, abs=1e-9)
