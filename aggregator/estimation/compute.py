"""One call from report counts to an estimate with intervals, as the service serves it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aggregator.estimation.channels import Channel, channel_for
from aggregator.estimation.estimators import (
    Estimator,
    MatrixInversion,
    cross_validated_ibu,
    default_method,
    empirical_bayes,
    posterior_median,
)
from aggregator.estimation.intervals import BOOTSTRAP_REPLICATES, confidence_interval
from shared.mechanisms import Mechanism

METHODS = ("ibu", "empirical_bayes", "posterior_median", "inversion", "clip", "projection")
INVERSION_DESCRIPTIONS = {
    "inversion": "matrix inversion (unbiased; entries may be negative)",
    "clip": "matrix inversion, negatives clipped to 0 and renormalised",
    "projection": "matrix inversion, projected onto the probability simplex",
}
INVERSION_NOT_CONVERGED = (
    "the iterative solver stopped before its tolerance: the inversion is approximate"
)


@dataclass(frozen=True)
class EstimateResult:
    """A frequency estimate with its confidence intervals and how it was obtained."""

    method: str
    n: int
    confidence: float
    frequencies: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    interval_method: str
    seconds: float
    n_iter: int | None = None
    converged: bool | None = None
    log_likelihood: float | None = None
    estimator: str = ""
    warnings: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, labels: Sequence[str]) -> dict[str, Any]:
        """The JSON body of the estimate API (``estimates`` in ``labels`` order)."""
        return {
            "method": self.method,
            "n": self.n,
            "confidence": self.confidence,
            "estimates": [
                {"label": label, "frequency": float(f), "ci_low": float(lo), "ci_high": float(hi)}
                for label, f, lo, hi in zip(
                    labels, self.frequencies, self.ci_low, self.ci_high, strict=True
                )
            ],
            "n_iter": self.n_iter,
            "converged": self.converged,
            "log_likelihood": self.log_likelihood,
            "interval_method": self.interval_method,
            "estimator": self.estimator,
            "warnings": list(self.warnings),
            "seconds": self.seconds,
            **self.details,
        }


def estimate(
    mechanism: Mechanism,
    counts: Sequence[int] | np.ndarray,
    *,
    method: str | None = None,
    confidence: float = 0.95,
    n_bootstrap: int | None = None,
    seed: int = 0,
    channel: Channel | None = None,
) -> EstimateResult:
    """Estimate the true distribution from per-output report counts.

    ``method`` is one of :data:`METHODS`, by default the one
    :func:`estimators.default_method` picks for the channel (``"empirical_bayes"``
    for k-RR over three categories or more, else ``"ibu"``: IBU with a
    cross-validated number of iterations). ``channel`` may be passed to
    reuse an operator across calls (the planar kernel is the costly part to
    build). The work is charged to the current thread's budget
    (:mod:`aggregator.estimation.budget`).
    """
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    started = time.perf_counter()
    channel = channel if channel is not None else channel_for(mechanism)
    method = method if method is not None else default_method(channel)
    counts = np.asarray(counts, dtype=float)
    fitted: Estimator
    details: dict[str, Any] = {}
    # The inversion whose interval the estimate takes (the intervals' docs), if any.
    unbiased: np.ndarray | None = None
    if method in ("empirical_bayes", "posterior_median"):
        bayes = empirical_bayes if method == "empirical_bayes" else posterior_median
        fitted = fitted_bayes = bayes(channel).fit(counts, channel)
        estimator = fitted_bayes.describe()
        warnings = tuple(fitted_bayes.warnings_)

        # The intervals of k-RR and of the posterior median do not depend on the estimator:
        # this is never called for them.
        def refit(redrawn: np.ndarray) -> np.ndarray:
            return bayes(channel).fit(redrawn, channel).frequencies_

    elif method == "ibu":
        fitted = ibu = cross_validated_ibu(channel, seed=seed).fit(counts, channel)
        estimator = ibu.describe()
        warnings = tuple(ibu.warnings_)

        # The same iteration counts on the redrawn counts (a new estimator per refit; all the
        # replicates at once where the channel's products act by row).
        def refit(redrawn: np.ndarray) -> np.ndarray:
            return ibu.replay(redrawn, channel)

        details["stopping"] = "cross-validated held-out likelihood"
    else:
        postprocess = {"inversion": "none", "clip": "clip", "projection": "projection"}[method]
        fitted = MatrixInversion(postprocess=postprocess).fit(counts, channel)
        estimator = INVERSION_DESCRIPTIONS[method]
        warnings = () if fitted.converged_ else (INVERSION_NOT_CONVERGED,)

        def refit(redrawn: np.ndarray) -> np.ndarray:
            return MatrixInversion(postprocess=postprocess).fit(redrawn, channel).frequencies_

        # Inversion and projection take the inversion's interval; the clipped inversion keeps
        # the bootstrap, which covers it (94-100% on grids) at a thirtieth of that width.
        if method != "clip":
            unbiased = fitted.unbiased_

    interval = confidence_interval(
        counts,
        channel,
        fitted.frequencies_,
        confidence,
        refit=refit,
        seed=seed,
        unbiased=unbiased,
        replicates=BOOTSTRAP_REPLICATES if n_bootstrap is None else int(n_bootstrap),
        moves=getattr(fitted, "moves_", None),
        refit_rows=method == "ibu" and channel.products_by_row,
    )
    log_lik = getattr(fitted, "log_likelihood_", None)
    return EstimateResult(
        method=method,
        n=int(counts.sum()),
        confidence=confidence,
        frequencies=fitted.frequencies_,
        ci_low=interval.low,
        ci_high=interval.high,
        interval_method=interval.method,
        seconds=time.perf_counter() - started,
        n_iter=fitted.n_iter_,
        converged=fitted.converged_,
        log_likelihood=log_lik,
        estimator=estimator,
        warnings=warnings + interval.warnings,
        details=details,
    )
