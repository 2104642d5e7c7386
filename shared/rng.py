"""The one randomness interface of the reporting path.

Mechanisms draw randomness only through ``rng.getrandbits(k)``, the one
method that :class:`secrets.SystemRandom` (the operating system's CSPRNG, the
default) and ``random.Random(seed)`` (for tests) both offer publicly; the
helpers below turn those bits into exact uniform integers, full-resolution
uniform doubles, exponentials and angles. Nothing here keeps module-level
state.
"""

from __future__ import annotations

import math
import secrets
from fractions import Fraction
from typing import Protocol

_MANTISSA_BITS = 52
_WORD_BITS = 64
# Uniforms below 2**-1074 would underflow a double; stop scanning there.
_MAX_EXPONENT = 1074


class RandomSource(Protocol):
    def getrandbits(self, k: int) -> int: ...


def default_rng() -> RandomSource:
    """A fresh handle on the operating system's CSPRNG."""
    return secrets.SystemRandom()


def randbelow(rng: RandomSource, n: int) -> int:
    """A uniform integer in ``[0, n)``, exactly, by rejection on ``n.bit_length()`` bits.

    Each try succeeds with probability above 1/2; the number of tries depends
    only on the random bits, never on what the caller will do with the result.
    """
    if n <= 0:
        raise ValueError(f"randbelow needs n > 0, got {n}")
    bits = n.bit_length()
    draw = rng.getrandbits(bits)
    while draw >= n:
        draw = rng.getrandbits(bits)
    return draw


def open_unit_uniform(rng: RandomSource) -> float:
    """A uniform double in (0, 1) at full floating-point resolution.

    The exponent is drawn by counting leading zero bits of a random bit
    stream (each halving has probability 1/2) and the 52-bit mantissa is
    uniform, so every double in (0, 1) is reachable with the probability of
    the interval it stands for, down to 2**-1074. A plain
    ``getrandbits(53) / 2**53`` stops at 2**-53, which would cut the tail of
    an exponential at about 36.7 and make far-away outputs impossible.
    """
    exponent = 1
    while exponent < _MAX_EXPONENT:
        word = rng.getrandbits(_WORD_BITS)
        if word:
            exponent += _WORD_BITS - word.bit_length()
            break
        exponent += _WORD_BITS
    exponent = min(exponent, _MAX_EXPONENT)  # deeper would underflow to 0.0
    # An odd 52-bit fraction: the midpoint of one of 2**51 equal cells of [2**-e, 2**(1-e)),
    # exactly representable, so the result is never 0 and never reaches 1.
    fraction = (rng.getrandbits(_MANTISSA_BITS - 1) << 1) | 1
    return math.ldexp((1 << _MANTISSA_BITS) + fraction, -_MANTISSA_BITS - exponent)


def standard_exponential(rng: RandomSource) -> float:
    """An Exp(1) draw, ``-log(U)`` with a full-resolution uniform ``U``."""
    return -math.log(open_unit_uniform(rng))


def uniform_angle(rng: RandomSource) -> float:
    """A uniform angle in [0, 2*pi) with 53 random bits."""
    return math.tau * rng.getrandbits(53) / (1 << 53)


def bernoulli_exp_minus(rng: RandomSource, numerator: int, denominator: int) -> bool:
    """True with probability ``exp(-numerator / denominator)``, exactly.

    Canonne, Kamath and Steinke, "The discrete Gaussian for differential
    privacy" (NeurIPS 2020), Algorithm 1: for a ratio ``g`` in [0, 1], count
    successive successes of Bernoulli(g / K) for K = 1, 2, ...; the count ends odd
    with probability ``exp(-g)``. A larger ratio is peeled into ``exp(-1)``
    factors first. Only uniform integers are drawn, so the probability is exact
    for any non-negative rational ratio.
    """
    if numerator < 0 or denominator <= 0:
        raise ValueError(f"need numerator >= 0 and denominator > 0, got {numerator}/{denominator}")
    while numerator > denominator:
        if not _bernoulli_exp_minus_unit(rng, 1, 1):
            return False
        numerator -= denominator
    return _bernoulli_exp_minus_unit(rng, numerator, denominator)


def _bernoulli_exp_minus_unit(rng: RandomSource, numerator: int, denominator: int) -> bool:
    """``bernoulli_exp_minus`` for a ratio in [0, 1]."""
    k = 1
    while randbelow(rng, denominator * k) < numerator:  # Bernoulli(ratio / k)
        k += 1
    return k % 2 == 1


def discrete_laplace(rng: RandomSource, epsilon: float | Fraction) -> int:
    """An integer ``z`` with probability proportional to ``exp(-epsilon |z|)``, exactly.

    Canonne, Kamath and Steinke (2020), Algorithm 2. A float ``epsilon`` is
    exactly a rational ``s / t``, as is a :class:`~fractions.Fraction` (for a
    product such as epsilon per metre times a cell size, which a float would
    round), and the law is realised exactly for it; the expected number of
    rounds is below 4.
    """
    ratio = Fraction(epsilon)
    s, t = ratio.numerator, ratio.denominator
    if s <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    while True:
        u = randbelow(rng, t)
        if not bernoulli_exp_minus(rng, u, t):
            continue
        v = 0
        while bernoulli_exp_minus(rng, 1, 1):
            v += 1
        magnitude = (u + t * v) // s
        negative = rng.getrandbits(1)
        if negative and magnitude == 0:
            continue  # zero would otherwise be drawn twice as often
        return -magnitude if negative else magnitude
