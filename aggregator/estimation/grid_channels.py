"""Channels on a grid of cells whose reports are cells of the same grid.

:class:`GridKernelChannel` applies a clamped translation-invariant channel (planar
Laplace, the Euclidean exponential mechanism) as an FFT convolution plus the exact fold of
the remapping at the edges, never forming the ``g^2 x g^2`` matrix.
"""

from __future__ import annotations

import threading
from functools import cached_property
from types import SimpleNamespace

import numpy as np
import scipy.fft
import scipy.linalg
from scipy.sparse.linalg import LinearOperator

from aggregator.estimation import fftw, planar_steps
from aggregator.estimation.channels import Channel
from aggregator.estimation.grid_kernel import manhattan_kernel
from aggregator.estimation.ordinal import ManhattanGridChannel
from aggregator.estimation.planar_kernel import kernel as planar_kernel
from shared.mechanisms import ExponentialGrid


class _PlanarIBUSteps(planar_steps.GridSteps):
    """IBU's steps on a grid convolution channel, run by compiled loops around FFTW's plans."""

    def __init__(self, channel: GridKernelChannel, counts: np.ndarray):
        super().__init__(channel, counts)
        bordered = np.zeros((channel.rows + 1, channel.cols + 1))
        self._loops.ibu_forward(*self._operands(), self._p, self._predicted, bordered)

    @property
    def _loops(self):
        return self._channel._fftw.loops

    def _operands(self) -> tuple:
        """This thread's transforms, the kernel's two spectra, the edges' 1-D factors."""
        channel = self._channel
        convolution = channel._workspace().convolution
        fft = (
            channel._fftw.execute,  # type: ignore[union-attr]  # these steps exist only with FFTW
            convolution.plans,
            convolution.image,
            convolution.spectrum,
            convolution.result,
        )
        return (
            fft,
            (channel._spectrum, channel._spectrum_conj),
            channel._edges,
        )

    def advance(self, steps: int, tol: float) -> tuple[int, float]:
        taken, change = self._loops.ibu_advance(
            *self._operands(),
            self._counts,
            self._p,
            self._predicted,
            steps,
            tol,
            self.steps_taken,
            self._relax_after,
        )
        self.steps_taken += taken
        return taken, change


