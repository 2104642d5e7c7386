"""Estimate responses: counts from the store in, the wire form of an estimate out.

The estimators themselves live in :mod:`aggregator.estimation`; this module
only turns a campaign's counts into the vector they take, runs the chosen
method, and shapes the response (labels, intervals, grid, timings).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aggregator.estimation import METHODS, SingularChannelError, estimate
from aggregator.store import Campaign
from shared.errors import ValidationError
from shared.mechanisms import Mechanism, PlanarLaplace

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


def estimate_response(
    campaign: Campaign, counts: dict[int, int], method: str, confidence: float
) -> dict[str, Any]:
    """The estimate of a campaign's distribution, as it goes on the wire.

    ``method`` and ``confidence`` are already parsed. With no reports yet the
    response has ``n = 0`` and an empty ``estimates`` list.
    """
    mechanism = campaign.mechanism
    vector = count_vector(counts, mechanism.n_outputs)
    head = {"campaign": campaign.spec.id, "spec_hash": campaign.spec_hash}
    if not vector.any():
        return {**head, "method": method, "n": 0, "confidence": confidence, "estimates": []}
    try:
        result = estimate(mechanism, vector, method=method, confidence=confidence)
    except SingularChannelError as exc:
        raise ValidationError(
            f"{method} cannot be used for this campaign: {exc}; use ibu",
            field="method",
            code="method_not_applicable",
        ) from exc
    response = {**head, **result.to_dict(output_labels(mechanism))}
    if isinstance(mechanism, PlanarLaplace):
        grid = mechanism.grid
        response["grid"] = {
            "rows": grid.rows,
            "cols": grid.cols,
            "cell_size_m": grid.cell_size_m,
            "region": grid.region.to_dict(),
            "cells": np.asarray(result.frequencies).reshape(grid.rows, grid.cols).tolist(),
        }
    return response
