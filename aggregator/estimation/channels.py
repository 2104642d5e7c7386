"""Channels as operators.

A channel ``C`` has ``C[x, y] = P(report y | true x)``: rows are true values,
columns are reports, and every row sums to 1. Estimators never see ``C``
itself, only these two products:

* ``forward(p) = p C``: the report distribution that a true distribution
  ``p`` produces (length ``n_outputs``);
* ``backward(u) = C u``: for each true value, the expectation of ``u`` over
  its reports (length ``n_inputs``).

:class:`DenseChannel` is the plain reference; :class:`KRRChannel` applies
k-RR's ``(p - q) I + q 11^T`` in O(k); :class:`GridKernelChannel` applies a
clamped translation-invariant grid channel (planar Laplace, the Euclidean
exponential mechanism) as an FFT convolution plus the exact fold of the
remapping, never forming the ``g^2 x g^2`` matrix; the geometric mechanism's
channel and the Manhattan exponential mechanism's
(:mod:`aggregator.estimation.ordinal`) run recursive filters in O(m) and
O(cells).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import scipy.fft
import scipy.linalg
from scipy.sparse.linalg import LinearOperator, gmres

from aggregator.estimation import budget, krr_steps

# Channels up to this many inputs are inverted through a dense LU factorisation.
DENSE_SOLVE_LIMIT = 2500
GMRES_RTOL = 1e-12
GMRES_RESTART = 100
GMRES_RESTARTS = 20
# A solution whose true relative residual is below this counts as converged.
GMRES_ACCEPT = 1e-9


def log_likelihood(counts: np.ndarray, predicted: np.ndarray) -> float:
    """Multinomial log-likelihood ``sum_y counts_y log predicted_y`` (without the constant)."""
    seen = counts > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(counts[seen] * np.log(predicted[seen])))


def report_counts(counts, channel: Channel) -> np.ndarray:
    """``counts`` as floats, one per output of ``channel``: finite, non-negative, not all zero
    (ValueError otherwise)."""
    counts = np.asarray(counts, dtype=float)
    if counts.shape != (channel.n_outputs,):
        raise ValueError(f"expected {channel.n_outputs} counts, got shape {counts.shape}")
    if np.any(counts < 0) or not np.all(np.isfinite(counts)) or counts.sum() <= 0:
        raise ValueError("counts must be finite, non-negative and not all zero")
    return counts


class SingularChannelError(ValueError):
    """The channel cannot be inverted (e.g. k-RR whose weights are equal)."""


class Channel(ABC):
    """The operator interface every estimator works with."""

    # Intervals around the unbiased estimate, whatever the method (the large-domain oracles).
    intervals_around_unbiased: ClassVar[bool] = False
    # IBU over-relaxed after this many plain EM steps: each later step multiplies ``p`` by its
    # EM factor to the power 1.75 (docs/estimation.md); None: plain EM steps throughout.
    ibu_relax_after: ClassVar[int | None] = None
    # ``forward`` and ``backward`` act on each row of a matrix of distributions (or of report
    # ratios), so IBU runs on many sets of counts at once (ibu.IBUSteps).
    products_by_row: ClassVar[bool] = False
    n_inputs: int
    n_outputs: int

    @property
    def steps_run_in_parallel(self) -> bool:
        """Whether IBU runs on this channel gain from threads side by side (cross-validation
        folds, bootstrap refits): their steps must release Python's lock for most of their
        time. Whole-array numpy steps on small arrays hold it enough that two threads were
        slower than one."""
        return False

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
        reaching ``GMRES_RTOL``; the best iterate is returned. Each of its products is
        charged to the estimate's budget (``n_inputs`` units), so that a time limit stops
        a solve within one product (one solve over 256 x 256 cells took 39 s).
        """
        if self.n_inputs <= DENSE_SOLVE_LIMIT:
            return scipy.linalg.lu_solve(self._lu(), q, trans=1), True

        def product(p: np.ndarray) -> np.ndarray:
            budget.charge(self.n_inputs)
            return self.forward(p)

        operator = LinearOperator(
            (self.n_outputs, self.n_inputs), matvec=product, rmatvec=self.backward
        )
        solution, info = gmres(
            operator,
            q,
            rtol=GMRES_RTOL,
            atol=0.0,
            restart=GMRES_RESTART,
            maxiter=GMRES_RESTARTS,
            M=self.preconditioner(),
        )
        if info < 0:
            raise SingularChannelError("GMRES broke down: the channel is singular")
        # A preconditioned GMRES measures its own residual; judge by the true one.
        residual = np.linalg.norm(self.forward(solution) - q)
        return solution, bool(residual <= GMRES_ACCEPT * np.linalg.norm(q))

    def solve_counts(self, counts: np.ndarray) -> tuple[np.ndarray, bool]:
        """``solve_with_info`` on the report frequencies; a channel whose estimate also
        depends on the number of reports (OLH's pool correction) overrides it."""
        counts = np.asarray(counts, dtype=float)
        return self.solve_with_info(counts / counts.sum())

    def inversion_second_moment(self, q: np.ndarray) -> np.ndarray | None:
        """``sum_y (C^-1)[y, x]^2 q_y`` per input ``x`` where the structure gives it exactly
        and cheaply (the variance of the unbiased inversion), else ``None``."""
        return None

    def preconditioner(self) -> LinearOperator | None:
        """An approximate inverse of ``p -> p C`` (for GMRES), if the structure offers one."""
        return None

    def ibu_steps(self, counts: np.ndarray):
        """IBU's steps on ``counts`` run by code specialised to this channel, or ``None``.

        The result behaves like :class:`ibu.IBUSteps`, which runs them
        through ``forward`` and ``backward`` where this is ``None``.
        """
        return None

    def inverse_transpose(self) -> np.ndarray:
        """``C^-T`` as a dense matrix, through the LU factorisation (small channels only)."""
        return scipy.linalg.lu_solve(self._lu(), np.eye(self.n_outputs), trans=1)

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


