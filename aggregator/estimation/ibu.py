"""The Iterative Bayesian Update, stopped by cross-validation of the held-out likelihood.

IBU is EM for the maximum-likelihood distribution (Agrawal and Aggarwal, PODS 2001;
ElSalamouny and Palamidessi, "Generalized iterative Bayesian update and applications to
mechanisms for privacy protection", EuroS&P 2020): from equal shares, each step is
``p_x <- p_x * sum_y C[x, y] q_y / (p C)_y``. Run to convergence it fits the noise
(:mod:`aggregator.estimation.mle`); stopped early, its estimate is shrunk towards equal
shares, so the iteration count is the strength of a regulariser. :class:`IBU` chooses it from
the reports by K-fold cross-validation: the count whose estimate, fitted on the other folds,
gives the held-out reports the highest likelihood.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aggregator.estimation import budget, parallel, planar_steps
from aggregator.estimation.channels import Channel, KRRChannel, log_likelihood, report_counts

FOLDS = 10
# The choice is made again on 2 folds (half the reports), and the 10-fold count scaled to all
# the reports by how it grew between the two (extrapolated_count).
SMALLER_FOLDS = 2
# The curves are followed until the best score is this old: at least PATIENCE_MIN iterations
# and PATIENCE_FRACTION of the best count.
PATIENCE_MIN = 20
PATIENCE_FRACTION = 0.25
# Once the held-out score has fallen below its best, a later count becomes the best only where
# it gains on it by this many standard errors of the per-fold gains: the score can come back
# level and creep up on noise alone for thousands of iterations.
REGAIN_SE = 1.0
MAX_ITER = 10_000
# Where a channel's products act by row, at most this many values (rows x values) step side by
# side: it saves the per-step cost of many small rows without holding much memory.
SIDE_BY_SIDE_VALUES = 1 << 17


class IBUSteps:
    """IBU's steps on one set of counts (or several, one per row, where the channel's
    products act by row), through the channel's ``forward`` and ``backward``.

    ``p`` starts at equal shares; ``predicted`` is always ``forward(p)``. A channel may run the
    same steps faster (:meth:`channels.Channel.ibu_steps`) and may over-relax them after a
    number of steps (:attr:`channels.Channel.ibu_relax_after`); ``steps_taken`` counts them.
    """

    def __init__(self, channel: Channel, counts: np.ndarray):
        self._channel = channel
        self._counts = counts
        self._observed = counts > 0
        self.p = np.full((*counts.shape[:-1], channel.n_inputs), 1.0 / channel.n_inputs)
        self.predicted = channel.forward(self.p)
        self._relax_after = channel.ibu_relax_after
        self.steps_taken = 0

    def advance(self, steps: int, tol: float) -> tuple[int, float]:
        """Up to ``steps`` steps, stopping after one that changes no frequency by more than
        ``tol``. Returns the steps taken and the last one's largest change."""
        taken, change = 0, np.inf
        while taken < steps:
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


def start_steps(channel: Channel, counts: np.ndarray) -> Any:
    """IBU's steps from equal shares: the channel's own where it has them, else the generic."""
    steps = channel.ibu_steps(counts)
    return IBUSteps(channel, counts) if steps is None else steps


def advance_charged(steps: Any, count: int, tol: float, units_per_step: int) -> tuple[int, float]:
    """``steps.advance(count, tol)`` in chunks paced by the clock, each charged to the work
    budget (:class:`budget.Pace`). Returns the steps taken and the last one's largest change."""
    taken, change = 0, np.inf
    for chunk in budget.Pace().chunks(count, units_per_step):
        done, change = steps.advance(chunk, tol)
        taken += done
        if done < chunk:  # converged within the chunk
            break
    return taken, change


