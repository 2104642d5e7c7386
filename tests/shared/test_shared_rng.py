"""The reporting path's randomness: exact integers, full-resolution uniforms, exponentials."""

from __future__ import annotations

import math
import random
import secrets

import numpy as np
import pytest
from scipy import stats
from shared_stats import GOF_ALPHA, chi_square_gof

from shared.rng import (
    default_rng,
    open_unit_uniform,
    randbelow,
    standard_exponential,
    uniform_angle,
)

# Moment checks allow 5 standard errors: a correct sampler fails one with
# probability below 6e-7 under a random seed.
Z_MOMENT = 5.0
N_DRAWS = 200_000


class ScriptedBits:
    """A source that returns given words for its first calls, then ``fill`` bits forever."""

    def __init__(self, words, fill: int | None = None):
        self.words = list(words)
        self.fill = fill
        self.requests: list[int] = []

    def getrandbits(self, k: int) -> int:
        self.requests.append(k)
        if self.words:
            return self.words.pop(0)
        if self.fill is None:
            return (1 << k) - 1
        return self.fill & ((1 << k) - 1)


def test_default_rng_is_the_system_csprng():
    rng = default_rng()
    assert isinstance(rng, secrets.SystemRandom)
    assert default_rng() is not rng  # no shared module-level handle


@pytest.mark.parametrize("n", [2, 3, 5, 6, 7, 10, 37, 100, 1000])
def test_randbelow_is_uniform(n):
    rng = random.Random(1000 + n)
    draws = [randbelow(rng, n) for _ in range(max(50 * n, 60_000))]
    assert min(draws) == 0 and max(draws) == n - 1
    counts = np.bincount(draws, minlength=n)
    assert counts.size == n
    fit = chi_square_gof(counts, np.full(n, 1 / n))
    assert fit.p_value > GOF_ALPHA, fit


def test_chi_square_catches_modulo_bias():
    # Negative control of the test above: the classic "bits % n" is not uniform for n = 3.
    rng = random.Random(3)
    counts = np.bincount([rng.getrandbits(3) % 3 for _ in range(60_000)], minlength=3)
    assert chi_square_gof(counts, np.full(3, 1 / 3)).p_value < 1e-12


def test_randbelow_huge_n_and_edge_cases():
    rng = random.Random(7)
    n = (1 << 64) + 12345  # k-RR's total weight is this large
    draws = [randbelow(rng, n) for _ in range(20_000)]
    assert all(0 <= d < n for d in draws)
    above = sum(d >= 1 << 64 for d in draws)
    # P(d >= 2**64) = 12345 / n, about 7e-16: never in 20 000 draws.
    assert above == 0
    top = sum(d >= 1 << 63 for d in draws)
    # P(top bit set) = (n - 2**63) / n, about 1/2: 5 standard errors.
    assert abs(top / len(draws) - 0.5) < Z_MOMENT * math.sqrt(0.25 / len(draws))
    assert all(randbelow(rng, 1) == 0 for _ in range(10))
    for bad in (0, -1):
        with pytest.raises(ValueError):
            randbelow(rng, bad)


def test_randbelow_rejects_and_redraws_with_bit_length_bits():
    # n = 5 needs 3 bits; 7, 6 and 5 are rejected, then 2 is accepted.
    source = ScriptedBits([7, 6, 5, 2])
    assert randbelow(source, 5) == 2
    assert source.requests == [3, 3, 3, 3]


def test_open_unit_uniform_range_and_moments():
    rng = random.Random(11)
    draws = np.array([open_unit_uniform(rng) for _ in range(N_DRAWS)])
    assert draws.min() > 0 and draws.max() < 1
    assert abs(draws.mean() - 0.5) < Z_MOMENT * math.sqrt(1 / 12 / N_DRAWS)
    # Var((U - 1/2)^2) = 1/80 - 1/144 = 1/180.
    assert abs(draws.var() - 1 / 12) < Z_MOMENT * math.sqrt(1 / 180 / N_DRAWS)
    assert stats.kstest(draws, "uniform").pvalue > GOF_ALPHA
    # The exponent scan: P(U < 2**-10) = 2**-10.
    small = np.mean(draws < 2**-10)
    assert abs(small - 2**-10) < Z_MOMENT * math.sqrt(2**-10 / N_DRAWS)


