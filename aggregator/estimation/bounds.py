"""Bounds on binomial shares: Wilson's and Jeffreys's, and the grid cells' window bounds.

A grid cell the reports do not resolve gets an upper bound from the counts around it
(:func:`unresolved_cells`); the Wilson score interval also serves k-RR's intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import betaincinv
from scipy.stats import norm

from aggregator.estimation.grid_channels import GridKernelChannel

# The noise's reach: the half-width of the smallest square around a cell holding this share of
# the noise (GridKernelChannel.noise_reach). A grid cell with no report within it, or whose share
# the reports bound best over a wider window, is one they do not resolve (unresolved_cells).
NOISE_REACH_MASS = 0.9
# Window report counts below this get Jeffreys's upper bound (a beta quantile), larger ones the
# Wilson score bound, within 0.5% of it there (share_upper_bound).
EXACT_BOUND_REPORTS = 100


@dataclass(frozen=True)
class UnresolvedCells:
    """The grid cells the reports do not resolve (:func:`unresolved_cells`).

    ``upper`` holds their upper bounds (0 for resolved cells), ``no_report`` marks the cells
    with no report within ``reach`` cells, the noise's reach.
    """

    upper: np.ndarray
    no_report: np.ndarray
    reach: int


def unresolved_cells(
    counts: np.ndarray, channel: GridKernelChannel, confidence: float
) -> UnresolvedCells:
    """Which grid cells the reports do not resolve, and an upper bound for each.

    The reports bound the mean share of any square window ``W`` of ``m`` cells around a
    cell: its report count is ``Binomial(n, q_W)``, and where the true shares are even at
    the window's scale ``q_W / m`` is each of its cells' share. A cell's bound is the
    smallest, over windows of half-width 0, 1, 2, 4, ... up to the whole grid (cut at its
    edges), of the upper bound on ``q_W`` (:func:`share_upper_bound`, one-sided at
    ``1 - (1 - confidence) / 2``) divided by ``m``. The windows are nested and their
    bounds move together, so the smallest is taken without a multiplicity correction; the
    measured coverage (``docs/estimation.md``) is what supports it.

    A cell is unresolved when that smallest bound comes from a window wider than the
    noise's reach (the half-width of the square holding :data:`NOISE_REACH_MASS` of the
    noise, :meth:`GridKernelChannel.noise_reach`) or from a window holding no report, or
    when no report landed within the reach at all: the reports then say how much lies in
    the area, not where in it, the estimate and its bootstrap world put about nothing where
    no report fell, and a bootstrap interval misses a thin even share there (beside a
    hotspot too, whose spilled reports land within the reach).
    """
    rows, cols = channel.rows, channel.cols
    n = float(counts.sum())
    reach = channel.noise_reach(NOISE_REACH_MASS)
    table = _summed_area(counts.reshape(rows, cols))
    no_report = _window_sums(table, reach)[0].ravel() < 0.5  # counts are whole numbers
    level = 0.5 + confidence / 2
    best = np.full(channel.n_inputs, np.inf)
    best_radius = np.zeros(channel.n_inputs, dtype=int)
    best_empty = np.zeros(channel.n_inputs, dtype=bool)
    radius, widest = 0, max(rows, cols) - 1
    while True:
        sums, cells = (values.ravel() for values in _window_sums(table, radius))
        bound = share_upper_bound(sums, n, level) / cells
        better = bound < best
        best[better] = bound[better]
        best_radius[better] = radius
        best_empty[better] = sums[better] < 0.5  # counts are whole numbers
        if radius >= widest:
            break
        radius = min(max(2 * radius, 1), widest)
    unresolved = no_report | (best_radius > reach) | best_empty
    return UnresolvedCells(np.where(unresolved, best, 0.0), no_report, reach)


def share_upper_bound(counts: np.ndarray, n: float, level: float) -> np.ndarray:
    """One-sided upper bounds at ``level`` on binomial proportions ``counts / n``.

    Jeffreys's bound, the ``level`` quantile of ``Beta(c + 1/2, n - c + 1/2)`` (1 at
    ``c = n``), which holds close to its level with few successes where the exact
    Clopper-Pearson bound holds well above it (Brown, Cai and DasGupta, Statistical Science
    2001); from :data:`EXACT_BOUND_REPORTS` counts up, the Wilson score bound, within 0.5%
    of it there, without a beta quantile per value.
    """
    counts = np.asarray(counts, dtype=float)
    upper = wilson_interval(counts, n, float(norm.ppf(level)))[1]
    few = counts < min(EXACT_BOUND_REPORTS, n)
    if np.any(few):
        values, index = np.unique(counts[few], return_inverse=True)
        upper[few] = betaincinv(values + 0.5, n - values + 0.5, level)[index]
    return np.minimum(upper, 1.0)


def _summed_area(grid: np.ndarray) -> np.ndarray:
    """``table[i, j]`` = the sum of ``grid[:i, :j]`` (a zero row and column in front)."""
    table = np.zeros((grid.shape[0] + 1, grid.shape[1] + 1))
    table[1:, 1:] = grid.cumsum(axis=0).cumsum(axis=1)
    return table


def _window_sums(table: np.ndarray, radius: int) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, the sum over the square of half-width ``radius`` around it (cut at the grid's
    edges) from a :func:`_summed_area` table, and the number of cells in that square."""
    rows, cols = table.shape[0] - 1, table.shape[1] - 1
    top = np.clip(np.arange(rows) - radius, 0, rows)
    bottom = np.clip(np.arange(rows) + radius + 1, 0, rows)
    left = np.clip(np.arange(cols) - radius, 0, cols)
    right = np.clip(np.arange(cols) + radius + 1, 0, cols)
    sums = (
        table[np.ix_(bottom, right)]
        - table[np.ix_(top, right)]
        - table[np.ix_(bottom, left)]
        + table[np.ix_(top, left)]
    )
    return sums, np.outer(bottom - top, right - left)


def wilson_interval(counts: np.ndarray, n: float, z: float) -> tuple[np.ndarray, np.ndarray]:
    """The Wilson score interval of binomial proportions ``counts / n`` at normal quantile ``z``."""
    share = counts / n
    z2 = z * z
    centre = (share + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * np.sqrt(np.maximum(share * (1 - share), 0.0) / n + z2 / (4 * n * n))
    return centre - half, centre + half
