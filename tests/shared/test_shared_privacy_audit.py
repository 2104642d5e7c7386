"""Empirical privacy audit of the on-device samplers.

For every mechanism, ``N_AUDIT = 10**6`` reports are drawn through the real
scalar sampler (``perturb_index`` with ``random.Random(seed)``, the interface
of ``secrets.SystemRandom``) for each input of a set of neighbouring pairs,
and the empirical log-ratio ``ln(P_hat(y | x) / P_hat(y | x'))`` of every
output with at least ``MIN_COUNT`` reports under both inputs must stay within

* ``epsilon`` for rr and k-RR (every ordered pair; the bound is tight), and
* ``min(epsilon * d(x, x'), L(x, x'))`` for planar Laplace, where ``d`` is the
  distance of the cell centres and ``L(x, x') = max_y ln C[x, y] / C[x', y]``
  is the exact loss of the discretised, remapped channel (shown below to be
  ``<= epsilon * d`` on whole grids; it is not tight, the cells being squares),

plus a tolerance ``z * SE``: ``SE`` is the delta-method standard error of the
log-ratio estimate and ``z`` a Bonferroni quantile that shares
``FAMILY_ALPHA = 1e-3`` over every (pair, output) check of a mechanism, so a
correct sampler fails a case with probability below 1e-3 under a random seed.

Negative controls: the same audit on k-RR built with ``epsilon + 0.1`` and on
planar Laplace built with ``1.1 epsilon`` (``epsilon * cell = 1``, so 0.1 per
cell) must find an output beyond the bound of the intended mechanism.

A second stage re-tests the worst (pair, output) triple of the first on fresh
samples with exact Clopper-Pearson bounds (no multiplicity left to pay for):
it catches a k-RR over 50 labels built with ``1.1 epsilon`` at ``epsilon =
0.5``, whose 0.05 excess lies inside the first stage's tolerance. The slow
tests run it on the worst triple of every case.

The draws run in two processes; the default tests of the file take about 55 s
of CPU time, 8 s of it the second stage's.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from shared_stats import (
    bonferroni_z,
    log_ratio_audit,
    log_ratio_bounds,
    scalar_counts,
    scalar_hits,
    small_grid,
)

from aggregator.estimation import PlanarLaplaceChannel
from shared.mechanisms import KRR, PlanarLaplace, RandomizedResponse

N_AUDIT = 1_000_000
FAMILY_ALPHA = 1e-3
# The delta-method error of ln(k / n) is below 10 % of the estimate's scale from here on.
MIN_COUNT = 100
WORKERS = 2
KRR_EXTRA_EPSILON = 0.1
PLANAR_EXTRA_FACTOR = 1.1
# Slack of the exact (quadrature) loss against epsilon * d; the kernel is accurate to ~1e-15.
EXACT_SLACK = 1e-9


def labels(k: int) -> tuple[str, ...]:
    return tuple(f"c{i}" for i in range(k))


# Categorical cases: (name, mechanism, inputs audited pairwise).
KRR_CASES = {
    "rr": (RandomizedResponse(epsilon=1.0), (0, 1)),
    "krr-5": (KRR(epsilon=1.0, domain=labels(5)), tuple(range(5))),
    "krr-10": (KRR(epsilon=math.log(3), domain=labels(10)), tuple(range(10))),
}
KRR_WRONG = KRR(epsilon=1.0 + KRR_EXTRA_EPSILON, domain=labels(5))
KRR_WRONG_INPUTS = (0, 1)

# Planar: a 5 x 5 grid of 100 m cells, epsilon * cell = 1.
PLANAR_GRID = small_grid(5, 5, 100.0)
PLANAR = PlanarLaplace(epsilon=0.01, grid=PLANAR_GRID)
PLANAR_WRONG = PlanarLaplace(epsilon=0.01 * PLANAR_EXTRA_FACTOR, grid=PLANAR_GRID)
# Pairs at distances 1, sqrt 2, 2 and 2 sqrt 2 cells, from the corner and from the centre.
PLANAR_PAIRS = ((0, 1), (0, 6), (0, 2), (0, 12), (12, 13), (12, 18), (12, 14))
PLANAR_WRONG_PAIRS = ((0, 2), (12, 13), (12, 14))


def planar_channel(mechanism: PlanarLaplace) -> np.ndarray:
    grid = mechanism.grid
    return PlanarLaplaceChannel(
        epsilon=mechanism.epsilon, cell_size_m=grid.cell_size_m, rows=grid.rows, cols=grid.cols
    ).dense_reference()


def exact_loss(channel: np.ndarray, x: int, other: int) -> float:
    """``L(x, x') = max_y ln C[x, y] / C[x', y]``."""
    return float(np.max(np.log(channel[x]) - np.log(channel[other])))


def centre_distance_cells(grid, x: int, other: int) -> float:
    (r0, c0), (r1, c1) = divmod(x, grid.cols), divmod(other, grid.cols)
    return math.hypot(r0 - r1, c0 - c1)


def ordered(pairs):
    return [p for pair in pairs for p in (pair, pair[::-1])]


def jobs():
    """Every (key, mechanism, input) to draw; keys name the case."""
    out = []
    for name, (mechanism, inputs) in KRR_CASES.items():
        out += [((name, x), mechanism, x) for x in inputs]
    out += [(("krr-wrong", x), KRR_WRONG, x) for x in KRR_WRONG_INPUTS]
    out += [(("planar", x), PLANAR, x) for x in sorted({x for p in PLANAR_PAIRS for x in p})]
    wrong_inputs = sorted({x for p in PLANAR_WRONG_PAIRS for x in p})
    out += [(("planar-wrong", x), PLANAR_WRONG, x) for x in wrong_inputs]
    return out


@pytest.fixture(scope="module")
def pool():
    """WORKERS processes for the draws of this file."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=WORKERS, mp_context=context) as executor:
        yield executor


