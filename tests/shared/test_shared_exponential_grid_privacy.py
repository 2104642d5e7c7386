"""Privacy audit of the exponential mechanism on a grid, both metrics, edge rows included.

As for the geometric mechanism (test_shared_geometric_privacy.py), in two parts,
each also run on negative controls that the audit must catch:

1. **The law.** The clamped law ``ln p(z | x)`` is written out independently of
   the channel code, by summing ``exp(-a d(offset))`` over a box of the
   unbounded lattice (out to ``46 / a`` cells, beyond which the mass is below
   1e-18 of the whole) and folding each offset onto the grid cell clamping
   sends it to. The largest excess ``ln p(z | x) - ln p(z | x') - epsilon d(x, x')``
   over every pair of cells of a small grid (every edge and corner included)
   and every report must be <= 0 up to float rounding, with ``d`` the metric's
   distance between centres in metres. The aggregator's channel must be that
   law.
2. **The sampler follows the law.** Draws of the device sampler (exact, integer
   only) for a corner, an edge and an inner cell fit the audited law
   (chi-square at ``GOF_ALPHA``, fixed seeds).

The Euclidean sampler realises ``exp(-a_s r(s))``, ``r(s)`` the square root rounded
up to a multiple of 2**-64 and ``a_s = a 2**64 / (2**64 + 1)`` (see
:class:`shared.mechanisms.ExponentialGrid`): within a relative ``a (1 + d) 2**-64``
of the law audited here, far below what a float law or a test can see; the bound
that rounding keeps is proven in the docstring and checked on its integers in
test_shared_exponential_grid.py.

Controls: a law and a sampler 10% too generous (``1.1 epsilon`` drawn, ``epsilon``
stated), and the law normalised over the bounded grid instead of clamped from the
lattice (its normaliser depends on the true cell and the loss near the edges
exceeds epsilon).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from shared_stats import GOF_ALPHA, chi_square_gof, scalar_counts, small_grid

from aggregator.estimation import channel_for
from shared.mechanisms import ExponentialGrid
from shared.rng import RandomSource
from shared.spec import EUCLIDEAN, GRID_METRICS, MANHATTAN

GENEROUS = 1.1
DRAWS = 30_000
TOLERANCE = 1e-9
CELL_M = 100.0


def lattice_distance(di: np.ndarray, dj: np.ndarray, metric: str) -> np.ndarray:
    """Distance in cells between lattice points ``(di, dj)`` apart."""
    if metric == MANHATTAN:
        return np.abs(di) + np.abs(dj)
    return np.hypot(di, dj)


def log_law(step: float, rows: int, cols: int, metric: str) -> np.ndarray:
    """``ln p(z | x)`` for every pair of cells: lattice weights folded by clamping, normalised
    over the lattice (one constant for every x)."""
    radius = math.ceil(46.0 / step) + max(rows, cols)
    offsets = np.arange(-radius, radius + 1)
    di, dj = np.meshgrid(offsets, offsets, indexing="ij")
    weights = np.exp(-step * lattice_distance(di, dj, metric))
    total = weights.sum()
    law = np.zeros((rows * cols, rows * cols))
    for x in range(rows * cols):
        i, j = divmod(x, cols)
        z = np.clip(i + di, 0, rows - 1) * cols + np.clip(j + dj, 0, cols - 1)
        np.add.at(law[x], z.ravel(), weights.ravel())
    return np.log(law / total)


def cell_distances(rows: int, cols: int, metric: str) -> np.ndarray:
    """Distance in cells between every pair of cells' centres."""
    i, j = np.divmod(np.arange(rows * cols), cols)
    return lattice_distance(np.subtract.outer(i, i), np.subtract.outer(j, j), metric)


def excess_over_all_pairs(logs: np.ndarray, step: float, distances: np.ndarray) -> float:
    """``max ln p(z|x) - ln p(z|x') - step d(x, x')`` over every x, x', z (d in cells)."""
    worst = -np.inf
    for z in range(logs.shape[1]):
        loss = logs[:, z][:, None] - logs[:, z][None, :]
        worst = max(worst, float(np.max(loss - step * distances)))
    return worst


def largest_loss_per_cell(logs: np.ndarray, distances: np.ndarray) -> float:
    """``max (ln p(z|x) - ln p(z|x')) / d(x, x')`` over distinct cells: the epsilon per cell."""
    off = distances > 0
    worst = 0.0
    for z in range(logs.shape[1]):
        loss = logs[:, z][:, None] - logs[:, z][None, :]
        worst = max(worst, float((loss[off] / distances[off]).max()))
    return worst


CASES = [(rows, cols, epsilon) for rows, cols in ((4, 3), (1, 5)) for epsilon in (0.006, 0.03)]
CASES.append((5, 5, 0.0025))


