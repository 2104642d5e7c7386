"""k-RR over the cells of a grid: the label-only default, or a spatially smoothed estimate
where the reports show structure at the smoothing's scale.

When k-RR's categories are the ``rows x cols`` cells of a grid, neighbouring
cells often have similar shares, which the label-only default
(:class:`empirical_bayes.KRREmpiricalBayes`) cannot know. For a bandwidth
``h`` (in cells), the unbiased inversion ``u`` is smoothed by a Gaussian of
standard deviation ``h``, each cell's kernel truncated at the grid's edges and
renormalised (a Markov operator ``M``: no mass leaves the grid). The smoothed
inversion ``s = M u`` has noise of known size: with ``v_x`` the variance of
``u_x`` (``q_x (1 - q_x) / (n (p_keep - p_other)^2)``, ``q`` the report
shares), its expected squared distance from the uniform distribution is
``sum_x v_x sum_y M_yx^2`` beyond the signal's (``noise``), with standard
deviation about ``v sqrt(2 ||M M^T||_F^2)`` (``v`` the mean of ``v_x``).

``selection="test"`` (the default) smooths only where the label-only default
is the raw report shares (its prior not supported by the reports: it found no
structure cell by cell). A bandwidth is then eligible when that squared
distance ``spread`` is too large for noise alone (a chi-square test with
``2 noise^2 / sd^2`` degrees of freedom, level ``alpha``); among the eligible,
the one with the smallest p-value is taken and the estimate is the simplex
projection of ``1/k + w (s - 1/k)``, a positive-part James-Stein shrinkage
towards uniform made more cautious by ``margin`` standard deviations:
``w = max(0, 1 - (noise + margin sd) / spread)``. With no eligible bandwidth
the estimate is the label-only default.

``selection="cv"``: the bandwidth (0: the default) chosen by ``folds``-fold
cross-validation on the held-out reports' k-RR log-likelihood, with random
multinomial folds as IBU's (:func:`estimators.held_out_folds`) and a
standard-error rule towards 0; the candidates are the simplex projection of
the smoothed inversion (``candidates="smooth-then-project"``) or the smoothed
projection (``"project-then-smooth"``). Kept to reproduce the figures: it was
measured and is not a safe default.

All smoothing is charged to the work budget (:mod:`aggregator.estimation.budget`).
Measured, not used by the service (so it lives with its benchmark,
``scripts/bench_krr_grid.py``): it gained 0.3-1% on the SF check-ins and was worse
than the raw shares on one synthetic row (docs/estimation.md, "k-RR over a grid of
cells", has the figures and what else was measured).
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import gaussian_filter1d
from scipy.stats import chi2

from aggregator.estimation import budget
from aggregator.estimation.channels import KRRChannel
from aggregator.estimation.empirical_bayes import KRREmpiricalBayes
from aggregator.estimation.estimators import (
    DEFAULT_FOLDS,
    KRR_BLEND,
    held_out_folds,
    held_out_scores,
    paired_se,
    project_to_simplex,
)

# Bandwidths tried, in cells.
BANDWIDTHS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# The Gaussian is cut off this many standard deviations out.
TRUNCATE = 4.0
ALPHA = 0.01
MARGIN = 4.0
SELECTIONS = ("test", "cv")
CANDIDATES = ("smooth-then-project", "project-then-smooth")


def _filter(values: np.ndarray, bandwidth: float, axis: int) -> np.ndarray:
    """The Gaussian filter along ``axis``, zero outside the grid; charged to the budget."""
    budget.charge(int(2 * TRUNCATE * bandwidth + 1) * values.size)
    return gaussian_filter1d(values, bandwidth, axis=axis, mode="constant", truncate=TRUNCATE)


def smooth(p: np.ndarray, rows: int, cols: int, bandwidth: float) -> np.ndarray:
    """``p`` (``rows * cols`` values, row-major) convolved with a Gaussian of standard deviation
    ``bandwidth`` cells, each cell's kernel truncated at the grid's edges and renormalised, so
    that no mass leaves the grid (the total is unchanged)."""
    if bandwidth <= 0:
        return p.copy()
    # The share of a cell's kernel that falls inside the grid, per axis.
    inside_rows = _filter(np.ones(rows), bandwidth, 0)
    inside_cols = _filter(np.ones(cols), bandwidth, 0)
    image = p.reshape(rows, cols) / np.outer(inside_rows, inside_cols)
    return _filter(_filter(image, bandwidth, 0), bandwidth, 1).ravel()


def _axis_moments(size: int, bandwidth: float) -> tuple[np.ndarray, float]:
    """For one axis's smoothing matrix ``M`` (column ``i``: where cell ``i``'s mass goes), the
    column sums of ``M^2`` and ``||M M^T||_F^2``, through the filter (``M = G D`` with ``G``
    the symmetric Gaussian filter and ``D`` the columns' renormalisation)."""
    spread = _filter(np.eye(size), bandwidth, 0)
    scale = 1.0 / spread.sum(axis=0)
    matrix = spread * scale[None, :]
    # M M^T = G D^2 G: filter D^2 G along its rows.
    product = _filter(spread * (scale**2)[:, None], bandwidth, 0)
    return np.sum(matrix**2, axis=0), float(np.sum(product**2))


class KRRGridSmoothing:
    """k-RR over a ``rows x cols`` grid: the empirical Bayes default, or a smoothed and shrunk
    inversion where the reports show spatial structure (see the module docstring).

    Parameters
    ----------
    rows, cols : int
        The grid's shape; the channel's categories are its cells in row-major order.
    bandwidths : tuple of float
        Bandwidths tried, in cells.
    selection : {"test", "cv"}
    alpha, margin : float
        ``selection="test"``: the test's level, and the shrinkage's caution in noise
        standard deviations.
    folds, seed, se_rule, candidates
        ``selection="cv"``: folds, the split's seed, the standard-error rule towards
        bandwidth 0, the smoothed candidates.

    Attributes
    ----------
    frequencies_, bandwidth_ (0: the default), weight_ (the shrinkage's ``w``; None for the
    default and under ``"cv"``), p_values_ (per bandwidth; ``"test"`` where it tested), cv_bandwidths_,
    cv_scores_ and cv_fold_scores_ (``"cv"``), default_ (the fitted label-only default),
    log_likelihood_, warnings_; n_iter_ and converged_ are None.
    """

    warnings_: list[str]
    p_values_: np.ndarray | None
    cv_scores_: np.ndarray | None
    cv_fold_scores_: np.ndarray | None
    weight_: float | None

    def __init__(
        self,
        rows: int,
        cols: int,
        *,
        bandwidths: tuple[float, ...] = BANDWIDTHS,
        selection: str = "test",
        alpha: float = ALPHA,
        margin: float = MARGIN,
        folds: int = DEFAULT_FOLDS,
        seed: int = 0,
        se_rule: float = 0.0,
        candidates: str = "smooth-then-project",
    ):
        if int(rows) < 1 or int(cols) < 1:
            raise ValueError(f"the grid needs rows and cols >= 1, got {rows!r} x {cols!r}")
        if not bandwidths or any(not (h > 0 and np.isfinite(h)) for h in bandwidths):
            raise ValueError(f"bandwidths must be finite and > 0, got {bandwidths!r}")
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
        if candidates not in CANDIDATES:
            raise ValueError(f"candidates must be one of {CANDIDATES}, got {candidates!r}")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        if not (margin >= 0 and np.isfinite(margin)):
            raise ValueError(f"margin must be finite and >= 0, got {margin!r}")
        if int(folds) < 2:
            raise ValueError(f"folds must be >= 2, got {folds!r}")
        if not (se_rule >= 0 and np.isfinite(se_rule)):
            raise ValueError(f"se_rule must be finite and >= 0, got {se_rule!r}")
        self.rows, self.cols = int(rows), int(cols)
        self.bandwidths = tuple(sorted(float(h) for h in bandwidths))
        self.selection = selection
        self.alpha = float(alpha)
        self.margin = float(margin)
        self.folds = int(folds)
        self.seed = seed
        self.se_rule = float(se_rule)
        self.candidates = candidates

    def _check(self, counts, channel) -> np.ndarray:
        if not isinstance(channel, KRRChannel):
            raise TypeError(f"expected a k-RR channel, got {type(channel).__name__}")
        counts = np.asarray(counts, dtype=float)
        if counts.shape != (self.rows * self.cols,) or channel.n_inputs != counts.size:
            raise ValueError(
                f"expected {self.rows} x {self.cols} = {self.rows * self.cols} counts for a "
                f"channel over {channel.n_inputs} categories, got shape {counts.shape}"
            )
        if np.any(counts < 0) or not np.all(np.isfinite(counts)) or counts.sum() <= 0:
            raise ValueError("counts must be finite, non-negative and not all zero")
        return counts

    def signal(self, counts: np.ndarray, channel: KRRChannel, bandwidth: float):
        """The smoothed inversion at ``bandwidth``, the test's p-value, and the shrinkage
        weight ``w`` (see the module docstring)."""
        n = counts.sum()
        q = counts / n
        variance = q * (1 - q) / (n * (channel.p_keep - channel.p_other) ** 2)
        smoothed = smooth(channel.solve_with_info(q)[0], self.rows, self.cols, bandwidth)
        squared_rows, frobenius_rows = _axis_moments(self.rows, bandwidth)
        squared_cols, frobenius_cols = _axis_moments(self.cols, bandwidth)
        noise = float(np.sum(variance * np.outer(squared_rows, squared_cols).ravel()))
        noise_sd = float(variance.mean() * np.sqrt(2 * frobenius_rows * frobenius_cols))
        spread = float(np.sum((smoothed - 1.0 / counts.size) ** 2))
        if noise <= 0 or noise_sd <= 0:  # every report in one cell: nothing to smooth
            return smoothed, 1.0, 0.0
        dof = 2 * noise**2 / noise_sd**2
        p_value = float(chi2.sf(dof * spread / noise, dof))
        weight = max(0.0, 1.0 - (noise + self.margin * noise_sd) / spread) if spread > 0 else 0.0
        return smoothed, p_value, weight

    def _smoothed_candidate(self, counts: np.ndarray, channel, bandwidth: float) -> np.ndarray:
        unbiased = channel.solve_with_info(counts / counts.sum())[0]
        if self.candidates == "project-then-smooth":
            return smooth(project_to_simplex(unbiased), self.rows, self.cols, bandwidth)
        return project_to_simplex(smooth(unbiased, self.rows, self.cols, bandwidth))

    def _cross_validate(self, counts: np.ndarray, channel) -> float:
        """The bandwidth chosen by cross-validation (0: the default)."""
        candidates = (0.0, *self.bandwidths)
        held_out = held_out_folds(counts, self.folds, self.seed)
        train = counts[None, :] - held_out
        self.cv_bandwidths_ = np.asarray(candidates)
        if held_out.shape[0] < 2 or np.any(train.sum(axis=1) <= 0):
            return 0.0
        scores = np.empty((len(candidates), held_out.shape[0]))
        for index, bandwidth in enumerate(candidates):
            fitted = [
                KRREmpiricalBayes(blend=KRR_BLEND).fit(row, channel).frequencies_
                if bandwidth == 0
                else self._smoothed_candidate(row, channel, bandwidth)
                for row in train
            ]
            predicted = np.stack([channel.forward(p) for p in fitted])
            scores[index] = held_out_scores(held_out, predicted)
        totals = scores.sum(axis=1)
        self.cv_scores_, self.cv_fold_scores_ = totals, scores
        best = int(np.argmax(totals))
        for index in range(best):
            if totals[best] - totals[index] <= self.se_rule * paired_se(
                scores[best] - scores[index]
            ):
                return candidates[index]
        return candidates[best]

    def fit(self, counts, channel) -> KRRGridSmoothing:
        counts = self._check(counts, channel)
        self.default_ = KRREmpiricalBayes(blend=KRR_BLEND).fit(counts, channel)
        self.warnings_ = []
        self.bandwidth_, self.weight_ = 0.0, None
        self.p_values_ = self.cv_scores_ = self.cv_fold_scores_ = None
        frequencies = None
        if self.selection == "cv":
            self.bandwidth_ = self._cross_validate(counts, channel)
            if self.bandwidth_ > 0:
                frequencies = self._smoothed_candidate(counts, channel, self.bandwidth_)
        elif self.default_.weight_ == 0.0:
            # Only where the label-only default found nothing (it is the raw shares): where its
            # prior is supported, the reports resolve single cells and smoothing blurs them.
            signals = [self.signal(counts, channel, h) for h in self.bandwidths]
            self.p_values_ = np.array([p_value for _, p_value, _ in signals])
            eligible = [i for i, (_, p, w) in enumerate(signals) if p <= self.alpha and w > 0]
            if eligible:
                chosen = min(eligible, key=lambda i: (signals[i][1], i))
                smoothed, _, self.weight_ = signals[chosen]
                self.bandwidth_ = self.bandwidths[chosen]
                uniform = 1.0 / counts.size
                frequencies = project_to_simplex(uniform + self.weight_ * (smoothed - uniform))
        if frequencies is None:
            frequencies = self.default_.frequencies_
            self.warnings_.extend(self.default_.warnings_)
        self.frequencies_ = frequencies
        predicted = channel.forward(frequencies)
        seen = counts > 0
        self.log_likelihood_ = float(np.sum(counts[seen] * np.log(predicted[seen])))
        self.n_iter_ = self.converged_ = None
        return self

    def describe(self) -> str:
        """What the last :meth:`fit` ran, in words (for the estimate API's ``estimator``)."""
        if self.bandwidth_ == 0 and self.selection == "test" and self.p_values_ is None:
            return f"{self.default_.describe()} (not smoothed: the reports resolve single cells)"
        if self.bandwidth_ == 0:
            return f"{self.default_.describe()} (no spatial structure found to smooth)"
        if self.selection == "cv":
            return (
                f"the inversion smoothed over the grid (Gaussian of {self.bandwidth_:g} cells, "
                f"chosen by {self.folds}-fold cross-validation), projected onto the simplex"
            )
        return (
            f"the inversion smoothed over the grid (Gaussian of {self.bandwidth_:g} cells), "
            f"{self.weight_:.0%} of its departure from uniform kept, projected onto the simplex"
        )
