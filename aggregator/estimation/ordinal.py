"""The geometric mechanism's channel as an operator: O(m) per product, never an m x m matrix.

For true ``x`` and report ``y`` on a range of ``m`` values (indices 0..m-1),
with ``a = exp(-epsilon)`` and ``c = (1 - a) / (1 + a)``::

    C[x, y] = c a^|y - x|           for 0 < y < m - 1
    C[x, 0] = a^x / (1 + a)         (the clamped lower tail)
    C[x, m - 1] = a^(m-1-x) / (1 + a)

The inner part is a convolution with ``a^|d|``, which two first-order
recursive filters compute exactly (one running up the range, one down):
``L[y] = v[y] + a L[y - 1]`` and ``R[y] = v[y] + a R[y + 1]`` give
``sum_x v[x] a^|y - x| = L[y] + R[y] - v[y]``, and the tails' sums are ``R[0]``
and ``L[m - 1]``.
"""

from __future__ import annotations

import numpy as np
from scipy.signal import lfilter

from aggregator.estimation.channels import Channel
from shared.mechanisms import Geometric


class GeometricChannel(Channel):
    """The clamped geometric mechanism on ``m`` ordered values."""

    def __init__(self, mechanism: Geometric):
        self.n_inputs = self.n_outputs = mechanism.n_inputs
        self.alpha = mechanism.alpha
        self._inner = (1.0 - self.alpha) / (1.0 + self.alpha)
        self._end = 1.0 / (1.0 + self.alpha)
        # a^x and a^(m-1-x): the tails' weights per true value.
        powers = self.alpha ** np.arange(self.n_inputs, dtype=float)
        self._to_low = powers
        self._to_high = powers[::-1].copy()

    def _runs(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(L, R): the discounted sums from below and from above, along the last axis."""
        feedback = [1.0, -self.alpha]
        up = lfilter([1.0], feedback, v, axis=-1)
        down = lfilter([1.0], feedback, v[..., ::-1], axis=-1)[..., ::-1]
        return up, down

    def forward(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        up, down = self._runs(p)
        q = self._inner * (up + down - p)
        q[..., 0] = self._end * down[..., 0]
        q[..., -1] = self._end * up[..., -1]
        return q

    def backward(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        inner = u.copy()
        inner[..., 0] = inner[..., -1] = 0.0
        up, down = self._runs(inner)
        result = self._inner * (up + down - inner)
        result += self._end * np.multiply.outer(u[..., 0], self._to_low)
        result += self._end * np.multiply.outer(u[..., -1], self._to_high)
        return result