def draw(pool, work, n: int = N_AUDIT, first_seed: int = 20_000) -> dict:
    """Output counts of ``n`` scalar draws for each ``(key, mechanism, x)``, in the pool."""
    # Planar draws are ~8x slower than k-RR ones; start them first so the two workers finish together.
    work = sorted(work, key=lambda job: not isinstance(job[1], PlanarLaplace))
    seeds = [first_seed + i for i in range(len(work))]
    results = pool.map(
        scalar_counts, [job[1] for job in work], [job[2] for job in work], [n] * len(work), seeds
    )
    counts = {job[0]: result for job, result in zip(work, results, strict=True)}
    for key, result in counts.items():
        assert result.sum() == n, key
    return counts


@pytest.fixture(scope="module")
def audit_counts(pool):
    """The draws of every case of the default run, computed once."""
    return draw(pool, jobs())


def audit_pairs(counts, case: str, pairs, bound_of, n_outputs: int):
    z = bonferroni_z(FAMILY_ALPHA, len(pairs) * n_outputs)
    return {
        (x, other): log_ratio_audit(
            counts[(case, x)], counts[(case, other)], bound_of(x, other), z, MIN_COUNT
        )
        for x, other in pairs
    }


# -- k-RR ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(KRR_CASES))
def test_krr_log_ratios_stay_within_epsilon(audit_counts, case):
    mechanism, inputs = KRR_CASES[case]
    pairs = list(itertools.permutations(inputs, 2))
    checks = audit_pairs(
        audit_counts, case, pairs, lambda x, o, eps=mechanism.epsilon: eps, mechanism.k
    )
    for pair, check in checks.items():
        assert check.n_checked == mechanism.k, pair  # every output is seen ~10^5 times
        assert check.excess <= 0, (pair, check)
        # The audit sees the whole loss: at y = x the estimate reaches epsilon within tolerance.
        assert check.output == pair[0]
        assert check.largest >= mechanism.epsilon - 2 * check.tolerance, (pair, check)


def test_krr_negative_control_epsilon_plus_point_one_is_caught(audit_counts):
    intended = KRR_CASES["krr-5"][0]
    assert KRR_WRONG.k == intended.k
    pairs = list(itertools.permutations(KRR_WRONG_INPUTS, 2))
    checks = audit_pairs(
        audit_counts, "krr-wrong", pairs, lambda x, o: intended.epsilon, KRR_WRONG.k
    )
    for pair, check in checks.items():
        assert check.excess > 0, (pair, check)
        assert check.output == pair[0]  # caught where the true label is reported


# -- planar Laplace ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "cols", "unit"),
    [(5, 5, 1.0), (3, 7, 0.5), (6, 4, 2.0), (1, 8, 1.0), (8, 8, 0.3)],
)
def test_planar_exact_loss_is_bounded_by_epsilon_times_distance(rows, cols, unit):
    # Deterministic: the discretised, remapped channel is post-processing of planar Laplace
    # at the cell centres, so its exact loss between two cells is at most epsilon * d.
    grid = small_grid(rows, cols, 100.0)
    mechanism = PlanarLaplace(epsilon=unit / 100.0, grid=grid)
    channel = planar_channel(mechanism)
    assert channel.min() > 0
    worst_slack = math.inf
    for x, other in itertools.permutations(range(grid.n_cells), 2):
        loss = exact_loss(channel, x, other)
        allowed = unit * centre_distance_cells(grid, x, other)
        assert loss <= allowed + EXACT_SLACK, (x, other, loss, allowed)
        worst_slack = min(worst_slack, allowed - loss)
    # ... and the bound is nearly attained by some pair (the check is not vacuous).
    assert worst_slack < 0.1 * unit


