"""The maximum-likelihood distribution: IBU run until it converges.

IBU is EM for the multinomial likelihood of the reports, so run to convergence it reaches
the distribution under which the reports are most likely (the MLE). Where the unbiased
inversion is already a distribution the two agree; elsewhere the MLE is a consistent
estimate that, unlike the inversion, never leaves the simplex. With few reports per output
it fits their noise: :class:`~aggregator.estimation.ibu.IBU` stops earlier, by
cross-validation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aggregator.estimation.channels import Channel, log_likelihood, report_counts
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
        steps = start_steps(channel, counts)
        taken, change = advance_charged(steps, self.max_iter, self.tol, channel.n_inputs)
        self.frequencies_ = np.array(steps.p, copy=True)
        self.n_iter_ = taken
        self.converged_ = bool(change <= self.tol)
        self.log_likelihood_ = log_likelihood(counts, steps.predicted)
        self.warnings_: list[str] = []
        if not self.converged_:
            self.warnings_.append(
                f"IBU had not converged after {taken} iterations (largest change {change:.1e}): "
                "the estimate is near, not at, the maximum-likelihood distribution"
            )
        return self

    def replay(self, counts: np.ndarray, channel: Channel) -> np.ndarray:
        """The same number of IBU steps on other counts (one set, or one per row)."""
        counts = np.asarray(counts, dtype=float)
        if counts.ndim == 2:
            return steps_on_rows(channel, counts, self.n_iter_)
        return steps_on_rows(channel, counts[None, :], self.n_iter_)[0]

    def headline(self) -> str:
        state = "converged" if self.converged_ else "not converged"
        steps = f"{self.n_iter_} iteration{'' if self.n_iter_ == 1 else 's'}"
        return f"maximum likelihood (IBU, {steps}, {state})"

    def details(self) -> dict[str, Any]:
        return {"iterations": self.n_iter_, "tolerance": self.tol, "converged": self.converged_}
