"""Accuracy of an estimated distribution against the truth.

All metrics compare two vectors over the same inputs (labels or grid cells):

* ``tv``: total variation distance, ``sum |p - t| / 2`` (in [0, 1] for distributions);
* ``mse``: mean squared error per input, ``sum (p - t)^2 / k``;
* ``max_abs``: the largest absolute error of one frequency;
* ``kl``: ``KL(truth || estimate)`` in nats, defined when the estimate is a
  distribution that is positive wherever the truth is (otherwise ``None``);
* ``emd_m``: for locations, the earth mover's distance in metres between the
  two distributions on the grid (:func:`aggregator.estimation.distance.earth_movers_distance`,
  exact). It is ``None`` when the estimate has negative entries (it is then no
  distribution), or when the transport problem would be too large to solve exactly (a
  coarser grid, or a subset of the region, keeps it exact).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from aggregator.estimation.distance import earth_movers_distance, is_distribution
from shared.geo import Grid


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


def kl_divergence(truth: np.ndarray, estimate: np.ndarray) -> float | None:
    """``KL(truth || estimate)`` in nats, or ``None`` where it is not defined (or infinite)."""
    if not (is_distribution(truth) and is_distribution(estimate)):
        return None
    seen = truth > 0
    if np.any(estimate[seen] <= 0):
        return None
    return float(np.sum(truth[seen] * np.log(truth[seen] / estimate[seen])))


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