def test_planar_log_ratios_stay_within_the_exact_loss(audit_counts):
    channel = planar_channel(PLANAR)
    unit = PLANAR.epsilon * PLANAR_GRID.cell_size_m

    def bound(x, other):
        geo = unit * centre_distance_cells(PLANAR_GRID, x, other)
        return min(geo, exact_loss(channel, x, other))

    pairs = ordered(PLANAR_PAIRS)
    z_planar = bonferroni_z(FAMILY_ALPHA, len(pairs) * PLANAR.n_outputs)
    checks = audit_pairs(audit_counts, "planar", pairs, bound, PLANAR.n_outputs)
    for pair, check in checks.items():
        assert check.n_checked >= 20, (pair, check)
        assert check.excess <= 0, (pair, check)
        # The empirical loss reaches the exact one (the sampler is no more private than the
        # channel says, so the bound is really being tested): within z standard errors of the
        # least likely output, the widest tolerance of any output.
        x, other = pair
        p_min = min(channel[x].min(), channel[other].min())
        slack = z_planar * math.sqrt(2 * (1 - p_min) / (N_AUDIT * p_min))
        assert check.largest >= exact_loss(channel, x, other) - slack, (pair, check, slack)


def test_planar_negative_control_larger_epsilon_is_caught(audit_counts):
    channel = planar_channel(PLANAR)
    pairs = ordered(PLANAR_WRONG_PAIRS)

    def bound(x, other):
        return exact_loss(channel, x, other)

    checks = audit_pairs(audit_counts, "planar-wrong", pairs, bound, PLANAR.n_outputs)
    caught = {pair for pair, check in checks.items() if check.excess > 0}
    # Every pair: the worst output exceeds the intended channel's loss by more than the tolerance.
    assert caught == set(pairs), {p: checks[p] for p in set(pairs) - caught}


# -- the second stage: the worst triple again, on fresh samples ---------------------------
#
# The first stage shares its error level over every (pair, output) check, so its tolerance
# is several standard errors wide. The second stage takes the one triple (x, x', y) whose
# first-stage excess is largest and draws fresh samples for x and x' alone: with nothing
# chosen on them, exact Clopper-Pearson bounds on P(y | x) and P(y | x') give a lower
# confidence bound on ln P(y | x) / P(y | x') at level SECOND_ALPHA, which must not exceed
# the claimed loss. A k-RR over 50 labels built with 1.1 epsilon (0.55 for 0.5) exceeds its
# claim by 0.05 at y = x: inside the first stage's tolerance at N_FIRST draws, and about 7
# standard errors of the second stage's N_SECOND.

N_FIRST = 200_000
N_SECOND = 2_000_000
SECOND_ALPHA = 1e-3
KRR_50 = KRR(epsilon=0.5, domain=labels(50))
KRR_50_GENEROUS = KRR(epsilon=0.55, domain=labels(50))
KRR_50_INPUTS = (0, 1)


def worst_triple(checks) -> tuple[int, int, int]:
    """The (x, x', y) whose first-stage excess is the largest."""
    (x, other), check = max(checks.items(), key=lambda item: item[1].excess)
    return x, other, check.output


def second_stage(pool, triples, n: int = N_SECOND, first_seed: int = 40_000):
    """Re-test each ``(mechanism, x, x', y)`` on ``n`` fresh draws of x and of x'."""
    jobs = [(mechanism, x, y) for mechanism, x, other, y in triples]
    jobs += [(mechanism, other, y) for mechanism, x, other, y in triples]
    hits = list(
        pool.map(
            scalar_hits,
            [job[0] for job in jobs],
            [job[1] for job in jobs],
            [job[2] for job in jobs],
            [n] * len(jobs),
            [first_seed + i for i in range(len(jobs))],
        )
    )
    return [
        log_ratio_bounds(x, other, y, hits_x, hits_other, n, SECOND_ALPHA)
        for (_, x, other, y), hits_x, hits_other in zip(
            triples, hits[: len(triples)], hits[len(triples) :], strict=True
        )
    ]


