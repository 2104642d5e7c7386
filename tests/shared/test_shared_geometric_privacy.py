"""Privacy audit of the geometric mechanism: epsilon per unit on every row, the ends included.

The audit has two parts, each run on the intended mechanism and on a negative
control whose sampler is 10% too generous (it draws with ``1.1 epsilon`` while
its campaign says ``epsilon``):

1. **The law.** From the clamped law written out in log space (independently
   of the channel code), the largest excess
   ``ln p(z | x) - ln p(z | x') - epsilon |x - x'|`` over every pair of rows
   and every report is computed exactly (no sampling); it must be <= 0 (up to
   float rounding). On small ranges every pair is checked; on a large range
   every row against its neighbour, which covers every pair by the triangle
   inequality. The aggregator's channel must be that law.
2. **The sampler follows the law.** Draws of the device sampler for the two
   edge rows and a middle row must fit the audited law (chi-square at
   ``GOF_ALPHA``, fixed seeds).

The control's law fails part 1 and its draws fail part 2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from shared_stats import GOF_ALPHA, chi_square_gof, scalar_counts

from aggregator.estimation import channel_for
from shared.mechanisms import Geometric
from shared.rng import RandomSource, discrete_laplace

GENEROUS = 1.1
DRAWS = 60_000
# Float rounding of the logs: far below the 10% control's excess (0.1 epsilon per unit).
TOLERANCE = 1e-9


class TooGenerousGeometric(Geometric):
    """A faulty sampler: it draws the noise with ``1.1 epsilon``, the law it says is ``epsilon``."""

    def perturb_index(self, x: int, rng: RandomSource) -> int:
        noise = discrete_laplace(rng, GENEROUS * self.epsilon)
        return min(max(x + noise, 0), self.n_outputs - 1)


def log_law(epsilon: float, m: int, rows: np.ndarray | None = None) -> np.ndarray:
    """``ln p(z | x)`` of the clamped discrete Laplace on ``m`` values, for ``rows`` (all by default).

    Inner reports ``ln((1 - a) / (1 + a)) + |z - x| ln a``; the ends gather the tails,
    ``x ln a - ln(1 + a)`` at the bottom and ``(m - 1 - x) ln a - ln(1 + a)`` at the top.
    """
    log_a = -epsilon
    a = math.exp(log_a)
    x = np.arange(m)[:, None] if rows is None else np.asarray(rows)[:, None]
    z = np.arange(m)[None, :]
    logs = math.log((1 - a) / (1 + a)) + np.abs(z - x) * log_a
    logs[:, 0] = x[:, 0] * log_a - math.log1p(a)
    logs[:, -1] = (m - 1 - x[:, 0]) * log_a - math.log1p(a)
    return logs


def excess_over_all_pairs(logs: np.ndarray, epsilon: float) -> float:
    """``max ln p(z|x) - ln p(z|x') - epsilon |x - x'|`` over every x, x', z."""
    m = logs.shape[0]
    distance = np.abs(np.subtract.outer(np.arange(m), np.arange(m)))
    worst = -np.inf
    for z in range(logs.shape[1]):
        loss = logs[:, z][:, None] - logs[:, z][None, :]
        worst = max(worst, float(np.max(loss - epsilon * distance)))
    return worst


def excess_between_neighbours(logs: np.ndarray, epsilon: float) -> float:
    """The same over rows ``x, x + 1`` (both orders): enough for every pair, by the triangle
    inequality."""
    step = np.abs(logs[1:] - logs[:-1])
    return float(step.max() - epsilon)


def sampler_fits(mechanism: Geometric, epsilon: float, seed: int) -> bool:
    """Whether the device sampler's draws fit the law of ``epsilon`` on the edge and middle rows."""
    m = mechanism.n_outputs
    for x in (0, m // 2, m - 1):
        law = np.exp(log_law(epsilon, m, np.array([x]))[0])
        counts = scalar_counts(mechanism, x, DRAWS, seed=seed + x)
        if chi_square_gof(counts, law / law.sum()).p_value <= GOF_ALPHA:
            return False
    return True


@pytest.mark.parametrize(("epsilon", "m"), [(0.5, 2), (0.5, 13), (0.05, 80), (2.0, 40), (9.0, 7)])
def test_epsilon_per_unit_holds_for_every_pair_of_rows_the_ends_included(epsilon, m):
    logs = log_law(epsilon, m)
    assert excess_over_all_pairs(logs, epsilon) <= TOLERANCE
    # Tight: the bottom end tells 0 from 1 by exactly epsilon (the mechanism is not
    # more private than it says, so the audit can see a larger epsilon).
    assert logs[0, 0] - logs[1, 0] == pytest.approx(epsilon, rel=1e-12)
    # The aggregator estimates with exactly this law.
    mechanism = Geometric(epsilon=epsilon, lo=-7, hi=-7 + m - 1)
    np.testing.assert_allclose(channel_for(mechanism).to_dense(), np.exp(logs), rtol=1e-10)


def test_epsilon_per_unit_holds_between_neighbours_on_every_row_of_a_large_range():
    epsilon, m = 0.01, 3000
    assert excess_between_neighbours(log_law(epsilon, m), epsilon) <= TOLERANCE


@pytest.mark.parametrize(("epsilon", "m"), [(0.5, 13), (0.05, 80), (2.0, 40)])
def test_negative_control_a_ten_percent_too_generous_law_is_caught(epsilon, m):
    generous = log_law(GENEROUS * epsilon, m)
    excess = excess_over_all_pairs(generous, epsilon)
    assert excess >= 0.1 * epsilon * (1 - 1e-9)
    assert excess_between_neighbours(generous, epsilon) > TOLERANCE


def test_the_device_sampler_follows_the_audited_law_on_its_edge_rows():
    assert sampler_fits(Geometric(epsilon=0.5, lo=0, hi=12), 0.5, seed=101)


def test_negative_control_a_ten_percent_too_generous_sampler_is_caught():
    faulty = TooGenerousGeometric(epsilon=0.5, lo=0, hi=12)
    assert not sampler_fits(faulty, 0.5, seed=101)


def test_negative_control_renormalising_over_the_range_instead_of_clamping_is_caught():
    # p(z | x) proportional to a^|z - x| on the range: the normaliser depends on x and the
    # loss between neighbours near an end exceeds epsilon (towards 2 epsilon).
    epsilon, m = 0.5, 13
    distance = np.abs(np.subtract.outer(np.arange(m), np.arange(m)))
    logs = -epsilon * distance
    logs -= np.log(np.exp(logs).sum(axis=1, keepdims=True))
    assert excess_over_all_pairs(logs, epsilon) > 0.1 * epsilon
