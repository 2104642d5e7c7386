"""The planar channel's convolution and IBU steps on ``scipy.fft``: the default path.

:class:`Convolution` has :class:`aggregator.estimation.fftw.Convolution`'s
interface: two-stage real transforms (rows, then columns), so the padding rows
are never transformed and only the rows asked for come back. :class:`IBUSteps`
runs IBU on a :class:`aggregator.estimation.grid_channels.GridKernelChannel`
with the arithmetic of :mod:`aggregator.estimation.fftw_loops` (four transforms
a step), in whole-array numpy operations on buffers kept between steps.

``workers`` is passed to ``scipy.fft``: the threads one transform may use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import scipy.fft

if TYPE_CHECKING:
    from aggregator.estimation.grid_channels import GridKernelChannel

# Over-relaxed steps raise the EM factor to this power (channels.Channel.ibu_relax_after).
RELAXATION = 1.75


def relax(factor: np.ndarray) -> np.ndarray:
    """``factor ** RELAXATION`` (1.75) in place for a non-negative ``factor``: computed as
    ``f sqrt(f sqrt(f))``, two square roots costing a fraction of a general power."""
    root = np.sqrt(factor)
    root *= factor
    np.sqrt(root, out=root)
    factor *= root
    return factor


class Convolution:
    """One thread's buffers for linear 2-D convolutions of small images, on ``scipy.fft``.

    Write the image into ``image`` (``rows x shape[1]``; columns beyond the
    image are zero padding, rows up to ``shape[0]`` implied zeros), then
    :meth:`apply` a kernel's half spectrum of ``shape`` already divided by the
    transform size: the result's rows are the first ``rows`` rows of the
    circular convolution.
    """

    # One thread per transform: the aggregator already runs estimates side by side (workers and
    # their thread pools), and two threads made a 40 x 40 grid's transforms slower, not faster,
    # on the benchmark machine (80 x 80 transforms are too small to share).
    def __init__(self, rows: int, shape: tuple[int, int], workers: int = 1):
        self.rows, self.shape, self.workers = rows, shape, workers
        self.image = np.zeros((rows, shape[1]))

    def apply(self, spectrum: np.ndarray) -> np.ndarray:
        """The first ``rows`` rows of ``image`` convolved with ``spectrum`` (a fresh array)."""
        workers = self.workers
        rows_spectrum = scipy.fft.rfft(self.image, axis=1, workers=workers)
        full = scipy.fft.fft(rows_spectrum, self.shape[0], axis=0, workers=workers)
        full *= spectrum
        back = scipy.fft.ifft(full, axis=0, norm="forward", overwrite_x=True, workers=workers)
        return scipy.fft.irfft(
            back[: self.rows], self.shape[1], axis=1, norm="forward", workers=workers
        )


class GridSteps:
    """What IBU's steps on a planar channel keep, as ``rows x cols`` grids: the counts,
    ``p`` (starting uniform) and ``predicted`` (see :class:`ibu.IBUSteps`)."""

    def __init__(self, channel: GridKernelChannel, counts: np.ndarray):
        shape = (channel.rows, channel.cols)
        self._channel = channel
        self._counts = np.ascontiguousarray(counts, dtype=float).reshape(shape)
        self._p = np.full(shape, 1.0 / channel.n_inputs)
        self._predicted = np.empty(shape)
        # Plain EM steps up to this many, then over-relaxed (Channel.ibu_relax_after); a count
        # no run reaches where the channel is never over-relaxed.
        after = channel.ibu_relax_after
        self._relax_after = int(np.iinfo(np.int64).max) if after is None else after
        self.steps_taken = 0

    @property
    def p(self) -> np.ndarray:
        return self._p.ravel()

    @property
    def predicted(self) -> np.ndarray:
        return self._predicted.ravel()


class IBUSteps(GridSteps):
    """IBU's steps on a planar channel through :class:`Convolution`: the same iterates as
    the generic steps over ``forward`` and ``backward``, without their per-call buffers
    and checks."""

    def __init__(self, channel: GridKernelChannel, counts: np.ndarray):
        super().__init__(channel, counts)
        rows, cols = channel.rows, channel.cols
        self._observed = self._counts > 0
        # S bordered by a zero first row and column; the ratio padded by a zero last row
        # and column (as forward and backward pad them).
        self._bordered = np.zeros((rows + 1, cols + 1))
        self._ratio = np.zeros((rows + 1, cols + 1))
        self._rows_diff = np.empty((rows, cols + 1))
        self._forward()

    def _forward(self) -> None:
        """``predicted = forward(p)``, negative round-off cleared (``p`` is a distribution)."""
        channel, p, bordered = self._channel, self._p, self._bordered
        rows, cols = p.shape
        convolution = channel._workspace().convolution
        convolution.image[:, :cols] = p
        bordered[1:rows, 1:cols] = convolution.apply(channel._spectrum)[: rows - 1, : cols - 1]
        np.matmul(p.sum(axis=0), channel._last_row, out=bordered[rows, 1:])
        np.matmul(p.sum(axis=1), channel._last_col, out=bordered[1:rows, cols])
        rows_diff = np.subtract(bordered[1:], bordered[:-1], out=self._rows_diff)
        predicted = np.subtract(rows_diff[:, 1:], rows_diff[:, :-1], out=self._predicted)
        np.maximum(predicted, 0.0, out=predicted)

    def _update(self) -> float:
        """One EM update of ``p``; returns the largest change of a frequency."""
        channel, p, ratio = self._channel, self._p, self._ratio
        rows, cols = p.shape
        inner = ratio[:rows, :cols]
        np.divide(self._counts, self._predicted, out=inner, where=self._observed)
        # backward(ratio): the transpose of forward's second differences, then of its products.
        rows_diff = np.subtract(ratio[1:], ratio[:-1], out=self._rows_diff)
        convolution = channel._workspace().convolution
        image = convolution.image
        np.subtract(rows_diff[:-1, 1:cols], rows_diff[:-1, : cols - 1], out=image[:-1, : cols - 1])
        image[:-1, cols - 1] = 0.0
        image[rows - 1] = 0.0
        backward = convolution.apply(channel._spectrum_conj)[:, :cols]
        # Minus the last column's row differences; the last row less its right neighbour.
        backward += (channel._last_col @ -rows_diff[: rows - 1, cols - 1])[:, None]
        backward += channel._last_row @ (ratio[rows - 1, :cols] - ratio[rows - 1, 1:])
        # Non-negative in exact arithmetic: round-off below 0 would leave p at -1e-250.
        np.maximum(backward, 0.0, out=backward)
        if self.steps_taken >= self._relax_after:
            relax(backward)
        backward *= p
        backward /= backward.sum()
        change = float(abs(backward - p).max())
        self._p = backward
        return change

    def advance(self, steps: int, tol: float) -> tuple[int, float]:
        """Up to ``steps`` steps, stopping after one that changes no frequency by more than
        ``tol``. Returns the steps taken and the last one's largest change."""
        taken, change = 0, np.inf
        while taken < steps:
            change = self._update()
            taken += 1
            self.steps_taken += 1
            self._forward()
            if change <= tol:
                break
        return taken, change
