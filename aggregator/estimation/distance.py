"""The earth mover's distance between two distributions over a grid's cells.

The 1-Wasserstein distance in metres, with the straight-line distance between cell centres
as the ground cost, solved exactly by POT's network simplex (``ot.emd2``) on the cells'
surplus (where one distribution exceeds the other) and deficit, which costs the same as the
full problem for a metric. It scores simulations (``ldp-simulate``) and the advisor's
simulated ranking of a region's mechanisms (:mod:`aggregator.estimation.region_advice`).
"""

from __future__ import annotations

import math

import numpy as np

from shared.geo import Grid

# The largest (cells in surplus) x (cells in deficit) cost matrix solved (200 MB of float64).
EMD_MAX_PAIRS = 25_000_000
# Entries within this of zero count as zero (floating-point residue of the estimators).
ZERO = 1e-15
EMD_MAX_ITER = 100_000_000


def is_distribution(v: np.ndarray) -> bool:
    """Whether ``v`` is a probability vector (up to floating-point residue)."""
    return bool(np.all(v >= -ZERO) and math.isclose(v.sum(), 1.0, abs_tol=1e-9))


def cell_centres_m(grid: Grid) -> np.ndarray:
    """``(n_cells, 2)`` cell centres in metres, in index order."""
    rows, cols = np.divmod(np.arange(grid.n_cells), grid.cols)
    return np.column_stack(((cols + 0.5) * grid.cell_size_m, (rows + 0.5) * grid.cell_size_m))


def earth_movers_distance(
    truth: np.ndarray, estimate: np.ndarray, grid: Grid, *, max_pairs: int = EMD_MAX_PAIRS
) -> float | None:
    """Exact 1-Wasserstein distance in metres between two distributions on ``grid``.

    Returns ``None`` if either is not a distribution or the problem is too large
    (see the module docstring).
    """
    import ot  # POT; imported when needed, it is slow to import

    if not (is_distribution(truth) and is_distribution(estimate)):
        return None
    # Mass both hold stays where it is: with a metric cost, moving only the cells where one
    # exceeds the other onto the cells where the other exceeds it costs the same, on a smaller
    # transport problem.
    difference = truth - estimate
    sources = np.flatnonzero(difference > ZERO)
    sinks = np.flatnonzero(difference < -ZERO)
    if sources.size == 0 or sinks.size == 0:
        return 0.0
    if sources.size * sinks.size > max_pairs:
        return None
    surplus, deficit = difference[sources], -difference[sinks]
    moved = min(surplus.sum(), deficit.sum())
    centres = cell_centres_m(grid)
    cost = ot.dist(centres[sources], centres[sinks], metric="euclidean")
    value, log = ot.emd2(
        surplus / surplus.sum(), deficit / deficit.sum(), cost, numItermax=EMD_MAX_ITER, log=True
    )
    if log.get("warning"):
        raise ArithmeticError(f"the exact transport did not finish: {log['warning']}")
    return float(value) * moved
