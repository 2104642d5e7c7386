"""IBU steps for k-RR on several sets of counts at once, in whole-array numpy: the default path.

The same arithmetic as :mod:`aggregator.estimation.krr_loops` (the ``fast``
extra's compiled loops), a step at a time over every row together: for a
distribution ``p`` (which sums to 1), with ``a = p_keep - p_other`` and
``b = p_other``,

    predicted = a p + b,   r = c / predicted,   p <- p (a r + b sum(r)), renormalised.

Results differ from the compiled loops by rounding only (their sums run in
another order).
"""

from __future__ import annotations

import numpy as np


def ibu_advance(
    counts: np.ndarray, p: np.ndarray, keep_excess: float, other: float, steps: int, tol: float
) -> tuple[int, float]:
    """Up to ``steps`` steps on every row, stopping after one that changes no frequency of any
    row by more than ``tol``; ``p`` is updated in place. Returns the steps taken and the last
    step's largest change (measured on every step only when ``tol > 0``, else on the last)."""
    scratch = np.empty_like(p)
    taken, change = 0, np.inf
    while taken < steps:
        measure = tol > 0 or taken == steps - 1
        # k-RR gives every report probability >= other > 0: no division by zero.
        np.multiply(p, keep_excess, out=scratch)
        scratch += other
        np.divide(counts, scratch, out=scratch)
        shared = other * scratch.sum(axis=1, keepdims=True)
        scratch *= keep_excess
        scratch += shared
        scratch *= p
        scratch /= scratch.sum(axis=1, keepdims=True)
        change = float(np.abs(scratch - p).max()) if measure else np.inf
        p[...] = scratch
        taken += 1
        if change <= tol:
            break
    return taken, change
