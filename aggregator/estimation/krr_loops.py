"""Compiled IBU steps for k-RR, on several sets of counts at once.

k-RR's channel is ``C = (p_keep - p_other) I + p_other 11^T``, so one IBU
step on counts ``c`` is, for a distribution ``p`` (which sums to 1),

    predicted = a p + b,   r = c / predicted,   p <- p (a r + b sum(r)), renormalised,

with ``a = p_keep - p_other`` and ``b = p_other``: three passes over ``k``
values and no temporary arrays. Each row of ``counts`` and ``p`` is one
independent run (the folds of a cross-validation, or a single estimate).
Imported only where numba is installed; compiled once and cached on disk.
Sums run over four interleaved partial sums, in a fixed order (so that they
pipeline without giving up bit-for-bit reproducibility): results differ from
:class:`ibu.IBUSteps` by rounding only.
"""

from __future__ import annotations

from typing import Literal, TypedDict

import numpy as np
from numba import njit


class _CompileOptions(TypedDict):
    cache: bool
    nogil: bool
    error_model: Literal["python", "numpy"]


COMPILE: _CompileOptions = {"cache": True, "nogil": True, "error_model": "numpy"}
LANES = 4


@njit(**COMPILE)
def _sum(values):
    """``values.sum()`` over :data:`LANES` interleaved partial sums, in a fixed order."""
    partial = np.zeros(LANES)
    n = values.size
    whole = n - n % LANES
    for start in range(0, whole, LANES):
        for lane in range(LANES):
            partial[lane] += values[start + lane]
    total = (partial[0] + partial[1]) + (partial[2] + partial[3])
    for x in range(whole, n):
        total += values[x]
    return total


@njit(**COMPILE)
def ibu_advance(counts, p, keep_excess, other, steps, tol):
    """Up to ``steps`` steps on every row, stopping after one that changes no frequency of any
    row by more than ``tol``; ``p`` is updated in place. Returns the steps taken and the last
    step's largest change (measured on every step only when ``tol > 0``, else on the last)."""
    rows, k = p.shape
    scratch = np.empty(k)
    previous = np.empty(k)
    taken = 0
    change = np.inf
    while taken < steps:
        measure = tol > 0 or taken == steps - 1
        change = 0.0 if measure else np.inf
        for row in range(rows):
            # k-RR gives every report probability >= other > 0: no division by zero.
            for x in range(k):
                scratch[x] = counts[row, x] / (keep_excess * p[row, x] + other)
            shared = other * _sum(scratch)
            for x in range(k):
                scratch[x] = p[row, x] * (keep_excess * scratch[x] + shared)
            scale = 1.0 / _sum(scratch)
            if measure:
                for x in range(k):
                    previous[x] = p[row, x]
            for x in range(k):
                p[row, x] = scratch[x] * scale
            if measure:
                for x in range(k):
                    change = max(change, abs(p[row, x] - previous[x]))
        taken += 1
        if change <= tol:
            break
    return taken, change
