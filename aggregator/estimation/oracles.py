"""Channels of frequency oracles for large domains, as operators over fast transforms.

Hadamard response on ``k`` labels with ``K`` outputs (a power of two above
``k``): with ``a`` and ``b`` the probabilities of an output inside and outside
the true label's half, ``C[x, y] = (a + b) / 2 + (a - b) / 2 H[x + 1, y]`` for
the Sylvester Hadamard matrix ``H`` (symmetric, ``H H = K I``). So

    forward(p) = (a + b) / 2 sum(p) + (a - b) / 2 H p~        (p~: p moved to rows 1..k)
    backward(u)_x = (a + b) / 2 sum(u) + (a - b) / 2 (H u)_(x+1)

and the inverse of report frequencies ``q`` is ``p_x = 2 (H q)_(x+1) / ((a - b) K)``:
one fast Walsh-Hadamard transform, O(K log K), never the ``k x K`` matrix.

Optimized local hashing (:class:`OLHChannel`) hashes every value under each of
the pool's ``S`` hash functions in each product, O(S k), compiled with the
``fast`` extra (:mod:`aggregator.estimation.oracle_loops`). Optimized unary
encoding is not collected by the service; :func:`oue_estimate` estimates from
its per-bit counts in O(k) (simulation, comparisons).
"""

from __future__ import annotations

import numpy as np

from aggregator.estimation.channels import Channel, SingularChannelError
from aggregator.estimation.inversion import project_to_simplex
from shared.mechanisms import HadamardResponse
from shared.oracles import OLH, OUE


