"""Accuracy of an estimated distribution against the truth.

All metrics compare two vectors over the same inputs (labels or grid cells):

* ``tv``: total variation distance, ``sum |p - t| / 2`` (in [0, 1] for distributions);
* ``mse``: mean squared error per input, ``sum (p - t)^2 / k``;
* ``max_abs``: the largest absolute error of one frequency;
* ``kl``: ``KL(truth || estimate)`` in nats, defined when the estimate is a
  distribution that is positive wherever the truth is (otherwise ``None``);
* ``emd_m``: for locations, the earth mover's distance (1-Wasserstein) in
  metres between the two distributions on the grid, with the Euclidean
  distance between cell centres as the ground cost. It is solved exactly by
  POT's network simplex (``ot.emd2``), moving only the cells' surplus
  (where one distribution exceeds the other) onto their deficit, which costs
  the same for a metric. It is ``None`` when the estimate has negative
  entries (it is then no distribution), or when the transport problem would
  exceed :data:`EMD_MAX_PAIRS` cost entries (an exact solution is then too costly
  in memory; a coarser grid, or a subset of the region, keeps it exact).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from shared.geo import Grid

# The largest (cells in surplus) x (cells in deficit) cost matrix solved (200 MB of float64).
EMD_MAX_PAIRS = 25_000_000
# Entries within this of zero count as zero (floating-point residue of the estimators).
_ZERO = 1e-15
EMD_MAX_ITER = 100_000_000


@dataclass(frozen=True)
class Scores:
    """The accuracy of one estimate; ``None`` where a metric is not defined."""

    tv: float
    mse: float
    max_abs: float
    kl: float | None = None
    emd_m: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)


def total_variation(truth: np.ndarray, estimate: np.ndarray) -> float:
    return float(0.5 * np.abs(estimate - truth).sum())


def mean_squared_error(truth: np.ndarray, estimate: np.ndarray) -> float:
    return float(np.mean((estimate - truth) ** 2))


def max_abs_error(truth: np.ndarray, estimate: np.ndarray) -> float:
    return float(np.max(np.abs(estimate - truth)))


def _is_distribution(v: np.ndarray) -> bool:
    return bool(np.all(v >= -_ZERO) and math.isclose(v.sum(), 1.0, abs_tol=1e-9))


def kl_divergence(truth: np.ndarray, estimate: np.ndarray) -> float | None:
    """``KL(truth || estimate)`` in nats, or ``None`` where it is not defined (or infinite)."""
    if not (_is_distribution(truth) and _is_distribution(estimate)):
        return None
    seen = truth > 0
    if np.any(estimate[seen] <= 0):
        return None
    return float(np.sum(truth[seen] * np.log(truth[seen] / estimate[seen])))


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

    if not (_is_distribution(truth) and _is_distribution(estimate)):
        return None
    # Mass both hold stays where it is: with a metric cost, moving only the cells where one
    # exceeds the other onto the cells where the other exceeds it costs the same, on a smaller
    # transport problem.
    difference = truth - estimate
    sources = np.flatnonzero(difference > _ZERO)
    sinks = np.flatnonzero(difference < -_ZERO)
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


def score(truth: np.ndarray, estimate: np.ndarray, grid: Grid | None = None) -> Scores:
    """Every metric that applies (EMD only with a grid)."""
    truth = np.asarray(truth, dtype=float)
    estimate = np.asarray(estimate, dtype=float)
    if truth.shape != estimate.shape:
        raise ValueError(f"shapes differ: truth {truth.shape}, estimate {estimate.shape}")
    return Scores(
        tv=total_variation(truth, estimate),
        mse=mean_squared_error(truth, estimate),
        max_abs=max_abs_error(truth, estimate),
        kl=kl_divergence(truth, estimate),
        emd_m=None if grid is None else earth_movers_distance(truth, estimate, grid),
    )
