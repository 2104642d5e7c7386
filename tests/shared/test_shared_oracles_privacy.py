"""Privacy audit of the large-domain oracles: OLH, OUE and Hadamard response.

For each mechanism, and for a negative control whose device keeps the true
answer with the weights of ``1.1 epsilon`` while its campaign says ``epsilon``:

1. **The law, exactly.** Every report's probability is written out as a
   fraction of the device's integer weights (independently of the channel
   code: OLH over its seeds and buckets, OUE over all ``2^k`` bit vectors,
   Hadamard response over its columns), and the largest ratio
   ``P(y | x) / P(y | x')`` over every pair of inputs and every report is
   compared with ``e^epsilon`` (its log, with float rounding far below the
   control's excess of ``0.1 epsilon``). The aggregator's OLH channel must be
   that law.
2. **The sampler follows the law.** Draws of the device sampler for two inputs
   must fit the audited law (chi-square at ``GOF_ALPHA``, fixed seeds).

The control fails both.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from shared_stats import GOF_ALPHA, chi_square_gof, scalar_counts

from aggregator.estimation import channel_for
from shared.exactness import keep_weight
from shared.mechanisms import HadamardResponse
from shared.oracles import OLH, OUE

GENEROUS = 1.1
DRAWS = 40_000
TOLERANCE = 1e-12


def generous(mechanism):
    """The mechanism with the keep weight of ``1.1 epsilon`` (its law and its sampler)."""
    mechanism.keep_weight = keep_weight(GENEROUS * mechanism.epsilon)
    others = mechanism.g - 1 if isinstance(mechanism, OLH) else 1
    mechanism.total_weight = mechanism.keep_weight + others * mechanism.unit_weight
    return mechanism


def max_log_ratio(law: list[list[Fraction]]) -> float:
    """``max ln P(y | x) / P(y | x')`` over every pair of rows and every column."""
    worst = Fraction(1)
    for y in range(len(law[0])):
        column = [row[y] for row in law]
        worst = max(worst, max(column) / min(column))
    return math.log(worst)


def olh_law(m: OLH) -> list[list[Fraction]]:
    keep = Fraction(m.keep_weight, m.total_weight * m.pool_size)
    other = Fraction(m.unit_weight, m.total_weight * m.pool_size)
    law = []
    for x in range(m.k):
        row = [other] * m.n_outputs
        for s in range(m.pool_size):
            row[s * m.g + m.bucket(s, x)] = keep
        law.append(row)
    return law


def oue_law(m: OUE) -> list[list[Fraction]]:
    """P(bit vector | x) for every vector, as the bitmask ``sum 2^i`` of its 1 bits."""
    one = Fraction(m.unit_weight, m.total_weight)
    law = []
    for x in range(m.k):
        row = []
        for vector in range(1 << m.k):
            p = Fraction(1)
            for bit in range(m.k):
                on = (vector >> bit) & 1
                p *= Fraction(1, 2) if bit == x else (one if on else 1 - one)
            row.append(p)
        law.append(row)
    return law


def hadamard_law(m: HadamardResponse) -> list[list[Fraction]]:
    half = m.size // 2
    inside = Fraction(m.keep_weight, m.total_weight * half)
    outside = Fraction(m.unit_weight, m.total_weight * half)
    return [
        [inside if bin((x + 1) & y).count("1") % 2 == 0 else outside for y in range(m.size)]
        for x in range(m.k)
    ]


def oue_counts(m: OUE, x: int, n: int, seed: int) -> np.ndarray:
    rng = random.Random(seed)
    masks = [sum(1 << bit for bit in m.perturb_bits(x, rng)) for _ in range(n)]
    return np.bincount(masks, minlength=1 << m.k)


CASES = [
    ("olh", lambda e: OLH(epsilon=e, domain_size=6, pool_size=4), olh_law, scalar_counts),
    ("oue", lambda e: OUE(epsilon=e, domain_size=4), oue_law, oue_counts),
    (
        "hadamard_response",
        lambda e: HadamardResponse(epsilon=e, domain_size=5),
        hadamard_law,
        scalar_counts,
    ),
]


@pytest.mark.parametrize(("name", "build", "law", "_"), CASES)
@pytest.mark.parametrize("epsilon", [0.3, 1.0, 2.5])
def test_the_exact_law_is_within_epsilon_on_every_pair_and_tight(name, build, law, _, epsilon):
    m = build(epsilon)
    loss = max_log_ratio(law(m))
    assert loss <= epsilon + TOLERANCE
    # Tight to the weights' resolution: the audit can see a larger epsilon.
    assert loss == pytest.approx(epsilon, abs=1e-9)
    assert loss == pytest.approx(math.log(m.keep_weight / m.unit_weight), abs=1e-12)


@pytest.mark.parametrize(("name", "build", "law", "_"), CASES)
def test_negative_control_a_ten_percent_too_generous_law_is_caught(name, build, law, _):
    epsilon = 1.0
    loss = max_log_ratio(law(generous(build(epsilon))))
    assert loss >= GENEROUS * epsilon - 1e-9 > epsilon + TOLERANCE


def test_the_olh_channel_is_the_audited_law():
    m = OLH(epsilon=1.3, domain_size=6, pool_size=4)
    exact = np.array([[float(p) for p in row] for row in olh_law(m)])
    np.testing.assert_allclose(channel_for(m).to_dense(), exact, rtol=1e-12)


def sampler_fits(m, law: list[list[Fraction]], counts, seed: int) -> bool:
    for x in (0, m.k - 1):
        probabilities = np.array([float(p) for p in law[x]])
        drawn = counts(m, x, DRAWS, seed + x)
        if chi_square_gof(drawn, probabilities).p_value <= GOF_ALPHA:
            return False
    return True


@pytest.mark.parametrize(("name", "build", "law", "counts"), CASES)
def test_the_device_sampler_follows_the_audited_law(name, build, law, counts):
    m = build(1.0)
    assert sampler_fits(m, law(m), counts, seed=211)


@pytest.mark.parametrize(("name", "build", "law", "counts"), CASES)
def test_negative_control_a_ten_percent_too_generous_sampler_is_caught(name, build, law, counts):
    intended = build(1.0)
    faulty = generous(build(1.0))
    assert not sampler_fits(faulty, law(intended), counts, seed=211)
