"""Frequency estimators over channel operators.

Each estimator is configured in ``__init__``; ``fit(counts, channel)``
returns ``self`` with the results in attributes ending in ``_``
(``frequencies_``, ``n_iter_``, ...). ``counts[y]`` is the number of
reports of output ``y``; ``channel`` is a :class:`channels.Channel`.

* :class:`MatrixInversion`: the unbiased ``p = q C^{-1}`` (``q`` the
  observed report frequencies), optionally made a distribution by clipping
  negatives and renormalising, or by Euclidean projection onto the simplex.
* :class:`IBU`: the Iterative Bayesian Update, i.e. EM for the maximum
  likelihood ``p`` (Agrawal and Aggarwal, PODS 2001; ElSalamouny and
  Palamidessi, "Generalized iterative Bayesian update and applications to
  mechanisms for privacy protection", EuroS&P 2020).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from aggregator.estimation import budget, parallel, planar_steps
from aggregator.estimation.channels import (
    GridKernelChannel,
    KRRChannel,
    log_likelihood,
    report_counts,
)
from aggregator.estimation.empirical_bayes import KRREmpiricalBayes
from aggregator.estimation.ordinal import GeometricChannel
from aggregator.estimation.posterior_median import (
    PosteriorMedian,
    is_binary,
    noise_share,
    takes_posterior_median,
)
from aggregator.estimation.transport import dyadic_transport
from shared.mechanisms import KRR, Geometric, HadamardResponse
from shared.oracles import OLH

POSTPROCESS = ("none", "clip", "projection")
STOPPING = ("cv", "tolerance")
STARTS = ("uniform", "reports")
DEFAULT_FOLDS = 10
# The cross-validation follows its curves until the best score is this old (iterations).
PATIENCE_MIN = 20
PATIENCE_FRACTION = 0.25
# IBU(gain_se=...) asks a later iteration count for a gain of that many standard errors only
# past this many iterations, where a score creeping up on noise would run on for thousands.
GAIN_SE_AFTER = 20
# Randomized response's default takes the smallest iteration count within this many standard
# errors.
KRR_SE_RULE = 0.5
ORACLE_DEFAULT_METHOD = "projection"
# k-RR's default (k >= 3): the raw report shares up to this log-likelihood gain of the fitted
# prior over equal shares, the posterior means from the second value on, linear between.
KRR_BLEND = (5.0, 15.0)
# k-RR over three categories or more takes the posterior median (each category's, mixed with
# its raw report share) where the mechanism's noise is under this share of a count's variance
# (noise_share: epsilon 5 or more over 3 categories, 6 over 7 or 10, 7.5 over 30, 8.5 over 100,
# 11 over 1,000); empirical Bayes elsewhere.
POSTERIOR_MEDIAN_MAX_NOISE_SHARE = 0.05
# The geometric mechanism takes it where its noise is under this share (3 per unit or more), over
# at most this many values (about 0.3 s; its medians are a step per value).
GEOMETRIC_POSTERIOR_MEDIAN_MAX_NOISE_SHARE = 0.2
GEOMETRIC_POSTERIOR_MEDIAN_MAX_VALUES = 1000
# IBU steps run between two budget checks.
CHUNK_STEPS = 32
# Where a channel's products act by row, at most this many values (rows x values) step side by
# side: it saves the per-step cost of many small rows, and over a wide range (10^5 geometric
# values) a row at a time costs the same time in a sixth of the memory.
SIDE_BY_SIDE_VALUES = 1 << 17
# The geometric mechanism's default weighs its two IBU runs (from equal shares and from the
# report shares) by exp(held-out log-likelihood / this many nats).
TWO_STARTS_TEMPERATURE = 3.0
# ... and each run's cross-validation takes a count past GAIN_SE_AFTER iterations as its best
# only where its held-out score gains on the best so far by this many standard errors (of the
# per-fold gains): with a few hundred reports the score can creep up on noise alone, and IBU
# followed it for thousands of iterations to the sparse maximum-likelihood fit.
GEOMETRIC_GAIN_SE = 1.0
# ... and each run stops at the first iteration count whose fit to all the reports is within
# their noise (the discrepancy principle): Pearson's statistic at most its expected value under
# the mechanism's noise less this many of its standard deviations. The held-out score cannot
# tell apart truths whose report distributions nearly agree (a pile at the range's end and its
# users moved to the next value), and with a few hundred reports it led IBU there.
GEOMETRIC_DISCREPANCY_SD = 0.5
# ... unless cross-validation's count beats that one's held-out score by more than this many
# standard errors of the per-fold gains.
GEOMETRIC_BEYOND_NOISE_SE = 2.0
# On a grid, once the held-out score has fallen below its best, a later count becomes the best
# only where it gains on it by this many standard errors: after a dip the score can come back
# level with the best (within a few thousandths of a nat on the SF check-ins) and then creep up
# for thousands of iterations towards the noisy maximum-likelihood fit.
GRID_REGAIN_SE = 1.0
# On a grid, cross-validation's count is scaled to all the reports by how the choice grows
# from 2 folds (half the reports) to the 10 (nine tenths): IBU.extrapolate_from.
GRID_EXTRAPOLATE_FROM = 2
# IBU started from the report shares starts an unreported value at this share (before
# renormalising): IBU's steps multiply, so a share of 0 would stay 0.
REPORT_START_FLOOR = 1e-12
# The geometric default is mixed with the raw report shares where the mechanism's noise is less
# than this share of the report counts' variance (a high epsilon: the reports are nearly the
# users' own answers; see raw_report_weight), over at most this many values (the estimate's
# derivative takes two replays per value).
RAW_MIX_MAX_NOISE_SHARE = 0.5
RAW_MIX_MAX_VALUES = 300
# ... and where those replays cost at most this many value-steps (about half a second).
RAW_MIX_MAX_WORK = 20_000_000
# On a grid (planar Laplace, the exponential mechanism) IBU's estimate, and over three k-RR
# categories or more the default's, is checked against the raw report shares on this many
# surveys simulated from it (check_against_reports), where that costs at most this much work:
# each survey's users and reports drawn (on a grid a unit per user, for k-RR a unit per
# category: the channels' draw_work) and the estimate refitted on it (on a grid a unit per cell
# and IBU step).
REPORTS_CHECK_SURVEYS = 16
REPORTS_CHECK_MAX_WORK = 4_000_000
# ... for k-RR, where a fit's units are much cheaper (empirical Bayes: a distinct count times an
# atom per EM step; 16 fits over 1,000 categories with 10^5 reports, 2.2 x 10^8 units, take
# about 0.1 s): the 16 surveys' draws and fits, at most this many units, the fits counted as
# the estimate's own cost (budget.metered); enough for 30 categories with 10^6 reports (3.7 x
# 10^8). Either check also keeps to half of what the estimate's work budget has left.
KRR_REPORTS_CHECK_MAX_WORK = 400_000_000
# k-RR keeps the report shares only where they are the closer by this many standard errors
# of the surveys' differences (their total variations are noisier than a grid's transport).
KRR_REPORTS_CHECK_MARGIN = 2.0
# Where k-RR's empirical Bayes takes its posterior means alone, the maximum-likelihood shares
# replace them where they are the closer by this many standard errors on surveys simulated with
# the spread the reports measure (KRRCheckedAgainstReports; None: not checked, as before).
KRR_LIKELIHOOD_CHECK_MARGIN: float | None = 2.0


def project_to_simplex(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``v`` onto the probability simplex.

    The sort-based algorithm of Held, Wolfe and Crowder (1974), as in Duchi et
    al., "Efficient projections onto the l1-ball", ICML 2008: O(k log k).
    """
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - 1.0
    index = np.arange(1, v.size + 1)
    rho = np.nonzero(u - cumulative / index > 0)[0][-1]
    theta = cumulative[rho] / (rho + 1)
    return np.maximum(v - theta, 0.0)


