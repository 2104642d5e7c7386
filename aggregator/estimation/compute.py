"""One call from report counts to an estimate with intervals, as the service serves it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aggregator.estimation.channels import Channel
from aggregator.estimation.decision import (
    CLIP,
    IBU,
    INVERSION,
    METHODS,
    MLE,
    PROJECTION,
    SMOOTHED,
    cell_grid,
)
from aggregator.estimation.decision import default_method as table_default
from aggregator.estimation.factory import channel_for
from aggregator.estimation.ibu import IBU as CrossValidatedIBU
from aggregator.estimation.intervals import BOOTSTRAP_REPLICATES, confidence_interval
from aggregator.estimation.inversion import MatrixInversion
from aggregator.estimation.mle import MaximumLikelihood
from aggregator.estimation.smoothing import SmoothedProjection
from shared.mechanisms import Mechanism

Estimator = CrossValidatedIBU | MaximumLikelihood | MatrixInversion | SmoothedProjection


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
            "details": self.details,
            "warnings": list(self.warnings),
            "seconds": self.seconds,
        }


def estimator_for(method: str, mechanism: Mechanism, *, seed: int = 0) -> Estimator:
    """A new, unfitted estimator of ``method`` (:data:`METHODS`) for ``mechanism``."""
    if method == SMOOTHED:
        grid = cell_grid(mechanism)
        if grid is None:
            raise ValueError(
                f"{SMOOTHED} estimates k-RR, OLH and Hadamard response over a region's cells"
            )
        return SmoothedProjection(grid.rows, grid.cols, seed=seed)
    if method == IBU:
        return CrossValidatedIBU(seed=seed)
    if method == MLE:
        return MaximumLikelihood()
    if method in (PROJECTION, CLIP, INVERSION):
        return MatrixInversion(postprocess=method)
    raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")


def point_estimate(
    mechanism: Mechanism,
    counts: Sequence[int] | np.ndarray,
    *,
    method: str | None = None,
    seed: int = 0,
    channel: Channel | None = None,
) -> np.ndarray:
    """The estimate alone, without intervals (simulations and the advisor)."""
    channel = channel if channel is not None else channel_for(mechanism)
    chosen = method if method is not None else table_default(mechanism)
    return estimator_for(chosen, mechanism, seed=seed).fit(counts, channel).frequencies_


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
    """Estimate the true distribution from per-output report counts, with intervals.

    ``method`` is one of :data:`METHODS`; by default the mechanism's row of the decision
    table (:mod:`aggregator.estimation.decision`). ``channel`` may be passed to reuse an
    operator across calls (a planar kernel is costly to build). The work is charged to the
    current thread's budget (:mod:`aggregator.estimation.budget`).
    """
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    started = time.perf_counter()
    channel = channel if channel is not None else channel_for(mechanism)
    method = method if method is not None else table_default(mechanism)
    counts = np.asarray(counts, dtype=float)
    fitted = estimator_for(method, mechanism, seed=seed).fit(counts, channel)
    # The inversion and Norm-Sub take the inversion's interval (intervals' docs); the clipped
    # inversion keeps the bootstrap, which covers it at a fraction of that width on grids.
    # Norm-Sub smoothed is not made from the inversion alone: it keeps the bootstrap or, over
    # k-RR, the score intervals (which hold whatever the estimator).
    unbiased = fitted.unbiased_ if isinstance(fitted, MatrixInversion) and method != CLIP else None
    iterative = isinstance(fitted, (CrossValidatedIBU, MaximumLikelihood))
    interval = confidence_interval(
        counts,
        channel,
        fitted.frequencies_,
        confidence,
        refit=lambda redrawn: fitted.replay(redrawn, channel),
        seed=seed,
        unbiased=unbiased,
        replicates=BOOTSTRAP_REPLICATES if n_bootstrap is None else int(n_bootstrap),
        refit_rows=iterative and channel.products_by_row,
    )
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
        log_likelihood=getattr(fitted, "log_likelihood_", None),
        estimator=fitted.headline(),
        warnings=tuple(fitted.warnings_) + interval.warnings,
        details=fitted.details(),
    )
