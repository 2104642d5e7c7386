"""Privacy audit of k-RR and OLH over a region's cells: the device's snapping and perturbing.

A true location goes through the whole device path (:func:`shared_stats.location_counts`):
snapped to its cell of the campaign's grid, perturbed by the mechanism over the cells,
put on the wire and read back as the server reads it. For pairs of locations the
empirical log-ratio ``ln(P_hat(y | u) / P_hat(y | v))`` of every report seen at least
``MIN_COUNT`` times under both must stay within

* ``epsilon`` for two locations in different cells (k-RR's, and OLH's, epsilon is the
  same for every two cells, near or far), and
* ``0`` for two locations in one cell: snapping leaves nothing of where in the cell a
  user is,

plus the Bonferroni tolerance of :mod:`test_shared_privacy_audit` (``FAMILY_ALPHA``
shared over every (pair, report) check of a mechanism). The audit also sees the whole
loss: between two cells the worst report reaches ``epsilon`` within its tolerance.

Negative controls, each of which the audit must catch:

* k-RR over the cells whose device keeps the true cell with the weights of
  ``epsilon + 0.1``;
* k-RR over the cells whose device, when it reports another cell, favours the
  neighbour its location lies nearest to: it leaks where in the cell the user is,
  so two locations of one cell are told apart;
* OLH over the cells whose device keeps the true bucket with the weights of
  ``1.1 epsilon``.

OLH runs with a pool of two hash functions so that each of its 16 reports is seen
often enough at 10^5 draws; the pool's size does not enter its worst-case ratio
(``keep / unit`` for any seed whose buckets differ). About 12 s of CPU, on two workers.
"""

from __future__ import annotations

import itertools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest
from shared_stats import bonferroni_z, location_counts, log_ratio_audit, small_grid

from shared.exactness import keep_weight
from shared.mechanisms import KRR
from shared.oracles import OLH
from shared.rng import RandomSource, randbelow

N = 100_000
FAMILY_ALPHA = 1e-3
MIN_COUNT = 100
WORKERS = 2

GRID = small_grid(3, 3, 100.0)


def location(cell: int, x_m: float, y_m: float) -> dict[str, float]:
    """The point ``(x_m, y_m)`` metres from the south-west corner of ``cell``."""
    row, col = divmod(cell, GRID.cols)
    lat, lon = GRID.to_latlon(col * GRID.cell_size_m + x_m, row * GRID.cell_size_m + y_m)
    return {"lat": lat, "lon": lon}


# Two locations in the centre cell (4), near its west and its east edge; one in a neighbour
# (5) and one in the far corner (0).
LOCATIONS = {
    "west": location(4, 10.0, 50.0),
    "east": location(4, 90.0, 50.0),
    "neighbour": location(5, 50.0, 50.0),
    "corner": location(0, 20.0, 20.0),
}
SAME_CELL = {("west", "east"), ("east", "west")}


class NearestNeighbourLeak(KRR):
    """k-RR over the cells, except that another cell is drawn with twice the weight for the
    side neighbour nearest the location (west or east of the centre of its cell)."""

    def perturb(self, value, rng: RandomSource | None = None):
        assert self.grid is not None and rng is not None
        x = self.grid.locate(value)
        px, _ = self.grid.to_xy(value["lat"], value["lon"])
        cx, _ = self.grid.centre_xy(x)
        favoured = x - 1 if px < cx else x + 1
        draw = randbelow(rng, self.keep_weight + self.k * self.unit_weight)
        if draw < self.keep_weight:
            return self.report_value(x)
        other = (draw - self.keep_weight) // self.unit_weight  # 0 .. k - 1: k - 1 cells + 1
        if other == self.k - 1:
            return self.report_value(favoured)
        return self.report_value(other + (other >= x))


def generous(mechanism, factor: float = 1.0, extra: float = 0.0):
    """The mechanism with the keep weight of ``factor * epsilon + extra``: its campaign says
    ``epsilon``."""
    mechanism.keep_weight = keep_weight(factor * mechanism.epsilon + extra)
    others = (mechanism.g if isinstance(mechanism, OLH) else mechanism.k) - 1
    mechanism.total_weight = mechanism.keep_weight + others * mechanism.unit_weight
    return mechanism


