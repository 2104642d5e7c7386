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

The draws run in two processes; the whole file takes about half a minute.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from shared_stats import bonferroni_z, log_ratio_audit, scalar_counts, small_grid

from aggregator.estimation.channels import PlanarLaplaceChannel
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


def draw(work) -> dict:
    """Output counts of N_AUDIT scalar draws for each ``(key, mechanism, x)``, in WORKERS processes."""
    # Planar draws are ~8x slower than k-RR ones; start them first so the two workers finish together.
    work = sorted(work, key=lambda job: not isinstance(job[1], PlanarLaplace))
    seeds = [20_000 + i for i in range(len(work))]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=WORKERS, mp_context=context) as pool:
        results = pool.map(
            scalar_counts,
            [job[1] for job in work],
            [job[2] for job in work],
            [N_AUDIT] * len(work),
            seeds,
        )
        counts = {job[0]: result for job, result in zip(work, results, strict=True)}
    for key, result in counts.items():
        assert result.sum() == N_AUDIT, key
    return counts


@pytest.fixture(scope="module")
def audit_counts():
    """The draws of every case of the default run, computed once."""
    return draw(jobs())


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
    checks = audit_pairs(audit_counts, case, pairs, lambda x, o: mechanism.epsilon, mechanism.k)
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


# -- the extended audit (slow: about a minute on two cores) ------------------------------


@pytest.mark.slow
def test_extended_audit_every_pair_of_krr_50_and_of_a_planar_grid():
    krr = KRR(epsilon=3.0, domain=labels(50))
    grid = small_grid(4, 4, 100.0)
    planar = PlanarLaplace(epsilon=0.01, grid=grid)
    work = [(("krr", x), krr, x) for x in range(krr.k)]
    work += [(("planar", x), planar, x) for x in range(grid.n_cells)]
    counts = draw(work)

    krr_pairs = list(itertools.permutations(range(krr.k), 2))
    checks = audit_pairs(counts, "krr", krr_pairs, lambda x, o: krr.epsilon, krr.k)
    assert max(check.excess for check in checks.values()) <= 0
    assert min(check.largest for check in checks.values()) >= krr.epsilon - 0.1

    channel = planar_channel(planar)

    def bound(x, other):
        geo = centre_distance_cells(grid, x, other) * planar.epsilon * grid.cell_size_m
        return min(geo, exact_loss(channel, x, other))

    planar_pairs = list(itertools.permutations(range(grid.n_cells), 2))
    checks = audit_pairs(counts, "planar", planar_pairs, bound, planar.n_outputs)
    worst = max(checks.items(), key=lambda item: item[1].excess)
    assert worst[1].excess <= 0, worst
