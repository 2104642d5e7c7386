"""The Euclidean exponential mechanism's noise kernel on a report grid.

On the unbounded lattice of cells an offset ``(di, dj)`` has probability
``exp(-a sqrt(di^2 + dj^2)) / Z`` with ``a = epsilon * cell_size_m`` and ``Z``
the sum over the whole lattice (:class:`shared.mechanisms.ExponentialGrid`).
The lattice is summed out to radius ``R = 46 / a`` cells (the mass beyond is
below ``exp(-aR) (1 + aR)``, about 5e-19 of the whole, by comparison with the
integral ``2 pi`` times ``r exp(-a r)``), a quadrant at a time by symmetry, each
offset folded onto the grid's edge as clamping sends it: the layout of
:func:`aggregator.estimation.planar_kernel.kernel`, which
:class:`aggregator.estimation.grid_channels.GridKernelChannel` reads.
"""

from __future__ import annotations

import functools
import math

import numpy as np

# exp(-46) (1 + 46) is about 5e-19: the share of the mass beyond the summed radius.
TAIL_RATES = 46.0
# Offsets evaluated at once (memory of one block of the quadrant).
_BLOCK = 1 << 20


def manhattan_kernel(step: float, rows: int, cols: int) -> np.ndarray:
    """The clamped Manhattan kernel in the same layout: the outer product of the two axes'
    clamped discrete Laplaces, in closed form.

    Along an axis of ``m`` cells with ``a = exp(-step)``, an offset ``|d| < m`` has
    probability ``(1 - a) / (1 + a) a^|d|`` and everything at or beyond ``m`` (either
    side), ``a^m / (1 + a)``.
    """
    if not step > 0:
        raise ValueError(f"step must be > 0, got {step!r}")
    alpha = math.exp(-step)

    def axis(m: int) -> np.ndarray:
        law = (1.0 - alpha) / (1.0 + alpha) * alpha ** np.abs(np.arange(-m, m + 1, dtype=float))
        law[[0, -1]] = alpha**m / (1.0 + alpha)
        return law

    return np.outer(axis(rows), axis(cols))


@functools.lru_cache(maxsize=256)
def mean_displacement_cells(step: float, metric: str) -> float:
    """The mean straight-line distance, in cells, between a report and its true cell on the
    unbounded lattice (``metric`` ``"manhattan"`` or ``"euclidean"``, ``step = epsilon * cell``).

    Summed over a quadrant out to :func:`lattice_radius` (the mass beyond is negligible);
    clamping into a grid only moves reports nearer. The cost grows as ``1 / step^2`` (0.2 s
    at the smallest step a campaign takes, 0.01), so results are cached.
    """
    if not step > 0:
        raise ValueError(f"step must be > 0, got {step!r}")
    radius = lattice_radius(step)
    j = np.arange(radius + 1, dtype=float)
    # Offsets (i, j) with i, j >= 0 stand for 4, 2 (on an axis) or 1 (the origin) lattice points.
    multiplicity_j = np.where(j == 0, 1.0, 2.0)
    weight_sum = distance_sum = 0.0
    block = max(1, _BLOCK // (radius + 1))
    for start in range(0, radius + 1, block):
        i = np.arange(start, min(start + block, radius + 1), dtype=float)
        euclidean = np.hypot(i[:, None], j[None, :])
        score = euclidean if metric == "euclidean" else i[:, None] + j[None, :]
        weights = np.exp(-step * score) * np.where(i == 0, 1.0, 2.0)[:, None] * multiplicity_j
        weight_sum += float(weights.sum())
        distance_sum += float((weights * euclidean).sum())
    return distance_sum / weight_sum


def lattice_radius(step: float) -> int:
    """Cells out to which the lattice is summed for ``step = epsilon * cell_size_m``."""
    return math.ceil(TAIL_RATES / step)


def euclidean_kernel(step: float, rows: int, cols: int) -> np.ndarray:
    """``K[di + rows, dj + cols]``: the clamped Euclidean exponential kernel on ``rows x cols``.

    ``step`` is ``epsilon * cell_size_m``. Rows 0 and ``2 rows`` hold every offset
    at or beyond ``rows`` cells (columns likewise), which from any cell of the grid
    lands on its edge. Sums to 1 up to rounding.
    """
    if not step > 0:
        raise ValueError(f"step must be > 0, got {step!r}")
    radius = max(lattice_radius(step), rows, cols)
    # quadrant[i, j]: offsets (i, j) with i, j >= 0, i folded at rows and j at cols.
    quadrant = np.zeros((rows + 1, cols + 1))
    j = np.arange(radius + 1, dtype=float)
    block = max(1, _BLOCK // (radius + 1))
    for start in range(0, radius + 1, block):
        i = np.arange(start, min(start + block, radius + 1))
        weights = np.exp(-step * np.hypot(i[:, None].astype(float), j[None, :]))
        folded = np.empty((i.size, cols + 1))
        folded[:, :cols] = weights[:, :cols]
        folded[:, cols] = weights[:, cols:].sum(axis=1)
        inner = i[i < rows]
        quadrant[inner] += folded[: inner.size]
        quadrant[rows] += folded[inner.size :].sum(axis=0)
    full = np.empty((2 * rows + 1, 2 * cols + 1))
    full[rows:, cols:] = quadrant
    full[rows:, :cols] = quadrant[:, :0:-1]
    full[:rows, :] = full[:rows:-1, :]
    return full / full.sum()