KRR_EPSILON = 1.0
OLH_EPSILON = 2.0
CASES = {
    "krr": (KRR(epsilon=KRR_EPSILON, grid=GRID), tuple(LOCATIONS)),
    "krr-generous": (generous(KRR(epsilon=KRR_EPSILON, grid=GRID), extra=0.1), ("west", "corner")),
    "krr-leak": (NearestNeighbourLeak(epsilon=KRR_EPSILON, grid=GRID), ("west", "east")),
    "olh": (OLH(epsilon=OLH_EPSILON, grid=GRID, pool_size=2), ("west", "east", "corner")),
    "olh-generous": (
        generous(OLH(epsilon=OLH_EPSILON, grid=GRID, pool_size=2), factor=1.1),
        ("west", "corner"),
    ),
}


@pytest.fixture(scope="module")
def counts():
    """Report counts of every (case, location), drawn once on WORKERS processes."""
    jobs = [(case, name) for case, (_, names) in CASES.items() for name in names]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=WORKERS, mp_context=context) as pool:
        results = pool.map(
            location_counts,
            [CASES[case][0] for case, _ in jobs],
            [LOCATIONS[name] for _, name in jobs],
            [N] * len(jobs),
            [70_000 + i for i in range(len(jobs))],
        )
        return dict(zip(jobs, results, strict=True))


def audit(counts, case: str, epsilon: float):
    """The log-ratio check of every ordered pair of the case's locations: bound 0 within a
    cell, ``epsilon`` between cells."""
    mechanism, names = CASES[case]
    pairs = list(itertools.permutations(names, 2))
    z = bonferroni_z(FAMILY_ALPHA, len(pairs) * mechanism.n_outputs)
    return {
        (u, v): log_ratio_audit(
            counts[(case, u)],
            counts[(case, v)],
            0.0 if (u, v) in SAME_CELL else epsilon,
            z,
            MIN_COUNT,
        )
        for u, v in pairs
    }


def test_the_locations_are_where_the_audit_says():
    cells = {name: GRID.locate(point) for name, point in LOCATIONS.items()}
    assert cells == {"west": 4, "east": 4, "neighbour": 5, "corner": 0}


@pytest.mark.parametrize(("case", "epsilon"), [("krr", KRR_EPSILON), ("olh", OLH_EPSILON)])
def test_snapping_then_perturbing_stays_within_epsilon_and_a_cell_tells_nothing(
    counts, case, epsilon
):
    mechanism, _ = CASES[case]
    for (u, v), check in audit(counts, case, epsilon).items():
        assert check.n_checked == mechanism.n_outputs, (u, v)  # every report is seen often
        assert check.excess <= 0, (u, v, check)
        if (u, v) not in SAME_CELL:
            # The audit sees the whole loss between two cells.
            assert check.largest >= epsilon - 2 * check.tolerance, (u, v, check)


def test_olh_pairs_are_told_apart_by_some_seed():
    # The audited pair of cells must not share a bucket under both seeds (else it shows nothing).
    olh = CASES["olh"][0]
    west, corner = GRID.locate(LOCATIONS["west"]), GRID.locate(LOCATIONS["corner"])
    assert any(olh.bucket(s, west) != olh.bucket(s, corner) for s in range(olh.pool_size))


@pytest.mark.parametrize(
    ("case", "epsilon"),
    [("krr-generous", KRR_EPSILON), ("krr-leak", KRR_EPSILON), ("olh-generous", OLH_EPSILON)],
)
def test_the_negative_controls_are_caught(counts, case, epsilon):
    checks = audit(counts, case, epsilon)
    caught = {pair for pair, check in checks.items() if check.excess > 0}
    assert caught, checks
    if case == "krr-leak":
        # Two locations of one cell told apart: where in the cell the user is, leaked.
        assert caught == SAME_CELL, checks
