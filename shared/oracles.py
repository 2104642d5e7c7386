r"""Frequency oracles for large domains: optimized local hashing (OLH) and unary encoding (OUE).

Wang, Blocki, Li and Jha, "Locally differentially private protocols for
frequency estimation", USENIX Security 2017. Both have per-value variance
:math:`4 e^\varepsilon / ((e^\varepsilon - 1)^2 n)` whatever the domain size
``k``, where k-ary randomized response's grows with ``k``
(:math:`(e^\varepsilon + k - 2) / ((e^\varepsilon - 1)^2 n)`), so they win from
about ``k = 3 e^epsilon + 2`` on.

* :class:`OLH` hashes the value into ``g`` buckets with a hash function drawn
  from a fixed pool of ``S`` and reports the bucket through randomized response
  over the ``g`` buckets. A report is one integer ``y = seed * g + bucket``.
* :class:`OUE` sends a ``k``-bit vector: the true value's bit is 1 with
  probability 1/2, every other bit is 1 with probability
  :math:`1 / (e^\varepsilon + 1)`. A report is ``k`` bits, so the service does
  not collect it (docs/mechanisms.md); it is here for simulation and comparison.

Both draw on the device only uniform integers from the CSPRNG
(:mod:`shared.rng`), with integer weights as k-RR's
(:func:`shared.exactness.krr_weights`), so ``keep / unit <= e^epsilon`` holds
exactly. Standard library only.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from shared.domain import Domain, OverDomain
from shared.errors import ReportError
from shared.geo import Grid
from shared.mechanisms import IntegerWeights, Mechanism, cell_domain
from shared.rng import RandomSource, default_rng, randbelow
from shared.schema import positive_finite
from shared.spec import OLH_NAME, OUE_NAME

# The pool of hash functions a device draws from. Its finite size adds an error that does not
# shrink with n (the pool's collisions, see OLH); 1024 keeps it small for all but very
# concentrated distributions (docs/mechanisms.md, scripts/bench_oracles.py).
DEFAULT_POOL_SIZE = 1024
MAX_POOL_SIZE = 1 << 16
# Buckets are capped: beyond this, e^epsilon is so large that the last few percent of
# variance are not worth the server's S x g counts.
MAX_HASH_RANGE = 4096
# Values are hashed as 32-bit words.
MAX_HASHED_VALUES = 1 << 32
_MASK64 = (1 << 64) - 1
_SEED_TAG = b"ldp-collect olh hash v1"


def hash_range(epsilon: float) -> int:
    """``g = round(e^epsilon) + 1`` buckets (at least 2, at most :data:`MAX_HASH_RANGE`).

    Wang et al. (2017) show ``g = e^epsilon + 1`` minimises the variance; it has to
    be an integer, and the variance is flat around its minimum.
    """
    if epsilon >= math.log(MAX_HASH_RANGE):
        return MAX_HASH_RANGE
    return max(2, min(MAX_HASH_RANGE, round(math.exp(epsilon)) + 1))


def hash_parameters(seed: int) -> tuple[int, int]:
    """The multiplier and offset ``(a, b)`` (64-bit words) of pool member ``seed``.

    Derived from SHA-256 of a fixed tag and the seed index, so the device and the
    server compute the same pool without storing it.
    """
    digest = hashlib.sha256(_SEED_TAG + seed.to_bytes(4, "big")).digest()
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:16], "big")


def hash_value(a: int, b: int, x: int, g: int) -> int:
    """Bucket of value ``x`` (< 2**32) under ``(a, b)``: multiply-add-shift, then range reduction.

    ``h = ((a x + b) mod 2**64) >> 32`` is Dietzfelbinger's multiply-add-shift
    ("Universal hashing and k-wise independent random variables via integer
    arithmetic without primes", STACS 1996), 2-independent on 32-bit inputs up to
    a factor 2 (any two values collide with probability at most 2 / 2**32
    before reduction); ``(h g) >> 32`` maps it to ``[0, g)`` with bucket
    probabilities within ``g / 2**32`` of ``1 / g``. Numpy computes the same in
    uint64 arithmetic (wrapping multiply) over all values at once.
    """
    return ((((a * x + b) & _MASK64) >> 32) * g) >> 32


class OLH(IntegerWeights, OverDomain, Mechanism):
    r"""Optimized local hashing (Wang et al., USENIX Security 2017), with a bounded hash pool.

    The device draws a seed ``s`` uniformly from ``0 .. S - 1``, hashes its
    value ``x`` to ``v = H_s(x)`` in ``[0, g)`` (:func:`hash_value`,
    :func:`hash_parameters`) and reports ``v`` with probability
    :math:`p = e^\varepsilon / (e^\varepsilon + g - 1)`, each other bucket with
    :math:`q = 1 / (e^\varepsilon + g - 1)` (k-RR over the ``g`` buckets; the
    seed itself is public). The wire value is one integer ``y = s g + v`` in
    ``[0, S g)``.

    Channel: :math:`C[x, (s, v)] = (q + (p - q)[H_s(x) = v]) / S`. For any two
    values and any report the ratio is at most ``p / q <= e^epsilon``.

    The server's estimate is :math:`\hat f_x = (c_x / n - 1/g) / (p - 1/g)` with
    ``c_x`` the number of reports whose bucket is ``H_s(x)`` for their seed (the
    support count). Over the draw of the hash functions it is unbiased with
    variance :math:`(\pi_x (1 - \pi_x)) / (n (p - 1/g)^2)`, :math:`\pi_x = 1/g +
    f_x (p - 1/g)`, which at ``g = e^epsilon + 1`` is
    :math:`4 e^\varepsilon / ((e^\varepsilon - 1)^2 n)` for small ``f_x``. A fixed
    pool of ``S`` functions adds, for value ``x``, an error from how often other
    values share its bucket across the pool: variance about
    :math:`\sum_{x' \ne x} f_{x'}^2 (1/g)(1 - 1/g) / S \cdot ((p - q)/(p - 1/g))^2`,
    independent of ``n``.

    Parameters
    ----------
    epsilon : float
        Finite and > 0, within the limits of :func:`shared.exactness.krr_weights`.
    domain : sequence of str, optional
        The labels; or
    domain_size : int, optional
        ``K``: the values are the integers ``0 .. K - 1`` (K < 2**32); or
    grid : shared.geo.Grid, optional
        A region's grid: the values are its cells, labelled ``r{row}c{col}``, and a
        true value is a location ``{"lat", "lon"}``, snapped to its cell on the
        device before the cell's index is hashed.
    pool_size : int
        ``S``, the number of hash functions devices draw from (1 to 65536).
    """

    name = OLH_NAME

    def __init__(
        self,
        *,
        epsilon: float,
        domain: Sequence[str] | None = None,
        domain_size: int | None = None,
        grid: Grid | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
    ):
        self.epsilon = positive_finite(epsilon, "epsilon")
        self.grid = grid
        self.values = Domain(labels=cell_domain(domain, grid), size=domain_size)
        if self.values.size > MAX_HASHED_VALUES:
            raise ValueError(f"OLH hashes at most 2**32 values, got {self.values.size}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int):
            raise TypeError(f"pool_size must be an integer, got {type(pool_size).__name__}")
        if not 1 <= pool_size <= MAX_POOL_SIZE:
            raise ValueError(f"pool_size must be in [1, {MAX_POOL_SIZE}], got {pool_size}")
        self.pool_size = pool_size
        self.g = hash_range(self.epsilon)
        self._set_weights(self.g)

    @property
    def n_outputs(self) -> int:
        return self.pool_size * self.g

    @cached_property
    def pool(self) -> tuple[tuple[int, int], ...]:
        """``(a, b)`` of every seed of the pool."""
        return tuple(hash_parameters(s) for s in range(self.pool_size))

    def bucket(self, seed: int, x: int) -> int:
        """``H_seed(x)``."""
        a, b = hash_parameters(seed)
        return hash_value(a, b, x, self.g)

    def perturb_index(self, x: int, rng: RandomSource) -> int:
        seed = randbelow(rng, self.pool_size)
        return seed * self.g + self._pick(self.bucket(seed, x), rng)

    def report_value(self, y: int) -> int:
        return y

    def parse_report_value(self, raw: Any, field: str = "value") -> int:
        if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw < self.n_outputs:
            raise ReportError(
                f"{field} must be an integer in [0, {self.n_outputs}) (seed * {self.g} + bucket)",
                field=field,
            )
        return raw


class OUE(IntegerWeights, OverDomain):
    r"""Optimized unary encoding (Wang et al., USENIX Security 2017).

    The value ``x`` becomes the one-hot vector of ``k`` bits; the device sends
    bit ``x`` as 1 with probability :math:`p = 1/2` and every other bit as 1 with
    probability :math:`q = 1 / (e^\varepsilon + 1)`, independently. For two
    values the report's probabilities differ on two bits only, by factors
    :math:`p (1 - q) / ((1 - p) q) = e^\varepsilon` at most: ``epsilon``-LDP.
    The estimate from the number ``c_x`` of reports with bit ``x`` set is
    :math:`\hat f_x = (c_x / n - q) / (p - q)`, unbiased with variance
    :math:`(\pi_x (1 - \pi_x)) / (n (p - q)^2)`, :math:`\pi_x = q + f_x (p - q)`,
    i.e. :math:`4 e^\varepsilon / ((e^\varepsilon - 1)^2 n)` for small ``f_x``.

    A report is ``k`` bits, so it is not a mechanism of the collection service
    (one output per report); :meth:`perturb` gives the positions of the 1 bits.

    Parameters
    ----------
    epsilon : float
        Finite and > 0, within the limits of :func:`shared.exactness.krr_weights`.
    domain : sequence of str, optional
        The labels; or
    domain_size : int, optional
        ``K``: the values are the integers ``0 .. K - 1``.
    """

    name = OUE_NAME

    def __init__(
        self,
        *,
        epsilon: float,
        domain: Sequence[str] | None = None,
        domain_size: int | None = None,
    ):
        self.epsilon = positive_finite(epsilon, "epsilon")
        self.values = Domain(labels=domain, size=domain_size)
        # A 0 bit is sent as 1 with weight unit out of keep + unit.
        self._set_weights(2)

    @property
    def p(self) -> float:
        """P(the true value's bit is 1)."""
        return 0.5

    @property
    def q(self) -> float:
        """P(another value's bit is 1), as the integer weights realise it."""
        return self.p_other

    def perturb_bits(self, x: int, rng: RandomSource) -> list[int]:
        """The sorted positions of the report's 1 bits for input ``x``."""
        ones = []
        for position in range(self.k):
            if position == x:
                flip = rng.getrandbits(1) == 1
            else:
                flip = randbelow(rng, self.total_weight) < self.unit_weight
            if flip:
                ones.append(position)
        return ones

    def perturb(self, value: Any, rng: RandomSource | None = None) -> list[int]:
        """One user's report: the positions of its 1 bits."""
        x = self.encode(value)
        return self.perturb_bits(x, rng if rng is not None else default_rng())
