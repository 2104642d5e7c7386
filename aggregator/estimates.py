"""Estimate responses: counts from the store in, the wire form of an estimate out.

The estimators themselves live in :mod:`aggregator.estimation`; this module
only turns a campaign's counts into the vector they take, runs the chosen
method, and shapes the response (labels, intervals, grid, timings).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from aggregator.estimation.channels import channel_for
from aggregator.store import Campaign
from shared.errors import ValidationError
from shared.mechanisms import Mechanism, PlanarLaplace

METHODS = ("ibu", "inversion", "clip", "projection")
DEFAULT_METHOD = "ibu"
DEFAULT_CONFIDENCE = 0.95


def cell_label(row: int, col: int) -> str:
    """The label of a report-grid cell (row 0 is the southern edge, col 0 the western)."""
    return f"r{row}c{col}"


def output_labels(mechanism: Mechanism) -> list[str]:
    """One label per output index: the category, or the grid cell."""
    if isinstance(mechanism, PlanarLaplace):
        cols = mechanism.grid.cols
        return [cell_label(*divmod(y, cols)) for y in range(mechanism.n_outputs)]
    return [mechanism.report_value(y) for y in range(mechanism.n_outputs)]


def parse_method(raw: str) -> str:
    if raw not in METHODS:
        raise ValidationError(
            f"method must be one of {', '.join(METHODS)}, got {raw!r}",
            field="method",
            code="invalid_parameter",
        )
    return raw


def parse_confidence(raw: str | None) -> float:
    """The interval's confidence level from a query string, in (0, 1); 0.95 by default."""
    if raw is None:
        return DEFAULT_CONFIDENCE
    try:
        level = float(raw)
    except ValueError:
        level = math.nan
    if not (math.isfinite(level) and 0 < level < 1):
        raise ValidationError(
            "confidence must be a number strictly between 0 and 1",
            field="confidence",
            code="invalid_parameter",
        )
    return level


def count_vector(counts: dict[int, int], n_outputs: int) -> np.ndarray:
    vector = np.zeros(n_outputs, dtype=np.int64)
    for output, count in counts.items():
        vector[output] = count
    return vector


def run_estimator(method: str, counts: np.ndarray, channel: Any, confidence: float) -> dict:
    """Run one estimation method; the single point of contact with :mod:`aggregator.estimation`.

    Returns ``frequency``, ``ci_low``, ``ci_high`` (arrays over input indices)
    and ``iterations`` / ``converged`` (None for closed-form methods).
    """
    from aggregator import estimation

    return estimation.estimate(counts, channel, method=method, confidence=confidence)


def estimate_response(
    campaign: Campaign, counts: dict[int, int], method: str, confidence: float
) -> dict[str, Any]:
    """The estimate of a campaign's distribution, as it goes on the wire (``method`` parsed)."""
    mechanism = Mechanism.from_spec(campaign.spec)
    vector = count_vector(counts, mechanism.n_outputs)
    n = int(vector.sum())
    labels = output_labels(mechanism)
    response: dict[str, Any] = {
        "campaign": campaign.spec.id,
        "spec_hash": campaign.spec_hash,
        "method": method,
        "n": n,
        "confidence": confidence,
        "estimates": [],
        "iterations": None,
        "converged": None,
        "timings": {},
    }
    if n == 0:
        return response
    started = time.perf_counter()
    channel = channel_for(mechanism)
    built = time.perf_counter()
    fitted = run_estimator(method, vector, channel, confidence)
    finished = time.perf_counter()
    frequency = np.asarray(fitted["frequency"], dtype=float)
    low = np.asarray(fitted["ci_low"], dtype=float)
    high = np.asarray(fitted["ci_high"], dtype=float)
    response["estimates"] = [
        {"label": label, "frequency": f, "ci_low": lo, "ci_high": hi}
        for label, f, lo, hi in zip(
            labels, frequency.tolist(), low.tolist(), high.tolist(), strict=True
        )
    ]
    response["iterations"] = fitted.get("iterations")
    response["converged"] = fitted.get("converged")
    response["timings"] = {
        "channel_ms": round((built - started) * 1000, 3),
        "estimate_ms": round((finished - built) * 1000, 3),
    }
    if isinstance(mechanism, PlanarLaplace):
        grid = mechanism.grid
        response["grid"] = {
            "rows": grid.rows,
            "cols": grid.cols,
            "cell_size_m": grid.cell_size_m,
            "region": grid.region.to_dict(),
            "cells": frequency.reshape(grid.rows, grid.cols).tolist(),
        }
    return response