class GridKernelChannel(Channel):
    """Translation-invariant noise on a ``rows x cols`` grid, clamped into the grid.

    A report lands in cell ``clip(x + d)`` where ``d`` is the noise offset in
    cells, drawn from a kernel that does not depend on ``x``, and ``clip``
    clamps each index into the grid (the nearest-point remapping). Offsets of
    ``rows`` or more (``cols`` or more) always clamp to the edge, so the
    kernel is truncated there with its tail folded in and nothing is
    approximated: ``kernel[di + rows, dj + cols]`` for ``|di| < rows``,
    ``|dj| < cols``, its outer rows and columns holding everything at or
    beyond (planar Laplace: :func:`planar_kernel.kernel`; the Euclidean
    exponential mechanism: :func:`grid_kernel.euclidean_kernel`).

    The remapping is handled through cumulative sums instead of an extended
    grid. ``forward`` computes ``S[i, j] = P(report row <= i, report col <= j)``
    on the grid: for ``i < rows - 1`` and ``j < cols - 1`` one FFT
    convolution of ``p`` with the kernel summed cumulatively along both axes
    (it only reads offsets within ``rows - 1`` cells, so an FFT of about
    ``2 rows`` per axis sees no wrap-around), and for the last row and column
    (``i`` or ``j`` unbounded) 1-D products of ``p``'s column and row sums with
    the kernel's cumulated marginals. The second differences of ``S`` are the
    report probabilities, each edge cell holding everything remapped onto it.
    ``backward`` is the transpose of the same steps.

    Both keep per-thread buffers, so one channel can serve several threads.
    Values carry an absolute rounding error of about 1e-16 of the total mass
    (the cumulative sums are of order one).
    """

    # Spiky truths (check-ins on venues) call for hundreds of IBU steps; after the first 30,
    # raising the EM factor to 1.75 covers the same path in about 1 / 1.75 as many (not 2: a
    # direction EM settles in one step would oscillate without decaying there).
    ibu_relax_after = 30

    def __init__(self, kernel: np.ndarray, rows: int, cols: int):
        if kernel.shape != (2 * rows + 1, 2 * cols + 1):
            raise ValueError(
                f"a {rows} x {cols} grid needs a kernel of {2 * rows + 1} x {2 * cols + 1}"
            )
        self.rows, self.cols = rows, cols
        self.n_inputs = self.n_outputs = rows * cols
        self.kernel = kernel
        cumulative = self.kernel.cumsum(axis=0).cumsum(axis=1)
        # Column j of S's last row: sum over y of colsum(p)[y] * marginal[j - y]; the extra
        # column of ones gives S's corner, the total mass.
        marginal = cumulative[-1]
        y, j = np.arange(cols)[:, None], np.arange(cols - 1)[None, :]
        self._last_row = np.hstack([marginal[j - y + cols], np.ones((cols, 1))])
        marginal = cumulative[:, -1]
        x, i = np.arange(rows)[:, None], np.arange(rows - 1)[None, :]
        self._last_col = marginal[i - x + rows]
        # The compiled IBU steps read them along both axes.
        self._edges = (
            self._last_row,
            self._last_col,
            np.ascontiguousarray(self._last_row.T),
            np.ascontiguousarray(self._last_col.T),
        )
        self._fft_shape = (
            scipy.fft.next_fast_len(max(2 * rows - 2, 1), real=True),
            scipy.fft.next_fast_len(max(2 * cols - 2, 1), real=True),
        )
        # S's FFT part reads offsets -(rows - 1) .. rows - 2 of the cumulated kernel.
        image = np.zeros(self._fft_shape)
        di, dj = np.arange(1 - rows, rows - 1), np.arange(1 - cols, cols - 1)
        image[np.ix_(di % self._fft_shape[0], dj % self._fft_shape[1])] = cumulative[
            np.ix_(di + rows, dj + cols)
        ]
        spectrum = scipy.fft.rfft2(image) / (self._fft_shape[0] * self._fft_shape[1])
        self._spectrum = spectrum
        self._spectrum_conj = spectrum.conj()
        self._fftw = fftw.load() if rows > 1 and cols > 1 else None
        self._local = threading.local()
        self._workspace()  # plan the transforms now, as part of building the channel

    def _workspace(self) -> SimpleNamespace:
        """This thread's buffers: FFT plans, ``S`` bordered by zeros, ``u`` padded by zeros."""
        workspace = getattr(self._local, "workspace", None)
        if workspace is None:
            rows, cols = self.rows, self.cols
            convolution: planar_steps.Convolution | fftw.Convolution | None
            if rows == 1 or cols == 1:
                convolution = None
            elif self._fftw is None:
                convolution = planar_steps.Convolution(rows, self._fft_shape)
            else:
                convolution = fftw.Convolution(self._fftw, rows, self._fft_shape)
            workspace = SimpleNamespace(
                convolution=convolution,
                bordered=np.zeros((rows + 1, cols + 1)),
                padded=np.zeros((rows + 2, cols + 2)),
                rows_diff=np.empty((rows + 1, cols + 2)),
            )
            self._local.workspace = workspace
        return workspace

    @cached_property
    def _periodic(self) -> tuple[tuple[int, int], np.ndarray]:
        """The FFT shape and kernel spectrum of the periodic (torus) convolution by the kernel."""
        shape = (
            scipy.fft.next_fast_len(3 * self.rows, real=True),
            scipy.fft.next_fast_len(3 * self.cols, real=True),
        )
        return shape, scipy.fft.rfft2(self.kernel, shape)

    def preconditioner(self) -> LinearOperator:
        """Periodic deconvolution by the kernel: exact away from the grid's edges.

        Dividing by the kernel's spectrum inverts the convolution on the torus
        of the FFT; the remapping at the edges is what it misses, and GMRES
        corrects that in about a hundred products where the plain operator
        needs thousands (the channel's condition number grows with the grid).
        """
        rows, cols = self.rows, self.cols
        shape, kernel_fft = self._periodic

        def deconvolve(q: np.ndarray) -> np.ndarray:
            image = scipy.fft.irfft2(
                scipy.fft.rfft2(q.reshape(rows, cols), shape) / kernel_fft, shape
            )
            # The kernel's centre sits at (rows, cols): undo that shift.
            return np.roll(image, (rows, cols), axis=(0, 1))[:rows, :cols].ravel()

        return LinearOperator((self.n_inputs, self.n_outputs), matvec=deconvolve)

    def inverse_second_moment(self, q: np.ndarray) -> np.ndarray:
        """``sum_y M[x, y]^2 q_y`` for ``M = C^-T``, with ``M`` taken as the periodic inverse.

        The variance of the unbiased inversion needs the squared entries of the
        inverse; with the periodic deconvolution for ``M`` (the preconditioner
        above) they form one convolution of ``q`` with the squared inverse
        kernel. Exact away from the edges, where the remapping changes the
        inverse; used where a dense inverse is too large.
        """
        rows, cols = self.rows, self.cols
        shape, kernel_fft = self._periodic
        inverse = np.roll(scipy.fft.irfft2(1.0 / kernel_fft, shape), (rows, cols), (0, 1))
        spectrum = scipy.fft.rfft2(q.reshape(rows, cols), shape) * scipy.fft.rfft2(
            inverse**2, shape
        )
        return scipy.fft.irfft2(spectrum, shape)[:rows, :cols].ravel()

    def noise_reach(self, mass: float) -> int:
        """The half-width, in cells, of the smallest square around a cell that holds at least
        ``mass`` of its reports' noise (the kernel's mass within that many rows and columns).
        """
        if not 0 < mass <= 1:
            raise ValueError(f"mass must be in (0, 1], got {mass!r}")
        rows, cols = self.rows, self.cols
        # Mass of the square of half-width h: the kernel's centred sub-square.
        for reach in range(max(rows, cols)):
            square = self.kernel[
                max(rows - reach, 0) : rows + reach + 1, max(cols - reach, 0) : cols + reach + 1
            ]
            if square.sum() >= mass * (1 - 1e-12):
                return reach
        return max(rows, cols)

    @property
    def steps_run_in_parallel(self) -> bool:
        """With FFTW and numba the steps run in compiled loops that release Python's lock
        (the spiky 64 x 64 city's estimate with intervals: 0.65 s on two threads, 1.17 s on
        one); on ``scipy.fft`` two threads were slower than one (4.5 s against 4.2 s)."""
        return self._fftw is not None

    def ibu_steps(self, counts: np.ndarray) -> _PlanarIBUSteps | planar_steps.IBUSteps | None:
        """IBU steps of four transforms each: on ``scipy.fft``, or compiled around FFTW's
        plans where the ``fast`` extra (pyFFTW, numba) is installed; None for a single row
        or column (the generic steps serve it)."""
        if self.rows == 1 or self.cols == 1:
            return None
        if self._fftw is None:
            return planar_steps.IBUSteps(self, counts)
        return _PlanarIBUSteps(self, counts)

    def forward(self, p: np.ndarray) -> np.ndarray:
        rows, cols = self.rows, self.cols
        grid = p.reshape(rows, cols)
        workspace = self._workspace()
        # bordered[1 + i, 1 + j] = S[i, j]; row and column 0 stay zero (nothing below the grid).
        bordered = workspace.bordered
        if workspace.convolution is not None:
            workspace.convolution.image[:rows, :cols] = grid
            bordered[1:rows, 1:cols] = workspace.convolution.apply(self._spectrum)[
                : rows - 1, : cols - 1
            ]
        np.matmul(grid.sum(axis=0), self._last_row, out=bordered[rows, 1:])
        np.matmul(grid.sum(axis=1), self._last_col, out=bordered[1:rows, cols])
        rows_diff = np.subtract(bordered[1:], bordered[:-1], out=workspace.rows_diff[:rows, 1:])
        out = np.subtract(rows_diff[:, 1:], rows_diff[:, :-1]).ravel()
        # FFT round-off can leave -1e-16 where a distribution's image is 0: clear it for
        # non-negative inputs only, so that signed vectors (GMRES, probes) stay linear.
        return np.maximum(out, 0.0, out=out) if p.min() >= 0 else out

    def backward(self, u: np.ndarray) -> np.ndarray:
        rows, cols = self.rows, self.cols
        workspace = self._workspace()
        # The transpose of forward's second differences: those of u padded by zeros, g[k, l]
        # weighting bordered[k, l].
        padded = workspace.padded
        padded[1:-1, 1:-1] = u.reshape(rows, cols)
        rows_diff = np.subtract(padded[1:], padded[:-1], out=workspace.rows_diff)
        last_row = rows_diff[rows, 2:] - rows_diff[rows, 1:-1]
        last_col = rows_diff[1:rows, cols + 1] - rows_diff[1:rows, cols]
        out = (self._last_row @ last_row)[None, :] + (self._last_col @ last_col)[:, None]
        if workspace.convolution is not None:
            image = workspace.convolution.image
            np.subtract(
                rows_diff[1:rows, 2 : cols + 1],
                rows_diff[1:rows, 1:cols],
                out=image[: rows - 1, : cols - 1],
            )
            image[rows - 1, :cols] = 0.0
            image[: rows - 1, cols - 1] = 0.0
            out += workspace.convolution.apply(self._spectrum_conj)[:, :cols]
        return out.ravel()

    def to_dense(self) -> np.ndarray:
        return self.dense_reference()

    def row_of(self, x: int) -> np.ndarray:
        """Row ``x`` of the matrix, summed from the kernel directly (no FFT)."""
        rows, cols = self.rows, self.cols
        row = np.zeros(rows * cols)
        r, c = divmod(x, cols)
        out_r = np.clip(r + np.arange(-rows, rows + 1), 0, rows - 1)
        out_c = np.clip(c + np.arange(-cols, cols + 1), 0, cols - 1)
        np.add.at(row, (out_r[:, None] * cols + out_c[None, :]).ravel(), self.kernel.ravel())
        return row

    def dense_reference(self) -> np.ndarray:
        """The matrix built cell by cell from the kernel, without FFTs (tests only)."""
        return np.stack([self.row_of(x) for x in range(self.n_inputs)])


