"""Channels of the clamped geometric family as operators, never as matrices.

The geometric mechanism on a range of ``m`` values (indices 0..m-1), with
``a = exp(-epsilon)`` and ``c = (1 - a) / (1 + a)``::

    C[x, y] = c a^|y - x|           for 0 < y < m - 1
    C[x, 0] = a^x / (1 + a)         (the clamped lower tail)
    C[x, m - 1] = a^(m-1-x) / (1 + a)

The inner part is a convolution with ``a^|d|``, which two first-order
recursive filters compute exactly in O(m) (one running up the range, one
down): ``L[y] = v[y] + a L[y - 1]`` and ``R[y] = v[y] + a R[y + 1]`` give
``sum_x v[x] a^|y - x| = L[y] + R[y] - v[y]``, and the tails' sums are ``R[0]``
and ``L[m - 1]``. The Manhattan exponential mechanism on a grid is this
channel along the rows times this channel along the columns, so its products
are the one-dimensional ones applied along each axis in turn: O(cells).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from scipy.signal import lfilter

from aggregator.estimation.channels import Channel
from shared.mechanisms import ExponentialGrid, Geometric


class ClampedGeometric:
    """Products with the clamped geometric channel on ``m`` values, along one axis, and its
    exact banded inverse (see :class:`GeometricChannel`). On one value the channel is 1."""

    def __init__(self, alpha: float, m: int):
        self.alpha = alpha
        self.m = m
        self._inner = (1.0 - alpha) / (1.0 + alpha)
        self._end = 1.0 / (1.0 + alpha)
        powers = alpha ** np.arange(m, dtype=float)
        # a^x and a^(m-1-x): each true value's weight on the lower and the upper end.
        self._to_low = powers
        self._to_high = powers[::-1].copy()
        # The inverse: the ends' scale s_y and the filter's centre tap d_x, over (1 - a)^2.
        self._scale = np.ones(m)
        self._scale[[0, -1]] = 1.0 - alpha
        self._centre = np.full(m, 1.0 + alpha * alpha)
        self._centre[[0, -1]] = 1.0
        self._denominator = (1.0 - alpha) ** 2

    def diagonal(self) -> np.ndarray:
        """``C[x, x]`` for every ``x``: the chance that a report keeps its value, ``c`` inside
        the range and ``1 / (1 + a)`` at its clamped ends (1 on one value)."""
        if self.m == 1:
            return np.ones(1)
        stay = np.full(self.m, self._inner)
        stay[[0, -1]] = self._end
        return stay

    def forward_squared(self, p: np.ndarray) -> np.ndarray:
        """``sum_x p_x C[x, y]^2`` for every ``y`` (along the last axis): the squared entries
        are this family's with ``a^2`` (inner ``c^2 a^(2|d|)``, ends ``a^(2x) / (1 + a)^2``), so
        the channel of ``a^2``'s product, rescaled at the inner values and at the ends."""
        if self.m == 1:
            return np.asarray(p, dtype=float).copy()
        squared = self._squared
        result = squared.forward(p)
        result *= self._inner**2 / squared._inner
        result[..., [0, -1]] *= (self._end**2 / squared._end) / (self._inner**2 / squared._inner)
        return result

    @cached_property
    def _squared(self) -> ClampedGeometric:
        """The channel of ``a^2`` on the same values (built once: its weights are O(m))."""
        return ClampedGeometric(self.alpha**2, self.m)

    def solve(self, q: np.ndarray, axis: int = -1) -> np.ndarray:
        """The ``p`` with ``p C = q`` along ``axis``: three taps per value."""
        return self._taps(q, axis, self._scale, self._centre, -self.alpha, self._denominator)

    def squared_inverse(self, q: np.ndarray, axis: int = -1) -> np.ndarray:
        """``sum_y (C^-1)[y, x]^2 q_y`` along ``axis``, from the squared taps."""
        return self._taps(
            q, axis, self._scale**2, self._centre**2, self.alpha**2, self._denominator**2
        )

    def _taps(self, q, axis: int, scale, centre, side: float, denominator: float) -> np.ndarray:
        """``(centre r_x + side (r_{x-1} + r_{x+1})) / denominator`` with ``r = scale q``."""
        if self.m == 1:
            return np.asarray(q, dtype=float).copy()
        r = scale * np.moveaxis(np.asarray(q, dtype=float), axis, -1)
        out = centre * r
        out[..., 1:] += side * r[..., :-1]
        out[..., :-1] += side * r[..., 1:]
        return np.moveaxis(out / denominator, -1, axis)

    def _runs(self, v: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """(L, R): the discounted sums from below and from above, along ``axis``."""
        feedback = [1.0, -self.alpha]
        up = lfilter([1.0], feedback, v, axis=axis)
        down = np.flip(lfilter([1.0], feedback, np.flip(v, axis), axis=axis), axis)
        return up, down

    def forward(self, p: np.ndarray, axis: int = -1) -> np.ndarray:
        if self.m == 1:
            return np.asarray(p, dtype=float).copy()
        p = np.moveaxis(np.asarray(p, dtype=float), axis, -1)
        up, down = self._runs(p, -1)
        q = self._inner * (up + down - p)
        q[..., 0] = self._end * down[..., 0]
        q[..., -1] = self._end * up[..., -1]
        return np.moveaxis(q, -1, axis)

    def backward(self, u: np.ndarray, axis: int = -1) -> np.ndarray:
        if self.m == 1:
            return np.asarray(u, dtype=float).copy()
        u = np.moveaxis(np.asarray(u, dtype=float), axis, -1)
        inner = u.copy()
        inner[..., 0] = inner[..., -1] = 0.0
        up, down = self._runs(inner, -1)
        result = self._inner * (up + down - inner)
        result += self._end * u[..., :1] * self._to_low
        result += self._end * u[..., -1:] * self._to_high
        return np.moveaxis(result, -1, axis)


class GeometricChannel(Channel):
    """The geometric mechanism's channel on its range, with its exact banded inverse.

    The inner convolution with ``c a^|d|`` is undone by the three-tap filter
    ``((1 + a^2) r_y - a r_{y-1} - a r_{y+1}) / (1 - a)^2`` (its z-transform is the
    reciprocal of the kernel's). On the unbounded lattice the report
    distribution ``r`` below the range decays as ``r_0 a^j`` (every true value
    lies above it), so the clamped end's probability is ``r_0 / (1 - a)``, and
    likewise at the top. Hence ``p = q C^-1`` in O(m) exactly: ``r = q`` with the
    two ends scaled by ``1 - a``, then the filter, whose ends read
    ``(r_0 - a r_1) / (1 - a)^2`` (the lattice's ``r_{-1} = a r_0``). Each ``p_x``
    depends on ``q_{x-1}, q_x, q_{x+1}`` only, which also gives the inversion's
    variance exactly in O(m).
    """

    products_by_row = True

    def __init__(self, mechanism: Geometric):
        self.n_inputs = self.n_outputs = mechanism.n_inputs
        self.alpha = mechanism.alpha
        self._axis = ClampedGeometric(mechanism.alpha, mechanism.n_inputs)

    def forward(self, p: np.ndarray) -> np.ndarray:
        return self._axis.forward(p)

    def backward(self, u: np.ndarray) -> np.ndarray:
        return self._axis.backward(u)

    def diagonal(self) -> np.ndarray:
        """``C[x, x]``: the chance that a report keeps its user's value."""
        return self._axis.diagonal()

    def solve_with_info(self, q: np.ndarray) -> tuple[np.ndarray, bool]:
        """The ``p`` with ``p C = q``, exactly, in O(m) (see the class docstring)."""
        return self._axis.solve(q), True

    def report_variance(self, p: np.ndarray) -> np.ndarray:
        """Each report count's variance per user, the users' values fixed at shares ``p``:
        ``sum_x p_x C[x, y] (1 - C[x, y])`` (each user's report is its own Bernoulli draw
        at ``y``; the mechanism's noise alone, not the drawing of the users)."""
        return self.forward(p) - self._axis.forward_squared(p)

    def inversion_second_moment(self, q: np.ndarray) -> np.ndarray:
        """``sum_y (C^-1)[y, x]^2 q_y`` for every ``x``, exactly, from the three taps."""
        return self._axis.squared_inverse(q)


class ManhattanGridChannel(Channel):
    """The Manhattan exponential mechanism's channel on a ``rows x cols`` grid (row-major).

    The channel is the Kronecker product of the clamped geometric channels along
    the rows and along the columns, so its inverse is the product of theirs (three
    taps per axis: nine per cell) and the squared entries of the inverse are the
    products of the squared taps: the inversion and its exact variance in O(cells).
    """

    def __init__(self, mechanism: ExponentialGrid):
        grid = mechanism.grid
        self.shape = (grid.rows, grid.cols)
        self.n_inputs = self.n_outputs = grid.n_cells
        self._rows = ClampedGeometric(mechanism.alpha, grid.rows)
        self._cols = ClampedGeometric(mechanism.alpha, grid.cols)

    def _apply(self, v: np.ndarray, backward: bool) -> np.ndarray:
        v = np.asarray(v, dtype=float)
        planes = v.reshape(*v.shape[:-1], *self.shape)
        along = "backward" if backward else "forward"
        planes = getattr(self._cols, along)(planes, axis=-1)
        planes = getattr(self._rows, along)(planes, axis=-2)
        return planes.reshape(v.shape)

    def forward(self, p: np.ndarray) -> np.ndarray:
        return self._apply(p, backward=False)

    def backward(self, u: np.ndarray) -> np.ndarray:
        return self._apply(u, backward=True)

    def solve_with_info(self, q: np.ndarray) -> tuple[np.ndarray, bool]:
        """The ``p`` with ``p C = q``, exactly, one banded inverse per axis."""
        planes = np.asarray(q, dtype=float).reshape(self.shape)
        planes = self._rows.solve(self._cols.solve(planes, axis=-1), axis=-2)
        return planes.ravel(), True

    def inversion_second_moment(self, q: np.ndarray) -> np.ndarray:
        """``sum_y (C^-1)[y, x]^2 q_y`` for every cell ``x``, exactly."""
        planes = np.asarray(q, dtype=float).reshape(self.shape)
        planes = self._rows.squared_inverse(self._cols.squared_inverse(planes, axis=-1), axis=-2)
        return planes.ravel()