class KRRIBUSteps:
    """IBU's steps on k-RR run by compiled loops (see :class:`ibu.IBUSteps`).

    ``counts`` is one set of counts, or several as the rows of a matrix
    (independent runs, e.g. cross-validation folds); ``p`` and ``predicted``
    then have one row per run, and ``advance`` steps them all.
    """

    def __init__(self, channel: KRRChannel, counts: np.ndarray, loops):
        self._loops = loops
        self._keep_excess = channel.p_keep - channel.p_other
        self._other = channel.p_other
        counts = np.asarray(counts, dtype=float)
        self._single = counts.ndim == 1
        self._counts = np.ascontiguousarray(np.atleast_2d(counts))
        self._p = np.full(self._counts.shape, 1.0 / channel.n_inputs)

    @property
    def p(self) -> np.ndarray:
        return self._p[0] if self._single else self._p

    @property
    def predicted(self) -> np.ndarray:
        predicted = self._keep_excess * self._p + self._other  # each row of p sums to 1
        return predicted[0] if self._single else predicted

    def advance(self, steps: int, tol: float) -> tuple[int, float]:
        taken, change = self._loops.ibu_advance(
            self._counts, self._p, self._keep_excess, self._other, steps, tol
        )
        return int(taken), float(change)


def _krr_loops():
    """The compiled k-RR loops with the ``fast`` extra (numba), else the numpy steps."""
    try:
        from aggregator.estimation import krr_loops
    except ImportError:
        return krr_steps
    return krr_loops


class KRRChannel(Channel):
    """k-RR: ``C = (p_keep - p_other) I + p_other 11^T``, applied in O(k)."""

    def __init__(self, k: int, p_keep: float, p_other: float):
        self.n_inputs = self.n_outputs = k
        self.p_keep = p_keep
        self.p_other = p_other

    def forward(self, p: np.ndarray) -> np.ndarray:
        return (self.p_keep - self.p_other) * p + self.p_other * p.sum()

    def backward(self, u: np.ndarray) -> np.ndarray:
        return self.forward(u)  # the matrix is symmetric

    def solve_with_info(self, q: np.ndarray) -> tuple[np.ndarray, bool]:
        """The ``p`` with ``p C = q``, in closed form."""
        if self.p_keep <= self.p_other:
            raise SingularChannelError("k-RR with epsilon this small cannot be inverted")
        return (q - self.p_other * q.sum()) / (self.p_keep - self.p_other), True

    def maximum_likelihood(self, counts: np.ndarray) -> np.ndarray:
        """The shares under which ``counts`` are most likely (where IBU converges), in closed
        form, O(k log k).

        A category's report share is ``q_x = p_other + (p_keep - p_other) p_x``, so the shares
        maximise ``sum c_x log q_x`` over the ``q`` summing to 1 with every ``q_x >= p_other``.
        By the Karush-Kuhn-Tucker conditions ``q_x = max(p_other, c_x / lam)``: the categories
        above the floor are the ``j`` largest counts, and ``lam`` is their sum over what the
        floor leaves, ``1 - (k - j) p_other``; ``j`` is the one for which the ``j``-th largest
        count is above ``p_other lam`` and the next is not.
        """
        counts = np.asarray(counts, dtype=float)
        k, floor = counts.size, self.p_other
        shares = counts / counts.sum()
        ordered = np.sort(shares)[::-1]
        above = np.arange(1, k + 1)
        lam = np.cumsum(ordered) / (1.0 - (k - above) * floor)
        following = np.append(ordered[1:], 0.0)
        # The first j where the next count falls to the floor (j = k always qualifies).
        j = int(np.argmax((following <= floor * lam) | (above == k)))
        q = np.maximum(floor, shares / lam[j])
        p = (q - floor) / (self.p_keep - floor)
        return p / p.sum()

    def draw_reports(self, users: np.ndarray, generator: np.random.Generator) -> np.ndarray:
        """Report counts of ``users[x]`` users of each category ``x``, drawn through the
        mechanism (for the advisor's simulations), in O(k) whatever the number of users: k-RR is
        the mixture that reports the true category with probability ``p_keep - p_other`` and
        otherwise one of all ``k`` uniformly (the true one included), which gives each user's
        report the channel's law; so the kept users are binomial per category and the others
        one multinomial over the ``k`` categories."""
        users = np.asarray(users, dtype=np.int64)
        kept = generator.binomial(users, self.p_keep - self.p_other)
        others = int(users.sum() - kept.sum())
        spread = generator.multinomial(others, np.full(self.n_inputs, 1.0 / self.n_inputs))
        return (kept + spread).astype(float)

    def ibu_steps(self, counts: np.ndarray) -> KRRIBUSteps:
        """IBU steps on every row of ``counts`` at once: compiled loops (three passes over
        ``k`` values each) with the ``fast`` extra (numba), else whole-array numpy steps."""
        return KRRIBUSteps(self, counts, _krr_loops())
