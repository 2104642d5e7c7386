"""Norm-Sub smoothed over neighbouring cells, for categorical mechanisms over a grid's cells.

k-RR, OLH and Hadamard response over a region's cells treat the cells as unrelated labels:
a report says nothing about the cells near the true one. But people are near each other, so
a cell's neighbours tell something about it, and borrowing from them lowers the estimate's
error where the reports are few per cell. :class:`SmoothedProjection` spreads the Norm-Sub
estimate over neighbouring cells with a Gaussian kernel (each cell's mass kept within the
grid), and chooses the kernel's width, no smoothing included, by K-fold cross-validation of
the held-out likelihood of the reports: the width whose estimate, fitted on the other folds,
makes the held-out reports most likely.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aggregator.estimation import budget
from aggregator.estimation.channels import Channel, log_likelihood, report_counts
from aggregator.estimation.ibu import FOLDS, held_out_folds, held_out_scores
from aggregator.estimation.inversion import project_to_simplex

# Kernel widths tried, in cells (standard deviations of the Gaussian); 0 is no smoothing.
BANDWIDTHS_CELLS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)


def kernel_matrix(size: int, bandwidth: float) -> np.ndarray:
    """``K[i, j]``: the share of cell ``i``'s mass that a Gaussian of ``bandwidth`` cells
    moves to cell ``j`` along one axis of ``size`` cells, each row summing to 1 (the mass
    that would leave the grid stays in it)."""
    if bandwidth <= 0:
        return np.eye(size)
    distance = np.arange(size)[:, None] - np.arange(size)[None, :]
    weights = np.exp(-0.5 * (distance / bandwidth) ** 2)
    return weights / weights.sum(axis=1, keepdims=True)


class GridSmoother:
    """Mass-preserving Gaussian smoothing of distributions over ``rows x cols`` cells (one
    per row of a matrix, or a single one), separable by axis."""

    def __init__(self, rows: int, cols: int, bandwidth: float):
        self.rows, self.cols, self.bandwidth = rows, cols, float(bandwidth)
        self._down = kernel_matrix(rows, bandwidth)
        self._across = kernel_matrix(cols, bandwidth)

    def __call__(self, p: np.ndarray) -> np.ndarray:
        if self.bandwidth <= 0:
            return p
        grids = p.reshape(*p.shape[:-1], self.rows, self.cols)
        smoothed = np.swapaxes(self._down, -1, -2) @ grids @ self._across
        return smoothed.reshape(p.shape)


class SmoothedProjection:
    """Norm-Sub over a grid's cells, smoothed by a Gaussian whose width (in cells, from
    :data:`BANDWIDTHS_CELLS`) is chosen by ``folds``-fold cross-validation of the held-out
    likelihood; a width of 0 is Norm-Sub itself.

    Attributes
    ----------
    frequencies_, unbiased_ (the inversion), bandwidth_ (cells), scores_ (summed held-out
    log-likelihood per width, or None with too few reports to split), log_likelihood_,
    n_iter_ (None), converged_, warnings_.
    """

    name = "smoothed_projection"

    def __init__(self, rows: int, cols: int, *, folds: int = FOLDS, seed: int = 0):
        if rows < 1 or cols < 1:
            raise ValueError(f"a grid needs at least one row and column, got {rows} x {cols}")
        self.rows, self.cols = int(rows), int(cols)
        self.folds = int(folds)
        self.seed = seed

    def _fit_width(self, counts: np.ndarray, channel: Channel, bandwidth: float) -> np.ndarray:
        return GridSmoother(self.rows, self.cols, bandwidth)(self._projected(counts, channel))

    def fit(self, counts: Any, channel: Channel) -> SmoothedProjection:
        counts = report_counts(counts, channel)
        if channel.n_inputs != self.rows * self.cols:
            raise ValueError(
                f"the channel has {channel.n_inputs} inputs, the grid {self.rows * self.cols}"
            )
        self.warnings_: list[str] = []
        self.bandwidth_ = self._choose(counts, channel)
        self.unbiased_, self.converged_ = channel.solve_counts(counts)
        smoother = GridSmoother(self.rows, self.cols, self.bandwidth_)
        self.frequencies_ = smoother(project_to_simplex(self.unbiased_))
        self.log_likelihood_ = log_likelihood(counts, channel.forward(self.frequencies_))
        self.n_iter_ = None
        return self

    def _choose(self, counts: np.ndarray, channel: Channel) -> float:
        held_out = held_out_folds(counts, self.folds, self.seed)
        train = counts[None, :] - held_out
        self.scores_: np.ndarray | None = None
        if held_out.shape[0] < 2 or np.any(train.sum(axis=1) <= 0):
            self.warnings_.append(
                f"only {int(counts.sum())} reports: too few to choose the smoothing by "
                "cross-validation, so none was applied"
            )
            return 0.0
        projected = np.stack([self._projected(row, channel) for row in train])
        scores = []
        for bandwidth in BANDWIDTHS_CELLS:
            budget.charge(channel.n_inputs * train.shape[0])
            smoothed = GridSmoother(self.rows, self.cols, bandwidth)(projected)
            predicted = np.stack([channel.forward(row) for row in smoothed])
            scores.append(held_out_scores(held_out, predicted).sum())
        self.scores_ = np.asarray(scores)
        return float(BANDWIDTHS_CELLS[int(np.argmax(self.scores_))])

    @staticmethod
    def _projected(counts: np.ndarray, channel: Channel) -> np.ndarray:
        """Norm-Sub on one fold's counts, charged to the work budget (a solve is a pass over
        the values, and a large-domain oracle's many)."""
        budget.charge(channel.n_inputs)
        return project_to_simplex(channel.solve_counts(counts)[0])

    def replay(self, counts: np.ndarray, channel: Channel) -> np.ndarray:
        """The chosen width on other counts (one set, or one per row)."""
        counts = np.asarray(counts, dtype=float)
        if counts.ndim == 2:
            return np.stack([self.replay(row, channel) for row in counts])
        return self._fit_width(counts, channel, self.bandwidth_)

    def headline(self) -> str:
        if self.scores_ is None:
            return "Norm-Sub, not smoothed (too few reports to cross-validate)"
        if self.bandwidth_ == 0:
            return f"Norm-Sub, not smoothed ({self.folds}-fold cross-validation)"
        return (
            f"Norm-Sub smoothed over {self.bandwidth_:g} cells ({self.folds}-fold cross-validation)"
        )

    def details(self) -> dict[str, Any]:
        found: dict[str, Any] = {"bandwidth_cells": self.bandwidth_}
        if self.scores_ is not None:
            found["folds"] = self.folds
            found["held_out_log_likelihood"] = {
                f"{width:g}": float(score)
                for width, score in zip(BANDWIDTHS_CELLS, self.scores_, strict=True)
            }
        return found