def steps_on_rows(channel: Channel, counts: np.ndarray, count: int) -> np.ndarray:
    """``count`` IBU steps from equal shares on each row of ``counts`` (no early stop).
    Returns the estimates as rows: side by side where the channel's products act by row,
    else a row at a time on the threads the estimate may use."""
    if not channel.products_by_row:

        def one(row: np.ndarray) -> np.ndarray:
            steps = start_steps(channel, row)
            advance_charged(steps, count, 0.0, channel.n_inputs)
            return np.array(steps.p, copy=True)  # a channel's own steps may keep their buffers

        fitted = parallel.map_ordered(one, counts, alone=not channel.steps_run_in_parallel)
        return np.asarray(fitted)
    rows = max(1, SIDE_BY_SIDE_VALUES // channel.n_inputs)
    fits = []
    for part in np.split(counts, range(rows, counts.shape[0], rows)):
        steps = start_steps(channel, part)
        advance_charged(steps, count, 0.0, channel.n_inputs * part.shape[0])
        fits.append(steps.p)
    return np.concatenate(fits)


class _Folds:
    """IBU's steps on every fold's training counts at once: in one batch where the channel
    can (its products act by row, or k-RR's own steps), else a fold per thread."""

    def __init__(self, channel: Channel, train: np.ndarray):
        batched = (channel.products_by_row and train.size <= SIDE_BY_SIDE_VALUES) or isinstance(
            channel, KRRChannel
        )
        self._batch = start_steps(channel, train) if batched else None
        self._each = [] if batched else [start_steps(channel, row) for row in train]
        self._alone = not channel.steps_run_in_parallel

    def advance(self, count: int) -> float:
        """``count`` steps on every fold; the largest change of the last step. The budget is
        checked before each fold's steps (the caller charges them)."""
        if self._batch is not None:
            return float(self._batch.advance(count, 0.0)[1])

        def one(steps: Any) -> float:
            budget.check()
            return float(steps.advance(count, 0.0)[1])

        return max(parallel.map_ordered(one, self._each, alone=self._alone))

    def predicted(self) -> np.ndarray:
        if self._batch is not None:
            return np.asarray(self._batch.predicted)
        return np.stack([steps.predicted for steps in self._each])


def held_out_folds(counts: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """The reports of each fold, one row per fold (empty folds dropped): every whole report
    goes to one of ``folds`` folds at random (seeded, so an estimate is reproducible); a
    fractional part of a count stays in every fold's training set."""
    rng = np.random.default_rng(seed)
    whole = np.floor(counts).astype(np.int64)
    held_out = rng.multinomial(whole, np.full(folds, 1.0 / folds)).T.astype(float)
    return held_out[held_out.sum(axis=1) > 0]


def held_out_scores(held_out: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Per fold, the held-out reports' log-likelihood under that fold's predicted distribution."""
    logs = np.log(np.maximum(predicted, np.finfo(float).tiny))
    return np.sum(np.where(held_out > 0, held_out * logs, 0.0), axis=1)


def paired_se(differences: np.ndarray) -> float:
    """The standard error of a sum of per-fold score differences."""
    if differences.size < 2:
        return 0.0
    return float(np.sqrt(differences.size * np.var(differences, ddof=1)))


def next_checkpoint(iteration: int) -> int:
    """Where the cross-validation scores next: every step up to 20, then about every 5%."""
    return iteration + max(1, iteration // 20)


def extrapolated_count(chosen: int, smaller: int, folds: int, smaller_folds: int) -> int:
    """A count chosen on ``folds`` folds (trained on ``1 - 1/folds`` of the reports), scaled
    to all the reports: the count grows as a power of the reports, ``t ~ n^a``, with ``a``
    measured against the choice on ``smaller_folds`` folds and held to [0, 1]. Never below
    ``chosen``."""
    share, smaller_share = 1 - 1 / folds, 1 - 1 / smaller_folds
    if chosen <= 0:
        return chosen
    growth = math.log(chosen / smaller) / math.log(share / smaller_share) if smaller > 0 else 1.0
    power = min(max(growth, 0.0), 1.0)
    factor = share**-power
    return max(chosen, math.floor(chosen * factor + 0.5))


class CrossValidation:
    """The iteration count whose estimate best predicts held-out reports.

    Every report is put in one of ``folds`` folds at random; IBU runs on each fold's
    complement and, at checkpoints (every step up to 20, then about every 5%), scores the
    held-out fold's log-likelihood under its predicted report distribution. The curves are
    followed until the best summed score is :data:`PATIENCE_MIN` iterations and
    :data:`PATIENCE_FRACTION` of the best count old, or every fold has converged, or
    ``max_iter``. Once a checkpoint has scored below the best, a later one becomes the best
    only by gaining more than :data:`REGAIN_SE` standard errors of the per-fold gains.
    """

    def __init__(self, *, folds: int, seed: int, max_iter: int, tol: float):
        self.folds, self.seed, self.max_iter, self.tol = folds, seed, max_iter, tol

    def choose(self, counts: np.ndarray, channel: Channel) -> int | None:
        """The chosen count, or None where there are too few reports to split. Sets
        ``iterations_``, ``scores_`` (summed, per checkpoint), ``start_score_`` (equal
        shares'), ``at_cap_`` (the best was the last checkpoint at ``max_iter``) and
        ``fold_scores_``."""
        held_out = held_out_folds(counts, self.folds, self.seed)
        train = counts[None, :] - held_out
        if held_out.shape[0] < 2 or np.any(train.sum(axis=1) <= 0):
            return None
        steps = _Folds(channel, train)
        start = held_out_scores(held_out, steps.predicted())
        iterations: list[int] = []
        per_fold: list[np.ndarray] = []
        done, best, fell, change = 0, 0, False, np.inf
        pace = budget.Pace()
        while done < self.max_iter:
            target = min(next_checkpoint(done), self.max_iter)
            for chunk in pace.chunks(target - done, channel.n_inputs * held_out.shape[0]):
                change = steps.advance(chunk)
                done += chunk
            iterations.append(done)
            per_fold.append(held_out_scores(held_out, steps.predicted()))
            gain = per_fold[-1] - per_fold[best]
            required = REGAIN_SE * paired_se(gain) if fell else 0.0
            if len(per_fold) == 1 or gain.sum() > required:
                best, fell = len(per_fold) - 1, False
            else:
                fell = fell or gain.sum() < 0
            if change <= self.tol:
                break
            if done - iterations[best] >= max(PATIENCE_MIN, PATIENCE_FRACTION * iterations[best]):
                break
        self.iterations_ = np.asarray(iterations)
        self.fold_scores_ = np.asarray(per_fold)
        self.scores_ = self.fold_scores_.sum(axis=1)
        self.start_score_ = float(start.sum())
        self.at_cap_ = iterations[best] >= self.max_iter
        self.no_better_than_equal_ = bool(
            self.scores_[best] - self.start_score_ <= paired_se(self.fold_scores_[best] - start)
        )
        return int(iterations[best])


class IBU:
    """IBU from equal shares, stopped by ``folds``-fold cross-validation
    (:class:`CrossValidation`), or run a fixed number of iterations.

    Cross-validation chooses the count for ``(folds - 1) / folds`` of the reports, and the
    count IBU needs grows with the reports; so the choice is made again on
    :data:`SMALLER_FOLDS` folds, and the first scaled to all the reports by the growth
    between the two (:func:`extrapolated_count`). Every step is charged to the work budget
    (:mod:`aggregator.estimation.budget`).

    Attributes
    ----------
    frequencies_, n_iter_, converged_ (the run reached its count, or converged before it),
    log_likelihood_, cv_n_iter_ (cross-validation's count on ``folds`` folds, or None),
    cv_smaller_n_iter_ (on :data:`SMALLER_FOLDS`, or None), warnings_.
    """

    name = "ibu"

    def __init__(
        self,
        *,
        folds: int = FOLDS,
        seed: int = 0,
        max_iter: int = MAX_ITER,
        tol: float = 1e-9,
        extrapolate: bool = True,
    ):
        if int(folds) <= SMALLER_FOLDS:
            raise ValueError(f"folds must be more than {SMALLER_FOLDS}, got {folds!r}")
        if int(max_iter) < 1:
            raise ValueError(f"max_iter must be >= 1, got {max_iter!r}")
        if not (tol >= 0 and np.isfinite(tol)):
            raise ValueError(f"tol must be finite and >= 0, got {tol!r}")
        self.folds = int(folds)
        self.seed = seed
        self.max_iter = int(max_iter)
        self.tol = float(tol)
        self.extrapolate = extrapolate

    def fit(self, counts: Any, channel: Channel, n_iter: int | None = None) -> IBU:
        """Estimate from ``counts``; ``n_iter`` fixes the number of iterations instead."""
        counts = report_counts(counts, channel)
        self.warnings_: list[str] = []
        self.cv_n_iter_: int | None = None
        self.cv_smaller_n_iter_: int | None = None
        self.cv_: CrossValidation | None = None
        self._asked = n_iter
        if n_iter is None:
            n_iter = self._cross_validated(counts, channel)
        steps = start_steps(channel, counts)
        taken, _ = advance_charged(steps, n_iter, self.tol, channel.n_inputs)
        self.frequencies_ = np.array(steps.p, copy=True)
        self.n_iter_ = taken
        self.converged_ = True
        self.converged_early_ = taken < n_iter
        self.log_likelihood_ = log_likelihood(counts, steps.predicted)
        return self

    def _cross_validated(self, counts: np.ndarray, channel: Channel) -> int:
        self.cv_ = CrossValidation(
            folds=self.folds, seed=self.seed, max_iter=self.max_iter, tol=self.tol
        )
        chosen = self.cv_.choose(counts, channel)
        if chosen is None:
            reports = int(counts.sum())
            self.warnings_.append(
                f"only {reports} report{'' if reports == 1 else 's'}: too few to choose the "
                "number of IBU iterations by cross-validation, so one was run (an estimate "
                "close to equal shares)"
            )
            return 1
        self.cv_n_iter_ = chosen
        if self.cv_.at_cap_:
            self.warnings_.append(
                f"the held-out likelihood was still rising at the iteration cap "
                f"({self.max_iter}): the estimate may be smoother than the reports allow"
            )
        elif self.cv_.no_better_than_equal_:
            self.warnings_.append(
                "the held-out reports are fitted no better by this estimate than by equal "
                "shares (within one standard error): differences between values may be noise"
            )
        if not self.extrapolate:
            return chosen
        smaller = CrossValidation(
            folds=SMALLER_FOLDS, seed=self.seed, max_iter=self.max_iter, tol=self.tol
        )
        self.cv_smaller_n_iter_ = smaller.choose(counts, channel) or 0
        scaled = extrapolated_count(chosen, self.cv_smaller_n_iter_, self.folds, SMALLER_FOLDS)
        return min(scaled, self.max_iter)

    def replay(self, counts: np.ndarray, channel: Channel) -> np.ndarray:
        """The last fit's iteration count on other counts (one set, or one per row), e.g. a
        bootstrap's: a new run each call, so that calls may run at once."""
        counts = np.asarray(counts, dtype=float)
        if counts.ndim == 2:
            return steps_on_rows(channel, counts, self.n_iter_)
        return IBU(tol=self.tol).fit(counts, channel, n_iter=self.n_iter_).frequencies_

    def headline(self) -> str:
        """What ran, in one line."""
        steps = f"{self.n_iter_} iteration{'' if self.n_iter_ == 1 else 's'}"
        if self.cv_n_iter_ is None:
            reason = "fixed" if self._asked is not None else "too few reports to cross-validate"
            return f"IBU, {steps} ({reason})"
        if self.converged_early_:
            return f"IBU, converged after {steps} ({self.folds}-fold cross-validation)"
        return f"IBU, {steps} ({self.folds}-fold cross-validation)"

    def details(self) -> dict[str, Any]:
        """The facts behind the headline."""
        if self.cv_ is None:
            return {"iterations": self.n_iter_}
        found: dict[str, Any] = {"iterations": self.n_iter_, "folds": self.folds}
        if self.cv_n_iter_ is not None:
            found["chosen_on_folds"] = self.cv_n_iter_
            found["held_out_log_likelihood"] = float(self.cv_.scores_.max())
        if self.cv_smaller_n_iter_ is not None:
            found[f"chosen_on_{SMALLER_FOLDS}_folds"] = self.cv_smaller_n_iter_
            found["scaled_to_all_reports"] = True
        if self.converged_early_:
            found["converged_before_the_chosen_count"] = True
        return found