def test_second_stage_catches_a_krr_ten_percent_too_generous_that_the_first_stage_misses(pool):
    work = [(("krr-50", x), KRR_50, x) for x in KRR_50_INPUTS]
    work += [(("krr-50-generous", x), KRR_50_GENEROUS, x) for x in KRR_50_INPUTS]
    counts = draw(pool, work, n=N_FIRST, first_seed=30_000)
    pairs = list(itertools.permutations(KRR_50_INPUTS, 2))
    claimed = KRR_50.epsilon

    def first_stage(case):
        return audit_pairs(counts, case, pairs, lambda x, o: claimed, KRR_50.k)

    correct, generous = first_stage("krr-50"), first_stage("krr-50-generous")
    # Stage one passes the correct mechanism, and cannot tell the generous one: its tolerance
    # is wider than the 0.05 excess ...
    assert all(check.excess <= 0 for check in correct.values())
    assert all(check.tolerance > 0.05 for check in generous.values())
    # ... but it points at the right triple: the true label, where the loss is.
    triples = [worst_triple(correct), worst_triple(generous)]
    for x, _, output in triples:
        assert output == x
    results = second_stage(
        pool, [(KRR_50, *triples[0]), (KRR_50_GENEROUS, *triples[1])], first_seed=40_000
    )
    right, wrong = results
    # The correct mechanism passes, its interval holding the claimed loss ...
    assert right.lower <= claimed <= right.upper, right
    # ... and the generous one is caught: its loss is above 0.5 at confidence 1 - 1e-3.
    assert wrong.lower > claimed, wrong


# -- the extended audit (slow: about a minute on two cores) ------------------------------


@pytest.mark.slow
def test_extended_audit_every_pair_of_krr_50_and_of_a_planar_grid(pool):
    krr = KRR(epsilon=3.0, domain=labels(50))
    grid = small_grid(4, 4, 100.0)
    planar = PlanarLaplace(epsilon=0.01, grid=grid)
    work = [(("krr", x), krr, x) for x in range(krr.k)]
    work += [(("planar", x), planar, x) for x in range(grid.n_cells)]
    counts = draw(pool, work)

    krr_pairs = list(itertools.permutations(range(krr.k), 2))
    checks = audit_pairs(counts, "krr", krr_pairs, lambda x, o: krr.epsilon, krr.k)
    assert max(check.excess for check in checks.values()) <= 0
    assert min(check.largest for check in checks.values()) >= krr.epsilon - 0.1

    channel = planar_channel(planar)

    def bound(x, other):
        geo = centre_distance_cells(grid, x, other) * planar.epsilon * grid.cell_size_m
        return min(geo, exact_loss(channel, x, other))

    planar_pairs = list(itertools.permutations(range(grid.n_cells), 2))
    planar_checks = audit_pairs(counts, "planar", planar_pairs, bound, planar.n_outputs)
    worst = max(planar_checks.items(), key=lambda item: item[1].excess)
    assert worst[1].excess <= 0, worst

    # The second stage: the worst triple of each, on fresh samples.
    retests = [
        (krr, *worst_triple(checks), krr.epsilon),
        (planar, *worst_triple(planar_checks), bound(*worst[0])),
    ]
    results = second_stage(pool, [retest[:4] for retest in retests], first_seed=50_000)
    for retest, result in zip(retests, results, strict=True):
        assert result.lower <= retest[4], (retest, result)
        assert result.upper >= retest[4] - 0.1, (retest, result)  # tight: the loss is seen


@pytest.mark.slow
def test_second_stage_on_the_worst_triple_of_every_default_case(pool, audit_counts):
    retests = []
    for case, (mechanism, inputs) in KRR_CASES.items():
        pairs = list(itertools.permutations(inputs, 2))
        checks = audit_pairs(
            audit_counts, case, pairs, lambda x, o, eps=mechanism.epsilon: eps, mechanism.k
        )
        retests.append((mechanism, *worst_triple(checks), mechanism.epsilon))
    channel = planar_channel(PLANAR)
    pairs = ordered(PLANAR_PAIRS)
    checks = audit_pairs(
        audit_counts, "planar", pairs, lambda x, o: exact_loss(channel, x, o), PLANAR.n_outputs
    )
    x, other, output = worst_triple(checks)
    retests.append((PLANAR, x, other, output, exact_loss(channel, x, other)))
    results = second_stage(pool, [retest[:4] for retest in retests], first_seed=60_000)
    for retest, result in zip(retests, results, strict=True):
        assert result.lower <= retest[4], (retest, result)