def clip_and_normalise(v: np.ndarray) -> np.ndarray:
    """Negative entries set to 0, then rescaled to sum to 1 (uniform if nothing is left)."""
    clipped = np.maximum(v, 0.0)
    total = clipped.sum()
    return clipped / total if total > 0 else np.full(v.size, 1.0 / v.size)


class MatrixInversion:
    """Matrix inversion: solve ``p C = q`` for the observed report frequencies ``q``.

    Parameters
    ----------
    postprocess : {"none", "clip", "projection"}
        ``"none"`` keeps the unbiased solution (it may have negative entries);
        ``"clip"`` sets negatives to zero and renormalises; ``"projection"``
        takes the closest distribution in Euclidean distance.
    """

    def __init__(self, *, postprocess: str = "none"):
        if postprocess not in POSTPROCESS:
            raise ValueError(f"postprocess must be one of {POSTPROCESS}, got {postprocess!r}")
        self.postprocess = postprocess

    def fit(self, counts, channel) -> MatrixInversion:
        counts = report_counts(counts, channel)
        self.n_ = counts.sum()
        self.unbiased_, self.converged_ = channel.solve_counts(counts)
        if self.postprocess == "clip":
            self.frequencies_ = clip_and_normalise(self.unbiased_)
        elif self.postprocess == "projection":
            self.frequencies_ = project_to_simplex(self.unbiased_)
        else:
            self.frequencies_ = self.unbiased_
        self.n_iter_ = None
        return self


class IBUSteps:
    """IBU's steps on one set of counts, through the channel's ``forward`` and ``backward``.

    ``p`` starts at ``start`` (by default uniform); ``predicted`` is always ``forward(p)``. A channel
    may run the same steps faster (:meth:`channels.Channel.ibu_steps`), and
    may have them over-relaxed after a number of steps
    (:attr:`channels.Channel.ibu_relax_after`); ``steps_taken`` counts them. Where the
    channel's products act on every row of a matrix
    (:attr:`channels.Channel.products_by_row`), ``counts`` may be several sets, one per row,
    run side by side.
    """

    def __init__(self, channel, counts: np.ndarray, start: np.ndarray | None = None):
        self._channel = channel
        self._counts = counts
        self._observed = counts > 0
        uniform = np.full((*counts.shape[:-1], channel.n_inputs), 1.0 / channel.n_inputs)
        self.p = uniform if start is None else np.array(start, dtype=float)
        self.predicted = channel.forward(self.p)
        self._relax_after = channel.ibu_relax_after
        self.steps_taken = 0

    def advance(self, steps: int, tol: float) -> tuple[int, float]:
        """Up to ``steps`` steps, stopping after one that changes no frequency by more than
        ``tol``. Returns the steps taken and the last one's largest change."""
        taken, change = 0, np.inf
        while taken < steps:
            # p_x <- p_x * sum_y C[x, y] counts_y / predicted_y; unreported outputs add nothing.
            ratio = np.zeros_like(self.predicted)
            with np.errstate(divide="ignore"):
                np.divide(self._counts, self.predicted, out=ratio, where=self._observed)
            # Non-negative in exact arithmetic: round-off below 0 would leave p at -1e-250.
            factor = np.maximum(self._channel.backward(ratio), 0.0)
            if self._relax_after is not None and self.steps_taken >= self._relax_after:
                planar_steps.relax(factor)
            updated = self.p * factor
            updated /= updated.sum(axis=-1, keepdims=True)
            change = float(np.max(np.abs(updated - self.p)))
            taken += 1
            self.steps_taken += 1
            self.p = updated
            self.predicted = self._channel.forward(updated)
            if change <= tol:
                break
        return taken, change


def _steps(channel, counts: np.ndarray, start: str = "uniform"):
    """IBU's steps from ``start`` (:data:`STARTS`): from uniform the channel's own steps where
    it has them, else (and from the report shares) the generic ones."""
    if start == "reports":
        return IBUSteps(channel, counts, report_start(counts))
    steps = channel.ibu_steps(counts)
    return IBUSteps(channel, counts) if steps is None else steps


def report_start(counts: np.ndarray) -> np.ndarray:
    """The report shares as a starting distribution over the same values, every share at
    least :data:`REPORT_START_FLOOR` (IBU's steps cannot raise a share of 0); per row where
    ``counts`` has several."""
    start = np.maximum(counts / counts.sum(axis=-1, keepdims=True), REPORT_START_FLOOR)
    return start / start.sum(axis=-1, keepdims=True)