def walsh_hadamard(values: np.ndarray) -> np.ndarray:
    """``H v`` for the Sylvester Hadamard matrix of the last axis's size (a power of two)."""
    out = np.array(values, dtype=float)
    size = out.shape[-1]
    if size & (size - 1):
        raise ValueError(f"the transform's length must be a power of two, got {size}")
    lead = out.shape[:-1]
    half = 1
    while half < size:
        blocks = out.reshape(*lead, size // (2 * half), 2, half)
        top, bottom = blocks[..., 0, :].copy(), blocks[..., 1, :]
        blocks[..., 0, :] += bottom
        blocks[..., 1, :] = top - bottom
        half *= 2
    return out


class HadamardChannel(Channel):
    """Hadamard response's channel: ``k`` inputs, ``K`` outputs."""

    # See OLHChannel: analytic intervals around the unbiased estimate for every method.
    intervals_around_unbiased = True
    # The transform acts along the last axis: IBU's folds run side by side.
    products_by_row = True

    def __init__(self, mechanism: HadamardResponse):
        self.n_inputs, self.n_outputs = mechanism.k, mechanism.size
        size = mechanism.size
        self.inside = 2 * mechanism.p_in / size
        self.outside = 2 * (1 - mechanism.p_in) / size
        # forward is mean * sum(p) + spread * (the Walsh-Hadamard transform of p, padded).
        self.mean = (self.inside + self.outside) / 2
        self.spread = (self.inside - self.outside) / 2

    def _padded(self, p: np.ndarray) -> np.ndarray:
        padded = np.zeros((*p.shape[:-1], self.n_outputs))
        padded[..., 1 : self.n_inputs + 1] = p
        return padded

    def forward(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        return self.mean * p.sum(axis=-1, keepdims=True) + self.spread * walsh_hadamard(
            self._padded(p)
        )

    def backward(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        transformed = walsh_hadamard(u)[..., 1 : self.n_inputs + 1]
        return self.mean * u.sum(axis=-1, keepdims=True) + self.spread * transformed

    def solve_with_info(self, q: np.ndarray) -> tuple[np.ndarray, bool]:
        """The unbiased inverse: the ``p`` whose forward is ``q`` wherever ``q`` has one."""
        if self.spread <= 0:
            raise SingularChannelError(
                "Hadamard response with epsilon this small is not invertible"
            )
        transformed = walsh_hadamard(np.asarray(q, dtype=float))[..., 1 : self.n_inputs + 1]
        return transformed / (self.spread * self.n_outputs), True

    def inversion_second_moment(self, q: np.ndarray) -> np.ndarray:
        """Every entry of the inverse is ``+-1 / (spread K)``: ``sum(q) / (spread K)^2``."""
        return np.full(self.n_inputs, np.sum(q) / (self.spread * self.n_outputs) ** 2)


def _olh_loops():
    """The compiled OLH loops with the ``fast`` extra (numba), else ``None`` (numpy)."""
    try:
        from aggregator.estimation import oracle_loops
    except ImportError:
        return None
    return oracle_loops


def olh_buckets(
    multiplier: int | np.ndarray,
    offset: int | np.ndarray,
    values: np.ndarray,
    g: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``H(x)`` for an array of values, in uint64 arithmetic (see :func:`shared.oracles.hash_value`);
    ``multiplier`` and ``offset`` may be arrays of seeds' parameters, broadcast against ``values``."""
    work = np.multiply(values, np.uint64(multiplier), out=out)
    work += np.uint64(offset)
    work >>= np.uint64(32)
    work *= np.uint64(g)
    work >>= np.uint64(32)
    return work


# The thresholds of the rounds that peel heavy values off OLH's estimate (see
# OLHChannel.solve_with_info); the last round uses sqrt(2 ln k) standard deviations.
POOL_PEEL_THRESHOLDS = (0.1, 0.03, 0.01, 0.0)


class OLHChannel(Channel):
    r"""OLH's channel: ``k`` inputs, ``S g`` outputs ``y = s g + v``, applied in O(S k).

    ``C[x, (s, v)] = (q + (p - q) [H_s(x) = v]) / S``. So

        forward(f)[s, v] = (q sum(f) + (p - q) sum_{x: H_s(x) = v} f_x) / S
        backward(u)_x = (q sum(u) + (p - q) sum_s u[s, H_s(x)]) / S

    Each hashes every value under every seed; nothing of size ``S k`` is stored.

    :meth:`solve_with_info` is the support-count estimator
    ``f_x = (pi_x - 1/g) / (p - 1/g)`` with ``pi_x = sum_s q[s, H_s(x)]``: unbiased
    over the draw of the pool, not an exact inverse of this pool's channel (which
    has more outputs than inputs). :meth:`inversion_second_moment` gives its
    multinomial variance in closed form.
    """

    # Intervals around any estimate of this channel come from the unbiased estimate's
    # analytic interval (a bootstrap would rerun S k work per replicate).
    intervals_around_unbiased = True

    def __init__(self, mechanism: OLH):
        self.n_inputs = mechanism.k
        self.g = mechanism.g
        self.pool_size = mechanism.pool_size
        self.n_outputs = self.pool_size * self.g
        self.p_keep = mechanism.p_keep
        self.p_other = mechanism.p_other
        pool = np.array(mechanism.pool, dtype=np.uint64).reshape(self.pool_size, 2)
        self.multipliers = np.ascontiguousarray(pool[:, 0])
        self.offsets = np.ascontiguousarray(pool[:, 1])
        self._values = np.arange(self.n_inputs, dtype=np.uint64)
        self._loops = _olh_loops()
        self._last_support: tuple[np.ndarray, np.ndarray] | None = None

    def buckets(self, seed: int) -> np.ndarray:
        """``H_seed(x)`` for every value, as indices."""
        hashed = olh_buckets(
            int(self.multipliers[seed]), int(self.offsets[seed]), self._values, self.g
        )
        return hashed.astype(np.intp)

    def gather(self, u: np.ndarray) -> np.ndarray:
        """``sum_s u[s, H_s(x)]`` for every value ``x`` (``u`` of length ``S g``)."""
        table = np.ascontiguousarray(np.asarray(u, dtype=float).reshape(self.pool_size, self.g))
        if self._loops is not None:
            return self._loops.gather(table, self.multipliers, self.offsets, self.g, self.n_inputs)
        out = np.zeros(self.n_inputs)
        scratch = np.empty(self.n_inputs, dtype=np.uint64)
        for s in range(self.pool_size):
            hashed = olh_buckets(
                int(self.multipliers[s]), int(self.offsets[s]), self._values, self.g, scratch
            )
            out += table[s].take(hashed.astype(np.intp))
        return out

    def scatter(self, f: np.ndarray) -> np.ndarray:
        """``sum_{x: H_s(x) = v} f_x`` as an ``S x g`` table."""
        f = np.ascontiguousarray(f, dtype=float)
        if self._loops is not None:
            return self._loops.scatter(f, self.multipliers, self.offsets, self.g)
        out = np.empty((self.pool_size, self.g))
        for s in range(self.pool_size):
            out[s] = np.bincount(self.buckets(s), weights=f, minlength=self.g)
        return out

    def forward(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=float)
        spread = self.p_keep - self.p_other
        table = self.p_other * p.sum() + spread * self.scatter(p)
        return table.ravel() / self.pool_size

    def backward(self, u: np.ndarray) -> np.ndarray:
        u = np.asarray(u, dtype=float)
        spread = self.p_keep - self.p_other
        return (self.p_other * u.sum() + spread * self.gather(u)) / self.pool_size

    def _excess(self) -> float:
        excess = self.p_keep - 1.0 / self.g
        if excess <= 0:
            raise SingularChannelError("OLH with epsilon this small cannot be inverted")
        return excess

    def support(self, q: np.ndarray) -> np.ndarray:
        """``pi_x = sum_s q[s, H_s(x)]``, remembered for the last ``q`` (an estimate and its
        intervals need it several times)."""
        q = np.asarray(q, dtype=float)
        last = self._last_support
        if last is not None and np.array_equal(last[0], q):
            return last[1]
        support = self.gather(q)
        self._last_support = (q.copy(), support)
        return support

    def support_estimate(self, q: np.ndarray) -> np.ndarray:
        """The textbook estimate ``(pi_x - 1/g) / (p - 1/g)``: unbiased over the draw of the pool."""
        return (self.support(q) - 1.0 / self.g) / self._excess()

    def pool_bias(self, f: np.ndarray) -> np.ndarray:
        """The bias of :meth:`support_estimate` that this pool's collisions give a truth ``f``.

        ``E[pi_x] = q + (p - q) (G f)_x`` with ``G f = gather(scatter(f)) / S`` (how
        often each value shares a bucket with the others across the pool), where a fresh
        pool would give ``(1 - 1/g) f + sum(f) / g``; the difference, scaled by
        ``g / (g - 1)``, is the bias. ``f`` is meant to be sparse (the heavy values):
        its buckets are found per non-zero entry, and one gather runs over all values.
        """
        table = np.zeros((self.pool_size, self.g))
        heavy = np.flatnonzero(f)
        hashed = olh_buckets(
            self.multipliers[:, None], self.offsets[:, None], heavy.astype(np.uint64), self.g
        ).astype(np.intp)
        np.add.at(table, (np.arange(self.pool_size)[:, None], hashed), f[heavy])
        shared = self.gather(table) / self.pool_size
        return (shared - (1 - 1 / self.g) * f - f.sum() / self.g) * self.g / (self.g - 1)

    def solve_with_info(self, q: np.ndarray) -> tuple[np.ndarray, bool]:
        """The linear support estimate (see :meth:`solve_counts` for the one served)."""
        return self.support_estimate(q), True

    def solve_counts(self, counts: np.ndarray) -> tuple[np.ndarray, bool]:
        """The support estimate with the pool's collision bias from the heavy values removed.

        With a fixed pool, value ``x`` shares its bucket with a heavy value ``h`` in
        a fraction of the seeds that differs from ``1/g`` by about
        ``sqrt((1/g)(1 - 1/g) / S)``, so ``f_h`` times that leaks into ``x``'s
        estimate whatever ``n`` (at ``S = 1024``, ``g = 4`` and a value holding
        60% of the users: a standard deviation of about 0.01 on every other
        value). The correction peels the heavy values off in a few rounds: the
        values whose current estimate exceeds a threshold (0.1, 0.03, 0.01, then
        none) and ``sqrt(2 ln k)`` times the standard deviation of an estimate
        (sampling, plus the pool's leak from the values not yet peeled, as the
        projection of the current estimate onto the simplex gives them) are taken as known, and their :meth:`pool_bias` is subtracted
        from the support estimate. At most ``S g / 16`` values are peeled, so
        that a pool too small for its domain is not corrected with noise. Each
        round is one pass over ``S k`` hashes; without heavy values nothing
        changes.
        """
        counts = np.asarray(counts, dtype=float)
        n = counts.sum()
        q = counts / n
        plain = self.support_estimate(q)
        # The largest sampling variance of an entry, from the closed form at the estimate.
        sampling = float(np.maximum(self.inversion_second_moment(q) - plain**2, 0.0).max() / n)
        z2 = 2 * np.log(self.n_inputs)
        g = self.g
        leak = (1 / g) * (1 - 1 / g) / self.pool_size * (g / (g - 1)) ** 2
        cap = max(1, self.n_outputs // 16)
        peeled = np.zeros(self.n_inputs, dtype=bool)
        current = plain
        for threshold in POOL_PEEL_THRESHOLDS:
            # The mass that still leaks: the values not yet peeled, as the projection onto the
            # simplex sees them (it zeroes the values lost in the noise).
            remaining = np.where(peeled, 0.0, project_to_simplex(current))
            floor = float(np.sqrt(z2 * (sampling + leak * np.sum(remaining**2))))
            chosen = (current > max(threshold, floor)) & ~peeled
            if chosen.sum() + peeled.sum() > cap:
                order = np.flatnonzero(chosen)[np.argsort(-current[chosen], kind="stable")]
                chosen[order[max(0, cap - int(peeled.sum())) :]] = False
            if chosen.any():
                peeled |= chosen
                current = plain - self.pool_bias(np.where(peeled, current, 0.0))
            if threshold <= floor or peeled.sum() >= cap:
                break
        return current, True

    def inversion_second_moment(self, q: np.ndarray) -> np.ndarray:
        """``sum_y L[x, y]^2 q_y`` of the support estimator ``L``, from the support shares."""
        support = self.support(q)
        inside, outside = 1.0 - 1.0 / self.g, 1.0 / self.g
        return (inside**2 * support + outside**2 * (1.0 - support)) / self._excess() ** 2


def oue_estimate(mechanism: OUE, ones: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """OUE's unbiased estimate from ``ones[x]``, the reports with bit ``x`` set, out of ``n``.

    Returns ``(frequencies, variance)``: ``(c_x / n - q) / (p - q)`` and its
    multinomial variance ``pi_x (1 - pi_x) / (n (p - q)^2)`` with the observed
    share ``pi_x = c_x / n``. O(k).
    """
    share = np.asarray(ones, dtype=float) / n
    spread = mechanism.p - mechanism.q
    estimate = (share - mechanism.q) / spread
    variance = share * (1.0 - share) / (n * spread**2)
    return estimate, variance
