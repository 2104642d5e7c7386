"""Channels as operators.

A channel ``C`` has ``C[x, y] = P(report y | true x)``: rows are true values,
columns are reports, and every row sums to 1. Estimators never see ``C``
itself, only these two products:

* ``forward(p) = p C``: the report distribution that a true distribution
  ``p`` produces (length ``n_outputs``);
* ``backward(u) = C u``: for each true value, the expectation of ``u`` over
  its reports (length ``n_inputs``).

:class:`DenseChannel` is the plain reference; :class:`KRRChannel` applies
k-RR's ``(p - q) I + q 11^T`` in O(k); :class:`PlanarLaplaceChannel` applies
the grid channel as an FFT convolution plus the exact fold of the remapping,
never forming the ``g^2 x g^2`` matrix.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import scipy.fft
import scipy.linalg
from scipy.sparse.linalg import LinearOperator, gmres

from aggregator.estimation.planar_kernel import kernel as planar_kernel
from shared.mechanisms import KRR, Mechanism, PlanarLaplace

# Channels up to this many inputs are inverted through a dense LU factorisation.
DENSE_SOLVE_LIMIT = 2500
GMRES_RTOL = 1e-12
GMRES_RESTART = 100
GMRES_RESTARTS = 20
# A solution whose true relative residual is below this counts as converged.
GMRES_ACCEPT = 1e-9


class SingularChannelError(ValueError):
    """The channel cannot be inverted (e.g. k-RR whose weights are equal)."""


class Channel(ABC):
    """The operator interface every estimator works with."""

    n_inputs: int
    n_outputs: int

    @abstractmethod
    def forward(self, p: np.ndarray) -> np.ndarray:
        """``p C``."""

    @abstractmethod
    def backward(self, u: np.ndarray) -> np.ndarray:
        """``C u``."""

    def to_dense(self) -> np.ndarray:
        """The matrix, row by row through ``forward`` (for tests and small channels)."""
        eye = np.eye(self.n_inputs)
        return np.stack([self.forward(row) for row in eye])

    def solve(self, q: np.ndarray) -> np.ndarray:
        """The ``p`` with ``p C = q``."""
        return self.solve_with_info(q)[0]

    def solve_with_info(self, q: np.ndarray) -> tuple[np.ndarray, bool]:
        """``(p, converged)``: dense LU for small channels, GMRES on the operator otherwise.

        ``converged`` is False when GMRES stopped at its iteration cap before
        reaching ``GMRES_RTOL``; the best iterate is returned.
        """
        if self.n_inputs <= DENSE_SOLVE_LIMIT:
            return scipy.linalg.lu_solve(self._lu(), q, trans=1), True
        operator = LinearOperator(
            (self.n_outputs, self.n_inputs), matvec=self.forward, rmatvec=self.backward
        )
        solution, info = gmres(
            operator,
            q,
            rtol=GMRES_RTOL,
            atol=0.0,
            restart=GMRES_RESTART,
            maxiter=GMRES_RESTARTS,
            M=self._preconditioner(),
        )
        if info < 0:
            raise SingularChannelError("GMRES broke down: the channel is singular")
        # A preconditioned GMRES measures its own residual; judge by the true one.
        residual = np.linalg.norm(self.forward(solution) - q)
        return solution, bool(residual <= GMRES_ACCEPT * np.linalg.norm(q))

    def _preconditioner(self) -> LinearOperator | None:
        """An approximate inverse of ``p -> p C`` for GMRES, if the structure offers one."""
        return None

    def _lu(self):
        if getattr(self, "_lu_cache", None) is None:
            lu, pivots = scipy.linalg.lu_factor(self.to_dense(), check_finite=False)
            diagonal = np.abs(np.diag(lu))
            if diagonal.min() <= 1e-14 * diagonal.max():
                raise SingularChannelError("the channel matrix is singular; it cannot be inverted")
            self._lu_cache = (lu, pivots)
        return self._lu_cache


class DenseChannel(Channel):
    """A channel given as an explicit row-stochastic matrix."""

    def __init__(self, matrix: np.ndarray):
        matrix = np.asarray(matrix, dtype=float)
        if matrix.ndim != 2:
            raise ValueError("a channel matrix must be two-dimensional")
        if np.any(matrix < 0) or not np.allclose(matrix.sum(axis=1), 1.0, atol=1e-9):
            raise ValueError("a channel matrix must be non-negative with rows summing to 1")
        self.matrix = matrix
        self.n_inputs, self.n_outputs = matrix.shape

    def forward(self, p: np.ndarray) -> np.ndarray:
        return p @ self.matrix

    def backward(self, u: np.ndarray) -> np.ndarray:
        return self.matrix @ u

    def to_dense(self) -> np.ndarray:
        return self.matrix.copy()


class KRRChannel(Channel):
    """k-RR: ``C = (p_keep - p_other) I + p_other 11^T``, applied in O(k)."""

    def __init__(self, k: int, p_keep: float, p_other: float):
        self.n_inputs = self.n_outputs = k
        self.p_keep = p_keep
        self.p_other = p_other

    def forward(self, p: np.ndarray) -> np.ndarray:
        return (self.p_keep - self.p_other) * p + self.p_other * p.sum()

    backward = forward  # the matrix is symmetric

    def solve_with_info(self, q: np.ndarray) -> tuple[np.ndarray, bool]:
        """The ``p`` with ``p C = q``, in closed form."""
        if self.p_keep <= self.p_other:
            raise SingularChannelError("k-RR with epsilon this small cannot be inverted")
        return (q - self.p_other * q.sum()) / (self.p_keep - self.p_other), True


class PlanarLaplaceChannel(Channel):
    """Planar Laplace on a ``rows x cols`` grid, with remapping into the grid.

    A report lands in cell ``clip(x + d)`` where ``d`` is the noise offset in
    cells and ``clip`` clamps each index into the grid (the nearest-point
    remapping). Offsets of ``rows`` or more (``cols`` or more) always clamp to
    the edge, so the kernel is truncated there with its tail folded in (see
    :func:`planar_kernel.kernel`) and nothing is approximated:

    * ``forward``: full 2-D convolution of ``p`` with the kernel onto the
      extended grid of rows ``-rows .. 2 rows - 1``, then the rows and columns
      outside the grid are summed onto its edge;
    * ``backward``: ``u`` is extended by repeating its edge (what a report
      beyond the edge is worth) and correlated with the kernel.

    Both run through one precomputed real FFT of the kernel.
    """

    def __init__(self, *, epsilon: float, cell_size_m: float, rows: int, cols: int):
        self.rows, self.cols = rows, cols
        self.n_inputs = self.n_outputs = rows * cols
        self.kernel = planar_kernel(epsilon, cell_size_m, rows, cols)
        self._shape = (
            scipy.fft.next_fast_len(3 * rows, real=True),
            scipy.fft.next_fast_len(3 * cols, real=True),
        )
        self._kernel_fft = scipy.fft.rfft2(self.kernel, self._shape)

    def _convolve(self, image: np.ndarray) -> np.ndarray:
        spectrum = scipy.fft.rfft2(image, self._shape) * self._kernel_fft
        return scipy.fft.irfft2(spectrum, self._shape)

    def _preconditioner(self) -> LinearOperator:
        """Periodic deconvolution by the kernel: exact away from the grid's edges.

        Dividing by the kernel's spectrum inverts the convolution on the torus
        of the FFT; the remapping at the edges is what it misses, and GMRES
        corrects that in about a hundred products where the plain operator
        needs thousands (the channel's condition number grows with the grid).
        """
        rows, cols = self.rows, self.cols

        def deconvolve(q: np.ndarray) -> np.ndarray:
            image = scipy.fft.irfft2(
                scipy.fft.rfft2(q.reshape(rows, cols), self._shape) / self._kernel_fft, self._shape
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
        inverse = np.roll(
            scipy.fft.irfft2(1.0 / self._kernel_fft, self._shape), (rows, cols), (0, 1)
        )
        spectrum = scipy.fft.rfft2(q.reshape(rows, cols), self._shape) * scipy.fft.rfft2(
            inverse**2, self._shape
        )
        return scipy.fft.irfft2(spectrum, self._shape)[:rows, :cols].ravel()

    def forward(self, p: np.ndarray) -> np.ndarray:
        rows, cols = self.rows, self.cols
        full = self._convolve(p.reshape(rows, cols))
        # Extended row e sits at index e + rows: fold e < 0 onto row 0 and e >= rows onto
        # rows - 1, then the same for columns, in place on the fresh FFT output.
        band = full[rows : 2 * rows]
        band[0] += full[:rows].sum(axis=0)
        band[-1] += full[2 * rows : 3 * rows].sum(axis=0)
        band[:, cols] += band[:, :cols].sum(axis=1)
        band[:, 2 * cols - 1] += band[:, 2 * cols : 3 * cols].sum(axis=1)
        out = band[:, cols : 2 * cols].ravel()
        # FFT round-off can leave -1e-18 where a distribution's image is 0: clear it for
        # non-negative inputs only, so that signed vectors (GMRES, probes) stay linear.
        return np.maximum(out, 0.0, out=out) if np.all(p >= 0) else out

    def backward(self, u: np.ndarray) -> np.ndarray:
        rows, cols = self.rows, self.cols
        grid = u.reshape(rows, cols)
        # u extended by its edge values (np.pad(mode="edge"), without its overhead).
        extended = np.empty((3 * rows, 3 * cols))
        extended[rows : 2 * rows, cols : 2 * cols] = grid
        extended[:rows, cols : 2 * cols] = grid[0]
        extended[2 * rows :, cols : 2 * cols] = grid[-1]
        extended[:, :cols] = extended[:, cols : cols + 1]
        extended[:, 2 * cols :] = extended[:, 2 * cols - 1 : 2 * cols]
        # The kernel is symmetric, so correlation is convolution; the valid part starts at 2 rows.
        full = self._convolve(extended)
        return full[2 * rows : 3 * rows, 2 * cols : 3 * cols].ravel()

    def to_dense(self) -> np.ndarray:
        return self.dense_reference()

    def dense_reference(self) -> np.ndarray:
        """The matrix built cell by cell from the kernel, without FFTs (tests only)."""
        rows, cols = self.rows, self.cols
        matrix = np.zeros((rows * cols, rows * cols))
        di = np.arange(-rows, rows + 1)
        dj = np.arange(-cols, cols + 1)
        for x in range(rows * cols):
            r, c = divmod(x, cols)
            out_r = np.clip(r + di, 0, rows - 1)
            out_c = np.clip(c + dj, 0, cols - 1)
            target = out_r[:, None] * cols + out_c[None, :]
            np.add.at(matrix[x], target.ravel(), self.kernel.ravel())
        return matrix


def channel_for(mechanism: Mechanism) -> Channel:
    """The channel operator of a mechanism, with the probabilities its sampler realises."""
    if isinstance(mechanism, PlanarLaplace):
        grid = mechanism.grid
        return PlanarLaplaceChannel(
            epsilon=mechanism.epsilon, cell_size_m=grid.cell_size_m, rows=grid.rows, cols=grid.cols
        )
    if isinstance(mechanism, KRR):
        return KRRChannel(mechanism.k, mechanism.p_keep, mechanism.p_other)
    raise TypeError(f"no channel for {type(mechanism).__name__}")