@pytest.mark.parametrize("metric", GRID_METRICS)
@pytest.mark.parametrize(("rows", "cols", "epsilon"), CASES)
def test_epsilon_per_metre_holds_for_every_pair_of_cells_edges_included(
    metric, rows, cols, epsilon
):
    step = epsilon * CELL_M
    logs = log_law(step, rows, cols, metric)
    distances = cell_distances(rows, cols, metric)
    assert excess_over_all_pairs(logs, step, distances) <= TOLERANCE
    # Tight where the grid has an inner row: its west edge cell is reached from that row's
    # first two cells only through offsets along the row, each pair exactly one step
    # apart, so the audit can see a larger epsilon.
    if rows >= 3:
        assert largest_loss_per_cell(logs, distances) >= step * (1 - 1e-9)
    # The aggregator estimates with exactly this law.
    mechanism = ExponentialGrid(epsilon=epsilon, grid=small_grid(rows, cols, CELL_M), metric=metric)
    np.testing.assert_allclose(
        channel_for(mechanism).to_dense(), np.exp(logs), rtol=1e-9, atol=1e-300
    )


@pytest.mark.parametrize("metric", GRID_METRICS)
def test_negative_control_a_ten_percent_too_generous_law_is_caught(metric):
    step, rows, cols = 0.6, 4, 3
    generous = log_law(GENEROUS * step, rows, cols, metric)
    distances = cell_distances(rows, cols, metric)
    assert excess_over_all_pairs(generous, step, distances) >= 0.1 * step * (1 - 1e-9)


@pytest.mark.parametrize("metric", GRID_METRICS)
def test_negative_control_normalising_over_the_bounded_grid_is_caught(metric):
    # p(z | x) proportional to exp(-a d(z, x)) over the grid's cells only: a corner cell has
    # fewer near neighbours, so a smaller normaliser, and the loss exceeds epsilon there.
    step, rows, cols = 0.6, 4, 3
    distances = cell_distances(rows, cols, metric)
    logs = -step * distances
    logs -= np.log(np.exp(logs).sum(axis=1, keepdims=True))
    assert excess_over_all_pairs(logs, step, distances) > 0.1 * step


class TooGenerousGrid(ExponentialGrid):
    """A faulty sampler: it draws with ``1.1 epsilon`` while its campaign states ``epsilon``."""

    def __init__(self, *, epsilon: float, grid, metric: str):
        super().__init__(epsilon=GENEROUS * epsilon, grid=grid, metric=metric)


def sampler_fits(mechanism: ExponentialGrid, law: np.ndarray, seed: int) -> bool:
    """Whether the device sampler's draws fit ``law`` on a corner, an edge and an inner cell."""
    cols = mechanism.grid.cols
    for x in (0, cols + 0, cols + 1):
        counts = scalar_counts(mechanism, x, DRAWS, seed=seed + x)
        if chi_square_gof(counts, law[x] / law[x].sum()).p_value <= GOF_ALPHA:
            return False
    return True


@pytest.mark.parametrize("metric", GRID_METRICS)
def test_the_device_sampler_follows_the_audited_law_on_its_corner_and_edge_cells(metric):
    epsilon, grid = 0.006, small_grid(4, 3, CELL_M)
    law = np.exp(log_law(epsilon * CELL_M, 4, 3, metric))
    assert sampler_fits(ExponentialGrid(epsilon=epsilon, grid=grid, metric=metric), law, seed=7)


@pytest.mark.parametrize("metric", GRID_METRICS)
def test_negative_control_a_ten_percent_too_generous_sampler_is_caught(metric):
    epsilon, grid = 0.006, small_grid(4, 3, CELL_M)
    law = np.exp(log_law(epsilon * CELL_M, 4, 3, metric))
    faulty = TooGenerousGrid(epsilon=epsilon, grid=grid, metric=metric)
    assert not sampler_fits(faulty, law, seed=7)


def test_euclidean_offsets_do_not_depend_on_the_true_cell():
    # The same random bits give the same lattice offset whatever the true cell: the number
    # of proposals (time) and the noise are independent of the value.
    grid = small_grid(4, 3, CELL_M)
    mechanism = ExponentialGrid(epsilon=0.006, grid=grid, metric=EUCLIDEAN)

    class Recorder:
        def __init__(self, seed: int):
            import random

            self._rng: RandomSource = random.Random(seed)
            self.bits = 0

        def getrandbits(self, k: int) -> int:
            self.bits += k
            return self._rng.getrandbits(k)

    used = set()
    for x in range(grid.n_cells):
        recorder = Recorder(5)
        mechanism.perturb_index(x, recorder)
        used.add(recorder.bits)
    assert len(used) == 1
