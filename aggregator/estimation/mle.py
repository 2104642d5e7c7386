"""The maximum-likelihood distribution: IBU run until it converges.

IBU is EM for the multinomial likelihood of the reports, so run to convergence it reaches
the distribution under which the reports are most likely (the MLE). Where the unbiased
inversion is already a distribution the two agree; elsewhere the MLE is a consistent
estimate that, unlike the inversion, never leaves the simplex. With few reports per output
it fits their noise: :class:`~aggregator.estimation.ibu.IBU` stops earlier, by
cross-validation.

Over k-RR (randomized response included) the maximum is known in closed form, and IBU, whose
steps slow down near the simplex's faces, would need tens of thousands of steps to reach it:
with ``a = p_keep - p_other`` and ``b = p_other``, the conditions for a maximum of
``sum_y c_y log(a p_y + b)`` over the simplex give ``p_y = max(t c_y - b / a, 0)``, one ``t``
for every value, fixed by ``sum_y p_y = 1`` (a water-filling, solved exactly after sorting).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aggregator.estimation.channels import Channel, KRRChannel, log_likelihood, report_counts
from aggregator.estimation.ibu import MAX_ITER, advance_charged, start_steps, steps_on_rows

# Converged: no frequency changed by more than this in the last step.
TOLERANCE = 1e-9


class MaximumLikelihood:
    """IBU from equal shares until no frequency changes by more than ``tol`` in a step, or
    ``max_iter`` steps.

    Attributes
    ----------
    frequencies_, n_iter_, converged_, log_likelihood_, warnings_.
    """

    name = "mle"

    def __init__(self, *, tol: float = TOLERANCE, max_iter: int = MAX_ITER):
        if not (tol >= 0 and np.isfinite(tol)):
            raise ValueError(f"tol must be finite and >= 0, got {tol!r}")
        if int(max_iter) < 1:
            raise ValueError(f"max_iter must be >= 1, got {max_iter!r}")
        self.tol = float(tol)
        self.max_iter = int(max_iter)

    def fit(self, counts: Any, channel: Channel) -> MaximumLikelihood:
        counts = report_counts(counts, channel)
        self.warnings_: list[str] = []
        self.closed_form_ = isinstance(channel, KRRChannel) and channel.p_keep > channel.p_other
        if self.closed_form_:
            assert isinstance(channel, KRRChannel)
            self.frequencies_ = krr_maximum_likelihood(counts, channel.p_keep, channel.p_other)
            self.n_iter_, self.converged_ = None, True
            self.log_likelihood_ = log_likelihood(counts, channel.forward(self.frequencies_))
            return self
        steps = start_steps(channel, counts)
        taken, change = advance_charged(steps, self.max_iter, self.tol, channel.n_inputs)
        self.frequencies_ = np.array(steps.p, copy=True)
        self.n_iter_ = taken
        self.converged_ = bool(change <= self.tol)
        self.log_likelihood_ = log_likelihood(counts, steps.predicted)
        if not self.converged_:
            self.warnings_.append(
                f"IBU had not converged after {taken} iterations (largest change {change:.1e}): "
                "the estimate is near, not at, the maximum-likelihood distribution"
            )
        return self

    def replay(self, counts: np.ndarray, channel: Channel) -> np.ndarray:
        """The MLE of other counts (one set, or one per row): in closed form where it has one,
        else the same number of IBU steps."""
        counts = np.asarray(counts, dtype=float)
        if self.closed_form_:
            assert isinstance(channel, KRRChannel)
            rows = np.atleast_2d(counts)
            fits = [krr_maximum_likelihood(row, channel.p_keep, channel.p_other) for row in rows]
            return np.stack(fits) if counts.ndim == 2 else fits[0]
        assert self.n_iter_ is not None  # IBU ran
        rows = steps_on_rows(channel, np.atleast_2d(counts), self.n_iter_)
        return rows if counts.ndim == 2 else rows[0]

    def headline(self) -> str:
        if self.closed_form_:
            return "maximum likelihood (closed form for k-RR)"
        state = "converged" if self.converged_ else "not converged"
        steps = f"{self.n_iter_} iteration{'' if self.n_iter_ == 1 else 's'}"
        return f"maximum likelihood (IBU, {steps}, {state})"

    def details(self) -> dict[str, Any]:
        if self.closed_form_:
            return {"closed_form": True}
        return {"iterations": self.n_iter_, "tolerance": self.tol, "converged": self.converged_}


def krr_maximum_likelihood(counts: np.ndarray, p_keep: float, p_other: float) -> np.ndarray:
    """The distribution that makes k-RR's report ``counts`` most likely (module docstring):
    ``p_y = max(t c_y - r, 0)`` with ``r = p_other / (p_keep - p_other)`` and ``t`` such that
    the shares sum to 1, found over the values sorted by count."""
    r = p_other / (p_keep - p_other)
    ordered = np.sort(counts)[::-1]
    totals = np.cumsum(ordered)
    kept = np.arange(1, counts.size + 1)
    # With the m largest counts positive, t = (1 + m r) / (their sum); the right m is the
    # largest whose smallest count still gets a positive share.
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = (1.0 + kept * r) / totals
        positive = ordered * scale - r > 0
    m = int(np.nonzero(positive)[0][-1]) + 1 if positive.any() else counts.size
    return np.maximum(counts * scale[m - 1] - r, 0.0)
