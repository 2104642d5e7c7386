"""Matrix inversion and the two ways to make it a distribution.

The unbiased estimate solves ``p C = q`` for the observed report shares ``q``; its entries
can fall below 0 or above 1. Norm-Sub (Wang et al., "Locally differentially private frequency
estimation with consistency", NDSS 2020) shifts every entry by one amount and clips at 0 so
that they sum to 1: that is the Euclidean projection onto the probability simplex, and it
keeps the inversion's accuracy on the values that matter while removing its impossible ones.
Clipping negatives to 0 and renormalising is the older, cruder fix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aggregator.estimation.channels import Channel, report_counts

INVERSION, CLIP, PROJECTION = "inversion", "clip", "projection"
POSTPROCESS = (INVERSION, CLIP, PROJECTION)
HEADLINES = {
    INVERSION: "matrix inversion (unbiased; shares may fall outside [0, 1])",
    CLIP: "matrix inversion, negatives clipped to 0 and renormalised",
    PROJECTION: "Norm-Sub: the unbiased inversion projected onto the simplex",
}


def project_to_simplex(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``v`` onto the probability simplex (Norm-Sub).

    The sort-based algorithm of Held, Wolfe and Crowder (1974), as in Duchi et al.,
    "Efficient projections onto the l1-ball", ICML 2008: O(k log k).
    """
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - 1.0
    index = np.arange(1, v.size + 1)
    rho = np.nonzero(u - cumulative / index > 0)[0][-1]
    theta = cumulative[rho] / (rho + 1)
    return np.maximum(v - theta, 0.0)


def clip_and_normalise(v: np.ndarray) -> np.ndarray:
    """Negative entries set to 0, then rescaled to sum to 1 (equal shares if nothing is left)."""
    clipped = np.maximum(v, 0.0)
    total = clipped.sum()
    return clipped / total if total > 0 else np.full(v.size, 1.0 / v.size)


class MatrixInversion:
    """Solve ``p C = q``; ``postprocess`` is ``"inversion"`` (keep the unbiased solution),
    ``"clip"`` or ``"projection"`` (Norm-Sub).

    Attributes
    ----------
    frequencies_, unbiased_, converged_ (the channel's iterative solver, where it has one,
    reached its tolerance), n_iter_ (None), warnings_.
    """

    def __init__(self, *, postprocess: str = INVERSION):
        if postprocess not in POSTPROCESS:
            raise ValueError(f"postprocess must be one of {POSTPROCESS}, got {postprocess!r}")
        self.postprocess = postprocess
        self.name = postprocess

    def fit(self, counts: Any, channel: Channel) -> MatrixInversion:
        counts = report_counts(counts, channel)
        self.unbiased_, self.converged_ = channel.solve_counts(counts)
        if self.postprocess == CLIP:
            self.frequencies_ = clip_and_normalise(self.unbiased_)
        elif self.postprocess == PROJECTION:
            self.frequencies_ = project_to_simplex(self.unbiased_)
        else:
            self.frequencies_ = self.unbiased_
        self.n_iter_ = None
        self.warnings_: list[str] = []
        if not self.converged_:
            self.warnings_.append(
                "the iterative solver stopped before its tolerance: the inversion is approximate"
            )
        low, high = float(self.unbiased_.min()), float(self.unbiased_.max())
        if self.postprocess == INVERSION and (low < 0 or high > 1):
            self.warnings_.append(
                f"unbiased shares range from {low:.3g} to {high:.3g}: outside [0, 1], the "
                f"mechanism's noise over {int(counts.sum()):,} reports is larger than the "
                "shares; projection (Norm-Sub) gives the nearest distribution"
            )
        return self

    def replay(self, counts: np.ndarray, channel: Channel) -> np.ndarray:
        return MatrixInversion(postprocess=self.postprocess).fit(counts, channel).frequencies_

    def headline(self) -> str:
        return HEADLINES[self.postprocess]

    def details(self) -> dict[str, Any]:
        return {}