def test_open_unit_uniform_reaches_below_two_to_the_minus_53():
    # One zero word (64 leading zeros), then a word with its top bit set: exponent 65.
    source = ScriptedBits([0, 1 << 63, 0])
    value = open_unit_uniform(source)
    assert value == math.ldexp((1 << 52) + 1, -52 - 65)  # the lowest odd fraction
    assert 2**-65 <= value < 2**-64 < 2**-53
    assert source.requests == [64, 64, 51]
    # Three zero words and a word of 0b1: exponent 1 + 3 * 64 + 63, i.e. the binade
    # [2**-256, 2**-255).
    deep = open_unit_uniform(ScriptedBits([0, 0, 0, 1, 12345]))
    assert 2**-256 <= deep < 2**-255
    # Its exponential is far beyond the 36.7 where a 53-bit uniform stops.
    assert standard_exponential(ScriptedBits([0, 1 << 63, 0])) == pytest.approx(
        -math.log(value), rel=1e-15
    )
    assert -math.log(value) > 44


def test_open_unit_uniform_never_returns_one():
    # The first word has its top bit set: exponent 1, i.e. [1/2, 1); the all-ones mantissa
    # must still stay below 1, as the docstring promises an open interval.
    source = ScriptedBits([1 << 63])  # then all-ones for every later request
    value = open_unit_uniform(source)
    assert source.requests == [64, 51]
    assert 0.5 < value < 1.0


def test_open_unit_uniform_stays_in_its_binade_below_the_top_mantissa():
    for mantissa in (0, 1, 12345, (1 << 51) - 1):
        value = open_unit_uniform(ScriptedBits([1 << 62, mantissa]))  # exponent 2: [1/4, 1/2)
        assert 0.25 <= value < 0.5


@pytest.mark.parametrize("words", [[], [0] * 16 + [1]], ids=["all-zero", "zeros-then-one"])
def test_open_unit_uniform_is_never_zero(words):
    # A source that gives (nearly) only zero bits reaches the bottom of the double range;
    # the result must still be > 0 so that -log(U) stays finite.
    source = ScriptedBits(words, fill=0)
    value = open_unit_uniform(source)
    assert 0 < value < 2**-1000
    assert math.isfinite(standard_exponential(ScriptedBits(words, fill=0)))


def test_standard_exponential_moments_and_tail():
    rng = random.Random(12)
    draws = np.array([standard_exponential(rng) for _ in range(N_DRAWS)])
    assert draws.min() > 0
    assert abs(draws.mean() - 1) < Z_MOMENT * math.sqrt(1 / N_DRAWS)
    # Var((X - 1)^2) = E(X - 1)^4 - 1 = 9 - 1 = 8 for Exp(1).
    assert abs(draws.var() - 1) < Z_MOMENT * math.sqrt(8 / N_DRAWS)
    assert stats.kstest(draws, "expon").pvalue > GOF_ALPHA
    tail = np.mean(draws > 5)
    assert abs(tail - math.exp(-5)) < Z_MOMENT * math.sqrt(math.exp(-5) / N_DRAWS)


def test_uniform_angle():
    rng = random.Random(13)
    draws = np.array([uniform_angle(rng) for _ in range(N_DRAWS)])
    assert draws.min() >= 0 and draws.max() < math.tau
    assert stats.kstest(draws / math.tau, "uniform").pvalue > GOF_ALPHA
    assert uniform_angle(ScriptedBits([0])) == 0.0
    assert uniform_angle(ScriptedBits([(1 << 53) - 1])) < math.tau