class PlanarLaplaceChannel(GridKernelChannel):
    """Planar Laplace on a ``rows x cols`` grid, with remapping into the grid: the kernel is
    the planar Laplace mass of each cell (:func:`planar_kernel.kernel`)."""

    def __init__(self, *, epsilon: float, cell_size_m: float, rows: int, cols: int):
        super().__init__(planar_kernel(epsilon, cell_size_m, rows, cols), rows, cols)


class ManhattanKernelChannel(GridKernelChannel):
    """The Manhattan exponential mechanism on a grid: the FFT convolution channel (and its
    compiled IBU steps) on the product kernel, with the exact separable inverse.

    The channel is the Kronecker product of the clamped geometric channels along the
    rows and the columns, so ``p = q C^-1`` and the inversion's exact variance are
    three taps per axis (:class:`aggregator.estimation.ordinal.ManhattanGridChannel`,
    which applies the products with recursive filters instead).
    """

    def __init__(self, mechanism: ExponentialGrid):
        grid = mechanism.grid
        step = float(mechanism.step_epsilon)
        super().__init__(manhattan_kernel(step, grid.rows, grid.cols), grid.rows, grid.cols)
        self._separable = ManhattanGridChannel(mechanism)

    def solve_with_info(self, q: np.ndarray) -> tuple[np.ndarray, bool]:
        return self._separable.solve_with_info(q)

    def inversion_second_moment(self, q: np.ndarray) -> np.ndarray:
        return self._separable.inversion_second_moment(q)
