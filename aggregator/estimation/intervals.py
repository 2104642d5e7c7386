"""Confidence intervals for every estimator, through one entry point.

:func:`confidence_interval` takes the report counts, the channel, the point
estimate and a way to re-run the same estimator on other counts, and returns
an :class:`Interval` per input value. Which construction it uses depends on the
channel and on the estimate, not on the caller:

* **k-RR (any estimator): score intervals.** A category's report count is
  ``Binomial(n, q_x)`` with ``q_x = p_other + (p_keep - p_other) p_x``, so the
  Wilson score interval for ``q_x``, mapped through that affine map, is an
  interval for ``p_x`` whose coverage does not depend on the point estimator
  at all and holds with few reports (Wilson, JASA 1927; Brown, Cai and
  DasGupta, Statistical Science 2001). Where the interval reaches zero (the
  point estimate is 0, or the lower score bound maps below 0) it is the
  one-sided interval ``[0, upper]`` with the upper bound at the same level:
  a frequency cannot be negative, and a two-sided upper bound there would
  over-cover.
* **The unbiased inversion estimate, and its projection onto the simplex:
  analytic.** The report frequencies ``q``
  are multinomial, ``Cov(q) = (diag(q) - q q^T) / n``, and ``p = q C^{-1}`` is
  linear, so ``Var(p_x) = (sum_y M[x, y]^2 q_y - p_x^2) / n`` with
  ``M = C^{-T}``, estimated with the observed ``q``; the interval is
  ``p_x +- z sd_x``. Small channels use the explicit inverse; large ones
  estimate ``sum_y M[x, y]^2 q_y`` with random-sign probes
  (``E[(M D^1/2 z)_x^2]`` for Rademacher ``z``), one solve per probe, around the
  exact value for the periodic inverse where the channel has one (planar
  Laplace). The projected inversion gets the inversion's interval, widened to
  hold it: it is made from the inversion alone, so that interval covers what
  the inversion covers (its own bootstrap, below, gave its many zeros
  zero-width intervals).
* **Large-domain frequency oracles (OLH, Hadamard response), any estimator:
  analytic.** The interval of the unbiased estimate, as above, from the
  closed-form variance of the channel (``inversion_second_moment``); a
  post-processed estimate (projection, clipping, IBU) gets the same interval,
  widened to hold it. Their channels say so with ``intervals_around_unbiased``.
* **Any other estimate (IBU and the clipped inversion on grids, the geometric
  mechanism and dense channels): a bootstrap of the estimator's error, plus
  its distance to a less regularised fit.** Report counts are redrawn from
  ``Multinomial(n, p_hat C)`` and the estimator is re-run (``refit``, which
  reuses the regularisation chosen on the real counts, e.g. IBU's iteration
  count). In that bootstrap world ``p_hat`` is the truth, so ``r_b - p_hat``
  are draws of the estimator's error, spread and bias, with mean square
  ``mse_x``. That bias is the bias at ``p_hat``, which is already smooth; at a
  spiky truth (real check-ins concentrate on venues) an early-stopped IBU is
  biased far more. The distance ``d_x`` from ``p_hat`` to a less regularised
  fit of the same counts measures that bias directly, with some noise: IBU
  run :data:`REFERENCE_FACTOR` times as many steps as the IBU iterate that
  matches ``p_hat`` (:func:`reference_fit`). On the geometric mechanism and
  on grids (up to :data:`REFERENCE_NOISE_MAX_WORK`), the reference fit is also
  run on each replicate, and ``d_x^2`` loses the variance of the replicates'
  distances to theirs: the part of ``d_x^2`` that is noise, not bias. On a
  grid the counts are then redrawn from the reference fit instead of
  ``p_hat``, and the replicates' errors taken against it: its peaks are
  nearer a spiky truth's, so those errors carry more of the bias there.
  The interval is ``p_hat +- t sqrt(mse_x + d_x^2)``, ``t`` Student's
  quantile for the replicates' degrees of freedom. A percentile or basic
  bootstrap interval only carries the replicates' spread around their own
  mean and missed the truth in about a quarter of the cases at a nominal 95%.
* **Grid cells the reports do not resolve (planar and other grid channels,
  any estimate): bounds from the counts around them.** The reports bound the
  mean share of any square window around a cell (its report count is
  binomial; where shares are even at the window's scale its report share is
  its true mass). A cell is unresolved when the smallest of those bounds, over
  windows of growing size, comes from a window wider than the noise's reach
  (the square holding :data:`NOISE_REACH_MASS` of the noise), or when no
  report landed within that reach: the estimate there has only the noise's
  structure, and where no report fell it and its bootstrap world put about
  nothing, so bootstrap intervals missed a thin even share (64 x 64 cells
  from 1,000 reports covered 75-92%). Its upper end is raised to that
  smallest bound, and where no report fell within reach its lower end is 0
  (:func:`unresolved_cells`).

Every interval is then made to hold its point estimate (clipped into
[0, 1]), clipped to [0, 1], and given at least the width ``1 / (n k)`` (one
report's share spread over the ``k`` values), so that none collapses to a
point; widened intervals and small samples are reported in
:attr:`Interval.warnings`. Measured coverage is
in ``docs/estimation.md`` (``scripts/bench_coverage.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

from aggregator.estimation import budget, parallel, planar_steps
from aggregator.estimation.bounds import NOISE_REACH_MASS, unresolved_cells, wilson_interval
from aggregator.estimation.channels import DENSE_SOLVE_LIMIT, Channel, KRRChannel
from aggregator.estimation.grid_channels import GridKernelChannel
from aggregator.estimation.ibu import IBUSteps, advance_charged, steps_on_rows

VARIANCE_PROBES = 16
# Replicates of the error bootstrap; Student's t for their degrees of freedom absorbs the noise
# of a root mean square estimated from this few.
BOOTSTRAP_REPLICATES = 16
# The reference fit runs IBU this many times as long as the IBU iterate closest to the estimate
# (its equivalent regularisation), capped; its distance to the estimate measures the bias. Both
# count plain EM steps: an over-relaxed step counts planar_steps.RELAXATION of them.
REFERENCE_FACTOR = 10
REFERENCE_MAX_STEPS = 2000
# On the geometric mechanism (whose IBU runs on all replicates at once) and on grids, the
# reference fit's noise is measured on each replicate when that costs at most this many
# value-steps (replicates x steps x values: 2,000 steps over 300 values, about 0.4 s; on a
# 64 x 64 grid 146 steps, about 0.2 s with the fast extra); beyond, the distance keeps it.
REFERENCE_NOISE_MAX_WORK = 16 * 2000 * 300
# Steps after the closest iterate so far before the search for it stops.
MATCH_PATIENCE = 10
# Below this many reports the intervals' coverage has not been measured: say so.
SMALL_SAMPLE_REPORTS = 1000


@dataclass(frozen=True)
class Interval:
    """Per-value confidence bounds, how they were obtained, and what the reader should know.

    ``low <= point <= high`` (the point clipped into [0, 1]), ``0 <= low``,
    ``high <= 1`` and ``high - low > 0`` hold for every entry.
    """

    low: np.ndarray
    high: np.ndarray
    method: str
    warnings: tuple[str, ...] = ()


def z_value(confidence: float) -> float:
    """The two-sided standard normal quantile of ``confidence``."""
    return float(norm.ppf(0.5 + confidence / 2))


def confidence_interval(
    counts: np.ndarray,
    channel: Channel,
    point: np.ndarray,
    confidence: float,
    *,
    refit: Callable[[np.ndarray], np.ndarray],
    seed: int = 0,
    unbiased: np.ndarray | None = None,
    replicates: int = BOOTSTRAP_REPLICATES,
    refit_rows: bool = False,
) -> Interval:
    """Confidence intervals at level ``confidence`` for the estimate ``point``.

    Parameters
    ----------
    counts : numpy.ndarray
        Reports per output.
    channel : Channel
        The mechanism's channel.
    point : numpy.ndarray
        The estimate the intervals are reported with.
    confidence : float
        In (0, 1).
    refit : callable
        ``refit(counts) -> estimate``: the same estimator on other counts, reusing the
        regularisation chosen on ``counts`` (used by the error bootstrap only; each call's own
        steps are charged to :mod:`budget` by the estimator that runs them).
    refit_rows : bool
        ``refit`` takes every replicate's counts at once, one per row, and returns their
        estimates as rows (IBU's replays on a channel whose products act by row).
    seed : int
        Seeds the bootstrap and the variance probes (intervals are reproducible).
    unbiased : numpy.ndarray, optional
        The inversion solution, where ``point`` is it or its projection onto the simplex: the
        analytic interval around it, widened to hold ``point``. A ``point`` outside the simplex
        is taken as the inversion.
    replicates : int
        Bootstrap replicates.
    """
    counts = np.asarray(counts, dtype=float)
    point = np.asarray(point, dtype=float)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if point.shape != (channel.n_inputs,) or counts.shape != (channel.n_outputs,):
        raise ValueError("point and counts must match the channel's inputs and outputs")
    n = float(counts.sum())
    if not n > 0:
        raise ValueError("no reports to compute intervals from")
    notes: list[str] = []
    if unbiased is None and (point.min() < 0 or point.max() > 1):
        unbiased = point
    if channel.intervals_around_unbiased:
        # Large-domain oracles: the unbiased estimate's variance is in closed form, and a
        # bootstrap would rerun the whole estimate per replicate.
        if unbiased is None:
            unbiased = channel.solve_counts(counts)[0]
        low, high = analytic_interval(counts, channel, unbiased, confidence, seed)
        method = "analytic normal interval around the unbiased estimate (closed-form variance)"
        if not np.array_equal(point, unbiased):
            method += ", widened where needed to hold the estimate"
    elif isinstance(channel, KRRChannel):
        moves = (np.asarray(channel.p_other), np.asarray(1.0 - channel.p_keep))
        low, high = score_interval(counts, *moves, point, confidence)
        method = (
            "Wilson score interval of each category's report share, mapped to its frequency "
            "(one-sided at zero)"
        )
    elif unbiased is not None:
        # The inversion, or an estimate made from it alone (its projection onto the simplex):
        # the inversion's interval covers the truth whatever is made of it. A bootstrap of the
        # projection's error covered 34-97% on grids (its zeros are zeros in every replicate,
        # and their intervals had no width).
        low, high = analytic_interval(counts, channel, unbiased, confidence, seed)
        method = "analytic normal interval (multinomial covariance through the inverse)"
        if not np.array_equal(point, unbiased):
            method += " of the unbiased inversion, widened where needed to hold the estimate"
    else:
        # The reference fit (one long IBU run) beside the bootstrap's refits.
        fitted_reference = parallel.beside(
            lambda: reference_fit(counts, channel, point),
            alone=not channel.steps_run_in_parallel,
        )

        grid = isinstance(channel, GridKernelChannel)
        # On the geometric mechanism and on grids, the reference fit's own noise is measured
        # on the replicates and taken out of the distance, if that is cheap enough.
        noise_measurable = channel.products_by_row or grid

        def measures_noise() -> bool:
            work = replicates * fitted_reference().steps * channel.n_inputs
            return noise_measurable and work <= REFERENCE_NOISE_MAX_WORK

        def reference_noise(redrawn: np.ndarray) -> np.ndarray | None:
            if not measures_noise():
                return None
            return steps_on_rows(channel, redrawn, fitted_reference().steps)

        # On a grid the bootstrap world is then the reference fit, whose peaks are nearer a
        # spiky truth's than the estimate's: the replicates' errors carry the bias there.
        reference_world = grid and measures_noise()
        low, high = bootstrap_error_interval(
            counts,
            channel,
            point,
            refit,
            confidence=confidence,
            replicates=replicates,
            seed=seed,
            reference=lambda: fitted_reference().fit,
            reference_noise=reference_noise if noise_measurable else None,
            refit_rows=refit_rows,
            world=fitted_reference().fit if reference_world else None,
        )
        equivalent = fitted_reference().equivalent
        less_noise = ", less that distance's noise in the bootstrap" if measures_noise() else ""
        fit = f"a {REFERENCE_FACTOR}x less regularised IBU fit"
        drawn, fit = (f" drawn from {fit}", "that fit") if reference_world else ("", fit)
        method = (
            f"parametric bootstrap of the estimator's error ({replicates} replicates{drawn}) "
            f"and its distance to {fit}{less_noise} (the estimate matches IBU at {equivalent} "
            f"step{'' if equivalent == 1 else 's'})"
        )
    if isinstance(channel, GridKernelChannel):
        cells = unresolved_cells(counts, channel, confidence)
        raised = cells.upper > high
        empty = int(cells.no_report.sum())
        if raised.any() or empty:
            high = np.maximum(high, cells.upper)
            low = np.where(cells.no_report, 0.0, low)
            method += (
                "; where the reports bound a cell's share best as the mean share of a wider "
                "area, at least that bound"
            )
        if empty:
            notes.append(
                f"{empty:,} of {channel.n_inputs:,} cells had no report within {cells.reach} "
                f"cell{'' if cells.reach == 1 else 's'} (the noise's {NOISE_REACH_MASS:.0%} "
                "reach), so their lower ends are 0; the upper ends of "
                f"{int(raised.sum()):,} cells were raised to the upper bound of the mean share of "
                "the area around them, which the reports bound better than the cell's own"
            )
    return _finished(low, high, point, n, method, notes)


def score_interval(
    counts: np.ndarray,
    q_in: np.ndarray,
    q_out: np.ndarray,
    point: np.ndarray,
    confidence: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score intervals of the report shares, mapped to frequencies (one-sided at zero)
    through ``q_in`` (the share of the other users' reports that move to a value; k-RR's
    ``p_other``) and ``q_out`` (the chance that a report moves off its value; ``1 - p_keep``),
    one for all values or one per value: a report share ``r`` is the frequency
    ``(r - q_in) / (1 - q_in - q_out)``.

    Returns bounds before the final clipping; ``point`` decides where the lower end is 0.
    """
    n = counts.sum()
    q_in, q_out = np.broadcast_to(q_in, counts.shape), np.broadcast_to(q_out, counts.shape)
    slope = 1.0 - q_in - q_out
    if np.any(slope <= 0):
        # Reports independent of the true value: the data rule out no frequency at all.
        return np.zeros(counts.size), np.ones(counts.size)
    low_q, high_q = wilson_interval(counts, n, z_value(confidence))
    low = (low_q - q_in) / slope
    high = (high_q - q_in) / slope
    at_zero = (low <= 0) | (point <= 0)
    if np.any(at_zero):
        # One-sided: P(p_x > upper) = 1 - confidence, the lower end is the boundary itself.
        one_sided = float(norm.ppf(confidence))
        upper_q = wilson_interval(counts[at_zero], n, one_sided)[1]
        low[at_zero] = 0.0
        high[at_zero] = (upper_q - q_in[at_zero]) / slope[at_zero]
    return low, high


def bootstrap_error_interval(
    counts: np.ndarray,
    channel: Channel,
    point: np.ndarray,
    refit: Callable[[np.ndarray], np.ndarray],
    *,
    confidence: float,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = 0,
    reference: np.ndarray | Callable[[], np.ndarray] | None = None,
    reference_noise: Callable[[np.ndarray], np.ndarray | None] | None = None,
    refit_rows: bool = False,
    world: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``point +- t sqrt(mse + d^2)``: ``mse`` the mean square error of ``refit`` on counts
    redrawn from the report distribution of ``world`` (by default ``point``), the bootstrap
    world's truth, ``d`` the distance from ``point`` to ``reference`` (zero without one; a
    callable is asked for it after the refits).

    ``reference_noise(redrawn)``, given the redrawn counts (one replicate per row), returns
    the reference fit of each (or None: not measured). ``d^2`` then loses the variance over the
    replicates of a refit's distance to its reference fit: what ``d^2`` holds beside the bias
    it stands for (at most all of it). With ``refit_rows``, ``refit`` is given every
    replicate's counts at once, one per row.
    """
    if replicates < 2:
        raise ValueError(f"replicates must be >= 2, got {replicates!r}")
    generator = np.random.default_rng(seed)
    # At least one report per replicate: counts of weighted reports can sum below one.
    n = max(1, round(float(counts.sum())))
    truth = point if world is None else world
    predicted = np.maximum(channel.forward(np.clip(truth, 0.0, None)), 0.0)
    predicted /= predicted.sum()
    redrawn: list[np.ndarray] = []

    def redraws() -> Iterator[np.ndarray]:
        for _ in range(replicates):
            budget.charge(channel.n_outputs)
            draw = generator.multinomial(n, predicted).astype(float)
            if reference_noise is not None:
                redrawn.append(draw)
            yield draw

    squared_error = np.zeros(channel.n_inputs)
    refits = []
    # The refits side by side (all in one call, or on the estimate's threads); their errors
    # summed in the replicates' order.
    if refit_rows:
        fits = list(refit(np.asarray(list(redraws()))))
    else:
        fits = parallel.map_ordered(refit, redraws(), alone=not channel.steps_run_in_parallel)
    for fit in fits:
        squared_error += (fit - truth) ** 2
        if reference_noise is not None:
            refits.append(fit)
    if callable(reference):
        reference = reference()
    if reference is not None:
        distance = (point - reference) ** 2
        noise = None if reference_noise is None else reference_noise(np.asarray(redrawn))
        if noise is not None:
            gaps = np.asarray(refits) - noise
            distance = np.maximum(distance - np.var(gaps, axis=0, ddof=1), 0.0)
        squared_error += replicates * distance
    rmse = np.sqrt(squared_error / replicates)
    half = float(student_t.ppf(0.5 + confidence / 2, replicates - 1)) * rmse
    return point - half, point + half


@dataclass(frozen=True)
class ReferenceFit:
    """A less regularised fit than an estimate (:func:`reference_fit`)."""

    equivalent: int  # the estimate's equivalent IBU steps
    steps: int  # the IBU steps the fit ran
    fit: np.ndarray


def reference_fit(counts: np.ndarray, channel: Channel, point: np.ndarray) -> ReferenceFit:
    """A less regularised fit of ``counts`` than ``point``.

    IBU from the uniform distribution is run step by step until the iterate closest to
    ``point`` (Euclidean) is found: its step count is the estimate's equivalent regularisation
    (exactly IBU's own count when the estimate is IBU stopped early). The run then continues
    to :data:`REFERENCE_FACTOR` times that count (at most :data:`REFERENCE_MAX_STEPS`), counted
    in plain EM steps where the channel's steps are over-relaxed.
    """
    steps = channel.ibu_steps(counts)
    steps = IBUSteps(channel, counts) if steps is None else steps
    best, best_distance, taken = 0, np.inf, 0
    while taken < REFERENCE_MAX_STEPS and taken - best < MATCH_PATIENCE:
        taken += advance_charged(steps, 1, 0.0, channel.n_inputs)[0]
        distance = float(np.sum((steps.p - point) ** 2))
        if distance < best_distance:
            best, best_distance = taken, distance
    target = _steps_for(
        channel, min(REFERENCE_MAX_STEPS, REFERENCE_FACTOR * _plain_steps(channel, max(best, 1)))
    )
    if taken < target:
        advance_charged(steps, target - taken, 0.0, channel.n_inputs)
    return ReferenceFit(best, max(taken, target), steps.p.copy())


def _plain_steps(channel: Channel, steps: int) -> float:
    """How many plain EM steps ``steps`` of the channel's IBU steps go as far as."""
    after = channel.ibu_relax_after
    if after is None or steps <= after:
        return steps
    return after + planar_steps.RELAXATION * (steps - after)


def _steps_for(channel: Channel, plain: float) -> int:
    """The fewest of the channel's IBU steps that go as far as ``plain`` plain EM steps."""
    after = channel.ibu_relax_after
    if after is None or plain <= after:
        return math.ceil(plain)
    return after + math.ceil((plain - after) / planar_steps.RELAXATION)


def inversion_variance(
    counts: np.ndarray, channel: Channel, unbiased: np.ndarray, *, seed: int = 0
) -> np.ndarray:
    """Per-entry variance of the unbiased inversion estimate, from the observed counts."""
    n = counts.sum()
    q = counts / n
    if isinstance(channel, KRRChannel):
        return q * (1 - q) / (n * (channel.p_keep - channel.p_other) ** 2)
    exact = channel.inversion_second_moment(q)
    if exact is not None:
        second_moment = exact
    elif channel.n_inputs <= DENSE_SOLVE_LIMIT:
        second_moment = (channel.inverse_transpose() ** 2) @ q
    else:
        second_moment = _probed_second_moment(q, channel, seed)
    return np.maximum(second_moment - unbiased**2, 0.0) / n


def analytic_interval(
    counts: np.ndarray, channel: Channel, unbiased: np.ndarray, confidence: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``unbiased +- z sd``, the normal interval of the inversion estimate (not clipped)."""
    sd = np.sqrt(inversion_variance(counts, channel, unbiased, seed=seed))
    z = z_value(confidence)
    return unbiased - z * sd, unbiased + z * sd


def _finished(
    low: np.ndarray,
    high: np.ndarray,
    point: np.ndarray,
    n: float,
    method: str,
    notes: list[str],
) -> Interval:
    """Hold the point, clip to [0, 1], widen to at least ``1 / (n k)``; say what was done."""
    inside = np.clip(point, 0.0, 1.0)
    low = np.clip(np.minimum(low, inside), 0.0, 1.0)
    high = np.clip(np.maximum(high, inside), 0.0, 1.0)
    minimum = min(1.0, 1.0 / (n * point.size))
    narrow = ~(high - low >= minimum)
    if np.any(narrow):
        high[narrow] = np.minimum(1.0, low[narrow] + minimum)
        low[narrow] = np.maximum(0.0, high[narrow] - minimum)
    warnings = list(notes)
    if n < SMALL_SAMPLE_REPORTS:
        warnings.append(
            f"only {n:,.0f} report{'' if n == 1 else 's'}: intervals from fewer than "
            f"{SMALL_SAMPLE_REPORTS:,} reports are wide and approximate (their coverage is "
            f"measured from {SMALL_SAMPLE_REPORTS:,} reports up)"
        )
    if np.any(narrow):
        warnings.append(
            f"{int(narrow.sum()):,} of {narrow.size:,} intervals were narrower than "
            f"{minimum:.2g} (one report's share over all values) and were widened to it"
        )
    return Interval(low=low, high=high, method=method, warnings=tuple(warnings))


def _probed_second_moment(q: np.ndarray, channel: Channel, seed: int) -> np.ndarray:
    """``sum_y M[x, y]^2 q_y`` by random-sign probes, ``E[(M D^1/2 z)_x^2]``.

    Where the channel offers a periodic approximation of its inverse (planar
    Laplace), that approximation's exact value is the baseline and the probes
    only estimate the difference (a control variate): away from the grid's
    edges the difference vanishes and the result is exact; near them the
    probes carry the remapping's correction.
    """
    rng = np.random.default_rng(seed)
    root_q = np.sqrt(q)
    approximate = getattr(channel, "inverse_second_moment", None)
    baseline = approximate(q) if approximate is not None else np.zeros(channel.n_inputs)
    periodic = channel.preconditioner() if approximate is not None else None
    correction = np.zeros(channel.n_inputs)
    for _ in range(VARIANCE_PROBES):
        budget.charge(channel.n_inputs)
        probe = root_q * rng.choice((-1.0, 1.0), size=channel.n_outputs)
        correction += channel.solve(probe) ** 2
        if periodic is not None:
            correction -= periodic.matvec(probe) ** 2
    return baseline + correction / VARIANCE_PROBES