def steps_on_rows(channel, counts: np.ndarray, count: int, start: str = "uniform") -> np.ndarray:
    """``count`` IBU steps from ``start`` on each row of ``counts``; every row runs all
    ``count`` steps (no early stop at convergence). Returns the estimates as rows.

    Where the channel's products act by row the rows run side by side in one set of steps,
    :data:`SIDE_BY_SIDE_VALUES` values at a time; otherwise one row at a time, on the threads
    the estimate may use.
    """
    if not channel.products_by_row:

        def one(row: np.ndarray) -> np.ndarray:
            steps = _steps(channel, row, start)
            advance_charged(steps, count, 0.0, channel.n_inputs)
            return steps.p.copy()  # a channel's own steps may keep their buffers

        fitted = parallel.map_ordered(one, counts, alone=not channel.steps_run_in_parallel)
        return np.asarray(fitted)
    rows = max(1, SIDE_BY_SIDE_VALUES // channel.n_inputs)
    fits = []
    for part in np.split(counts, range(rows, counts.shape[0], rows)):
        steps = _steps(channel, part, start)
        advance_charged(steps, count, 0.0, channel.n_inputs * part.shape[0])
        fits.append(steps.p)
    return np.concatenate(fits)


def advance_charged(steps, count: int, tol: float, units_per_step: int) -> tuple[int, float]:
    """``steps.advance(count, tol)`` in chunks of :data:`CHUNK_STEPS`, each charged to the budget.

    Returns the steps taken and the last one's largest change, as ``advance`` does.
    """
    taken, change = 0, np.inf
    while taken < count:
        chunk = min(CHUNK_STEPS, count - taken)
        budget.charge(chunk * units_per_step)
        done, change = steps.advance(chunk, tol)
        taken += done
        if done < chunk:  # converged within the chunk
            break
    return taken, change


class _FoldSteps:
    """IBU's steps on several sets of counts at once (one per cross-validation fold), the
    folds side by side on the threads the estimate may use."""

    def __init__(self, channel, train: np.ndarray, start: str = "uniform"):
        self._steps = [_steps(channel, row, start) for row in train]
        self._alone = not channel.steps_run_in_parallel

    def advance(self, count: int) -> float:
        """``count`` steps on every fold; returns the largest change of the last step."""
        changes = parallel.map_ordered(
            lambda steps: steps.advance(count, 0.0)[1], self._steps, alone=self._alone
        )
        return max(changes)

    def predicted(self) -> np.ndarray:
        """Each fold's predicted report distribution, one row per fold."""
        return np.stack([steps.predicted for steps in self._steps])


class _BatchFoldSteps:
    """:class:`_FoldSteps` over a channel's own steps that run many sets of counts at once."""

    def __init__(self, steps):
        self._steps = steps

    def advance(self, count: int) -> float:
        return self._steps.advance(count, 0.0)[1]

    def predicted(self) -> np.ndarray:
        return self._steps.predicted


def _fold_steps(channel, train: np.ndarray, start: str = "uniform"):
    """Steps on every fold's training counts from ``start``: batched where the channel can
    (its products act by row, as the geometric mechanism's do; k-RR's own steps from
    uniform)."""
    if channel.products_by_row and train.size <= SIDE_BY_SIDE_VALUES:
        return _BatchFoldSteps(_steps(channel, train, start))
    batched = isinstance(channel, KRRChannel) and start == "uniform"
    batch = channel.ibu_steps(train) if batched else None
    return _FoldSteps(channel, train, start) if batch is None else _BatchFoldSteps(batch)


def held_out_folds(counts: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """The reports of each cross-validation fold, one row per fold (empty folds dropped).

    Every whole report is put in one of ``folds`` folds at random (a multinomial split
    of each count, seeded by ``seed``, so that an estimate is reproducible); a
    fractional part of a count stays in every fold's training set.
    """
    rng = np.random.default_rng(seed)
    whole = np.floor(counts).astype(np.int64)
    held_out = rng.multinomial(whole, np.full(folds, 1.0 / folds)).T.astype(float)
    return held_out[held_out.sum(axis=1) > 0]


def held_out_scores(held_out: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Per fold, the held-out reports' log-likelihood under that fold's predicted distribution."""
    with np.errstate(divide="ignore"):
        logs = np.log(np.maximum(predicted, np.finfo(float).tiny))
    return np.sum(np.where(held_out > 0, held_out * logs, 0.0), axis=1)


def pearson_against_noise(
    counts: np.ndarray, p: np.ndarray, predicted: np.ndarray, channel
) -> tuple[float, float]:
    """Pearson's statistic ``sum_y (c_y - n q_y)^2 / (n q_y)`` of ``counts`` against the report
    distribution ``predicted`` (``q``) of shares ``p``, and its expected value if the users'
    values were at ``p`` (the mechanism's noise alone): ``sum_y v_y / q_y``, with ``v`` the
    channel's ``report_variance(p)``. Infinite where a count falls on an output of
    probability 0."""
    if np.any((predicted <= 0) & (counts > 0)):
        return np.inf, 0.0
    expected_counts = counts.sum() * predicted
    seen = expected_counts > 0
    pearson = np.sum((counts[seen] - expected_counts[seen]) ** 2 / expected_counts[seen])
    expected = np.sum(channel.report_variance(p)[seen] / predicted[seen])
    return float(pearson), float(expected)


def within_noise(counts: np.ndarray, steps, channel, sd: float) -> bool:
    """Whether the fit of ``steps`` (its shares ``p`` and their report distribution) is within
    the noise of ``counts``: Pearson's statistic at most its expected value less ``sd`` times
    its standard deviation, taken as ``sqrt(2 E)`` (:func:`pearson_against_noise`). Fitted
    closer than that, an estimate follows the noise (the discrepancy principle of regularised
    deconvolution: Morozov, 1966)."""
    pearson, expected = pearson_against_noise(counts, steps.p, steps.predicted, channel)
    return pearson <= expected - sd * np.sqrt(2.0 * expected)


def _next_checkpoint(iteration: int) -> int:
    """Where the cross-validation scores next: every step up to 20, then about every 5%."""
    return iteration + max(1, iteration // 20)


def extrapolated_count(chosen: int, smaller: int, folds: int, smaller_folds: int) -> int:
    """An iteration count chosen by cross-validation on ``folds`` folds (trained on
    ``1 - 1 / folds`` of the reports), scaled to all the reports.

    The count grows with the reports as a power of them, ``t ~ n^a``, estimated from the
    choice on ``smaller_folds`` folds (smaller training sets), ``a`` held to [0, 1]: a count
    that does not grow is kept, and none grows faster than the reports. Rounded, never below
    ``chosen``."""
    share, smaller_share = 1 - 1 / folds, 1 - 1 / smaller_folds
    if smaller <= 0 or chosen <= 0:
        factor = 1 / share if chosen > 0 else 1.0
    else:
        power = math.log(chosen / smaller) / math.log(share / smaller_share)
        factor = share ** -min(max(power, 0.0), 1.0)
    return max(chosen, math.floor(chosen * factor + 0.5))


class IBU:
    """The Iterative Bayesian Update (EM for the maximum-likelihood distribution).

    Starting from the uniform distribution, each step is
    ``p_x <- p_x * sum_y C[x, y] q_y / (p C)_y``; the log-likelihood never
    decreases.

    Run to convergence, IBU fits the noise: with few reports per output its
    reconstruction gets worse as iterations grow (it is Richardson-Lucy
    deconvolution). Early iterations are shrunk towards the uniform start, so
    the iteration count is the strength of a regulariser, and the default
    ``stopping="cv"`` chooses it by ``folds``-fold cross-validation: every
    report is put in one of ``folds`` folds at random (a multinomial split of
    each count, seeded); IBU runs on each fold's complement and, at
    checkpoints (every iteration up to 20, then about every 5%), scores the
    held-out fold's log-likelihood under its predicted report distribution.
    The curves are followed until the best summed score is ``patience``
    iterations old (at least 20, at least a quarter of the best count) or every fold
    has converged; past :data:`GAIN_SE_AFTER` iterations, a later checkpoint becomes
    the best only where its summed score beats the best so far by more than
    ``gain_se`` standard errors of the per-fold gains, and once a checkpoint has
    scored below the best, by more than ``regain_se`` of them. The iteration count chosen
    is the smallest whose summed score is within ``se_rule`` standard errors of
    the best (the errors from the spread of the per-fold differences; ``0`` takes
    the best itself), and IBU is run that long on all reports; with ``discrepancy_sd``,
    it stops sooner where its fit to all the reports is already within their noise
    (:func:`within_noise`), unless the chosen count's held-out score beats that one's by
    more than ``beyond_noise_se`` standard errors. ``stopping="tolerance"`` runs until no
    frequency changes by more than ``tol`` (or ``max_iter``), which is the
    plain maximum-likelihood estimate. ``start="reports"`` starts from the
    report shares instead of uniform shares (for channels whose reports are
    values of the same domain, e.g. the geometric mechanism), so that early
    iterations are shrunk towards the reports.

    Every step is charged to the current work budget
    (:mod:`aggregator.estimation.budget`): ``n_inputs`` units per step and fold.

    Parameters
    ----------
    stopping : {"cv", "tolerance"}
    tol : float
        Convergence threshold on the largest change of a frequency in one step.
    max_iter : int
        Iteration cap.
    seed : int
        Seed of the cross-validation split (estimates are reproducible).
    folds : int
        Cross-validation folds (at least 2).
    se_rule : float
        How many standard errors below the best score a smaller (more regularised)
        iteration count may score and still be chosen.
    gain_se : float
        How many standard errors a later iteration count's score must gain on the
        best so far to become the best, past :data:`GAIN_SE_AFTER` iterations
        (``0``: any gain).
    regain_se : float
        The same, at any iteration, once a checkpoint has scored below the best so far
        (``0``: any gain).
    discrepancy_sd : float or None
        Stop the run on all reports at the first iteration count (after the first step
        from uniform shares) whose fit is within the reports' noise by this many standard
        deviations of Pearson's statistic (:func:`within_noise`; channels with
        ``report_variance`` only); ``None``: the count cross-validation chose.
    beyond_noise_se : float
        With ``discrepancy_sd``: how many standard errors of the per-fold gains the
        held-out score at cross-validation's count must gain on the one at the count within
        the noise for the run to go on to it.
    start : {"uniform", "reports"}
    extrapolate_from : int or None
        Cross-validation chooses the count for ``(folds - 1) / folds`` of the reports, and
        the count IBU needs grows with the reports. With this many folds (fewer: smaller
        training sets) the choice is made again, and ``folds``' choice is scaled to all the
        reports by the growth between the two (:func:`extrapolated_count`); ``None``: not.

    Attributes
    ----------
    frequencies_, n_iter_, converged_, log_likelihood_,
    log_likelihood_history_ (one value per iteration, on all reports),
    cv_iterations_ and cv_scores_ (the checkpoints and their summed held-out
    scores, ``stopping="cv"`` only), cv_score_ (the chosen count's, or None),
    cv_n_iter_ (the count cross-validation chose, before ``discrepancy_sd``, or None),
    cv_smaller_n_iter_ (``extrapolate_from``'s choice, or None),
    within_noise_ (whether the run stopped sooner, where its fit was within the noise),
    warnings_ (human-readable strings).
    """

    # Fitted by fit().
    cv_iterations_: np.ndarray | None
    cv_scores_: np.ndarray | None
    cv_score_: float | None
    cv_smaller_n_iter_: int | None
    warnings_: list[str]

    def __init__(
        self,
        *,
        stopping: str = "cv",
        tol: float = 1e-9,
        max_iter: int = 10_000,
        seed: int = 0,
        record_history: bool = False,
        folds: int = DEFAULT_FOLDS,
        se_rule: float = 0.0,
        gain_se: float = 0.0,
        regain_se: float = 0.0,
        discrepancy_sd: float | None = None,
        beyond_noise_se: float = 2.0,
        start: str = "uniform",
        extrapolate_from: int | None = None,
    ):
        if stopping not in STOPPING:
            raise ValueError(f"stopping must be one of {STOPPING}, got {stopping!r}")
        if not (tol >= 0 and np.isfinite(tol)):
            raise ValueError(f"tol must be finite and >= 0, got {tol!r}")
        if int(max_iter) < 1:
            raise ValueError(f"max_iter must be >= 1, got {max_iter!r}")
        if int(folds) < 2:
            raise ValueError(f"folds must be >= 2, got {folds!r}")
        if not (se_rule >= 0 and np.isfinite(se_rule)):
            raise ValueError(f"se_rule must be finite and >= 0, got {se_rule!r}")
        if not (gain_se >= 0 and np.isfinite(gain_se)):
            raise ValueError(f"gain_se must be finite and >= 0, got {gain_se!r}")
        if not (regain_se >= 0 and np.isfinite(regain_se)):
            raise ValueError(f"regain_se must be finite and >= 0, got {regain_se!r}")
        if discrepancy_sd is not None and not np.isfinite(discrepancy_sd):
            raise ValueError(f"discrepancy_sd must be finite or None, got {discrepancy_sd!r}")
        if not (beyond_noise_se >= 0 and np.isfinite(beyond_noise_se)):
            raise ValueError(f"beyond_noise_se must be finite and >= 0, got {beyond_noise_se!r}")
        if start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, got {start!r}")
        if extrapolate_from is not None and not 2 <= int(extrapolate_from) < int(folds):
            raise ValueError(
                f"extrapolate_from must be None or from 2 to folds - 1, got {extrapolate_from!r}"
            )
        self.stopping = stopping
        self.tol = tol
        self.max_iter = int(max_iter)
        self.seed = seed
        self.record_history = record_history
        self.folds = int(folds)
        self.se_rule = float(se_rule)
        self.gain_se = float(gain_se)
        self.regain_se = float(regain_se)
        self.discrepancy_sd = None if discrepancy_sd is None else float(discrepancy_sd)
        self.beyond_noise_se = float(beyond_noise_se)
        self.start = start
        self.extrapolate_from = None if extrapolate_from is None else int(extrapolate_from)

    def _run(self, counts, channel, n_iter: int | None, to_noise: bool = False):
        """IBU on ``counts`` for ``n_iter`` steps, or until converged if ``None``; with
        ``to_noise``, no further than the first count whose fit is within the reports' noise
        (:func:`within_noise`; after the first step from uniform shares).

        Returns the steps (their estimate and its report distribution), the
        steps taken, whether it converged, and the log-likelihood history.
        """
        steps = _steps(channel, counts, self.start)
        limit = self.max_iter if n_iter is None else n_iter
        least = 1 if self.start == "uniform" else 0
        history = []
        if self.record_history or to_noise:
            taken, change = 0, np.inf
            while taken < limit and not change <= self.tol:
                if to_noise and taken >= least:
                    assert self.discrepancy_sd is not None
                    if within_noise(counts, steps, channel, self.discrepancy_sd):
                        break
                # The fit is checked at the cross-validation's checkpoints (every step up
                # to 20, then about every 5%).
                stride = 1 if self.record_history else min(_next_checkpoint(taken), limit) - taken
                done, change = advance_charged(steps, stride, self.tol, channel.n_inputs)
                taken += done
                if self.record_history:
                    history.append(log_likelihood(counts, steps.predicted))
        else:
            taken, change = advance_charged(steps, limit, self.tol, channel.n_inputs)
        return steps, taken, bool(change <= self.tol), history

    def _cross_validate(self, counts, channel) -> int:
        """The iteration count chosen by cross-validation (see the class docstring)."""
        held_out = held_out_folds(counts, self.folds, self.seed)
        train = counts[None, :] - held_out
        self.cv_iterations_, self.cv_scores_ = np.zeros(0, dtype=int), np.zeros(0)
        if held_out.shape[0] < 2 or np.any(train.sum(axis=1) <= 0):
            kept = (
                "one iteration was run (an estimate close to uniform)"
                if self.start == "uniform"
                else "the report shares were kept"
            )
            reports = int(counts.sum())
            self.warnings_.append(
                f"only {reports} report{'' if reports == 1 else 's'}: too few to choose the "
                f"number of IBU iterations by cross-validation, so {kept}"
            )
            return 1 if self.start == "uniform" else 0
        folds = _fold_steps(channel, train, self.start)
        start_scores = held_out_scores(held_out, folds.predicted())
        # From the report shares, keeping them (no iteration) is a candidate too.
        iterations, per_fold = ([0], [start_scores]) if self.start == "reports" else ([], [])
        done, best, fell = 0, 0, False
        while done < self.max_iter:
            target = min(_next_checkpoint(done), self.max_iter)
            while done < target:
                chunk = min(CHUNK_STEPS, target - done)
                budget.charge(chunk * channel.n_inputs * held_out.shape[0])
                change = folds.advance(chunk)
                done += chunk
            iterations.append(done)
            per_fold.append(held_out_scores(held_out, folds.predicted()))
            if self._improves(done, per_fold[-1], per_fold[best], fell):
                best, fell = len(per_fold) - 1, False
            else:
                fell = fell or per_fold[-1].sum() < per_fold[best].sum()
            if change <= self.tol:
                break
            if done - iterations[best] >= max(PATIENCE_MIN, PATIENCE_FRACTION * iterations[best]):
                break
        else:
            self.warnings_.append(
                f"the cross-validated score was still rising at the iteration cap "
                f"({self.max_iter}): the estimate may be smoother than the data allow"
            )
        scores = np.asarray(per_fold)
        totals = scores.sum(axis=1)
        chosen = best
        for index in range(best):
            if totals[best] - totals[index] <= self.se_rule * paired_se(
                scores[best] - scores[index]
            ):
                chosen = index
                break
        if self.start == "uniform" and totals[chosen] - start_scores.sum() <= paired_se(
            scores[chosen] - start_scores
        ):
            self.warnings_.append(
                "the held-out reports are fitted no better by this estimate than by the uniform "
                "distribution (within one standard error): differences between rows may be noise"
            )
        self.cv_iterations_, self.cv_scores_ = np.asarray(iterations), totals
        self._cv_fold_scores = scores
        self.cv_score_ = float(totals[chosen])
        return iterations[chosen]

    def _improves(self, iteration: int, scores: np.ndarray, best: np.ndarray, fell: bool) -> bool:
        """Whether the per-fold held-out ``scores`` at ``iteration`` beat the ``best`` so far:
        by more than ``gain_se`` standard errors of their per-fold differences past
        :data:`GAIN_SE_AFTER` iterations, by anything before; once the score has ``fell``
        below the best, by more than ``regain_se`` of them as well."""
        gain = scores.sum() - best.sum()
        required = self.gain_se if iteration > GAIN_SE_AFTER else 0.0
        if fell:
            required = max(required, self.regain_se)
        if required == 0.0:
            return gain > 0.0
        return gain > required * paired_se(scores - best)

    def _gains_beyond(self, within: int, chosen: int) -> bool:
        """Whether the held-out score at cross-validation's ``chosen`` count beats the one at
        the count ``within`` the reports' noise by more than ``beyond_noise_se`` standard
        errors of the per-fold gains (both are checkpoints; else False)."""
        assert self.cv_iterations_ is not None  # cross-validation ran
        iterations = list(self.cv_iterations_)
        if within not in iterations or chosen not in iterations:
            return False
        scores = self._cv_fold_scores
        gains = scores[iterations.index(chosen)] - scores[iterations.index(within)]
        return bool(gains.sum() > self.beyond_noise_se * paired_se(gains))

    def fit(self, counts, channel, n_iter: int | None = None) -> IBU:
        """Estimate from ``counts``; ``n_iter`` forces a fixed number of iterations."""
        counts = report_counts(counts, channel)
        if self.start == "reports" and channel.n_inputs != channel.n_outputs:
            raise ValueError("IBU can start from the report shares only where reports are values")
        self.n_ = counts.sum()
        self.cv_iterations_ = self.cv_scores_ = self.cv_score_ = self.cv_n_iter_ = None
        self.cv_smaller_n_iter_ = None
        self._cv_fold_scores = np.zeros((0, 0))
        self.warnings_ = []
        to_noise = False
        if n_iter is None and self.stopping == "cv":
            n_iter = self.cv_n_iter_ = self._cross_validate(counts, channel)
            # Only where cross-validation ran (it keeps its per-fold scores).
            if self.extrapolate_from is not None and self._cv_fold_scores.size:
                n_iter = self._extrapolated(counts, channel, n_iter)
            to_noise = self.discrepancy_sd is not None and hasattr(channel, "report_variance")
        self._asked = n_iter
        steps, taken, converged, history = self._run(counts, channel, n_iter, to_noise)
        self.within_noise_ = False
        if to_noise and n_iter is not None and taken < n_iter and not converged:
            self.within_noise_ = not self._gains_beyond(taken, n_iter)
            if not self.within_noise_:
                more, change = advance_charged(steps, n_iter - taken, self.tol, channel.n_inputs)
                taken, converged = taken + more, bool(change <= self.tol)
        self.frequencies_ = steps.p.copy()
        self.n_iter_ = taken
        # With a chosen iteration count, reaching it is the stopping rule firing.
        self.converged_ = converged or n_iter is not None
        self.log_likelihood_ = log_likelihood(counts, steps.predicted)
        self.log_likelihood_history_ = np.asarray(history)
        return self

    def _extrapolated(self, counts: np.ndarray, channel, chosen: int) -> int:
        """``chosen`` (cross-validation's count) scaled to all the reports by how the choice
        grows from ``extrapolate_from`` folds' (on the same rules and seed)."""
        assert self.extrapolate_from is not None
        smaller = IBU(
            max_iter=self.max_iter,
            seed=self.seed,
            folds=self.extrapolate_from,
            se_rule=self.se_rule,
            gain_se=self.gain_se,
            regain_se=self.regain_se,
            start=self.start,
        )
        smaller.warnings_ = []  # its own, not the estimate's
        self.cv_smaller_n_iter_ = smaller._cross_validate(counts, channel)
        return extrapolated_count(
            chosen, self.cv_smaller_n_iter_, self.folds, self.extrapolate_from
        )

    def replay(self, counts, channel) -> np.ndarray:
        """The last fit's regularisation (its iteration count) on other counts, e.g. a
        bootstrap's redrawn ones. A new estimator each call, so that calls may run at once.

        Where the channel's products act by row, ``counts`` may be several sets, one per row,
        run side by side (:func:`steps_on_rows`)."""
        counts = np.asarray(counts, dtype=float)
        if counts.ndim == 2 and channel.products_by_row:
            return steps_on_rows(channel, counts, self.n_iter_, self.start)
        again = IBU(stopping="tolerance", seed=self.seed, start=self.start)
        return again.fit(counts, channel, n_iter=self.n_iter_).frequencies_

    def describe(self) -> str:
        """What the last :meth:`fit` ran, in words (for the estimate API's ``estimator``)."""
        steps = f"{self.n_iter_} iteration{'' if self.n_iter_ == 1 else 's'}"
        if self.start == "reports":
            steps += " from the report shares"
        if self.cv_iterations_ is not None and self.cv_iterations_.size:
            rule = "" if self.se_rule == 0 else f", {self.se_rule:g}-standard-error rule"
            if self.within_noise_:
                return (
                    f"IBU, stopped at {steps}, where it fitted the reports within their noise "
                    f"({self.folds}-fold cross-validation chose {self.cv_n_iter_})"
                )
            smaller = self.extrapolate_from
            if self.cv_smaller_n_iter_ is not None and smaller is not None:
                rule += (
                    f" (it chose {self.cv_n_iter_} on {self.folds - 1}/{self.folds} of the "
                    f"reports and {self.cv_smaller_n_iter_} on {smaller - 1}/{smaller}; the "
                    f"count scaled to all of them)"
                )
            if self._asked is not None and self.n_iter_ < self._asked:
                return (
                    f"IBU, converged after {steps}, before the {self._asked} chosen by "
                    f"{self.folds}-fold cross-validation{rule}"
                )
            return f"IBU, stopped at {steps} by {self.folds}-fold cross-validation{rule}"
        if self.cv_iterations_ is not None:
            return f"IBU, {steps} (too few reports to cross-validate)"
        state = "converged" if self.converged_ and self.stopping == "tolerance" else "fixed"
        return f"IBU, {steps} ({state})"


class TwoStartIBU:
    """Two cross-validated IBU runs, one from equal shares and one from the report shares,
    averaged with weights ``exp(score / temperature)`` of their summed held-out
    log-likelihoods (the same folds for both).

    For channels whose reports are values of the input domain (the geometric mechanism):
    stopped early, IBU from equal shares is shrunk towards equal shares, which suits a
    spread-out truth; IBU from the report shares is shrunk towards the reports, which are
    already close where the truth is piled against an end of the range (the clamped noise
    moves little of it). Where the held-out reports cannot tell the two apart, as with a few
    hundred reports, both count about equally. Each run stops where its fit to all the reports
    is within their noise, if cross-validation would run it further
    (:data:`GEOMETRIC_DISCREPANCY_SD`, :func:`within_noise`).

    At a high epsilon the mix is then mixed with the raw report shares, which are nearly the
    users' own answers there (:func:`raw_report_weight`; ``raw_mix=False`` leaves it out).

    Attributes
    ----------
    frequencies_, n_iter_ (of the run with the larger weight), converged_, log_likelihood_,
    warnings_, weight_ (the run from equal shares'), raw_weight_ (the raw report shares'),
    runs_ (the two fitted :class:`IBU`).
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        temperature: float = TWO_STARTS_TEMPERATURE,
        raw_mix: bool = True,
    ):
        if not (temperature > 0 and np.isfinite(temperature)):
            raise ValueError(f"temperature must be finite and > 0, got {temperature!r}")
        self.seed = seed
        self.temperature = float(temperature)
        self.raw_mix = raw_mix

    def fit(self, counts, channel) -> TwoStartIBU:
        counts = report_counts(counts, channel)
        self.runs_ = [
            IBU(
                seed=self.seed,
                folds=DEFAULT_FOLDS,
                gain_se=GEOMETRIC_GAIN_SE,
                discrepancy_sd=GEOMETRIC_DISCREPANCY_SD,
                beyond_noise_se=GEOMETRIC_BEYOND_NOISE_SE,
                start=start,
            ).fit(counts, channel)
            for start in STARTS
        ]
        uniform_run, reports_run = self.runs_
        if uniform_run.cv_score_ is None or reports_run.cv_score_ is None:
            self.weight_ = 0.5  # too few reports to cross-validate
        else:
            gap = uniform_run.cv_score_ - reports_run.cv_score_
            self.weight_ = float(expit(gap / self.temperature))
        runs = self._mix(uniform_run.frequencies_, reports_run.frequencies_)
        self.raw_weight_ = 0.0
        replays = 2 * counts.size * counts.size * (uniform_run.n_iter_ + reports_run.n_iter_)
        if self.raw_mix and replays <= RAW_MIX_MAX_WORK:
            self.raw_weight_ = raw_report_weight(counts, channel, runs, self._replay_runs)
        self.frequencies_ = self._with_raw(runs, counts)
        self.log_likelihood_ = log_likelihood(counts, channel.forward(self.frequencies_))
        self.n_iter_ = (uniform_run if self.weight_ >= 0.5 else reports_run).n_iter_
        self.converged_ = uniform_run.converged_ and reports_run.converged_
        self.warnings_ = list(dict.fromkeys(w for run in self.runs_ for w in run.warnings_))
        return self

    def _mix(self, from_uniform: np.ndarray, from_reports: np.ndarray) -> np.ndarray:
        return self.weight_ * from_uniform + (1.0 - self.weight_) * from_reports

    def _with_raw(self, runs: np.ndarray, counts: np.ndarray) -> np.ndarray:
        shares = counts / counts.sum(axis=-1, keepdims=True)
        return (1.0 - self.raw_weight_) * runs + self.raw_weight_ * shares

    def _replay_runs(self, counts, channel) -> np.ndarray:
        return self._mix(*(run.replay(counts, channel) for run in self.runs_))

    def replay(self, counts, channel) -> np.ndarray:
        """Both runs' iteration counts and the weights of the last fit, on other counts (one
        set per row, side by side, as :meth:`IBU.replay`)."""
        return self._with_raw(self._replay_runs(counts, channel), np.asarray(counts, float))

    def describe(self) -> str:
        uniform_run, reports_run = self.runs_
        text = (
            f"IBU from equal shares ({_iterations(uniform_run)}) and from the report "
            f"shares ({_iterations(reports_run)}), each stopped by {DEFAULT_FOLDS}-fold "
            "cross-validation or, sooner, where it fitted the reports within their noise, "
            f"weighted {self.weight_:.2f} and {1.0 - self.weight_:.2f} by their held-out "
            "likelihoods"
        )
        if self.raw_weight_ > 0.0:
            text += (
                f"; {self.raw_weight_:.0%} the raw report shares (nearly the users' own answers "
                "at this epsilon; the share chosen by an unbiased estimate of the error)"
            )
        return text


def _iterations(run: IBU) -> str:
    """A run's iteration count in words, and cross-validation's where it stopped sooner."""
    text = f"{run.n_iter_} iteration{'' if run.n_iter_ == 1 else 's'}"
    if run.within_noise_:
        text += f"; cross-validation chose {run.cv_n_iter_}"
    return text


class _CheckedAgainstReports:
    """What an estimate checked against the raw report shares (:func:`check_against_reports`)
    shares: its survey count and seed, the choice between the estimator's fit and the report
    shares once ``check_`` is set, and the words for it (``UNIT``, ``MEASURE``)."""

    UNIT: str
    MEASURE: str
    check_: ReportsCheck | None

    def __init__(self, *, seed: int = 0, surveys: int = REPORTS_CHECK_SURVEYS):
        if int(surveys) < 1:
            raise ValueError(f"surveys must be >= 1, got {surveys!r}")
        self.seed = seed
        self.surveys = int(surveys)

    def _settle(self, counts: np.ndarray, channel, fitted) -> None:
        """``frequencies_`` and the rest from ``check_``: the report shares where it kept
        them, else ``fitted``'s estimate."""
        self.kept_reports_ = self.check_ is not None and self.check_.rival_wins
        self.frequencies_ = counts / counts.sum() if self.kept_reports_ else fitted.frequencies_
        self.log_likelihood_ = log_likelihood(counts, channel.forward(self.frequencies_))
        self.warnings_ = list(fitted.warnings_)

    def _described(self, fitted: str) -> str:
        if self.check_ is None or not self.kept_reports_:
            return fitted
        return self.check_.describe(fitted, self.UNIT, self.MEASURE)


class GridIBU(_CheckedAgainstReports):
    """IBU stopped by cross-validation, or the raw report shares where those are the closer
    to the users' own cells (channels on a grid whose reports are its cells:
    :class:`~aggregator.estimation.channels.GridKernelChannel`).

    Cross-validation scores how well an estimate predicts held-out reports, that is, the
    population the users are drawn from. Where the noise moves a report less than a cell or
    so (a high epsilon for the cell size), that population estimate is a blur of the reports
    (one or two IBU steps from equal shares), further from the users who reported than their
    reports themselves. So the two are compared where they are judged: ``surveys`` surveys are
    simulated from IBU's estimate (its users drawn from it, each user's report through the
    channel), IBU is replayed on each survey's reports with the same iteration count, and
    the raw report shares are kept if their mean :func:`~aggregator.estimation.transport.
    dyadic_transport` distance to the survey's users is smaller than the replayed IBU's. Where
    the estimate cannot afford that (:func:`affordable_check`, :data:`REPORTS_CHECK_MAX_WORK`),
    IBU is kept unchecked.

    Attributes
    ----------
    frequencies_, n_iter_ (0 where the report shares are kept), converged_, log_likelihood_,
    warnings_, ibu_ (the fitted :class:`IBU`), check_ (a :class:`ReportsCheck`, distances in
    cells, or None: not checked), kept_reports_.
    """

    UNIT, MEASURE = "cells", "a mean transport, in cells,"

    def fit(self, counts, channel) -> GridIBU:
        counts = report_counts(counts, channel)
        self.ibu_ = IBU(
            seed=self.seed,
            folds=DEFAULT_FOLDS,
            regain_se=GRID_REGAIN_SE,
            extrapolate_from=GRID_EXTRAPOLATE_FROM,
        ).fit(counts, channel)
        self.check_ = self._check(counts, channel)
        self._settle(counts, channel, self.ibu_)
        self.n_iter_ = 0 if self.kept_reports_ else self.ibu_.n_iter_
        self.converged_ = self.ibu_.converged_
        return self

    def _check(self, counts: np.ndarray, channel: GridKernelChannel) -> ReportsCheck | None:
        n = round(float(counts.sum()))
        if n < 1:
            return None

        def distance(fits: np.ndarray, users: np.ndarray) -> np.ndarray:
            return dyadic_transport(fits, users, channel.rows, channel.cols)

        return affordable_check(
            self.surveys * (channel.draw_work(n) + self.ibu_.n_iter_ * channel.n_inputs),
            REPORTS_CHECK_MAX_WORK,
            lambda: check_against_reports(
                counts,
                channel,
                self.ibu_.frequencies_,
                lambda reports: self.ibu_.replay(reports, channel),
                distance,
                surveys=self.surveys,
                seed=self.seed,
            ),
        )

    def replay(self, counts, channel) -> np.ndarray:
        """The last fit's choice on other counts: the report shares, or IBU with its
        iteration count."""
        if self.kept_reports_:
            counts = np.asarray(counts, dtype=float)
            return counts / counts.sum()
        return self.ibu_.replay(counts, channel)

    def describe(self) -> str:
        return self._described(self.ibu_.describe())


@dataclass(frozen=True)
class ReportsCheck:
    """An estimate against a rival, by default the raw report shares, on surveys simulated
    (:func:`check_against_reports`): the mean distances of each to the surveys' users, the
    standard error of their mean difference, and the margin the rival had to win by (in
    standard errors)."""

    surveys: int
    estimate: float
    rival: float
    se: float
    margin: float

    @property
    def rival_wins(self) -> bool:
        return self.estimate - self.rival > self.margin * self.se

    def describe(self, estimate: str, unit: str, measure: str) -> str:
        """The ``estimator`` text of an estimate that kept the report shares."""
        return (
            f"the raw report shares: in {self.surveys} surveys simulated from {estimate}, they "
            f"were closer to the users' own {unit} than that estimate ({measure} of "
            f"{self.rival:.3g} against {self.estimate:.3g})"
        )


def affordable_check(work: int, cap: int, run: Callable[[], ReportsCheck]) -> ReportsCheck | None:
    """``run()``, a check of the estimate's choice, where its expected ``work`` is at most
    ``cap`` and at most half of what the estimate's work budget has left, on that share of the
    budget (:func:`budget.share`: and on half the time left); None where it cannot afford it.
    A check can turn out to cost more than expected (a survey's refit can cost more than the
    fit it repeats); it is then left unfinished, and None returned, so that the estimate never
    fails for it."""
    left = budget.remaining()
    allowed = cap if left is None else min(cap, left // 2)
    if work > allowed:
        return None
    try:
        with budget.share(allowed):
            return run()
    except budget.ShareExhausted:
        return None


def check_against_reports(
    counts: np.ndarray,
    channel,
    estimate: np.ndarray,
    refit,
    distance,
    *,
    surveys: int = REPORTS_CHECK_SURVEYS,
    seed: int = 0,
    margin: float = 0.0,
    rival=None,
) -> ReportsCheck:
    """``estimate`` against the raw report shares (or ``rival``), where the two are judged:
    against the users who reported.

    ``surveys`` surveys are simulated from ``estimate`` (as many users as reports drawn from it,
    each user's report through ``channel.draw_reports``); on each, ``refit(reports)`` (the
    estimator, its regularisation replayed or run again) and the survey's report shares, or
    ``rival(reports)``, are scored by ``distance(fits, users)`` (both as rows, against the
    users' shares). The surveys run on the estimate's threads, each from its own seed, so the
    result does not depend on them.
    """
    n = round(float(counts.sum()))
    shares = np.clip(estimate, 0.0, None)
    shares /= shares.sum()

    def survey(index: int) -> np.ndarray:
        budget.charge(channel.draw_work(n))
        generator = np.random.default_rng([seed, index])
        users = generator.multinomial(n, shares)
        reports = channel.draw_reports(users, generator)
        second = reports / n if rival is None else rival(reports)
        return distance(np.stack([refit(reports), second]), users / n)

    alone = not channel.steps_run_in_parallel
    scores = np.asarray(parallel.map_ordered(survey, range(surveys), alone=alone))
    differences = scores[:, 0] - scores[:, 1]
    se = float(np.std(differences, ddof=1) / np.sqrt(surveys)) if surveys > 1 else 0.0
    return ReportsCheck(surveys, float(scores[:, 0].mean()), float(scores[:, 1].mean()), se, margin)


class KRRCheckedAgainstReports(_CheckedAgainstReports):
    """k-RR's default over three categories or more (empirical Bayes, or the posterior median
    at a high epsilon), checked on surveys simulated (:func:`check_against_reports`; the
    estimators run again on each, where the estimate can afford it: :func:`affordable_check`,
    :data:`KRR_REPORTS_CHECK_MAX_WORK`):

    * where empirical Bayes takes its posterior means alone (the prior is clearly supported),
      against the maximum-likelihood shares (:meth:`KRRChannel.maximum_likelihood`), on
      surveys from :func:`measured_spread`: with few categories and strong signal the prior
      fitted to a handful of counts pools shares the reports tell apart;
    * else against the raw report shares, on surveys simulated from the estimate: where
      near-uniform shares are measured finely, the fitted prior can pool shares that the
      reports had told apart.

    Either rival is taken where its mean total variation to the surveys' users is the smaller
    by :data:`KRR_LIKELIHOOD_CHECK_MARGIN` or :data:`KRR_REPORTS_CHECK_MARGIN` standard errors.

    Attributes
    ----------
    frequencies_, n_iter_ and converged_ (None), log_likelihood_, warnings_, inner_ (the fitted
    estimator), likelihood_check_ (a :class:`ReportsCheck` of the maximum-likelihood shares,
    or None: not run), took_likelihood_, check_ (a :class:`ReportsCheck` of the raw shares, or
    None: not checked), kept_reports_.
    """

    UNIT, MEASURE = "answers", "a mean total variation"

    def __init__(self, make, *, seed: int = 0, surveys: int = REPORTS_CHECK_SURVEYS):
        super().__init__(seed=seed, surveys=surveys)
        self.make = make

    def fit(self, counts, channel) -> KRRCheckedAgainstReports:
        counts = report_counts(counts, channel)
        with budget.metered() as fit_work:
            self.inner_ = self.make().fit(counts, channel)
        self.check_ = self.likelihood_check_ = None
        n = round(float(counts.sum()))

        def refit(reports: np.ndarray) -> np.ndarray:
            return self.make().fit(reports, channel).frequencies_

        def check(start: np.ndarray, margin: float, rival=None) -> ReportsCheck | None:
            # A survey's users and reports (a unit per category) and the estimator's refit;
            # either rival costs next to nothing.
            return affordable_check(
                self.surveys * (channel.draw_work(n) + fit_work()),
                KRR_REPORTS_CHECK_MAX_WORK,
                lambda: check_against_reports(
                    counts,
                    channel,
                    start,
                    refit,
                    total_variations,
                    surveys=self.surveys,
                    seed=self.seed,
                    margin=margin,
                    rival=rival,
                ),
            )

        margin = KRR_LIKELIHOOD_CHECK_MARGIN
        supported = isinstance(self.inner_, KRREmpiricalBayes) and self.inner_.weight_ == 1.0
        # Whether a check of the same refits was tried and could not be afforded (too costly
        # beforehand, or left unfinished): the raw shares' would not be either.
        unaffordable = False
        if n >= 1 and supported and margin is not None:
            likelihood = channel.maximum_likelihood(counts)
            world = measured_spread(counts, channel, likelihood)
            # Where the reports measure no spread, surveys of equal shares: pooling wins.
            if np.ptp(world) > 0.0:
                self.likelihood_check_ = check(world, margin, channel.maximum_likelihood)
                unaffordable = self.likelihood_check_ is None
        fitted = self.inner_
        if self.took_likelihood_:
            fitted = _Fitted(likelihood, list(self.inner_.warnings_))
        elif n >= 1 and not unaffordable:
            self.check_ = check(self.inner_.frequencies_, KRR_REPORTS_CHECK_MARGIN)
        self._settle(counts, channel, fitted)
        self.n_iter_ = self.converged_ = None
        return self

    @property
    def took_likelihood_(self) -> bool:
        """Whether the estimate is the maximum-likelihood shares (their check found them the
        closer)."""
        return self.likelihood_check_ is not None and self.likelihood_check_.rival_wins

    def describe(self) -> str:
        check = self.likelihood_check_
        if check is not None and check.rival_wins:
            return (
                "maximum likelihood (the shares that make the reports most likely): in "
                f"{check.surveys} surveys simulated with the spread of shares the reports measure, "
                f"it was closer to the users' own answers than {self.inner_.describe()} (a mean "
                f"total variation of {check.rival:.3g} against {check.estimate:.3g})"
            )
        return self._described(self.inner_.describe())


@dataclass(frozen=True)
class _Fitted:
    """An estimate chosen in place of a fitted estimator's: what :meth:`_settle` reads."""

    frequencies_: np.ndarray
    warnings_: list[str]


def total_variations(fits: np.ndarray, users: np.ndarray) -> np.ndarray:
    """Each row of ``fits`` against ``users``' shares."""
    return 0.5 * np.abs(fits - users).sum(axis=-1)


def measured_spread(counts: np.ndarray, channel: KRRChannel, shares: np.ndarray) -> np.ndarray:
    """``shares`` (k-RR's maximum-likelihood ones) drawn towards equal shares until their
    spread is what the reports measure: their squared distance from equal shares less the
    unbiased inversion's variance (at the report shares ``shares`` predict: the observed ones
    have no variance where every report is on one category), the positive-part James-Stein
    factor. Surveys simulated from the maximum-likelihood shares themselves carry the counts'
    noise as spread, which favours those shares (they were taken over 1,000 categories, where
    pooling is far better); where the reports carry little signal these are nearly equal
    shares."""
    n, k = counts.sum(), counts.size
    predicted = channel.forward(shares)
    excess = channel.p_keep - channel.p_other
    noise = float(np.sum(predicted * (1.0 - predicted))) / (n * excess**2)
    apart = shares - 1.0 / k
    spread = float(apart @ apart)
    factor = max(0.0, 1.0 - noise / spread) if spread > 0.0 else 0.0
    return 1.0 / k + factor * apart


def raw_report_weight(counts: np.ndarray, channel, estimate: np.ndarray, replay) -> float:
    """The weight of the raw report shares in a mix with ``estimate`` (the geometric default),
    or 0.

    Where the mechanism's noise is a small part of the report counts' variance (less than
    :data:`RAW_MIX_MAX_NOISE_SHARE`), the reports are nearly the users' own answers, and an
    estimate regularised for a population they are drawn from (IBU's stopping) is further
    from those users' distribution than the reports themselves. The weight minimises Stein's
    unbiased estimate of the mix's squared error for the users who reported: with ``c`` the
    counts, ``Sigma`` their covariance under the mechanism alone (the users' values fixed at
    ``estimate``), ``p`` the unbiased inversion and ``J`` the derivative of ``replay`` (the
    estimate's regularisation replayed on other counts) in the counts, the estimated error of
    ``w e + (1 - w) r`` is ``|w (e - p) + (1 - w) (r - p)|^2 + 2 tr((w J + (1 - w) / n)
    Sigma C^-1) / n`` up to a constant. Over at most :data:`RAW_MIX_MAX_VALUES` values (``J``
    takes two replays per value; :class:`TwoStartIBU` also bounds their work by
    :data:`RAW_MIX_MAX_WORK`).
    """
    if not isinstance(channel, GeometricChannel) or counts.size > RAW_MIX_MAX_VALUES:
        return 0.0
    n, k = counts.sum(), counts.size
    rows = channel.forward(np.eye(k))  # C, a row per true value
    shares = np.clip(estimate, 0.0, None)
    users = n * shares / shares.sum()
    sigma = np.diag(users @ rows) - (rows.T * users) @ rows
    predicted = users @ rows / n
    if np.trace(sigma) >= RAW_MIX_MAX_NOISE_SHARE * n * np.sum(predicted * (1.0 - predicted)):
        return 0.0
    apart = estimate - counts / n
    spread = float(apart @ apart)
    if spread <= 0.0:  # the estimate is the raw shares already
        return 0.0
    # The geometric channel's inverse is exact and acts by row: Sigma C^-1 in one call.
    inverse = channel.solve_with_info(counts / n)[0]
    sigma_inverse = channel.solve_with_info(sigma)[0]
    # Each count moved up by one, and down by one where it can be (a one-sided step at 0).
    down = (counts >= 1.0).astype(float)
    # The geometric channel's products act by row: every moved count's replay side by side.
    derivative = (replay(counts + np.eye(k), channel) - replay(counts - np.diag(down), channel)).T
    derivative = derivative / (1.0 + down)
    raw_off = counts / n - inverse
    slope = np.trace(derivative @ sigma_inverse) / n - np.trace(sigma_inverse) / n**2
    return float(np.clip(1.0 + (raw_off @ apart + slope) / spread, 0.0, 1.0))


# What the estimate API and the simulator fit: one of the estimators above.
Estimator = (
    IBU
    | TwoStartIBU
    | GridIBU
    | KRRCheckedAgainstReports
    | KRREmpiricalBayes
    | PosteriorMedian
    | MatrixInversion
)


def paired_se(differences: np.ndarray) -> float:
    """The standard error of a sum of per-fold score differences."""
    if differences.size < 2:
        return 0.0
    return float(np.sqrt(differences.size * np.var(differences, ddof=1)))


def default_method(channel) -> str:
    """The estimation method the service uses by default for ``channel`` (docs/estimation.md),
    or for the mechanism it is built from.

    ``"projection"`` for the large-domain frequency oracles (OLH, Hadamard response), whose
    IBU steps hash every value under every seed.

    ``"posterior_median"`` for randomized response (k-RR over two labels), for k-RR over more
    at a high epsilon (the mechanism's noise under :data:`POSTERIOR_MEDIAN_MAX_NOISE_SHARE` of
    the counts' variance) and for the geometric mechanism at a high epsilon (under
    :data:`GEOMETRIC_POSTERIOR_MEDIAN_MAX_NOISE_SHARE`, over at most
    :data:`GEOMETRIC_POSTERIOR_MEDIAN_MAX_VALUES` values): each category's posterior median under
    a flat prior, mixed with its raw report share (:mod:`aggregator.estimation.posterior_median`).

    ``"empirical_bayes"`` for k-RR over three categories or more otherwise: posterior means
    under a nonparametric prior fitted to the counts, with the raw report shares mixed in
    where that prior is not clearly more likely than equal shares (:data:`KRR_BLEND`).

    Otherwise ``"ibu"``: IBU with its iteration count chosen by 10-fold cross-validation.
    """
    if isinstance(channel, (OLH, HadamardResponse)) or getattr(
        channel, "intervals_around_unbiased", False
    ):
        return ORACLE_DEFAULT_METHOD
    if (
        is_binary(channel)
        or (
            has_empirical_bayes(channel) and noise_share(channel) < POSTERIOR_MEDIAN_MAX_NOISE_SHARE
        )
        or (
            isinstance(channel, (GeometricChannel, Geometric))
            and noise_share(channel) < GEOMETRIC_POSTERIOR_MEDIAN_MAX_NOISE_SHARE
            and channel.n_inputs <= GEOMETRIC_POSTERIOR_MEDIAN_MAX_VALUES
        )
    ):
        return "posterior_median"
    return "empirical_bayes" if has_empirical_bayes(channel) else "ibu"


def has_empirical_bayes(subject) -> bool:
    """Whether ``subject`` (a channel, or the mechanism it is built from) is k-RR over three
    categories or more, where empirical Bayes runs."""
    return isinstance(subject, (KRRChannel, KRR)) and subject.n_inputs > 2


def default_estimator(channel, *, seed: int = 0) -> Estimator:
    """The estimator of :func:`default_method` for ``channel``."""
    method = default_method(channel)
    if method == ORACLE_DEFAULT_METHOD:
        return MatrixInversion(postprocess="projection")
    if method == "empirical_bayes":
        return empirical_bayes(channel)
    if method == "posterior_median":
        return posterior_median(channel)
    return cross_validated_ibu(channel, seed=seed)


def empirical_bayes(channel) -> KRRCheckedAgainstReports:
    """k-RR's empirical Bayes estimate as the default runs it (raw shares mixed in, and
    checked against them on simulated surveys)."""
    if not has_empirical_bayes(channel):
        raise ValueError("empirical Bayes estimates k-RR over three categories or more")
    return KRRCheckedAgainstReports(lambda: KRREmpiricalBayes(blend=KRR_BLEND))


def posterior_median(channel) -> PosteriorMedian | KRRCheckedAgainstReports:
    """The posterior median per category (k-RR, the geometric mechanism), mixed with the raw
    report shares; over three k-RR categories or more, checked against them on simulated
    surveys."""
    if not takes_posterior_median(channel):
        raise ValueError("the posterior median estimates k-RR and the geometric mechanism")
    if has_empirical_bayes(channel):
        return KRRCheckedAgainstReports(PosteriorMedian)
    return PosteriorMedian()


def cross_validated_ibu(channel, *, seed: int = 0) -> IBU | TwoStartIBU | GridIBU:
    """IBU stopped by 10-fold cross-validation, as the ``ibu`` method runs it (for k-RR and
    randomized response, the smallest iteration count within half a standard error of the
    best, because the held-out score is flat and noisy where the reports carry little signal;
    for the geometric mechanism, :class:`TwoStartIBU`; on a grid, :class:`GridIBU`)."""
    if isinstance(channel, GeometricChannel):
        return TwoStartIBU(seed=seed)
    if isinstance(channel, GridKernelChannel):
        return GridIBU(seed=seed)
    se_rule = KRR_SE_RULE if isinstance(channel, KRRChannel) else 0.0
    return IBU(seed=seed, folds=DEFAULT_FOLDS, se_rule=se_rule)
